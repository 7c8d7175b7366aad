"""DECOR end to end: key agreement, cancellation in a networked run, dropouts, audit = plan,
calibration round trip."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from coordinator_free import config, seeds, sim
from coordinator_free.accounting import audit
from coordinator_free.cluster import local
from coordinator_free.config import ConfigError
from coordinator_free.families.decor import keys as decor
from coordinator_free.families.learning import protocol as lp
from coordinator_free.viewlog import ViewLogWriter, read_viewlog
from tests.netrun import cfree_run_json

ROOT = Path(__file__).resolve().parents[1]
RING = ROOT / "examples" / "decor-ring.toml"
N = 6
SMALL = [
    f"graph.nodes={N}",
    "protocol.rounds=12",
    "protocol.step_size=0.01",
    "data.features=4",
    "privacy.sigma=2.0",
    "privacy.sigma_cor=50.0",
]


def _node_streams(seed: bytes, node: int, run_id: bytes = b"run-1") -> seeds.NodeSecretStreams:
    key = X25519PrivateKey.from_private_bytes(seed)
    return seeds.NodeSecretStreams(key, run_id, node, config_digest=bytes(32), nonce=bytes(16))


# ------------------------------------------------------------------------------ 1. key agreement


def test_pair_secret_is_the_same_at_both_ends_and_bound_to_run_and_edge():
    a, b = _node_streams(b"\x01" * 32, 0), _node_streams(b"\x02" * 32, 1)
    ka, kb = decor.exchange_key(a), decor.exchange_key(b)
    s_ab = decor.pair_secret(ka, decor.public_bytes(kb), b"run-1", 0, 1)
    s_ba = decor.pair_secret(kb, decor.public_bytes(ka), b"run-1", 1, 0)
    assert s_ab == s_ba and len(s_ab) == 32
    # Another run, or the same keys read as another edge, give unrelated secrets.
    assert decor.pair_secret(ka, decor.public_bytes(kb), b"run-2", 0, 1) != s_ab
    assert decor.pair_secret(ka, decor.public_bytes(kb), b"run-1", 0, 2) != s_ab
    # The run's exchange key is not the node's channel key.
    a2 = _node_streams(b"\x01" * 32, 0, b"run-2")
    assert decor.public_bytes(decor.exchange_key(a2)) != decor.public_bytes(ka)


def test_bad_exchange_keys_are_refused_by_name():
    k = decor.exchange_key(_node_streams(b"\x03" * 32, 0))
    with pytest.raises(decor.DecorKeyError, match="pair 0-5"):
        decor.pair_secret(k, bytes(32), b"r", 5, 0)  # a low-order point: all-zero secret
    with pytest.raises(decor.DecorKeyError, match="32 bytes"):
        decor.pair_secret(k, b"short", b"r", 0, 1)


def test_edge_noise_is_fresh_every_round_and_cancels_between_the_two_ends():
    s = bytes(range(32))
    z0 = decor.edge_noise(s, b"r", 2, 7, 0, 5, 3.0)
    z1 = decor.edge_noise(s, b"r", 7, 2, 1, 5, 3.0)
    assert not np.array_equal(z0, z1)
    assert np.array_equal(z0, decor.edge_noise(s, b"r", 7, 2, 0, 5, 3.0))  # both ends agree
    lo = decor.correlated_noise(2, [7], lambda j: decor.edge_noise(s, b"r", 2, j, 0, 5, 3.0), 5)
    hi = decor.correlated_noise(7, [2], lambda j: decor.edge_noise(s, b"r", 7, j, 0, 5, 3.0), 5)
    assert np.array_equal(lo, -hi) and np.array_equal(lo, z0)
    # Commitments: equal at both ends, different per round, and unrelated to the noise key.
    c = decor.commitment(s, b"r", 2, 7, 0)
    assert c == decor.commitment(s, b"r", 7, 2, 0) != decor.commitment(s, b"r", 2, 7, 1)
    assert c not in decor.edge_key(s, b"r", 2, 7, 0, decor.PURPOSE_NOISE).hex()


def test_simulator_correlated_terms_sum_to_zero_every_round():
    cfg = config.load(RING, SMALL)
    r = sim.simulate_learning(cfg, keep_correlated=True)
    C = r.correlated  # (rounds, n, dim)
    assert C.shape == (12, N, 4)
    scale = np.abs(C).max()
    assert scale > 50.0  # each node's term is of the order of sigma_cor
    assert np.abs(C.sum(axis=1)).max() <= 1e-12 * scale * N


# ------------------------------------------------------------------ 2. a networked run, cancelled


def _received_values(run_dir: Path, n: int, rounds: int) -> dict[tuple[int, int], np.ndarray]:
    """(round, sender) -> the value its neighbours received (all copies must agree)."""
    out: dict[tuple[int, int], np.ndarray] = {}
    for v in range(n):
        for rec in read_viewlog(run_dir / "logs" / f"node-{v}.vlog").records:
            if rec["k"] == "recv":
                key = (rec["step"], rec["peer"])
                val = np.asarray(rec["value"], dtype=np.float64)
                if key in out:
                    assert np.array_equal(out[key], val)
                out[key] = val
    assert len(out) == n * rounds
    return out


def test_networked_decor_run_cancels_its_correlated_noise_every_round(tmp_path):
    """Real peers, real X25519 exchange over the encrypted channels: from what went over the
    wire, the correlated parts of the n published values sum to zero every round, while each
    node's own part is of the order of sigma_cor."""
    out = tmp_path / "decor"
    R, dim, eta = 12, 4, 0.01
    summary = cfree_run_json(RING, SMALL, out)
    assert summary["failed"] == []
    cfg = config.load(out / "config.toml")
    plan = lp.make_plan(cfg)
    task = lp.make_task(cfg, N)
    streams = seeds.streams_of_run(out, N)

    # Every model equals the simulator's, which derives the pair secrets from the same keys.
    ref = sim.simulate_learning(cfg, streams=streams)
    for v in range(N):
        got = np.load(lp.models_path(out, v))
        assert np.array_equal(got, ref.models[:, v, :]), v

    sent = _received_values(out, N, R)
    for r in range(R):
        parts = []
        for v in range(N):
            theta = np.load(lp.models_path(out, v))[r]
            X, y = lp.batch(plan, task, v, r, streams)
            g = lp.clipped_grad(plan, task, theta, X, y)
            vbar = lp.gradient_noise(plan, v, r, streams)
            # thetahat = theta - eta (g + vbar + c)  =>  c = (theta - thetahat)/eta - g - vbar
            parts.append((theta - sent[(r, v)]) / eta - g - vbar)
        parts = np.stack(parts)
        assert np.abs(parts).max() > 10.0, r  # each node's correlated part is large ...
        assert np.abs(parts.sum(axis=0)).max() < 1e-9, (r, parts.sum(axis=0))  # ... and cancels
        assert parts.shape == (N, dim)

    # Both ends of every pair logged the same commitment every round; no secret in any log.
    secrets = decor.PairSecrets.of_streams(streams, plan.graph.edges())
    commits: dict[tuple[int, int, int], str] = {}
    for v in range(N):
        raw = (out / "logs" / f"node-{v}.vlog").read_bytes()
        for a, b in plan.graph.edges():
            s = secrets.secret(a, b)
            assert s not in raw and s.hex().encode() not in raw
        for rec in read_viewlog(out / "logs" / f"node-{v}.vlog").records:
            if rec["k"] == "decor-noise":
                assert rec["peers"] == plan.neighbours(v)
                for j, c in zip(rec["peers"], rec["commits"], strict=True):
                    commits[(rec["round"], v, j)] = c
    for (r, v, j), c in commits.items():
        assert commits[(r, j, v)] == c
        assert c == decor.commitment(secrets.secret(v, j), secrets.run_id, v, j, r)
    assert len(commits) == R * 2 * plan.graph.number_of_edges()

    # The audit of the fault-free run equals the plan.
    rep = audit.audit_run(out)
    want = audit.plan_report(cfg, source=None, method="exact")
    assert rep["fault_free"] and rep["complete"]
    assert rep["secldp"]["exact"]["eps"] == pytest.approx(want["secldp"]["exact"]["eps"], 1e-12)
    assert rep["secldp"]["paper"]["eps"] == pytest.approx(want["secldp"]["paper"]["eps"], 1e-12)
    assert rep["secldp"]["realised_pairs"]["matched_pairs_min"] == N
    worst = max(
        x["factor"] for o in rep["observers"] for x in o["losses"] if x["method"] == "exact"
    )
    assert worst == pytest.approx(want["worst_pair"]["factor"], 1e-12)


