"""The reconstruction attack on gossip averaging (`cfree attack`) against the coalition
accountant: a coalition reconstructs exactly the nodes whose exact loss towards it is local DP
(factor 1), and their noisy inputs to float precision.

In memory over six graphs (some nodes hidden from the coalition in four of them), then on a
real run through the CLI. The truth the reconstructions are compared with comes from the run's
own streams; the attack itself sees only the coalition's logs, the config and its own inputs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from memrun import write_run_dir
from netrun import cfree

import coordinator_free
from coordinator_free import config
from coordinator_free.families.averaging import attack, node
from coordinator_free.families.averaging.protocol import make_plan
from coordinator_free.inmemory import run_config
from coordinator_free.privacy import muffliato as acct
from coordinator_free.viewlog import read_viewlog

REPO = Path(coordinator_free.__file__).resolve().parents[1]

CASES = {
    "ring-10-T3": (["graph.kind=ring", "graph.nodes=10", "protocol.steps=3"], [0]),
    "path-9-T4": (["graph.kind=path", "graph.nodes=9", "protocol.steps=4"], [0]),
    "er-12": (
        ["graph.kind=erdos_renyi", "graph.nodes=12", "graph.p=0.3", "protocol.steps=3"],
        [0, 5],
    ),
    "grid-3x4-T3": (["graph.kind=grid", "graph.rows=3", "graph.cols=4", "protocol.steps=3"], [0]),
    "star-7-T2": (["graph.kind=star", "graph.nodes=7", "protocol.steps=2"], [1]),
    "ring-8-T10-pair": (["graph.kind=ring", "graph.nodes=8", "protocol.steps=10"], [0, 4]),
    "geometric-10": (
        ["graph.kind=geometric", "graph.nodes=10", "graph.radius=0.45", "protocol.steps=2"],
        [3],
    ),
}


def _attack_memrun(sets, members, tmp_path, own=True, plain=False):
    cfg = config.load(None, sets + ["privacy.sigma=0"] * plain)
    plan = make_plan(cfg)
    mr = run_config(cfg, None, seed=1)
    run = write_run_dir(cfg, mr, tmp_path / "run")
    logs = {a: read_viewlog(run / "logs" / f"node-{a}.vlog") for a in members}
    received = attack.from_logs(run, cfg, plan, members, logs)
    truth = {u: node.start_value(cfg, u, mr.streams.node(u)) for u in range(plan.n)}
    inputs = {a: truth[a] for a in members} if own else None
    out = attack.reconstruct(attack.knowledge(plan, members, received, inputs), plan.n)
    return plan, out, truth


@pytest.mark.parametrize("plain", [False, True], ids=["muffliato", "plain-gossip"])
@pytest.mark.parametrize("name", CASES)
def test_the_coalition_reconstructs_exactly_its_fully_exposed_nodes(name, plain, tmp_path):
    sets, members = CASES[name]
    plan, out, truth = _attack_memrun(sets, members, tmp_path, plain=plain)
    assert (plan.sigma == 0) == plain
    factors = acct.coalition_factors(plan.W, plan.steps, members)
    exposed = [int(u) for u in np.flatnonzero(factors >= 1 - 1e-9)]
    assert out["reconstructible"] == exposed
    # Everything else is well below 1 (no borderline case decides the comparison).
    assert all(f < 1 - 1e-3 for u, f in enumerate(factors) if u not in exposed)
    for u in out["reconstructible"]:
        assert np.max(np.abs(out["values"][u] - truth[u])) < 1e-10, u


def test_some_graphs_hide_nodes_and_some_expose_everyone(tmp_path):
    hidden = {}
    for i, (name, (sets, members)) in enumerate(CASES.items()):
        plan, out, _ = _attack_memrun(sets, members, tmp_path / str(i))
        hidden[name] = plan.n - len(out["reconstructible"])
    assert sum(1 for h in hidden.values() if h > 0) >= 4, hidden
    assert hidden["ring-8-T10-pair"] == 0 and hidden["er-12"] == 0


def test_without_its_own_inputs_the_coalition_learns_less(tmp_path):
    sets, members = CASES["grid-3x4-T3"]
    _, full, _ = _attack_memrun(sets, members, tmp_path / "a")
    _, blind, _ = _attack_memrun(sets, members, tmp_path / "b", own=False)
    assert set(blind["reconstructible"]) < set(full["reconstructible"])


def _brute_force_factors(plan, members):
    """The joint view's projector diagonal from the stacked rows themselves (small n only)."""
    coeffs = acct.realised_coefficients(
        acct.fault_free_steps(plan.W, plan.steps, plan.accelerated, plan.gamma)
    )
    rows = [np.eye(plan.n)[a] for a in members]
    for a in members:
        for x in plan.neighbours(a):
            rows.extend(coeffs[t][x] for t in range(plan.steps))
    u, s, _ = np.linalg.svd(np.array(rows).T, full_matrices=False)
    q = u[:, s > 1e-9 * s[0]]
    return np.einsum("ij,ij->i", q, q)


