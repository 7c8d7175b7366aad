"""DECOR accountant: diag of the inverse honest covariance, realised rounds, closed forms,
conversions and calibration.

The reference for realised rounds is a direct computation that does not use round_matrix: the
adversary's whole observation (published values plus the colluders' own noises and known secrets)
is written as a linear map A of all the noises, and the Rényi divergence per unit order of a shift
``d`` is ``d^T (A A^T)^+ d / 2``.
"""

from __future__ import annotations

import itertools
import math

import networkx as nx
import numpy as np
import pytest

from coordinator_free.privacy import rdp
from coordinator_free.privacy.decor import (
    SpectralGraph,
    TooManyCoalitions,
    algebraic_connectivity,
    calibrate_pairs,
    choose_pair,
    closed_form_rho,
    conversions,
    gamma_w,
    graph_step_rho,
    inverse_diagonal,
    rho_for_eps,
    round_matrix,
)


def laplacian(g: nx.Graph) -> np.ndarray:
    n = g.number_of_nodes()
    a = np.zeros((n, n))
    for u, v in g.edges():
        a[u, v] = a[v, u] = 1.0
    return np.diag(a.sum(axis=1)) - a


def random_connected(n: int, p: float, seed: int) -> nx.Graph:
    rng = np.random.default_rng(seed)
    while True:
        g = nx.gnp_random_graph(n, p, seed=int(rng.integers(1 << 30)))
        if nx.is_connected(g):
            return g


def torus(k: int) -> nx.Graph:
    return nx.convert_node_labels_to_integers(nx.grid_2d_graph(k, k, periodic=True))


def fault_free(g: nx.Graph) -> dict[int, list[int]]:
    return {i: list(g.neighbors(i)) for i in g.nodes}


# ------------------------------------------------------------------------------------------
# inverse_diagonal


@pytest.mark.parametrize("seed", range(4))
def test_inverse_diagonal_dense_sparse_and_inv(seed):
    rng = np.random.default_rng(seed)
    g = random_connected(30, 0.15, seed)
    lap = laplacian(g)
    for s_cdp, s_cor in [(1.0, 0.0), (0.7, 1.3), (2.0, 0.4), (1.0, 5.0)]:
        ref = np.diag(np.linalg.inv(s_cdp**2 * np.eye(30) + s_cor**2 * lap))
        dense = inverse_diagonal(s_cdp, s_cor, lap)
        sparse = inverse_diagonal(s_cdp, s_cor, lap, dense_max=0)
        np.testing.assert_allclose(dense, ref, rtol=1e-10)
        np.testing.assert_allclose(sparse, ref, rtol=1e-10)
    # a realised M with own-only terms, a disconnected piece and an isolated node
    added = {i: list(g.neighbors(i)) for i in range(30) if rng.random() < 0.9}
    published = [i for i in range(30) if rng.random() < 0.85]
    _, m = round_matrix(30, added, published=published)
    ref = np.diag(np.linalg.inv(1.1**2 * np.eye(m.shape[0]) + 0.9**2 * m.toarray()))
    np.testing.assert_allclose(inverse_diagonal(1.1, 0.9, m), ref, rtol=1e-10)
    np.testing.assert_allclose(inverse_diagonal(1.1, 0.9, m, dense_max=0), ref, rtol=1e-10)


def test_inverse_diagonal_block_boundary_and_empty():
    g = nx.cycle_graph(600)  # 600 > one 256-column block, not a multiple of it
    lap = laplacian(g)
    d_dense = inverse_diagonal(1.0, 3.0, lap)
    d_sparse = inverse_diagonal(1.0, 3.0, lap, dense_max=0)
    np.testing.assert_allclose(d_sparse, d_dense, rtol=1e-10)
    np.testing.assert_allclose(d_dense, d_dense[0], rtol=1e-10)  # vertex-transitive
    assert inverse_diagonal(1.0, 1.0, np.zeros((0, 0))).shape == (0,)