# ------------------------------------------------------------------------------- 3. a dropout


def _damaged_copy(src, dst, node: int, transform) -> None:
    """A copy of run directory ``src`` in which node's view log is rewritten record by record
    through ``transform(record) -> record | None`` (None drops it), with valid framing."""
    shutil.copytree(src, dst)
    path = dst / "logs" / f"node-{node}.vlog"
    vl = read_viewlog(path)
    path.unlink()
    w = ViewLogWriter(
        path, run_id=vl.header["run_id"], node=node, params=vl.header["params"], mode=0o600
    )
    for rec in vl.records:
        rec = transform(dict(rec))
        if rec is not None:
            fields = {k: v for k, v in rec.items() if k not in ("k", "seq", "t_mono", "t_wall")}
            w.write(rec["k"], **fields)
    w.close()


def test_decor_audit_applies_the_integrity_checks_of_every_family(tmp_path):
    """A DECOR run's logs get the same checks as every family's: a log that ends before the
    node finished, and a received value its sender logged differently, are findings, and the
    run is no longer fault-free."""
    out = tmp_path / "run"
    cfree_run_json(RING, [*SMALL, "protocol.rounds=3"], out)
    clean = audit.audit_run(out)
    assert clean["fault_free"] and clean["integrity"] == []

    cut = tmp_path / "unfinished"
    _damaged_copy(out, cut, 2, lambda r: None if r["k"] == "finished" else r)
    rep = audit.audit_run(cut)
    assert not rep["fault_free"] and not rep["complete"]
    assert {(x["node"], x["kind"]) for x in rep["integrity"]} == {(2, "unfinished")}

    edited = tmp_path / "edited"
    first = []

    def edit(r):
        if r["k"] == "recv" and not first:
            first.append(r)
            r["digest"] = "0" * 32
        return r

    _damaged_copy(out, edited, 1, edit)
    rep = audit.audit_run(edited)
    assert not rep["fault_free"]
    kinds = [(x["node"], x["kind"]) for x in rep["integrity"]]
    assert kinds == [(1, "digest-mismatch")], rep["integrity"]