@pytest.mark.parametrize("name", ["ring-10-T3", "path-9-T4", "grid-3x4-T3", "star-7-T2"])
def test_coalition_factors_equal_a_brute_force_joint_view(name):
    sets, members = CASES[name]
    plan = make_plan(config.load(None, sets))
    got = acct.coalition_factors(plan.W, plan.steps, members)
    assert np.allclose(got, _brute_force_factors(plan, members), atol=1e-8)
    # One member: the single-observer plan. More members never see less.
    for a in range(plan.n):
        one = acct.coalition_factors(plan.W, plan.steps, [a])
        row = acct.plan_factors(plan.W, plan.steps, plan.accelerated, method="exact", observers=[a])
        assert np.allclose(one, row[0], atol=1e-12)
    both = acct.coalition_factors(plan.W, plan.steps, [0, plan.n - 1])
    for a in (0, plan.n - 1):
        assert np.all(both >= acct.coalition_factors(plan.W, plan.steps, [a]) - 1e-12)


def test_a_log_without_values_or_with_missed_values_is_refused(tmp_path):
    cfg = config.load(None, ["graph.nodes=5", "protocol.steps=3", "log.values=false"])
    plan = make_plan(cfg)
    run = write_run_dir(cfg, run_config(cfg, None, seed=1), tmp_path / "run")
    logs = {0: read_viewlog(run / "logs" / "node-0.vlog")}
    with pytest.raises(attack.AttackError, match="log.values = false"):
        attack.from_logs(run, cfg, plan, [0], logs)


def _cfree(*args, cwd):
    return cfree(*args, cwd=cwd, timeout=300)


