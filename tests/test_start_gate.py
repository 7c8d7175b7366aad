"""The local launcher's start signal (cluster/local.py, StartGate): the peers of a run take their
first step together, once every one has connected, and a peer's connect timeout counts from
then. Real peer processes on loopback.

Without it, a peer that came up after its neighbours' connect timeout (the last of 1024 forked
peers starts a minute after the first on two cores) found them gone, and a neighbour up but
still waiting for its own neighbours missed the first step's deadline."""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import sys

import pytest

from coordinator_free import config, roster, rundir
from coordinator_free.cluster import local
from coordinator_free.viewlog import read_viewlog

LATE_S = 4.0


@pytest.mark.slow  # a real-process run that waits out a 4 s late start
def test_a_peer_up_after_its_neighbours_connect_timeout_still_joins_a_fault_free_run(tmp_path):
    """A 4-ring, connect timeout and step deadline 1.5 s, node 3 started 4 s after the rest:
    every node finishes, nothing missed, and the first step of every node comes after the late
    one connected."""
    cfg = config.load(
        None,
        ["graph.kind=ring", "graph.nodes=4", "protocol.steps=3", "protocol.accelerated=false",
         "network.deadline_s=1.5", "network.connect_timeout_s=1.5"],
    )  # fmt: skip
    out = tmp_path / "run"
    local.prepare_run_dir(cfg, out)
    plan = local.make_plan(cfg)
    socks = local.bind_sockets("127.0.0.1", plan.n, 0)
    hosts = [("127.0.0.1", s.getsockname()[1]) for s in socks]
    ros = roster.generate_keys(plan.n, out / "keys", hosts=hosts, name=cfg.run.name)
    roster.save_roster(rundir.roster_path(out), ros)

    def command(i, argv):
        fd = socks[i].fileno()
        argv = [*argv, "--listen-fd", str(fd)]
        if i == 3:  # the late one
            argv = ["sh", "-c", f"sleep {LATE_S}; exec {shlex.join(argv)}"]
        return argv, (fd,)

    run = asyncio.run(
        local.supervise_peers(
            cfg, plan, out, command, show_progress=False, timeout_s=120,
            after_spawn=lambda: [s.close() for s in socks],
        )
    )  # fmt: skip
    assert not run.failed, [(o.node, o.error) for o in run.failed]
    logs = {v: list(read_viewlog(rundir.log_path(out, v)).records) for v in range(plan.n)}
    for v in range(plan.n):
        res = json.loads(rundir.result_path(out, v).read_text())
        assert res["missed"] == [] and res["steps"] == 3
    late = next(r["t_mono"] for r in logs[3] if r["k"] == "connected")
    first = [next(r["t_mono"] for r in logs[v] if r["k"] == "send") for v in range(plan.n)]
    assert min(first) >= late, (first, late)


def test_a_start_descriptor_that_is_not_open_is_a_clear_error(tmp_path):
    keys = tmp_path / "keys"
    roster.save_roster(tmp_path / "roster.json", roster.generate_keys(3, keys))
    (tmp_path / "c.toml").write_text(
        config.load(None, ["graph.kind=ring", "graph.nodes=3"]).to_toml()
    )
    proc = subprocess.run(
        [sys.executable, "-m", "coordinator_free", "peer", "--config", "c.toml", "--roster",
         "roster.json", "--key", str(roster.key_path(keys, 0)), "--id", "0",
         "--out", str(tmp_path), "--start-fd", "987"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "cfree peer: --start-fd 987: Bad file descriptor" in proc.stderr
