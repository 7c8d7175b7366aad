"""Colluding observers in Muffliato averaging (`cfree plan --observers`, `cfree audit
--observers`): the coalition's exact loss equals a brute-force computation on the stacked rows
of what its members saw, for the plan, the public dropout schedule and in-memory runs with
faults; the audit equals the plan on fault-free runs; a member without a log, or a damaged log,
never lowers a loss below the plan's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from memrun import write_run_dir

import coordinator_free
from coordinator_free import config
from coordinator_free.engine.memnet import Faults
from coordinator_free.families import family_of
from coordinator_free.families.averaging import coalition
from coordinator_free.inmemory import run_config
from coordinator_free.privacy import muffliato as acct
from tests import gossipviews as accountant
from tests.gossipviews import replay

DEADLINE = 0.05


def _brute(steps, members, received) -> np.ndarray:
    """The projector diagonal of span{e_a} + every row a member saw, by SVD (small n)."""
    coeffs = acct.realised_coefficients(steps)
    n = coeffs.shape[1]
    rows = [np.eye(n)[a] for a in members]
    rows += [coeffs[t][x] for t, x in sorted({m for a in members for m in received[a]})]
    u, s, _ = np.linalg.svd(np.array(rows).T, full_matrices=False)
    q = u[:, s > 1e-9 * s[0]]
    return np.einsum("ij,ij->i", q, q)


GRAPHS = {
    "ring-9": ["graph.kind=ring", "graph.nodes=9", "protocol.steps=3"],
    "grid-3x4": ["graph.kind=grid", "graph.rows=3", "graph.cols=4", "protocol.steps=3"],
    "er-10": ["graph.kind=erdos_renyi", "graph.nodes=10", "graph.p=0.3", "protocol.steps=2"],
}
COALITIONS = [[0], [0, 4], [1, 2, 7]]


@pytest.mark.parametrize("members", COALITIONS, ids=str)
@pytest.mark.parametrize("name", GRAPHS)
def test_plan_and_fault_free_audit_equal_the_brute_force_joint_view(name, members, tmp_path):
    cfg = config.load(None, GRAPHS[name])
    plan = family_of("muffliato").make_plan(cfg)
    steps = acct.fault_free_steps(plan.W, plan.steps, plan.accelerated, plan.gamma)
    received = {a: acct.fault_free_received(plan.W, a, plan.steps) for a in members}
    want = _brute(steps, members, received)
    planned = coalition.plan_report(cfg, plan, members)
    got = {r["source"]: r["factor"] for r in planned["losses"]}
    assert sorted(got) == [u for u in range(plan.n) if u not in members]
    assert all(abs(got[u] - want[u]) < 1e-8 for u in got), (got, want)
    # Audit of a fault-free in-memory run: the plan's numbers.
    run = write_run_dir(cfg, run_config(cfg, seed=2), tmp_path / "run")
    audited = coalition.audit_report(run, cfg, plan, members)
    assert audited["fault_free"] and audited["basis"] == "logs"
    assert [r["source"] for r in audited["losses"]] == [r["source"] for r in planned["losses"]]
    assert [r["factor"] for r in audited["losses"]] == pytest.approx(
        [r["factor"] for r in planned["losses"]], abs=1e-9
    )
    # Every row carries the coalition, the source and the three numbers.
    assert set(audited["losses"][0]) >= {"observers", "source", "factor", "rdp", "eps"}
    assert audited["losses"][0]["observers"] == sorted(members)


def test_one_member_is_the_single_observer_plan():
    cfg = config.load(None, GRAPHS["grid-3x4"])
    plan = family_of("muffliato").make_plan(cfg)
    single = accountant.plan_factors(plan, "exact", observers=[5])[0]
    rep = coalition.plan_report(cfg, plan, [5])
    for r in rep["losses"]:
        assert r["factor"] == pytest.approx(single[r["source"]], abs=1e-10)


@pytest.mark.parametrize("spec", ["drop:0.15", "cut:3@1", "delay:50", "dropout:0.3", "kill:3@1"])
def test_audit_with_faults_equals_the_brute_force_on_the_realised_schedule(spec, tmp_path):
    cfg = config.load(
        None,
        ["graph.kind=ring", "graph.nodes=12", "protocol.steps=3", f"network.deadline_s={DEADLINE}"],
        [spec],
    )
    plan = family_of("muffliato").make_plan(cfg)
    members = [0, 1]
    run = write_run_dir(cfg, run_config(cfg, Faults.of_config(cfg), seed=6), tmp_path / "run")
    rp = replay(run, plan)
    audited = coalition.audit_report(run, cfg, plan, members)
    # Dropout is public and planned: a run that follows it is fault-free, on a schedule that
    # is not one fixed W all the same.
    assert audited["fault_free"] == spec.startswith("dropout")
    want = _brute(rp.steps, members, {a: sorted(rp.received[a]) for a in members})
    got = np.array([r["factor"] for r in audited["losses"]])
    want = np.delete(want, members)
    planned = np.delete(coalition.plan_factors(plan, members), members)
    assert len(set(np.round(got, 6))) > 1  # some sources hidden, some not
    if audited["complete"]:
        assert np.allclose(got, want, atol=1e-8)
    else:  # a damaged or unfinished log: never below the plan
        assert np.all(got >= np.maximum(want, planned) - 1e-8)
    if spec == "delay:50":  # every value late: no node mixed, the coalition saw only 2 and 11
        assert audited["complete"] and np.all(got <= planned + 1e-12) and got.sum() == 2


def test_public_dropout_plan_equals_the_brute_force_on_the_planned_schedule():
    cfg = config.load(None, [*GRAPHS["ring-9"], "protocol.steps=4"], ["dropout:0.3"])
    plan = family_of("muffliato").make_plan(cfg)
    assert plan.dropped
    members = [2, 6]
    received = {
        a: [(t, w) for t in range(plan.steps) for w in plan.partners_at(a, t)] for a in members
    }
    want = _brute(accountant.planned_schedule(plan), members, received)
    got = coalition.plan_factors(plan, members)
    assert np.allclose(got, want, atol=1e-8)


def test_a_member_without_a_log_puts_every_source_at_local_dp(tmp_path):
    cfg = config.load(None, GRAPHS["ring-9"])
    plan = family_of("muffliato").make_plan(cfg)
    run = write_run_dir(cfg, run_config(cfg, seed=2), tmp_path / "run")
    (run / "logs" / "node-4.vlog").unlink()
    rep = coalition.audit_report(run, cfg, plan, [0, 4])
    assert rep["basis"] == "worst-case" and not rep["complete"]
    assert all(r["factor"] == 1.0 for r in rep["losses"])
    assert "member(s) [4] have no usable view log" in rep["notes"][0]["message"]


def test_a_truncated_member_log_never_lowers_the_loss_below_the_plan(tmp_path):
    cfg = config.load(None, GRAPHS["ring-9"])
    plan = family_of("muffliato").make_plan(cfg)
    run = write_run_dir(cfg, run_config(cfg, seed=2), tmp_path / "run")
    log = run / "logs" / "node-0.vlog"
    log.write_bytes(log.read_bytes()[: len(log.read_bytes()) // 3])
    rep = coalition.audit_report(run, cfg, plan, [0, 4])
    planned = coalition.plan_factors(plan, [0, 4])
    assert rep["integrity"] and not rep["complete"]
    for r in rep["losses"]:
        assert r["factor"] >= planned[r["source"]] - 1e-12


def test_the_upper_bound_is_above_the_exact_coalition_loss(tmp_path):
    cfg = config.load(
        None, [*GRAPHS["grid-3x4"], "protocol.steps=4", f"network.deadline_s={DEADLINE}"],
        ["drop:0.2"],
    )  # fmt: skip
    plan = family_of("muffliato").make_plan(cfg)
    run = write_run_dir(cfg, run_config(cfg, Faults.of_config(cfg), seed=1), tmp_path / "run")
    rp = replay(run, plan)
    members = [0, 11]
    rec = {a: sorted(rp.received[a]) for a in members}
    exact = acct.coalition_exact_factors(rp.steps, members, rec)
    upper = acct.coalition_upper_factors(plan.W, rp.steps, members, rec)
    assert np.all(upper >= exact - 1e-9)


def _cli(*args):
    from coordinator_free.cli import main

    return main([str(a) for a in args])


def test_cli_plan_and_audit_agree_and_other_families_are_refused(tmp_path, capsys):
    cfg = config.load(None, GRAPHS["ring-9"])
    run = write_run_dir(cfg, run_config(cfg, seed=2), tmp_path / "run")
    assert _cli("audit", run, "--observers", "0,4", "--json") == 0
    audited = json.loads(capsys.readouterr().out)
    assert _cli("plan", run / "config.toml", "--observers", "4,0", "--json") == 0
    planned = json.loads(capsys.readouterr().out)
    assert audited["observers"] == planned["observers"] == [0, 4]
    assert [r["factor"] for r in audited["losses"]] == pytest.approx(
        [r["factor"] for r in planned["losses"]], abs=1e-9
    )
    assert _cli("audit", run, "--observers", "0,4") == 0
    text = capsys.readouterr().out
    assert "from the view logs of" in text and "basis: logs" in text
    assert not (run / "audit.json").exists()  # a coalition audit writes nothing
    ring_sum = Path(coordinator_free.__file__).resolve().parents[1] / "examples" / "ring-sum.toml"
    assert (
        _cli("plan", ring_sum, "--set", "graph.nodes=8", "--coalition-growth", "2", "--json") == 0
    )
    grow = json.loads(capsys.readouterr().out)["growth"]
    # One observer learns at most local DP on the ring; two neighbours of a node isolate its
    # noiseless contribution.
    assert grow[0]["eps_max"] < float("inf") and grow[1]["eps_max"] == float("inf")
    assert _cli("audit", run, "--observers", "0,x") == 2
    assert "expected node ids separated by commas" in capsys.readouterr().err


def test_coalition_growth_rows_are_the_coalitions_own_losses():
    cfg = config.load(
        None, ["graph.kind=erdos_renyi", "graph.nodes=20", "graph.p=0.15", "protocol.steps=3"]
    )
    plan = family_of("muffliato").make_plan(cfg)
    deg = family_of("muffliato").coalition_growth(cfg, plan, 4, "degree")
    greedy = family_of("muffliato").coalition_growth(cfg, plan, 4, "greedy")
    order = sorted(range(plan.n), key=lambda v: (-plan.graph.degree(v), v))
    for i, row in enumerate(deg["growth"]):
        assert row["observers"] == sorted(order[: i + 1])
    for rep in (deg, greedy):
        prev = None
        for row in rep["growth"]:
            f = acct.coalition_factors(plan.W, plan.steps, row["observers"])
            outside = np.delete(f, row["observers"])
            assert row["factor_mean"] == pytest.approx(outside.mean())
            assert row["fully_exposed"] == int(np.sum(outside >= 1 - 1e-9))
            assert row["sources"] == plan.n - row["size"]
            if prev is not None:  # each coalition contains the previous one: no source it
                assert set(prev) < set(row["observers"])  # saw becomes less exposed
                g = acct.coalition_factors(plan.W, plan.steps, prev)
                assert np.all(f >= g - 1e-9)
            prev = row["observers"]
    # The greedy first member is the single observer with the largest mean loss.
    singles = [
        np.delete(acct.coalition_factors(plan.W, plan.steps, [v]), v).mean() for v in range(plan.n)
    ]
    assert greedy["growth"][0]["factor_mean"] == pytest.approx(max(singles))
    assert greedy["growth"][0]["factor_mean"] >= deg["growth"][0]["factor_mean"] - 1e-12


def test_cli_coalition_growth(tmp_path, capsys):
    ring = Path(coordinator_free.__file__).resolve().parents[1] / "examples" / "muffliato-ring.toml"
    assert _cli("plan", ring, "--set", "graph.nodes=12", "--coalition-growth", "3", "--json") == 0
    rep = json.loads(capsys.readouterr().out)
    assert [r["size"] for r in rep["growth"]] == [1, 2, 3] and rep["join"] == "greedy"
    assert _cli("plan", ring, "--coalition-growth", "3", "--join", "degree") == 0
    assert "the highest-degree nodes join first" in capsys.readouterr().out
    assert _cli("plan", ring, "--coalition-growth", "8") == 2
    assert "expected 1..7 (n = 8)" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ DECOR

EX = Path(coordinator_free.__file__).resolve().parents[1] / "examples"


def _decor(*extra):
    cfg = config.load(EX / "decor-ring.toml", ["graph.nodes=6", "protocol.rounds=4", *extra])
    return cfg, family_of("decor").make_plan(cfg)


def _decor_brute(plan, members) -> np.ndarray:
    """R (Delta^2/2)[Sigma^-1]_uu over the honest users, Sigma = sigma^2 I + sigma_cor^2 B B^T
    with B the incidence of the honest-honest edges (a term shared with a member is known to
    the coalition and subtracted), over one local-DP round."""
    honest = [v for v in range(plan.n) if v not in members]
    pos = {v: i for i, v in enumerate(honest)}
    cols = []
    for i, j in plan.graph.edges():
        if i in pos and j in pos:
            c = np.zeros(len(honest))
            c[pos[i]], c[pos[j]] = 1.0, -1.0
            cols.append(c)
    b = np.array(cols).T if cols else np.zeros((len(honest), 0))
    cov = plan.sigma**2 * np.eye(len(honest)) + plan.sigma_cor**2 * b @ b.T
    rho = plan.sensitivity**2 / 2 * np.diag(np.linalg.inv(cov))
    ldp = plan.sensitivity**2 / (2 * plan.sigma**2)
    out = np.zeros(plan.n)
    out[honest] = plan.rounds * rho / ldp
    return out


@pytest.mark.parametrize("members", [[0], [0, 3], [1, 2, 4]], ids=str)
def test_decor_coalition_plan_and_audit_equal_the_brute_force(members, tmp_path):
    cfg, plan = _decor()
    want = _decor_brute(plan, members)
    planned = family_of("decor").coalition_plan(cfg, plan, members)
    got = {r["source"]: r["factor"] for r in planned["losses"]}
    assert sorted(got) == [u for u in range(plan.n) if u not in members]
    assert all(got[u] == pytest.approx(want[u], rel=1e-9) for u in got)
    assert planned["ldp"]["factor"] == plan.rounds
    run = write_run_dir(cfg, run_config(cfg, seed=2), tmp_path / "run")
    audited = family_of("decor").coalition_audit(run, cfg, plan, members)
    assert audited["fault_free"] and audited["basis"] == "logs"
    assert [r["factor"] for r in audited["losses"]] == pytest.approx(
        [r["factor"] for r in planned["losses"]], rel=1e-9
    )


def test_decor_single_members_are_the_pairwise_table_and_their_worst_is_secldp_q1():
    from coordinator_free.families.decor import accountant as dacc

    cfg, plan = _decor("privacy.collusion=1")
    pairwise = dacc.plan_pairwise(plan, "exact")
    per_member = np.array(
        [
            [r["factor"] for r in family_of("decor").coalition_plan(cfg, plan, [v])["losses"]]
            for v in range(plan.n)
        ]
    )
    for v in range(plan.n):
        assert per_member[v] == pytest.approx(np.delete(pairwise[v], v), rel=1e-9)
    # q-collusion: the guarantee at collusion 1 is the worst single curious user.
    rep = family_of("decor").plan_report(cfg, plan, source=None, method="exact")
    ldp_rho = plan.sensitivity**2 / (2 * plan.sigma**2)
    worst = max(float(per_member.max()) * ldp_rho, 0.0)
    assert rep["secldp"]["exact"]["rho"] == pytest.approx(worst, rel=1e-9)


def test_decor_coalition_audit_with_a_missing_member_log_is_never_below_the_plan(tmp_path):
    cfg, plan = _decor()
    run = write_run_dir(cfg, run_config(cfg, seed=2), tmp_path / "run")
    (run / "logs" / "node-3.vlog").unlink()
    rep = family_of("decor").coalition_audit(run, cfg, plan, [0, 3])
    planned = family_of("decor").coalition_plan(cfg, plan, [0, 3])
    assert not rep["complete"]
    for a, b in zip(rep["losses"], planned["losses"], strict=True):
        assert a["factor"] >= b["factor"] - 1e-9


# ------------------------------------------------------------------------- learning protocols


def _mr_brute(sched, received, members, n):
    """Q^(u) of a coalition over rounds, brute force: the coefficient row of every message any
    member got on all R n gradient noises, member columns dropped, projector by SVD."""
    R, K = len(sched), len(sched[0])
    h = np.zeros((n, R * n))
    h[:, :n] = np.eye(n)
    rows = []
    seen = sorted({m for a in members for m in received[a]})
    for r in range(R):
        cs = [h]
        for k, (m, g) in enumerate(sched[r]):
            nxt = m @ cs[-1]
            if k >= 1 and g != 1.0:
                nxt = g * nxt + (1.0 - g) * cs[-2]
            cs.append(nxt)
        rows += [cs[k][x] for rr, k, x in seen if rr == r]
        h = cs[K].copy()
        if r + 1 < R:
            h[:, (r + 1) * n : (r + 2) * n] += np.eye(n)
    keep = [j for j in range(R * n) if j % n not in members]
    a = np.array(rows)[:, keep]
    _, s, vt = np.linalg.svd(a, full_matrices=False)
    v = vt[s > 1e-9 * s[0]].T
    p = v @ v.T
    q = np.zeros((n, R, R))
    pos = {j: i for i, j in enumerate(keep)}
    for u in range(n):
        if u in members:
            continue
        idx = [pos[s * n + u] for s in range(R)]
        q[u] = p[np.ix_(idx, idx)]
    return q


def _single_member_and_fault_free_audit(fam, cfg, plan, members, planned, tmp_path, tol):
    """One member's coalition plan is the single-observer plan; a fault-free in-memory run's
    coalition audit is the coalition plan (both to ``tol``)."""
    if len(members) == 1:
        single = accountant.plan_factors(plan, "exact", observers=members)[0]
        for r in planned["losses"]:
            assert r["factor"] == pytest.approx(single[r["source"]], abs=tol)
    run = write_run_dir(cfg, run_config(cfg, seed=2), tmp_path / "run")
    audited = fam.coalition_audit(run, cfg, plan, members)
    assert audited["fault_free"] and audited["basis"] == "logs"
    assert [r["factor"] for r in audited["losses"]] == pytest.approx(
        [r["factor"] for r in planned["losses"]], abs=tol
    )


LEARN = {
    "dsgd-ring": (EX / "dsgd-breast-cancer.toml", ["graph.kind=ring", "graph.nodes=8", "protocol.rounds=3"]),
    "muffliato-gd-ring": (
        EX / "muffliato-gd-breast-cancer.toml",
        ["graph.kind=ring", "graph.nodes=8", "protocol.rounds=3", "protocol.gossip_steps=2"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("members", [[0], [0, 4], [1, 2]], ids=str)
@pytest.mark.parametrize("name", LEARN)
def test_learning_coalition_plan_and_audit_equal_the_brute_force(name, members, tmp_path):
    from coordinator_free.privacy import multiround

    path, sets = LEARN[name]
    cfg = config.load(path, [*sets, f"network.deadline_s={DEADLINE}"])
    fam = family_of(cfg.protocol.name)
    plan = fam.make_plan(cfg)
    K = plan.gossip_steps
    one = [(plan.W, g) for _, g in acct.fault_free_steps(plan.W, K, plan.accelerated, plan.gamma)]
    sched = [list(one) for _ in range(plan.rounds)]
    received = {
        a: [(r, k, x) for r in range(plan.rounds) for k in range(K) for x in plan.neighbours(a)]
        for a in members
    }
    want = _mr_brute(sched, received, members, plan.n)
    got = multiround.coalition_joint_factors(
        plan.W, plan.rounds, K, plan.accelerated, members,
        gamma=plan.gamma if plan.accelerated else None,
    )  # fmt: skip
    for u in range(plan.n):
        if u not in members:
            assert np.allclose(got.q[u], want[u], atol=1e-8), u
    planned = fam.coalition_plan(cfg, plan, members)
    assert [r["factor"] for r in planned["losses"]] == pytest.approx(
        [float(got.upper[r["source"]]) for r in planned["losses"]]
    )
    _single_member_and_fault_free_audit(fam, cfg, plan, members, planned, tmp_path, 1e-9)


def test_learning_coalition_audit_with_faults_equals_the_brute_force(tmp_path):
    path, sets = LEARN["muffliato-gd-ring"]
    cfg = config.load(path, [*sets, f"network.deadline_s={DEADLINE}"], ["delay:50"])
    fam = family_of(cfg.protocol.name)
    plan = fam.make_plan(cfg)
    run = write_run_dir(cfg, run_config(cfg, Faults.of_config(cfg), seed=4), tmp_path / "run")
    rp = replay(run, plan)
    members = [0, 4]
    audited = fam.coalition_audit(run, cfg, plan, members)
    assert not audited["fault_free"] and audited["complete"]
    K = plan.gossip_steps
    sched = [rp.steps[r * K : (r + 1) * K] for r in range(plan.rounds)]
    received = {a: [(t // K, t % K, w) for t, w in sorted(rp.received[a])] for a in members}
    q = _mr_brute(sched, received, members, plan.n)
    for row in audited["losses"]:  # the reported factor bounds the exact sup over |a_s| <= 1
        qu = q[row["source"]]
        signs = np.array(np.meshgrid(*[[-1.0, 1.0]] * plan.rounds)).reshape(plan.rounds, -1)
        sup = float(np.max(np.einsum("is,ij,js->s", signs, qu, signs)))
        assert sup - 1e-8 <= row["factor"] <= plan.rounds + 1e-12
        assert (
            row["factor"] <= min(plan.rounds * np.linalg.eigvalsh(qu)[-1], np.abs(qu).sum()) + 1e-8
        )


# ------------------------------------------------------------------------- randomized gossip


def _pairwise_brute(n, exchanges, members, received):
    c = np.eye(n)
    seen = {m for a in members for m in received[a]}
    rows = [np.eye(n)[a] for a in members]
    for t, (a, b, ua, ub) in enumerate(exchanges):
        rows += [c[w].copy() for tt, w in sorted(seen) if tt == t]
        avg = 0.5 * (c[a] + c[b])
        if ua:
            c[a] = avg
        if ub:
            c[b] = avg.copy()
    u, s, _ = np.linalg.svd(np.array(rows).T, full_matrices=False)
    q = u[:, s > 1e-9 * s[0]]
    return np.einsum("ij,ij->i", q, q)


@pytest.mark.parametrize("members", [[0], [0, 4], [1, 2, 5]], ids=str)
def test_randomized_coalition_plan_and_audit_equal_the_brute_force(members, tmp_path):
    from coordinator_free.families.randomized import protocol as rg

    cfg = config.load(
        EX / "randomized-gossip-ring.toml", ["graph.nodes=8", f"network.deadline_s={DEADLINE}"]
    )
    fam = family_of(cfg.protocol.name)
    plan = fam.make_plan(cfg)
    exchanges = [(e.a, e.b, True, True) for e in plan.edges]
    received = {a: rg.fault_free_received(plan, a) for a in members}
    want = _pairwise_brute(plan.n, exchanges, members, received)
    planned = fam.coalition_plan(cfg, plan, members)
    for r in planned["losses"]:
        assert r["factor"] == pytest.approx(want[r["source"]], abs=1e-9)
    if len(members) < 3:  # some sources partly hidden
        assert len({round(r["factor"], 6) for r in planned["losses"]}) > 1
    _single_member_and_fault_free_audit(fam, cfg, plan, members, planned, tmp_path, 1e-12)


# ------------------------------------------------------------------------------ token walks


def _walk_sum_brute(plan, walks, members):
    """The coalition's Gaussian view of every running sum, built explicitly: tau_r for every r
    it observed, its members' steps subtracted; covariance sum of the other steps' noise
    variances, mean shift of u the count of u's data steps before r; F = m^T Sigma^+ m (inf
    when m leaves the range of Sigma). Tokens are independent, so their factors add."""
    from coordinator_free.families.walk import coalition as wc

    F = np.zeros(plan.n)
    for w in walks:
        obs = wc._observations(w, members)
        var = plan.noise_vars(w.length)
        other = ~np.isin(w.holders, members)
        cov = np.array(
            [[var[: min(r, q)][other[: min(r, q)]].sum() for q in obs] for r in obs], dtype=float
        )
        for u in range(plan.n):
            if u in members:
                continue
            mine = (w.holders == u) & w.data
            m = np.array([mine[:r].sum() for r in obs], dtype=float)
            if not m.any():
                continue
            x, *_ = np.linalg.lstsq(cov, m, rcond=None)
            if np.linalg.norm(cov @ x - m) > 1e-9 * max(1.0, np.linalg.norm(m)):
                F[u] = np.inf
            else:
                F[u] += float(m @ x)
    return F


WALK_SUMS = {
    "ring-sum": (EX / "ring-sum.toml", ["graph.nodes=6", "protocol.cycles=2"]),
    "ring-sum-distributed": (
        EX / "ring-sum.toml",
        ["graph.nodes=6", "protocol.cycles=2", "protocol.distributed_noise=true"],
    ),
    "complete-sum": (EX / "complete-sum.toml", ["graph.nodes=5", "protocol.hops=30"]),
}


@pytest.mark.parametrize("members", [[0], [0, 2], [1, 3, 4]], ids=str)
@pytest.mark.parametrize("name", WALK_SUMS)
def test_walk_sum_coalition_plan_and_audit_equal_the_explicit_gaussian_view(
    name, members, tmp_path
):
    from coordinator_free.families.walk import accountant as wa

    path, sets = WALK_SUMS[name]
    cfg = config.load(path, [*sets, f"network.deadline_s={DEADLINE}"])
    fam = family_of(cfg.protocol.name)
    plan = fam.make_plan(cfg)
    walks = wa.sampled_walks(cfg, plan)
    want = _walk_sum_brute(plan, walks, members)
    planned = fam.coalition_plan(cfg, plan, members)
    if plan.ring:  # the ring's walk is fixed: the plan is the coalition's view of it
        for r in planned["losses"]:
            if np.isinf(want[r["source"]]):
                assert r["factor"] == np.inf and r["eps"] == np.inf
            else:
                assert r["factor"] == pytest.approx(want[r["source"]], rel=1e-9, abs=1e-12)
        if len(members) == 1:  # one member: the single-observer accountant
            single = wa.realised_factors(plan, walks, members[0])
            for r in planned["losses"]:
                assert r["factor"] == pytest.approx(single[r["source"]], rel=1e-12)
    else:  # off the ring the plan is the guarantee for every walk, the sampled one included
        g = wa.ldp_baseline(plan)
        for r in planned["losses"]:
            assert r["factor"] == g["factor"] and r["eps"] == g["eps"]
            assert want[r["source"]] <= r["factor"]
    # The audit: the same on the walks the logs show (on a complete graph each hop is drawn
    # by its holder, so the run's walk is not the public sample; on the ring it is the plan's).
    run = write_run_dir(cfg, run_config(cfg, seed=cfg.run.seed), tmp_path / "run")
    audited = fam.coalition_audit(run, cfg, plan, members)
    assert audited["fault_free"] and audited["basis"] == "logs"
    rp = wa.replay(run, plan, [])
    seen = _walk_sum_brute(plan, rp.walks, members)
    for r in audited["losses"]:
        if np.isinf(seen[r["source"]]):
            assert r["eps"] == np.inf
        else:
            assert r["factor"] == pytest.approx(seen[r["source"]], rel=1e-9, abs=1e-12)
    if plan.ring:
        assert [r["eps"] for r in audited["losses"]] == pytest.approx(
            [r["eps"] for r in planned["losses"]], rel=1e-9
        )
    else:  # the run's own walk costs at most the plan's guarantee
        for a, p in zip(audited["losses"], planned["losses"], strict=True):
            assert a["source"] == p["source"] and a["eps"] <= p["eps"]


def test_two_colluders_around_a_ring_node_recover_its_contribution():
    """Ring summation with the noise added once: the window between the two neighbours of a
    node holds its contribution alone, so the pair learns it exactly (eps inf, above local DP);
    with noise distributed over the hops it stays finite."""
    path, sets = WALK_SUMS["ring-sum"]
    cfg = config.load(path, sets)
    fam = family_of(cfg.protocol.name)
    rep = fam.coalition_plan(cfg, fam.make_plan(cfg), [0, 2])
    row = next(r for r in rep["losses"] if r["source"] == 1)
    assert row["eps"] == np.inf
    cfg = config.load(path, [*sets, "protocol.distributed_noise=true"])
    rep = fam.coalition_plan(cfg, fam.make_plan(cfg), [0, 2])
    assert np.isfinite(next(r for r in rep["losses"] if r["source"] == 1)["eps"])


@pytest.mark.parametrize(
    "path, sets",
    [
        (EX / "ring-histogram.toml", ["graph.nodes=5", "protocol.cycles=2"]),
        (EX / "complete-sgd.toml", ["graph.nodes=5", "protocol.hops=40"]),
    ],
    ids=["ring-histogram", "complete-sgd"],
)
def test_walk_histogram_and_sgd_coalitions(path, sets, tmp_path):
    from coordinator_free.families.walk import accountant as wa

    cfg = config.load(path, [*sets, f"network.deadline_s={DEADLINE}"])
    fam = family_of(cfg.protocol.name)
    plan = fam.make_plan(cfg)
    walks = wa.sampled_walks(cfg, plan)
    for v in range(plan.n):  # one member: the single-observer accountant
        single = wa.exact_losses(plan, walks, [v])[v]
        rep = fam.coalition_plan(cfg, plan, [v])
        single_plan = wa.planned_losses(cfg, plan, [v])[v]
        for r in rep["losses"]:
            assert r["eps"] == pytest.approx(single_plan[(r["source"], "exact")]["eps"], rel=1e-12)
            if plan.ring:
                assert r["eps"] == pytest.approx(single[r["source"]]["eps"], rel=1e-12)
            else:  # the guarantee for every walk, at least the sampled walk's loss
                assert r["eps"] >= single[r["source"]]["eps"]
    run = write_run_dir(cfg, run_config(cfg, seed=cfg.run.seed), tmp_path / "run")
    planned = fam.coalition_plan(cfg, plan, [0, 2])
    audited = fam.coalition_audit(run, cfg, plan, [0, 2])
    assert audited["fault_free"]
    rp = wa.replay(run, plan, [])
    from coordinator_free.families.walk import coalition as wc

    on_logs = wc.losses(plan, rp.walks, [0, 2])
    assert [r["eps"] for r in audited["losses"]] == pytest.approx(
        [on_logs[r["source"]]["eps"] for r in audited["losses"]], rel=1e-12
    )
    if plan.ring:
        assert [r["eps"] for r in audited["losses"]] == pytest.approx(
            [r["eps"] for r in planned["losses"]], rel=1e-9
        )
    else:  # the run's own walk costs at most the plan's guarantee
        for a, p in zip(audited["losses"], planned["losses"], strict=True):
            assert a["source"] == p["source"] and a["eps"] <= p["eps"]
    (run / "logs" / "node-2.vlog").unlink()
    worst = fam.coalition_audit(run, cfg, plan, [0, 2])
    assert worst["basis"] == "worst-case"
    for a, b in zip(worst["losses"], planned["losses"], strict=True):
        assert a["eps"] >= b["eps"] - 1e-12


# ----------------------------------------------------------------------- damaged logs, fuzzed

FUZZ = {
    "muffliato": (None, ["graph.kind=ring", "graph.nodes=9", "protocol.steps=3"], [0, 4]),
    "randomized": (EX / "randomized-gossip-ring.toml", ["graph.nodes=8"], [0, 4]),
    "dsgd": (EX / "dsgd-breast-cancer.toml", ["graph.nodes=8", "protocol.rounds=3"], [0, 4]),
    "decor": (EX / "decor-ring.toml", ["graph.nodes=6", "protocol.rounds=4"], [0, 3]),
    "ring-sum": (EX / "ring-sum.toml", ["graph.nodes=6", "protocol.cycles=2"], [0, 2]),
    "complete-sum": (EX / "complete-sum.toml", ["graph.nodes=5", "protocol.hops=30"], [0, 2]),
}


def _eps(rep) -> dict[int, float]:
    return {r["source"]: r["eps"] for r in rep["losses"]}


@pytest.mark.parametrize("name", FUZZ)
def test_a_coalition_audit_of_damaged_logs_never_fails_nor_reports_less(name, tmp_path):
    """Damaged and forged logs (the auditor fuzzer's mutations, any node's log): the coalition
    audit returns, and either reports exactly what the intact logs give, or says the logs are
    not intact and reports no source below the coalition's plan."""
    from logfuzz import Mutator

    path, sets, members = FUZZ[name]
    cfg = config.load(path, [*sets, f"network.deadline_s={DEADLINE}"])
    fam = family_of(cfg.protocol.name)
    plan = fam.make_plan(cfg)
    run = write_run_dir(cfg, run_config(cfg, seed=cfg.run.seed), tmp_path / "run")
    base = _eps(fam.coalition_audit(run, cfg, plan, members))
    floor = _eps(fam.coalition_plan(cfg, plan, members))
    mut = Mutator(run, seed=11)
    flagged = 0
    for _ in range(30):
        case = mut.case()
        log = run / "logs" / f"node-{case.node}.vlog"
        if case.data is None:
            log.unlink()
        else:
            log.write_bytes(case.data)
        try:
            rep = fam.coalition_audit(run, cfg, plan, members)
        finally:
            log.write_bytes(mut.raw[case.node])
        got = _eps(rep)
        if rep["complete"] and rep["basis"] == "logs":
            assert got == pytest.approx(base, rel=1e-9), case.what
        else:
            flagged += 1
            for u, e in got.items():
                assert e >= floor[u] * (1 - 1e-9), (case.what, u, e, floor[u])
    assert flagged > 0


def test_learning_coalition_on_per_round_graphs_is_the_single_observer_joint_view_for_one():
    cfg = config.load(
        EX / "muffliato-gd-breast-cancer.toml",
        ["graph.kind=erdos_renyi", "graph.nodes=8", "graph.p=0.5", "graph.resample=true",
         "protocol.rounds=3", "protocol.gossip_steps=2"],
    )  # fmt: skip
    fam = family_of(cfg.protocol.name)
    plan = fam.make_plan(cfg)
    assert plan.time_varying
    single = accountant.plan_factors(plan, "exact", observers=[0])[0]
    rep = fam.coalition_plan(cfg, plan, [0])
    assert [r["factor"] for r in rep["losses"]] == pytest.approx(
        list(np.delete(single, 0)), abs=1e-9
    )
    pair = {r["source"]: r["factor"] for r in fam.coalition_plan(cfg, plan, [0, 1])["losses"]}
    assert all(pair[u] >= single[u] - 1e-9 for u in pair)  # a coalition never sees less
