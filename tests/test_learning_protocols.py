"""The learning protocols end to end: muffliato-gd, muffliato-sgd, dsgd (real peer processes,
real TCP on loopback, real keys) and central-dp (the trusted curator, one process).

One fault-free `cfree run` per networked protocol (5 peers on a ring, a few rounds) is shared by
several checks (module fixture; the three runs start together on first use): every node's model
after every round equals the simulator's bit for bit, metrics.jsonl is what the node models give,
the models learn, the audit of the logs equals the plan, the logs hold no secrets, `cfree report`
plots them. Calibration and config errors run in process (`cli.main`). One more run kills a peer
mid-run and checks the survivors finish, record the dropout and are audited.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from coordinator_free import cli, config, seeds, sim
from coordinator_free.accounting import audit
from coordinator_free.cluster import local
from coordinator_free.families import make_plan
from coordinator_free.families.learning import protocol as lp
from coordinator_free.viewlog import read_viewlog
from tests import gossipviews as gossip

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
GD = EXAMPLES / "muffliato-gd-breast-cancer.toml"
DSGD = EXAMPLES / "dsgd-breast-cancer.toml"
CENTRAL = EXAMPLES / "central-dp-breast-cancer.toml"
N = 5
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# Small, quick runs. sigma = 0.1: little enough noise that a few rounds visibly learn.
COMMON = [
    "graph.kind=ring",  # muffliato-gd's example is a hypercube; these runs take N nodes on a ring
    f"graph.nodes={N}",
    "privacy.sigma=0.1",
    "network.deadline_s=20",
    "network.connect_timeout_s=120",
]
NETWORKED = {
    # Chebyshev-accelerated, K = 3 gossip steps per round, full local gradients.
    "muffliato-gd": (
        GD,
        ["protocol.rounds=4", "protocol.gossip_steps=3", "protocol.accelerated=true"],
    ),
    # Minibatches of 8 points (a shard has ~91) drawn from each node's secret stream; plain gossip.
    "muffliato-sgd": (
        GD,
        [
            "protocol.name=muffliato-sgd",
            "protocol.batch_size=8",
            "protocol.rounds=6",
            "protocol.gossip_steps=2",
            "protocol.accelerated=false",
        ],
    ),
    # One plain gossip step per round.
    "dsgd": (DSGD, ["protocol.rounds=5"]),
}
EXPECTED_K = {"muffliato-gd": 3, "muffliato-sgd": 2, "dsgd": 1}


def cfree(*argv: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "coordinator_free", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def sets(overrides: list[str]) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@dataclass
class LearningRun:
    protocol: str
    out: Path
    proc: subprocess.CompletedProcess

    def ok(self) -> LearningRun:
        assert self.proc.returncode == 0, self.proc.stderr
        return self

    @property
    def cfg(self) -> config.Config:
        return config.load(self.out / "config.toml")

    @property
    def summary(self) -> dict:
        return json.loads(self.proc.stdout)

    def models(self, v: int) -> np.ndarray:
        return np.load(local.models_path(self.out, v), allow_pickle=False)


@pytest.fixture(scope="module")
def learning_runs(tmp_path_factory):
    """``learning_runs(protocol)``: the finished `cfree run` of that protocol. On first use the
    three runs start together (their peers' start-ups overlap on the cores); output goes to
    files, so no pipe can fill up while another run is being waited for."""
    started: dict[str, tuple[subprocess.Popen, Path, Path]] = {}
    done: dict[str, LearningRun] = {}

    def start_all() -> None:
        for protocol, (path, overrides) in NETWORKED.items():
            base = tmp_path_factory.mktemp(protocol)
            out = base / "run"
            argv = ["run", path, *sets(COMMON + overrides), "--out", out, "--json", "--quiet"]
            with open(base / "stdout", "w") as so, open(base / "stderr", "w") as se:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "coordinator_free", *map(str, argv)],
                    stdin=subprocess.DEVNULL,
                    stdout=so,
                    stderr=se,
                )
            started[protocol] = (proc, out, base)

    def get(protocol: str) -> LearningRun:
        if protocol not in done:
            if not started:
                start_all()
            proc, out, base = started[protocol]
            returncode = proc.wait(timeout=240)
            result = subprocess.CompletedProcess(
                proc.args,
                returncode,
                (base / "stdout").read_text(),
                (base / "stderr").read_text(),
            )
            done[protocol] = LearningRun(protocol, out, result)
        return done[protocol]

    yield get
    for proc, _, _ in started.values():
        if proc.poll() is None:  # a test failed before waiting for it
            proc.kill()
            proc.wait(timeout=30)


class MixedStreams:
    """The run's secret streams for everything except minibatch sampling (public seed)."""

    def __init__(self, secret: seeds.Streams, public: seeds.Streams):
        self.secret, self.public = secret, public

    def stream(self, purpose: int, node: int, round_: int = 0) -> np.random.Generator:
        src = self.public if purpose == seeds.PURPOSE_BATCH else self.secret
        return src.stream(purpose, node, round_)


# ------------------------------------------------------------------------- 1. peers == simulator


@pytest.mark.parametrize("protocol", list(NETWORKED))
def test_networked_models_equal_simulator_bitwise_every_round(learning_runs, protocol):
    run = learning_runs(protocol).ok()
    summary = run.summary
    assert summary["simulator_max_abs_diff"] == 0
    assert summary["failed"] == []
    on_disk = json.loads((run.out / "summary.json").read_text())
    assert on_disk["simulator_max_abs_diff"] == 0
    cfg = run.cfg
    assert cfg.protocol.name == protocol
    streams = seeds.streams_of_run(run.out, N)
    ref = sim.simulate_learning(cfg, streams=streams)
    plan = ref.plan
    R, K = cfg.protocol.rounds, EXPECTED_K[protocol]
    assert (plan.rounds, plan.gossip_steps, plan.steps) == (R, K, R * K)
    assert ref.models.shape == (R + 1, N, plan.dim)
    for v in range(N):
        models = run.models(v)
        assert models.shape == (R + 1, plan.dim) and models.dtype == np.float64
        assert np.array_equal(models, ref.models[:, v]), f"node {v}: differs from the simulator"
        res = json.loads((run.out / "results" / f"node-{v}.json").read_text())
        assert res["missed"] == [] and res["late"] == 0 and res["steps"] == R * K
        assert res["estimate"] == models[-1].tolist()
    # Every round moved the models, and all nodes started from 0.
    assert not ref.models[0].any()
    assert all(not np.array_equal(ref.models[r], ref.models[r + 1]) for r in range(R))
    # The nodes' secret streams are what the peers used: the public seed gives other models.
    assert not np.array_equal(sim.simulate_learning(cfg).models, ref.models)
    # Minibatches: muffliato-sgd draws them from the node's secret stream (a public batch stream
    # changes the models); the full-gradient protocols never touch that stream.
    mixed = sim.simulate_learning(
        cfg, streams=MixedStreams(streams, seeds.PublicSeedStreams(cfg.run.seed))
    )
    if protocol == "muffliato-sgd":
        task = lp.make_task(cfg, N)
        assert all(plan.batch_size < len(s) for s in task.shards)
        assert not np.array_equal(mixed.models, ref.models)
        b0 = lp.batch(plan, task, 0, 0, streams)[0]
        b1 = lp.batch(plan, task, 0, 1, streams)[0]
        assert b0.shape[0] == plan.batch_size and not np.array_equal(b0, b1)
    else:
        assert np.array_equal(mixed.models, ref.models)
    if protocol == "muffliato-gd":
        assert plan.accelerated and plan.gamma != 1.0


# ---------------------------------------------------------------- 2. metrics, and it does learn


@pytest.mark.parametrize("protocol", list(NETWORKED))
def test_metrics_are_recomputed_from_node_models_and_accuracy_improves(learning_runs, protocol):
    run = learning_runs(protocol).ok()
    cfg = run.cfg
    R = cfg.protocol.rounds
    rows = [json.loads(line) for line in (run.out / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in rows] == list(range(R + 1))
    task = lp.make_task(cfg, N)
    stacked = np.stack([run.models(v) for v in range(N)], axis=1)  # (R+1, n, dim)
    for r, row in enumerate(rows):
        assert row == lp.round_metrics(task, r, stacked[r]), f"round {r}"
    assert run.summary["results"]["metrics"] == rows
    # Round 0: every node holds the zero model.
    assert rows[0]["consensus_distance"] == 0.0
    assert rows[0]["node_test_accuracy_min"] == rows[0]["node_test_accuracy_max"]
    # A real learning check (breast cancer, sigma 0.1): from the majority-class guess at round 0
    # (~0.37) to well above it; the loss drops.
    first, last = rows[0], rows[-1]
    assert last["avg_test_accuracy"] > first["avg_test_accuracy"] + 0.2, rows
    assert last["avg_test_loss"] < first["avg_test_loss"]
    assert last["avg_train_loss"] < first["avg_train_loss"]
    # The per-node results in the summary are the nodes' own final models.
    for node in run.summary["results"]["nodes"]:
        theta = run.models(node["node"])[-1]
        ds = task.dataset
        assert node["finished"] is True
        assert node["test_accuracy"] == task.model.accuracy(theta, ds.X_test, ds.y_test)


# ------------------------------------------------------------------------------ 3. audit == plan


@pytest.mark.parametrize("protocol", list(NETWORKED))
def test_audit_of_fault_free_learning_run_equals_plan(learning_runs, protocol):
    run = learning_runs(protocol).ok()
    cfg = run.cfg
    rep = json.loads((run.out / "audit.json").read_text())
    assert rep["fault_free"] is True and rep["complete"] is True
    assert rep["integrity"] == [] and rep["protocol"] == protocol
    plan = make_plan(cfg)
    R = plan.rounds
    units = audit.units_of(plan)
    assert rep["ldp"]["factor"] == R
    assert rep["steps"] == plan.steps
    F = {m: gossip.plan_factors(plan, m) for m in audit.METHODS}
    assert [o["observer"] for o in rep["observers"]] == list(range(N))
    count = 0
    for o in rep["observers"]:
        v = o["observer"]
        got = {(x["source"], x["method"]): x for x in o["losses"]}
        assert set(got) == {(u, m) for u in range(N) if u != v for m in audit.METHODS}
        for (u, m), x in got.items():
            want = float(F[m][v, u])
            assert x["factor"] == pytest.approx(want, rel=1e-9, abs=1e-9), (v, u, m)
            loss = units.method(m)(want)
            assert x["rdp"] == pytest.approx(loss.rdp, rel=1e-9, abs=1e-12)
            assert x["eps"] == pytest.approx(loss.eps, rel=1e-9, abs=1e-12)
            if m == "exact":
                assert 0.0 <= x["factor"] <= R * (1 + 1e-9)
            count += 1
    assert count == N * (N - 1) * len(audit.METHODS)
    # Each round a neighbour sees the node's noisy step directly: R-fold local DP under Eq. (13).
    assert float(F["paper"][1, 0]) == pytest.approx(R, rel=1e-9)
    # The joint view of all rounds: the first round's direct view is a full local-DP loss, and
    # later rounds' messages also carry other nodes' unknown noise, so a neighbour's loss is
    # between 1 and R (docs/privacy.md, section 8).
    assert 1.0 - 1e-9 <= float(F["exact"][1, 0]) <= R * (1 + 1e-9)
    # Far nodes still learn about old gradients through the models: never 0 beyond one hop,
    # unlike a per-round composition.
    assert float(F["exact"][N // 2, 0]) > 0.0
    if protocol == "dsgd":
        # 'paper' for the baseline is its own guarantee: R-fold local DP for every pair.
        assert np.all(F["paper"] == R)
    # The audit is reproducible from the logs, and audit.json records which logs it read.
    assert rep.pop(audit.LOGS_KEY) == audit.logs_fingerprint(run.out)
    assert rep.pop(audit.WRITER_KEY)["run_dir"] == str(run.out.resolve())  # and who wrote it
    assert json.loads(json.dumps(audit.audit_run(run.out))) == rep


# -------------------------------------------------------------------------------- 4. view logs


FORBIDDEN = ("key", "noise", "secret", "private", "theta", "grad", "batch_idx", "seed")


@pytest.mark.parametrize("protocol", list(NETWORKED))
def test_view_logs_hold_every_message_and_no_secret(learning_runs, protocol):
    run = learning_runs(protocol).ok()
    cfg = run.cfg
    streams = seeds.streams_of_run(run.out, N)
    ref = sim.simulate_learning(cfg, streams=streams)
    plan, R, K = ref.plan, cfg.protocol.rounds, EXPECTED_K[protocol]
    task = lp.make_task(cfg, N)
    # What each node must never write down: its noise and its noisy local step (thetahat, sent
    # to its neighbours at the first step of every round).
    noise = {
        (v, r): lp.gradient_noise(plan, v, r, streams).tobytes() for v in range(N) for r in range(R)
    }
    thetahat = {
        (v, r): lp.local_step(plan, task, v, r, ref.models[r, v], streams).tobytes()
        for v in range(N)
        for r in range(R)
    }
    raw = {v: (run.out / "logs" / f"node-{v}.vlog").read_bytes() for v in range(N)}
    for v in range(N):
        vl = read_viewlog(run.out / "logs" / f"node-{v}.vlog")
        assert vl.intact, vl.problems
        params = vl.header["params"]
        assert params["protocol"] == protocol
        assert (params["rounds"], params["gossip_steps"], params["steps"]) == (R, K, R * K)
        assert params["sigma"] == 0.1 and params["node"] == v
        assert {k: params[k] for k in plan.public_params()} == plan.public_params()
        degree = len(plan.neighbours(v))
        assert degree == 2  # a ring
        kinds = [r["k"] for r in vl.records]
        assert kinds.count("recv") == R * K * degree
        assert kinds.count("send") == R * K * degree
        assert kinds[-1] == "finished"
        assert not {"miss", "late", "peer-down", "bad-message"} & set(kinds)
        assert {(r["step"], r["peer"]) for r in vl.records if r["k"] == "recv"} == {
            (t, w) for t in range(R * K) for w in plan.neighbours(v)
        }
        for rec in vl.records:
            for field in rec:
                assert not any(bad in field.lower() for bad in FORBIDDEN), (v, rec["k"], field)
            if rec["k"] == "send":
                assert (
                    "value" not in rec
                    and rec["digest"].startswith("blake3:")
                    and len(rec["digest"]) == 39
                )
        for field in params:
            assert not any(bad in field.lower() for bad in FORBIDDEN), field
        for r in range(R):
            assert thetahat[(v, r)] not in raw[v], f"node {v} logged its own step of round {r}"
            # Positive control: its neighbours did see (and log) it, so the search works.
            for w in plan.neighbours(v):
                assert thetahat[(v, r)] in raw[w]
        key_pem = (run.out / "keys" / f"node-{v}.key").read_bytes()
        body = b"".join(key_pem.splitlines()[1:-1])
        assert all(body not in raw[w] for w in range(N))
    for (v, r), eta in noise.items():
        assert all(eta not in raw[w] for w in range(N)), f"noise of node {v}, round {r} logged"


# ----------------------------------------------------------------------------- central DP (3.)


@pytest.fixture(scope="module")
def central_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("central") / "run"
    overrides = ["graph.kind=ring", "graph.nodes=6", "protocol.rounds=5", "privacy.sigma=0.1"]
    proc = cfree("run", CENTRAL, *sets(overrides), "--out", out, "--json", "--quiet")
    return out, proc


def test_central_dp_runs_without_peers_and_every_pair_loses_r_fold(central_run):
    out, proc = central_run
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["failed"] == [] and summary["results"]["nodes"] == []
    assert summary["simulator_max_abs_diff"] is None
    # No peers: no roster, no keys, no view logs.
    assert not (out / "roster.json").exists() and not (out / "logs").exists()
    cfg = config.load(out / "config.toml")
    R, n = cfg.protocol.rounds, 6
    models = np.load(out / "results" / "central.models.npy", allow_pickle=False)
    plan = make_plan(cfg)
    assert models.shape == (R + 1, plan.dim) and not models[0].any()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in rows] == list(range(R + 1))
    task = lp.make_task(cfg, n)
    for r, row in enumerate(rows):
        assert row == lp.round_metrics(task, r, models[r][None, :])
    assert rows[-1]["avg_test_accuracy"] > rows[0]["avg_test_accuracy"] + 0.2
    # The curator's noise is secret: not the one the public run seed gives.
    assert not np.array_equal(sim.simulate_learning(cfg).models[:, 0], models)
    rep = json.loads((out / "audit.json").read_text())
    assert rep["fault_free"] is True and rep["integrity"] == [] and rep["steps"] == 0
    assert rep["ldp"]["factor"] == R
    assert [o["observer"] for o in rep["observers"]] == list(range(n))
    pairs = [(o["observer"], x) for o in rep["observers"] for x in o["losses"]]
    assert len(pairs) == n * (n - 1) * len(audit.METHODS)
    for v, x in pairs:
        assert x["source"] != v
        assert x["factor"] == R
        # R-fold local DP: exact by the Gaussian profile, paper by the RDP conversion
        ldp_eps = rep["ldp"]["eps"] if x["method"] == "exact" else rep["ldp"]["eps_rdp"]
        assert x["eps"] == pytest.approx(ldp_eps, rel=1e-12)
    for m in audit.METHODS:
        assert np.all(gossip.plan_factors(plan, m) == R)


# ---------------------------------------------------------------------------- 5. calibration

CALIBRATE = {
    "muffliato-gd": (GD, ["protocol.gossip_steps=2"]),  # K=2: pairs differ (mean < worst)
    "dsgd": (DSGD, []),
    "central-dp": (CENTRAL, []),
}


@pytest.mark.parametrize("method", audit.METHODS)
@pytest.mark.parametrize("budget", ["worst", "mean"])
@pytest.mark.parametrize("protocol", list(CALIBRATE))
def test_calibration_round_trip(capsys, protocol, budget, method):
    path, extra = CALIBRATE[protocol]
    base = sets(["graph.kind=ring", "graph.nodes=6", "protocol.rounds=5", *extra])
    key = "worst_pair" if budget == "worst" else "mean_over_pairs"

    def plan_eps(sigma: float) -> float:
        code, out, err = run_cli(
            capsys, "plan", path, *base, "--set", f"privacy.sigma={sigma!r}", "--method", method,
            "--json",
        )  # fmt: skip
        assert code == 0, err
        rep = json.loads(out)
        assert rep["sigma"] == sigma
        return rep[key]["eps"]

    sigmas = {}
    for target in (4.0, 8.0):
        code, out, err = run_cli(
            capsys, "plan", path, *base, "--target-eps", target, "--budget", budget,
            "--method", method, "--json",
        )  # fmt: skip
        assert code == 0, err
        cal = json.loads(out)
        assert (cal["protocol"], cal["budget"], cal["method"]) == (protocol, budget, method)
        assert cal["target_eps"] == target and cal["eps"] <= target
        sigma = cal["sigma"]
        assert plan_eps(sigma) == pytest.approx(target, rel=1e-6)
        # The smallest such sigma: slightly less noise is over the target.
        assert plan_eps(sigma * (1 - 1e-6)) > target
        sigmas[target] = sigma
    assert sigmas[8.0] < sigmas[4.0]


def test_calibration_budgets_differ_where_pairs_differ(capsys):
    """On a 6-ring with K=2 the pairs' losses differ, so a mean budget allows less noise than a
    worst-pair budget; for central DP every pair is the same and both budgets agree."""
    out = {}
    for name, (path, extra) in CALIBRATE.items():
        for budget in ("worst", "mean"):
            code, text, err = run_cli(
                capsys, "plan", path, *sets(["graph.kind=ring", "graph.nodes=6", "protocol.rounds=5", *extra]),
                "--target-eps", 8, "--budget", budget, "--json",
            )  # fmt: skip
            assert code == 0, err
            out[(name, budget)] = json.loads(text)["sigma"]
    assert out[("muffliato-gd", "mean")] < out[("muffliato-gd", "worst")]
    assert out[("dsgd", "mean")] < out[("dsgd", "worst")]
    assert out[("central-dp", "mean")] == out[("central-dp", "worst")]


# ------------------------------------------------------------------------------ 6. config errors


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["data.kind=uniform"], "data.kind must be one of"),
        (["protocol.name=muffliato-sgd", "protocol.batch_size=0"], "protocol.batch_size >= 1"),
        (["protocol.name=muffliato-sgd"], "protocol.batch_size >= 1"),  # the default is 0
        (["data.kind=csv"], "data.path is required"),
        (["data.kind=csv", "data.path=/nonexistent/d.csv"], "data.path /nonexistent/d.csv"),
        (["model.kind=svm"], "model.kind 'svm' unknown"),
        (["model.kind=ridge", "model.l2=0"], "model.l2 > 0"),
    ],
)
def test_learning_config_errors_exit_2_naming_the_key(capsys, overrides, expected):
    code, out, err = run_cli(capsys, "plan", GD, *sets(overrides))
    assert code == 2, (out, err)
    assert out == ""
    assert err.startswith("cfree plan: error: ") and expected in err, err
    assert "muffliato-gd-breast-cancer.toml" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- 7. a peer crash