@pytest.mark.parametrize("ratio", [1e4, 1e8, 1e12])
def test_inverse_diagonal_accurate_for_huge_sigma_cor(ratio):
    """The null direction of M is deflated: a plain Cholesky of Sigma is useless here."""
    n = 12
    complete = laplacian(nx.complete_graph(n))
    exact = 1.0 / n + (1.0 - 1.0 / n) / (1.0 + n * ratio**2)
    for dense_max in (2000, 0):
        d = inverse_diagonal(1.0, ratio, complete, dense_max=dense_max)
        np.testing.assert_allclose(d, exact, rtol=1e-9)
    # realised round: own-only terms (grounded pieces), a null piece and an isolated node
    added = {0: [1, 5], 1: [0, 2], 2: [1], 3: [4], 4: [3], 5: [], 7: [6, 8], 8: [7]}
    _, m = round_matrix(9, added, published=[0, 1, 2, 3, 4, 6, 7, 8])
    lam, u = np.linalg.eigh(m.toarray())
    lam[lam < 1e-9] = 0.0
    ref = (u**2) @ (1.0 / (1.0 + ratio**2 * lam))
    for dense_max in (2000, 0):
        d = inverse_diagonal(1.0, ratio, m, dense_max=dense_max)
        np.testing.assert_allclose(d, ref, rtol=1e-8)


def test_inverse_diagonal_rejects_bad_sigmas():
    lap = laplacian(nx.cycle_graph(5))
    with pytest.raises(ValueError, match="sigma_cdp"):
        inverse_diagonal(0.0, 1.0, lap)
    with pytest.raises(ValueError, match="sigma_cor"):
        inverse_diagonal(1.0, -1.0, lap)
    with pytest.raises(ValueError, match="square"):
        inverse_diagonal(1.0, 1.0, np.zeros((3, 4)))


# ------------------------------------------------------------------------------------------
# round_matrix


def test_round_matrix_fault_free_is_laplacian_and_induced_with_colluders():
    g = random_connected(12, 0.35, 7)
    honest, m = round_matrix(12, fault_free(g))
    assert honest.tolist() == list(range(12))
    np.testing.assert_array_equal(m.toarray(), laplacian(g))
    for q in [(3,), (0, 5), (2, 7, 11)]:
        honest, m = round_matrix(12, fault_free(g), colluders=q)
        assert honest.tolist() == sorted(set(range(12)) - set(q))
        induced = nx.convert_node_labels_to_integers(g.subgraph(honest.tolist()), ordering="sorted")
        np.testing.assert_array_equal(m.toarray(), laplacian(induced))


def test_round_matrix_rules_by_hand():
    # 0-1 matched, 1-2 only 1 added, 2-3 unmatched, 3-4 matched but 4 unpublished, 0-5 with 5 in Q
    added = {0: [1, 5], 1: [0, 2], 2: [3], 3: [2, 4], 4: [3], 5: [0]}
    honest, m = round_matrix(
        6, added, published=[0, 1, 2, 3, 5], colluders=[5], unmatched=[frozenset({2, 3})]
    )
    assert honest.tolist() == [0, 1, 2, 3]
    expected = np.array(
        [
            [1, -1, 0, 0],  # term to 5 is known to Q; term to 1 cancels with 1's
            [-1, 2, 0, 0],  # own-only term towards 2 counts on the diagonal
            [0, 0, 1, 0],  # unmatched towards 3: own-only
            [0, 0, 0, 2],  # unmatched towards 2 + term towards unpublished 4
        ],
        dtype=float,
    )
    np.testing.assert_array_equal(m.toarray(), expected)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"added": {0: [0]}}, r"added\[0\] contains 0"),
        ({"added": {0: [7]}}, r"added\[0\]: node id 7 out of range"),
        ({"added": {9: [1]}}, "added: node id 9 out of range"),
        ({"added": {0: [1, 1]}}, "twice"),
        ({"added": {0: [1]}, "published": [4]}, "published: node id 4"),
        ({"added": {0: [1]}, "colluders": [-1]}, "colluders: node id -1"),
        ({"added": {0: [1]}, "unmatched": [(2, 2)]}, "two distinct"),
        ({"added": {0: ["a"]}}, "must be an integer"),
    ],
)
def test_round_matrix_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        round_matrix(4, **kwargs)


