"""Joint privacy loss of multi-round Muffliato-GD / D-SGD (R rounds of K gossip steps each).

Mechanism, per coordinate (the noise is isotropic, so one coordinate suffices). W is the public
gossip matrix; gamma_0 = 1 and gamma_k = gamma (Chebyshev) for k >= 1 if accelerated, else 1::

    theta^0 public
    round r = 0..R-1:
        z^r_w = g^r_w + eta^r_w                  (clipped gradient + fresh N(0, sigma^2) noise)
        x^{r,0} = theta^r - nu z^r
        for k = 0..K-1:  every node w sends x^{r,k}_w to its neighbours;
                         x^{r,k+1} = gamma_k M_{r,k} x^{r,k} + (1 - gamma_k) x^{r,k-1}
        theta^{r+1} = x^{r,K}

Fault-free ``M_{r,k} = W``; with faults the realised rows (a missed neighbour's weight moved to the
diagonal). A *schedule* is ``schedule[r][k] = (M_{r,k}, gamma_{r,k})``.

As in the paper, gradients are treated as the inputs: the protocol is linear-Gaussian in the z's
and every message is ``-nu * sum_{s<=r} sum_x A[(r,k,w), (s,x)] z^s_x`` plus public terms. Observer
v sees the messages (r, k, w) it received, knows theta^0 and its own z^s_v. Adjacent datasets
differ in u's gradients, ``|delta g^s_u| <= Delta`` every round, and the exact Rényi divergence is

    D_alpha = alpha Delta^2 / (2 sigma^2) * sup_{|a_s| <= 1} a^T Q^(u) a,
    Q^(u)_{s s'} = c_{(s,u)}^T (C' C'^T)^+ c_{(s',u)},

C' = observed rows of A with v's columns removed, c its columns; Q^(u) is the R x R block, on u's
columns, of the orthogonal projector onto rowspace(C'). :func:`joint_factors` returns, per source,
factors of the local-DP loss ``L = alpha Delta^2 / (2 sigma^2)`` (see ``rdp.rho_from_factor``):

* ``upper = min(R lambda_max(Q), sum_{s,s'} |Q_{ss'}|)``: an upper bound on the sup for scalar and
  for vector gradients (per-round L2 sensitivity), never above R (R-fold LDP composition);
* ``diag = trace(Q)``: the average of ``a^T Q a`` over random signs, so a *lower* bound on the sup
  (``lower`` also takes ``1^T Q 1``, the value at a = 1; it meets ``upper`` when Q >= 0);
* ``per_round``: each round's messages accounted as a fresh single-run Muffliato view (theta^r
  public), composed over the rounds. For a fixed W this is ``R * plan_factors(W, K, ...)``.

Findings (tests/test_multiround.py; measured, not assumed):

* ``per_round`` is **not** a bound in either direction. It misses that a gradient keeps travelling
  through the models in later rounds: with D-SGD (K = 1) on a path or ring, nodes at distance >= 2
  get 0 per round but a positive joint loss for R >= 2. It also *over*-states the loss of nearby
  sources, because it treats theta^r as public: on the path u - w - v (Metropolis weights 1/3),
  K = 1, R = 2, v's round-1 message from w is ``theta^1_w - nu z^1_w`` with theta^1_w containing
  u's unknown round-0 noise; exactly ``Q^(w) = diag(1, 9/10)``, so every joint quantity is 1.9
  while ``per_round`` = 2. Summed over sources the two agree exactly: ``sum_u diag = sum_u
  per_round`` = the number of independent directions v observes (each round adds d_r of them,
  jointly as on its own, since its innovations have covariance >= I). So ``diag`` exceeds
  ``per_round`` at some sources only by falling below it at others: the joint view moves loss from
  near sources to far ones. (``upper`` >= ``diag`` also fell below ``per_round`` for some near
  sources in most graphs measured, e.g. by up to 0.03 on Erdős–Rényi n = 128, R = 200.)
* Accelerated and plain gossip give the same Q only for R = 1 or K = 1. For R >= 2 and K >= 2 the
  within-round spans agree but the models passed on (``theta^{r+1} = P_K(W) x^{r,0}``) differ, and
  so does the joint view (ring of 6, K = 2, R = 2: entries differ by up to 0.06).

Numerics. The rows of A are nearly collinear (``W^t -> 11^T/n``) and small directions are real
information, so nothing is truncated by a tolerance. Three paths, all of which raise rather than
guess (:class:`MultiRoundTooLarge`; :class:`~coordinator_free.privacy.muffliato.NumericalRankError`
from the Lanczos rank checks):

* ``"rational"``: A is built exactly (float weights read with ``intended_fraction``), row-reduced
  exactly over the integers (no tolerance), and the exact reduced echelon basis ``[I | X]`` is
  orthonormalised in float64 when ``eps * ||X||_F`` is negligible and otherwise in mpmath with
  ``2 log2 ||X||_F`` extra bits (its Gram matrix ``I + X X^T`` has condition <= 1 + ||X||_F^2).
  Any schedule; chosen automatically while ``R (n-1) <= JOINT_RATIONAL_MAX_COLS``.
* ``"float"`` (fixed W, fault-free rounds): a Kalman filter over rounds. Within a round v's view
  is ``Q^T x^{r,0}`` for an orthonormal basis Q (v's coordinate zeroed) of the round's observed span,
  which is the block Krylov space ``K_K(W, [e_v, e_N(v)])`` computed by the strict block Lanczos of
  privacy/muffliato.py (the same rank policy as the single-run accountant). The state x^{r,0} is
  propagated by ``F = P_K(W)`` and receives fresh noise of covariance ``Z = I - e_v e_v^T``, so
  every innovation covariance satisfies ``S_r = Q^T Sigma_r Q >= Q^T Z Q = I``: the filter never
  inverts anything worse conditioned than its own state covariance (Joseph-form updates keep it
  PSD), and ``Q^(u) = sum_r G_r^T S_r^{-1} G_r`` is the Fisher information of the innovations,
  which is exactly the projector block above (innovations are an invertible triangular transform
  of the observations). When the block Krylov space of W from [e_v, e_N(v)] is invariant of
  dimension D < n (symmetric graphs) the filter runs in those D coordinates.
* ``"hybrid"``: the same filter, with the observed span of every faulty round computed exactly
  (rational row reduction, n <= ``RATIONAL_MAX_NODES``) and then orthonormalised as above. The
  spans are the only discontinuous part of the problem; the filter is Lipschitz in the
  transition matrices because ``S_r >= I``, so those are formed in float64.

Float paths report Q with an absolute error budget ``FLOAT_ENTRY_TOL`` per entry (measured errors
against the rational path and against an independent dense QR of the explicit well-conditioned
basis: <= 2e-15, for R up to 200) and ``upper`` includes it; sources whose columns are
structurally zero (no walk reaches an observed message) get exactly 0.

Limits, measured on this 2-core machine with single-threaded BLAS while other jobs kept the load
at 12-15 (a multi-threaded BLAS was up to 15x slower under that load; set OPENBLAS_NUM_THREADS=1):

* rational (any schedule, n <= ``RATIONAL_MAX_NODES``): cost grows with the rank R (n-1) and the
  size of the exact coefficients (Chebyshev gammas read as 30-50-bit fractions make them large).
  0.1-0.9 s at R (n-1) = 60 (``JOINT_RATIONAL_MAX_COLS``, the auto threshold); 0.4-5 s at
  90-160 columns, 15 s for a geometric 16-node graph with faults, K = 8, R = 6, accelerated.
* float (fault-free fixed W): O(R D^3 + R^2 D^2 n) time, 8 R D (n + 2 D) bytes, D = n or the
  dimension of the invariant Krylov space (hypercube n = 2048: D = 112). Hypercube n = 2048,
  K = 19: 1.8 s at R = 20, 5.6 s at R = 50, 28 s at R = 100. Erdős–Rényi n = 128, K = 8: 0.6 /
  2.0 / 9.7 s at R = 50 / 100 / 200; n = 256, K = 10: 3.6 / 12.5 s at R = 50 / 100; n = 512,
  K = 12: 5.7 / 13 s at R = 20 / 50; n = 1024, K = 12: 9 / 44 s at R = 10 / 30, refused at R = 40
  (``FLOAT_MAX_ENTRIES``, ~800 MB). Ring n = 64, K = 1: 4.3 s at R = 500. A random geometric
  graph n = 200, K = 30 is refused: its within-round Krylov span has a direction of relative size
  4e-10, inside the band where float64 cannot decide (the single-run accountant refuses too);
  graphs with n <= RATIONAL_MAX_NODES fall back to exact spans instead.
* hybrid (faults, n <= RATIONAL_MAX_NODES): the exact span of every distinct faulty round,
  0.04 s (hypercube n = 32, K = 10) to ~1.5 s (n = 64, K = 12) each, plus the filter.
  Faulty schedules with n > RATIONAL_MAX_NODES are refused.

Caveat: like the paper, the model treats gradients as inputs fixed in advance. When gradients
depend on the iterates, changing u's data also changes other nodes' later gradients through the
models; that (nonlinear) effect is not captured here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

from coordinator_free.privacy.muffliato import (
    RATIONAL_MAX_BITS,
    RATIONAL_MAX_NODES,
    NumericalRankError,
    _lanczos_basis,
    _Ranks,
    fault_free_steps,
    intended_fraction,
)

__all__ = [
    "FLOAT_ENTRY_TOL",
    "FLOAT_MAX_ENTRIES",
    "JOINT_RATIONAL_MAX_COLS",
    "MultiRoundLoss",
    "MultiRoundTooLarge",
    "joint_factors",
]

#: ``method="auto"`` uses exact rational arithmetic for the whole joint view while
#: R * (n - 1) is at most this (the number of unknown noise coordinates).
JOINT_RATIONAL_MAX_COLS = 60
#: The Kalman paths keep R * D * n sensitivities (D = state dimension <= n); past this many
#: float64 entries they refuse.
FLOAT_MAX_ENTRIES = 100_000_000
#: Absolute error budget per entry of Q on the float paths (measured: < 1e-12); ``upper`` adds it.
FLOAT_ENTRY_TOL = 1e-9
#: Same for the rational path (exact span, projector accurate to ~1e-15, eigenvalue rounding).
RATIONAL_ENTRY_TOL = 1e-13
#: Orthonormalise an exact echelon basis [I | X] in float64 only if eps * ||X||_F is below this.
_FLOAT_ORTH_MAX = 1e-14


class MultiRoundTooLarge(ValueError):
    """No sound method covers this size (or this schedule) within the configured limits."""


@dataclass(frozen=True)
class MultiRoundLoss:
    """Per-source loss factors of one observer over R rounds (units of alpha Delta^2/(2 sigma^2)).

    ``upper``: ``min(R lambda_max(Q), sum |Q|)`` (+ the float error budget), an upper bound on the
    exact joint loss, <= R. ``diag``: ``trace(Q)``, a lower bound on it. ``per_round``: composition
    of each round's own single-run view (not a bound in either direction; see module doc).
    ``q``: the R x R matrices ``Q^(u)``, shape (n, R, R). ``lower``: ``max(trace Q, 1^T Q 1)``, the
    better of two values the sup attains or exceeds (the same-sign gradient change ``a = 1``);
    equal to ``upper`` (up to the error budget) when Q is entrywise nonnegative, which is typical
    for distant sources. The observer's own entries are R (and ``q[v] = I``). ``method``:
    ``"rational"``, ``"float"`` or ``"hybrid"``.
    """

    upper: np.ndarray
    diag: np.ndarray
    per_round: np.ndarray
    method: str
    q: np.ndarray | None = None
    lower: np.ndarray | None = None


# ---------------------------------------------------------------------------------------------
# Input normalisation
# ---------------------------------------------------------------------------------------------

Round = list[tuple[np.ndarray, float]]


def _neighbours(w: np.ndarray, v: int) -> list[int]:
    return [int(x) for x in np.flatnonzero(w[v]) if x != v]


def _normalise(
    w, rounds, steps, accelerated, observer, gamma, schedule, received
) -> tuple[np.ndarray, list[Round], set[tuple[int, int, int]]]:
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] < 1:
        raise ValueError(f"gossip matrix must be square, got shape {w.shape}")
    n = w.shape[0]
    if not np.all(np.isfinite(w)):
        raise ValueError("gossip matrix has non-finite entries")
    if int(rounds) != rounds or rounds < 1:
        raise ValueError("rounds must be a positive integer")
    if int(steps) != steps or steps < 1:
        raise ValueError("steps must be a positive integer")
    rounds, steps = int(rounds), int(steps)
    if not 0 <= observer < n:
        raise ValueError(f"observer {observer} out of range 0..{n - 1}")
    if schedule is None:
        if not np.array_equal(w, w.T):
            raise ValueError("the fixed gossip matrix W must be exactly symmetric")
        one = [(w, float(g)) for _, g in fault_free_steps(w, steps, accelerated, gamma)]
        sched = [list(one) for _ in range(rounds)]
    else:
        sched = []
        if len(schedule) != rounds:
            raise ValueError(f"schedule has {len(schedule)} rounds, expected {rounds}")
        for r, rnd in enumerate(schedule):
            if len(rnd) != steps:
                raise ValueError(f"schedule round {r} has {len(rnd)} steps, expected {steps}")
            out: Round = []
            for k, (m, g) in enumerate(rnd):
                m = np.asarray(m, dtype=np.float64)
                if m.shape != (n, n):
                    raise ValueError(f"schedule[{r}][{k}] has shape {m.shape}, expected {(n, n)}")
                if not np.all(np.isfinite(m)):
                    raise ValueError(f"schedule[{r}][{k}] has non-finite entries")
                g = float(g)
                if not math.isfinite(g):
                    raise ValueError(f"schedule[{r}][{k}]: gamma must be finite")
                if k == 0 and g != 1.0:
                    raise ValueError(f"schedule[{r}][0]: gamma_0 must be 1")
                out.append((m, g))
            sched.append(out)
    nb = _neighbours(w, observer)
    if received is None:
        rec = {(r, k, x) for r in range(rounds) for k in range(steps) for x in nb}
        if schedule is not None:
            # Also whatever the realised rows say v used (time-varying graphs).
            for r, rnd in enumerate(sched):
                for k, (m, _) in enumerate(rnd):
                    rec.update((r, k, int(x)) for x in np.flatnonzero(m[observer]) if x != observer)
    else:
        rec = set()
        for item in received:
            r, k, x = (int(c) for c in item)
            if not (0 <= r < rounds and 0 <= k < steps and 0 <= x < n):
                raise ValueError(f"received message {(r, k, x)} out of range")
            if x == observer:
                raise ValueError(
                    f"received message {(r, k, x)}: the observer does not send to itself"
                )
            rec.add((r, k, x))
    # Every message v used must be one it received (otherwise its own state is not in its view).
    for r, rnd in enumerate(sched):
        for k, (m, _) in enumerate(rnd):
            for x in np.flatnonzero(m[observer]):
                x = int(x)
                if x != observer and (r, k, x) not in rec:
                    raise ValueError(
                        f"inconsistent schedule: observer {observer} uses message {(r, k, x)} "
                        f"(M[{observer}, {x}] != 0 in round {r}, step {k}) but did not receive it; "
                        "pass the realised schedule"
                    )
    return w, sched, rec


def _step_keys(w: np.ndarray, sched: list[Round]) -> list[tuple]:
    """A hashable key per round identifying its matrices and gammas (W itself is key -1)."""
    seen: dict[bytes, int] = {}
    out = []
    for rnd in sched:
        key = []
        for m, g in rnd:
            if m is w or np.array_equal(m, w):
                key.append((-1, g))
            else:
                key.append((seen.setdefault(m.tobytes(), len(seen)), g))
        out.append(tuple(key))
    return out


def _fault_free_round(w: np.ndarray, rnd: Round, rec_r: frozenset, observer: int) -> bool:
    """Every M_{r,k} = W (symmetric), every gamma != 0 and v received all neighbours at all k:
    the round's span is then the block Krylov space K_K(W, [e_v, e_N(v)])."""
    if not np.array_equal(w, w.T):
        return False
    if any(g == 0.0 for _, g in rnd):
        return False
    if any(m is not w and not np.array_equal(m, w) for m, _ in rnd):
        return False
    nb = _neighbours(w, observer)
    return rec_r == frozenset((k, x) for k in range(len(rnd)) for x in nb)