@pytest.mark.slow  # a real kill, 6 to 8 s (the quick suite keeps test_integration's)
def test_killed_peer_in_learning_run_is_recorded_and_audited(tmp_path):
    """SIGKILL one peer of a muffliato-gd run early in round 1: the others finish (bounded by the
    down-grace of 2 deadlines), record the dropout, and the audit covers the survivors."""
    out = tmp_path / "kill"
    R, K = 25, 2
    cfg = config.load(
        GD,
        [
            "graph.kind=ring",
            f"graph.nodes={N}",
            f"protocol.rounds={R}",
            f"protocol.gossip_steps={K}",
            "privacy.sigma=0.1",
            "network.deadline_s=2",
        ],
    )
    local.prepare_run_dir(cfg, out)
    victim = 2

    def on_event(node, ev, pid):
        if node == victim and ev.get("event") == "step" and ev.get("step") == 3:
            os.kill(pid, signal.SIGKILL)

    run = asyncio.run(
        local.launch_peers(cfg, out, show_progress=False, timeout_s=120, on_event=on_event)
    )
    assert run.wall_s < 100
    codes = {o.node: o.returncode for o in run.outcomes}
    assert codes[victim] == -signal.SIGKILL, run.outcomes
    (failed,) = run.failed
    assert failed.node == victim and "killed by SIGKILL" in failed.error
    survivors = [v for v in range(N) if v != victim]
    assert all(codes[v] == 0 for v in survivors), run.outcomes
    plan = make_plan(cfg)
    for w in plan.neighbours(victim):
        vl = read_viewlog(out / "logs" / f"node-{w}.vlog")
        assert vl.intact and vl.records[-1]["k"] == "finished"
        misses = [r for r in vl.records if r["k"] == "miss" and r["peer"] == victim]
        assert misses, f"node {w} did not record the dropout"
        assert {r["reason"] for r in misses} <= {"peer-down", "deadline"}
        # Missed from round 1 on, every later step: the survivors carried on without it.
        assert min(r["step"] for r in misses) >= K
        assert {r["step"] for r in misses} >= set(range(R * K - K, R * K))
    # The survivors' results: final models of every round; metrics over the survivors.
    results = local.collect_learning_results(cfg, out)
    finished = {r["node"]: r["finished"] for r in results["nodes"]}
    assert finished == {v: v != victim for v in range(N)}
    assert [m["round"] for m in results["metrics"]] == list(range(R + 1))
    for v in survivors:
        models = np.load(local.models_path(out, v), allow_pickle=False)
        assert models.shape == (R + 1, plan.dim) and np.isfinite(models).all()

    rep = audit.audit_run(out)
    assert rep["fault_free"] is False and rep["complete"] is False
    assert any(f["node"] == victim and f["kind"] == "unfinished" for f in rep["integrity"])
    # Anything else is about the victim (e.g. a torn last record, or a value it sent but was
    # killed before logging the send).
    others = [f for f in rep["integrity"] if f["node"] != victim and f["kind"] != "unmatched-recv"]
    assert not others, rep["integrity"]
    by_obs = {o["observer"]: o["losses"] for o in rep["observers"]}
    assert set(survivors) <= set(by_obs)
    ldp = rep["ldp"]["rdp"]
    F = gossip.plan_factors(plan, "exact")
    for v in survivors:
        losses = by_obs[v]
        assert {(x["source"], x["method"]) for x in losses} == {
            (u, m) for u in range(N) if u != v for m in audit.METHODS
        }
        for x in losses:
            assert np.isfinite(x["eps"]) and x["eps"] >= 0
            if x["method"] == "exact":
                assert 0 <= x["rdp"] <= ldp * (1 + 1e-9)
    # The logs show the victim's neighbours saw its steps only until it died (from_logs); its
    # log ends early, so what is reported is raised to the plan, never below it.
    for w in plan.neighbours(victim):
        (x,) = [y for y in by_obs[w] if y["source"] == victim and y["method"] == "exact"]
        assert x["from_logs"]["factor"] < float(F[w, victim]) - 0.5
        assert x["basis"] == "plan" and x["factor"] >= float(F[w, victim]) * (1 - 1e-9)


# ------------------------------------------------------------------------------------- 8. report


@pytest.mark.parametrize("which", ["muffliato-gd", "central-dp"])
def test_report_of_a_learning_run_writes_accuracy_png(
    learning_runs, central_run, capsys, tmp_path, which
):
    if which == "central-dp":
        out, proc = central_run
        assert proc.returncode == 0, proc.stderr
    else:
        out = learning_runs(which).ok().out
    dest = tmp_path / "report"
    code, text, err = run_cli(capsys, "report", out, "--out", dest, "--json")
    assert code == 0, err
    rep = json.loads(text)
    acc = dest / "accuracy.png"
    assert str(acc) in rep["files"]
    assert acc.read_bytes().startswith(PNG_SIGNATURE) and acc.stat().st_size > 1000
    assert not any("accuracy.png skipped" in note for note in rep["notes"])