def direct_rho(n, added, published, colluders, unmatched, s_cdp, s_cor, sens) -> dict[int, float]:
    """rho of each honest published user from the adversary's full linear-Gaussian view."""
    key_of: dict[tuple[int, int], int] = {}
    key_edge: list[frozenset] = []
    for i in sorted(added):
        for j in sorted(added[i]):
            if (i, j) in key_of:
                continue
            key_of[(i, j)] = len(key_edge)
            if i in added.get(j, ()) and frozenset((i, j)) not in unmatched:
                key_of[(j, i)] = len(key_edge)  # one shared z, cancels in the sum
            key_edge.append(frozenset((i, j)))
    cols = n + len(key_edge)
    rows = []
    row_of = {}
    for p in sorted(published):
        r = np.zeros(cols)
        r[p] = s_cdp
        for j in added.get(p, ()):
            r[n + key_of[(p, j)]] += (1.0 if p < j else -1.0) * s_cor
        row_of[p] = len(rows)
        rows.append(r)
    for k in colluders:  # the colluders' own noises
        r = np.zeros(cols)
        r[k] = s_cdp
        rows.append(r)
    for e, edge in enumerate(key_edge):  # every secret of an edge touching the coalition
        if edge & set(colluders):
            r = np.zeros(cols)
            r[n + e] = s_cor
            rows.append(r)
    a = np.array(rows)
    s_pinv = np.linalg.pinv(a @ a.T, rcond=1e-10, hermitian=True)
    out = {}
    for i in sorted(set(published) - set(colluders)):
        d = np.zeros(len(rows))
        d[row_of[i]] = sens
        assert np.linalg.matrix_rank(np.c_[a, d], tol=1e-9) == np.linalg.matrix_rank(a, tol=1e-9)
        out[i] = 0.5 * d @ s_pinv @ d
    return out


def test_round_matrix_matches_dense_direct_view():
    rng = np.random.default_rng(2024)
    checked = 0
    for case in range(60):
        n = int(rng.integers(5, 9))
        g = nx.gnp_random_graph(n, 0.6, seed=case)
        added = {}
        for i in range(n):
            if rng.random() < 0.9:
                added[i] = [j for j in g.neighbors(i) if rng.random() < 0.8]
        both = [
            frozenset((i, j))
            for i, j in g.edges()
            if j in added.get(i, ()) and i in added.get(j, ())
        ]
        unmatched = {e for e in both if rng.random() < 0.3}
        published = [p for p in range(n) if rng.random() < 0.85]
        q = int(rng.integers(0, 3))
        colluders = [int(c) for c in rng.choice(n, size=q, replace=False)]
        s_cdp, s_cor, sens = 0.8 + rng.random(), 0.5 + 2 * rng.random(), 2.0
        honest, m = round_matrix(
            n, added, published=published, colluders=colluders, unmatched=unmatched
        )
        assert honest.tolist() == sorted(set(published) - set(colluders))
        ours = 0.5 * sens**2 * inverse_diagonal(s_cdp, s_cor, m)
        ref = direct_rho(n, added, published, colluders, unmatched, s_cdp, s_cor, sens)
        np.testing.assert_allclose(ours, [ref[i] for i in honest.tolist()], rtol=1e-8)
        checked += len(honest)
    assert checked > 150


# ------------------------------------------------------------------------------------------
# fault-free graphs, closed form


