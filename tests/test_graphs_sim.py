import networkx as nx
import numpy as np
import pytest
from freshpy import run_with_free_blas

from coordinator_free import config, graphs, seeds, sim
from coordinator_free.families.averaging import protocol as mf


def test_metropolis_weights_match_the_papers_experiments():
    w = graphs.gossip_matrix(graphs.build_graph("path", nodes=4), "metropolis")
    expected = np.array(
        [
            [2 / 3, 1 / 3, 0, 0],
            [1 / 3, 1 / 3, 1 / 3, 0],
            [0, 1 / 3, 1 / 3, 1 / 3],
            [0, 0, 1 / 3, 2 / 3],
        ]
    )
    np.testing.assert_allclose(w, expected, atol=1e-15)
    h = graphs.gossip_matrix(graphs.build_graph("hypercube", dim=5), "metropolis")
    assert h[0, 1] == pytest.approx(1 / 6) and h[0, 0] == pytest.approx(1 / 6)


@pytest.mark.parametrize(
    "kind, kw",
    [
        ("ring", {"nodes": 7}),
        ("star", {"nodes": 6}),
        ("grid", {"rows": 3, "cols": 4}),
        ("complete", {"nodes": 5}),
        ("erdos_renyi", {"nodes": 20, "p": 0.3, "seed": 3}),
        ("geometric", {"nodes": 30, "radius": 0.4, "seed": 1}),
    ],
)
@pytest.mark.parametrize("scheme", graphs.WEIGHT_SCHEMES)
def test_gossip_matrices_are_symmetric_doubly_stochastic_on_the_graph(kind, kw, scheme):
    g = graphs.build_graph(kind, **kw)
    assert sorted(g.nodes()) == list(range(g.number_of_nodes()))
    w = graphs.gossip_matrix(g, scheme)
    np.testing.assert_allclose(w, w.T, atol=0)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
    assert (w >= 0).all()
    adj = nx.to_numpy_array(g, nodelist=range(g.number_of_nodes())) > 0
    off = ~np.eye(len(w), dtype=bool)
    assert ((w > 0) & off <= adj).all()


def test_random_graphs_are_deterministic_in_their_seed():
    a = graphs.build_graph("erdos_renyi", nodes=25, p=0.2, seed=5)
    b = graphs.build_graph("erdos_renyi", nodes=25, p=0.2, seed=5)
    c = graphs.build_graph("erdos_renyi", nodes=25, p=0.2, seed=6)
    assert set(a.edges()) == set(b.edges()) != set(c.edges())


def _coin_by_coin(n: int, p: float, seed: int) -> list[tuple[int, int]]:
    """The G(n, p) graph as defined: one coin of ``random.Random(seed)`` per pair, in order."""
    import itertools
    import random

    coins = random.Random(seed)
    return [e for e in itertools.combinations(range(n), 2) if coins.random() < p]


@pytest.mark.parametrize("n,p", [(2, 0.5), (3, 0.9), (60, 0.1), (300, 0.02), (900, 0.004)])
def test_erdos_renyi_graphs_are_drawn_coin_for_coin(n, p, monkeypatch):
    """``graphs.gnp_graph`` draws the coins in numpy; the graph (its edges in order, each
    node's neighbours in order) is the one of a coin per pair drawn by Python's generator, and
    networkx's ``gnp_random_graph`` of the same seed; chunked draws continue the same stream."""
    monkeypatch.setattr(graphs, "_GNP_CHUNK", 1000)  # several chunks, one cut mid-row
    rng = np.random.default_rng(n)
    seeds_ = [int(rng.integers(2**32, 2**63)) for _ in range(4)] + [2**32, 2**63 - 1, 7]
    for seed in seeds_:  # 7: one word, which networkx draws itself
        g = graphs.gnp_graph(n, p, seed)
        ref = nx.gnp_random_graph(n, p, seed=seed)
        assert list(g.edges()) == _coin_by_coin(n, p, seed) == list(ref.edges()), seed
        assert list(g.nodes()) == list(range(n))
        assert all(list(g[v]) == list(ref[v]) for v in range(n))
    # and so is every Erdős–Rényi graph of a configuration
    g = graphs.build_graph("erdos_renyi", nodes=120, p=0.06, seed=3)
    monkeypatch.setattr(graphs, "gnp_graph", lambda n, p, s: nx.gnp_random_graph(n, p, seed=s))
    ref = graphs.build_graph("erdos_renyi", nodes=120, p=0.06, seed=3)
    assert list(g.edges()) == list(ref.edges())


