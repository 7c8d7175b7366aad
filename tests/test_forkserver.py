"""The fork server: peers forked from one process that imported everything once.

Real processes throughout: a real server process, real forked children, real pipes and signals.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from netrun import wait_gone

from coordinator_free.cluster.forkserver import ForkServer, ForkServerError

# Preload little: these tests are about the mechanism, not the import time it saves.
LIGHT = ("coordinator_free.peer.command",)


def _gone(pid: int) -> bool:
    """No such process, or only its exit status left (a zombie whose parent is gone)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


@pytest.fixture
def waiting_peer(tmp_path):
    """argv of ``cfree peer`` for node 0 or 1 of a 3-ring whose node 2 never comes: it
    listens on the inherited socket ``fd``, reports it, and waits two minutes to connect."""
    keys = tmp_path / "keys"
    subprocess.run(
        [sys.executable, "-m", "coordinator_free", "keygen", "--hosts",
         "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "--out", str(keys)],
        check=True, capture_output=True,
    )  # fmt: skip
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        "[graph]\nkind='ring'\nnodes=3\n[network]\nconnect_timeout_s=120\n[run]\nname='fs'\n"
    )

    def argv(node: int, fd: int) -> list[str]:
        return ["peer", "--config", str(cfg), "--roster", str(keys / "roster.json"),
                "--key", str(keys / "keys" / f"node-{node}.key"), "--id", str(node),
                "--out", str(tmp_path / "run"), "--listen-fd", str(fd),
                "--progress-fd", "1"]  # fmt: skip

    return argv


def test_children_run_cfree_with_their_own_streams_and_exit_codes(tmp_path):
    async def main():
        server = ForkServer.start(LIGHT)
        try:
            ok = await server.spawn(["peer", "--help"])
            bad = await server.spawn(["peer", "--id", "banana"])
            outs = [await ok.stdout.read(), await bad.stdout.read()]
            errs = [await ok.stderr.read(), await bad.stderr.read()]
            codes = [await ok.wait(), await bad.wait()]
            return ok, bad, outs, errs, codes
        finally:
            await server.close()

    ok, bad, outs, errs, codes = asyncio.run(main())
    assert ok.pid != bad.pid and ok.pid != os.getpid()
    assert outs[0].decode().startswith("usage: cfree peer")
    assert codes == [0, 2]
    assert ok.returncode == 0 and bad.returncode == 2
    assert b"banana" in errs[1]  # the child's stderr is its own pipe


def test_a_child_gets_the_launchers_descriptors_under_the_same_numbers(tmp_path):
    """--listen-fd N: the launcher's descriptor N must be N in the child. Here the child writes
    its result to an inherited pipe given as its progress descriptor (``cfree peer`` writes a
    ``failed`` event there when its config is unreadable)."""
    r, w = os.pipe()
    target = 200 if w != 200 else 201
    os.dup2(w, target)
    os.close(w)

    async def main():
        server = ForkServer.start(LIGHT)
        try:
            child = await server.spawn(
                ["peer", "--config", str(tmp_path / "missing.toml"), "--roster", "r.json",
                 "--key", "k", "--id", "0", "--out", str(tmp_path), "--progress-fd",
                 str(target)],
                pass_fds=(target,),
            )  # fmt: skip
            os.close(target)
            err = await child.stderr.read()
            return await child.wait(), err
        finally:
            await server.close()

    code, err = asyncio.run(main())
    assert code == 2
    assert b"missing.toml" in err
    # The child closed its end and no one else holds the pipe's write end: EOF, not a hang.
    os.set_blocking(r, True)
    assert os.read(r, 100) == b""
    os.close(r)


def test_a_killed_child_reports_the_signal_and_the_server_ends_the_rest(waiting_peer):
    socks = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    fds = [s.fileno() for s in socks]

    async def main():
        server = ForkServer.start()
        a = await server.spawn(waiting_peer(0, fds[0]), pass_fds=(fds[0],))
        b = await server.spawn(waiting_peer(1, fds[1]), pass_fds=(fds[1],))
        for s in socks:
            s.close()
        for p in (a, b):  # both up and waiting for their neighbour
            line = await asyncio.wait_for(p.stdout.readline(), 60)
            assert line, (await p.stderr.read()).decode()
            assert json.loads(line)["event"] == "listening"
        a.kill()
        code = await asyncio.wait_for(a.wait(), 30)
        assert b.returncode is None and not _gone(b.pid)
        await server.close()
        return code, b.pid, wait_gone(b.pid, 10)

    code, other, gone = asyncio.run(main())
    assert code == -signal.SIGKILL
    assert gone, f"peer {other} outlived the fork server"