@pytest.mark.parametrize("q", [0, 1])
def test_complete_graph_closed_form_is_exact(q):
    n = 9
    g = nx.complete_graph(n)
    a_q = algebraic_connectivity(g, q)
    assert a_q == pytest.approx(n - q, rel=1e-12)
    for s_cdp, s_cor in [(1.0, 0.5), (3.0, 10.0), (0.2, 0.0)]:
        exact = graph_step_rho(g, s_cdp, s_cor, 2.0, collusion=q)
        bound = closed_form_rho(n, a_q, s_cdp, s_cor, 2.0, collusion=q)
        np.testing.assert_allclose(exact, bound, rtol=1e-12)


@pytest.mark.parametrize(
    "g",
    [nx.cycle_graph(16), torus(4), random_connected(14, 0.4, 3)],
    ids=["ring", "torus", "random"],
)
@pytest.mark.parametrize("q", [0, 1])
def test_exact_below_closed_form(g, q):
    n = g.number_of_nodes()
    a_q = algebraic_connectivity(g, q)
    if q == 1:
        assert a_q >= algebraic_connectivity(g) - 1.0 - 1e-12  # Fiedler's vertex bound
    for s_cdp, s_cor in [(1.0, 0.0), (1.0, 1.0), (2.0, 30.0), (0.5, 1e4)]:
        exact = graph_step_rho(g, s_cdp, s_cor, 2.0, collusion=q)
        bound = closed_form_rho(n, a_q, s_cdp, s_cor, 2.0, collusion=q)
        assert np.all(exact <= bound * (1 + 1e-12))
        # and never below the sigma_cor -> infinity floor
        assert np.all(exact >= 2.0 / ((n - q) * s_cdp**2) * (1 - 1e-12))


def test_known_algebraic_connectivities():
    assert algebraic_connectivity(nx.cycle_graph(16)) == pytest.approx(0.15224, abs=1e-5)
    assert algebraic_connectivity(nx.cycle_graph(16), 1) == pytest.approx(
        2 * (1 - math.cos(math.pi / 15)), rel=1e-10
    )
    assert algebraic_connectivity(torus(4)) == pytest.approx(2.0, rel=1e-10)
    assert algebraic_connectivity(torus(4), 1) == pytest.approx(1.6571, abs=1e-4)
    assert algebraic_connectivity(nx.path_graph(5), 1) == 0.0  # cut vertex
    assert algebraic_connectivity(nx.star_graph(5)) == pytest.approx(1.0, rel=1e-10)


@pytest.mark.parametrize("q", [0, 1, 2])
def test_graph_spectral_and_sparse_agree(q):
    g = random_connected(11, 0.35, 11)
    spec = SpectralGraph(g, collusion=q)
    for s_cdp, s_cor in [(1.0, 0.0), (0.7, 2.0), (1.5, 1e6)]:
        dense = graph_step_rho(g, s_cdp, s_cor, 2.0, collusion=q)
        sparse = graph_step_rho(g, s_cdp, s_cor, 2.0, collusion=q, dense_max=0)
        fast = spec.step_rho(s_cdp, s_cor, 2.0)
        np.testing.assert_allclose(sparse, dense, rtol=1e-10)
        np.testing.assert_allclose(fast, dense, rtol=1e-9)
        assert spec.worst_step_rho(s_cdp, s_cor, 2.0) == pytest.approx(dense.max(), rel=1e-9)


