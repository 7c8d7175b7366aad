"""Local runs know their memory: `cfree run` and `cfree lab run` estimate what their peers will
take (a measured figure per peer plus each peer's copy of the plan) and refuse, before any peer
starts, a run that will not fit the machine; an interrupted run ends with every peer gone.

The quick tests need no peers; the slow ones measure a real run's PSS against the estimate and
interrupt a running cluster."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netrun import sigint_default

from coordinator_free import config
from coordinator_free.cli import main
from coordinator_free.cluster import local
from coordinator_free.families import make_plan

ROOT = Path(__file__).resolve().parent.parent
RING = ROOT / "examples" / "muffliato-ring.toml"
GIB = 2**30


def _no_peers(monkeypatch):
    """Starting a peer (or the fork server) fails the test."""

    def boom(*a, **k):
        raise AssertionError("a peer was started")

    monkeypatch.setattr(local, "launch_peers", boom)
    monkeypatch.setattr(local.ForkServer, "start", boom)


def test_2000_peers_are_refused_on_a_24_gib_machine_before_any_starts(
    tmp_path, monkeypatch, capsys
):
    """Measured: a forked peer takes about 10.5 MiB (PSS and the kernel's memory for it), so
    2000 take about 21 GiB, over 80 % of 22 GiB; the run is refused with the key, the estimate
    and the override, and nothing is written."""
    monkeypatch.setattr(local, "available_memory", lambda: 22 * GIB)  # a 24 GiB machine, idle
    _no_peers(monkeypatch)
    out = tmp_path / "run"
    argv = ["run", str(RING), "--set", "graph.nodes=2000", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "graph.nodes=2000: 2000 peer processes need about" in err
    assert "--no-memory-check" in err and "nothing was started" in err
    est = local.estimate_memory(make_plan(config.load(RING, ["graph.nodes=2000"])), "fork")
    assert f"{est.total_bytes / GIB:.1f} GiB" in err
    # At least the measured 10.5 MiB a peer, and the n x n plan they share, once.
    assert est.per_peer_bytes >= 10.5 * 2**20 and est.plan_bytes >= 8 * 2000**2
    assert est.total_bytes == 2000 * est.per_peer_bytes + est.plan_bytes
    assert not out.exists()
    # The lab starts fresh interpreters (exec): more per peer, refused sooner.
    assert main(["lab", "run", str(RING), "--set", "graph.nodes=400"]) == 2
    err = capsys.readouterr().err
    assert "graph.nodes=400: 400 peer processes" in err and "per peer interpreter" in err


def test_the_estimate_scales_with_the_plan_and_names_the_size_keys():
    cube = config.load(ROOT / "examples" / "muffliato-hypercube.toml", ["graph.dim=11"])
    plan = make_plan(cube)
    est = local.estimate_memory(plan, "fork", available=1 * GIB)
    assert not est.fits and est.peers == 2048
    assert est.plan_bytes >= 8 * 2048**2  # the n x n matrix the forked peers share
    assert local.size_keys(cube, 2048) == "graph.dim=11 (2048 nodes)"
    small_plan = make_plan(config.load(RING))
    small = local.estimate_memory(small_plan, "fork", available=1 * GIB)
    base = int(local.PEER_BASE_MIB["fork"] * 2**20)
    assert small.fits and small.per_peer_bytes == base
    assert small.total_bytes == small_plan.n * base + small.plan_bytes
    # Fresh interpreters each make their own plan.
    fresh = local.estimate_memory(small_plan, "exec", available=1 * GIB)
    assert fresh.per_peer_bytes == int(local.PEER_BASE_MIB["exec"] * 2**20) + fresh.plan_bytes
    assert fresh.total_bytes == small_plan.n * fresh.per_peer_bytes
    # Unknown available memory (no /proc/meminfo): nothing to refuse against.
    unknown = local.MemoryEstimate(2048, "fork", est.base_bytes, est.plan_bytes, None)
    assert unknown.fits


def test_a_run_that_fits_is_not_refused_and_the_override_lets_a_big_one_start(monkeypatch):
    monkeypatch.setattr(local, "available_memory", lambda: 22 * GIB)
    cfg = config.load(RING, ["graph.nodes=2000"])
    plan = make_plan(cfg)
    with pytest.raises(local.LaunchError, match="graph.nodes=2000"):
        local.check_memory(cfg, plan)
    assert local.check_memory(cfg, plan, allow=True).total_bytes > 22 * GIB
    ok = config.load(RING, ["graph.nodes=256"])
    assert local.check_memory(ok, make_plan(ok)).fits
    # The default hypercube: 1024 forked peers start (measured: 9.5 GiB of PSS), 2048 do not.
    cube = config.load(None, ["graph.nodes=1024"], default=config.RUN_DEFAULT_CONFIG)
    assert local.check_memory(cube, make_plan(cube)).fits
    cube = config.load(None, ["graph.nodes=2048"], default=config.RUN_DEFAULT_CONFIG)
    with pytest.raises(local.LaunchError, match=r"graph.dim=11 \(2048 nodes\)"):
        local.check_memory(cube, make_plan(cube))


# ------------------------------------------------------------------------------ slow: measured


def _pss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


@pytest.mark.slow
def test_the_estimate_covers_the_measured_memory_of_a_real_run(tmp_path):
    """64 forked peers: the peak of their summed PSS, sampled while they run, is at most the
    estimate, and the estimate is not wildly above it (measured here: 10 to 11.5 MiB a peer,
    the estimate 13 with the kernel's memory and a margin). A peer that copied the preloaded
    modules (no gc.freeze in the fork server) took 38 MiB."""
    if not Path("/proc/self/smaps_rollup").exists():
        pytest.skip("no /proc/<pid>/smaps_rollup to measure with")
    cfg = config.load(RING, ["graph.nodes=64", "protocol.steps=300"])
    plan = make_plan(cfg)
    est = local.estimate_memory(plan, "fork")
    out = tmp_path / "run"
    local.prepare_run_dir(cfg, out)
    pids: dict[int, int] = {}
    peak = {"sum": 0, "peers": 0}
    last = [0.0]

    def on_event(node, ev, pid):
        pids[node] = pid
        now = time.monotonic()
        if len(pids) == plan.n and now - last[0] >= 0.2:
            last[0] = now
            total = sum(_pss(p) for p in pids.values())
            if total > peak["sum"]:
                peak.update(sum=total, peers=len(pids))

    on_event.needs_steps = True
    run = asyncio.run(local.launch_peers(cfg, out, show_progress=False, on_event=on_event))
    assert not run.failed, [(o.node, o.error) for o in run.failed]
    assert peak["peers"] == 64 and peak["sum"] > 0
    measured = peak["sum"] / 64
    print(
        f"measured PSS {measured / 2**20:.1f} MiB a peer; estimate {est.per_peer_bytes / 2**20:.1f}"
    )
    assert measured <= est.per_peer_bytes <= 1.6 * measured


@pytest.mark.slow
def test_sigint_to_cfree_run_ends_it_with_every_peer_gone(tmp_path):
    """SIGINT to the launcher alone (not its process group): every peer is killed at once and
    awaited together (one by one, 2000 peers took a minute)."""
    out = tmp_path / "run"
    n = 40
    argv = [sys.executable, "-m", "coordinator_free", "run", str(RING), "--set", f"graph.nodes={n}"]
    argv += ["--set", "protocol.steps=100000", "--out", str(out), "--no-audit", "--quiet"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=sigint_default,  # the test interrupts it
    )  # fmt: skip
    try:
        # Every peer is up once each has logged a send (the first step's value).
        from tests.dockerimg import wait_for_send

        for i in range(n):
            wait_for_send(
                out / "logs" / f"node-{i}.vlog", 1, 240, alive=lambda: proc.poll() is None
            )
        peers = _descendants(proc.pid)
        assert len(peers) >= n  # the fork server and its n peers
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    left = [p for p in peers if _alive(p)]
    assert left == [], left


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(stat[1]), []).append(int(d))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
