"""The fault matrix: every declared fault kind x every protocol, on the in-memory network.

Each cell declares its fault the way a user does (``--fault SPEC``, here through
``config.load(..., faults=[...])``), runs the protocol's real node engines on the in-memory
network with the delays of a real run (a silent neighbour is declared down after
SILENCE_DEADLINES deadlines), writes the run directory and checks:

* the run ends by itself within a bound of the fault-free run plus a few deadlines;
* every node has a named outcome (finished, crashed, never-started);
* every declared fault took effect, by what it leaves behind (MAY_NOT_FIRE lists the cells
  where it legitimately may not, and why), a node fault that did not is reported as not
  applied with the reason (and one that did is not), and the verdict names the node a fault is aimed
  at; a run that did not complete as planned is never reported as if it had;
* the auditor returns (never raises) and, whenever it reports an integrity finding, no loss is
  below the plan's; estimates stay finite (a NaN from a neighbour is refused);
* dropout, where the protocol knows it, is part of the public plan: the audit equals the plan.
"""

from __future__ import annotations

import numpy as np
import pytest
from memcases import ALL as MEMNET_ALL
from memcases import DEADLINE, EX

from coordinator_free import config, faults, verdict
from coordinator_free.accounting.audit import audit_run
from coordinator_free.engine.events import SILENCE_DEADLINES
from coordinator_free.engine.memnet import Faults
from coordinator_free.errors import ConfigError
from coordinator_free.families import family_of
from coordinator_free.faults import NODE_KINDS
from coordinator_free.inmemory import run_config
from tests.memrun import write_run_dir

#: Every protocol with peers: the in-memory network's configs, plus the walks and learning
#: variants it does not run.
ALL = {
    **MEMNET_ALL,
    "ring-histogram": (EX / "ring-histogram.toml", ["graph.nodes=5", "protocol.cycles=2"]),
    "complete-histogram": (
        EX / "complete-histogram.toml",
        # Uncapped, as the cells were chosen for: a capped node's late visits change nothing
        # (it answers no more), so whether a cut is felt would depend on where the walk goes.
        ["graph.nodes=5", "protocol.hops=40", "protocol.cap=0"],
    ),
    # step size 0.05 (the example takes 0.02): every draw of a run depends on its whole config,
    # and with this one the walk (seed 3) meets the target while it is cut, so the cut-heal cell
    # tests a cut that is felt
    "complete-sgd": (
        EX / "complete-sgd.toml",
        ["graph.nodes=5", "protocol.hops=40", "protocol.step_size=0.05"],
    ),
    "muffliato-sgd": (
        EX / "muffliato-gd-breast-cancer.toml",
        [
            "protocol.name=muffliato-sgd",
            "protocol.batch_size=8",
            "graph.kind=ring",
            "graph.nodes=6",
            "protocol.rounds=3",
            "protocol.gossip_steps=2",
        ],
    ),  # fmt: skip
}


def cfg_of(name: str, *extra: str):
    path, sets = ALL[name]
    return config.load(path, [*sets, f"network.deadline_s={DEADLINE}", *extra])


TARGET = 2  # the node a node fault is aimed at
AT = 3  # the step it fires at

#: fault kind -> the specs declaring it (``{T}``: the target node, ``{S}``: the step).
MATRIX = {
    "kill": ["kill:{T}@{S}"],
    "stop": [f"stop:{{T}}@{{S}}+{5 * DEADLINE:g}"],  # past the silence verdict
    "cut": ["cut:{T}@{S}"],
    "cut-heal": ["cut:{T}@{S}", "heal:{T}@{H}"],
    "never-starts": [],  # not a spec: the in-memory network's never_start
    "drop": ["drop:0.05"],
    "duplicate": ["duplicate:0.2"],
    "delay": ["delay:50"],
    "corrupt": ["corrupt:0.03"],
    "nan": ["nan:{T}@{S}"],
    "dropout": ["dropout:0.2"],
}
#: Faults aimed at TARGET that the verdict must name.
NAMED = ("kill", "stop", "cut", "cut-heal", "never-starts", "nan")


def _specs(kind: str, name: str) -> list[str]:
    heal_at = AT + 3
    return [s.format(T=TARGET, S=AT, H=heal_at) for s in MATRIX[kind]]


def _run(name: str, kind: str, tmp_path, seed: int = 3):
    specs = _specs(kind, name)
    try:
        cfg = cfg_of(name) if not specs else _cfg(name, specs)
    except ConfigError as exc:
        return None, None, exc
    fam = family_of(cfg.protocol.name)
    overrides = {"never_start": {TARGET}} if kind == "never-starts" else {}
    faults = Faults.of_config(cfg, **overrides)
    run = run_config(cfg, faults, seed=seed)
    out = write_run_dir(cfg, run, tmp_path / f"{name}-{kind}")
    return cfg, (fam, run, out), None