def _items(rec_r: frozenset) -> list[tuple[int, int]]:
    return sorted(rec_r)


def _received_by_round(rec: set, rounds: int) -> list[frozenset]:
    by: list[set] = [set() for _ in range(rounds)]
    for r, k, x in rec:
        by[r].add((k, x))
    return [frozenset(s) for s in by]


# ---------------------------------------------------------------------------------------------
# Structural support (exact zeros)
# ---------------------------------------------------------------------------------------------


def _bool_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # 0/1 matrices in float64 (BLAS); counts <= n are exact.
    return (a.astype(np.float64) @ b.astype(np.float64)) > 0.5


def _structural_sources(sched: list[Round], keys: list[tuple], rec_by: list[frozenset], n: int):
    """Sources with a structurally nonzero coefficient in some observed message, jointly and per
    round. A superset of the true support (cancellations are ignored), so outside it Q is 0."""
    rounds = len(sched)
    eye = np.eye(n, dtype=bool)
    joint = np.zeros(n, dtype=bool)
    per = np.zeros((rounds, n), dtype=bool)
    h = eye.copy()  # h[x, u]: x^{r,0}_x depends on some z^s_u, s <= r
    cache: dict[tuple, list[np.ndarray]] = {}
    for r, rnd in enumerate(sched):
        cs = cache.get(keys[r])
        if cs is None:
            cs = [eye]
            for k, (m, g) in enumerate(rnd):
                nxt = _bool_mul(m != 0.0, cs[-1])
                if k >= 1 and g != 1.0:
                    nxt |= cs[-2]
                cs.append(nxt)
            cache[keys[r]] = cs
        items = _items(rec_by[r])
        if items:
            rows = np.array([cs[k][x] for k, x in items])
            per[r] = rows.any(axis=0)
            joint |= _bool_mul(per[r][None, :], h)[0]
        if r + 1 < rounds and not joint.all():
            h = _bool_mul(cs[-1], h) | eye
    return joint, per