@pytest.mark.slow  # a real kill, 6 to 8 s (the quick suite keeps test_integration's)
def test_killed_peer_drops_its_pairs_and_the_audit_counts_the_realised_pairs(tmp_path):
    """SIGKILL one peer in round 3: its neighbours miss its value, drop the pair from the next
    round (logged with the reason), finish, and the audit recomputes the guarantee on the pairs
    that were really used: the victim's neighbours lose privacy against the fault-free plan."""
    out = tmp_path / "kill"
    R = 20
    cfg = config.load(
        RING,
        [*SMALL, f"protocol.rounds={R}", "network.deadline_s=2", "privacy.sigma_cor=5.0"],
    )
    local.prepare_run_dir(cfg, out)
    victim = 2

    def on_event(node, ev, pid):
        if node == victim and ev.get("event") == "step" and ev.get("step") == 3:
            os.kill(pid, signal.SIGKILL)

    run = asyncio.run(
        local.launch_peers(cfg, out, show_progress=False, timeout_s=120, on_event=on_event)
    )
    codes = {o.node: o.returncode for o in run.outcomes}
    assert codes[victim] == -signal.SIGKILL, run.outcomes
    assert [o.node for o in run.failed] == [victim]

    drops = {}
    for v in (1, 3):  # the victim's neighbours on the ring
        recs = read_viewlog(out / "logs" / f"node-{v}.vlog").records
        (drop,) = [x for x in recs if x["k"] == "decor-drop"]
        assert drop["peer"] == victim, drop
        assert drop["reason"] == "peer-down" or "deadlines missed" in drop["reason"], drop
        drops[v] = drop["first_round"]
        for x in recs:
            if x["k"] == "decor-noise":
                assert (victim in x["peers"]) == (x["round"] < drop["first_round"]), x
        json.loads((out / "results" / f"node-{v}.json").read_text())  # it finished
    assert all(3 <= f <= 8 for f in drops.values()), drops  # right after the kill

    rep = audit.audit_run(out)
    plan_rep = audit.plan_report(cfg, source=None, method="exact")
    assert not rep["fault_free"]
    rp = rep["secldp"]["realised_pairs"]
    # All N ring pairs cancel before the kill; at most N - 2 once the victim's two are gone
    # (a neighbour slowed down by the crash may lose another pair for a while under load).
    assert rp["matched_pairs_max"] == N and rp["matched_pairs_min"] <= N - 2
    per_node = rep["secldp"]["per_node_eps"]
    planned = plan_rep["secldp"]["per_node_eps"]
    for v in (1, 3):
        assert per_node[v] > planned[v] * 1.05, (v, per_node[v], planned[v])
    # It published only its first rounds, but its log is cut: the audit cannot certify that,
    # so its figure is the plan's, and what the logs gave is kept beside it.
    assert per_node[victim] == planned[victim]
    assert rep["secldp"]["lists_from_logs"]["per_node_eps"][victim] < planned[victim]
    # The victim's pair with each neighbour v stops cancelling at v's first round without it
    # (one-sided terms from a kill mid-round are noted apart, and depend on the timing).
    assert rp["matched_pair_rounds"] <= N * R - sum(R - f for f in drops.values()), (rp, drops)


