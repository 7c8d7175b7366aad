"""Muffliato pairwise losses: exact joint-view factor and the paper's Eq. (6).

The reference is a brute-force Rényi divergence of the observer's whole Gaussian view, computed
from its covariance in 80-digit arithmetic (mpmath): mean shift ``C' e_u`` (Delta = 1), covariance
``C' C'^T`` (sigma = 1), divergence ``alpha/2 * shift^T Sigma^+ shift``; reported in units of the
LDP loss alpha/2, i.e. ``shift^T Sigma^+ shift``. ``C'`` holds the observed rows with column v
removed (v knows its own noise), and is built from the float64 schedule entries exactly.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import mpmath
import networkx as nx
import numpy as np
import pytest

import coordinator_free.privacy.muffliato as mf
from coordinator_free.graphs import (
    build_graph,
    chebyshev_gamma,
    distances_from,
    gossip_matrix,
    spectral_gap,
)
from coordinator_free.privacy.muffliato import (
    ExactTooLargeError,
    NumericalRankError,
    apply_misses,
    distance_summary,
    exact_factors,
    exact_factors_rational,
    exact_upper_factors,
    fault_free_received,
    fault_free_steps,
    ldp_capped,
    paper_factors,
    plan_exact_diagnostics,
    plan_factors,
    realised_coefficients,
)

DPS = 80


def snapped(x: float):
    """The weight a float64 entry stands for: the first limit_denominator(10^k) within 8 ulps.

    Written independently of the library's continued-fraction helper on purpose."""
    exact = Fraction(x)
    for k in range(1, 11):
        f = exact.limit_denominator(10**k)
        if abs(f - exact) <= 8 * Fraction(math.ulp(x)):
            return f
    return exact


def to_mp(x: float):
    f = snapped(x)
    return mpmath.mpf(f.numerator) / f.denominator


