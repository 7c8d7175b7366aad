"""Logs without a shared disk: each peer ships its finished view log and result to the auditor's
collector over an authenticated channel; the collector checks every file against the peer's
manifest (size and SHA-256) and writes only what matches; a log that never arrives is a
`missing-log` finding of the audit."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from memrun import write_run_dir

from coordinator_free import config, rundir
from coordinator_free import roster as roster_mod
from coordinator_free.accounting.audit import audit_run
from coordinator_free.cluster import shiplogs
from coordinator_free.inmemory import run_config


def _runs(tmp_path, n=4):
    """A finished run of n nodes (their own disks: ``nodes``) and the auditor's run directory
    (config and roster only, plus node 0's files: node 0 ran on the auditor's host)."""
    cfg = config.load(None, [f"graph.nodes={n}", "protocol.steps=4", "network.deadline_s=1"])
    ros = roster_mod.generate_keys(
        n, tmp_path / "keys", hosts=[(f"peer-{i}", 7000) for i in range(n)]
    )
    nodes = write_run_dir(cfg, run_config(cfg, None, seed=1), tmp_path / "nodes", ros.run_id)
    roster_mod.save_roster(rundir.roster_path(nodes), ros)
    aud = tmp_path / "auditor"
    (aud / "logs").mkdir(parents=True)
    (aud / "results").mkdir()
    for name in ("config.toml", "roster.json"):
        shutil.copy(nodes / name, aud / name)
    shutil.copy(rundir.log_path(nodes, 0), rundir.log_path(aud, 0))
    shutil.copy(rundir.result_path(nodes, 0), rundir.result_path(aud, 0))
    return cfg, ros, nodes, aud


def test_shipped_logs_reach_the_auditor_checked_and_a_missing_one_is_named(tmp_path):
    cfg, ros, nodes, aud = _runs(tmp_path)
    said: list[str] = []

    async def scenario():
        ckey = tmp_path / "keys" / "collector.key"
        desc = shiplogs.make_collector(ckey, "127.0.0.1", 0)
        col = shiplogs.LogCollector(aud, roster_mod.load_private_key(ckey), ros, say=said.append)
        port = await col.start("127.0.0.1", 0)
        desc = shiplogs.Collector("127.0.0.1", port, desc.public_key)
        keys = [roster_mod.load_private_key(tmp_path / "keys" / f"node-{i}.key") for i in range(4)]
        answers = {}
        for i in (0, 1, 2):  # node 3 never ships (killed, or its host unreachable)
            answers[i] = await shiplogs.ship(
                nodes, i, keys[i], ros, desc, within_s=10, say=said.append
            )
        # A key that is not node 3's cannot ship node 3's files, even with a roster that says
        # it is: the collector authenticates against the real roster, and writes nothing.
        other = X25519PrivateKey.generate()
        entries = list(ros.entries)
        entries[3] = dataclasses.replace(entries[3], public_key=roster_mod.public_bytes(other))
        lie = dataclasses.replace(ros, entries=tuple(entries))
        forged = await shiplogs.ship(nodes, 3, other, lie, desc, within_s=1, say=said.append)
        await col.close()
        return answers, forged

    answers, forged = asyncio.run(scenario())
    assert forged is None
    assert any("connection failed" in m and "node 3" in m for m in said), said
    assert answers[0] == {"log": "already here, identical", "result": "already here, identical"}
    assert answers[1] == answers[2] == {"log": "written", "result": "written"}
    for i in (0, 1, 2):
        assert rundir.log_path(aud, i).read_bytes() == rundir.log_path(nodes, i).read_bytes()
        assert rundir.result_path(aud, i).read_bytes() == rundir.result_path(nodes, i).read_bytes()
    assert not rundir.log_path(aud, 3).exists() and not rundir.result_path(aud, 3).exists()
    collected = json.loads((aud / shiplogs.COLLECTED_FILE).read_text())
    assert sorted(collected) == ["0", "1", "2"]
    assert collected["1"]["log"]["sha256"] == shiplogs._digest(rundir.log_path(nodes, 1))[1]
    rep = audit_run(aud)
    assert rep["fault_free"] is False
    missing = [f for f in rep["integrity"] if f["kind"] == "missing-log"]
    assert [f["node"] for f in missing] == [3], rep["integrity"]
    # The audit of the full set (what a shared disk would have shown) is fault-free.
    assert audit_run(nodes)["fault_free"] is True


def test_bytes_that_do_not_match_the_manifest_are_refused(tmp_path, monkeypatch):
    cfg, ros, nodes, aud = _runs(tmp_path)
    real = shiplogs._digest

    def lying(path):  # the manifest promises other bytes than those sent
        size, sha = real(path)
        return size, "0" * 64 if path.name.endswith(".vlog") else sha

    async def scenario():
        ckey = tmp_path / "keys" / "collector.key"
        desc = shiplogs.make_collector(ckey, "127.0.0.1", 0)
        col = shiplogs.LogCollector(aud, roster_mod.load_private_key(ckey), ros, say=lambda m: None)
        port = await col.start("127.0.0.1", 0)
        key = roster_mod.load_private_key(tmp_path / "keys" / "node-2.key")
        monkeypatch.setattr(shiplogs, "_digest", lying)
        answer = await shiplogs.ship(
            nodes, 2, key, ros, shiplogs.Collector("127.0.0.1", port, desc.public_key),
            within_s=5, say=lambda m: None,
        )  # fmt: skip
        monkeypatch.setattr(shiplogs, "_digest", real)
        await col.close()
        return answer

    answer = asyncio.run(scenario())
    assert answer["log"].startswith("refused") and answer["result"] == "written"
    assert not rundir.log_path(aud, 2).exists()
    assert [f["node"] for f in audit_run(aud)["integrity"] if f["kind"] == "missing-log"] == [
        1,
        2,
        3,
    ]


def test_the_auditor_role_collects_every_peer_then_audits(tmp_path, capsys):
    """The stack's auditor (`audit --collect-key`): a collector runs while it waits, the wait
    ends once every peer has shipped, and the audit of the gathered directory is the full one."""
    import socket
    import threading

    from coordinator_free.cluster import compose

    cfg, ros, nodes, aud = _runs(tmp_path)
    (aud / "logs" / "node-0.vlog").unlink()  # nothing on the auditor's disk at all
    (aud / "results" / "node-0.json").unlink()
    ckey = tmp_path / "keys" / "collector.key"
    pub = shiplogs.make_collector(ckey, "127.0.0.1").public_key
    with socket.socket() as s:  # a free port for the collector
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done: list = []
    role = threading.Thread(
        target=lambda: done.append(
            compose.audit_role(
                aud, wait_for=4, timeout_s=120, idle_s=120, collect_key=ckey, collect_port=port
            )
        )
    )
    role.start()
    desc = shiplogs.Collector("127.0.0.1", port, pub)

    async def peers():
        keys = [roster_mod.load_private_key(tmp_path / "keys" / f"node-{i}.key") for i in range(4)]
        return await asyncio.gather(
            *(shiplogs.ship(nodes, i, keys[i], ros, desc, within_s=60, say=print) for i in range(4))
        )

    answers = asyncio.run(peers())
    role.join(120)
    assert not role.is_alive() and len(done) == 1
    assert all(a == {"log": "written", "result": "written"} for a in answers), answers
    rep = done[0]
    assert rep["fault_free"] is True and rep["integrity"] == []
    saved = json.loads((aud / "audit.json").read_text())
    assert saved["written_by"]["role"] == "auditor job"
    assert sorted(json.loads((aud / shiplogs.COLLECTED_FILE).read_text())) == ["0", "1", "2", "3"]
    assert "collecting the peers' logs on port" in capsys.readouterr().out
