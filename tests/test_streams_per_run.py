"""A node's secret streams never repeat across runs: they are derived from its private key
salted by the run id, a digest of the config and a nonce the peer draws at start. A second run
with the same roster, keys and config draws other values and noise; the nonce in each node's
view log lets the launcher rebuild a run's streams exactly."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from netrun import cfree_run_json

from coordinator_free import config, rundir, seeds, sim
from coordinator_free import roster as roster_mod
from coordinator_free.cluster import local
from coordinator_free.families.averaging import protocol as mf
from coordinator_free.peer import runner
from coordinator_free.viewlog import read_viewlog

ROOT = Path(__file__).resolve().parent.parent
KEY = X25519PrivateKey.from_private_bytes(bytes(range(32)))
RUN_ID = b"0123456789abcdef"
DIGEST = seeds.config_digest(config.load(None))
NONCE = bytes(range(16))


def streams(*, digest: bytes = DIGEST, nonce: bytes = NONCE, run_id: bytes = RUN_ID, node=0):
    return seeds.NodeSecretStreams(KEY, run_id, node, config_digest=digest, nonce=nonce)


def draws(s: seeds.NodeSecretStreams) -> np.ndarray:
    """A node's private value, noise and minibatch draws, and its derived key material."""
    v = s.node
    parts = [s.stream(p, v, r).standard_normal(4) for p in (1, 2, 3, 5) for r in (0, 7)]
    derived = np.frombuffer(s.derive(b"some purpose"), dtype=np.uint8).astype(float)
    return np.concatenate([*parts, derived])


def test_the_same_inputs_give_the_same_streams():
    assert np.array_equal(draws(streams()), draws(streams()))


@pytest.mark.parametrize(
    "change",
    [
        {"digest": seeds.config_digest(config.load(None, ["privacy.sigma=2"]))},
        {"nonce": bytes(15) + b"\x01"},
        {"run_id": b"another run id!!"},
    ],
    ids=["config", "nonce", "run-id"],
)
def test_another_config_nonce_or_run_gives_other_streams(change):
    a, b = draws(streams()), draws(streams(**change))
    # Every draw differs (not merely the vector as a whole).
    assert not np.any(a[:-32] == b[:-32])
    assert not np.array_equal(a[-32:], b[-32:])


def test_config_digest_is_canonical_and_covers_every_key():
    cfg = config.load(None)
    assert seeds.config_digest(cfg) == seeds.config_digest(cfg.to_dict())
    # Key order does not matter; any value does.
    shuffled = {s: dict(reversed(list(t.items()))) for s, t in reversed(cfg.to_dict().items())}
    assert seeds.config_digest(shuffled) == seeds.config_digest(cfg)
    for override in ("run.seed=1", "graph.nodes=9", "network.deadline_s=9"):
        assert seeds.config_digest(config.load(None, [override])) != seeds.config_digest(cfg)


def test_fresh_nonces_differ_and_bad_lengths_are_refused():
    assert len({seeds.fresh_nonce() for _ in range(64)}) == 64
    with pytest.raises(seeds.StreamsError, match="nonce is 16 bytes"):
        streams(nonce=bytes(8))
    with pytest.raises(seeds.StreamsError, match="digest is 32 bytes"):
        streams(digest=bytes(16))


# ---------------------------------------------------------------- two real runs, one roster

N = 4


def run_with(cfg, ros: roster_mod.Roster, key_dir: Path, out: Path) -> None:
    """Run every peer of ``ros`` in this process (real channels on loopback) into ``out``,
    laid out as a run directory (config, roster, keys, logs, results)."""
    socks = local.bind_sockets("127.0.0.1", N, 0)
    ros = ros.with_addresses([s.getsockname()[:2] for s in socks])
    out.mkdir(parents=True)
    (rundir.config_path(out)).write_text(cfg.to_toml())
    roster_mod.save_roster(rundir.roster_path(out), ros)
    shutil.copytree(key_dir, out / "keys")
    keys = [roster_mod.load_private_key(roster_mod.key_path(key_dir, v)) for v in range(N)]

    async def main():
        await asyncio.gather(
            *(runner.run_peer(cfg, ros, v, keys[v], out, listen_sock=socks[v]) for v in range(N))
        )

    asyncio.run(main())


