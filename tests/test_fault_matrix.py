"""The fault matrix: every declared fault kind x every protocol, on the in-memory network.

Each cell declares its fault the way a user does (``--fault SPEC``, here through
``config.load(..., faults=[...])``), runs the protocol's real node engines on the in-memory
network with the delays of a real run (a silent neighbour is declared down after
SILENCE_DEADLINES deadlines), writes the run directory and checks:

* the run ends by itself within a bound of the fault-free run plus a few deadlines;
* every node has a named outcome (finished, crashed, never-started);
* the verdict names the faulted node whenever the fault is aimed at one, and a run that did
  not complete as planned is never reported as if it had;
* the auditor returns (never raises) and, whenever it reports an integrity finding, no loss is
  below the plan's; estimates stay finite (a NaN from a neighbour is refused);
* dropout, where the protocol knows it, is part of the public plan: the audit equals the plan.
"""

from __future__ import annotations

import numpy as np
import pytest
from memcases import ALL as MEMNET_ALL
from memcases import DEADLINE, EX

from coordinator_free import config, verdict
from coordinator_free.accounting.audit import audit_run
from coordinator_free.engine.events import SILENCE_DEADLINES
from coordinator_free.engine.memnet import Faults
from coordinator_free.errors import ConfigError
from coordinator_free.families import family_of
from coordinator_free.inmemory import run_config
from tests.memrun import write_run_dir

#: Every protocol with peers: the in-memory network's configs, plus the walks and learning
#: variants it does not run.
ALL = {
    **MEMNET_ALL,
    "ring-histogram": (EX / "ring-histogram.toml", ["graph.nodes=5", "protocol.cycles=2"]),
    "complete-histogram": (
        EX / "complete-histogram.toml",
        ["graph.nodes=5", "protocol.hops=40"],
    ),
    "complete-sgd": (EX / "complete-sgd.toml", ["graph.nodes=5", "protocol.hops=40"]),
    "muffliato-sgd": (
        EX / "muffliato-gd-breast-cancer.toml",
        [
            "protocol.name=muffliato-sgd",
            "protocol.batch_size=8",
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
    fired = kind == "never-starts" or any(i.get("node") == TARGET for i in run.injected)
    if kind in NAMED and fired and _affects(fam, cfg, kind) and (kind != "cut-heal" or problems):
        # (a cut healed before the node had an exchange due may leave no trace at all)
        assert any(p["node"] == TARGET for p in problems), problems
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


def _affects(fam, cfg, kind: str) -> bool:
    """A token walk only notices a fault at a node the token visits while it lasts; the
    gossip protocols always do."""
    return not fam.walks(cfg) or kind in ("kill", "never-starts")


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

    with_peers = {p for p in catalog.ALL if p != "central-dp"}
    assert set(ALL_PROTOCOL.values()) == with_peers


def test_faults_are_refused_for_the_trusted_curator():
    with pytest.raises(ConfigError, match="runs in one process"):
        config.load(EX / "central-dp-breast-cancer.toml", [], ["kill:1@2"])