def _full_received(w: np.ndarray, observer: int, steps: int) -> frozenset:
    return frozenset((k, x) for k in range(steps) for x in _neighbours(w, observer))


def _structural_fault_free(w: np.ndarray, observer: int, rounds: int, steps: int):
    """Fault-free fixed W: message (r, k, x) depends on z^s_u only if dist(x, u) <= k + (r-s) K,
    so the joint support is dist(v, u) <= R K and the per-round one dist(v, u) <= K."""
    from scipy.sparse.csgraph import shortest_path

    adj = sp.csr_matrix(w != 0.0)
    d = shortest_path(adj, unweighted=True, indices=[observer])[0]
    joint = d <= rounds * steps
    per = np.broadcast_to(d <= steps, (rounds, w.shape[0]))
    return joint, per


# ---------------------------------------------------------------------------------------------
# Exact arithmetic helpers (integer matrices over a common denominator, object arrays)
# ---------------------------------------------------------------------------------------------


class _Conv:
    """Float -> intended fraction, cached."""

    def __init__(self) -> None:
        self.cache: dict[float, Fraction] = {}

    def __call__(self, x: float) -> Fraction:
        f = self.cache.get(x)
        if f is None:
            f = intended_fraction(x) if x != 0.0 else Fraction(0)
            self.cache[x] = f
        return f