def brute_force_factors(steps, v, received):
    """Rényi divergence / (alpha Delta^2 / (2 sigma^2)) for every source, in high precision.

    The schedule's float64 weights are read as the fractions they stand for (1/3, 13/24, ...).
    Read as exact dyadic rationals instead, rounding breaks exact symmetries of the intended
    matrix and creates directions of relative size ~1e-17 (see test_float_rounding_artefacts).
    """
    n = steps[0][0].shape[0]
    with mpmath.workdps(DPS):

        def mat(m):
            return mpmath.matrix([[to_mp(float(e)) for e in row] for row in m])

        c = [mpmath.eye(n)]
        if len(steps) > 1:
            c.append(mat(steps[0][0]))
        for t in range(1, len(steps) - 1):
            m = mat(steps[t][0])
            g = to_mp(steps[t][1])
            c.append(g * (m * c[t]) + (1 - g) * c[t - 1])
        others = [j for j in range(n) if j != v]
        rows = [[c[t][w, j] for j in others] for t, w in sorted(set(received))]
        out = np.zeros(n)
        out[v] = 1.0
        if not rows:
            return out
        cp = mpmath.matrix(rows)
        sigma = cp * cp.T
        evals, evecs = mpmath.eigsy(sigma)
        top = max(abs(e) for e in evals)
        pinv = mpmath.zeros(sigma.rows, sigma.cols)
        for i in range(len(evals)):
            if abs(evals[i]) > top * mpmath.mpf(10) ** (-(DPS // 2)):
                col = evecs[:, i]
                pinv += (col * col.T) / evals[i]
        for k, u in enumerate(others):
            shift = cp[:, k]
            out[u] = float((shift.T * pinv * shift)[0])
        return out


def metropolis(kind, **kw):
    g = build_graph(kind, **kw)
    return g, gossip_matrix(g, "metropolis")


def faulty_schedule(w, steps, accelerated, p, seed):
    """Random missed messages; half of the missed ones still arrive late (seen, not used)."""
    rng = np.random.default_rng(seed)
    n = w.shape[0]
    gamma = chebyshev_gamma(spectral_gap(w)) if accelerated else 1.0
    sched, missed = [], []
    for t in range(steps):
        miss = {
            (a, b)
            for a in range(n)
            for b in range(n)
            if a != b and w[a, b] > 0 and rng.random() < p
        }
        sched.append((apply_misses(w, miss), 1.0 if t == 0 else gamma))
        missed.append(miss)
    late_seen = {(t, a, b) for t in range(steps) for a, b in missed[t] if rng.random() < 0.5}

    def received(v):
        return [
            (t, b)
            for t in range(steps)
            for b in range(n)
            if b != v and w[v, b] > 0 and ((v, b) not in missed[t] or (t, v, b) in late_seen)
        ]

    return sched, received


# ---------------------------------------------------------------------------------------------
# The smallest counterexample to Eq. (6) being an upper bound: path u-w-v (docs/privacy.md)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("accelerated", [False, True])
def test_path3_counterexample(accelerated):
    _, w = metropolis("path", nodes=3)
    steps = fault_free_steps(w, 2, accelerated)
    rec = fault_free_received(w, 2, 2)
    assert rec == [(0, 1), (1, 1)]
    exact = exact_factors(steps, 2, rec)
    paper = paper_factors(steps, 2, rec)
    # v = 2 computes x_1^1 - W_11 y_1 - W_12 y_2 = y_0 / 3: node 0 is fully exposed.
    assert exact[0] == pytest.approx(1.0, abs=1e-12)
    assert paper[0] == pytest.approx(1 / 3, abs=1e-12)
    np.testing.assert_allclose(brute_force_factors(steps, 2, rec), exact, atol=1e-12)
    np.testing.assert_allclose(exact_factors_rational(steps, 2, rec), exact, atol=1e-15)
    np.testing.assert_allclose(plan_factors(w, 2, accelerated, method="exact")[2], exact)


def test_eq6_underestimates_on_the_hypercube_far_side():
    # The paper's synthetic graph at small size: far nodes are fully exposed to the exact
    # computation while Eq. (6) reports a small loss (and mid-range is the other way round).
    g, w = metropolis("hypercube", dim=7)
    steps = 10  # T^stop of Theorem 2 for sigma = 1, spread 0.25
    exact = plan_factors(w, steps, True, method="exact", sources=[0])[:, 0]
    paper = plan_factors(w, steps, True, method="paper", sources=[0])[:, 0]
    d = distances_from(g, 0)
    far = d == d.max()
    assert np.all(exact[far] > 0.99)
    assert np.all(paper[far] < 0.5)
    assert np.any((paper > exact + 1e-3) & (d >= 2))  # Eq. (6) is also too pessimistic somewhere


# ---------------------------------------------------------------------------------------------
# Exact factor vs brute force
# ---------------------------------------------------------------------------------------------

SMALL_GRAPHS = [
    ("ring", {"nodes": 6}),
    ("ring", {"nodes": 8}),
    ("star", {"nodes": 6}),
    ("complete", {"nodes": 5}),
    ("grid", {"rows": 3, "cols": 3}),
    ("hypercube", {"dim": 4}),
    ("erdos_renyi", {"nodes": 8, "p": 0.35, "seed": 4}),
    ("geometric", {"nodes": 8, "radius": 0.55, "seed": 2}),
]


@pytest.mark.parametrize("kind,kw", SMALL_GRAPHS, ids=[k for k, _ in SMALL_GRAPHS])
@pytest.mark.parametrize("accelerated", [False, True], ids=["plain", "cheb"])
def test_exact_matches_brute_force_fault_free(kind, kw, accelerated):
    _, w = metropolis(kind, **kw)
    n = w.shape[0]
    steps = 3
    sched = fault_free_steps(w, steps, accelerated)
    plan = plan_factors(w, steps, accelerated, method="exact")
    for v in (0, n // 2):
        rec = fault_free_received(w, v, steps)
        ref = brute_force_factors(sched, v, rec)
        np.testing.assert_allclose(plan[v], ref, atol=1e-10)
        np.testing.assert_allclose(exact_factors(sched, v, rec), ref, atol=1e-10)


@pytest.mark.parametrize("case", range(6), ids=[k for k, _ in SMALL_GRAPHS[:6]])
@pytest.mark.parametrize("accelerated", [False, True], ids=["plain", "cheb"])
def test_exact_matches_brute_force_with_faults(case, accelerated):
    kind, kw = SMALL_GRAPHS[case]
    _, w = metropolis(kind, **kw)
    n = w.shape[0]
    steps = 4
    sched, received = faulty_schedule(w, steps, accelerated, p=0.15, seed=100 + case)
    assert any(not np.array_equal(m, w) for m, _ in sched[:-1])  # faults really happen
    for v in (0, n - 1):
        rec = received(v)
        ref = brute_force_factors(sched, v, rec)
        got = exact_factors(sched, v, rec)
        np.testing.assert_allclose(got, ref, atol=1e-10)
        upper = exact_upper_factors(w, sched, v, rec)
        assert np.all(upper >= got - 1e-10)


@pytest.mark.parametrize("accelerated", [False, True], ids=["plain", "cheb"])
def test_work_shared_by_the_observers_of_one_schedule(accelerated, monkeypatch):
    # Eq. (6) of every observer in one sweep: the same bits as one observer at a time, with
    # every C_t computed once. The fault rows' span, computed once and passed in: the same
    # upper bound (to roundoff), still above the exact loss.
    _, w = metropolis("erdos_renyi", nodes=12, p=0.3)
    n = w.shape[0]
    sched, received = faulty_schedule(w, 5, accelerated, p=0.2, seed=7)
    assert any(not np.array_equal(m, w) for m, _ in sched[:-1])
    recs = {v: received(v) for v in range(n)}
    sweeps = []
    inner = mf._coefficients
    monkeypatch.setattr(mf, "_coefficients", lambda *a: (sweeps.append(1), inner(*a))[1])
    many = mf.paper_factors_many(sched, recs)
    assert len(sweeps) == 1
    for v in range(n):
        np.testing.assert_array_equal(many[v], paper_factors(sched, v, recs[v]))
    span = mf.fault_span(w, sched)
    assert 0 < span.shape[1] <= n
    np.testing.assert_allclose(span.T @ span, np.eye(span.shape[1]), atol=1e-12)
    for v in range(n):
        shared = exact_upper_factors(w, sched, v, recs[v], span=span)
        np.testing.assert_allclose(shared, exact_upper_factors(w, sched, v, recs[v]), atol=1e-12)
        assert np.all(shared >= exact_factors(sched, v, recs[v]) - 1e-10)
    with pytest.raises(ValueError, match="different sizes"):
        exact_upper_factors(w, sched, 0, recs[0], span=np.zeros((n + 1, 0)))


def test_float_rounding_artefacts():
    # Hub 0, twin pair {2, 7} and leaf 5 hang off the hub; with the intended weights
    # e_5 - (e_2 + e_7)/2 is an eigenvector (eigenvalue 7/8) orthogonal to everything observer 4
    # can reach. The float64 weights (13/24 is stored one ulp off) break that symmetry by ~1e-17,
    # and exact arithmetic on the raw floats then "exposes" node 5 completely.
    g, w = metropolis("geometric", nodes=8, radius=0.55, seed=2)
    assert sorted(g.neighbors(5)) == [0] and sorted(g.neighbors(2)) == [0, 7]
    sched = fault_free_steps(w, 4, False)
    rec = fault_free_received(w, 4, 4)
    intended = exact_factors_rational(sched, 4, rec)
    raw = exact_factors_rational(sched, 4, rec, snap=False)
    lanczos = plan_factors(w, 4, False, method="exact", observers=[4])[0]
    np.testing.assert_allclose(intended, lanczos, atol=1e-12)
    np.testing.assert_allclose(intended, brute_force_factors(sched, 4, rec), atol=1e-12)
    assert intended[5] == pytest.approx(1 / 3) and raw[5] == 1.0


def test_fault_free_with_varying_gammas_takes_the_krylov_path():
    _, w = metropolis("grid", rows=3, cols=3)
    sched = [(w, 1.0), (w, 1.3), (w, 1.7), (w, 1.1)]
    rec = fault_free_received(w, 4, 4)
    got = exact_factors(sched, 4, rec)
    np.testing.assert_allclose(got, exact_factors_rational(sched, 4, rec), atol=1e-12)
    np.testing.assert_allclose(got, brute_force_factors(sched, 4, rec), atol=1e-10)
    np.testing.assert_allclose(got, plan_factors(w, 4, False, method="exact")[4], atol=1e-12)


def test_a_missed_message_changes_the_exact_loss():
    # ring of 8, observer 0; node 1 misses node 2's step-1 message (not seen late either)
    _, w = metropolis("ring", nodes=8)
    steps = 3
    base = fault_free_steps(w, steps, False)
    sched = list(base)
    sched[1] = (apply_misses(w, [(1, 2)]), 1.0)
    rec = fault_free_received(w, 0, steps)
    got = exact_factors(sched, 0, rec)
    np.testing.assert_allclose(got, brute_force_factors(sched, 0, rec), atol=1e-10)
    assert np.abs(got - exact_factors(base, 0, rec)).max() > 1e-3
    # and the observer itself missing a message (seen late, or not seen at all)
    sched2 = list(base)
    sched2[1] = (apply_misses(w, [(0, 1)]), 1.0)
    for rec2 in (rec, [m for m in rec if m != (1, 1)]):
        np.testing.assert_allclose(
            exact_factors(sched2, 0, rec2), brute_force_factors(sched2, 0, rec2), atol=1e-10
        )


def test_nontrivial_values_are_exercised():
    # Guard against a brute-force comparison that only ever sees 0 and 1 (rings, complete
    # graphs and small hypercubes do give 0/1 factors: there the observed span is a coordinate
    # subspace or everything).
    graphs_with_fractions = 0
    for kind, kw in SMALL_GRAPHS:
        _, w = metropolis(kind, **kw)
        f = plan_factors(w, 3, True, method="exact")
        n = w.shape[0]
        rows = f[[0, n // 2]]
        if np.any((rows > 1e-3) & (rows < 1 - 1e-3)):
            graphs_with_fractions += 1
        assert np.all(f >= 0) and np.all(f <= 1)
    assert graphs_with_fractions >= 5


# ---------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind,kw",
    [
        ("grid", {"rows": 4, "cols": 5}),
        ("erdos_renyi", {"nodes": 30, "p": 0.15}),
        ("hypercube", {"dim": 5}),
        ("geometric", {"nodes": 40, "radius": 0.3, "seed": 1}),
    ],
)
def test_plan_properties(kind, kw):
    _, w = metropolis(kind, **kw)
    steps = 6
    ex_plain = plan_factors(w, steps, False, method="exact")
    ex_acc = plan_factors(w, steps, True, method="exact")
    # same span for plain and Chebyshev gossip
    np.testing.assert_allclose(ex_plain, ex_acc, atol=1e-9)
    assert np.all(ex_acc >= 0) and np.all(ex_acc <= 1)
    np.testing.assert_array_equal(np.diag(ex_acc), 1.0)
    for acc in (False, True):
        pap = plan_factors(w, steps, acc, method="paper")
        deg = (w > 0).sum(axis=1) - 1
        # sum over all sources (including v) of one message's terms is 1 (docs/privacy.md, section 3)
        np.testing.assert_allclose(pap.sum(axis=1), deg * steps, rtol=1e-12)
        np.testing.assert_array_equal(ldp_capped(pap), np.minimum(pap, 1.0))
    diag = plan_exact_diagnostics(w, steps)
    assert diag.ambiguous == 0 and diag.max_dropped <= mf.DROP_TOL < mf.KEEP_TOL <= diag.min_kept


def test_plan_matches_realised_path():
    for (kind, kw), acc in itertools.product(
        [("grid", {"rows": 3, "cols": 4}), ("erdos_renyi", {"nodes": 12, "p": 0.3})],
        (False, True),
    ):
        _, w = metropolis(kind, **kw)
        n = w.shape[0]
        steps = 5
        sched = fault_free_steps(w, steps, acc)
        pe = plan_factors(w, steps, acc, method="exact")
        pp = plan_factors(w, steps, acc, method="paper")
        for v in range(n):
            rec = fault_free_received(w, v, steps)
            np.testing.assert_allclose(exact_factors(sched, v, rec), pe[v], atol=1e-9)
            np.testing.assert_allclose(exact_factors_rational(sched, v, rec), pe[v], atol=1e-9)
            np.testing.assert_allclose(paper_factors(sched, v, rec), pp[v], atol=1e-9)
            np.testing.assert_allclose(exact_upper_factors(w, sched, v, rec), pe[v], atol=1e-9)


def test_subsets_of_observers_and_sources():
    _, w = metropolis("grid", rows=4, cols=4)
    full_e = plan_factors(w, 5, True, method="exact")
    full_p = plan_factors(w, 5, True, method="paper")
    obs, src = [3, 0, 9], [5, 3]
    np.testing.assert_allclose(
        plan_factors(w, 5, True, method="exact", observers=obs, sources=src),
        full_e[np.ix_(obs, src)],
    )
    np.testing.assert_allclose(
        plan_factors(w, 5, True, method="paper", observers=obs, sources=src),
        full_p[np.ix_(obs, src)],
    )


def test_paper_sum_equals_number_of_received_messages_with_faults():
    _, w = metropolis("grid", rows=3, cols=3)
    sched, received = faulty_schedule(w, 6, True, p=0.2, seed=7)
    for v in range(9):
        rec = received(v)
        assert paper_factors(sched, v, rec).sum() == pytest.approx(len(rec), rel=1e-12)


def test_hypercube_losses_depend_only_on_distance():
    g, w = metropolis("hypercube", dim=6)
    steps = 6
    d = np.array([distances_from(g, v) for v in range(w.shape[0])])
    obs = [0, 5, 33, 63]
    for method in ("paper", "exact"):
        f = plan_factors(w, steps, True, method=method, observers=obs)
        dd = d[obs]
        for k in range(1, 7):
            vals = f[dd == k]
            assert vals.max() - vals.min() <= 1e-9, (method, k)
        summ = distance_summary(f, dd)
        assert sorted(summ) == list(range(1, 7))
        assert summ[1]["count"] == 6 * len(obs)


def test_realised_coefficients_match_a_node_level_simulation():
    # Each node averages what it received and uses its own value for a missed message.
    _, w = metropolis("grid", rows=3, cols=3)
    n, steps = 9, 5
    sched, _ = faulty_schedule(w, steps, True, p=0.2, seed=3)
    c = realised_coefficients(sched)
    rng = np.random.default_rng(0)
    y = rng.normal(size=n)
    x_prev, x = None, y.copy()
    for t in range(steps):
        np.testing.assert_allclose(c[t] @ y, x, atol=1e-12)
        m, g = sched[t]
        nxt = np.empty(n)
        for v in range(n):
            acc = w[v, v] * x[v]
            for u in range(n):
                if u != v and w[v, u] > 0:
                    acc += w[v, u] * (x[u] if m[v, u] != 0 else x[v])
            nxt[v] = acc if t == 0 else g * acc + (1 - g) * x_prev[v]
        x_prev, x = x, nxt


def test_apply_misses():
    _, w = metropolis("ring", nodes=5)
    m = apply_misses(w, [(0, 1), (0, 4), (2, 3)])
    assert m[0, 1] == 0 and m[0, 4] == 0 and m[2, 3] == 0
    assert m[0, 0] == pytest.approx(w[0, 0] + w[0, 1] + w[0, 4])
    np.testing.assert_allclose(m.sum(axis=1), 1.0)
    np.testing.assert_array_equal(m[1], w[1])


# ---------------------------------------------------------------------------------------------
# Numerical policy and errors
# ---------------------------------------------------------------------------------------------


def test_ambiguous_rank_decisions_raise_or_are_counted(monkeypatch):
    _, w = metropolis("grid", rows=3, cols=4)
    # widen the band so that genuine directions fall inside it
    monkeypatch.setattr(mf, "KEEP_TOL", 2.0)
    with pytest.raises(NumericalRankError, match="cannot tell"):
        plan_factors(w, 4, True, method="exact")
    lax = plan_factors(w, 4, True, method="exact", strict=False)
    monkeypatch.undo()
    np.testing.assert_allclose(lax, plan_factors(w, 4, True, method="exact"), atol=1e-12)
    monkeypatch.setattr(mf, "KEEP_TOL", 2.0)
    assert plan_exact_diagnostics(w, 4).ambiguous > 0


def test_input_validation():
    _, w = metropolis("ring", nodes=6)
    sched = fault_free_steps(w, 3, True)
    rec = fault_free_received(w, 0, 3)
    with pytest.raises(ValueError, match="gamma_0"):
        exact_factors([(w, 1.4)] + sched[1:], 0, rec)
    with pytest.raises(ValueError, match="from itself"):
        paper_factors(sched, 0, [(0, 0)])
    with pytest.raises(ValueError, match="out of range"):
        paper_factors(sched, 0, [(3, 1)])
    with pytest.raises(ValueError, match="not listed as received"):
        exact_factors(sched, 0, [m for m in rec if m != (1, 1)])
    with pytest.raises(ValueError, match="unknown method"):
        plan_factors(w, 3, True, method="eq6")
    with pytest.raises(ValueError, match="symmetric"):
        plan_factors(np.triu(w), 3, True, method="paper")


def test_large_faulty_schedules_are_refused_with_a_clear_error():
    g = nx.cycle_graph(mf.RATIONAL_MAX_NODES + 1)
    w = gossip_matrix(g)
    sched = fault_free_steps(w, 3, False)
    sched[1] = (apply_misses(w, [(5, 6)]), 1.0)
    rec = fault_free_received(w, 0, 3)
    with pytest.raises(ExactTooLargeError, match="exact_upper_factors"):
        exact_factors(sched, 0, rec)
    up = exact_upper_factors(w, sched, 0, rec)
    assert up.shape == (w.shape[0],) and np.all((up >= 0) & (up <= 1))
    # fault-free schedules of any size take the Lanczos path
    ff = fault_free_steps(w, 3, False)
    np.testing.assert_allclose(
        exact_factors(ff, 0, rec), plan_factors(w, 3, False, method="exact", observers=[0])[0]
    )


@pytest.mark.parametrize(
    "kind, kw",
    [("hypercube", {"dim": 5}), ("ring", {"nodes": 14}), ("complete", {"nodes": 7})],
)
@pytest.mark.parametrize("accelerated", [False, True])
def test_a_translation_invariant_gossip_matrix_gives_every_row_from_one(kind, kw, accelerated):
    """The symmetric shortcut (observer 0's row moved by the graph's translations) equals the
    per-observer computation, for both methods, all pairs and subsets."""
    import scipy.sparse as sp

    from coordinator_free.graphs import build_graph, gossip_matrix
    from coordinator_free.privacy.muffliato import plan_factors, translations

    w = gossip_matrix(build_graph(kind, **kw), "metropolis")
    assert translations(sp.csr_matrix(w)) is not None
    for method in ("exact", "paper"):
        fast = plan_factors(w, 4, accelerated, method=method)
        slow = plan_factors(w, 4, accelerated, method=method, symmetry=False)
        assert np.allclose(fast, slow, atol=1e-13)
        some = plan_factors(w, 4, accelerated, method=method, observers=[3, 1], sources=[0, 2])
        assert np.allclose(some, slow[[3, 1]][:, [0, 2]], atol=1e-13)


def test_no_translation_group_is_assumed_where_the_weights_break_it():
    import scipy.sparse as sp

    from coordinator_free.graphs import build_graph, gossip_matrix
    from coordinator_free.privacy.muffliato import translations

    w = gossip_matrix(build_graph("hypercube", dim=4), "metropolis")
    w[0, 1] = w[1, 0] = w[0, 1] * 0.5  # one edge lighter: no longer vertex-transitive
    w[0, 0] += w[0, 1]
    w[1, 1] += w[0, 1]
    assert translations(sp.csr_matrix(w)) is None
    er = gossip_matrix(build_graph("erdos_renyi", nodes=16, p=0.3), "metropolis")
    assert translations(sp.csr_matrix(er)) is None


def test_the_audits_schedule_shares_the_fault_span_beyond_exact_arithmetic(monkeypatch):
    # Past RATIONAL_MAX_NODES an observer's 'exact' is the Krylov upper bound; the span of the
    # schedule's fault rows is computed once for all observers, each gets its note.
    from types import SimpleNamespace

    from coordinator_free.families.averaging.accountant import Schedule

    _, w = metropolis("erdos_renyi", nodes=mf.RATIONAL_MAX_NODES + 6, p=0.12)
    n = w.shape[0]
    sched, received = faulty_schedule(w, 4, True, p=0.05, seed=3)
    recs = {v: received(v) for v in range(n)}
    calls = []
    inner = mf.fault_span
    monkeypatch.setattr(mf, "fault_span", lambda *a, **k: (calls.append(1), inner(*a, **k))[1])
    work = Schedule(SimpleNamespace(n=n, W=w), sched, recs)
    notes: list = []
    for v in (0, 5, n - 1):
        got = work.factors(v, "exact", notes)
        np.testing.assert_allclose(got, exact_upper_factors(w, sched, v, recs[v]), atol=1e-12)
        np.testing.assert_array_equal(work.factors(v, "paper", notes),
                                      paper_factors(sched, v, recs[v]))  # fmt: skip
    assert len(calls) == 1
    assert [x["observer"] for x in notes] == [0, 5, n - 1]
    assert {x["kind"] for x in notes} == {"exact-upper-bound"}


def test_the_audits_schedule_prepares_its_observers_in_forked_children():
    # prepare(): every observer's exact row ahead, in children; the same rows (to roundoff: the
    # children hold BLAS to one thread) and the same notes as one observer at a time.
    from types import SimpleNamespace

    from coordinator_free.families.averaging.accountant import Schedule

    _, w = metropolis("erdos_renyi", nodes=mf.RATIONAL_MAX_NODES + 6, p=0.12)
    n = w.shape[0]
    sched, received = faulty_schedule(w, 4, True, p=0.05, seed=4)
    recs = {v: received(v) for v in range(n)}
    plan = SimpleNamespace(n=n, W=w)
    ahead, lazy = Schedule(plan, sched, recs), Schedule(plan, sched, recs)
    ahead.prepare(list(range(n)))
    assert sorted(ahead._exact) == list(range(n))
    notes_ahead: list = []
    notes_lazy: list = []
    for v in range(n):
        np.testing.assert_allclose(ahead.factors(v, "exact", notes_ahead),
                                   lazy.factors(v, "exact", notes_lazy), rtol=0, atol=1e-12)  # fmt: skip
    assert notes_ahead == notes_lazy and len(notes_ahead) == n
