"""Token protocols: the step and hop math, the simulator, and real networked walks.

Networked runs start real peer processes on loopback (encrypted channels, real keys); a
fault-free run must equal the simulator bit for bit, its logs must hold the walk the simulator
made, and the audit must account for that walk.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from coordinator_free import config, seeds, sim
from coordinator_free.accounting import audit
from coordinator_free.cluster import local
from coordinator_free.families import make_plan
from coordinator_free.families.walk import accountant as audit_walk
from coordinator_free.families.walk import protocol as wk
from tests.netrun import cfree_run_json

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def cfg_of(name: str, *extra: str) -> config.Config:
    return config.load(EXAMPLES / f"{name}.toml", list(extra))


# ------------------------------------------------------------------------------ pure math


def test_ring_noise_schedule_hides_every_window():
    # Steps 0, n-1, 2(n-1), ... are noisy: ceil(Kn/(n-1)) noise terms, and every window of n
    # consecutive steps starting at a node's own step holds a noisy step of another node.
    for n, K in [(3, 1), (10, 10), (7, 5)]:
        cfg = cfg_of("ring-sum", f"graph.nodes={n}", f"protocol.cycles={K}")
        plan = make_plan(cfg)
        noisy = [s for s in range(plan.hops) if plan.noise_var(s) > 0]
        assert len(noisy) == math.ceil(K * n / (n - 1))
        want = [plan.noise_var(s) for s in range(plan.hops)]
        assert plan.noise_vars(plan.hops).tolist() == want
        spread = make_plan(config.load(EXAMPLES / "ring-sum.toml", [
            f"graph.nodes={n}", f"protocol.cycles={K}", "protocol.distributed_noise=true"]))  # fmt: skip
        assert spread.noise_vars(spread.hops).tolist() == [
            1.0 if s == 0 else 1.0 / (n - 1) for s in range(spread.hops)
        ]
        for s in range(plan.hops - n + 1):
            assert any(plan.noise_var(t) > 0 for t in range(s + 1, s + n)), (n, K, s)


def test_hops_follow_the_transition_rows():
    cfg = cfg_of("walk-sgd", "graph.kind=path", "graph.nodes=4", "protocol.cap=3")
    plan = make_plan(cfg)
    streams = seeds.PublicSeedStreams(0)
    for v in range(plan.n):
        draws = np.array([wk.next_hop(plan, v, 0, s, streams) for s in range(4000)])
        cand, prob = plan.transition_row(v)
        freq = np.array([(draws == c).mean() for c in cand])
        assert set(draws.tolist()) <= set(cand.tolist())
        se = np.sqrt(prob * (1 - prob) / draws.size)
        assert np.all(np.abs(freq - prob) <= 5 * se + 1e-12), (v, freq, prob)
    # A re-route draws by the same rule without the excluded nodes.
    for s in range(200):
        w = wk.next_hop(plan, 1, 0, s, streams, exclude={2}, attempt=1)
        assert w in (0, 1)
    ring = make_plan(cfg_of("ring-sum", "graph.nodes=5"))
    assert wk.next_hop(ring, 4, 0, 3, streams) == 0
    assert wk.next_hop(ring, 4, 0, 3, streams, exclude={0}, attempt=1) is None


def test_complete_graph_hops_are_uniform_including_self():
    plan = make_plan(cfg_of("complete-sum", "graph.nodes=5"))
    streams = seeds.PublicSeedStreams(1)
    draws = np.array([wk.next_hop(plan, 2, 0, s, streams) for s in range(5000)])
    freq = np.bincount(draws, minlength=5) / draws.size
    assert np.all(np.abs(freq - 0.2) <= 5 * math.sqrt(0.16 / draws.size))


def test_histogram_estimate_is_unbiased():
    # Over many seeds, the debiased count equals the true count of the contributions on average.
    errs = []
    for seed in range(200):
        cfg = cfg_of("ring-histogram", "graph.nodes=8", "protocol.cycles=2", f"run.seed={seed}")
        r = sim.simulate_walk(cfg)
        t = r.traces[0]
        errs.append(wk.estimate(r.plan, t.final) - t.truth)
    errs = np.array(errs)
    se = errs.std(axis=0) / math.sqrt(len(errs))
    assert np.all(np.abs(errs.mean(axis=0)) <= 4 * se + 1e-9), (errs.mean(axis=0), se)


def test_cap_turns_contributions_into_noise_only_steps():
    cfg = cfg_of("complete-sum", "graph.nodes=4", "protocol.hops=60", "protocol.cap=3")
    t = sim.simulate_walk(cfg).traces[0]
    holders, data = np.array(t.holders), np.array(t.data)
    for v in range(4):
        mine = data[holders == v]
        assert mine.sum() == min(3, mine.size)
        assert not np.any(mine[3:])


def test_simulated_sum_is_the_sum_of_contributions_plus_noise():
    cfg = cfg_of("complete-sum", "graph.nodes=6", "protocol.hops=40", "privacy.sigma=1e-9")
    t = sim.simulate_walk(cfg).traces[0]
    assert np.allclose(t.final, t.truth, atol=1e-6)
    assert t.truth.sum() > 0


def test_config_errors_name_the_key():
    with pytest.raises(config.ConfigError, match="graph.kind"):
        cfg_of("ring-sum", "graph.kind=complete")
    with pytest.raises(config.ConfigError, match="protocol.cap"):
        cfg_of("walk-sgd", "protocol.cap=0")
    with pytest.raises(config.ConfigError, match="protocol.hops"):
        cfg_of("ring-sum", "protocol.hops=10")
    with pytest.raises(config.ConfigError, match="data.kind"):
        cfg_of("ring-histogram", "data.kind=uniform")
    with pytest.raises(config.ConfigError, match="distributed_noise"):
        cfg_of("complete-sum", "protocol.distributed_noise=true")
    with pytest.raises(config.ConfigError, match="protocol.tokens"):
        cfg_of("complete-sum", "protocol.tokens=0")


def test_calibration_round_trip():
    cfg = cfg_of("complete-sum", "graph.nodes=8", "protocol.hops=80")
    for method, budget in (("exact", "mean"), ("paper", "worst")):
        rep = audit.calibrate(cfg, 3.0, method=method, budget=budget)
        assert rep["eps"] == pytest.approx(3.0, rel=1e-6)
        at = config.load(EXAMPLES / "complete-sum.toml",
                         ["graph.nodes=8", "protocol.hops=80", f"privacy.sigma={rep['sigma']!r}"])  # fmt: skip
        plan = audit.plan_report(at, source=None, method=method)
        key = "mean_over_pairs" if budget == "mean" else "worst_pair"
        # paper: the usable bound, the theorem capped at local DP, is what was calibrated
        got = plan[key]["eps_usable"] if method == "paper" else plan[key]["eps"]
        assert got == pytest.approx(3.0, rel=1e-6)
    with pytest.raises(audit.AuditError, match="eps0"):
        audit.calibrate(cfg_of("ring-histogram"), 3.0, method="exact", budget="worst")


# ------------------------------------------------------------------------------ networked runs

N = 5
NET = ["network.deadline_s=20", "network.connect_timeout_s=120"]
CASES = {
    "ring-sum": ["graph.nodes=5", "protocol.cycles=3"],
    "ring-histogram": ["graph.nodes=5", "protocol.cycles=3"],
    "complete-sum": ["graph.nodes=5", "protocol.hops=40", "protocol.tokens=2", "protocol.cap=6"],
    "complete-histogram": ["graph.nodes=5", "protocol.hops=40"],
    "complete-sgd": ["graph.nodes=5", "protocol.hops=30", "protocol.cap=8"],
    "walk-sgd": ["graph.kind=ring", "graph.nodes=5", "protocol.hops=30", "protocol.cap=8",
                 "protocol.tokens=2"],
}  # fmt: skip


#: Real-process runs in the default suite: one sum on each graph. The others run with -m slow;
#: the in-memory network (tests/test_memnet.py) covers every token protocol in the quick suite.
QUICK = ("ring-sum", "complete-sum")


@pytest.fixture(
    scope="module",
    params=[n if n in QUICK else pytest.param(n, marks=pytest.mark.slow) for n in sorted(CASES)],
)
def walk_run(request, tmp_path_factory):
    name = request.param
    out = tmp_path_factory.mktemp(name) / "run"
    summary = cfree_run_json(EXAMPLES / f"{name}.toml", [*CASES[name], *NET], out)
    return name, out, summary


def _logged_walks(out: Path, plan) -> list[audit_walk.RealisedWalk]:
    integrity: list[dict] = []
    walks, logged, fault_free = audit_walk.replay_walks(out, plan, integrity)
    assert integrity == [] and fault_free and logged == set(range(plan.n))
    return walks


def test_peers_equal_simulator_and_logs_hold_the_walk(walk_run):
    name, out, summary = walk_run
    assert summary["failed"] == []
    assert summary["simulator_max_abs_diff"] == 0
    cfg = config.load(out / "config.toml")
    plan = make_plan(cfg)
    ref = sim.simulate_walk(cfg, streams=seeds.streams_of_run(out, plan.n))
    tokens = summary["results"]["tokens"]
    assert len(tokens) == plan.tokens
    for t, trace in zip(tokens, ref.traces, strict=True):
        assert t["end"] == {"how": "completed", "at": trace.holders[-1], "step": plan.hops}
        assert np.array_equal(np.asarray(t["final"]), trace.final)
    # The union of the view logs is exactly the simulator's walk: every step's holder and
    # whether it added data.
    for w, trace in zip(_logged_walks(out, plan), ref.traces, strict=True):
        assert w.holders.tolist() == trace.holders
        assert w.data.tolist() == trace.data
    # The public seed would have walked elsewhere: the hops came from the nodes' secret streams.
    if not plan.ring:
        pub = sim.simulate_walk(cfg).traces[0].holders
        assert pub != ref.traces[0].holders


def test_audit_accounts_for_the_walk_in_the_logs(walk_run):
    name, out, _ = walk_run
    cfg = config.load(out / "config.toml")
    plan = make_plan(cfg)
    rep = audit.audit_run(out)
    assert rep["fault_free"] is True and rep["complete"] is True
    assert rep["protocol"] == name
    ref = sim.simulate_walk(cfg, streams=seeds.streams_of_run(out, plan.n))
    walks = [audit_walk.walk_of_trace(t, plan.n) for t in ref.traces]
    want = audit_walk.exact_losses(plan, walks, range(plan.n))
    E_paper, _ = audit_walk.paper_eps(plan)
    checked = 0
    for o in rep["observers"]:
        v = o["observer"]
        for x in o["losses"]:
            if x["method"] == "exact":
                assert x["eps"] == pytest.approx(want[v][x["source"]]["eps"], rel=1e-12)
            else:
                assert x["eps"] == pytest.approx(E_paper[v, x["source"]], rel=1e-12)
            checked += 1
    assert checked == plan.n * (plan.n - 1) * 2
    if plan.ring:  # the ring's walk is public: the audit equals the plan
        rep_plan = audit.plan_report(cfg, source=0, method="exact")
        got = {
            o["observer"]: x["eps"]
            for o in rep["observers"]
            for x in o["losses"]
            if x["method"] == "exact" and x["source"] == 0
        }
        for x in rep_plan["losses"]:
            assert got[x["observer"]] == pytest.approx(x["eps"], rel=1e-12)


def test_every_hand_off_is_logged_by_both_ends(walk_run):
    _, out, _ = walk_run
    plan = make_plan(config.load(out / "config.toml"))
    sends, accepts = set(), set()
    for v in range(plan.n):
        from coordinator_free.viewlog import read_viewlog

        for r in read_viewlog(out / "logs" / f"node-{v}.vlog").records:
            if r["k"] == "token-send":
                sends.add((r["token"], r["step"], v, r["peer"]))
            elif r["k"] == "token-accept":
                accepts.add((r["token"], r["step"], r["peer"], v))
    assert sends == accepts and sends


@pytest.mark.slow  # a real-process run of several seconds; the in-memory suites cover the rule
def test_killed_holder_ends_the_run_with_the_loss_or_a_reroute_recorded(tmp_path):
    cfg = cfg_of("complete-sum", "graph.nodes=5", "protocol.hops=400", "network.deadline_s=2",
                 "network.connect_timeout_s=120")  # fmt: skip
    out = tmp_path / "kill"
    local.prepare_run_dir(cfg, out)
    victim = 3
    killed = []

    def on_event(node, ev, pid):
        if node == victim and ev.get("event") == "step" and not killed:
            killed.append(ev["step"])
            os.kill(pid, signal.SIGKILL)

    run = asyncio.run(
        local.launch_peers(cfg, out, show_progress=False, timeout_s=240, on_event=on_event)
    )
    assert killed and [o.node for o in run.failed] == [victim]
    res = local.collect_results(cfg, out)
    end = res["tokens"][0]["end"]
    survivors = [r for r in res["nodes"] if r["finished"]]
    assert len(survivors) == N - 1
    rep = audit.audit_run(out)
    assert rep["fault_free"] is False
    assert any(i["node"] == victim and i["kind"] == "unfinished" for i in rep["integrity"])
    if end["how"] == "lost":
        # The walk died with the victim; whoever handed it over said so.
        assert end["at"] == victim
    else:
        # The walk went on: every later attempt to hand it to the victim was re-routed.
        assert end == {"how": "completed", "at": end["at"], "step": 400}
        rer = [x for r in survivors for x in r["reroutes"]]
        assert rer and all(x["peer"] == victim for x in rer)
    # Survivors saw the victim's channel go down.
    downs = 0
    from coordinator_free.viewlog import read_viewlog

    for v in range(N):
        if v != victim:
            recs = read_viewlog(out / "logs" / f"node-{v}.vlog").records
            downs += any(r["k"] == "peer-down" and r["peer"] == victim for r in recs)
    assert downs >= 1
    assert json.loads(json.dumps(rep))  # JSON-serialisable


def test_a_sum_token_prints_its_truth_beside_the_error():
    """|estimate - truth| alone (120 on complete-sum) reads as a failure; the truth says how
    large the sum is."""
    from coordinator_free.families.walk.render import token_quality

    line = token_quality({"estimate": [1530.0], "truth": [1410.0], "error": 120.0})
    assert "estimate [1530.]" in line and "truth [1410.]" in line and "= 120" in line