# ----------------------------------------------------------------------- 4. calibration, config


def test_calibration_round_trip_meets_the_target():
    cfg = config.load(RING, SMALL)
    cal = audit.calibrate(cfg, 3.0, method="exact", budget="worst", decor_pair="mid")
    assert cal["eps"] == pytest.approx(3.0, rel=1e-6)
    c2 = config.load(
        RING, [*SMALL, f"privacy.sigma={cal['sigma']!r}", f"privacy.sigma_cor={cal['sigma_cor']!r}"]
    )
    rep = audit.plan_report(c2, source=None, method="exact")
    assert rep["secldp"]["exact"]["eps"] == pytest.approx(3.0, rel=1e-6)
    assert cal["sigma_cdp_floor"] < cal["low"]["sigma_cdp"] < cal["mid"]["sigma_cdp"]
    assert cal["low"]["sigma_cor"] > cal["mid"]["sigma_cor"] > cal["high"]["sigma_cor"]
    assert cal["high"]["sigma_cor"] == pytest.approx(0.0, abs=1e-6 * cal["sigma_ldp"])
    # Curious users need more noise than an eavesdropper for the same target.
    q1 = config.load(RING, [*SMALL, "privacy.collusion=1"])
    cal1 = audit.calibrate(q1, 3.0, method="exact", budget="worst", decor_pair="mid")
    assert cal1["sigma_ldp"] == pytest.approx(cal["sigma_ldp"])
    assert cal1["sigma_cdp_floor"] > cal["sigma_cdp_floor"]


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["protocol.name=dsgd"], "privacy.sigma_cor and privacy.collusion belong to"),
        (["privacy.collusion=5"], "leaves fewer than 2 honest nodes"),
        (["privacy.sigma_cor=-1"], "privacy.sigma_cor must be"),
        (["data.partition=iid"], 'data.partition = "ordered"'),
        (["protocol.clipping=user"], "protocol.clipping 'user' unknown"),
        (["graph.kind=torus", "graph.rows=2", "graph.cols=3"], "a torus needs"),
    ],
)
def test_decor_config_errors_name_the_key(overrides, expected):
    with pytest.raises(ConfigError, match=None) as e:
        config.load(RING, [*SMALL, *overrides])
    assert expected in str(e.value) and "decor-ring.toml" in str(e.value)
