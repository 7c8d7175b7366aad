"""Pairwise privacy loss of Muffliato gossip averaging (exact and the paper's Eq. (6)).

Mechanism (what the peers run). Node v publishes nothing but gossip messages; its noisy input is
``y_v = x_v + eta_v``, ``eta_v ~ N(0, sigma^2 I_D)``, and ``x^0 = y``. For steps t = 0..T-1 every
node sends ``x_v^t`` to its neighbours and then sets

    x^{t+1} = gamma_t M_t x^t + (1 - gamma_t) x^{t-1},     gamma_0 = 1 (so x^1 = M_0 x^0).

Fault-free, ``M_t = W`` (public, symmetric, doubly stochastic); ``gamma_t = gamma`` (Chebyshev) for
t >= 1 when accelerated, else 1. When v misses w's step-t message it uses its own value instead:
row v of the *realised* ``M_t`` has ``M_t[v, w] = 0`` and ``M_t[v, v] = W_vv + (missed weights)``.
Hence ``x^t = C_t y`` with ``C_0 = I``, ``C_1 = M_0``, ``C_{t+1} = gamma_t M_t C_t + (1-gamma_t) C_{t-1}``.
A schedule is the list ``steps = [(M_0, gamma_0), ..., (M_{T-1}, gamma_{T-1})]``; message (t, w)
carries row ``C_t[w, :]`` applied to y. ``M_{T-1}`` only produces the output x^T, which is never
sent, so it does not enter any view.

Observer v's view: its own ``x_v`` and ``eta_v`` and every message (t, w) it *observed* (including
a late one it did not use in its update: what v saw is what counts for privacy, what v used is
what defines ``M_t``).

Losses are returned as unitless **factors** of the local-DP loss ``L = alpha Delta^2 / (2 sigma^2)``:
``RDP_{u->v}(alpha) = factor_{u->v} * L``. Use :func:`coordinator_free.privacy.rdp.rho_from_factor`
to get ``rho`` (RDP = alpha * rho) and the conversions there for (eps, delta).

* **exact**: ``factor_{u->v} = [Pi_v]_{uu}``, Pi_v the orthogonal projector onto
  ``span{e_v} + span{C_t[w, :] : (t, w) observed by v}``. This *is* the Rényi divergence of v's
  whole Gaussian view divided by L (docs/privacy.md, section 3). In [0, 1]; ``factor_{v->v} = 1``.
* **paper**: Eq. (6) of the Muffliato paper, ``sum_{(t, w) observed} C_t[w, u]^2 / ||C_t[w, :]||^2``
  (t = 0 included, raw, not capped). It is *not* an upper bound on the exact loss; the paper's code
  reports ``min(factor, 1)`` (see :func:`ldp_capped`).

Numerics of the exact factor. The message rows are nearly collinear (``C_t -> 11^T/n``) while
the small directions they span are real information, so raw rows or powers are never
orthogonalised in floating point. Instead:

* fixed W, fault-free (:func:`plan_factors`, and :func:`exact_factors` on such a schedule): the
  span is the block Krylov space ``K_T(W, [e_v, e_{N(v)}])`` (the Chebyshev polynomial P_t has
  exact degree t, so accelerated and plain gossip give the same span). The reference builds it
  by block Lanczos with full re-orthogonalisation (twice); only true rank deficiency (an
  invariant subspace, seen as roundoff-level singular values) is deflated. Every rank decision
  is checked: singular values at or below ``DROP_TOL`` are deflated, values above ``KEEP_TOL``
  are directions, and a value in between raises :class:`NumericalRankError` (``strict=True``,
  default) or is kept and counted (``strict=False``: over-estimates rather than hides a
  direction). :func:`plan_factors` first tries a faster route for batches of observers
  (:func:`_local_leverages`: Lanczos by its three-term recurrence alone, the
  projector read exactly through the Gram matrix of the basis it built, which also measures
  how far that basis is from orthonormal); an observer whose basis fails that check or whose
  rank decisions are not clear-cut by a wide margin goes through the reference.
* any other realised schedule (time-varying rows, missed or late messages):
  :func:`exact_factors_rational`, exact rational arithmetic: the rows are computed exactly as
  integer vectors over a common denominator and row-reduced exactly, so the rank needs no
  tolerance. Limited to ``RATIONAL_MAX_NODES`` nodes. The float64 weights are first read as the
  fractions they stand for (:func:`intended_fraction`: 1/3, 13/24, ...). Read as exact dyadic
  rationals instead, their rounding can break exact symmetries of the intended matrix and create
  directions of relative size ~1e-17 that exact arithmetic would count in full although no
  float execution of the protocol carries them (``snap=False`` shows this).
  (A float "backward subspace" recursion ``S_t = M_t^T S_{t+1} + ...`` is *not* sound: it is a
  subspace power iteration and loses the directions of small eigenvalues; it was tried and
  disagreed with exact arithmetic on a 16-ring.)
* larger faulty schedules based on a fixed W: :func:`exact_upper_factors`, a stable Lanczos
  computation of a provable upper bound (the span lies in a block Krylov space of W that also
  starts from the row spaces of ``M_t - W``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import scipy.sparse as sp

from coordinator_free import forkwork, progress

__all__ = [
    "DROP_TOL",
    "KEEP_TOL",
    "NumericalRankError",
    "RankDiagnostics",
    "fault_free_steps",
    "fault_free_received",
    "apply_misses",
    "realised_coefficients",
    "paper_factors",
    "paper_factors_many",
    "exact_factors",
    "exact_factors_rational",
    "exact_upper_factors",
    "fault_span",
    "intended_fraction",
    "ExactTooLargeError",
    "plan_factors",
    "plan_exact_diagnostics",
    "coalition_factors",
    "ldp_capped",
    "distance_summary",
]

#: Singular values of an orthogonalised new block at or below this (relative to the norm of the
#: one-step map) are treated as exact rank deficiency. Measured roundoff residuals of exactly
#: invariant Krylov spaces reach ~1e-11 on symmetric graphs (8x8 grid, T = 24).
DROP_TOL = 1e-10
#: Singular values at or above this are real directions. Between the two is the ambiguous band.
#: Measured genuine directions go down to ~5e-6 on small random geometric graphs.
KEEP_TOL = 1e-7


class NumericalRankError(ArithmeticError):
    """A rank decision fell in the band float64 cannot resolve (see module doc)."""


@dataclass(frozen=True)
class RankDiagnostics:
    """How clear-cut the rank decisions of one exact computation were.

    ``dim``: dimension of the observed span (including e_v). ``min_kept``: smallest singular value
    accepted as a direction (inf if none was tested). ``max_dropped``: largest singular value
    deflated (0 if none). ``ambiguous``: number of kept values inside (DROP_TOL, KEEP_TOL).
    """

    dim: int
    min_kept: float
    max_dropped: float
    ambiguous: int

    def merge(self, other: RankDiagnostics) -> RankDiagnostics:
        return RankDiagnostics(
            dim=max(self.dim, other.dim),
            min_kept=min(self.min_kept, other.min_kept),
            max_dropped=max(self.max_dropped, other.max_dropped),
            ambiguous=self.ambiguous + other.ambiguous,
        )


class _Ranks:
    """Accumulates rank decisions and applies the tolerance policy."""

    def __init__(self, strict: bool, where: str) -> None:
        self.strict = strict
        self.where = where
        self.min_kept = math.inf
        self.max_dropped = 0.0
        self.ambiguous = 0

    def count(self, s: np.ndarray, scale: float) -> int:
        """Number of leading singular values (sorted decreasingly) that are directions."""
        rel = s / scale if scale > 0 else s
        keep = int(np.count_nonzero(rel > DROP_TOL))
        if keep:
            self.min_kept = min(self.min_kept, float(rel[keep - 1]))
        if keep < rel.size:
            self.max_dropped = max(self.max_dropped, float(rel[keep]))
        amb = int(np.count_nonzero((rel > DROP_TOL) & (rel < KEEP_TOL)))
        if amb:
            if self.strict:
                raise NumericalRankError(
                    f"{self.where}: a new direction has relative size "
                    f"{float(rel[(rel > DROP_TOL) & (rel < KEEP_TOL)].min()):.3g}, inside the "
                    f"band ({DROP_TOL:g}, {KEEP_TOL:g}) where float64 cannot tell a real direction "
                    "from roundoff. Use exact_factors_rational for a small schedule, or "
                    "strict=False to keep such directions (over-estimates the loss)"
                )
            self.ambiguous += amb
        return keep

    def diagnostics(self, dim: int) -> RankDiagnostics:
        return RankDiagnostics(dim, self.min_kept, self.max_dropped, self.ambiguous)


def _extend(basis: np.ndarray, block: np.ndarray, scale: float, ranks: _Ranks) -> np.ndarray:
    """Orthonormal basis of span(basis) + span(block); ``basis`` is orthonormal (n x r).

    Two passes of block classical Gram-Schmidt, SVD of the residual, deflation by ``ranks``,
    then one more projection of the accepted directions (they may be tiny before normalisation)
    and a QR to restore orthonormality to working precision.
    """
    if block.shape[1] == 0:
        return basis
    z = np.array(block, dtype=np.float64, copy=True)
    if basis.shape[1]:
        for _ in range(2):
            z -= basis @ (basis.T @ z)
    u, s, _ = np.linalg.svd(z, full_matrices=False)
    k = ranks.count(s, scale)
    if k == 0:
        return basis
    q = u[:, :k]
    if basis.shape[1]:
        q = q - basis @ (basis.T @ q)
    q, _ = np.linalg.qr(q)
    return np.hstack([basis, q]) if basis.shape[1] else q


# ---------------------------------------------------------------------------------------------
# Schedules
# ---------------------------------------------------------------------------------------------

Step = tuple[np.ndarray, float]


def _check_w(w: np.ndarray) -> np.ndarray:
    """W as given (dense, or a scipy sparse matrix as CSR), checked square and symmetric."""
    if sp.issparse(w):
        w = sp.csr_matrix(w, dtype=np.float64)
        if w.shape[0] != w.shape[1] or w.shape[0] < 1:
            raise ValueError(f"gossip matrix must be square, got shape {w.shape}")
        if (w != w.T).nnz:
            raise ValueError("the fixed gossip matrix W must be exactly symmetric")
        return w
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] < 1:
        raise ValueError(f"gossip matrix must be square, got shape {w.shape}")
    if not np.array_equal(w, w.T):
        raise ValueError("the fixed gossip matrix W must be exactly symmetric")
    return w


def _gamma_for(w: np.ndarray) -> float:
    from coordinator_free.graphs import chebyshev_gamma, spectral_gap

    return chebyshev_gamma(spectral_gap(w))


def fault_free_steps(
    w: np.ndarray, steps: int, accelerated: bool, gamma: float | None = None
) -> list[Step]:
    """The fault-free schedule ``[(W, 1), (W, gamma), ...]`` of ``steps`` steps.

    ``gamma`` defaults to ``chebyshev_gamma(spectral_gap(W))`` when accelerated.
    """
    w = _check_w(w)
    if steps < 1:
        raise ValueError("a schedule needs at least one step")
    g = (gamma if gamma is not None else _gamma_for(w)) if accelerated else 1.0
    return [(w, 1.0 if t == 0 else float(g)) for t in range(steps)]


def _neighbours(w: np.ndarray, v: int) -> list[int]:
    if sp.issparse(w):
        row = w.getrow(v)
        return [int(x) for x, val in zip(row.indices, row.data, strict=True) if x != v and val]
    return [int(x) for x in np.flatnonzero(w[v]) if x != v]


def fault_free_received(w: np.ndarray, observer: int, steps: int) -> list[tuple[int, int]]:
    """Messages (t, w) observer v gets in a fault-free run: every neighbour, every t < steps."""
    w = np.asarray(w)
    return [(t, x) for t in range(steps) for x in _neighbours(w, observer)]


def apply_misses(w: np.ndarray, missed: Iterable[tuple[int, int]]) -> np.ndarray:
    """Realised step matrix: for each (v, x) in ``missed`` (v did not get x's message in time),
    ``M[v, x] = 0`` and ``M[v, v] = W_vv + sum of v's missed weights``."""
    m = np.array(w, dtype=np.float64, copy=True)
    extra: dict[int, list[float]] = {}
    for v, x in missed:
        if v == x:
            raise ValueError(f"node {v} cannot miss its own message")
        if m[v, x] != 0.0:
            extra.setdefault(v, []).append(float(m[v, x]))
            m[v, x] = 0.0
    for v, vals in extra.items():
        m[v, v] = math.fsum([float(w[v, v]), *vals])
    return m


def _check_steps(steps: Sequence[Step]) -> tuple[list[np.ndarray], list[float], int]:
    if len(steps) == 0:
        raise ValueError("empty schedule")
    ms: list[np.ndarray] = []
    gs: list[float] = []
    n = None
    for t, (m, g) in enumerate(steps):
        m = np.asarray(m, dtype=np.float64)
        if m.ndim != 2 or m.shape[0] != m.shape[1]:
            raise ValueError(f"step {t}: M_t must be square, got shape {m.shape}")
        if n is None:
            n = m.shape[0]
        elif m.shape[0] != n:
            raise ValueError(f"step {t}: M_t has size {m.shape[0]}, expected {n}")
        g = float(g)
        if not math.isfinite(g):
            raise ValueError(f"step {t}: gamma must be finite")
        ms.append(m)
        gs.append(g)
    if gs[0] != 1.0:
        raise ValueError("gamma_0 must be 1 (x^1 = M_0 x^0; x^{-1} does not exist)")
    assert n is not None
    return ms, gs, n


def _check_received(
    received: Iterable[tuple[int, int]], observer: int, n: int, steps: int
) -> list[tuple[int, int]]:
    if not 0 <= observer < n:
        raise ValueError(f"observer {observer} out of range 0..{n - 1}")
    out = sorted({(int(t), int(x)) for t, x in received})
    for t, x in out:
        if not 0 <= t < steps:
            raise ValueError(f"message ({t}, {x}): step out of range 0..{steps - 1}")
        if not 0 <= x < n:
            raise ValueError(f"message ({t}, {x}): sender out of range 0..{n - 1}")
        if x == observer:
            raise ValueError(f"message ({t}, {x}): the observer does not receive from itself")
    return out


def realised_coefficients(steps: Sequence[Step]) -> np.ndarray:
    """``C_0, ..., C_{T-1}`` as an array of shape (T, n, n) (float64).

    Row ``C_t[w]`` is the noise/input coefficient vector of the message w sends at step t. These
    rows are fine for Eq. (6) but must not be orthogonalised directly (see module doc).
    """
    ms, gs, n = _check_steps(steps)
    c = np.empty((len(ms), n, n))
    for t, ct in enumerate(_coefficients(ms, gs, n, len(ms) - 1)):
        c[t] = ct
    return c


def _coefficients(ms: list[np.ndarray], gs: list[float], n: int, last: int):
    """Yield ``C_0 .. C_last`` one at a time (two n x n arrays alive, not T)."""
    prev, cur = None, np.eye(n)
    for t in range(last + 1):
        yield cur
        if t == last:
            return
        nxt = ms[t] @ cur
        if t >= 1 and gs[t] != 1.0:
            nxt = gs[t] * nxt + (1.0 - gs[t]) * prev
        prev, cur = cur, nxt


# ---------------------------------------------------------------------------------------------
# Eq. (6), general schedule
# ---------------------------------------------------------------------------------------------


def paper_factors(
    steps: Sequence[Step], observer: int, received: Iterable[tuple[int, int]]
) -> np.ndarray:
    """Eq. (6): ``f[u] = sum_{(t,w) observed} C_t[w,u]^2 / ||C_t[w,:]||^2``, shape (n,).

    Raw (not capped at 1, so it can exceed the LDP loss; ``f.sum()`` equals the number of
    observed messages). Entry ``observer`` is the same raw sum; it is not a loss of anyone.

    Hypotheses (Theorem 1 of the paper, and Eq. (13) per round): Assumption 1 (sensitivity
    Delta), Gaussian noise, any gossip matrices; no condition on sigma or on the order: the
    curve ``alpha * rho_ldp * f`` is stated for every alpha > 1, so converting it over all orders
    is what the theorem says (its composition over messages is the step that fails for
    correlated messages: docs/privacy.md, "Why Eq. (6) is not a bound").
    """
    return paper_factors_many(steps, {observer: received})[observer]


def paper_factors_many(
    steps: Sequence[Step], received: Mapping[int, Iterable[tuple[int, int]]]
) -> dict[int, np.ndarray]:
    """:func:`paper_factors` of every observer in ``received`` (observer -> the messages it
    observed) for one schedule, each ``C_t`` computed once instead of once per observer (n
    dense n x n products each). Equal to it bit for bit: each observer's terms are added in the
    same order."""
    ms, gs, n = _check_steps(steps)
    out: dict[int, np.ndarray] = {}
    by_t: dict[int, list[tuple[int, int]]] = {}  # step -> (observer, sender), in each one's order
    for v, rec in received.items():
        out[v] = np.zeros(n)
        for t, x in _check_received(rec, v, n, len(ms)):
            by_t.setdefault(t, []).append((v, x))
    if not by_t:
        return out
    for t, c in enumerate(_coefficients(ms, gs, n, max(by_t))):
        for v, x in by_t.get(t, []):
            row = c[x]
            out[v] += row * row / float(row @ row)
    return out


def ldp_capped(factors: np.ndarray) -> np.ndarray:
    """``min(factor, 1)``: the paper's code clips Eq. (6) at the LDP loss (valid by post-processing)."""
    return np.minimum(np.asarray(factors, dtype=np.float64), 1.0)


# ---------------------------------------------------------------------------------------------
# Exact factor in rational arithmetic (small schedules, certification)
# ---------------------------------------------------------------------------------------------

#: Limits of :func:`exact_factors_rational`: node count and the size (in bits) of the integers
#: representing C_t over its common denominator. Past them it raises ValueError.
RATIONAL_MAX_NODES = 64
RATIONAL_MAX_BITS = 200_000


#: :func:`intended_fraction` looks for the simplest fraction within this many units in the last
#: place of the float, with at most this denominator.
SNAP_ULPS = 8
SNAP_MAX_DENOMINATOR = 1 << 32


def intended_fraction(
    x: float, ulps: int = SNAP_ULPS, max_denominator: int = SNAP_MAX_DENOMINATOR
) -> Fraction:
    """The simplest fraction within ``ulps`` units in the last place of ``x`` (the first
    continued-fraction convergent of x that close, denominator <= max_denominator), else ``x``
    itself as an exact dyadic rational.

    Recovers the weights a schedule meant from their float64 values: ``1/3`` from fl(1/3), and
    ``13/24`` from ``1 - fsum([1/8, 1/3])`` which is one ulp away from fl(13/24).
    """
    exact = Fraction(x)
    if exact.denominator == 1:
        return exact
    tol = Fraction(ulps * math.ulp(x))
    p0, q0, p1, q1 = 0, 1, 1, 0
    rest = exact
    while True:
        a = math.floor(rest)
        p0, q0, p1, q1 = p1, q1, a * p1 + p0, a * q1 + q0
        if q1 > max_denominator:
            return exact
        cand = Fraction(p1, q1)
        if abs(cand - exact) <= tol:
            return cand
        frac = rest - a
        if frac == 0:
            return exact
        rest = 1 / frac


def _content_free(r: list[int]) -> list[int]:
    g = 0
    for c in r:
        if c:
            g = math.gcd(g, c)
            if g == 1:
                return r
    return [c // g for c in r] if g > 1 else r


def _reduce_into(basis: list[tuple[int, list[int]]], r: list[int]) -> list[tuple[int, list[int]]]:
    """Exact fraction-free reduction of integer row r against an echelon basis whose rows are
    zero at each other's pivots; returns the basis, extended (and kept mutually reduced) when r
    is independent."""
    for p, b in basis:
        c = r[p]
        if c:
            a = b[p]
            r = _content_free([a * ri - c * bi for ri, bi in zip(r, b, strict=True)])
    piv = next((j for j, c in enumerate(r) if c), None)
    if piv is None:
        return basis
    if r[piv] < 0:
        r = [-c for c in r]
    out = []
    for p, b in basis:
        c = b[piv]
        if c:
            a = r[piv]
            b = _content_free([a * bi - c * ri for bi, ri in zip(b, r, strict=True)])
            if b[p] < 0:
                b = [-bi for bi in b]
        out.append((p, b))
    out.append((piv, r))
    out.sort(key=lambda e: e[0])
    return out


def exact_coefficients(steps: Sequence[Step], last: int, *, snap: bool = True):
    """Yield ``(t, Ci_t, den_t)`` for t = 0..last: ``C_t = Ci_t / den_t`` exactly, ``Ci_t`` a list
    of integer rows, with the weights and gammas read as :func:`intended_fraction` of their
    float64 values (``snap=True``) or as exact dyadic rationals. The consumer may stop early.
    Raises :class:`ExactTooLargeError` when the coefficients outgrow ``RATIONAL_MAX_BITS``."""
    ms, gs, n = _check_steps(steps)
    conv = intended_fraction if snap else Fraction
    # Integer representation: M_t = Mi_t / d_t.
    mi: list[list[list[tuple[int, int]]]] = []  # per t, per row: [(col, int)]
    m_den: list[int] = []
    for m in ms[:last]:
        entries = [[(int(j), conv(float(m[i, j]))) for j in np.flatnonzero(m[i])] for i in range(n)]
        d = 1
        for row in entries:
            for _, f in row:
                d = d * f.denominator // math.gcd(d, f.denominator)
        mi.append([[(j, f.numerator * (d // f.denominator)) for j, f in row] for row in entries])
        m_den.append(d)
    gammas = [conv(g) for g in gs]
    prev: list[list[int]] | None = None
    cur = [[1 if i == j else 0 for j in range(n)] for i in range(n)]
    cur_den = prev_den = 1
    for t in range(last + 1):
        yield t, cur, cur_den
        if t == last:
            return
        bits = max((abs(c).bit_length() for row in cur for c in row), default=0)
        if bits > RATIONAL_MAX_BITS:
            raise ExactTooLargeError(
                f"exact coefficients exceed {RATIONAL_MAX_BITS} bits at step {t}; the schedule "
                "is too long for exact arithmetic"
            )
        mrow = mi[t]
        prod = [[0] * n for _ in range(n)]
        for i in range(n):
            acc = prod[i]
            for j, a in mrow[i]:
                for col, cj in enumerate(cur[j]):
                    if cj:
                        acc[col] += a * cj
        prod_den = m_den[t] * cur_den
        g = gammas[t]
        if g == 1 or prev is None:
            nxt, nxt_den = prod, prod_den
        else:
            # g * prod/prod_den + (1-g) * prev/prev_den over the common denominator
            ga, gb = g.numerator, g.denominator
            c1 = ga * prev_den
            c2 = (gb - ga) * prod_den
            nxt = [
                [c1 * a + c2 * b for a, b in zip(pr, pv, strict=True)]
                for pr, pv in zip(prod, prev, strict=True)
            ]
            nxt_den = gb * prod_den * prev_den
        common = nxt_den
        for row in nxt:
            for c in row:
                if c:
                    common = math.gcd(common, c)
                    if common == 1:
                        break
            if common == 1:
                break
        if common > 1:
            nxt = [[c // common for c in row] for row in nxt]
            nxt_den //= common
        prev, prev_den = cur, cur_den
        cur, cur_den = nxt, nxt_den


def exact_factors_rational(
    steps: Sequence[Step],
    observer: int,
    received: Iterable[tuple[int, int]],
    *,
    snap: bool = True,
) -> np.ndarray:
    """Exact loss factors computed in exact rational arithmetic.

    With ``snap=True`` (default) every entry of M_t and every gamma_t is replaced by
    :func:`intended_fraction` of its float64 value, i.e. the mechanism with the weights the
    schedule meant (Metropolis weights are fractions with small denominators). With
    ``snap=False`` the float64 values are used exactly as dyadic rationals; then rounding of the
    weights can break exact symmetries of the intended matrix and create directions of relative
    size ~1e-17 that exact arithmetic counts in full (see docs/privacy.md), which no float
    computation of the protocol could exploit.

    The rows C_t[w] are computed exactly as integer vectors over a common denominator; the span
    (coordinate v dropped, as v knows its own noise) is row-reduced exactly over the integers
    (fraction-free, content removed), so the rank needs no tolerance. The projector diagonal is
    then formed from the exact reduced echelon basis [I | X] (Gram matrix I + X X^T, condition
    <= 1 + ||X||^2) in mpmath with enough bits for that condition. Limits: ``RATIONAL_MAX_NODES``
    nodes and ``RATIONAL_MAX_BITS`` bits per coefficient; intended for tests and small audits.
    """

    ms, gs, n = _check_steps(steps)
    T = len(ms)
    rec = _check_received(received, observer, n, T)
    if n > RATIONAL_MAX_NODES:
        raise ValueError(
            f"exact_factors_rational supports at most {RATIONAL_MAX_NODES} nodes, got {n}"
        )
    # Observed rows (coordinate v dropped) are row-reduced as soon as they are produced, and
    # the recursion stops once the span is full.
    need = max((t for t, _ in rec), default=0)
    by_t: dict[int, list[int]] = {}
    for t, x in rec:
        by_t.setdefault(t, []).append(x)
    m_cols = n - 1
    basis: list[tuple[int, list[int]]] = []  # (pivot col, row); zero at every other pivot
    for t, cur, _den in exact_coefficients(steps, need, snap=snap):
        for x in by_t.get(t, []):
            if len(basis) == m_cols:
                break
            basis = _reduce_into(basis, [c for j, c in enumerate(cur[x]) if j != observer])
        if len(basis) == m_cols:
            break

    return projector_diagonal(basis, n, observer)


def projector_diagonal(
    basis: list[tuple[int, list[int]]], n: int, observer: int | Sequence[int]
) -> np.ndarray:
    """The diagonal of the orthogonal projector onto the span of an exact echelon ``basis``
    (integer rows over the coordinates other than ``observer``, as built by ``_reduce_into``;
    a coalition drops every member's coordinate), as loss factors of every source (the
    observers themselves: 1)."""
    import mpmath

    known = {observer} if isinstance(observer, int) else {int(a) for a in observer}
    m_cols = n - len(known)
    f = np.zeros(n)
    f[sorted(known)] = 1.0
    rank = len(basis)
    if rank == 0:
        return f
    others = [j for j in range(n) if j not in known]
    if rank == m_cols:
        f[:] = 1.0
        return f
    # Reduced echelon: row i = b_i / b_i[p_i] is [I | X] after permuting pivot columns first.
    pivots = [p for p, _ in basis]
    nonpiv = [j for j in range(m_cols) if j not in set(pivots)]
    xs = [[Fraction(b[j], b[p]) for j in nonpiv] for p, b in basis]
    xmax = max((abs(v) for row in xs for v in row), default=Fraction(0))
    cond_bits = 2 * (int(xmax).bit_length() + 1) + 2 * max(rank, 1).bit_length()
    with mpmath.workprec(128 + cond_bits):
        xm = mpmath.matrix([[mpmath.mpf(v.numerator) / v.denominator for v in row] for row in xs])
        g = mpmath.eye(rank) + xm * xm.T
        # P = R^T G^{-1} R with R = [I | X]: diag at pivot i: (G^{-1})_{ii};
        # at non-pivot j: x_j^T G^{-1} x_j.
        ginv = mpmath.inverse(g)
        for i, p in enumerate(pivots):
            f[others[p]] = float(ginv[i, i])
        y = ginv * xm
        for k, j in enumerate(nonpiv):
            f[others[j]] = float(sum(xm[i, k] * y[i, k] for i in range(rank)))
    return np.clip(f, 0.0, 1.0)


# ---------------------------------------------------------------------------------------------
# Fixed W, fault-free plan
# ---------------------------------------------------------------------------------------------


#: Below this relative size the fast Gram-matrix orthonormalisation of a new Lanczos block is not
#: trusted and the block goes through the SVD path of :func:`_extend`.
_GRAM_SAFE = 1e-4


def _lanczos_from(
    ws: sp.csr_matrix, start: np.ndarray, n: int, steps: int, ranks: _Ranks
) -> np.ndarray:
    """Orthonormal basis of the block Krylov space K_steps(W, start), ``start`` orthonormal.

    Block Lanczos with full re-orthogonalisation (twice): each new block ``W Q_{j-1}`` is
    orthogonalised against the whole basis, then its singular values decide its rank
    (``ranks`` policy) and only directions at roundoff level are deflated. Stops early once the
    space is invariant. ||W||_2 = 1 for a symmetric stochastic W, so singular values are
    already relative.

    Speed: the large singular values (>= _GRAM_SAFE) come from the eigenvalues of the block's
    small Gram matrix and those directions are orthonormalised by two Gram (Cholesky-QR2 style)
    passes, accurate to working precision at that conditioning; if what remains of the block is
    all below DROP_TOL / 2 (measured by its own Gram matrix) it is deflated. Any other block goes
    through the SVD of :func:`_extend` (same deflation policy, third projection, QR).
    """
    r = start.shape[1]
    b = max(r, 1)
    cap = min(n, b * steps) + b
    basis = np.empty((n, cap))
    basis[:, :r] = start
    last = start
    for _ in range(1, steps):
        kv = last.shape[1]
        if r >= n or kv == 0:
            break
        z = np.asarray(ws @ last)
        bs = basis[:, :r]
        for _ in range(2):
            z -= bs @ (bs.T @ z)
        lam, vec = np.linalg.eigh(z.T @ z)
        lam, vec = lam[::-1], vec[:, ::-1]
        # Gram eigenvalues are accurate to ~eps * lam_max in absolute terms: the clearly large
        # ones (>= _GRAM_SAFE^2) are directions with well separated eigenvectors. Orthonormalise
        # them (two Gram passes), then look at what is left of the block on its own, where the
        # Gram matrix is accurate relative to its (small) size.
        big = int(np.count_nonzero(lam >= _GRAM_SAFE * _GRAM_SAFE))
        q = None
        if r + big <= n:
            if big:
                q = z @ (vec[:, :big] / np.sqrt(lam[:big]))
                l2, v2 = np.linalg.eigh(q.T @ q)
                q = q @ (v2 / np.sqrt(l2))
                rest = z - q @ (q.T @ z)
            else:
                q = np.zeros((n, 0))
                rest = z
            lr = np.linalg.eigvalsh(rest.T @ rest)[::-1]
            if lr[0] <= 0.25 * DROP_TOL * DROP_TOL:
                sv = np.concatenate([np.sqrt(lam[:big]), np.sqrt(np.maximum(lr[: kv - big], 0.0))])
                ranks.count(sv, 1.0)
                if big == 0:
                    break
                if big < kv:
                    q -= bs @ (bs.T @ q)
                    l2, v2 = np.linalg.eigh(q.T @ q)
                    q = q @ (v2 / np.sqrt(l2))
            else:
                q = None
        if q is None:
            q = _extend(bs, z, 1.0, ranks)[:, r:]
        k = q.shape[1]
        if k == 0:
            break
        if r + k > cap:
            cap = max(2 * cap, r + k)
            grown = np.empty((n, cap))
            grown[:, :r] = basis[:, :r]
            basis = grown
        basis[:, r : r + k] = q
        r += k
        last = q
    return basis[:, :r]


def _lanczos_basis(
    ws: sp.csr_matrix, start_cols: list[int], n: int, steps: int, ranks: _Ranks
) -> np.ndarray:
    """K_steps(W, [e_i for i in start_cols]) (distinct indices, so already orthonormal)."""
    q = np.zeros((n, len(start_cols)))
    q[start_cols, range(len(start_cols))] = 1.0
    return _lanczos_from(ws, q, n, steps, ranks)


#: Fast path of the exact plan (:func:`_local_leverages`): a new Lanczos direction is accepted
#: there only at or above this size, far above ``KEEP_TOL`` (an observer with a smaller one goes
#: to the fully re-orthogonalised path, which applies the tolerance policy)...
_LOCAL_KEEP = 1e-3
#: ... and a finished basis only if ``||Q^T Q - I||_F`` is at most this (measured on the
#: double-precision Gram matrix, or, for a few sources, on the single-precision one).
_LOCAL_ORTH = 1e-4
#: Up to this many sources the fast path solves with its Gram matrix G = I + E by a Neumann
#: iteration (a few products with E, whose norm it has bounded) instead of a Cholesky factor.
_NEUMANN_SOURCES = 16
#: Up to ``_NEUMANN_SOURCES`` sources the fast path first vouches for its basis without the
#: double-precision Gram matrix (:func:`_drift_bound`): ``Q^T Q`` summed in double precision
#: from single-precision products over this many rows at a time, whose rounding it bounds...
_SINGLE_ROWS = 512
#: ... and accepted if that bound on ``||Q^T Q - I||_2`` is at most this (G is then within 2 %
#: of the identity), the drift read there at most ``_LOCAL_ORTH`` (the same gate as the Gram
#: matrix's) and every new block's smallest singular value exceeds ``_LOCAL_KEEP`` by at least
#: the bound; else the double-precision Gram matrix decides, as for many sources.
_SINGLE_ORTH = 0.02
#: At most this many refinement steps of the few sources' solve (each two products with Q).
_REFINE_STEPS = 4
#: Observers per task of the fast path (one task per core at a time; each observer runs on its
#: own, so a task holds one Lanczos basis at a time).
_LOCAL_BATCH = 32
#: False: every observer through the reference (:func:`_lanczos_basis`, one after the other),
#: as before the fast path existed; for benchmarks and tests that compare the two.
_EXACT_FAST = True


def _local_leverages(
    ws: sp.csr_matrix, starts: list[list[int]], n: int, steps: int, src: np.ndarray
) -> list[np.ndarray | None]:
    """For each start ``[v, *N(v)]``: ``[Pi]_{uu}`` for u in ``src``, Pi the orthogonal projector
    onto K_steps(W, [e_v, e_N(v)]), or None where this fast path cannot vouch for the result (the
    caller then runs :func:`_lanczos_basis`, the reference).

    Block Lanczos by its three-term recurrence, ``W L - L A - P B^T`` for the last block L and
    the one before it P, with ``A = L^T W L`` and ``B^T = (W P)^T L`` known from the step that
    made L, which is all that exact arithmetic needs for a symmetric W: O(n k^2) per step instead
    of the reference's O(n r k) (k = deg v). The first block is ``[e_v, e_N(v)]`` and the second
    comes from ``W e_N(v)`` alone, projected on the first explicitly: ``W e_v`` lies in the first
    block exactly (the direction the reference deflates at roundoff level).

    In floating point the blocks drift away from orthogonality, but each new block still
    satisfies the block three-term relation to working precision, so the computed Q spans the
    Krylov space (Paige); the projector is then read from that span exactly, through the Gram
    matrix ``G = Q^T Q = U^T U`` (Cholesky): ``[Pi]_{uu} = ||U^{-T} Q[u]||^2``.

    When it is sound. ``||G - I||_F <= _LOCAL_ORTH`` keeps G well conditioned (the leverages are
    then as accurate as from an orthonormal basis) and rules out repeated directions (long
    schedules, where Lanczos vectors lose orthogonality entirely: those observers return None).
    Rank decisions: a new block's singular values here (``s_loc``) are those of the block before
    the projection on the earlier blocks that full re-orthogonalisation also does; that projection
    removes only what the block has along them, which the Gram matrix of the finished basis
    measures, so it changes them by at most the measured loss of orthogonality
    (``s_full >= s_loc - ||G - I||``),
    so a block whose values are all at least ``_LOCAL_KEEP`` here is, there, a block of
    directions well above ``KEEP_TOL``: the reference keeps them too. Any smaller value (a
    deflation, or the ambiguous band) returns None for that observer.

    Few sources (up to ``_NEUMANN_SOURCES``) first try without the double-precision Gram
    matrix, the largest cost of an observer: :func:`_drift_bound` bounds ``||G - I||_2`` from
    single-precision products at about half its cost, rounding included, and where that bound is
    at most ``_SINGLE_ORTH``, the drift read there at most ``_LOCAL_ORTH`` (as below), and
    every new block's smallest singular value exceeds ``_LOCAL_KEEP`` by at least the bound (so
    ``s_full`` stays within a few 1e-4 of ``_LOCAL_KEEP`` or above, far above ``KEEP_TOL``),
    :func:`_refined_leverages` reads ``b^T G^{-1} b`` through products with Q alone (an upper
    bound within ``2^-60 ||b||^2`` of it in exact arithmetic; to roundoff in double precision).
    Otherwise the double-precision Gram matrix decides, as below.

    Cost. Each observer runs on its own, in one contiguous n x r array (r = 1 + k T): its blocks
    are column slices that the small products read in place, the sparse product reads the last
    block, and the Gram matrix is one symmetric rank-r update of that array (no copy). The
    leverages of up to ``_NEUMANN_SOURCES`` sources (when the check above declined) are ``b^T
    G^{-1} b`` for their rows b, by a Neumann iteration on ``G = I + E`` (||E||_2 <= ||E||_F,
    checked above, bounds its error; no factorisation); of up to n / 4, triangular solves of
    their rows; of more, the squared rows of ``Q U^{-1}``, one triangular product in place
    (BLAS ``dtrmm``).
    """
    rows: list[np.ndarray | None] = []
    buf = np.empty(0)
    for start in starts:
        r = len(start) + (len(start) - 1) * (steps - 1)
        if r > n:  # more directions than R^n has: repeated ones
            rows.append(None)
            continue
        if buf.size < n * r:
            buf = np.empty(n * r)
        try:
            q = buf[: n * r].reshape(n, r)
            rows.append(_local_leverage(ws, start, n, steps, src, q))
        except np.linalg.LinAlgError:
            rows.append(None)
    return rows


def _local_leverage(
    ws: sp.csr_matrix,
    start: list[int],
    n: int,
    steps: int,
    src: np.ndarray,
    q: np.ndarray,
) -> np.ndarray | None:
    """One observer of :func:`_local_leverages`; ``q``: a C-contiguous n x r work array (its
    contents are overwritten when many sources are asked for)."""
    from scipy.linalg import blas, lapack, solve_triangular

    b0 = len(start)
    k = b0 - 1
    # Read at call time: the tolerance policy is the module's (a test may widen its band).
    keep = max(_LOCAL_KEEP, 10.0 * KEEP_TOL)
    floor = keep * keep
    q[:, :b0] = 0.0
    q[start, range(b0)] = 1.0
    smallest = 1.0  # a lower bound on every new block's smallest singular value
    hi = b0  # the columns filled so far
    # W e_v is in span(first block): only W e_N(v) brings new directions. ``last``: the last
    # block, contiguous (the sparse product reads it), then copied into q; ``z``: W times it.
    last = np.ascontiguousarray(q[:, 1:b0])
    z = np.empty((n, k))
    product = _block_product(ws)
    coef = None  # P^T W L for the last block L and the one before it P (P^T W L = (W P)^T L)
    ab = np.empty((2 * k, k))  # [P^T W L; L^T W L], refilled at every step
    for _ in range(1, steps if k else 1):
        product(last, z)
        if coef is None:
            # The first step: W e_N(v) projected on the first block [e_v, e_N(v)] explicitly
            # (its rows of v and N(v) become exactly 0).
            first = q[:, :b0]
            z -= first @ (first.T @ z)
        else:
            # Block Lanczos' three-term recurrence: W L - L A - P B^T for the last block L and
            # the one before it P (e_N(v) at the second step: W e_v has no part along L),
            # with B^T = (W P)^T L known from the step that made L (z_prev = L U there, so
            # z_prev^T L = U^T); only A = L^T W L is a new product. One product subtracts both.
            ab[:k] = coef
            ab[k:] = q[:, hi - k : hi].T @ z
            z -= q[:, hi - 2 * k : hi] @ ab
        # Orthonormalised through its Gram matrix z^T z = R^T R (Cholesky), q = z R^{-1}: what
        # roundoff leaves is measured (G) and corrected with the rest at the end. Its smallest
        # eigenvalue is at least 1 / ||R^{-1}||_F^2, so a block that passes that bound has every
        # singular value at or above the floor.
        upper, info = lapack.dpotrf(z.T @ z, lower=0, clean=1)
        if not info:
            inv, info = lapack.dtrtri(upper, lower=0)
        if info or not (frob := float(np.vdot(inv, inv))) * floor <= 1.0:
            # A small direction: the Gram matrix cannot size it, the SVD can. Any direction
            # below the floor, a deflation included, is left to the reference. (Even an exactly
            # zero one, from a neighbour whose neighbourhood lies in [v, N(v)]: with such
            # deflations a geometric graph's observer came out 9e-8 below the reference with
            # every other check passed.)
            u, sv, vt = np.linalg.svd(z, full_matrices=False)
            if not sv[-1] >= keep:
                return None
            smallest = min(smallest, float(sv[-1]))
            coef = (sv[:, None] * vt).T  # z = u S V^T, the new block u: z^T u = V S
            last[...] = u
        else:
            smallest = min(smallest, 1.0 / math.sqrt(frob))
            coef = upper.T
            # z R^{-1} in place (BLAS dtrmm on the Fortran-ordered transpose: R^{-T} z^T); z
            # becomes the new block and the old block's array takes the next product.
            done = blas.dtrmm(1.0, inv, z.T, side=0, lower=0, trans_a=1, overwrite_b=1).T
            last, z = done, last
        q[:, hi : hi + k] = last
        hi += k
    # The single-precision check, unless its rounding term alone (about c r) rules it out.
    if src.size <= _NEUMANN_SOURCES and _single_rounding(n) * q.shape[1] <= _SINGLE_ORTH:
        read, drift = _drift_bound(q)
        if read <= _LOCAL_ORTH and drift <= _SINGLE_ORTH and smallest - drift >= keep:
            lev = _refined_leverages(q, src, drift)
            if lev is not None:
                return lev
    # G = Q^T Q, one symmetric rank-r update (numpy's product of an array with its own transpose).
    r = q.shape[1]
    g = q.T @ q
    g.flat[:: r + 1] -= 1.0
    dev = float(np.linalg.norm(g))  # ||G - I||_F
    if not dev <= _LOCAL_ORTH:
        return None
    if src.size <= _NEUMANN_SOURCES:
        # A few sources: G^{-1} b (b = Q[u]^T) without factorising G = I + E. ||E||_2 <= dev,
        # so x <- b - E x from x = b converges to it, and after m steps
        # ||x - G^{-1} b|| <= dev^(m+1) ||b|| / (1 - dev); m is the least for which that bound is
        # at most 2^-60 ||b|| (m <= 4 at dev <= 1e-4). [Pi]_uu = b^T G^{-1} b.
        b = q[src].T
        x = b.copy()
        bound = dev / (1.0 - dev)
        while bound > 2.0**-60:
            x = b - g @ x
            bound *= dev
        return np.einsum("ij,ij->j", b, x)
    g.flat[:: r + 1] += 1.0  # exact: each |G_ii - 1| <= dev, far below 1/2
    # G = U^T U (LAPACK reads the symmetric G as its Fortran-ordered transpose, in place);
    # [Pi]_uu = ||U^{-T} Q[u]||^2.
    upper, info = lapack.dpotrf(g.T, lower=0, overwrite_a=1, clean=1)
    if info:
        return None
    if src.size * 4 <= n:
        x = solve_triangular(upper, q[src].T, trans="T", check_finite=False)
        return np.einsum("ij,ij->j", x, x)
    # Many sources: the rows of Q U^{-1} (U^{-1} is as well conditioned as U, G being near I),
    # as one triangular product in place (BLAS dtrmm, n r^2 / 2 multiply-adds: Q^T, the
    # Fortran-ordered view of the C-ordered Q, becomes U^{-T} Q^T).
    inv, info = lapack.dtrtri(upper, lower=0, overwrite_c=1)
    if info:
        return None
    yt = blas.dtrmm(1.0, inv, q.T, side=0, lower=0, trans_a=1, overwrite_b=1)
    lev = np.einsum("ij,ij->j", yt, yt)
    return lev if src.size == n and np.array_equal(src, np.arange(n)) else lev[src]


def _block_product(ws: sp.csr_matrix):
    """``product(x, out)``: ``out[...] = ws @ x`` for n x k arrays (``out`` C-contiguous
    float64), the same sums in the same order as scipy's product (its ``csr_matvecs``) without
    the checks, conversions and new array of every call (about 15 us of the 200 an observer's
    step takes on the 2048-node Erdos-Renyi graph, 29 steps an observer). Falls back to ``ws @
    x`` where that routine is not there."""
    try:
        from scipy.sparse import _sparsetools

        matvecs = _sparsetools.csr_matvecs
    except (ImportError, AttributeError):  # pragma: no cover - another scipy layout
        matvecs = None
    if matvecs is None or ws.dtype != np.float64 or ws.format != "csr":

        def plain(x: np.ndarray, out: np.ndarray) -> None:
            out[...] = ws @ x

        return plain
    rows, cols = ws.shape
    indptr, indices, data = ws.indptr, ws.indices, ws.data

    def product(x: np.ndarray, out: np.ndarray) -> None:
        if x.ndim != 2 or x.shape[0] != cols or out.shape != (rows, x.shape[1]):
            raise ValueError(f"shapes {x.shape} -> {out.shape} do not fit a {rows} x {cols} matrix")
        if not out.flags.c_contiguous or out.dtype != np.float64:  # else the sums are lost
            raise ValueError("the product's output must be a C-contiguous float64 array")
        out.fill(0.0)  # the routine adds to it
        flat = np.ascontiguousarray(x, dtype=np.float64).reshape(-1)
        matvecs(rows, cols, x.shape[1], indptr, indices, data, flat, out.reshape(-1))

    return product


_U32 = 2.0**-24  # unit roundoff of single precision
_U64 = 2.0**-53  # and of double precision


def _single_rounding(n: int) -> float:
    """The constant c of :func:`_drift_bound` for n rows: ``|S - Q^T Q| <= c |Q|^T |Q|``."""
    rows = min(n, _SINGLE_ROWS)
    chunks = -(-n // _SINGLE_ROWS)
    gb = rows * _U32 / (1.0 - rows * _U32)
    gm = chunks * _U64 / (1.0 - chunks * _U64)
    return gb * (1.0 + _U32) ** 2 + 2.0 * _U32 + _U32 * _U32 + gm * (1.0 + gb) * (1.0 + _U32) ** 2


def _drift_bound(q: np.ndarray) -> tuple[float, float]:
    """``(read, bound)``: ``||S - I||_F``, the drift read in single precision, and an upper
    bound on ``||Q^T Q - I||_2``, at half the cost of the double-precision Gram matrix:
    ``S = sum_c fl32(H_c^T H_c)``, H = Q rounded to single precision, H_c its rows in chunks of
    ``_SINGLE_ROWS``, each chunk's product converted exactly and summed in double precision.

    Rounding, entry by entry (Higham's bound for inner products in any order of summation,
    fused or not): ``|H - Q| <= u|Q|``; a chunk's product is off by at most ``gamma_b |H_c|^T
    |H_c|`` (b rows, ``gamma_b = b u / (1 - b u)``, u = 2^-24); the double-precision sum of m
    chunks by at most ``gamma_m |S_c|`` summed (u = 2^-53). So ``|S - Q^T Q| <= c |Q|^T |Q|``
    with ``c`` below, and ``|| |Q|^T |Q| ||_2 = || |Q| ||_2^2 <= ||Q||_F^2 = tr(Q^T Q) <=
    tr(S) / (1 - c)``. Then ``||Q^T Q - I||_2 <= ||S - I||_F + c tr(S) / (1 - c)``, the two
    norms taken with a margin for their own double-precision rounding. Underflow adds at most
    ``2^-149`` an entry of H and of a product; a term for it is added too. At n = 2048, r = 307
    the rounding term is about 0.009, far above the drift itself (at most 6e-6 on the 2 048-node
    Erdős–Rényi graph), and the tests on it (``_SINGLE_ORTH``, the margin above
    ``_LOCAL_KEEP``) leave room for it."""
    n, r = q.shape
    # Each chunk rounded into one small buffer that stays in the core's cache (the whole of H,
    # 2.4 MiB at n = 2048 and r = 307, was streamed through memory by two observers at a time).
    h = np.empty((min(n, _SINGLE_ROWS), r), dtype=np.float32)
    s = np.zeros((r, r))
    for lo in range(0, n, _SINGLE_ROWS):
        hc = h[: min(_SINGLE_ROWS, n - lo)]
        np.copyto(hc, q[lo : lo + _SINGLE_ROWS], casting="same_kind")
        s += hc.T @ hc
    c = _single_rounding(n)
    trace = float(np.trace(s)) * (1.0 + 1e-12)
    s.flat[:: r + 1] -= 1.0
    dev = float(np.linalg.norm(s)) * (1.0 + 1e-10)
    underflow = float(r) * (n + 1) * 2.0**-147
    return dev, dev + c * trace / (1.0 - c) + underflow


def _refined_leverages(
    q: np.ndarray, src: np.ndarray, drift: float, tol: float = 2.0**-60
) -> np.ndarray | None:
    """``b^T G^{-1} b`` for the rows ``b = Q[u]^T`` of the sources, ``G = Q^T Q`` never formed:
    ``G x`` is two products with Q. From ``x = b``, each step computes the residual ``g = G x -
    b`` and stops once the bound below is at most ``tol ||b||^2``; else ``x <- x - g``
    (Richardson's iteration, which contracts by ``||G - I||_2 <= drift`` a step).

    The value returned, ``2 b^T x - x^T G x + ||g||^2 / (1 - drift)``, is an upper bound on
    ``b^T G^{-1} b`` within that bound of it, in exact arithmetic: with ``x* = G^{-1} b``, ``b^T
    x* - (2 b^T x - x^T G x) = (x - x*)^T G (x - x*) = g^T G^{-1} g``, between 0 and ``||g||^2 /
    lambda_min(G)``, and ``lambda_min(G) >= 1 - drift``. In double precision the products' own
    rounding (about 1e-15 ||b||^2) is larger than the default ``tol``: the value is then the
    leverage to roundoff, as the Gram matrix's path gives it. None if the steps run out (the
    Gram matrix then decides)."""
    b = q[src].T
    x = b
    limit = tol * np.einsum("ij,ij->j", b, b)
    for _ in range(_REFINE_STEPS + 1):
        gx = q.T @ (q @ x)
        g = gx - b
        gap = np.einsum("ij,ij->j", g, g) / (1.0 - drift)
        if np.all(gap <= limit):
            return 2.0 * np.einsum("ij,ij->j", b, x) - np.einsum("ij,ij->j", x, gx) + gap
        x = x - g
    return None


def _observers_factors(
    ws: sp.csr_matrix,
    w,
    group: list[int],
    n: int,
    steps: int,
    src: np.ndarray,
    strict: bool,
    resolve: bool = False,
) -> tuple[list[np.ndarray], list[bool]]:
    """Exact fault-free factors of the sources ``src`` towards each observer of ``group``: the
    fast path, else the reference for that observer (:func:`_reference_row`); and, for each,
    whether its row is an upper bound (``resolve``)."""
    starts = [[v, *_neighbours(w, v)] for v in group]
    rows = _local_leverages(ws, starts, n, steps, src)
    upper = [False] * len(group)
    for i, (v, start) in enumerate(zip(group, starts, strict=True)):
        if rows[i] is None:
            rows[i], upper[i] = _reference_row(ws, w, v, start, n, steps, src, strict, resolve)
        rows[i] = np.clip(rows[i], 0.0, 1.0)
    return rows, upper


def _reference_row(
    ws: sp.csr_matrix,
    w,
    v: int,
    start: list[int],
    n: int,
    steps: int,
    src: np.ndarray,
    strict: bool,
    resolve: bool,
) -> tuple[np.ndarray, bool]:
    """Observer v's factors by the reference (:func:`_lanczos_basis`), and whether they are an
    upper bound. A rank decision in the band float64 cannot resolve raises
    :class:`NumericalRankError` (``strict``), unless ``resolve``: then, up to
    ``RATIONAL_MAX_NODES`` nodes, exact rational arithmetic decides (the exact row, not a
    bound); beyond, or where that arithmetic is out of reach, the ambiguous directions are kept
    (``strict=False``). Keeping a direction can only enlarge the observer's span, and
    ``[Pi]_uu = ||Pi e_u||^2`` grows with the span: the row is then an upper bound, never below
    the exact one."""
    try:
        q = _lanczos_basis(ws, start, n, steps, _Ranks(strict, f"observer {v}"))
        upper = False
    except NumericalRankError:
        if not resolve:
            raise
        if n <= RATIONAL_MAX_NODES:
            dense = w.toarray() if sp.issparse(w) else np.asarray(w, dtype=np.float64)
            schedule = fault_free_steps(dense, steps, False)
            try:
                exact = exact_factors_rational(schedule, v, fault_free_received(dense, v, steps))
                return exact[src], False
            except ExactTooLargeError:
                pass
        q = _lanczos_basis(ws, start, n, steps, _Ranks(False, f"observer {v}"))
        upper = True
    qs = q[src]
    return np.einsum("ij,ij->i", qs, qs), upper


#: Below this many nodes the observers run in the calling process (forking costs more than it
#: saves on small graphs).
_PARALLEL_MIN_N = 256


def _fill_observers(
    fn, batches: list[list[int]], out: np.ndarray, n: int, marks: np.ndarray
) -> None:
    """``out[batch], marks[batch] = fn(batch)`` for every batch of observers (rows of ``out``;
    ``marks``: 1.0 where that row is an upper bound). On a graph of at
    least ``_PARALLEL_MIN_N`` nodes the batches are spread over one forked child per core
    (:mod:`coordinator_free.forkwork`; scipy's sparse products and its BLAS and LAPACK wrappers
    hold the interpreter lock, so threads shared them poorly), with BLAS held to one thread in
    each so they do not oversubscribe the cores. Each observer's row is computed on its own, the
    same way in any process."""
    done = forkwork.ticks([len(b) for b in batches], "exact loss, observer")
    if n < _PARALLEL_MIN_N or forkwork.cores() < 2:
        # On one thread here too, as in the children: an observer's products are too small for
        # BLAS's threads, which only spin beside it (the 200-node Erdos-Renyi plan took twice as
        # long).
        from coordinator_free.blas import one_thread_scipy_included

        with one_thread_scipy_included():
            for i, batch in enumerate(batches):
                out[batch], marks[batch] = fn(batch)
                done(i)
        return
    shared = forkwork.shared_array(out.shape)
    shared_marks = forkwork.shared_array(marks.shape)

    def task(i: int) -> None:
        shared[batches[i]], shared_marks[batches[i]] = fn(batches[i])

    forkwork.fill_numeric(task, len(batches), done=done)
    out[...] = shared
    marks[...] = shared_marks


def _chebyshev_columns(ws, cols: np.ndarray, steps: int, gamma: float):
    """Yields C_t[:, cols] for t = 0..steps-1 (C_t = P_t(W), symmetric)."""
    prev = None
    cur = cols
    for t in range(steps):
        yield t, cur
        if t == steps - 1:
            break
        nxt = ws @ cur
        if t >= 1 and gamma != 1.0:
            nxt = gamma * nxt + (1.0 - gamma) * prev
        prev, cur = cur, nxt


def plan_factors(
    w: np.ndarray,
    steps: int,
    accelerated: bool,
    *,
    method: str,
    observers: Sequence[int] | None = None,
    sources: Sequence[int] | None = None,
    gamma: float | None = None,
    strict: bool = True,
    symmetry: bool = True,
    bounds: list[int] | None = None,
) -> np.ndarray:
    """Fault-free loss factors ``F[i, j]`` = factor of source ``sources[j]`` towards observer
    ``observers[i]`` (defaults: all nodes), for the fixed symmetric W, ``steps`` = T gossip
    steps, plain or Chebyshev-accelerated (``gamma`` defaults to the optimal one).

    ``symmetry``: when W is invariant under a transitive group of node translations
    (:func:`translations`), compute observer 0's row only and move it to every observer.

    ``method="exact"``: per observer the projector onto K_T(W, [e_v, e_N(v)]); accelerated and
    plain give the same result. ``F[v, v] = 1``. Observers run in batches through
    :func:`_local_leverages` (else :func:`_lanczos_basis`), on one process per core; one source
    saves the last O(n r^2) product per observer, not the basis.
    ``method="paper"``: Eq. (6) with C_t = P_t(W) (accelerated) or W^t, t = 0..T-1, via the
    sparse recursion on dense n x n (memory 3 n^2 floats), or on the columns of the observers'
    neighbours only when they are few. ``F[v, v]`` is the raw sum.

    ``w`` may be a scipy sparse matrix (a plan past ``graphs.DENSE_MAX_N`` nodes): then every
    path that needs no dense n x n matrix works (exact per observer, the translation-symmetric
    one, Eq. (6) for few observers); the others are refused.

    ``bounds`` (exact, ``strict``): a list to collect the observers whose row is an upper bound.
    Given, an observer whose rank decision falls in the band float64 cannot resolve does not
    raise :class:`NumericalRankError`: up to ``RATIONAL_MAX_NODES`` nodes exact rational
    arithmetic gives its exact row; beyond, its ambiguous directions are kept, an upper bound
    never below the exact row, and its id is appended to ``bounds`` (:func:`_reference_row`).
    """
    w = _check_w(w)
    n = w.shape[0]
    if steps < 1:
        raise ValueError("steps must be >= 1")
    obs = np.arange(n) if observers is None else np.asarray(observers, dtype=np.int64)
    src = np.arange(n) if sources is None else np.asarray(sources, dtype=np.int64)
    for name, arr in (("observers", obs), ("sources", src)):
        if arr.size and (arr.min() < 0 or arr.max() >= n):
            raise ValueError(f"{name} out of range 0..{n - 1}")
    ws = sp.csr_matrix(w)
    shift = translations(ws) if symmetry and obs.size > 1 else None
    if shift is not None:
        # A vertex-transitive W (hypercube, ring, complete graph): one observer's row gives
        # every row, F[v, u] = F[0, shift(v)[u]], exactly as the losses are equal.
        first: list[int] | None = None if bounds is None else []
        row = plan_factors(w, steps, accelerated, method=method, observers=[0], gamma=gamma,
                           strict=strict, symmetry=False, bounds=first)[0]  # fmt: skip
        out = np.empty((obs.size, src.size))
        for i, v in enumerate(obs.tolist()):
            out[i] = row[shift(v)[src]]
        if first and bounds is not None:  # every row is observer 0's, moved
            bounds.extend(obs.tolist())
        return out
    if method == "exact":
        out = np.empty((obs.size, src.size))
        marks = np.zeros(obs.size)
        resolve = bounds is not None and strict
        if not _EXACT_FAST:
            for i, v in enumerate(obs.tolist()):
                start = [v, *_neighbours(w, v)]
                row, up = _reference_row(ws, w, v, start, n, steps, src, strict, resolve)
                out[i], marks[i] = np.clip(row, 0.0, 1.0), float(up)
                progress.tick(i + 1, obs.size, "exact loss, observer")
        else:
            # The last observers in smaller tasks: the cores finish within one of them.
            taper = 2 * _LOCAL_BATCH * forkwork.cores()
            batches = [list(r) for r in forkwork.chunks(obs.size, _LOCAL_BATCH, taper=taper)]
            _fill_observers(
                lambda idx: _observers_factors(
                    ws, w, obs[idx].tolist(), n, steps, src, strict, resolve
                ),
                batches,
                out,
                n,
                marks,
            )
        out[obs[:, None] == src[None, :]] = 1.0
        if bounds is not None:
            bounds.extend(obs[marks > 0].tolist())
        return out
    if method == "paper":
        g = (gamma if gamma is not None else _gamma_for(w)) if accelerated else 1.0
        heard = sorted({x for v in obs.tolist() for x in _neighbours(w, v)})
        if len(heard) * 4 < n:
            # Few observers: only their neighbours' rows of C_t matter (C_t[x] = C_t e_x).
            pos = {x: j for j, x in enumerate(heard)}
            acc = np.zeros((obs.size, src.size))
            for t, c in _chebyshev_columns(ws, np.eye(n)[:, heard], steps, g):
                terms = c[src] ** 2 / np.einsum("ij,ij->j", c, c)[None, :]  # (sources, heard)
                for i, v in enumerate(obs.tolist()):
                    acc[i] += terms[:, [pos[x] for x in _neighbours(w, v)]].sum(axis=1)
                progress.tick(t + 1, steps, "Eq. (6), gossip step")
            return acc
        if sp.issparse(w):
            raise ValueError(
                f"Eq. (6) for {obs.size} of {n} observers needs dense n x n matrices; name fewer "
                "observers (at most a quarter of the nodes hearing them), or use a graph with "
                "translation symmetry (hypercube, ring, complete)"
            )
        adj = ws.copy()
        adj.setdiag(0.0)
        adj.eliminate_zeros()
        adj.data[:] = 1.0
        adj_obs = adj[obs]
        acc = np.zeros((obs.size, src.size))
        for t, (_, c) in enumerate(_chebyshev_columns(ws, np.eye(n), steps, g)):
            # C_t is symmetric: row norms are column norms.
            norms = np.einsum("ij,ij->j", c, c)
            cs = c[:, src] if sources is not None else c
            acc += adj_obs @ (cs * cs / norms[:, None])
            progress.tick(t + 1, steps, "Eq. (6), gossip step")
        return acc
    raise ValueError(f"unknown method {method!r}; expected 'exact' or 'paper'")


def translations(ws: sp.csr_matrix):
    """A transitive group of automorphisms of W, as ``shift(v)``: the permutation p with
    ``F[v, u] = F[0, p[u]]`` for any loss that depends on W alone, or None (the groups tried
    and how they are checked: :func:`coordinator_free.graphs.translation_group`)."""
    from coordinator_free.graphs import translation_group

    group = translation_group(ws)
    idx = np.arange(ws.shape[0])
    if group == "xor":
        return lambda v: idx ^ v
    if group == "cyclic":
        return lambda v: (idx - v) % idx.size
    return None


def coalition_factors(
    w: np.ndarray, steps: int, coalition: Sequence[int], *, strict: bool = True
) -> np.ndarray:
    """Fault-free exact loss factors of every source towards the joint view of a coalition of
    observers (they pool what they saw), shape (n,); members get 1.

    The joint view is the span of the members' own coordinates and of every message a member
    received, ``span{e_a} + span{C_t[x, :] : t < T, x in N(a)}``; as for one observer, that is
    the block Krylov space ``K_T(W, [e_A, e_N(A)])``. A source with factor 1 is fully exposed:
    the coalition can solve for its noisy input from what it saw.
    """
    w = _check_w(w)
    n = w.shape[0]
    members = sorted({int(a) for a in coalition})
    if not members or members[0] < 0 or members[-1] >= n:
        raise ValueError(f"a coalition needs members in 0..{n - 1}, got {list(coalition)}")
    if steps < 1:
        raise ValueError("steps must be >= 1")
    start = sorted(set(members).union(*(_neighbours(w, a) for a in members)))
    ranks = _Ranks(strict, f"coalition {members}")
    q = _lanczos_basis(sp.csr_matrix(w), start, n, steps, ranks)
    f = np.clip(np.einsum("ij,ij->i", q, q), 0.0, 1.0)
    f[members] = 1.0
    return f


def coalition_received(w: np.ndarray, coalition: Sequence[int], steps: int) -> set[tuple[int, int]]:
    """Messages (t, x) a coalition gets in a fault-free run: every member's neighbours'."""
    return {m for a in coalition for m in fault_free_received(w, a, steps)}


def coalition_exact_factors(
    steps: Sequence[Step],
    coalition: Sequence[int],
    received: dict[int, Iterable[tuple[int, int]]],
    *,
    strict: bool = True,
    float_first: bool = True,
) -> np.ndarray:
    """Exact loss factors of every source towards a coalition's joint view for a realised
    schedule (``received``: member -> the messages (t, x) it got), shape (n,); members get 1.

    Fault-free on a fixed W: :func:`coalition_factors` (any n; up to ``RATIONAL_MAX_NODES``
    nodes a rank decision float64 cannot make goes to the exact arithmetic below instead of
    raising :class:`NumericalRankError`). Otherwise the rows of every
    message any member got are reduced exactly over the coordinates of the non-members (each
    member knows its own noise), as :func:`exact_factors_rational` does for one observer; more
    than ``RATIONAL_MAX_NODES`` nodes raise :class:`ExactTooLargeError`
    (:func:`coalition_upper_factors` then bounds the loss from above). ``float_first=False``
    goes to the exact arithmetic at once: for a caller whose :func:`coalition_factors` of the
    same fault-free schedule has just raised :class:`NumericalRankError` (the float64 basis
    is not built a second time to raise it again)."""
    ms, gs, n = _check_steps(steps)
    members = sorted({int(a) for a in coalition})
    if not members or members[0] < 0 or members[-1] >= n:
        raise ValueError(f"a coalition needs members in 0..{n - 1}, got {list(coalition)}")
    rec: set[tuple[int, int]] = set()
    for a in members:
        mine = _check_received(received.get(a, ()), a, n, len(ms))
        _check_used_observed(ms, a, mine)
        rec.update(mine)
    w = _fixed_w(ms, gs)
    if float_first and w is not None and rec == coalition_received(w, members, len(ms)):
        try:
            return coalition_factors(w, len(ms), members, strict=strict)
        except NumericalRankError:
            # A rank decision float64 cannot make: exact arithmetic makes it, where it can.
            if n > RATIONAL_MAX_NODES:
                raise
    if n > RATIONAL_MAX_NODES:
        raise ExactTooLargeError(
            f"exact loss of a coalition under a schedule with faults needs exact arithmetic, "
            f"supported up to {RATIONAL_MAX_NODES} nodes (got {n})"
        )
    drop = set(members)
    need = max((t for t, _ in rec), default=0)
    by_t: dict[int, list[int]] = {}
    for t, x in sorted(rec):
        by_t.setdefault(t, []).append(x)
    m_cols = n - len(drop)
    basis: list[tuple[int, list[int]]] = []
    for t, cur, _den in exact_coefficients(steps, need):
        for x in by_t.get(t, []):
            if len(basis) == m_cols:
                break
            basis = _reduce_into(basis, [c for j, c in enumerate(cur[x]) if j not in drop])
        if len(basis) == m_cols:
            break
    return projector_diagonal(basis, n, members)


def coalition_upper_factors(
    w: np.ndarray,
    steps: Sequence[Step],
    coalition: Sequence[int],
    received: dict[int, Iterable[tuple[int, int]]],
    *,
    strict: bool = True,
) -> np.ndarray:
    """An upper bound on :func:`coalition_exact_factors` for any n, as
    :func:`exact_upper_factors` bounds one observer's: the joint view lies in the block Krylov
    space of W started at the members, the senders they heard and the row spaces of the
    deviations ``M_s - W``."""
    w = _check_w(w)
    ms, _, n = _check_steps(steps)
    members = sorted({int(a) for a in coalition})
    if w.shape[0] != n:
        raise ValueError("W and the schedule have different sizes")
    senders: set[int] = set()
    for a in members:
        mine = _check_received(received.get(a, ()), a, n, len(ms))
        _check_used_observed(ms, a, mine)
        senders.update(x for _, x in mine)
    return _krylov_upper(w, ms, members, senders, _Ranks(strict, f"coalition {members}"))


def plan_exact_diagnostics(
    w: np.ndarray, steps: int, observers: Sequence[int] | None = None
) -> RankDiagnostics:
    """Merged :class:`RankDiagnostics` of the exact plan for the given observers (non-strict)."""
    w = _check_w(w)
    n = w.shape[0]
    ws = sp.csr_matrix(w)
    out = RankDiagnostics(0, math.inf, 0.0, 0)
    todo = list(range(n) if observers is None else observers)
    for i, v in enumerate(todo):
        ranks = _Ranks(False, f"observer {v}")
        q = _lanczos_basis(ws, [v, *_neighbours(w, v)], n, steps, ranks)
        out = out.merge(ranks.diagnostics(q.shape[1]))
        progress.tick(i + 1, len(todo), "rank checks, observer")
    return out


# ---------------------------------------------------------------------------------------------
# Exact factor, general realised schedule (dispatch) and the Krylov upper bound
# ---------------------------------------------------------------------------------------------


class ExactTooLargeError(ValueError):
    """The schedule is too large for exact rational arithmetic (nodes or coefficient size)."""


def _check_used_observed(ms: list[np.ndarray], observer: int, rec: list[tuple[int, int]]) -> None:
    """Every message the observer *used* (M_t[v, w] != 0) must be among those it observed."""
    seen = set(rec)
    for t, m in enumerate(ms):
        for x in np.flatnonzero(m[observer]):
            x = int(x)
            if x != observer and (t, x) not in seen:
                raise ValueError(
                    f"inconsistent schedule: observer {observer} uses the step-{t} message of "
                    f"node {x} (M_{t}[{observer}, {x}] != 0) but it is not listed as received"
                )


def _fixed_w(ms: list[np.ndarray], gs: list[float]) -> np.ndarray | None:
    """W if every step uses the same symmetric W and no gamma_t is 0.

    Then C_t is a polynomial in W of exact degree t (leading coefficient prod gamma_s), so the
    rows observed from a neighbour over t < T span the Krylov space whatever the gammas are.
    """
    w = ms[0]
    if not np.array_equal(w, w.T):
        return None
    if any(m is not w and not np.array_equal(m, w) for m in ms[1:]):
        return None
    if any(g == 0.0 for g in gs):
        return None
    return w


def exact_factors(
    steps: Sequence[Step],
    observer: int,
    received: Iterable[tuple[int, int]],
    *,
    strict: bool = True,
) -> np.ndarray:
    """Exact loss factors ``[Pi_v]_{uu}`` for every source u, shape (n,), for a realised
    schedule (any rows M_t, any gammas with gamma_0 = 1, missed and late messages).

    * Fault-free fixed W, and the observer saw exactly its neighbours' messages at every step:
      block Lanczos on K_T(W, [e_v, e_N(v)]) (any n; same as :func:`plan_factors`).
      Where a rank decision there falls in the band float64 cannot resolve, up to
      ``RATIONAL_MAX_NODES`` nodes exact rational arithmetic decides (below); beyond, ``strict``
      raises :class:`NumericalRankError` and ``strict=False`` keeps the direction (an upper
      bound).
    * Otherwise: :func:`exact_factors_rational` (exact; at most ``RATIONAL_MAX_NODES`` nodes).
      Larger faulty schedules raise :class:`ExactTooLargeError`; :func:`exact_upper_factors`
      then gives a numerically stable upper bound.

    Raises ValueError if the observer used a message it is not listed as having received.
    """
    ms, gs, n = _check_steps(steps)
    rec = _check_received(received, observer, n, len(ms))
    _check_used_observed(ms, observer, rec)
    w = _fixed_w(ms, gs)
    if w is not None and set(rec) == set(fault_free_received(w, observer, len(ms))):
        try:
            return plan_factors(
                w, len(ms), False, method="exact", observers=[observer], strict=strict
            )[0]
        except NumericalRankError:
            # A rank decision float64 cannot make: exact arithmetic makes it, where it can.
            if n > RATIONAL_MAX_NODES:
                raise
    if n > RATIONAL_MAX_NODES:
        raise ExactTooLargeError(
            f"exact loss of a schedule with faults needs exact arithmetic, supported up to "
            f"{RATIONAL_MAX_NODES} nodes (got {n}); use exact_upper_factors for an upper bound"
        )
    return exact_factors_rational(steps, observer, rec)


def exact_upper_factors(
    w: np.ndarray,
    steps: Sequence[Step],
    observer: int,
    received: Iterable[tuple[int, int]],
    *,
    strict: bool = True,
    span: np.ndarray | None = None,
) -> np.ndarray:
    """Upper bound on the exact factors of a realised schedule whose rows deviate from a fixed
    symmetric W (missed messages, late messages, any gammas), computed stably for any n.
    ``span``: :func:`fault_span` of the same W and schedule, which every observer shares (an
    audit computes it once instead of once per observer).

    With ``M_s = W + D_s``, every observed row satisfies
    ``C_t^T e_w in span{W^k e_w, W^k r : k < T, r in rowspace(D_s), s <= T-2}`` (expand the
    products of ``M_s^T = W + D_s^T``; ``D_s^T x`` lies in the row space of D_s, which for a miss
    (v, x) is ``e_v - e_x``). So the observed span lies in the block Krylov space
    ``K_T(W, [e_v, senders, rowspaces of D_s])`` and the projection onto it bounds the factor
    from above. Equal to the exact factor when the schedule is fault-free.
    """
    w = _check_w(w)
    ms, _, n = _check_steps(steps)
    if w.shape[0] != n:
        raise ValueError("W and the schedule have different sizes")
    rec = _check_received(received, observer, n, len(ms))
    _check_used_observed(ms, observer, rec)
    if span is not None and span.shape[0] != n:
        raise ValueError("the fault span and the schedule have different sizes")
    return _krylov_upper(
        w, ms, [observer], {x for _, x in rec}, _Ranks(strict, f"observer {observer}"), span
    )


def fault_span(w: np.ndarray, steps: Sequence[Step], *, strict: bool = True) -> np.ndarray:
    """Orthonormal basis of the row spaces of the deviations ``M_s - W`` (s <= T-2) of a
    schedule: the part of :func:`exact_upper_factors`'s Krylov start that is the same for every
    observer (an n x n SVD of the stacked rows, the bulk of that bound's cost)."""
    w = _check_w(w)
    ms, _, n = _check_steps(steps)
    if w.shape[0] != n:
        raise ValueError("W and the schedule have different sizes")
    return _fault_span(w, ms, _Ranks(strict, "the fault rows of the schedule"))


def _fault_span(w, ms, ranks: _Ranks) -> np.ndarray:
    n = w.shape[0]
    extra = []
    for m in ms[: max(len(ms) - 1, 0)]:
        d = m - w
        rows = np.flatnonzero(np.any(d != 0.0, axis=1))
        if rows.size:
            extra.append(d[rows].T)
    if not extra:
        return np.zeros((n, 0))
    blk = np.hstack(extra)
    return _extend(np.zeros((n, 0)), blk / np.linalg.norm(blk, axis=0), 1.0, ranks)


def _krylov_upper(
    w, ms, members: list[int], senders: set[int], ranks: _Ranks, span: np.ndarray | None = None
) -> np.ndarray:
    """Projector diagonal of ``K_T(W, [e_members, e_senders, rowspaces of M_s - W])``, the
    members set to 1; ``span``: the row spaces' orthonormal basis (:func:`fault_span`), when
    the caller has it."""
    n = w.shape[0]
    if span is None:
        span = _fault_span(w, ms, ranks)
    start = np.eye(n)[:, sorted(set(members) | senders)]
    basis = _extend(span, start, 1.0, ranks)
    q = _lanczos_from(sp.csr_matrix(w), basis, n, len(ms), ranks)
    f = np.clip(np.einsum("ij,ij->i", q, q), 0.0, 1.0)
    f[members] = 1.0
    return f


# ---------------------------------------------------------------------------------------------
# Summaries
# ---------------------------------------------------------------------------------------------


def distance_summary(factors: np.ndarray, distances: np.ndarray) -> dict[int, dict[str, float]]:
    """Per hop distance d >= 1: count, mean, min and max of ``factors`` over pairs at distance d.

    ``factors`` and ``distances`` have the same shape (e.g. F[v, u] and the hop distance
    between v and u); pairs with distance 0 (u = v) or negative (unreachable) are skipped.
    """
    f = np.asarray(factors, dtype=np.float64).ravel()
    d = np.asarray(distances).ravel()
    if f.shape != d.shape:
        raise ValueError("factors and distances must have the same shape")
    mask = d >= 1
    f, d = f[mask], d[mask].astype(np.int64)
    out: dict[int, dict[str, float]] = {}
    if d.size == 0:
        return out
    cnt = np.bincount(d)
    tot = np.bincount(d, weights=f)
    mx = np.full(cnt.size, -np.inf)
    mn = np.full(cnt.size, np.inf)
    np.maximum.at(mx, d, f)
    np.minimum.at(mn, d, f)
    for k in np.flatnonzero(cnt):
        out[int(k)] = {
            "count": int(cnt[k]),
            "mean": float(tot[k] / cnt[k]),
            "min": float(mn[k]),
            "max": float(mx[k]),
        }
    return out
