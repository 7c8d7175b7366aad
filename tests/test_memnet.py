"""Every family's node engines on the in-memory network: fault-free runs equal the simulator
bit for bit, and under faults (a crashed neighbour, a cut link, lost, duplicated, delayed and
reordered messages, a node that never starts) every node finishes or ends with a named
outcome in bounded fake time, and the view logs record what happened."""

from __future__ import annotations

import numpy as np
import pytest
from memcases import ALL, DEADLINE, GOSSIP, WALKS, cfg_of

from coordinator_free import sim
from coordinator_free.engine.memnet import Faults
from coordinator_free.engine.token import run_bound
from coordinator_free.families import family_of
from coordinator_free.inmemory import run_config


def known_graphs(plan, run):
    """The plan with every round's graph (secret graphs: from every node's streams, as the
    simulator knows them); any other plan as it is."""
    from coordinator_free.families.learning import secret

    if getattr(plan, "secret", False):
        return secret.bind_all(plan, run.streams)
    return plan


def reference(cfg, run):
    """The simulator's values of the run's nodes (per node for gossip, per token for walks)."""
    fam = family_of(cfg.protocol.name)
    ref = fam.simulate(cfg, None, run.streams)
    if fam.walks(cfg):
        return ref.finals
    if fam.learns(cfg):
        return ref.models
    return ref.finals


def assert_equals_simulator(cfg, run) -> None:
    ref = reference(cfg, run)
    fam = family_of(cfg.protocol.name)
    assert set(run.outcome.values()) == {"finished"}, run.outcome
    if fam.walks(cfg):
        finals = {}
        for res in run.results.values():
            assert all(e["how"] == "completed" for e in res["walks"]["ended"].values())
            finals.update({int(j): np.array(v) for j, v in res["walks"]["finals"].items()})
        assert sorted(finals) == list(range(ref.shape[0]))
        for j, v in finals.items():
            assert np.array_equal(v, ref[j]), j
    elif fam.learns(cfg):
        for v, models in run.models.items():
            assert np.array_equal(models, ref[:, v]), v
    else:
        for v, res in run.results.items():
            assert np.array_equal(np.array(res["estimate"]), ref[v]), v


def assert_bounded_and_named(cfg, run, allowed=("finished", "crashed", "never-started")):
    assert set(run.outcome.values()) <= set(allowed), run.outcome
    plan = family_of(cfg.protocol.name).make_plan(cfg)
    if family_of(cfg.protocol.name).walks(cfg):
        bound = run_bound(plan, DEADLINE) + 2 * DEADLINE
    else:
        # Every step costs at most a deadline, plus the seed exchange and the goodbye.
        bound = (plan.steps + 2) * DEADLINE + cfg.network.connect_timeout_s
    assert run.end_time <= bound, (run.end_time, bound)
    for v, how in run.outcome.items():
        if how == "finished":
            assert run.results[v] is not None and run.logs[v][-1][0] == "finished"


def misses_of(run, v: int, peer: int) -> list[dict]:
    return [r for r in run.records(v, "miss") if r["peer"] == peer]


# --------------------------------------------------------------------------- fault-free


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", list(ALL))
def test_fault_free_in_memory_run_equals_the_simulator_bitwise(name, seed):
    cfg = cfg_of(name)
    # Randomized gossip waits for a late partner, so waits add up along chains of exchanges:
    # its latencies stay well below the deadline.
    hi = 0.02 if name == "randomized-gossip" else 0.3
    run = run_config(cfg, Faults(delay=(0.001, hi)), seed=seed)
    assert_equals_simulator(cfg, run)
    assert_bounded_and_named(cfg, run)
    for v in run.logs:
        kinds = {k for k, _ in run.logs[v]}
        assert not kinds & {"miss", "peer-down", "bad-message", "token-reroute", "decor-drop"}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("name", list(ALL))
def test_duplicated_messages_change_nothing_but_are_logged(name, seed):
    cfg = cfg_of(name)
    run = run_config(cfg, Faults(duplicate=0.3, delay=(0.001, 0.02)), seed=seed)
    assert_equals_simulator(cfg, run)
    assert any(k == "duplicate" for v in run.logs for k, _ in run.logs[v])


