"""randomized-gossip (Algorithm 2): Poisson clocks, pairwise exchanges, and their accountants.

Pure parts first (the clock schedule, the simulator, Corollary 2 and the exact accountant
against brute force), then real peer processes on loopback: a fault-free `cfree run` equals the
simulator bit for bit and its audit equals the plan; a run with a peer killed mid-way is
reproduced from the realised exchange sequence in the logs.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from netrun import assert_audit_equals_plan, cfree_run_json

from coordinator_free import config, graphs, seeds, sim
from coordinator_free.accounting import audit
from coordinator_free.cluster import local
from coordinator_free.families import make_plan
from coordinator_free.families.randomized import protocol as rg
from coordinator_free.privacy import muffliato as acct
from coordinator_free.privacy import pairwise as pw
from coordinator_free.viewlog import read_viewlog
from tests import gossipviews as gossip

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "randomized-gossip-ring.toml"


def rg_config(**sections) -> config.Config:
    data = {
        "run": {"name": "rg", "seed": 5},
        "graph": {"kind": "ring", "nodes": 6},
        "protocol": {"name": "randomized-gossip", "steps": 40},
        "data": {"kind": "uniform", "dim": 2},
    }
    for sec, values in sections.items():
        data.setdefault(sec, {}).update(values)
    return config.from_dict(data)


# ------------------------------------------------------------------------------- the schedule


def test_schedule_is_public_deterministic_and_on_graph_edges():
    cfg = rg_config()
    a, b = make_plan(cfg), make_plan(cfg)
    assert a.edges == b.edges and len(a.edges) == a.steps == 40
    other = make_plan(rg_config(run={"seed": 6}))
    assert other.edges != a.edges  # the run seed drives the clocks
    times = [e.time for e in a.edges]
    assert times == sorted(times) and times[0] > 0
    for e in a.edges:
        assert e.a < e.b and a.graph.has_edge(e.a, e.b)
        assert e.initiator in (e.a, e.b) and a.edges[e.t] is e
    assert a.public_params()["schedule"] == rg.schedule_digest(a.edges)
    assert a.public_params()["schedule"] != other.public_params()["schedule"]
    assert a.accelerated is False and a.gamma_at(7) == 1.0


def test_clock_rates_and_edge_frequencies_follow_the_gossip_matrix():
    """Edge {v, w} rings at rate 2 W_vw: over many exchanges its frequency is 2 W_vw / Lambda,
    node v's clock rings at rate 1 - W_vv (a star makes the rates very unequal)."""
    g = graphs.build_graph("star", nodes=6)
    W = graphs.gossip_matrix(g, "metropolis")
    rates = rg.clock_rates(W)
    assert rates == pytest.approx(1.0 - np.diag(W))
    T = 30_000
    edges = rg.poisson_schedule(W, T, seed=11)
    lam = rates.sum()
    counts = Counter((e.a, e.b) for e in edges)
    for (a, b), c in counts.items():
        p = 2 * W[a, b] / lam
        assert c / T == pytest.approx(p, abs=4 * np.sqrt(p * (1 - p) / T)), (a, b)
    assert set(counts) == {(0, k) for k in range(1, 6)}
    # Who initiated: the hub's clock rings at rate 1 - W_00, each leaf's at rate 1 - W_kk.
    horizon = edges[-1].time
    init = Counter(e.initiator for e in edges)
    for v in range(6):
        expect = rates[v] * horizon
        assert init[v] == pytest.approx(expect, abs=5 * np.sqrt(expect)), v
    # Two exchanges on one edge in a row with opposite initiators: both ends woke together.
    assert any(
        (x.a, x.b) == (y.a, y.b) and x.initiator != y.initiator
        for x, y in zip(edges, edges[1:], strict=False)
    )


def test_auto_steps_scale_the_synchronous_stop_by_the_clock_rate():
    cfg = rg_config(protocol={"steps": "auto"}, graph={"nodes": 8})
    plan = make_plan(cfg)
    sync = graphs.auto_steps(plan.spectral_gap, 8, 1.0, 0.25, 2, accelerated=False)
    assert plan.rate == pytest.approx(8 * 2 / 3)  # Metropolis ring: W_vv = 1/3
    assert plan.steps == int(np.ceil(sync * plan.rate))


