"""Private ADMM as a protocol family: the plan and its accounting, the config's errors, the
simulator against the in-memory network, the audit of a fault-free run against the plan, the
one-process baselines, and one real-process run bit-equal to the simulator."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from coordinator_free import config, seeds
from coordinator_free.accounting import audit
from coordinator_free.engine.memnet import Faults
from coordinator_free.errors import ConfigError
from coordinator_free.families import family_of
from coordinator_free.families.admm import accountant as aa
from coordinator_free.families.admm import protocol as ap
from coordinator_free.inmemory import run_config
from coordinator_free.privacy import admm as theorems
from tests.memrun import write_run_dir
from tests.netrun import cfree_run_json

EX = Path(__file__).resolve().parent.parent / "examples"
LASSO = EX / "admm-lasso.toml"
SMALL = ["graph.nodes=6", "protocol.hops=30", "data.samples=240", "data.features=8"]


def cfg_of(*sets: str, path: Path = LASSO):
    return config.load(path, [*SMALL, "network.deadline_s=1", *sets])


# ------------------------------------------------------------------------------ the plan


def test_example_plan_amplifies_every_pair_below_local_dp_within_eps_10():
    cfg = config.load(LASSO)
    plan = ap.make_plan(cfg)
    assert plan.n == 16 and plan.complete_graph
    rep = audit.plan_report(cfg, source=None, method="exact")
    ldp = rep["ldp"]["eps"]
    assert ldp <= 10.0
    assert rep["baseline"]["amplified"] == rep["baseline"]["pairs"] == 16 * 15
    assert rep["worst_pair"]["eps"] < ldp
    # Local DP is Theorem 8.9's local curve for the plan's bound on a user's contributions.
    K = aa.contributions_bound(plan)
    rho = theorems.local_rho(K, plan.lipschitz, plan.gamma, plan.sigma)
    assert rep["ldp"]["rdp"] == pytest.approx(plan.alpha * rho, rel=1e-12)
    # The entry holds at the orders Theorem 8.12's condition allows only.
    amax = theorems.alpha_max(plan.sigma, plan.lipschitz, plan.gamma)
    assert rep["worst_pair"]["alpha_max"] == pytest.approx(amax)
    assert 1.0 < rep["worst_pair"]["alpha"] < amax


def test_the_record_unit_divides_the_sensitivity_by_the_smallest_shard():
    """Record level: one contribution's shift is 4 gamma L / m_min (plus the certified solves'
    tolerance), so every planned RDP is (L_eff(record) / L_eff(user))^2 times the user-level one
    at the same sigma; the plan says which unit it took."""
    from coordinator_free.ml.prox import PROX_TOL_REL

    rec = ap.make_plan(config.load(LASSO))
    usr = ap.make_plan(config.load(LASSO, ["privacy.unit=user"]))
    assert (rec.unit, usr.unit) == ("record", "user")
    task = ap.make_task(config.load(LASSO), rec.n)
    m_min = min(len(s) for s in task.shards)
    assert rec.min_shard == m_min == 250
    T = rec.hops
    assert rec.lipschitz == pytest.approx(rec.clip * (1.0 / m_min + (1 + T) * PROX_TOL_REL))
    assert usr.lipschitz == pytest.approx(usr.clip * (1.0 + T * PROX_TOL_REL))
    assert aa.units_of(rec).sensitivity == pytest.approx(4.0 * rec.gamma * rec.lipschitz)
    ratio = (rec.lipschitz / usr.lipschitz) ** 2
    assert aa.ldp_entry(rec)["rdp"] == pytest.approx(ratio * aa.ldp_entry(usr)["rdp"], rel=1e-9)
    r_rec = audit.plan_report(config.load(LASSO), source=None, method="exact")
    r_usr = audit.plan_report(
        config.load(LASSO, ["privacy.unit=user"]), source=None, method="exact"
    )
    assert "record level" in r_rec["accounting"] and "m_min = 250" in r_rec["accounting"]
    assert "user level" in r_usr["accounting"]
    assert r_rec["worst_pair"]["eps"] < r_usr["worst_pair"]["eps"]


def test_the_record_unit_calibrates_to_m_min_times_less_noise():
    """Calibration to the same target needs m_min times less noise (up to the tolerance term)."""
    rec = ap.make_plan(config.load(LASSO))
    usr = ap.make_plan(config.load(LASSO, ["privacy.unit=user"]))
    fam = family_of("admm")
    s_rec = fam.calibrate(config.load(LASSO), 5.0, method="exact", budget="worst")["sigma"]
    s_usr = fam.calibrate(
        config.load(LASSO, ["privacy.unit=user"]), 5.0, method="exact", budget="worst"
    )["sigma"]
    assert s_usr / s_rec == pytest.approx(usr.lipschitz / rec.lipschitz, rel=1e-3)


@pytest.mark.parametrize(
    "sets",
    [["protocol.name=admm-central", "protocol.hops=auto"], ["protocol.name=prox-sgd"]],
)
def test_the_record_unit_is_refused_where_it_is_not_accounted(sets):
    with pytest.raises(ConfigError, match="privacy.unit = 'record'"):
        config.load(LASSO, sets)
    with pytest.raises(ConfigError, match="privacy.unit must be"):
        config.load(LASSO, ["privacy.unit=shard"])


def test_effective_lipschitz_is_checked():
    with pytest.raises(ValueError, match="unit must be"):
        theorems.effective_lipschitz(1.0, unit="node")
    with pytest.raises(ValueError, match="m_min"):
        theorems.effective_lipschitz(1.0, unit="record", m_min=0)
    assert theorems.effective_lipschitz(2.0, unit="record", m_min=4) > 0.5


def test_paper_is_the_closed_form_and_flagged_where_below_the_proof():
    cfg = config.load(LASSO)
    plan = ap.make_plan(cfg)
    rep = audit.plan_report(cfg, source=0, method="paper")
    K = aa.contributions_bound(plan)
    rho = theorems.network_rho_closed(K, plan.lipschitz, plan.gamma, plan.sigma, plan.n)
    for x in rep["losses"]:
        assert x["factor"] == pytest.approx(rho / aa.units_of(plan).ldp_rho, rel=1e-12)
        assert x["eps"] < rep["ldp"]["eps"]
    exact = audit.plan_report(cfg, source=0, method="exact")["losses"][0]["eps"]
    assert rep["losses"][0]["eps"] < exact  # the printed form is below the proof's figure


def test_off_the_complete_graph_every_pair_gets_local_dp():
    cfg = cfg_of("graph.kind=ring")
    rep = audit.plan_report(cfg, source=0, method="exact")
    assert not ap.make_plan(cfg).complete_graph
    for x in rep["losses"]:
        assert x["eps"] == rep["ldp"]["eps"]
        assert "complete graph" in x["theorem"]


def test_no_allowed_order_gives_local_dp_and_says_why():
    # sigma <= 2 L gamma sqrt(alpha (alpha - 1)) for alpha close to 1 only when sigma is tiny
    cfg = cfg_of("privacy.sigma=0.0001")
    rep = audit.plan_report(cfg, source=0, method="exact")
    x = rep["losses"][0]
    assert x["eps"] == rep["ldp"]["eps"] or x["theorem"].startswith("8.12")
    assert x["eps"] <= rep["ldp"]["eps"]


def test_calibration_meets_the_target_and_the_plan_agrees():
    cfg = cfg_of()
    cal = family_of("admm").calibrate(cfg, 2.0, method="paper", budget="worst")
    assert cal["eps"] == pytest.approx(2.0, rel=1e-6)
    again = cfg_of(f"privacy.sigma={cal['sigma']!r}")
    rep = audit.plan_report(again, source=None, method="paper")
    assert rep["worst_pair"]["eps"] == pytest.approx(2.0, rel=1e-6)


def test_calibration_of_the_numerical_theorem():
    cfg = config.load(LASSO)
    cal = family_of("admm").calibrate(cfg, 2.0, method="exact", budget="worst")
    assert cal["eps"] == pytest.approx(2.0, rel=1e-6)
    rep = audit.plan_report(
        config.load(LASSO, [f"privacy.sigma={cal['sigma']!r}"]), source=None, method="exact"
    )
    assert rep["worst_pair"]["eps"] == pytest.approx(2.0, rel=1e-6)


def test_the_plans_placement_costs_at_least_any_placement_of_as_many_contributions():
    """The audit keeps the plan's entry for a source with no more contributions per token than
    the plan's count: the count placed where it costs most bounds every placement."""
    plan = ap.make_plan(cfg_of())
    K = aa.per_token_bound(plan)
    ldp = aa.ldp_entry(plan, K)
    worst = aa.theorem_entry(plan, "exact", ldp)["eps"]
    rng = np.random.default_rng(0)
    for k in (1, K // 2, K):
        steps = sorted(rng.choice(np.arange(1, plan.hops + 1), size=k, replace=False).tolist())
        got = aa.theorem_entry(plan, "exact", ldp, contributions=[steps])
        assert got["eps"] <= worst * (1 + 1e-12)


# ------------------------------------------------------------------------------ config


@pytest.mark.parametrize(
    ("sets", "key"),
    [
        (["protocol.gamma=0"], "protocol.gamma"),
        (["protocol.lam=1.5"], "protocol.lam"),
        (["protocol.clip=0"], "protocol.clip"),
        (["protocol.cap=3"], "protocol.cap"),
        (["model.kind=least-squares"], "model.kind"),
        (["model.l1=0"], "model.kind"),
        (["privacy.sensitivity=1"], "privacy.sensitivity"),
        (["protocol.users_per_round=2"], "protocol.users_per_round"),
        (["data.kind=breast_cancer"], "data.kind"),
    ],
)
def test_config_errors_name_the_source_and_the_key(sets, key):
    with pytest.raises(ConfigError) as exc:
        config.load(LASSO, sets)
    assert str(LASSO) in str(exc.value) and key in str(exc.value)


def test_admm_keys_are_refused_by_other_protocols():
    with pytest.raises(ConfigError, match="protocol.gamma"):
        config.load(EX / "complete-sum.toml", ["protocol.gamma=1"])
    with pytest.raises(ConfigError, match="model.l1"):
        config.load(EX / "complete-sgd.toml", ["model.l1=0.1"])


# ------------------------------------------------------------------------------ running


def test_simulator_keeps_each_users_block_and_releases_the_mean():
    cfg = cfg_of()
    plan = ap.make_plan(cfg)
    streams = seeds.PublicSeedStreams(7)
    trace = family_of("admm").simulate(cfg, plan, streams).traces[0]
    # Replay the walk by hand: z_hat is the mean of the blocks after every step.
    blocks = np.zeros((plan.n, plan.dim))
    zh = np.zeros(plan.dim)
    for s, v in enumerate(trace.holders):
        zh, blocks[v] = ap.apply_step(plan, cfg, v, 0, s, zh, blocks[v], streams)
        np.testing.assert_array_equal(trace.path[s], zh)
        np.testing.assert_allclose(zh, blocks.mean(axis=0), rtol=0, atol=1e-12)
    assert np.array_equal(trace.final, trace.path[-1])


@pytest.mark.parametrize("seed", range(2))
def test_fault_free_in_memory_run_equals_the_simulator_and_audit_equals_plan(seed, tmp_path):
    cfg = cfg_of("protocol.tokens=2")
    run = run_config(cfg, Faults(delay=(0.001, 0.3)), seed=seed)
    assert set(run.outcome.values()) == {"finished"}
    ref = family_of("admm").simulate(cfg, None, run.streams)
    finals = {}
    for res in run.results.values():
        finals.update({int(j): np.array(v) for j, v in res["walks"]["finals"].items()})
    assert sorted(finals) == [0, 1]
    for j, v in finals.items():
        assert np.array_equal(v, ref.traces[j].final)
    out = write_run_dir(cfg, run, tmp_path / "run")
    rep = audit.audit_run(out)
    assert rep["fault_free"] is True and rep["integrity"] == []
    plan = ap.make_plan(cfg)
    # Every user's contributions counted in the logs are the simulator's walk.
    counted = np.zeros(plan.n, dtype=int)
    for t in ref.traces:
        counted += np.bincount(t.holders, minlength=plan.n)
    assert rep["contributions"]["counted"] == counted.tolist()
    assert rep["contributions"]["above_plan"] == []
    _assert_audit_equals_plan(cfg, rep)


def _assert_audit_equals_plan(cfg, rep) -> None:
    plan = ap.make_plan(cfg)
    want = {m: audit.plan_report(cfg, source=0, method=m)["losses"][0] for m in aa.METHODS}
    checked = 0
    for o in rep["observers"]:
        for x in o["losses"]:
            assert x["eps"] == pytest.approx(want[x["method"]]["eps"], rel=1e-12), (o, x)
            # The logs' own figure, never above the plan here, is kept beside it.
            if "from_logs" in x:
                assert x["from_logs"]["eps"] <= x["eps"]
            checked += 1
    assert checked == plan.n * (plan.n - 1) * 2


def test_audit_never_lowers_a_user_that_contributed_more_than_the_plan_bound(tmp_path):
    # A walk of one user only: its count is far above the plan's binomial bound.
    cfg = cfg_of()
    plan = ap.make_plan(cfg)
    from coordinator_free.families.walk.accountant import RealisedWalk

    walks = [
        RealisedWalk(
            token=0,
            holders=np.zeros(plan.hops, dtype=np.int64),
            data=np.ones(plan.hops, dtype=bool),
            seen={},
        )
    ]
    steps, unknown = aa.realised_contributions(plan, walks)
    assert unknown == 0 and len(steps[0][0]) == plan.hops
    ldp = aa.ldp_entry(plan, plan.hops)
    real = aa.theorem_entry(plan, "exact", ldp, contributions=steps[0])
    planned = aa.planned_losses(cfg, plan, [1])[1][(0, "exact")]
    assert real["eps"] > planned["eps"]


def test_report_draws_the_objective_gap(tmp_path):
    from coordinator_free import report

    cfg = cfg_of()
    run = run_config(cfg, seed=0)
    out = write_run_dir(cfg, run, tmp_path / "run")
    from coordinator_free.families.admm import render

    rows = render.objective_path(cfg, ap.make_plan(cfg), out)
    assert [r["round"] for r in rows] == list(range(31))
    ref = family_of("admm").simulate(cfg, None, run.streams).traces[0]
    z = ap.z_of(ap.make_plan(cfg), ref.path[-1])
    assert rows[-1]["objective"] == pytest.approx(ap.objective_value(cfg, ap.make_plan(cfg), z))
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    audit.save_audit(out, audit.audit_run(out))
    files = report.render_report(out, html="no")["files"]
    assert any(f.endswith("objective_gap.png") for f in files)


def test_noise_free_walk_approaches_the_optimum():
    cfg = cfg_of("privacy.sigma=1e-9", "protocol.hops=600", "protocol.clip=100")
    sim = family_of("admm").simulate(cfg)
    plan = sim.plan
    fstar, _ = ap.optimum(cfg, plan.n)
    f0 = ap.objective_value(cfg, plan, np.zeros(plan.dim))
    f = ap.objective_value(cfg, plan, ap.z_of(plan, sim.traces[0].final))
    assert f - fstar < 1e-3 * (f0 - fstar)


@pytest.mark.parametrize("name", ["admm-central", "admm-federated", "prox-sgd"])
def test_one_process_baselines_run_and_report_their_central_guarantees(name, tmp_path):
    path = EX / ("prox-sgd-lasso.toml" if name == "prox-sgd" else "admm-lasso.toml")
    sets = ["graph.nodes=4", "protocol.rounds=5", "data.samples=200", "data.features=8"]
    if name != "prox-sgd":
        sets += [f"protocol.name={name}", "protocol.hops=auto", "privacy.unit=user"]
    out = tmp_path / "run"
    summary = cfree_run_json(path, sets, out)
    res = summary["results"]
    assert res["central"]["objective_gap"] >= -1e-9
    g = res["guarantees"]
    assert g["released"]["eps"] > 0
    cfg = config.load(out / "config.toml")
    plan = family_of(name).make_plan(cfg)
    if name == "admm-central":
        # Every record's own loss is clipped at L (displacement gamma L, not gamma L / N):
        # Theorem 8.7 with L N, the local guarantee of its 5 updates.
        rho = theorems.local_rho(5, plan.clip, plan.gamma, plan.sigma)
        assert rho == pytest.approx(
            theorems.central_rho(5, plan.clip * plan.records, plan.gamma, plan.sigma, plan.records)
        )
        assert g["released"]["rdp"] == pytest.approx(plan.alpha * rho, rel=1e-12)
    if name == "admm-federated":
        assert g["released"]["eps"] <= g["local"]["eps"]
    rep = json.loads((out / "audit.json").read_text())
    assert rep["central"] is True
    assert all(
        x["eps"] == pytest.approx(g["released"]["eps"])
        for o in rep["observers"]
        for x in o["losses"]
    )
    ls = subprocess.run(
        [sys.executable, "-m", "coordinator_free", "ls", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ls.returncode == 0, ls.stderr
    assert name in ls.stdout and "central" in ls.stdout


# ------------------------------------------------------------------------------ real peers


def test_real_peers_equal_the_simulator_bit_for_bit_and_audit_equals_plan(tmp_path):
    out = tmp_path / "run"
    sets = ["graph.nodes=6", "protocol.hops=30", "data.samples=240", "data.features=8"]
    summary = cfree_run_json(LASSO, sets, out)
    assert summary["failed"] == [] and summary["completed_as_planned"]
    assert summary["simulator_max_abs_diff"] == 0
    cfg = config.load(out / "config.toml")
    plan = ap.make_plan(cfg)
    ref = family_of("admm").simulate_as_peers(cfg, None, seeds.streams_of_run(out, plan.n))
    (t,) = summary["results"]["tokens"]
    assert np.array_equal(np.asarray(t["final"]), ref.traces[0].final)
    assert t["end"] == {"how": "completed", "at": ref.traces[0].holders[-1], "step": plan.hops}
    assert math.isfinite(t["objective_gap"])
    # The hops came from the peers' secret streams, not the public seed.
    assert family_of("admm").simulate(cfg).traces[0].holders != ref.traces[0].holders
    rep = json.loads((out / "audit.json").read_text())
    assert rep["fault_free"] is True
    _assert_audit_equals_plan(cfg, rep)
    y = summary["yardstick"]
    assert y["ratio"] is not None and not y["far"]
