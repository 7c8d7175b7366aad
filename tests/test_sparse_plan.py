"""Past graphs.DENSE_MAX_N nodes a Muffliato plan keeps W sparse: the same numbers, the
simulator and the planner's sparse-capable paths give what the dense matrix gives."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from memrun import write_run_dir

from coordinator_free import config, graphs
from coordinator_free.families import family_of
from coordinator_free.inmemory import run_config
from coordinator_free.privacy.muffliato import plan_factors


@pytest.mark.parametrize(
    "kind, kw",
    [("hypercube", {"dim": 6}), ("ring", {"nodes": 30}),
     ("erdos_renyi", {"nodes": 60, "p": 0.1, "seed": 2})],
)  # fmt: skip
@pytest.mark.parametrize("weights", graphs.WEIGHT_SCHEMES)
def test_the_sparse_gossip_matrix_holds_the_dense_numbers(kind, kw, weights):
    g = graphs.build_graph(kind, **kw)
    dense = graphs.gossip_matrix(g, weights)
    sparse = graphs.gossip_matrix(g, weights, sparse=True)
    assert np.array_equal(sparse.toarray(), dense)
    assert graphs.spectral_gap(sparse) == pytest.approx(graphs.spectral_gap(dense), abs=1e-12)


def test_a_large_plan_is_sparse_and_simulates_like_the_dense_one(monkeypatch):
    monkeypatch.setattr(graphs, "DENSE_MAX_N", 16)
    cfg = config.load(None, ["graph.kind=hypercube", "graph.dim=5", "data.dim=2"])
    fam = family_of(cfg.protocol.name)
    plan = fam.make_plan(cfg)
    assert not isinstance(plan.W, np.ndarray) and plan.W.nnz == 32 * 6
    dense = dataclasses.replace(plan, W=plan.W.toarray())
    assert plan.row(3) == dense.row(3) and plan.neighbours(3) == dense.neighbours(3)
    a, b = fam.simulate(cfg, plan), fam.simulate(cfg, dense)
    assert np.array_equal(a.finals, b.finals)


def test_the_planner_takes_a_sparse_matrix_where_it_needs_no_dense_one():
    g = graphs.build_graph("hypercube", dim=7)
    dense = graphs.gossip_matrix(g)
    sparse = graphs.gossip_matrix(g, sparse=True)
    gamma = graphs.chebyshev_gamma(graphs.spectral_gap(dense))
    for method in ("paper", "exact"):
        # all observers of one source: the translation-symmetric path
        want = plan_factors(dense, 12, True, method=method, sources=[5], gamma=gamma)
        got = plan_factors(sparse, 12, True, method=method, sources=[5], gamma=gamma)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
        # few observers, no symmetry
        want = plan_factors(dense, 12, True, method=method, observers=[0, 9], gamma=gamma,
                            symmetry=False)  # fmt: skip
        got = plan_factors(sparse, 12, True, method=method, observers=[0, 9], gamma=gamma,
                           symmetry=False)  # fmt: skip
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="needs dense n x n"):
        plan_factors(sparse, 12, True, method="paper", gamma=gamma, symmetry=False)


def test_a_run_planned_sparse_audits_as_one_planned_dense(monkeypatch, tmp_path):
    cfg = config.load(None, ["graph.kind=hypercube", "graph.dim=5", "protocol.steps=4"])
    fam = family_of(cfg.protocol.name)
    run = write_run_dir(cfg, run_config(cfg, seed=1), tmp_path / "r")
    dense = fam.audit(run, cfg, fam.make_plan(cfg), None)
    monkeypatch.setattr(graphs, "DENSE_MAX_N", 16)
    plan = fam.make_plan(cfg)
    assert not isinstance(plan.W, np.ndarray)
    sparse = fam.audit(run, cfg, plan, None)
    assert sparse["fault_free"] is dense["fault_free"] is True
    for a, b in zip(sparse["observers"], dense["observers"], strict=True):
        for x, y in zip(a["losses"], b["losses"], strict=True):
            assert (x["source"], x["method"]) == (y["source"], y["method"])
            assert x["eps"] == pytest.approx(y["eps"], rel=1e-9)