def test_simulator_averages_pairs_and_converges_to_the_noisy_mean():
    cfg = rg_config(protocol={"steps": 600}, privacy={"sigma": 0.5})
    r = sim.simulate(cfg)
    streams = seeds.PublicSeedStreams(cfg.run.seed)
    y = np.stack(
        [r.inputs[v] + np.asarray(sim.mf.local_noise(cfg, v, streams)) for v in range(r.plan.n)]
    )
    # Pairwise averaging keeps the sum: every node ends at the mean of the noisy inputs.
    assert r.finals.sum(axis=0) == pytest.approx(y.sum(axis=0), rel=1e-12, abs=1e-12)
    assert np.max(np.abs(r.finals - y.mean(axis=0))) < 1e-3
    assert len(r.history_mse) == 601
    # Replaying "nobody ever averaged" leaves the noisy inputs; one node refusing everything
    # keeps its own value.
    r0 = sim.simulate(cfg, used=lambda t, v: False)
    assert np.array_equal(r0.finals, y)
    r3 = sim.simulate(cfg, used=lambda t, v: v != 3)
    assert np.array_equal(r3.finals[3], y[3])


# -------------------------------------------------------------------------------- accountants


def schedule_steps(plan: rg.RandomizedPlan) -> list[tuple[np.ndarray, float]]:
    """The fault-free exchange sequence as general accountant steps ``(W_t, 1.0)``,
    ``W_t = I - (e_a - e_b)(e_a - e_b)^T / 2`` (what privacy/pairwise.py computes without them)."""
    out = []
    for e in plan.edges:
        m = np.eye(plan.n)
        m[e.a, e.a] = m[e.b, e.b] = m[e.a, e.b] = m[e.b, e.a] = 0.5
        out.append((m, 1.0))
    return out


def _brute_force(steps, observer, received, n):
    """The exact factor from its definition with float linear algebra on a tiny schedule: the
    observer's messages are rows C_t[w] of the products of the W_t; drop its own coordinate;
    factor_u = c_u^T (C' C'^T)^+ c_u."""
    c = np.eye(n)
    rows = {}
    for t, (m, _) in enumerate(steps):
        for tt, w in received:
            if tt == t:
                rows[(t, w)] = c[w].copy()
        c = m @ c
    mat = np.array([np.delete(rows[k], observer) for k in sorted(rows)])
    out = np.ones(n)
    if mat.size:
        proj = mat.T @ np.linalg.pinv(mat @ mat.T) @ mat
        out[[u for u in range(n) if u != observer]] = np.diag(proj)
    else:
        out[:] = 0.0
        out[observer] = 1.0
    return out


def test_path_of_three_by_hand():
    """Exchanges (0,1) then (1,2): node 2 receives (y0 + y1)/2 at t = 1. It learns the sum
    y0 + y1, so each of 0 and 1 loses half the local-DP loss (exact and Corollary 2 agree)."""
    cfg = rg_config(graph={"kind": "path", "nodes": 3}, protocol={"steps": 2})
    plan = make_plan(cfg)
    edges = (rg.Exchange(0, 0, 1, 0, 0.1), rg.Exchange(1, 1, 2, 2, 0.2))
    plan = rg.RandomizedPlan(**{**plan.__dict__, "edges": edges})
    steps = schedule_steps(plan)
    rec = rg.fault_free_received(plan, 2)
    assert rec == [(1, 1)]
    assert acct.exact_factors(steps, 2, rec) == pytest.approx([0.5, 0.5, 1.0])
    assert acct.paper_factors(steps, 2, rec) == pytest.approx([0.5, 0.5, 0.0])
    # Node 0 saw y1 raw at t = 0: full local-DP loss of node 1, nothing of node 2.
    assert acct.exact_factors(steps, 0, rg.fault_free_received(plan, 0)) == pytest.approx(
        [1.0, 1.0, 0.0]
    )