def test_collusion_worst_case_by_hand():
    # path 0-1-2: curious node 1 isolates 0 and 2 (LDP loss Delta^2 / (2 sigma_cdp^2) = 0.5);
    # the middle node's worst case is a curious end, which leaves it in an honest pair (K_2).
    g = nx.path_graph(3)
    rho = graph_step_rho(g, 2.0, 5.0, 2.0, collusion=1)
    pair = closed_form_rho(2, 2.0, 2.0, 5.0, 2.0)
    np.testing.assert_allclose(rho, [0.5, pair, 0.5], rtol=1e-12)
    assert pair < 0.5
    # collusion n - 1 leaves a single honest node: LDP for everybody
    g = nx.complete_graph(5)
    np.testing.assert_allclose(graph_step_rho(g, 2.0, 5.0, 2.0, collusion=4), 0.5, rtol=1e-12)
    np.testing.assert_allclose(SpectralGraph(g, 4).step_rho(2.0, 5.0, 2.0), 0.5, rtol=1e-12)
    # disconnected graph, eavesdropper: each piece is its own complete graph
    g = nx.disjoint_union(nx.complete_graph(3), nx.complete_graph(4))
    rho = graph_step_rho(g, 1.0, 2.0, 2.0)
    np.testing.assert_allclose(rho[:3], closed_form_rho(3, 3, 1.0, 2.0, 2.0), rtol=1e-12)
    np.testing.assert_allclose(rho[3:], closed_form_rho(4, 4, 1.0, 2.0, 2.0), rtol=1e-12)
    np.testing.assert_allclose(SpectralGraph(g).step_rho(1.0, 2.0, 2.0), rho, rtol=1e-10)


def test_pairwise_rho_matches_single_coalitions():
    g = random_connected(9, 0.45, 5)
    spec = SpectralGraph(g, collusion=1)
    f = spec.pairwise_rho(1.2, 3.0, 2.0)
    assert f.shape == (9, 9)
    np.testing.assert_array_equal(np.diag(f), 0.0)
    for v in range(9):
        honest, m = round_matrix(9, fault_free(g), colluders=[v])
        ref = 2.0 * inverse_diagonal(1.2, 3.0, m)
        np.testing.assert_allclose(f[v, honest], ref, rtol=1e-9)
    np.testing.assert_allclose(f.max(axis=0), spec.step_rho(1.2, 3.0, 2.0), rtol=1e-12)
    np.testing.assert_allclose(
        f.max(axis=0), graph_step_rho(g, 1.2, 3.0, 2.0, collusion=1), rtol=1e-9
    )
    with pytest.raises(ValueError, match="collusion = 1"):
        SpectralGraph(g).pairwise_rho(1.2, 3.0, 2.0)


def test_too_many_coalitions():
    g = nx.cycle_graph(30)
    with pytest.raises(TooManyCoalitions, match=r"C\(30, 4\) = 27405") as info:
        graph_step_rho(g, 1.0, 1.0, 2.0, collusion=4)
    assert "closed_form_rho" in str(info.value)
    assert isinstance(info.value, ValueError)
    with pytest.raises(TooManyCoalitions):
        SpectralGraph(g, collusion=2, max_coalitions=100)
    with pytest.raises(TooManyCoalitions):
        algebraic_connectivity(g, 3, max_coalitions=1000)
    with pytest.raises(ValueError, match="no honest user"):
        graph_step_rho(nx.cycle_graph(4), 1.0, 1.0, 2.0, collusion=4)


def test_graph_labels_checked():
    g = nx.relabel_nodes(nx.cycle_graph(4), {0: 10})
    with pytest.raises(ValueError, match="labelled"):
        graph_step_rho(g, 1.0, 1.0, 2.0)


# ------------------------------------------------------------------------------------------
# Gamma_W


def test_gamma_w_values():
    ring = nx.cycle_graph(16)
    w = (np.eye(16) + nx.to_numpy_array(ring, nodelist=range(16))) / 3.0
    assert gamma_w(w, ring) == pytest.approx(2.0 / 9.0, rel=1e-12)
    k = nx.complete_graph(16)
    assert gamma_w(np.full((16, 16), 1.0 / 16), k) == pytest.approx(0.0, abs=1e-15)
    t = torus(4)
    w = (np.eye(16) + nx.to_numpy_array(t, nodelist=range(16))) / 5.0
    assert gamma_w(w, t) == pytest.approx(6.0 / 25.0, rel=1e-12)
    assert gamma_w(np.eye(16), ring) == pytest.approx(2.0)  # no gossip: pre-gossip energy


