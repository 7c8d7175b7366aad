"""Heavier suites (marked slow: `python3 -m pytest -m slow`, run by .ci/run)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from coordinator_free import config, seeds, sim
from coordinator_free.accounting import audit
from coordinator_free.cluster import local
from tests import gossipviews as gossip

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def test_hypercube_64_peers_networked_equals_simulator_and_audit_equals_plan(tmp_path):
    """The built-in `cfree run` default, as shipped: 64 peers on a 6-cube."""
    cfg = config.load(ROOT / "examples" / "muffliato-hypercube.toml")
    out = tmp_path / "run"
    local.prepare_run_dir(cfg, out)
    run = asyncio.run(local.launch_peers(cfg, out, show_progress=False, timeout_s=600))
    assert not run.failed, [(o.node, o.error) for o in run.failed]
    ref = sim.simulate(cfg, streams=seeds.streams_of_run(out, 64))
    n = ref.plan.n
    assert n == 64
    for v in range(n):
        est = np.asarray(json.loads((out / "results" / f"node-{v}.json").read_text())["estimate"])
        assert np.array_equal(est, ref.finals[v])
    rep = audit.audit_run(out)  # n = 64: the realised schedule in exact rational arithmetic
    assert rep["fault_free"] and rep["integrity"] == []
    for m in audit.METHODS:
        F = gossip.plan_factors(ref.plan, m)
        for o in rep["observers"]:
            v = o["observer"]
            for x in o["losses"]:
                if x["method"] == m:
                    assert x["factor"] == pytest.approx(F[v, x["source"]], rel=1e-9, abs=1e-12)
    # Amplification exists on this graph: some pairs are strictly below LDP.
    exact = [x["factor"] for o in rep["observers"] for x in o["losses"] if x["method"] == "exact"]
    assert min(exact) < 0.75 and max(exact) == pytest.approx(1.0)


def test_plan_for_the_papers_2048_node_hypercube():
    """n = 2048 (hypercube dim 11), both methods, all pairs: the exact factors by distance are
    the rational values 1, 1/5, 1/15, 1/30, 1/42, 1/42, 1/30, 1/15, 1/5, 1, 1 (the far side of
    the cube is fully exposed), and Eq. (6) depends on distance only."""
    cfg = config.load(None, ["graph.kind=hypercube", "graph.dim=11", "data.dim=1"])
    rep = audit.plan_report(cfg, source=None, method="exact")
    assert rep["n"] == 2048
    expected = [1, 1 / 5, 1 / 15, 1 / 30, 1 / 42, 1 / 42, 1 / 30, 1 / 15, 1 / 5, 1, 1]
    got = [r["factor_max"] for r in rep["by_distance"]]
    assert got == pytest.approx(expected, rel=1e-7)
    for r in rep["by_distance"]:
        assert r["factor_mean"] == pytest.approx(r["factor_max"], rel=1e-9)
    paper = audit.plan_report(cfg, source=0, method="paper")
    by_d: dict[int, set[float]] = {}
    for x in paper["losses"]:
        by_d.setdefault(x["distance"], set()).add(round(x["factor"], 9))
    assert all(len(s) == 1 for s in by_d.values())
    assert len(paper["losses"]) == 2047


@pytest.mark.parametrize(
    "example, extra",
    [
        ("ring-sum", []),  # 64 peers, 4 turns of the ring
        ("ring-histogram", []),  # 64 peers, 2 turns
        ("complete-sgd", ["protocol.tokens=2"]),  # 16 peers, two walks at once
        ("walk-sgd", []),  # 16 peers on a hypercube
    ],
)
def test_token_protocols_at_full_size_equal_the_simulator(tmp_path, example, extra):
    from coordinator_free.families import make_plan
    from coordinator_free.families.walk import accountant as audit_walk

    # A hand-off not acknowledged by its deadline is re-routed, which changes the walk; on a
    # loaded 2-core machine 64 processes can starve one past 10 s, so allow a wide margin here.
    cfg = config.load(ROOT / "examples" / f"{example}.toml", [*extra, "network.deadline_s=60"])
    plan = make_plan(cfg)
    out = tmp_path / "run"
    local.prepare_run_dir(cfg, out)
    run = asyncio.run(local.launch_peers(cfg, out, show_progress=False, timeout_s=900))
    assert not run.failed, [(o.node, o.error) for o in run.failed]
    ref = sim.simulate_walk(cfg, streams=seeds.streams_of_run(out, plan.n))
    res = local.collect_results(cfg, out)
    reroutes = [(n["node"], r) for n in res["nodes"] for r in n["reroutes"]]
    assert not reroutes, f"hand-offs re-routed (a peer starved past its deadline): {reroutes}"
    for t, trace in zip(res["tokens"], ref.traces, strict=True):
        assert t["end"]["how"] == "completed"
        assert np.array_equal(np.asarray(t["final"]), trace.final)
    integrity: list[dict] = []
    walks, logged, fault_free = audit_walk.replay_walks(out, plan, integrity)
    assert fault_free and integrity == [] and len(logged) == plan.n
    for w, trace in zip(walks, ref.traces, strict=True):
        assert w.holders.tolist() == trace.holders
    rep = audit.audit_run(out)
    assert rep["fault_free"] and rep["complete"]
    if plan.ring:  # the ring's walk is public: the audit equals the plan, pair by pair
        want = audit_walk.exact_losses(plan, audit_walk.sampled_walks(cfg, plan), range(plan.n))
        for o in rep["observers"]:
            for x in o["losses"]:
                if x["method"] == "exact":
                    assert x["eps"] == pytest.approx(want[o["observer"]][x["source"]]["eps"])


@pytest.mark.parametrize(
    "graph",
    [
        ["graph.kind=torus", "graph.rows=4", "graph.cols=4"],
        ["graph.kind=complete", "graph.nodes=16"],
    ],
)
def test_decor_16_peers_equal_the_simulator_and_audit_equals_plan(tmp_path, graph):
    """DECOR at the paper's size: 16 peers, 200 rounds, real seed exchange; every model equals
    the simulator's, and the audit of the logs equals the plan (eavesdropper and curious users)."""
    out = tmp_path / "decor16"
    ex = ROOT / "examples" / "decor-ring.toml"
    over = [*graph, "protocol.rounds=200", "privacy.collusion=1"]
    cfg = config.load(ex, over)
    local.prepare_run_dir(cfg, out)
    run = asyncio.run(local.launch_peers(cfg, out, show_progress=False, timeout_s=600))
    assert not run.failed, run.failed
    ref = sim.simulate_learning(cfg, streams=seeds.streams_of_run(out, 16))
    for v in range(16):
        assert np.array_equal(np.load(out / "results" / f"node-{v}.models.npy"), ref.models[:, v])
    rep = audit.audit_run(out)
    want = audit.plan_report(cfg, source=None, method="exact")
    assert rep["fault_free"] and rep["complete"]
    for m in ("exact", "paper"):
        assert rep["secldp"][m]["eps"] == pytest.approx(want["secldp"][m]["eps"], rel=1e-9)
    exact = [x["factor"] for o in rep["observers"] for x in o["losses"] if x["method"] == "exact"]
    assert max(exact) == pytest.approx(want["worst_pair"]["factor"], rel=1e-9)