def _exact(m: np.ndarray, conv: _Conv) -> tuple[np.ndarray, int]:
    fr = [[conv(float(e)) for e in row] for row in m]
    den = 1
    for row in fr:
        for f in row:
            den = math.lcm(den, f.denominator)
    a = np.empty(m.shape, dtype=object)
    for i, row in enumerate(fr):
        for j, f in enumerate(row):
            a[i, j] = f.numerator * (den // f.denominator)
    return a, den


def _simplify(a: np.ndarray, den: int) -> tuple[np.ndarray, int]:
    g = math.gcd(den, *a.ravel().tolist())
    if g > 1:
        a = a // g
        den //= g
    return a, den


def _bits(a: np.ndarray) -> int:
    return max((abs(int(c)).bit_length() for c in a.ravel().tolist()), default=0)


def _round_exact(rnd: Round, conv: _Conv) -> list[tuple[np.ndarray, int]]:
    """Exact C_0, ..., C_K of one round: C_0 = I, C_{k+1} = g_k M_k C_k + (1 - g_k) C_{k-1}."""
    n = rnd[0][0].shape[0]
    eye = np.zeros((n, n), dtype=object)
    eye[...] = 0
    for i in range(n):
        eye[i, i] = 1
    cs = [(eye, 1)]
    for k, (m, g) in enumerate(rnd):
        mi, md = _exact(m, conv)
        ci, cd = cs[-1]
        prod = mi.dot(ci)
        gf = conv(g)
        if k == 0 or gf == 1:
            nxt = (prod, md * cd)
        else:
            pi, pd = cs[-2]
            p, q = gf.numerator, gf.denominator
            nxt = (p * pd * prod + (q - p) * md * cd * pi, q * md * cd * pd)
        nxt = _simplify(*nxt)
        if _bits(nxt[0]) > RATIONAL_MAX_BITS:
            raise MultiRoundTooLarge(
                f"exact coefficients exceed {RATIONAL_MAX_BITS} bits within a round"
            )
        cs.append(nxt)
    return cs


def _content_free(r: np.ndarray) -> np.ndarray:
    g = math.gcd(*r.tolist())
    return r // g if g > 1 else r


class _Echelon:
    """Exact reduced echelon basis of a row space, integer rows (fraction-free elimination with
    content removal); every basis row is zero at every other row's pivot."""

    def __init__(self, m: int) -> None:
        self.m = m
        self.rows: list[np.ndarray] = []
        self.pivots: list[int] = []

    @property
    def full(self) -> bool:
        return len(self.rows) == self.m

    def add(self, r: np.ndarray) -> None:
        if self.full:
            return
        r = r.copy()
        for p, b in zip(self.pivots, self.rows, strict=True):
            c = r[p]
            if c:
                r = _content_free(b[p] * r - c * b)
        nz = np.flatnonzero(r != 0)
        if nz.size == 0:
            return
        # Pivot: the nonzero entry of smallest magnitude keeps the reduced rows small.
        mags = [abs(int(r[j])) for j in nz]
        piv = int(nz[int(np.argmin(mags))])
        if r[piv] < 0:
            r = -r
        r = _content_free(r)
        for i, (p, b) in enumerate(zip(self.pivots, self.rows, strict=True)):
            c = b[piv]
            if c:
                b = _content_free(r[piv] * b - c * r)
                if b[p] < 0:
                    b = -b
                self.rows[i] = b
        self.rows.append(r)
        self.pivots.append(piv)

    def orthonormal(self) -> np.ndarray:
        """Float64 orthonormal rows spanning the exact row space (error ~1e-15)."""
        rho, m = len(self.rows), self.m
        if rho == 0:
            return np.zeros((0, m))
        if rho == m:
            return np.eye(m)
        piv = self.pivots
        # Reduced echelon [I | X]: row i / row_i[p_i].
        fr = [
            [Fraction(int(b[j]), int(b[p])) for j in range(m)]
            for p, b in zip(piv, self.rows, strict=True)
        ]
        # log2 of ||X||_F, from exact magnitudes (entries may be astronomically large)
        sq = sum(f * f for row in fr for f in row) - rho
        lg = (sq.numerator.bit_length() - sq.denominator.bit_length()) / 2 + 1 if sq else 0
        if lg < 40 and math.sqrt(float(sq)) * 2.3e-16 < _FLOAT_ORTH_MAX:
            rr = np.array([[float(f) for f in row] for row in fr])
            q, _ = np.linalg.qr(rr.T)
            return q.T.copy()
        import mpmath

        prec = 80 + 2 * max(int(math.ceil(lg)), 0) + 2 * max(rho, 1).bit_length()
        bi = np.array([[int(c) for c in b] for b in self.rows], dtype=object)
        gi = bi.dot(bi.T)  # exact integer Gram of the unnormalised rows
        with mpmath.workprec(prec):
            mpf = mpmath.mpf
            # Rows scaled by 1/b_i[p_i] are [I | X]; G = I + X X^T, condition <= 1 + ||X||_F^2.
            scale = [mpf(1) / int(b[p]) for p, b in zip(piv, self.rows, strict=True)]
            g = np.empty((rho, rho), dtype=object)
            for i in range(rho):
                for j in range(i + 1):
                    g[i, j] = mpf(int(gi[i, j])) * scale[i] * scale[j]
            lo = np.empty((rho, rho), dtype=object)
            lo[...] = mpf(0)
            for j in range(rho):
                row = lo[j, :j]
                lo[j, j] = mpmath.sqrt(g[j, j] - (row.dot(row) if j else mpf(0)))
                for i in range(j + 1, rho):
                    t = g[i, j] - (lo[i, :j].dot(row) if j else mpf(0))
                    lo[i, j] = t / lo[j, j]
            # O = L^{-1} R by forward substitution (row i of R is b_i * scale_i).
            o = np.empty((rho, m), dtype=object)
            for i in range(rho):
                acc = bi[i] * scale[i]
                if i:
                    acc = acc - lo[i, :i].dot(o[:i])
                o[i] = acc * (1 / lo[i, i])
            return np.array([[float(c) for c in row] for row in o])


def _round_basis_exact(rnd: Round, rec_r: frozenset, observer: int, conv: _Conv) -> np.ndarray:
    """n x d orthonormal basis (row ``observer`` zero) of the round's observed span projected on
    e_v^perp: rows C_k[w, :] for received (k, w), v's coordinate dropped, reduced exactly."""
    n = rnd[0][0].shape[0]
    cs = _round_exact(rnd, conv)
    keep = [j for j in range(n) if j != observer]
    ech = _Echelon(n - 1)
    for k, x in _items(rec_r):
        ech.add(_content_free(cs[k][0][x][keep]))
        if ech.full:
            break
    o = ech.orthonormal()
    out = np.zeros((n, o.shape[0]))
    out[keep] = o.T
    return out


# ---------------------------------------------------------------------------------------------
# Rational path: the whole joint view exactly
# ---------------------------------------------------------------------------------------------


def _joint_rational(sched, rec_by, observer, n, conv) -> np.ndarray:
    """Q of every source (shape (n, R, R)) from the exact joint view; ``observer`` is one node
    or a coalition (a set of nodes), whose own coordinates are known and dropped."""
    known = {observer} if isinstance(observer, int) else set(observer)
    rounds = len(sched)
    keep = np.array([j for j in range(n) if j not in known])
    width = len(keep)
    m_cols = rounds * width
    ech = _Echelon(m_cols)
    # H: coefficients of x^{r,0} on (z^0 .. z^r), n x (r+1) n, integer over den.
    h = np.zeros((n, n), dtype=object)
    h[...] = 0
    for i in range(n):
        h[i, i] = 1
    hd = 1
    for r, rnd in enumerate(sched):
        cs = _round_exact(rnd, conv)
        for k, x in _items(rec_by[r]):
            if ech.full:
                break
            row = cs[k][0][x].dot(h)  # over cs_den * hd, scale irrelevant
            red = np.zeros(m_cols, dtype=object)
            red[...] = 0
            for s in range(r + 1):
                red[s * width : (s + 1) * width] = row[s * n + keep]
            if any(red):
                ech.add(_content_free(red))
        if r + 1 < rounds and not ech.full:
            ck, cd = cs[-1]
            nh = np.zeros((n, (r + 2) * n), dtype=object)
            nh[...] = 0
            nh[:, : (r + 1) * n] = ck.dot(h)
            den = cd * hd
            for i in range(n):
                nh[i, (r + 1) * n + i] = den
            h, hd = _simplify(nh, den)
            if _bits(h) > RATIONAL_MAX_BITS:
                raise MultiRoundTooLarge(
                    f"exact coefficients exceed {RATIONAL_MAX_BITS} bits after round {r}"
                )
    o = ech.orthonormal()  # rho x m_cols
    q = np.zeros((n, rounds, rounds))
    for j, u in enumerate(keep.tolist()):
        cols = o[:, j::width]
        q[u] = cols.T @ cols
    return q


# ---------------------------------------------------------------------------------------------
# Float paths: Kalman filter over rounds
# ---------------------------------------------------------------------------------------------


def _transition_float(rnd: Round) -> np.ndarray:
    """P_{r,K} = C_K of the round (float64; well conditioned, no orthogonalisation)."""
    n = rnd[0][0].shape[0]
    prev = None
    cur = np.eye(n)
    for k, (m, g) in enumerate(rnd):
        nxt = m @ cur
        if k >= 1 and g != 1.0:
            nxt = g * nxt + (1.0 - g) * prev
        prev, cur = cur, nxt
    return cur


def _poly_apply(ws, x: np.ndarray, gammas: Sequence[float]) -> np.ndarray:
    """P_K(W) x for the fixed-W recursion with the given gammas (K = len(gammas))."""
    prev = None
    cur = x
    for k, g in enumerate(gammas):
        nxt = np.asarray(ws @ cur)
        if k >= 1 and g != 1.0:
            nxt = g * nxt + (1.0 - g) * prev
        prev, cur = cur, nxt
    return cur


def _kalman(qs: list[np.ndarray], fs: list[np.ndarray], inj: np.ndarray, uv: np.ndarray):
    """Fisher information of v's innovations about every source's per-round shifts.

    qs[r]: D x d_r orthonormal observation basis (orthogonal to uv); fs[r]: D x D transition of
    round r; inj: D x n, column u = where a unit shift of z^s_u enters x^{s,0} (column v zero);
    uv: v's coordinate vector in state coordinates. Returns J of shape (n, R, R).

    With the innovation ``nu_r = Q_r^T (x^{r,0} - xhat_r)``, ``S_r = Q_r^T Sigma_r Q_r >= I``,
    gain ``K_r`` and closed loop ``Phi_r = F_r (I - K_r Q_r^T)``, a shift of z^s_u moves the
    prediction error of round r >= s by ``Psi(r, s) inj e_u`` (``Psi`` = product of the Phi), so

        J_{s s'} = sum_{r >= s'} inj^T Psi(r, s)^T H_r Psi(r, s') inj,   H_r = Q_r S_r^{-1} Q_r^T
                 = (Psi(s', s) inj)^T Lambda_{s'} inj                     (s <= s'),

    with the backward information ``Lambda_t = H_t + Phi_t^T Lambda_{t+1} Phi_t``. Three passes:
    Riccati (forward), Lambda (backward), sensitivities Psi(t, s) inj (forward). Cost
    O(R D^3 + R^2 D^2 n), memory 2 R D^2 + R D n.
    """
    rounds = len(qs)
    dim, n = inj.shape
    eye = np.eye(dim)
    zs = eye - np.outer(uv, uv)
    sig = zs.copy()
    hs: list[np.ndarray | None] = []
    phis: list[np.ndarray] = []
    for r in range(rounds):
        q = qs[r]
        a = eye
        h = None
        if q.shape[1]:
            sq = sig @ q
            s = q.T @ sq
            s = 0.5 * (s + s.T)
            smin = float(np.linalg.eigvalsh(s)[0])
            if not smin > 0.5:
                raise ArithmeticError(
                    f"innovation covariance has eigenvalue {smin:.3g} < 1 in round {r}: the "
                    "observation basis is not orthonormal or not orthogonal to e_v"
                )
            lo = np.linalg.cholesky(s)
            gain = sla.cho_solve((lo, True), sq.T).T  # Sigma Q S^{-1}
            lq = sla.solve_triangular(lo, q.T, lower=True)  # L^{-1} Q^T
            h = lq.T @ lq
            a = eye - gain @ q.T
            sig = a @ sig @ a.T  # Joseph form (noiseless observation)
            sig = 0.5 * (sig + sig.T)
        hs.append(h)
        if r + 1 < rounds:
            f = fs[r]
            phis.append(f @ a)
            sig = f @ sig @ f.T + zs
            sig = 0.5 * (sig + sig.T)
    lams: list[np.ndarray] = [np.zeros((dim, dim))] * rounds
    nxt = None
    for r in range(rounds - 1, -1, -1):
        lam = np.zeros((dim, dim)) if hs[r] is None else hs[r].copy()
        if nxt is not None:
            lam += phis[r].T @ nxt @ phis[r]
        lam = 0.5 * (lam + lam.T)
        lams[r] = lam
        nxt = lam
    del hs
    bm = np.empty((dim, rounds * n))
    bm[:, :n] = inj
    jac = np.zeros((n, rounds, rounds))
    for t in range(rounds):
        w = (t + 1) * n
        v = lams[t] @ inj  # D x n
        col = np.einsum("isu,iu->us", bm[:, :w].reshape(dim, t + 1, n), v)  # (n, t+1)
        jac[:, : t + 1, t] = col
        jac[:, t, : t + 1] = col
        if t + 1 < rounds:
            bm[:, :w] = phis[t] @ bm[:, :w]
            bm[:, w : w + n] = inj
    return jac


def _orthonormal_cols(x: np.ndarray) -> np.ndarray:
    q, _ = np.linalg.qr(x)
    return q


def _joint_float(w, sched, keys, rec_by, observer, n, conv, strict, allow_rational):
    """Kalman path. Returns (J, per-round bases in original coordinates, method label)."""
    rounds = len(sched)
    ff = [_fault_free_round(w, rnd, rec_by[r], observer) for r, rnd in enumerate(sched)]
    ws = sp.csr_matrix(w) if any(ff) else None
    bases: list[np.ndarray] = [None] * rounds  # type: ignore[list-item]
    cache: dict[tuple, np.ndarray] = {}
    used_rational = False
    krylov = None
    for r, rnd in enumerate(sched):
        key = (keys[r], rec_by[r])
        if key in cache:
            bases[r] = cache[key]
            continue
        if ff[r] and krylov is None:
            try:
                nb = _neighbours(w, observer)
                kb = _lanczos_basis(
                    ws, [observer, *nb], n, len(rnd), _Ranks(strict, f"observer {observer}")
                )
                kb = kb[:, 1:].copy()  # drop e_v; the rest is orthogonal to it
                kb[observer] = 0.0
                krylov = _orthonormal_cols(kb) if kb.shape[1] else kb
            except NumericalRankError as exc:
                if not allow_rational:
                    raise MultiRoundTooLarge(
                        f"float64 cannot certify the within-round Krylov span ({exc}) and "
                        f"n = {n} > {RATIONAL_MAX_NODES} is too large for exact spans"
                    ) from exc
                krylov = False
        if ff[r] and krylov is not False:
            b = krylov
        else:
            if not allow_rational:
                raise MultiRoundTooLarge(
                    f"round {r} is not fault-free: its span needs exact arithmetic, supported up "
                    f"to {RATIONAL_MAX_NODES} nodes (got {n})"
                )
            b = _round_basis_exact(rnd, rec_by[r], observer, conv)
            used_rational = True
        cache[key] = b
        bases[r] = b
    # State coordinates: the invariant block Krylov space when every round is a polynomial in W.
    u_basis = None
    if all(ff) and krylov is not False:
        try:
            nb = _neighbours(w, observer)
            u = _lanczos_basis(ws, [observer, *nb], n, n + 1, _Ranks(True, "invariant space"))
            if u.shape[1] < n:
                u_basis = u
        except NumericalRankError:
            u_basis = None  # fall back to the full space (always exact)
    dim = n if u_basis is None else u_basis.shape[1]
    need = rounds * dim * (n + 2 * dim)
    if need > FLOAT_MAX_ENTRIES:
        raise MultiRoundTooLarge(
            f"the Kalman path needs R * D * (n + 2 D) = {need} float64 entries for R = {rounds}, "
            f"state dimension D = {dim}, n = {n} (limit FLOAT_MAX_ENTRIES = {FLOAT_MAX_ENTRIES})"
        )
    inj = np.eye(n)
    inj[:, observer] = 0.0
    uv = np.zeros(n)
    uv[observer] = 1.0
    if u_basis is not None:
        inj = u_basis.T @ inj
        uv = u_basis.T @ uv
        uv /= np.linalg.norm(uv)
    fcache: dict[tuple, np.ndarray] = {}
    qs, fs = [], []
    for r, rnd in enumerate(sched):
        b = bases[r]
        if u_basis is not None:
            b = u_basis.T @ b
            b -= np.outer(uv, uv @ b)
            b = _orthonormal_cols(b) if b.shape[1] else b
        qs.append(b)
        if r + 1 < rounds:
            key = keys[r]
            f = fcache.get(key)
            if f is None:
                if u_basis is not None:
                    f = u_basis.T @ _poly_apply(ws, u_basis, [g for _, g in rnd])
                else:
                    f = _transition_float(rnd)
                fcache[key] = f
            fs.append(f)
    from coordinator_free.blas import one_thread

    # Thousands of D x D steps (D <= n): BLAS threads only add their hand-offs here (a 500-round
    # 16-node plan took 63 s with them on 2 shared cores, 9.5 s on one thread).
    with one_thread():
        jac = _kalman(qs, fs, inj, uv)
    return jac, bases, ("hybrid" if used_rational else "float")


# ---------------------------------------------------------------------------------------------
# Public entry point
# ---------------------------------------------------------------------------------------------


def joint_factors(
    W: np.ndarray,
    rounds: int,
    steps: int,
    accelerated: bool,
    observer: int,
    *,
    gamma: float | None = None,
    schedule: Sequence[Sequence[tuple[np.ndarray, float]]] | None = None,
    received: Iterable[tuple[int, int, int]] | None = None,
    method: str = "auto",
    strict: bool = True,
) -> MultiRoundLoss:
    """Joint loss factors of ``observer``'s view over ``rounds`` rounds of ``steps`` gossip steps.

    ``schedule``: realised rows, ``schedule[r][k] = (M_{r,k}, gamma_{r,k})`` (fault-free from W,
    ``accelerated`` and ``gamma`` if None). ``received``: the (r, k, w) the observer saw (default:
    every W-neighbour at every step, plus whatever the schedule says it used). Every message the
    observer used (``M_{r,k}[v, w] != 0``) must be listed as received (ValueError otherwise).

    ``method``: ``"auto"`` (rational while R (n-1) <= JOINT_RATIONAL_MAX_COLS, else the Kalman
    path), ``"rational"`` or ``"float"`` (Kalman; faulty rounds get exact spans, reported as
    ``"hybrid"``). ``strict`` is the Lanczos rank policy of privacy/muffliato.py.
    Raises :class:`MultiRoundTooLarge` when no sound method covers the input.
    """
    w, sched, rec = _normalise(W, rounds, steps, accelerated, observer, gamma, schedule, received)
    n = w.shape[0]
    rounds = len(sched)
    rec_by = _received_by_round(rec, rounds)
    keys = _step_keys(w, sched)
    conv = _Conv()
    if method not in ("auto", "rational", "float"):
        raise ValueError(f"unknown method {method!r}; expected 'auto', 'rational' or 'float'")
    small = n <= RATIONAL_MAX_NODES
    jac = None
    bases = None
    label = ""
    if method == "rational" or (
        method == "auto" and small and rounds * (n - 1) <= JOINT_RATIONAL_MAX_COLS
    ):
        if not small:
            raise MultiRoundTooLarge(
                f"exact arithmetic supports at most {RATIONAL_MAX_NODES} nodes, got {n}"
            )
        try:
            jac = _joint_rational(sched, rec_by, observer, n, conv)
            label = "rational"
        except MultiRoundTooLarge:
            if method == "rational":
                raise
    if jac is None:
        jac, bases, label = _joint_float(w, sched, keys, rec_by, observer, n, conv, strict, small)
    # Per-round single-run views.
    if bases is None:
        cache: dict[tuple, np.ndarray] = {}
        bases = []
        for r, rnd in enumerate(sched):
            key = (keys[r], rec_by[r])
            if key not in cache:
                cache[key] = _round_basis_exact(rnd, rec_by[r], observer, conv)
            bases.append(cache[key])
    if all(k == keys[0] and all(i == -1 for i, _ in k) for k in keys) and all(
        rec_by[r] == _full_received(w, observer, steps) for r in range(rounds)
    ):
        joint_sup, per_sup = _structural_fault_free(w, observer, rounds, steps)
    else:
        joint_sup, per_sup = _structural_sources(sched, keys, rec_by, n)
    per = np.zeros(n)
    for r, b in enumerate(bases):
        f = np.clip(np.einsum("ij,ij->i", b, b), 0.0, 1.0)
        per += np.where(per_sup[r], f, 0.0)
    tau = RATIONAL_ENTRY_TOL if label == "rational" else FLOAT_ENTRY_TOL
    jac, upper, diag, lower = _bounds(jac, joint_sup, [observer], tau)
    per[observer] = float(rounds)
    return MultiRoundLoss(upper=upper, diag=diag, per_round=per, method=label, q=jac, lower=lower)


def _bounds(jac: np.ndarray, support: np.ndarray, known: list[int], tau: float):
    """``(q, upper, diag, lower)`` from the Q matrices (module doc), sources outside
    ``support`` exactly 0 and the ``known`` nodes (the observer or coalition) at R."""
    # In place and one source at a time: ``jac`` is n R^2 floats, the largest thing a long
    # multi-round plan holds (module doc), so no temporary of its size is made here.
    rounds = jac.shape[1]
    jac[~support] = 0.0
    idx = np.arange(rounds)
    jac[:, idx, idx] = np.clip(jac[:, idx, idx], 0.0, 1.0)
    for a in known:
        jac[a] = np.eye(rounds)
    diag = np.clip(np.trace(jac, axis1=1, axis2=2), 0.0, float(rounds))
    lam = np.zeros(jac.shape[0])
    abs_sum = np.zeros(jac.shape[0])
    for u in np.flatnonzero(support):
        q = jac[u]
        abs_sum[u] = np.abs(q).sum()
        if q.min() >= 0.0:
            # Entrywise nonnegative: R lambda_max >= 1^T Q 1 = sum |Q| (the Rayleigh quotient of
            # the all-ones vector), so the minimum below is sum |Q| whatever lambda_max is, and
            # its O(R^3) eigendecomposition (most of a long plan's time) is not needed.
            lam[u] = np.inf
        else:
            lam[u] = np.linalg.eigvalsh(q)[-1]
    upper = np.minimum(rounds * (lam + rounds * tau), abs_sum + rounds**2 * tau)
    upper = np.clip(np.maximum(upper, diag), 0.0, float(rounds))
    upper = np.where(support, upper, 0.0)
    lower = np.clip(np.maximum(diag, jac.sum(axis=(1, 2))), 0.0, upper)
    upper[known] = diag[known] = lower[known] = float(rounds)
    return jac, upper, diag, lower


# ---------------------------------------------------------------------------------------------
# Coalitions
# ---------------------------------------------------------------------------------------------


def coalition_joint_factors(
    W: np.ndarray,
    rounds: int,
    steps: int,
    accelerated: bool,
    members: Sequence[int],
    *,
    gamma: float | None = None,
    schedule: Sequence[Sequence[tuple[np.ndarray, float]]] | None = None,
    received: dict[int, Iterable[tuple[int, int, int]]] | None = None,
) -> MultiRoundLoss:
    """:func:`joint_factors` for a coalition: the members pool their own gradients and every
    message any of them received (``received``: member -> its (r, k, w); default: every
    W-neighbour of every member at every step). Exact arithmetic only (the rational path, the
    members' coordinates dropped); raises :class:`MultiRoundTooLarge` beyond it."""
    members = sorted({int(a) for a in members})
    rec: set[tuple[int, int, int]] = set()
    sched = None
    w = None
    for a in members:
        w, sched, mine = _normalise(
            W, rounds, steps, accelerated, a, gamma, schedule,
            None if received is None else received.get(a, ()),
        )  # fmt: skip
        rec |= mine
    n = w.shape[0]
    if n > RATIONAL_MAX_NODES:
        raise MultiRoundTooLarge(
            f"a coalition's joint loss over rounds is computed exactly, for at most "
            f"{RATIONAL_MAX_NODES} nodes (got {n})"
        )
    rounds = len(sched)
    jac = _joint_rational(sched, _received_by_round(rec, rounds), set(members), n, _Conv())
    # Exact zeros of the rational path are structural: no observed row holds the source.
    support = np.any(jac != 0.0, axis=(1, 2))
    jac, upper, diag, lower = _bounds(jac, support, members, RATIONAL_ENTRY_TOL)
    return MultiRoundLoss(
        upper=upper, diag=diag, per_round=np.full(n, np.nan), method="rational", q=jac,
        lower=lower,
    )  # fmt: skip