# ------------------------------------------------------------------------- gossip faults


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", list(GOSSIP))
def test_crashed_neighbour_is_missed_and_the_others_finish(name, seed):
    cfg = cfg_of(name)
    plan = family_of(cfg.protocol.name).make_plan(cfg)
    victim = 2 + seed
    run = run_config(cfg, Faults(crash_at_step={victim: 2 + seed}), seed=seed)
    plan = known_graphs(plan, run)
    assert_bounded_and_named(cfg, run)
    assert run.outcome[victim] == "crashed"
    assert all(run.outcome[v] == "finished" for v in run.outcome if v != victim)
    seen_down = 0
    for w in plan.neighbours(victim):
        m = misses_of(run, w, victim)
        partners_later = [
            t for t in range(3 + seed, plan.steps) if victim in plan.partners_at(w, t)
        ]
        if partners_later:
            assert m, f"node {w} did not record the dropout"
        assert {r["reason"] for r in m} <= {"peer-down", "deadline"}
        seen_down += any(r["peer"] == victim for r in run.records(w, "peer-down"))
    assert seen_down
    if cfg.protocol.name == "decor":
        for w in plan.neighbours(victim):
            (drop,) = [x for x in run.records(w, "decor-drop") if x["peer"] == victim]
            for x in run.records(w, "decor-noise"):
                assert (victim in x["peers"]) == (x["round"] < drop["first_round"]), x


@pytest.mark.parametrize("healed", [False, True])
@pytest.mark.parametrize("name", list(GOSSIP))
def test_cut_link_is_missed_at_both_ends(name, healed):
    cfg = cfg_of(name)
    plan = family_of(cfg.protocol.name).make_plan(cfg)
    a = 0
    b = plan.neighbours(0)[0]
    t_end = 1.5 * DEADLINE if healed else None
    run = run_config(cfg, Faults(partitions=[(a, b, 0.002, t_end)]), seed=1)
    plan = known_graphs(plan, run)
    assert_bounded_and_named(cfg, run, allowed=("finished",))
    for v, w in ((a, b), (b, a)):
        assert any(r["peer"] == w for r in run.records(v, "peer-down"))
        if any(w in plan.partners_at(v, t) for t in range(plan.steps)):
            assert misses_of(run, v, w)
    if healed and cfg.protocol.name != "randomized-gossip":
        assert any(r["peer"] == b for r in run.records(a, "peer-up"))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("name", list(GOSSIP))
def test_lost_messages_are_missed_at_the_deadline(name, seed):
    cfg = cfg_of(name)
    run = run_config(cfg, Faults(drop=0.15, delay=(0.001, 0.2)), seed=seed)
    assert_bounded_and_named(cfg, run, allowed=("finished",))
    reasons = {r["reason"] for v in run.logs for r in run.records(v, "miss")}
    assert reasons <= {"deadline", "finished"}
    assert reasons, "15% of the messages lost and nothing missed"


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", list(GOSSIP))
def test_messages_later_than_the_deadline_are_logged_late(name, seed):
    cfg = cfg_of(name)
    run = run_config(cfg, Faults(delay=(0.001, 2.5 * DEADLINE), reorder=True), seed=seed)
    assert_bounded_and_named(cfg, run, allowed=("finished",))
    late = sum(len(run.records(v, "late")) for v in run.logs)
    missed = sum(len(run.records(v, "miss")) for v in run.logs)
    assert missed > 0 and late > 0
    for v, res in run.results.items():
        assert res["late"] == len(run.records(v, "late"))


@pytest.mark.parametrize("name", ["muffliato", "dsgd", "decor"])
def test_a_node_that_never_starts_is_skipped(name):
    cfg = cfg_of(name)
    plan = family_of(cfg.protocol.name).make_plan(cfg)
    run = run_config(cfg, Faults(never_start={1}), seed=0)
    assert_bounded_and_named(cfg, run)
    assert run.outcome[1] == "never-started"
    for w in plan.neighbours(1):
        assert {r["reason"] for r in misses_of(run, w, 1)} == {"peer-down"}
        if cfg.protocol.name == "decor":
            assert [x["peer"] for x in run.records(w, "decor-no-pair")] == [1]


def test_a_frozen_peer_catches_up_from_buffered_values():
    """The stalled-peer scenario: one node stops (SIGSTOP) for a few deadlines; its neighbours
    give up on it and run ahead, and when it resumes it finds values several steps ahead, which
    are buffered and logged (part of its view), never dropped."""
    cfg = cfg_of("muffliato", "protocol.steps=10")
    plan = family_of(cfg.protocol.name).make_plan(cfg)
    victim = 5
    run = run_config(cfg, Faults(delay=0.01, freeze={victim: (0.015, 5 * DEADLINE)}), seed=0)
    assert set(run.outcome.values()) == {"finished"}
    kinds = [k for k, _ in run.logs[victim]]
    assert "bad-message" not in kinds
    for w in plan.neighbours(victim):
        assert misses_of(run, w, victim)
    # Values from steps ahead of the victim were buffered (recv before their step's miss).
    recv = run.records(victim, "recv")
    assert len({(r["step"], r["peer"]) for r in recv}) == len(recv)
    assert any(r["step"] >= 3 for r in recv)