def test_disconnected_random_graph_is_a_clear_error():
    with pytest.raises(graphs.GraphError, match="not connected in 5 draws; increase p"):
        graphs.build_graph("erdos_renyi", nodes=50, p=0.001, seed=0, max_tries=5)


def test_chebyshev_gamma_for_the_hypercube_of_the_paper():
    # Hypercube dim 11 with Metropolis weights has lambda_W = 1/6, which gives gamma = 1.42893
    assert graphs.chebyshev_gamma(1 / 6) == pytest.approx(1.42893, abs=1e-5)
    assert graphs.chebyshev_gamma(1.0) < 2 and graphs.chebyshev_gamma(0.0) == 2.0


def test_simulator_equals_the_matrix_recursion():
    for accelerated in (False, True):
        cfg = config.load(
            None, [f"protocol.accelerated={str(accelerated).lower()}", "protocol.steps=9"]
        )
        r = sim.simulate(cfg)
        plan = r.plan
        pub = seeds.PublicSeedStreams(cfg.run.seed)
        y = np.stack(
            [
                mf.initial_value(mf.private_value(cfg, v, pub), mf.local_noise(cfg, v, pub))
                for v in range(plan.n)
            ]
        )
        prev, cur = None, y
        for t in range(plan.steps):
            g = plan.gamma_at(t)
            nxt = g * (plan.W @ cur) + ((1 - g) * prev if prev is not None else 0)
            prev, cur = cur, nxt
        np.testing.assert_allclose(r.finals, cur, rtol=1e-12, atol=1e-12)
        # Doubly stochastic W preserves the sum of the noisy values.
        np.testing.assert_allclose(r.finals.sum(axis=0), y.sum(axis=0), rtol=1e-12)


def test_simulator_is_bitwise_reproducible_and_seed_sensitive():
    a = sim.simulate(config.load(None)).finals
    b = sim.simulate(config.load(None)).finals
    c = sim.simulate(config.load(None, ["run.seed=8"])).finals
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_missed_neighbour_falls_back_to_own_value():
    row = {0: 0.5, 1: 0.25, 2: 0.25}
    own = np.array([1.0])
    terms = mf.step_terms(row, 0, own, {1: np.array([3.0])})
    out = mf.gossip_update(terms, 1.0, None)
    assert out[0] == pytest.approx(0.5 * 1 + 0.25 * 3 + 0.25 * 1)
    assert graphs.realised_row(row, 0, {1}) == {0: 0.75, 1: 0.25, 2: 0.0}


@pytest.mark.parametrize("dim", [1, 8, 4095, 4096, 16384 * 3 + 5])
@pytest.mark.parametrize("gamma", [1.0, 1.7])
def test_gossip_update_is_the_plain_expression_bit_for_bit(dim, gamma):
    """Large vectors are updated in place a block at a time, small ones by the expression
    itself: either way the same operations in the same order, so every driver agrees bit for
    bit whatever the vector's size."""
    rng = np.random.default_rng(dim)
    vals = [rng.normal(size=dim) * 10.0 ** rng.integers(-5, 5) for _ in range(4)]
    terms = [(0.2, vals[0]), (0.3, vals[1]), (0.5, vals[2])]
    prev = vals[3] if gamma != 1.0 else None
    acc = terms[0][0] * terms[0][1]
    for w, v in terms[1:]:
        acc = acc + w * v
    want = acc if gamma == 1.0 else gamma * acc + (1.0 - gamma) * prev
    got = mf.gossip_update(terms, gamma, prev)
    assert got.dtype == np.float64 and got.shape == (dim,)
    assert np.array_equal(got.view(np.uint64), want.view(np.uint64))


def test_the_spectral_gap_runs_on_one_blas_thread_where_blas_may_use_every_core():
    """Peers, simulator and planner must get the same last bits of the spectral gap, which
    LAPACK gives differently on different thread counts: its eigenvalues are computed on one
    thread, even in a process whose BLAS may use every core."""
    code = """if True:
        import numpy as np
        from threadpoolctl import threadpool_info
        from coordinator_free import graphs

        seen = []
        eigvalsh = np.linalg.eigvalsh

        def spy(a):
            seen.append(max(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"))
            return eigvalsh(a)

        np.linalg.eigvalsh = spy
        w = np.full((6, 6), 1.0 / 12) + np.eye(6) / 2
        graphs.spectral_gap(w)
        print(seen)
    """
    assert run_with_free_blas(code) == "[1]"
