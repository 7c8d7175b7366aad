"""Pairwise loss of randomized gossip (Algorithm 2): a schedule of two-node averages.

Exchange t averages the pair {a_t, b_t}: ``W_t = I - (e_a - e_b)(e_a - e_b)^T / 2``. With faults an
end may miss its partner and keep its value, so each exchange carries two flags: whether a used
b's value and whether b used a's. A message (t, w) observed by v is w's value before exchange t,
``C_t[w] . y`` with ``C_t = W_{t-1} ... W_0`` (the realised rows). Same quantities as
privacy/muffliato.py (factors of the local-DP loss):

* :func:`paper_factors` — Corollary 2 / Eq. (6): ``sum_{(t,w)} C_t[w,u]^2 / ||C_t[w]||^2``, not
  capped. O(T n) time, one n x n array.
* :func:`exact_factors` — ``[Pi_v]_{uu}``, the projector onto span{e_v, C_t[w] : observed}, in
  exact arithmetic: the rows are dyadic (each average halves), kept as integers over powers of 2,
  two rows updated per exchange, reduced exactly as they are observed; it stops as soon as the
  span is full. At most ``RATIONAL_MAX_NODES`` nodes.
* :func:`structural_factors` — for larger n: 1 for every source whose input reached a message v
  observed (or v itself), 0 for the others. An upper bound on the exact factor (which is <= 1 and
  exactly 0 where the source's column is zero).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from coordinator_free.privacy.muffliato import (
    RATIONAL_MAX_BITS,
    RATIONAL_MAX_NODES,
    ExactTooLargeError,
    _reduce_into,
    projector_diagonal,
)

#: An exchange: (a, b, a_used, b_used) — a_used: a averaged with b's value (b_used likewise).
Exchange = tuple[int, int, bool, bool]
#: :func:`paper_factors` keeps an n x n float64 array.
PAPER_MAX_NODES = 8192


def _check(n: int, exchanges: Sequence[Exchange], observer: int, received) -> dict[int, int]:
    if not 0 <= observer < n:
        raise ValueError(f"observer {observer} out of range 0..{n - 1}")
    rec: dict[int, int] = {}
    for t, w in received:
        t, w = int(t), int(w)
        if not 0 <= t < len(exchanges):
            raise ValueError(f"message ({t}, {w}): exchange out of range 0..{len(exchanges) - 1}")
        a, b, _, _ = exchanges[t]
        if observer not in (a, b) or w != (b if observer == a else a):
            raise ValueError(
                f"message ({t}, {w}): exchange {t} is between {a} and {b}, so observer "
                f"{observer} cannot have received node {w}'s value there"
            )
        rec[t] = w
    return rec


def paper_factors(
    n: int, exchanges: Sequence[Exchange], observer: int, received: Iterable[tuple[int, int]]
) -> np.ndarray:
    """Corollary 2 of the Muffliato paper (Eq. (6) with pairwise W_t), shape (n,)."""
    rec = _check(n, exchanges, observer, received)
    out = np.zeros(n)
    if not rec:
        return out
    if n > PAPER_MAX_NODES:
        raise ValueError(f"Corollary 2 here keeps an n x n array: at most {PAPER_MAX_NODES} nodes")
    c = np.eye(n)
    for t in range(max(rec) + 1):
        if t in rec:
            row = c[rec[t]]
            out += row * row / float(row @ row)
        a, b, ua, ub = exchanges[t]
        avg = 0.5 * c[a] + 0.5 * c[b]
        if ua:
            c[a] = avg
        if ub:
            c[b] = avg
    return out


def exact_factors(
    n: int, exchanges: Sequence[Exchange], observer: int, received: Iterable[tuple[int, int]]
) -> np.ndarray:
    """Exact loss factors of every source towards ``observer`` (shape (n,)); raises
    :class:`ExactTooLargeError` above ``RATIONAL_MAX_NODES`` nodes or ``RATIONAL_MAX_BITS``-bit
    coefficients."""
    rec = _check(n, exchanges, observer, received)
    return _exact(n, exchanges, [observer], {t: [w] for t, w in rec.items()})


def coalition_exact_factors(
    n: int,
    exchanges: Sequence[Exchange],
    members: Sequence[int],
    received: dict[int, Iterable[tuple[int, int]]],
) -> np.ndarray:
    """:func:`exact_factors` towards a coalition: the members pool their own inputs and every
    value any of them received (``received``: member -> its (t, w)); members get 1."""
    members = sorted({int(a) for a in members})
    rec: dict[int, list[int]] = {}
    for a in members:
        for t, w in _check(n, exchanges, a, received.get(a, ())).items():
            rec.setdefault(t, []).append(w)
    return _exact(n, exchanges, members, rec)


def _exact(
    n: int, exchanges: Sequence[Exchange], known: list[int], rec: dict[int, list[int]]
) -> np.ndarray:
    if n > RATIONAL_MAX_NODES:
        raise ExactTooLargeError(
            f"the exact pairwise loss uses exact arithmetic, up to {RATIONAL_MAX_NODES} nodes "
            f"(got {n})"
        )
    drop = set(known)
    rows = [[1 if i == j else 0 for j in range(n)] for i in range(n)]
    exps = [0] * n  # row v = rows[v] / 2^exps[v]
    basis: list[tuple[int, list[int]]] = []
    full = n - len(drop)
    last = max(rec, default=-1)
    for t in range(last + 1):
        if t in rec:
            for w in rec[t]:
                basis = _reduce_into(basis, [c for j, c in enumerate(rows[w]) if j not in drop])
            if len(basis) == full or t == last:
                break
        a, b, ua, ub = exchanges[t]
        if not (ua or ub):
            continue
        k = max(exps[a], exps[b])
        sa, sb = k - exps[a], k - exps[b]
        avg = [(x << sa) + (y << sb) for x, y in zip(rows[a], rows[b], strict=True)]
        e = k + 1
        low = min(((c & -c).bit_length() - 1 for c in avg if c), default=0)
        shift = min(low, e)
        if shift:
            avg = [c >> shift for c in avg]
            e -= shift
        if e > RATIONAL_MAX_BITS:
            raise ExactTooLargeError(
                f"exact pairwise loss: coefficients exceed {RATIONAL_MAX_BITS} bits at exchange {t}"
            )
        if ua:
            rows[a], exps[a] = avg, e
        if ub:
            rows[b], exps[b] = list(avg), e
    return projector_diagonal(basis, n, known if len(known) > 1 else known[0])


def coalition_structural_factors(
    n: int,
    exchanges: Sequence[Exchange],
    members: Sequence[int],
    received: dict[int, Iterable[tuple[int, int]]],
) -> np.ndarray:
    """:func:`structural_factors` towards a coalition (any n): the largest over the members."""
    out = np.zeros(n)
    for a in sorted({int(a) for a in members}):
        out = np.maximum(out, structural_factors(n, exchanges, a, received.get(a, ())))
    return out


def structural_factors(
    n: int, exchanges: Sequence[Exchange], observer: int, received: Iterable[tuple[int, int]]
) -> np.ndarray:
    """1 for the sources whose input reached a message the observer saw (and the observer), 0
    for the others: an upper bound on the exact factors for any n."""
    rec = _check(n, exchanges, observer, received)
    masks = [1 << v for v in range(n)]
    seen = 1 << observer
    for t in range(max(rec, default=-1) + 1):
        if t in rec:
            seen |= masks[rec[t]]
        a, b, ua, ub = exchanges[t]
        both = masks[a] | masks[b]
        if ua:
            masks[a] = both
        if ub:
            masks[b] = both
    return np.array([float((seen >> u) & 1) for u in range(n)])