@pytest.mark.parametrize("kind,seed", [("ring", 1), ("complete", 2), ("star", 3)])
def test_exact_and_corollary_2_against_brute_force(kind, seed):
    cfg = rg_config(graph={"kind": kind, "nodes": 5}, protocol={"steps": 9}, run={"seed": seed})
    plan = make_plan(cfg)
    steps = schedule_steps(plan)
    F = {m: gossip.plan_factors(plan, m) for m in audit.METHODS}
    for v in range(plan.n):
        rec = rg.fault_free_received(plan, v)
        assert F["exact"][v] == pytest.approx(_brute_force(steps, v, rec, plan.n), abs=1e-9)
        # Corollary 2 by its formula: sum over v's messages of C_t[w,u]^2 / ||C_t[w]||^2.
        want = np.zeros(plan.n)
        c = np.eye(plan.n)
        for e in plan.edges:
            if v in (e.a, e.b):
                row = c[e.partner(v)]
                want += row**2 / (row @ row)
            c = steps[e.t][0] @ c
        assert F["paper"][v] == pytest.approx(want, rel=1e-12)
        # Corollary 2's mean identity: sum_u f(u, v) = T_v (each message's shares sum to 1).
        assert F["paper"][v].sum() == pytest.approx(len(rec))
        assert np.all(F["exact"][v] <= 1 + 1e-12)


def test_plan_reports_clock_and_corollary_2_mean(capsys):
    from coordinator_free import cli

    path = EXAMPLE
    code = cli.main(["plan", str(path), "--json"])
    out = capsys.readouterr().out
    assert code == 0
    rep = json.loads(out)
    plan = make_plan(config.load(path))
    tv = plan.exchange_counts()
    assert rep["protocol"] == "randomized-gossip" and rep["accelerated"] is False
    assert rep["exchanges_per_node"] == {
        "min": int(tv.min()),
        "mean": float(tv.mean()),
        "max": int(tv.max()),
    }
    assert tv.sum() == 2 * plan.steps
    assert rep["cor2_mean_factor_max"] == pytest.approx(tv.max() / plan.n)
    assert "Corollary 2" in rep["accounting"]


def test_config_errors_name_the_key():
    with pytest.raises(config.ConfigError, match="protocol.tick"):
        rg_config(protocol={"tick": -1.0})
    with pytest.raises(config.ConfigError, match="data.kind"):
        rg_config(data={"kind": "breast_cancer"})


# --------------------------------------------------------------------------- real peer runs

N = 6
COMMON = [
    f"graph.nodes={N}",
    "protocol.steps=48",
    "protocol.tick=0.002",
    "network.deadline_s=20",
    "network.connect_timeout_s=120",
]


@pytest.fixture(scope="module")
def fault_free_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("rg") / "run"
    return out, cfree_run_json(EXAMPLE, COMMON, out)


def test_peers_equal_simulator_bitwise(fault_free_run):
    out, summary = fault_free_run
    assert summary["simulator_max_abs_diff"] == 0 and summary["failed"] == []
    cfg = config.load(out / "config.toml")
    ref = sim.simulate(cfg, streams=seeds.streams_of_run(out, N))
    for node in summary["results"]["nodes"]:
        v = node["node"]
        res = json.loads((out / "results" / f"node-{v}.json").read_text())
        assert res["missed"] == [] and res["late"] == 0
        assert np.array_equal(np.asarray(res["estimate"]), ref.finals[v])
    # The public seed's noise would give other values: the peers used their secret streams.
    assert not np.array_equal(sim.simulate(cfg).finals, ref.finals)


def test_logs_hold_the_realised_exchange_sequence_in_clock_order(fault_free_run):
    out, _ = fault_free_run
    plan = make_plan(config.load(out / "config.toml"))
    seen: dict[int, list[tuple]] = {}
    for v in range(N):
        vl = read_viewlog(out / "logs" / f"node-{v}.vlog")
        assert vl.intact, vl.problems
        assert vl.header["params"]["schedule"] == rg.schedule_digest(plan.edges)
        ex = [r for r in vl.records if r["k"] == "exchange"]
        mine = plan.exchanges_of(v)
        assert [r["step"] for r in ex] == [e.t for e in mine]  # served in clock order
        for r, e in zip(ex, mine, strict=True):
            assert (r["peer"], r["initiator"], r["averaged"]) == (e.partner(v), e.initiator, True)
            assert r["clock"] == e.time
            seen.setdefault(e.t, []).append((v, r["peer"]))
        recv = [(r["step"], r["peer"]) for r in vl.records if r["k"] == "recv"]
        assert sorted(recv) == rg.fault_free_received(plan, v)
    # Both ends logged every exchange: the union of the logs is the whole sequence.
    assert sorted(seen) == list(range(plan.steps))
    for t, ends in seen.items():
        e = plan.edges[t]
        assert sorted(ends) == [(e.a, e.b), (e.b, e.a)]
    # This schedule has exchanges where both ends' clocks rang back to back on the same edge.
    assert any(
        (x.a, x.b) == (y.a, y.b) and x.initiator != y.initiator
        for x, y in zip(plan.edges, plan.edges[1:], strict=False)
    )