def test_gamma_w_is_the_correlated_energy_after_gossip():
    """Lemma 8: E||V W||_F^2 = |E| sigma_cor^2 Gamma_W, computed exactly (no sampling): column i of
    V is sum_j v_ij = B z, so E||V W||^2 = sigma_cor^2 ||B^T W||_F^2 (W symmetric)."""
    g = random_connected(10, 0.4, 1)
    deg = dict(g.degree())
    w = np.zeros((10, 10))
    for i, j in g.edges():
        w[i, j] = w[j, i] = 1.0 / (max(deg[i], deg[j]) + 1)
    w[np.diag_indices(10)] = 1.0 - w.sum(axis=1)
    b = np.zeros((10, g.number_of_edges()))
    for e, (i, j) in enumerate(g.edges()):
        b[min(i, j), e], b[max(i, j), e] = 1.0, -1.0
    energy = np.sum((b.T @ w) ** 2)
    assert energy == pytest.approx(g.number_of_edges() * gamma_w(w, g), rel=1e-12)


# ------------------------------------------------------------------------------------------
# conversions and the research note's Figure 2 curve


def test_conversions_and_rho_for_eps_round_trip():
    c = conversions(1.15, 1e-5)
    assert c["eps"] == pytest.approx(rdp.eps_from_rho(1.15, 1e-5)[0])
    assert c["alpha"] == pytest.approx(rdp.eps_from_rho(1.15, 1e-5)[1])
    assert c["eps_gdp"] <= c["eps"] <= c["eps_paper"]
    for target in [0.1, 1.0, 5.0, 40.0]:
        for delta in [1e-5, 1e-8]:
            rho = rho_for_eps(target, delta)
            eps = rdp.eps_from_rho(rho, delta)[0]
            assert eps <= target
            assert eps == pytest.approx(target, rel=1e-10)
    with pytest.raises(ValueError):
        rho_for_eps(0.0, 1e-5)


def test_research_note_ring_curve():
    """Fig. 2 of the note: ring n = 16, C = 1, sigma_cdp = 41.684, T = 1000, delta = 1e-5,
    Mironov's conversion of T * (worst per-round rho)."""
    spec = SpectralGraph(nx.cycle_graph(16))

    def eps_paper(s_cor: float) -> float:
        return conversions(1000 * spec.worst_step_rho(41.684, s_cor, 2.0), 1e-5)["eps_paper"]

    for s_cor, expected in [(0.0, 8.43), (82.0, 3.9), (203.0, 2.54), (1000.0, 1.93)]:
        assert eps_paper(s_cor) == pytest.approx(expected, rel=0.02)
    assert eps_paper(1e8) == pytest.approx(1.89, rel=0.02)
    curve = [eps_paper(s) for s in np.linspace(0, 1000, 41)]
    assert all(x > y for x, y in itertools.pairwise(curve))
    assert eps_paper(1e8) < curve[-1]
    # same number from the dense/sparse path
    assert 1000 * graph_step_rho(nx.cycle_graph(16), 41.684, 82.0, 2.0).max() == pytest.approx(
        1000 * spec.worst_step_rho(41.684, 82.0, 2.0), rel=1e-10
    )


# ------------------------------------------------------------------------------------------
# calibration