# ---------------------------------------------------------------------------- walk faults


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("name", list(WALKS))
def test_crashed_holder_ends_the_walk_lost_or_rerouted(name, seed):
    cfg = cfg_of(name)
    victim = 1 + seed % 3
    run = run_config(cfg, Faults(crash_at_step={victim: 1 + seed}), seed=seed)
    assert_bounded_and_named(cfg, run)
    survivors = [v for v in run.outcome if v != victim]
    if run.outcome[victim] != "crashed":  # the token never reached the victim's step
        assert run.outcome[victim] == "finished"
        return
    assert all(run.outcome[v] == "finished" for v in survivors)
    ends = {}
    for v in survivors:
        ends.update(run.results[v]["walks"]["ended"])
    assert ends and all(e["how"] in ("completed", "lost", "stuck") for e in ends.values())
    for e in ends.values():
        if e["how"] == "lost":
            assert e["at"] == victim
    reroutes = [x for v in survivors for x in run.results[v]["missed"]]
    assert all(x["peer"] == victim for x in reroutes)
    assert any(r["peer"] == victim for v in survivors for r in run.records(v, "peer-down"))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("name", list(WALKS))
def test_lost_hand_off_messages_reroute_or_time_out(name, seed):
    cfg = cfg_of(name)
    run = run_config(cfg, Faults(drop=0.05, delay=(0.001, 0.2)), seed=seed)
    assert_bounded_and_named(cfg, run, allowed=("finished",))
    hows = set()
    for res in run.results.values():
        hows |= {e["how"] for e in res["walks"]["ended"].values()}
    assert hows <= {"completed", "lost", "stuck", "timeout"}
    # Every node knows how every walk ended, and they agree.
    tokens = {str(j) for j in range(family_of(cfg.protocol.name).make_plan(cfg).tokens)}
    for v, res in run.results.items():
        assert set(res["walks"]["ended"]) == tokens, (v, res["walks"]["ended"])
        assert {j: e["how"] for j, e in res["walks"]["ended"].items()} == {
            j: e["how"] for j, e in run.results[0]["walks"]["ended"].items()
        }, v
    # A lost message is recovered from in the open (re-routed, its commit timed out, a late
    # ack refused, a commit assumed, an offer refused and made again): where no node recorded
    # any of that, nothing was lost that mattered, and the walks are the fault-free ones.
    kinds = {k for v in run.logs for k, _ in run.logs[v]}
    recovered = kinds & {
        "token-reroute", "commit-timeout", "late-ack", "commit-assumed", "token-nack"
    }  # fmt: skip
    if not recovered:
        assert_equals_simulator(cfg, run)
    # A walk that did not complete ended where the records say: stuck where its holder ran out
    # of next hops (re-routed), lost where a holder recorded it lost.
    for j, e in run.results[0]["walks"]["ended"].items():
        if e["how"] == "stuck":
            assert any(r["token"] == int(j) for r in run.records(e["at"], "token-reroute")), e
        elif e["how"] == "lost":
            assert any(
                r["token"] == int(j) and r["peer"] == e["at"]
                for v in run.logs
                for r in run.records(v, "token-lost")
            ), e


@pytest.mark.parametrize("name", ["complete-sum", "walk-sgd"])
def test_cut_link_reroutes_the_token(name):
    cfg = cfg_of(name)
    plan = family_of(cfg.protocol.name).make_plan(cfg)
    a, b = 0, plan.neighbours(0)[-1]
    run = run_config(cfg, Faults(partitions=[(a, b, 0.0005, None)]), seed=2)
    assert_bounded_and_named(cfg, run, allowed=("finished",))
    ends = {}
    for res in run.results.values():
        ends.update(res["walks"]["ended"])
    assert all(e["how"] == "completed" for e in ends.values()), ends
    for res in run.results.values():
        for x in res["missed"]:
            assert x["peer"] in (a, b) and x["reason"] == "peer-down"


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", list(WALKS))
def test_delayed_hand_offs_within_the_deadline_change_nothing(name, seed):
    """Latency below the deadline, out of order across links: every hop is acknowledged in
    time, so the walk is the simulator's, bit for bit."""
    cfg = cfg_of(name)
    run = run_config(cfg, Faults(delay=(0.001, 0.3 * DEADLINE), reorder=True), seed=seed)
    assert_equals_simulator(cfg, run)
    assert not any(res["missed"] for res in run.results.values())


@pytest.mark.parametrize("name", list(WALKS))
def test_hand_offs_later_than_the_deadline_are_repeated_not_rerouted(name):
    """Every message takes longer than the deadline: the holder repeats its offer and its
    commit with the same step until the late answers arrive (the receiver deduplicates), nothing
    is re-routed while the channel is up, and the walk is the simulator's, bit for bit."""
    cfg = cfg_of(name)
    run = run_config(cfg, Faults(delay=1.5 * DEADLINE), seed=0)
    assert_bounded_and_named(cfg, run, allowed=("finished",))
    assert_equals_simulator(cfg, run)
    assert not any(res["missed"] for res in run.results.values())
    kinds = {k for v in run.logs for k, _ in run.logs[v]}
    assert "token-resend" in kinds and "duplicate" in kinds