def _cfg(name: str, specs: list[str]):
    path, sets = ALL[name]
    return config.load(path, [*sets, f"network.deadline_s={DEADLINE}"], specs)


def _fault_free_end(name: str) -> float:
    cfg = cfg_of(name)
    return run_config(cfg, seed=3).end_time


@pytest.mark.parametrize("kind", list(MATRIX))
@pytest.mark.parametrize("name", list(ALL))
def test_fault_matrix_cell(name, kind, tmp_path):
    cfg, ran, refused = _run(name, kind, tmp_path)
    if refused is not None:
        # Only dropout may be refused, and only by a protocol without a dropout schedule,
        # with an error naming the spec and saying what to use instead.
        assert kind == "dropout", refused
        assert "dropout:0.2" in str(refused) and "has no per-step dropout" in str(refused)
        assert not family_of(ALL_PROTOCOL[name]).dropout(cfg_of(name))
        return
    fam, run, out = ran
    plan = fam.make_plan(cfg)

    # Bounded, with a named outcome per node.
    assert set(run.outcome.values()) <= {"finished", "crashed", "never-started"}, run.outcome
    for v, how in run.outcome.items():
        if how == "finished":
            assert run.results[v] is not None and run.logs[v][-1][0] == "finished"
    stop_s = 5 * DEADLINE if kind == "stop" else 0.0
    slack = (SILENCE_DEADLINES + 8) * DEADLINE + stop_s
    if fam.walks(cfg):
        bound = _fault_free_end(name) + slack
        if kind in ("drop", "corrupt"):
            # Each lost hand-off message costs a few deadlines (query, nack, offer again),
            # never the walk: no walk ends by the run-level timeout.
            bound += 0.5 * plan.hops * DEADLINE
            assert not any(run.records(v, "walk-timeout") for v in run.logs)
    else:
        bound = (plan.steps + 2) * DEADLINE + slack + cfg.network.connect_timeout_s
    assert run.end_time <= bound, (run.end_time, bound)

    # The verdict: a fault aimed at a node that fired is named.
    failed = [
        {"node": v, "returncode": -9, "error": how, "step": None}
        for v, how in run.outcome.items()
        if how != "finished" and how != "never-started"
    ] + [
        {"node": v, "returncode": None, "error": "never started", "step": None}
        for v, how in run.outcome.items()
        if how == "never-started"
    ]
    problems = verdict.problems(
        plan, verdict.read_results(out, plan.n), failed, walks=fam.walks(cfg)
    )
    fired = _fired(run, kind, name)
    # Every declared node fault either took effect or is reported as not applied, with why.
    listed = {x["spec"]: x for x in run.not_applied}
    for spec in _specs(kind, name):
        if spec.split(":")[0] in NODE_KINDS:
            assert (spec in listed) != _took_effect(run, spec), (spec, run.not_applied)
            if spec in listed:
                assert listed[spec]["reason"], listed[spec]
    if (name, kind) in MAY_NOT_FIRE:
        # MAY_NOT_FIRE says why it may not have fired, and why nothing need be named; one that
        # did not fire is reported as not applied (checked above).
        if not fired and kind in NAMED:
            assert any(x["node"] == TARGET for x in run.not_applied), run.not_applied
    else:
        assert fired, f"{kind} never took effect in {name}: {run.injected}"
        if kind in NAMED:
            assert any(_names_target(p) for p in problems), problems
    if kind == "dropout":
        assert problems == [], problems  # sitting out is the plan, not a fault

    # Estimates stay finite: a NaN from a neighbour is refused, never averaged in.
    for v, res in run.results.items():
        if res is not None and res.get("estimate"):
            assert np.all(np.isfinite(res["estimate"])), (v, res["estimate"])
    for v, models in run.models.items():
        assert np.all(np.isfinite(models)), v

    # The audit never raises, and never reports below the plan when anything is damaged.
    if not fam.has_peers(cfg):
        return
    audit = audit_run(out)
    if audit["integrity"]:
        _compare_with_plan(cfg, audit, equal=False)
    if kind == "dropout":
        assert audit["fault_free"], audit["integrity"]
        _compare_with_plan(cfg, audit, equal=True)


_RANDOM_WALKS = ("complete-sum", "complete-histogram", "complete-sgd", "walk-sgd", "admm")
_RING_WALKS = ("ring-sum", "ring-histogram")

