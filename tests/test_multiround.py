"""Joint multi-round loss of Muffliato-GD / D-SGD (coordinator_free.privacy.multiround).

The reference is a brute force in exact rational arithmetic, written independently of the library:
the coefficient matrix A of every observed message on every (round, node) noise coordinate is
built explicitly (C_k H_r with H_r the coefficients of x^{r,0}), v's columns are dropped, the rows
are reduced by Gauss-Jordan over Fractions and the projector ``B^T (B B^T)^{-1} B`` is formed
exactly; ``Q^(u)`` is its block on u's columns. Float weights are read as the fractions they
stand for (1/3, 1/4, ...).
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp

from coordinator_free.graphs import (
    build_graph,
    chebyshev_gamma,
    distances_from,
    gossip_matrix,
    spectral_gap,
)
from coordinator_free.privacy.muffliato import (
    _lanczos_basis,
    _Ranks,
    apply_misses,
    exact_factors,
    plan_factors,
)
from coordinator_free.privacy.multiround import (
    MultiRoundLoss,
    MultiRoundTooLarge,
    joint_factors,
)

# ---------------------------------------------------------------------------------------------
# Brute force
# ---------------------------------------------------------------------------------------------


def snapped(x: float) -> Fraction:
    exact = Fraction(x)
    for k in range(1, 7):
        f = exact.limit_denominator(10**k)
        if abs(f - exact) <= 8 * Fraction(math.ulp(x)):
            return f
    return exact


def _mm(a, b):
    return [
        [
            sum((a[i][k] * b[k][j] for k in range(len(b)) if a[i][k]), Fraction(0))
            for j in range(len(b[0]))
        ]
        for i in range(len(a))
    ]


def brute_q(sched, received, v):
    """Q^(u) for every u (zeros for u = v), shape (n, R, R), exactly then rounded."""
    rounds, steps, n = len(sched), len(sched[0]), sched[0][0][0].shape[0]
    eye = [[Fraction(int(i == j)) for j in range(n)] for i in range(n)]
    h = [[Fraction(0)] * (rounds * n) for _ in range(n)]
    rows = []
    p_prev = None
    for r in range(rounds):
        c = [eye]
        for k, (m, g) in enumerate(sched[r]):
            mf = [[snapped(float(x)) for x in row] for row in m]
            nxt = _mm(mf, c[-1])
            if k >= 1:
                gf = snapped(float(g))
                nxt = [
                    [gf * nxt[i][j] + (1 - gf) * c[-2][i][j] for j in range(n)] for i in range(n)
                ]
            c.append(nxt)
        if r:
            h = _mm(p_prev, h)
        for i in range(n):
            h[i][r * n + i] += 1
        for k in range(steps):
            ch = _mm(c[k], h)
            rows += [ch[x] for (rr, kk, x) in sorted(received) if (rr, kk) == (r, k)]
        p_prev = c[steps]
    cols = [s * n + x for s in range(rounds) for x in range(n) if x != v]
    m = len(cols)
    basis: list[tuple[int, list[Fraction]]] = []
    for full in rows:
        row = [full[j] for j in cols]
        for p, b in basis:
            if row[p]:
                f = row[p]
                row = [a - f * bb for a, bb in zip(row, b, strict=True)]
        piv = next((j for j in range(m) if row[j]), None)
        if piv is None:
            continue
        row = [a / row[piv] for a in row]
        basis = [(p, [bb - b[piv] * rr for bb, rr in zip(b, row, strict=True)]) for p, b in basis]
        basis.append((piv, row))
    out = np.zeros((n, rounds, rounds))
    if not basis:
        return out
    bm = [b for _, b in basis]
    k = len(bm)
    g = [[sum(bm[i][t] * bm[j][t] for t in range(m)) for j in range(k)] for i in range(k)]
    aug = [g[i][:] + [Fraction(int(i == j)) for j in range(k)] for i in range(k)]
    for col in range(k):
        piv = next(i for i in range(col, k) if aug[i][col])
        aug[col], aug[piv] = aug[piv], aug[col]
        aug[col] = [a / aug[col][col] for a in aug[col]]
        for i in range(k):
            if i != col and aug[i][col]:
                f = aug[i][col]
                aug[i] = [a - f * b for a, b in zip(aug[i], aug[col], strict=True)]
    y = _mm([row[k:] for row in aug], bm)
    for u in range(n):
        if u == v:
            continue
        idx = [s * (n - 1) + (u if u < v else u - 1) for s in range(rounds)]
        out[u] = [[float(sum(bm[i][a] * y[i][b] for i in range(k))) for b in idx] for a in idx]
    return out


def metropolis(kind, **kw):
    return gossip_matrix(build_graph(kind, **kw), "metropolis")


def fault_free(w, rounds, steps, accelerated):
    g = chebyshev_gamma(spectral_gap(w)) if accelerated else 1.0
    sched = [[(w, 1.0 if k == 0 else g) for k in range(steps)] for _ in range(rounds)]
    return sched


def full_received(w, v, rounds, steps):
    return [
        (r, k, x)
        for r in range(rounds)
        for k in range(steps)
        for x in range(len(w))
        if x != v and w[v, x]
    ]


def check_properties(res: MultiRoundLoss, rounds: int, v: int) -> None:
    tol = 1e-12
    assert np.all(res.diag >= -tol)
    assert np.all(res.diag <= res.lower + tol) and np.all(res.lower <= res.upper + tol)
    assert np.all(res.upper <= rounds + tol)
    assert np.all(res.per_round >= -tol) and np.all(res.per_round <= rounds + tol)
    assert res.upper[v] == res.diag[v] == res.per_round[v] == rounds


# ---------------------------------------------------------------------------------------------
# Against brute force
# ---------------------------------------------------------------------------------------------

GRAPHS = {
    "path3": ("path", {"nodes": 3}),
    "ring5": ("ring", {"nodes": 5}),
    "ring6": ("ring", {"nodes": 6}),
    "star5": ("star", {"nodes": 5}),
    "er6": ("erdos_renyi", {"nodes": 6, "p": 0.45, "seed": 3}),
}
CASES = [
    ("path3", 3, 1, False, 2),
    ("path3", 2, 2, True, 0),
    ("ring5", 3, 1, False, 0),
    ("ring5", 2, 2, True, 1),
    ("ring6", 2, 2, False, 0),
    ("ring6", 2, 3, True, 3),
    ("star5", 3, 2, True, 0),
    ("star5", 2, 2, False, 3),
    ("er6", 2, 2, True, 0),
    ("er6", 3, 1, False, 4),
    ("er6", 2, 3, False, 2),
]


@pytest.mark.parametrize("name,rounds,steps,accelerated,v", CASES)
def test_matches_brute_force_fault_free(name, rounds, steps, accelerated, v):
    kind, kw = GRAPHS[name]
    w = metropolis(kind, **kw)
    ref = brute_q(fault_free(w, rounds, steps, accelerated), full_received(w, v, rounds, steps), v)
    single = plan_factors(w, steps, accelerated, method="exact")[v]
    for method in ("rational", "float"):
        res = joint_factors(w, rounds, steps, accelerated, v, method=method)
        assert res.method == method
        others = np.arange(len(w)) != v
        np.testing.assert_allclose(res.q[others], ref[others], atol=1e-13)
        check_properties(res, rounds, v)
        np.testing.assert_allclose(
            res.diag[others], np.trace(ref, axis1=1, axis2=2)[others], atol=1e-12
        )
        # Per-round composition of the single-run view: R * the single-run exact factor.
        np.testing.assert_allclose(res.per_round, rounds * single, atol=1e-12)


def _missed_schedule(w, rounds, steps, accelerated, seed):
    """Random misses; the observer sees half of the messages it missed late."""
    rng = np.random.default_rng(seed)
    n = len(w)
    g = chebyshev_gamma(spectral_gap(w)) if accelerated else 1.0
    sched, missed = [], {}
    for r in range(rounds):
        rnd = []
        for k in range(steps):
            miss = {
                (a, b)
                for a in range(n)
                for b in range(n)
                if a != b and w[a, b] and rng.random() < 0.2
            }
            missed[r, k] = miss
            rnd.append((apply_misses(w, miss), 1.0 if k == 0 else g))
        sched.append(rnd)

    def received(v):
        return [
            (r, k, x)
            for (r, k), miss in missed.items()
            for x in range(n)
            if x != v and w[v, x] and ((v, x) not in miss or rng.random() < 0.5)
        ]

    return sched, received


@pytest.mark.parametrize(
    "name,rounds,steps,accelerated,v,seed",
    [("ring6", 2, 2, True, 0, 1), ("er6", 3, 2, False, 2, 2), ("star5", 2, 3, True, 0, 5)],
)
def test_matches_brute_force_with_missed_messages(name, rounds, steps, accelerated, v, seed):
    kind, kw = GRAPHS[name]
    w = metropolis(kind, **kw)
    sched, received = _missed_schedule(w, rounds, steps, accelerated, seed)
    rec = received(v)
    assert any(sched[r][k][0][v, x] == 0 for r, k, x in rec)  # v saw some late message
    ref = brute_q(sched, rec, v)
    per = sum(
        exact_factors(sched[r], v, [(k, x) for rr, k, x in rec if rr == r]) for r in range(rounds)
    )
    others = np.arange(len(w)) != v
    for method, label in (("rational", "rational"), ("float", "hybrid")):
        res = joint_factors(
            w, rounds, steps, accelerated, v, schedule=sched, received=rec, method=method
        )
        assert res.method == label
        np.testing.assert_allclose(res.q[others], ref[others], atol=1e-13)
        np.testing.assert_allclose(res.per_round[others], per[others], atol=1e-12)
        check_properties(res, rounds, v)


def test_single_missed_message():
    # Ring of 6, observer 0 misses node 1's step-1 message of round 0 (never sees it).
    w = metropolis("ring", nodes=6)
    rounds, steps, v = 2, 2, 0
    sched = fault_free(w, rounds, steps, False)
    sched[0][1] = (apply_misses(w, {(0, 1)}), 1.0)
    rec = [m for m in full_received(w, v, rounds, steps) if m != (0, 1, 1)]
    ref = brute_q(sched, rec, v)
    ff = joint_factors(w, rounds, steps, False, v)
    for method in ("rational", "float"):
        res = joint_factors(w, rounds, steps, False, v, schedule=sched, received=rec, method=method)
        np.testing.assert_allclose(res.q[1:], ref[1:], atol=1e-13)
        assert np.all(res.diag <= ff.diag + 1e-12)  # seeing less never leaks more here
    with pytest.raises(ValueError, match="inconsistent"):
        joint_factors(w, rounds, steps, False, v, received=rec)  # fault-free rows use (0, 1, 1)


def test_time_varying_graphs():
    # Round 0 gossips on a ring, round 1 on a star (both on the same 5 nodes).
    ring, star = metropolis("ring", nodes=5), metropolis("star", nodes=5)
    sched = [[(ring, 1.0), (ring, 1.0)], [(star, 1.0), (star, 1.0)]]
    v = 1
    rec = [(0, k, x) for k in range(2) for x in (0, 2)] + [(1, k, 0) for k in range(2)]
    ref = brute_q(sched, rec, v)
    for method in ("rational", "float"):
        res = joint_factors(ring, 2, 2, False, v, schedule=sched, received=rec, method=method)
        np.testing.assert_allclose(res.q[np.arange(5) != v], ref[np.arange(5) != v], atol=1e-13)


# ---------------------------------------------------------------------------------------------
# Properties and comparisons with the single-run accountant
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("accelerated", [False, True])
@pytest.mark.parametrize("steps", [1, 2, 4])
def test_one_round_is_the_single_run_factor(steps, accelerated):
    w = metropolis("grid", rows=3, cols=3)
    single = plan_factors(w, steps, accelerated, method="exact")
    for v in (0, 4):
        for method in ("rational", "float"):
            res = joint_factors(w, 1, steps, accelerated, v, method=method)
            for f in (res.upper, res.diag, res.per_round):
                np.testing.assert_allclose(f, single[v], atol=1e-9)


def test_upper_and_diag_bracket_the_scalar_sup():
    # The sup of a^T Q a over the box is attained at a vertex; enumerate them.
    w = metropolis("erdos_renyi", nodes=7, p=0.4, seed=1)
    rounds = 4
    res = joint_factors(w, rounds, 2, True, 0)
    signs = np.array(list(itertools.product((-1.0, 1.0), repeat=rounds)))
    for u in range(1, 7):
        sup = np.max(np.einsum("ij,jk,ik->i", signs, res.q[u], signs))
        assert res.diag[u] - 1e-12 <= res.lower[u] <= sup + 1e-12
        assert sup <= res.upper[u] + 1e-12
    # A distant source on a path: Q is entrywise nonnegative, so the bounds meet (exact sup).
    w = metropolis("path", nodes=6)
    res = joint_factors(w, 6, 2, False, 0)
    assert np.all(res.q[4] >= 0) and res.lower[4] > 0.1
    assert res.upper[4] == pytest.approx(res.lower[4], abs=1e-6)


def test_dsgd_far_nodes_leak_only_jointly():
    # K = 1 (D-SGD): per round, v sees only its neighbours' models, so nodes at distance >= 2
    # get 0; over R rounds their gradients reach v through the models.
    for kind, kw, v in (("path", {"nodes": 6}, 0), ("ring", {"nodes": 8}, 0)):
        g = build_graph(kind, **kw)
        w = gossip_matrix(g)
        d = distances_from(g, v)
        one = joint_factors(w, 1, 1, False, v)
        assert np.all(one.upper[d >= 2] == 0.0)
        for rounds in (2, 3, 5):
            res = joint_factors(w, rounds, 1, False, v)
            assert np.all(res.per_round[d >= 2] == 0.0)
            reach = (d >= 2) & (d <= rounds)
            assert np.all(res.diag[reach] > 1e-4) and np.all(res.upper[reach] > 1e-4)
            # Beyond R hops nothing arrives: exactly 0.
            assert np.all(res.upper[d > rounds] == 0.0) and np.all(res.diag[d > rounds] == 0.0)


def test_per_round_is_not_a_bound_in_either_direction():
    # Path u - w - v (0 - 1 - 2), Metropolis weights 1/3, D-SGD, R = 2. Round 1's message from w
    # is theta^1_w - nu z^1_w, and theta^1_w contains u's unknown round-0 noise (weight 1/3):
    # Q^(w) = diag(1, 1/(1 + 1/9)) = diag(1, 9/10), Q^(u) = diag(1/10, 0).
    w = metropolis("path", nodes=3)
    for method in ("rational", "float"):
        res = joint_factors(w, 2, 1, False, 2, method=method)
        np.testing.assert_allclose(res.q[1], np.diag([1.0, 0.9]), atol=1e-14)
        np.testing.assert_allclose(res.q[0], np.diag([0.1, 0.0]), atol=1e-14)
        assert res.per_round[1] == pytest.approx(2.0)
        assert res.upper[1] == pytest.approx(1.9, abs=1e-8)
        assert res.upper[1] < res.per_round[1]  # joint below per-round for the neighbour
        assert res.per_round[0] == 0.0 < res.diag[0]  # and above it for the far node


@pytest.mark.parametrize(
    "kind,kw,rounds,steps",
    [
        ("ring", {"nodes": 7}, 4, 2),
        ("grid", {"rows": 3, "cols": 3}, 3, 2),
        ("erdos_renyi", {"nodes": 9, "p": 0.3, "seed": 2}, 4, 2),
        ("hypercube", {"dim": 3}, 3, 3),
    ],
)
def test_joint_redistributes_the_per_round_total(kind, kw, rounds, steps):
    # Summed over sources both equal the number of independent observed directions: round r
    # adds d_r of them (its innovations have covariance >= I), jointly and on its own. So the
    # joint view moves loss from near sources to far ones; it cannot dominate source by source.
    w = metropolis(kind, **kw)
    n = len(w)
    for v in range(n):
        res = joint_factors(w, rounds, steps, True, v)
        others = np.arange(n) != v
        assert res.diag[others].sum() == pytest.approx(res.per_round[others].sum(), abs=1e-9)
    sched, received = _missed_schedule(w, rounds, steps, True, 7)
    res = joint_factors(w, rounds, steps, True, 0, schedule=sched, received=received(0))
    assert res.diag[1:].sum() == pytest.approx(res.per_round[1:].sum(), abs=1e-9)


def test_accelerated_and_plain():
    w = metropolis("ring", nodes=6)
    # Same Q for R = 1 (any K) and for K = 1 (any R): same spans, same models.
    for rounds, steps in ((1, 3), (3, 1)):
        a = joint_factors(w, rounds, steps, True, 0)
        b = joint_factors(w, rounds, steps, False, 0)
        np.testing.assert_allclose(a.q, b.q, atol=1e-12)
    # For R >= 2, K >= 2 the models passed on (P_K(W) vs W^K) differ and so does the view.
    a = joint_factors(w, 2, 2, True, 0)
    b = joint_factors(w, 2, 2, False, 0)
    assert np.abs(a.q - b.q).max() > 1e-2
    np.testing.assert_allclose(a.per_round, b.per_round, atol=1e-12)


def _dense_reference(w, rounds, steps, accelerated, v, basis):
    """Independent float computation: the view's span in noise space is spanned by the columns
    (blocks s <= r) Z P^{r-s} B, B an orthonormal basis of the round's span with v's coordinate
    zeroed, Z = I - e_v e_v^T. That matrix is block triangular with orthonormal diagonal blocks
    (condition number O(R)), so a Householder QR of it is accurate."""
    n = len(w)
    g = chebyshev_gamma(spectral_gap(w)) if accelerated else 1.0
    cur, prev = np.eye(n), None
    for k in range(steps):
        nxt = w @ cur
        if k >= 1:
            nxt = g * nxt + (1.0 - g) * prev
        prev, cur = cur, nxt
    p = cur
    d = basis.shape[1]
    z = np.eye(n)
    z[v, v] = 0.0
    powers = [basis]
    for _ in range(1, rounds):
        powers.append(p @ powers[-1])
    m = np.zeros((rounds * n, rounds * d))
    for r in range(rounds):
        for s in range(r + 1):
            m[s * n : (s + 1) * n, r * d : (r + 1) * d] = z @ powers[r - s]
    assert np.linalg.svd(m, compute_uv=False).min() > 0.1
    o, _ = np.linalg.qr(m)
    q = np.zeros((n, rounds, rounds))
    for u in range(n):
        if u != v:
            q[u] = o[u::n] @ o[u::n].T
    return q


def test_kalman_matches_dense_reference_long_horizon():
    # Ring: the per-round span is the coordinate subspace within distance K of v (no Lanczos).
    n, steps, rounds, v = 24, 3, 30, 0
    w = metropolis("ring", nodes=n)
    dist = np.minimum(np.arange(n), n - np.arange(n))
    basis = np.eye(n)[:, (dist >= 1) & (dist <= steps)]
    res = joint_factors(w, rounds, steps, True, v)
    assert res.method == "float"
    ref = _dense_reference(w, rounds, steps, True, v, basis)
    np.testing.assert_allclose(res.q[1:], ref[1:], atol=1e-12)
    # Grid with the Lanczos basis of the single-run accountant.
    w = metropolis("grid", rows=5, cols=6)
    n, v = len(w), 7
    nb = [x for x in range(n) if x != v and w[v, x]]
    kb = _lanczos_basis(
        __import__("scipy.sparse").sparse.csr_matrix(w), [v, *nb], n, 4, _Ranks(True, "")
    )
    kb = kb[:, 1:]
    kb[v] = 0.0
    kb, _ = np.linalg.qr(kb)
    res = joint_factors(w, 20, 4, False, v)
    ref = _dense_reference(w, 20, 4, False, v, kb)
    np.testing.assert_allclose(np.delete(res.q, v, 0), np.delete(ref, v, 0), atol=1e-12)


def test_rational_and_float_agree_with_small_directions():
    # Random geometric graph, long rounds: the within-round spans have tiny directions.
    w = metropolis("geometric", nodes=14, radius=0.4, seed=7)
    a = joint_factors(w, 4, 7, True, 0, method="rational")
    b = joint_factors(w, 4, 7, True, 0, method="float")
    assert (a.method, b.method) == ("rational", "float")
    np.testing.assert_allclose(a.q, b.q, atol=1e-12)
    np.testing.assert_allclose(a.upper, b.upper, atol=1e-6)


def test_invariant_subspace_reduction():
    # Hypercube: the block Krylov space of [e_v, e_N(v)] is invariant of dimension D < n and the
    # filter runs in those D coordinates; the dense reference works in the full space.
    w = metropolis("hypercube", dim=5)
    n, v, steps, rounds = len(w), 3, 3, 12
    nb = [x for x in range(n) if x != v and w[v, x]]
    ws = sp.csr_matrix(w)
    assert _lanczos_basis(ws, [v, *nb], n, n + 1, _Ranks(True, "")).shape[1] < n
    kb = _lanczos_basis(ws, [v, *nb], n, steps, _Ranks(True, ""))[:, 1:]
    kb[v] = 0.0
    kb, _ = np.linalg.qr(kb)
    res = joint_factors(w, rounds, steps, True, v)
    assert res.method == "float"
    ref = _dense_reference(w, rounds, steps, True, v, kb)
    np.testing.assert_allclose(np.delete(res.q, v, 0), np.delete(ref, v, 0), atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


def test_refuses_what_it_cannot_do():
    w = metropolis("ring", nodes=70)
    sched = fault_free(w, 2, 2, False)
    sched[1][0] = (apply_misses(w, {(5, 6)}), 1.0)
    with pytest.raises(MultiRoundTooLarge):
        joint_factors(w, 2, 2, False, 0, schedule=sched)
    with pytest.raises(MultiRoundTooLarge):
        joint_factors(w, 2, 2, False, 0, method="rational")
    res = joint_factors(w, 2, 2, False, 0)  # fault-free: the float path covers it
    assert res.method == "float"
    small = metropolis("ring", nodes=5)
    with pytest.raises(ValueError):
        joint_factors(small, 0, 2, False, 0)
    with pytest.raises(ValueError):
        joint_factors(small, 2, 2, False, 7)
    with pytest.raises(ValueError):
        joint_factors(small, 2, 2, False, 0, received=[(2, 0, 1)])
    with pytest.raises(ValueError):
        joint_factors(small, 2, 2, False, 0, schedule=fault_free(small, 3, 2, False))
    with pytest.raises(ValueError):
        joint_factors(small, 2, 2, False, 0, method="bogus")
