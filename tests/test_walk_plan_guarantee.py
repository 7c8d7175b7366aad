"""Off the ring a token's walk is drawn at run time, so the plan's ``exact`` loss must hold for
every walk (the local-DP loss of all of a source's contributions); the one walk sampled from the
public seed is a labelled extra (``typical_walk``), and a fault-free run never audits above its
plan. The ring's walk is fixed: its plan is its walk."""

from __future__ import annotations

import pytest
from memcases import DEADLINE, EX

from coordinator_free import config
from coordinator_free.accounting.audit import audit_run
from coordinator_free.families import family_of
from coordinator_free.families.walk import accountant as wa
from coordinator_free.inmemory import run_config
from tests.memrun import write_run_dir

RANDOM_WALKS = {
    "complete-sum": (EX / "complete-sum.toml", ["graph.nodes=5", "protocol.hops=40"]),
    "complete-histogram": (EX / "complete-histogram.toml", ["graph.nodes=5", "protocol.hops=40"]),
    "complete-sgd": (EX / "complete-sgd.toml", ["graph.nodes=5", "protocol.hops=40"]),
    "walk-sgd": (EX / "walk-sgd.toml", ["graph.nodes=8", "protocol.hops=40"]),
}


def _cfg(name: str, *extra: str):
    path, sets = RANDOM_WALKS[name]
    return config.load(path, [*sets, f"network.deadline_s={DEADLINE}", *extra])


@pytest.mark.parametrize("name", RANDOM_WALKS)
def test_the_plan_is_the_guarantee_for_every_walk_and_the_sampled_walk_is_labelled(name):
    cfg = _cfg(name)
    fam = family_of(cfg.protocol.name)
    plan = fam.make_plan(cfg)
    rep = wa.plan_report(cfg, plan, source=None, method="exact")
    g = wa.ldp_baseline(plan)
    assert rep["worst_pair"]["eps"] == g["eps"] and rep["mean_over_pairs"]["eps"] == g["eps"]
    typical = rep["typical_walk"]
    assert "not a guarantee" in typical["note"]
    assert typical["worst_pair"]["eps"] <= g["eps"]
    assert "guarantee for every walk" in rep["accounting"]
    planned = wa.planned_losses(cfg, plan, range(plan.n))
    assert {
        x["eps"] for cells in planned.values() for (s, m), x in cells.items() if m == "exact"
    } == {g["eps"]}


@pytest.mark.parametrize("seed", [3, 11, 29])
@pytest.mark.parametrize("name", RANDOM_WALKS)
def test_a_fault_free_run_never_audits_above_its_plan(name, seed, tmp_path):
    cfg = _cfg(name, f"run.seed={seed}")
    fam = family_of(cfg.protocol.name)
    plan = fam.make_plan(cfg)
    out = write_run_dir(cfg, run_config(cfg, seed=seed), tmp_path / "run")
    audit = audit_run(out)
    assert audit["fault_free"], audit["integrity"]
    assert "conditions on the walk the run really took" in audit["accounting"]
    planned = wa.planned_losses(cfg, plan, range(plan.n))
    for obs in audit["observers"]:
        for e in obs["losses"]:
            want = planned[obs["observer"]][(e["source"], e["method"])]["eps"]
            assert e["eps"] <= want * (1 + 1e-12), (obs["observer"], e, want)


def test_without_a_cap_the_count_bound_leaves_the_view_two_thirds_of_delta():
    cfg = _cfg("complete-sum")
    plan = family_of(cfg.protocol.name).make_plan(cfg)
    assert not wa.count_is_certain(plan)
    from coordinator_free.accounting import loss

    n_bound = wa.contributions_bound(plan)
    full = loss.Units(alpha=plan.alpha, delta=plan.delta, sensitivity=plan.sensitivity,
                      sigma=plan.sigma).gaussian(n_bound)  # fmt: skip
    assert wa.ldp_baseline(plan)["eps"] > full.eps  # never under: less delta, more eps
    capped = _cfg("complete-sgd")
    assert wa.count_is_certain(family_of(capped.protocol.name).make_plan(capped))


def test_the_ring_plan_is_its_fixed_walk():
    cfg = config.load(EX / "ring-sum.toml", ["graph.nodes=5", "protocol.cycles=2"])
    plan = family_of(cfg.protocol.name).make_plan(cfg)
    rep = wa.plan_report(cfg, plan, source=None, method="exact")
    assert "typical_walk" not in rep
    ex = wa.exact_losses(plan, wa.sampled_walks(cfg, plan), [0])[0]
    assert wa.planned_losses(cfg, plan, [0])[0][(1, "exact")]["eps"] == ex[1]["eps"]