#: The cells whose declared fault may legitimately not take effect (or leave nothing to
#: name), and why; in every other cell the fault must be seen firing, and a fault aimed at
#: TARGET must be named by the verdict.
MAY_NOT_FIRE = {
    **{
        (name, "nan"): "nan:T@S replaces the values T sends at step S; a random walk's token "
        "is handed on by T at step S only if it happens to visit T at step S - 1"
        for name in _RANDOM_WALKS
    },
    ("randomized-gossip", "nan"): "nan:T@S replaces the values T sends at step S; randomized "
    "gossip's step S is one exchange of the pair the Poisson clocks pick, T only by chance",
    **{
        (name, "cut-heal"): "heal:T@H fires on a report of step H; on a ring, T's "
        "predecessor has no other hop than the cut T, so the walk ends before step H (the "
        "cut fires and is named as in the cut cell)"
        for name in _RING_WALKS
    },
    ("randomized-gossip", "cut-heal"): "the cut heals three steps after it fires, before the "
    "Poisson clocks (seed 3) give T an exchange: nothing of T's is missed, nothing to name",
    ("admm", "cut-heal"): "the cut heals three steps after it fires (steps 3 to 6, 6 ms of "
    "the fake clock), before the walk (seed 3) offers T the token at step 7: nothing of T's is "
    "missed, nothing to name",
    ("ring-histogram", "corrupt"): "a 10-hop ring walk sends about 40 frames; corrupt:0.03 "
    "hits none of them at seed 3",
    **{
        (name, "dropout"): "dropout is part of the public plan, not a fault that fires: the "
        "cell checks that the audit equals the plan instead"
        for name in ALL
    },
}

#: The records a node writes when a lost message is recovered from (a value missed at its
#: step and taken late; a token re-routed, refused and offered again, or its commit lost).
_RECOVERY = (
    "late",
    "token-reroute",
    "token-nack",
    "commit-timeout",
    "token-resend",
    "goodbye-resend",
    "goodbye-unanswered",
)


def _fired(run, kind: str, name: str) -> bool:
    """Whether the cell's declared fault took effect, by what it leaves behind."""
    records = {k for log in run.logs.values() for k, _ in log}
    aimed = {i["fault"] for i in run.injected if i.get("node") == TARGET}
    if kind == "never-starts":
        return run.outcome[TARGET] == "never-started"
    if kind in ("kill", "stop", "cut", "nan"):
        return kind in aimed
    if kind == "cut-heal":
        return {"cut", "heal"} <= aimed
    if kind == "drop":
        return bool(records & set(_RECOVERY))
    if kind == "duplicate":
        # randomized gossip logs the second copy of an exchange's value as late
        return "duplicate" in records or (name == "randomized-gossip" and "late" in records)
    if kind == "delay":
        return run.end_time > _fault_free_end(name)
    if kind == "corrupt":
        return any(
            k == "peer-down" and "authentication failed" in str(f.get("reason"))
            for log in run.logs.values()
            for k, f in log
        )
    return False


def _took_effect(run, spec: str) -> bool:
    """Whether the declared node fault ``spec`` fired: the launcher's kinds by their injected
    record, ``nan:N@S`` by a NaN node N sent at step S."""
    f = faults.parse(spec)
    if f.kind == "nan":
        return any(
            i["fault"] == "nan" and i["node"] == f.node and i["step"] == f.step
            for i in run.injected
        )
    return any(i.get("spec") == spec for i in run.injected)


def _names_target(problem: dict) -> bool:
    """The verdict names TARGET: the problem is TARGET's, or (a walk) its cause says the walk
    was lost or stuck at TARGET."""
    return problem["node"] == TARGET or f"at node {TARGET}," in str(problem.get("cause"))


def _entries(audit):
    for obs in audit["observers"]:
        for e in obs["losses"]:
            yield obs["observer"], e


def _compare_with_plan(cfg, audit, equal: bool) -> None:
    """Every audited entry is at least the plan's (``equal``: equal to it)."""
    fam = family_of(cfg.protocol.name)
    plan = fam.make_plan(cfg)
    planned = fam.planned_losses(cfg, plan, list(range(plan.n)))
    for v, e in _entries(audit):
        want = planned[v][(e["source"], e["method"])]["eps"]
        if equal:
            assert e["eps"] == pytest.approx(want, rel=1e-9, abs=1e-12), (v, e, want)
        else:
            assert e["eps"] >= want - 1e-9 * max(1.0, want), (v, e, want)


ALL_PROTOCOL = {name: cfg_of(name).protocol.name for name in ALL}


def test_every_protocol_with_peers_is_in_the_matrix():
    from coordinator_free.families import catalog
    from coordinator_free.families.admm import ONE_PROCESS

    with_peers = {p for p in catalog.ALL if p != "central-dp" and p not in ONE_PROCESS}
    assert set(ALL_PROTOCOL.values()) == with_peers


def test_faults_are_refused_for_the_trusted_curator():
    with pytest.raises(ConfigError, match="runs in one process"):
        config.load(EX / "central-dp-breast-cancer.toml", [], ["kill:1@2"])