def received(out: Path, observer: int, sender: int, step: int) -> np.ndarray:
    (rec,) = [
        r
        for r in read_viewlog(rundir.log_path(out, observer)).of_kind("recv")
        if r["peer"] == sender and r["step"] == step
    ]
    return np.asarray(rec["value"])


def estimates(out: Path) -> np.ndarray:
    import json

    return np.array(
        [json.loads(rundir.result_path(out, v).read_text())["estimate"] for v in range(N)]
    )


def test_a_second_run_with_the_same_roster_and_keys_draws_fresh_values_and_noise(tmp_path):
    cfg = config.load(None, [f"graph.nodes={N}", "protocol.steps=4", "network.deadline_s=5"])
    key_dir = tmp_path / "keys"
    ros = roster_mod.generate_keys(N, key_dir, name="twice")
    a, b = tmp_path / "a", tmp_path / "b"
    run_with(cfg, ros, key_dir, a)
    run_with(cfg, ros, key_dir, b)

    # What a neighbour sees of node 0 differs from run to run at every step.
    for t in range(4):
        assert not np.any(received(a, 1, 0, t) == received(b, 1, 0, t)), t
    # Each node logged one nonce, a different one in each run, and the same config digest.
    for v in range(N):
        na, da = seeds.read_streams_record(rundir.log_path(a, v))
        nb, db = seeds.read_streams_record(rundir.log_path(b, v))
        assert na != nb and da == db == seeds.config_digest(cfg)
    sa, sb = seeds.streams_of_run(a, N), seeds.streams_of_run(b, N)
    for v in range(N):
        assert not np.any(mf.private_value(cfg, v, sa) == mf.private_value(cfg, v, sb))
        noise_a = sa.stream(seeds.PURPOSE_NOISE, v, 0).standard_normal(8)
        noise_b = sb.stream(seeds.PURPOSE_NOISE, v, 0).standard_normal(8)
        assert not np.any(noise_a == noise_b)
    # And the rebuilt streams are the ones each run used: the simulator reproduces it exactly.
    for out, s in ((a, sa), (b, sb)):
        assert np.array_equal(estimates(out), sim.simulate(cfg, streams=s).finals)
    assert not np.any(estimates(a) == estimates(b))


def test_streams_of_run_names_a_node_without_a_nonce(tmp_path):
    cfg = config.load(None, [f"graph.nodes={N}", "protocol.steps=2", "network.deadline_s=5"])
    key_dir = tmp_path / "keys"
    ros = roster_mod.generate_keys(N, key_dir)
    run_with(cfg, ros, key_dir, tmp_path / "run")
    # Asked twice about unchanged files, the launcher reads the logs once; a change is seen.
    first = seeds.streams_of_run(tmp_path / "run", N)
    assert seeds.streams_of_run(tmp_path / "run", N) is first
    first.stream(seeds.PURPOSE_DATA, 2)
    rundir.log_path(tmp_path / "run", 2).unlink()
    s = seeds.streams_of_run(tmp_path / "run", N)
    assert s is not first
    s.stream(seeds.PURPOSE_DATA, 1)  # the others are intact
    with pytest.raises(seeds.StreamsError, match="node 2's streams cannot be rebuilt"):
        s.stream(seeds.PURPOSE_DATA, 2)


@pytest.mark.slow  # exhaustive or long: in the slow suite, which CI runs
@pytest.mark.parametrize(
    "example, sets",
    [
        ("muffliato-ring", ["graph.nodes=4"]),
        ("decor-ring", ["graph.nodes=4", "protocol.rounds=3"]),
    ],
)
def test_cfree_run_is_still_the_simulator_bit_for_bit(tmp_path, example, sets):
    summary = cfree_run_json(ROOT / "examples" / f"{example}.toml", sets, tmp_path / "run")
    assert summary["simulator_max_abs_diff"] == 0.0