def test_cut_ring_link_leaves_the_token_stuck_with_a_named_end():
    """On the ring there is no other next hop: a cut link ends the walk ``stuck`` at the node
    before the cut, and everyone still finishes."""
    cfg = cfg_of("ring-sum")
    run = run_config(cfg, Faults(partitions=[(2, 3, 0.0005, None)]), seed=0)
    assert_bounded_and_named(cfg, run, allowed=("finished",))
    ends = {}
    for res in run.results.values():
        ends.update(res["walks"]["ended"])
    assert ends and all(e["how"] == "stuck" and e["at"] == 2 for e in ends.values()), ends


def test_in_memory_runs_are_deterministic_from_the_seed():
    cfg = cfg_of("muffliato")
    f = Faults(drop=0.1, duplicate=0.1, delay=(0.001, 0.5), reorder=True)
    r1, r2 = run_config(cfg, f, seed=7), run_config(cfg, f, seed=7)
    assert r1.end_time == r2.end_time
    for v in r1.logs:
        assert [k for k, _ in r1.logs[v]] == [k for k, _ in r2.logs[v]]


def test_the_simulator_is_the_lockstep_run_of_the_same_programs():
    cfg = cfg_of("muffliato")
    run = run_config(cfg, seed=0)
    assert np.array_equal(
        sim.simulate(cfg, streams=run.streams).finals,
        np.stack([run.results[v]["estimate"] for v in sorted(run.results)]),
    )


@pytest.mark.parametrize("seed", range(4))
def test_randomized_realised_sequence_reproduces_the_survivors(seed):
    """A crashed node's partners skip their exchanges with it; the exchanges each node logs
    (who averaged at which exchange) replayed by the simulator give the survivors' values bit
    for bit."""
    cfg = cfg_of("randomized-gossip")
    victim = 3
    run = run_config(cfg, Faults(crash_at_step={victim: 10 + 5 * seed}), seed=seed)
    assert_bounded_and_named(cfg, run)
    averaged = {(r["step"], v): r["averaged"] for v in run.logs for r in run.records(v, "exchange")}
    assert not all(averaged.values())
    ref = sim.simulate(cfg, streams=run.streams, used=lambda t, v: averaged.get((t, v), False))
    for v, res in run.results.items():
        if run.outcome[v] == "finished":
            assert np.array_equal(np.array(res["estimate"]), ref.finals[v]), v


def test_everything_a_stalled_node_saw_is_audited(tmp_path):
    """The stalled peer, audited: its neighbours miss it, and the audit's view of it holds
    exactly the (step, sender) pairs its log shows it received, buffered ones included."""
    from memrun import write_run_dir

    from coordinator_free.accounting import audit
    from coordinator_free.privacy import muffliato as acct
    from tests import gossipviews as gossip

    cfg = cfg_of("muffliato", "protocol.steps=10", "protocol.accelerated=false")
    victim = 5
    run = run_config(cfg, Faults(delay=0.01, freeze={victim: (0.015, 5 * DEADLINE)}), seed=0)
    out = write_run_dir(cfg, run, tmp_path / "stall")
    recv_steps = {(f["step"], f["peer"]) for k, f in run.logs[victim] if k in ("recv", "late")}
    rep = audit.audit_run(out)
    assert rep["fault_free"] is False
    assert not [f for f in rep["integrity"] if f["kind"] != "unfinished"], rep["integrity"]
    replay = gossip.replay(out, audit.load_run(out)[1])
    assert replay.received[victim] == recv_steps
    f = acct.exact_factors(replay.steps, victim, sorted(recv_steps))
    (obs,) = [o for o in rep["observers"] if o["observer"] == victim]
    for x in obs["losses"]:
        if x["method"] == "exact":
            assert x["factor"] == pytest.approx(f[x["source"]], abs=1e-12)


@pytest.mark.parametrize("name", ["muffliato", "randomized-gossip", "dsgd", "decor", "ring-sum"])
def test_audit_of_a_fault_free_in_memory_run_is_fault_free(tmp_path, name):
    from memrun import write_run_dir

    from coordinator_free.accounting import audit

    cfg = cfg_of(name)
    out = write_run_dir(cfg, run_config(cfg, seed=1), tmp_path / name)
    rep = audit.audit_run(out)
    assert rep["fault_free"] is True, rep["integrity"]
    assert rep["integrity"] == []