@pytest.mark.parametrize(
    ("g", "q"), [(nx.cycle_graph(16), 0), (torus(4), 1), (nx.complete_graph(16), 0)]
)
def test_calibrate_pairs(g, q):
    spec = SpectralGraph(g, collusion=q)
    n = g.number_of_nodes()
    cal = calibrate_pairs(
        lambda a, b: spec.worst_step_rho(a, b, 2.0),
        rounds=1000,
        target_eps=5.0,
        delta=1e-5,
        sensitivity=2.0,
        honest_n=n - q,
        grid=50,
    )
    assert cal["rho_step"] == pytest.approx(rho_for_eps(5.0, 1e-5) / 1000, rel=1e-15)
    assert cal["sigma_ldp"] == pytest.approx(2.0 / math.sqrt(2 * cal["rho_step"]))
    assert cal["sigma_cdp_floor"] == pytest.approx(cal["sigma_ldp"] / math.sqrt(n - q))
    pairs = cal["pairs"]
    assert len(pairs) == 50 and cal["skipped"] == []
    grid = np.linspace(cal["sigma_cdp_floor"], cal["sigma_ldp"], 51)[1:]
    np.testing.assert_allclose([p["sigma_cdp"] for p in pairs], grid, rtol=1e-15)
    for p in pairs:
        assert p["rho_step"] <= cal["rho_step"] * (1 + 1e-13)  # RHO_SLACK: rounding only
        assert p["eps"] <= 5.0 * (1 + 1e-12)
        if p["sigma_cor"] > 0:
            assert p["eps"] == pytest.approx(5.0, rel=1e-6)
            # minimal: 1e-9 less correlated noise misses the target
            assert (
                spec.worst_step_rho(p["sigma_cdp"], p["sigma_cor"] * (1 - 1e-9), 2.0)
                > cal["rho_step"]
            )
        assert rdp.eps_from_rho(1000 * p["rho_step"], 1e-5)[0] == pytest.approx(p["eps"])
    cors = [p["sigma_cor"] for p in pairs]
    assert all(x >= y for x, y in itertools.pairwise(cors))
    assert cors[0] > cors[len(cors) // 2] > 0
    assert cors[-1] <= 1e-6 * pairs[-1]["sigma_cdp"]
    assert choose_pair(cal, "low") is pairs[0]
    assert choose_pair(cal, "mid") is pairs[25]
    assert choose_pair(cal, "high") is pairs[-1]
    with pytest.raises(ValueError, match="'low', 'mid' or 'high'"):
        choose_pair(cal, "best")


def test_calibrate_skips_unreachable_points():
    """Bowtie (two triangles sharing node 2) against a curious user: Q = {2} leaves two honest
    pairs, whose loss tends to Delta^2 / (4 sigma_cdp^2) as sigma_cor grows, so only
    sigma_cdp > sigma_LDP / sqrt(2) is reachable, not the floor sigma_LDP / sqrt(n - 1)."""
    g = nx.Graph([(0, 1), (1, 2), (2, 0), (2, 3), (3, 4), (4, 2)])
    spec = SpectralGraph(g, collusion=1)
    with pytest.warns(RuntimeWarning, match="grid point skipped"):
        cal = calibrate_pairs(
            lambda a, b: spec.worst_step_rho(a, b, 2.0),
            rounds=100,
            target_eps=3.0,
            delta=1e-5,
            sensitivity=2.0,
            honest_n=4,
            grid=20,
        )
    edge = cal["sigma_ldp"] / math.sqrt(2.0)
    assert cal["skipped"] and all(s < edge for s in cal["skipped"])
    assert len(cal["skipped"]) + len(cal["pairs"]) == 20
    assert all(p["sigma_cdp"] > edge for p in cal["pairs"])
    for p in cal["pairs"]:
        assert p["eps"] <= 3.0 * (1 + 1e-12)
    assert cal["high"]["sigma_cor"] == 0.0 or cal["high"]["sigma_cor"] < 1e-6


def test_calibrate_ldp_only_when_a_node_can_be_isolated():
    """On a path a curious neighbour isolates an end node: only sigma_LDP itself is feasible."""
    g = nx.path_graph(6)
    spec = SpectralGraph(g, collusion=1)
    with pytest.warns(RuntimeWarning):
        cal = calibrate_pairs(
            lambda a, b: spec.worst_step_rho(a, b, 2.0),
            rounds=100,
            target_eps=3.0,
            delta=1e-5,
            sensitivity=2.0,
            honest_n=5,
            grid=10,
        )
    assert len(cal["pairs"]) == 1 and len(cal["skipped"]) == 9
    assert cal["low"]["sigma_cdp"] == pytest.approx(cal["sigma_ldp"], rel=1e-15)
    assert cal["low"]["sigma_cor"] == 0.0
    assert cal["low"]["eps"] == pytest.approx(3.0, rel=1e-10)