def test_audit_of_fault_free_run_equals_plan(fault_free_run):
    out, _ = fault_free_run
    rep = json.loads((out / "audit.json").read_text())
    assert rep["fault_free"] is True and rep["complete"] is True and rep["integrity"] == []
    assert "Corollary 2" in rep["accounting"]
    plan = make_plan(config.load(out / "config.toml"))
    assert plan.n == N
    F = assert_audit_equals_plan(rep, plan, tol=1e-12)
    # Some pair is fully exposed and some is not, so the numbers are not trivially all LDP.
    assert F["exact"].max() == pytest.approx(1.0) and F["exact"].min() < 0.99


@pytest.mark.slow  # a real kill, 6 to 8 s (the quick suite keeps test_integration's)
def test_killed_peer_realised_sequence_reproduces_survivors(tmp_path):
    # tick 0.05 s: the victim's exchanges are ~40 ms apart, so the kill lands mid-run.
    cfg = config.load(
        EXAMPLE,
        [
            *COMMON[:2],
            "protocol.tick=0.05",
            "network.deadline_s=2",
            "network.connect_timeout_s=120",
        ],
    )
    out = tmp_path / "kill"
    local.prepare_run_dir(cfg, out)
    plan = make_plan(cfg)
    victim = 2
    mine = plan.exchanges_of(victim)
    kill_after = mine[len(mine) // 2 - 1].t + 1

    def on_event(node, ev, pid):
        if node == victim and ev.get("event") == "step" and ev.get("step") == kill_after:
            os.kill(pid, signal.SIGKILL)

    run = asyncio.run(
        local.launch_peers(cfg, out, show_progress=False, timeout_s=180, on_event=on_event)
    )
    assert [o.node for o in run.failed] == [victim]
    rep = audit.audit_run(out)
    assert rep["fault_free"] is False
    assert any(i["node"] == victim and i["kind"] == "unfinished" for i in rep["integrity"])
    rp = gossip.replay(out, plan)

    def used(t, v):
        return bool(rp.steps[t][0][v, plan.edges[t].partner(v)] != 0.0)

    # The victim's partners kept their values at (nearly) all its exchanges after the kill: the
    # one in flight when the signal landed may have completed on the partner's side.
    later = [e for e in mine if e.t >= kill_after]
    assert len(later) >= 3
    skipped = [e for e in later if not used(e.t, e.partner(victim))]
    assert len(skipped) >= len(later) - 1
    # Replaying the realised sequence reproduces every survivor's value bit for bit, and each
    # survivor's result lists exactly the exchanges it did not complete.
    ref = sim.simulate(cfg, streams=seeds.streams_of_run(out, N), used=used)
    survivors_missed = 0
    for v in range(N):
        if v == victim:
            continue
        res = json.loads((out / "results" / f"node-{v}.json").read_text())
        assert np.array_equal(np.asarray(res["estimate"]), ref.finals[v]), v
        assert {m["step"] for m in res["missed"]} == {
            e.t for e in plan.exchanges_of(v) if not used(e.t, v)
        }
        # A partner of the victim waits for it up to a deadline at each of its exchanges (the
        # channel might come back), so a survivor can also miss a late survivor: by deadline.
        assert all(m["peer"] == victim or m["reason"] == "deadline" for m in res["missed"])
        survivors_missed += sum(m["peer"] != victim for m in res["missed"])
    # The audit's numbers are never below those of the realised sequence; they are those
    # numbers where only the victim's exchanges went wrong. (Where the victim's log, cut off by
    # the kill, is involved, or a survivor's value came late on a loaded machine, the audit's
    # pairwise model of the exchanges may count more than this matrix replay, never less.)
    exact_pairs = rp.late == 0 and survivors_missed == 0
    for o in rep["observers"]:
        v = o["observer"]
        exact = acct.exact_factors(rp.steps, v, sorted(rp.received[v]))
        for x in o["losses"]:
            if x["method"] != "exact":
                continue
            if victim in (v, x["source"]) or not exact_pairs:
                assert x["factor"] >= exact[x["source"]] - 1e-12, (v, x["source"])
            else:
                assert x["factor"] == pytest.approx(exact[x["source"]], abs=1e-12), (
                    v,
                    x["source"],
                    [i for i in rep["integrity"] if i["node"] in (v, x["source"])],
                )


def _random_faulty_schedule(n: int, T: int, seed: int):
    rng = np.random.default_rng(seed)
    ex = []
    for _ in range(T):
        a, b = sorted(rng.choice(n, size=2, replace=False).tolist())
        ua, ub = (
            (True, True)
            if rng.random() < 0.7
            else (bool(rng.random() < 0.5), bool(rng.random() < 0.5))
        )
        ex.append((a, b, ua, ub))
    return ex


@pytest.mark.parametrize("seed", range(6))
def test_pairwise_accountant_equals_the_general_schedule_one(seed):
    """The dedicated O(T n) pairwise paths against the general ones (realised rows M_t as
    matrices, exact rational reduction), on schedules with missed ends."""
    n, T = 6, 24
    ex = _random_faulty_schedule(n, T, seed)
    steps = []
    for a, b, ua, ub in ex:
        m = np.eye(n)
        if ua:
            m[a, a] = m[a, b] = 0.5
        if ub:
            m[b, b] = m[b, a] = 0.5
        steps.append((m, 1.0))
    for v in range(n):
        rec = [(t, b if v == a else a) for t, (a, b, _, _) in enumerate(ex) if v in (a, b)]
        exact = pw.exact_factors(n, ex, v, rec)
        assert exact == pytest.approx(acct.exact_factors_rational(steps, v, rec), abs=1e-12)
        assert pw.paper_factors(n, ex, v, rec) == pytest.approx(
            acct.paper_factors(steps, v, rec), rel=1e-12, abs=1e-15
        )
        structural = pw.structural_factors(n, ex, v, rec)
        assert set(np.unique(structural)) <= {0.0, 1.0}
        assert np.all(exact <= structural + 1e-12)
        assert np.all((exact > 1e-12) == (structural == 1.0))
    a0, b0 = ex[0][0], ex[0][1]
    stranger = next(x for x in range(n) if x not in (a0, b0))
    with pytest.raises(ValueError, match="cannot have received"):
        pw.exact_factors(n, ex, a0, [(0, stranger)])


def test_above_the_exact_limit_the_plan_reports_the_structural_bound():
    cfg = rg_config(graph={"nodes": 70}, protocol={"steps": 300})
    plan = make_plan(cfg)
    assert plan.n > acct.RATIONAL_MAX_NODES
    F = gossip.plan_factors(plan, "exact", observers=[0, 35])
    P = gossip.plan_factors(plan, "paper", observers=[0, 35])
    assert set(np.unique(F)) <= {0.0, 1.0}
    off = np.ones_like(F, dtype=bool)
    off[0, 0] = off[1, 35] = False
    # 0 exactly for the sources whose input never reached the observer (Cor. 2 is 0 there too).
    assert np.array_equal(F[off] == 0.0, P[off] == 0.0)
    assert (F[off] == 0.0).sum() > 50  # 300 exchanges on a 70-ring: most inputs never travel far
    assert "structural upper bound" in gossip.accounting_note(plan)


def test_step_engine_rejects_a_neighbour_that_is_not_this_steps_partner():
    from coordinator_free.engine.step import StepEngine
    from coordinator_free.net.wire import Message

    engine = StepEngine(
        node=0,
        neighbours=[1, 2],
        steps=4,
        deadline=1.0,
        log_values=False,
        dim=3,
        program=None,
        partners_at=lambda t: [1] if t % 2 == 0 else [2],
    )

    def records():
        return [(a.kind, a.fields) for a in engine.out.actions]

    got: dict = {}
    value = np.zeros(3)
    engine._inbound(0, 2, Message(kind="value", round=0, step=0, payload=value), got)
    engine._inbound(0, 2, Message(kind="value", round=0, step=2, payload=value), got)
    assert got == {} and engine.buffered == {}
    assert [f["kind"] for k, f in records() if k == "bad-message"] == ["not-a-partner"] * 2
    engine._inbound(0, 1, Message(kind="value", round=0, step=0, payload=value), got)
    engine._inbound(0, 2, Message(kind="value", round=0, step=1, payload=value), got)
    assert list(got) == [1] and list(engine.buffered) == [(1, 2)]