@pytest.mark.slow  # a real 8-peer run; the attacks themselves run on in-memory runs above
def test_cfree_attack_on_a_real_run(tmp_path):
    r = _cfree(
        "run", REPO / "examples" / "muffliato-ring.toml", "--set", "graph.nodes=10",
        "--set", "protocol.steps=3", "--out", "ring", "--quiet", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = _cfree("attack", "ring", "--attackers", "0", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["attackers"] == [0] and res["own_inputs"] is True
    got = {row["node"] for row in res["nodes"] if row["reconstructed"]}
    assert got == {1, 2, 3, 7, 8, 9}  # within 3 hops on the ring: 4, 5, 6 stay hidden
    for row in res["nodes"]:
        assert (row["factor"] >= 1 - 1e-9) == row["reconstructed"]
        if row["reconstructed"]:
            assert row["error"] < 1e-10
    text = _cfree("attack", "ring", "--attackers", "0,5", cwd=tmp_path)
    assert text.returncode == 0 and "8 of 8 other nodes reconstructed" in text.stdout
    bad = _cfree("attack", "ring", "--attackers", "0,12", cwd=tmp_path)
    assert bad.returncode == 2 and "out of range 0..9" in bad.stderr


def test_a_run_of_another_protocol_is_refused_with_its_name(tmp_path):
    cfg = config.load(REPO / "examples" / "randomized-gossip-ring.toml", ["graph.nodes=5"])
    from coordinator_free.families import family_of

    with pytest.raises(attack.AttackError, match="so far; this is randomized-gossip"):
        attack.check_run(tmp_path, cfg, family_of(cfg.protocol.name).make_plan(cfg))


@pytest.mark.slow  # cfree plan --observers in subprocesses (5 s); coalitions are tested in memory
def test_plan_observers_gives_one_row_per_source_outside_the_coalition(tmp_path):
    ring = REPO / "examples" / "muffliato-ring.toml"
    r = _cfree("plan", ring, "--set", "graph.nodes=10", "--set", "protocol.steps=3",
               "--observers", "0,5", "--json", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["observers"] == [0, 5] and [x["source"] for x in rep["losses"]] == [
        1, 2, 3, 4, 6, 7, 8, 9,
    ]  # fmt: skip
    assert all(x["observers"] == [0, 5] and x["factor"] == 1.0 for x in rep["losses"])
    assert all(x["eps"] == pytest.approx(rep["ldp"]["eps"]) for x in rep["losses"])
    one = json.loads(
        _cfree("plan", ring, "--set", "graph.nodes=10", "--set", "protocol.steps=3",
               "--observers", "0", "--json", cwd=tmp_path).stdout
    )  # fmt: skip
    single = json.loads(
        _cfree("plan", ring, "--set", "graph.nodes=10", "--set", "protocol.steps=3",
               "--source", "4", "--json", cwd=tmp_path).stdout
    )  # fmt: skip
    row4 = next(x for x in one["losses"] if x["source"] == 4)
    seen = next(x for x in single["losses"] if x["observer"] == 0)
    assert row4["factor"] == pytest.approx(seen["factor"]) and row4["eps"] == pytest.approx(
        seen["eps"]
    )
    assert one["fully_exposed"] == 6
    bad = _cfree("plan", ring, "--observers", "0,8", "--source", "3", cwd=tmp_path)
    assert bad.returncode == 2 and "--observers gives the exact loss of every source" in bad.stderr


def test_plain_gossip_is_accepted_for_muffliato_only_and_labelled_no_privacy(tmp_path):
    from coordinator_free.accounting.core import Units
    from coordinator_free.errors import ConfigError

    cfg = config.load(None, ["graph.nodes=6", "privacy.sigma=0"])
    assert cfg.privacy.sigma == 0
    with pytest.raises(
        ConfigError, match="accepted for protocols muffliato, dsgd, muffliato-gd only"
    ):
        config.load(REPO / "examples" / "ring-sum.toml", ["privacy.sigma=0"])
    with pytest.raises(ConfigError, match=r"must be in \(1e-150, 1e150\), got -1"):
        config.load(None, ["privacy.sigma=-1"])
    units = Units(alpha=2.0, delta=1e-5, sensitivity=1.0, sigma=0.0)
    zero, tiny = units.gaussian(0.0), units.gaussian(1e-6)
    assert (zero.rdp, zero.eps) == (0.0, 0.0)  # a view that never depends on u
    assert (tiny.rdp, tiny.eps) == (float("inf"), float("inf"))
    ring = REPO / "examples" / "muffliato-ring.toml"
    r = _cfree("plan", ring, "--set", "graph.nodes=10", "--set", "protocol.steps=3",
               "--set", "privacy.sigma=0", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "NO PRIVACY" in r.stdout and "(the inf entries)" in r.stdout
    assert "amplified" not in r.stdout  # eps = 0 pairs saw nothing; they are not "amplified"
    r = _cfree("plan", ring, "--set", "graph.nodes=10", "--set", "protocol.steps=3",
               "--set", "privacy.sigma=0", "--json", cwd=tmp_path)  # fmt: skip
    rep = json.loads(r.stdout)  # Python reads the JSON 'Infinity'
    assert rep["ldp"]["eps"] == float("inf")


PLAIN = {
    "ring": (["graph.kind=ring", "graph.nodes=10", "protocol.steps=3"], "0"),
    "path": (["graph.kind=path", "graph.nodes=9", "protocol.steps=4"], "0"),
    "grid": (["graph.kind=grid", "graph.rows=3", "graph.cols=4", "protocol.steps=3"], "0"),
    "star": (["graph.kind=star", "graph.nodes=7", "protocol.steps=2"], "1"),
    "erdos-renyi": (
        ["graph.kind=erdos_renyi", "graph.nodes=12", "graph.p=0.3", "protocol.steps=3"],
        "0,5",
    ),
    "geometric": (
        ["graph.kind=geometric", "graph.nodes=10", "graph.radius=0.45", "protocol.steps=2"],
        "3",
    ),
}


@pytest.mark.slow
def test_cfree_attack_on_real_plain_gossip_runs_over_six_graphs(tmp_path):
    """Real peers, sigma = 0: the attack recovers exactly the private values of the nodes the
    coalition accountant marks fully exposed, to float precision, and no other node."""
    hidden = 0
    for name, (sets, attackers) in PLAIN.items():
        args = ["run", REPO / "examples" / "muffliato-ring.toml", "--set", "privacy.sigma=0"]
        for kv in sets:
            args += ["--set", kv]
        r = _cfree(*args, "--out", name, "--quiet", cwd=tmp_path)
        assert r.returncode == 0, (name, r.stderr)
        r = _cfree("attack", name, "--attackers", attackers, "--json", cwd=tmp_path)
        assert r.returncode == 0, (name, r.stderr)
        res = json.loads(r.stdout)
        assert res["sigma"] == 0
        cfg = config.load(tmp_path / name / "config.toml")
        plan = make_plan(cfg)
        members = [int(a) for a in attackers.split(",")]
        factors = acct.coalition_factors(plan.W, plan.steps, members)
        for row in res["nodes"]:
            exposed = factors[row["node"]] >= 1 - 1e-9
            assert row["reconstructed"] == exposed, (name, row)
            if exposed:
                assert row["error"] < 1e-10, (name, row)
        hidden += sum(1 for row in res["nodes"] if not row["reconstructed"])
        text = _cfree("attack", name, "--attackers", attackers, cwd=tmp_path)
        assert "NO PRIVACY" in text.stdout
    assert hidden > 0


def test_the_erdos_renyi_table_script_agrees_with_the_accountant():
    """bench/attack_table.py (docs/results.md) on a small grid: it exits 0 only when the
    attack's exact decisions equal the coalition accountant's fully exposed sets."""
    r = subprocess.run(
        [sys.executable, REPO / "bench" / "attack_table.py", "--nodes", "20", "--degrees", "4",
         "--attackers", "1,2", "--graphs", "3"],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "0 disagreement(s)" in r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("| 20 |")]
    assert len(rows) == 2 and all("±" in row for row in rows)


# ------------------------------------------------------------------ D-GD gradient reconstruction

DSGD = REPO / "examples" / "dsgd-breast-cancer.toml"
PATH8 = ["graph.kind=path", "graph.nodes=8", "protocol.rounds=8", "privacy.sigma=0",
         "data.partition=fixed", "data.per_node=1", "protocol.step_size=0.001"]  # fmt: skip


def _dgd_attack(sets, own=True, seed=1):
    from types import SimpleNamespace

    from coordinator_free.families import family_of
    from coordinator_free.families.learning import attack as lattack

    cfg = config.load(DSGD, sets)
    plan = family_of(cfg.protocol.name).make_plan(cfg)
    mr = run_config(cfg, seed=seed)
    logs = {0: SimpleNamespace(records=[{"k": k, **f} for k, f in mr.logs[0]])}
    streams = {0: mr.streams.node(0)} if own else {}
    return lattack.run(Path("memnet"), cfg, plan, [0], logs, streams)


def test_dgd_attack_inverts_every_example_on_a_path_from_one_end():
    res = _dgd_attack(PATH8)
    assert res["own_models"] == [0]  # recomputed, and equal to the digests in its log
    assert res["method"] == "ols" and res["inversion"]
    assert all(r["reconstructed"] for r in res["nodes"])
    errs = {r["distance"]: r["error"] for r in res["nodes"]}
    # Gradients change little at step size 0.001; the far end is the worst conditioned.
    assert np.median(list(errs.values())) < 0.01 and max(errs.values()) < 0.25, errs
    assert all(r["cosine"] > 0.97 for r in res["nodes"])


def test_own_models_are_checked_against_a_log_of_either_digest_form(monkeypatch):
    """A log written before BLAKE3 names what it sent by SHA-256 digests (no prefix): the
    recomputed own models are compared in that form and match; a digest of the other form
    does not vouch for them."""
    from types import SimpleNamespace

    from coordinator_free import viewlog
    from coordinator_free.engine import step
    from coordinator_free.families import family_of
    from coordinator_free.families.learning import attack as lattack

    cfg = config.load(DSGD, PATH8)
    plan = family_of(cfg.protocol.name).make_plan(cfg)
    monkeypatch.setattr(step, "digest", viewlog.sha256_digest)
    mr = run_config(cfg, seed=1)
    monkeypatch.undo()
    recs = [{"k": k, **f} for k, f in mr.logs[0]]
    sends = [r for r in recs if r["k"] == "send"]
    assert sends and all(len(r["digest"]) == 32 and ":" not in r["digest"] for r in sends)

    def attack() -> list[int]:
        logs = {0: SimpleNamespace(records=recs)}
        res = lattack.run(Path("memnet"), cfg, plan, [0], logs, {0: mr.streams.node(0)})
        return res["own_models"]

    assert attack() == [0]
    sends[0]["digest"] = viewlog.DIGEST_PREFIX + sends[0]["digest"]
    assert attack() == []


def test_the_attackers_own_gradients_sharpen_the_reconstruction():
    """Its own gradients, recomputed and checked against its log's digests, are subtracted
    (Algorithm 4.3); without them they are estimated like the others' and every error grows."""
    full = _dgd_attack(PATH8)
    blind = _dgd_attack(PATH8, own=False)
    assert full["own_models"] == [0] and blind["own_models"] == []
    got = {r["node"] for r in full["nodes"] if r["reconstructed"]}
    seen = {r["node"] for r in blind["nodes"] if r["reconstructed"]}
    assert seen <= got
    e_full = np.array([r["error"] for r in full["nodes"]])
    e_blind = np.array([r["error"] for r in blind["nodes"]])
    assert e_full.mean() < e_blind.mean() and np.all(e_full <= e_blind + 1e-9)


def test_gls_covariance_matches_the_spread_of_estimates_under_the_model():
    """Under Assumption 4.7 exactly (constant gradients plus Gaussian noise of std sigma), the
    GLS estimate is unbiased and its spread is the reported std (Eq. 4.8)."""
    from coordinator_free.families import family_of
    from coordinator_free.families.learning import attack as lattack

    cfg = config.load(DSGD, [*PATH8[:-1], "privacy.sigma=0.3", "graph.nodes=6"])
    plan = family_of(cfg.protocol.name).make_plan(cfg)
    keys = sorted({(t, x) for t in range(plan.rounds) for x in (0, 1)})
    c = lattack.coefficients(plan, keys)
    k_mat = c.reshape(len(keys), plan.rounds, plan.n).sum(axis=1)
    rng = np.random.default_rng(7)
    gbar = rng.normal(size=(plan.n, 1))
    theta0 = np.zeros(1)
    draws = []
    for _ in range(400):
        z = np.repeat(gbar[None], plan.rounds, axis=0).reshape(-1, 1)
        z = z + rng.normal(0.0, plan.sigma, size=z.shape)
        y = theta0 - plan.step_size * (c @ z)
        est = lattack.estimate(plan, dict(zip(keys, y, strict=True)), theta0)
        draws.append(est["gradients"][:, 0])
    draws = np.array(draws)
    assert est["method"] == "gls" and est["identifiable"]
    for u in est["identifiable"]:
        assert abs(draws[:, u].mean() - gbar[u, 0]) < 4 * est["std"][u] / np.sqrt(len(draws))
        assert draws[:, u].std() == pytest.approx(est["std"][u], rel=0.15)
    assert np.allclose(k_mat @ gbar, k_mat @ gbar)  # (k_mat is the thesis' Algorithm 4.2 K)


@pytest.mark.slow
def test_cfree_attack_on_a_real_plain_dgd_run(tmp_path):
    args = ["run", DSGD]
    for kv in PATH8:
        args += ["--set", kv]
    r = _cfree(*args, "--out", "line8", "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = _cfree("attack", "line8", "--attackers", "0", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["own_models"] == [0] and res["inversion"]
    assert all(row["reconstructed"] and row["error"] < 0.25 for row in res["nodes"])
    text = _cfree("attack", "line8", "--attackers", "0", cwd=tmp_path).stdout
    assert "NO PRIVACY" in text and "example rel. error" in text


def test_an_attacker_log_that_is_damaged_is_named(tmp_path, capsys):
    from coordinator_free.cli import main

    cfg = config.load(None, ["graph.nodes=6", "protocol.steps=3"])
    run = write_run_dir(cfg, run_config(cfg, None, seed=1), tmp_path / "run")
    log = run / "logs" / "node-0.vlog"
    log.write_bytes(log.read_bytes()[:-7])
    assert main(["attack", str(run), "--attackers", "0", "--json"]) == 0
    out = capsys.readouterr()
    assert "attacker 0's log is damaged" in out.err
    assert json.loads(out.out)["damaged_logs"]["0"]