def test_children_do_not_outlive_a_launcher_that_dies(waiting_peer):
    """A launcher SIGKILLed mid-run: the server sees its channel close, gives its peers the
    grace period to end by themselves (this one waits to connect: it does not), kills them and
    ends."""
    script = textwrap.dedent(
        f"""
        import asyncio, json, socket
        from coordinator_free.cluster.forkserver import ForkServer

        async def main():
            sock = socket.create_server(("127.0.0.1", 0))
            fd = sock.fileno()
            argv = {waiting_peer(0, 12345)!r}
            argv[argv.index("12345")] = str(fd)
            server = ForkServer.start(grace_s=1)
            child = await server.spawn(argv, pass_fds=(fd,))
            assert json.loads(await child.stdout.readline())["event"] == "listening"
            print(server.pid, child.pid, flush=True)
            await asyncio.sleep(3600)

        asyncio.run(main())
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        server_pid, child_pid = map(int, proc.stdout.readline().split())
        assert not _gone(server_pid) and not _gone(child_pid)
        proc.kill()
        proc.wait(10)
        assert wait_gone(child_pid, 10), "a peer outlived its launcher"
        assert wait_gone(server_pid, 10), "the fork server outlived its launcher"
    finally:
        proc.kill()


def test_a_server_that_cannot_start_is_a_clear_error():
    async def main():
        server = ForkServer.start(("coordinator_free.no_such_module",))
        try:
            with pytest.raises(ForkServerError, match="no_such_module"):
                await asyncio.wait_for(server.spawn(["peer", "--help"]), 60)
        finally:
            await server.close()

    asyncio.run(main())


def test_a_shared_plan_and_roster_serve_only_the_same_keys_and_bytes(tmp_path, monkeypatch):
    """What the server makes once for its children (families.share_plan, roster.share_roster)
    is handed out only for a config equal in every key (wherever it was read from) and for a
    roster file of the same bytes; anything else is made afresh, errors included."""
    from coordinator_free import config, families
    from coordinator_free import roster as roster_mod

    monkeypatch.setattr(families, "_shared", None)
    monkeypatch.setattr(roster_mod, "_shared", None)
    ring = Path(__file__).resolve().parent.parent / "examples" / "muffliato-ring.toml"
    cfg = config.load(ring, ["graph.nodes=8"])
    assert families.shared_plan(cfg) is None
    plan = families.share_plan(cfg)
    copy = tmp_path / "config.toml"
    copy.write_text(cfg.to_toml())
    assert families.shared_plan(config.load(copy)) is plan  # same keys, another file
    assert families.shared_plan(config.load(copy, ["protocol.steps=7"])) is None
    assert families.shared_plan(config.load(copy, ["graph.nodes=9"])) is None

    path = tmp_path / "roster.json"
    roster_mod.save_roster(path, roster_mod.generate_keys(3, tmp_path / "k1"))
    shared = roster_mod.share_roster(path)
    assert roster_mod.load_roster(path) is shared
    other = roster_mod.generate_keys(3, tmp_path / "k2")
    path.unlink()
    roster_mod.save_roster(path, other)  # the same file, other bytes: parsed again
    got = roster_mod.load_roster(path)
    assert got is not shared and got == other
    path.write_text("{")
    with pytest.raises(roster_mod.RosterError, match="invalid JSON"):
        roster_mod.load_roster(path)


def test_the_server_makes_a_runs_plan_and_roster_once_or_says_why_not(tmp_path, waiting_peer):
    """share_run: the server makes the plan and parses the roster before it forks the peers
    (they share both); a file it cannot read is a clear error, and the server keeps serving."""
    argv = waiting_peer(0, 99)
    cfg = argv[argv.index("--config") + 1]
    ros = argv[argv.index("--roster") + 1]

    async def main():
        server = ForkServer.start(LIGHT)
        try:
            await asyncio.wait_for(server.share_run(cfg, ros), 120)
            with pytest.raises(ForkServerError, match="missing.json"):
                await asyncio.wait_for(server.share_run(cfg, tmp_path / "missing.json"), 60)
            child = await server.spawn(["peer", "--help"])
            return await child.wait()
        finally:
            await server.close()

    assert asyncio.run(main()) == 0
