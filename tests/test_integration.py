"""End to end: real peer processes, real TCP on loopback, real keys.

One fault-free 8-peer run is shared by several checks (module fixture): the final values equal
the simulator's bit for bit, the audit of the logs equals the plan, the logs are intact and hold
no secrets. A second run kills one peer mid-run and checks the dropout is recorded and accounted.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from netrun import assert_killed_node_audited, sigint_default, wait_gone

from coordinator_free import config, seeds, sim
from coordinator_free.accounting import audit
from coordinator_free.cluster import local
from coordinator_free.viewlog import read_viewlog

N = 8


@pytest.fixture(scope="module")
def ring_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ring") / "run"
    cfg = config.load(None, ["network.deadline_s=20"])
    local.prepare_run_dir(cfg, out)
    run = asyncio.run(local.launch_peers(cfg, out, show_progress=False, timeout_s=180))
    return cfg, out, run


def test_all_peers_finish(ring_run):
    cfg, out, run = ring_run
    assert len(run.outcomes) == N
    assert [o.returncode for o in run.outcomes] == [0] * N, [o.error for o in run.outcomes]


def test_networked_run_equals_simulator_bitwise(ring_run):
    cfg, out, _ = ring_run
    ref = sim.simulate(cfg, streams=seeds.streams_of_run(out, N))
    for v in range(N):
        res = json.loads((out / "results" / f"node-{v}.json").read_text())
        est = np.asarray(res["estimate"], dtype=np.float64)
        assert np.array_equal(est, ref.finals[v]), f"node {v}: {est} != {ref.finals[v]}"
        assert res["missed"] == []
        assert res["bytes_sent"] > 0 and res["messages_sent"] >= ref.plan.steps * 2


def test_audit_of_fault_free_run_equals_plan(ring_run):
    cfg, out, _ = ring_run
    rep = audit.audit_run(out)
    assert rep["fault_free"] is True
    assert rep["integrity"] == []
    assert [o["observer"] for o in rep["observers"]] == list(range(N))
    plan = {m: audit.plan_report(cfg, source=None, method=m) for m in audit.METHODS}
    for u in range(N):
        for m in audit.METHODS:
            p = audit.plan_report(cfg, source=u, method=m)
            by_obs = {x["observer"]: x for x in p["losses"]}
            for o in rep["observers"]:
                v = o["observer"]
                if v == u:
                    continue
                (a,) = [x for x in o["losses"] if x["source"] == u and x["method"] == m]
                assert a["rdp"] == pytest.approx(by_obs[v]["rdp"], rel=1e-7, abs=1e-12)
                assert a["eps"] == pytest.approx(by_obs[v]["eps"], rel=1e-6, abs=1e-10)
    # On a ring of 8 the neighbours' exact loss is LDP-level for some pair, and never above it.
    ldp = rep["ldp"]["rdp"]
    exact = [x["rdp"] for o in rep["observers"] for x in o["losses"] if x["method"] == "exact"]
    assert max(exact) <= ldp * (1 + 1e-9)
    assert plan["exact"]["worst_pair"]["rdp"] == pytest.approx(max(exact), rel=1e-7)


def test_view_logs_are_intact_and_hold_no_secrets(ring_run):
    cfg, out, _ = ring_run
    ref = sim.simulate(cfg, streams=seeds.streams_of_run(out, N))
    for v in range(N):
        vl = read_viewlog(out / "logs" / f"node-{v}.vlog")
        assert vl.intact, vl.problems
        assert vl.header["node"] == v
        kinds = {r["k"] for r in vl.records}
        assert {"send", "recv", "finished"} <= kinds
        assert "miss" not in kinds
        recv = [r for r in vl.records if r["k"] == "recv"]
        assert len(recv) == 2 * ref.plan.steps  # ring: 2 neighbours per step
        # The node's own noisy input y_v = x_v + eta_v is sent (step 0) but never logged by v:
        # sends carry digests only.
        for r in vl.records:
            if r["k"] == "send":
                assert (
                    "value" not in r
                    and r["digest"].startswith("blake3:")
                    and len(r["digest"]) == 39
                )
    raw = b"".join((out / "logs" / f"node-{v}.vlog").read_bytes() for v in range(N))
    for v in range(N):
        key_pem = (out / "keys" / f"node-{v}.key").read_bytes()
        body = b"".join(key_pem.splitlines()[1:-1])
        assert body not in raw
    assert oct((out / "keys" / "node-0.key").stat().st_mode & 0o777) == "0o600"


def test_cli_run_default_prints_summary(tmp_path):
    """`cfree run` with no config runs the built-in hypercube example end to end (64 peers)
    and explains the privacy table: most pairs amplified below local DP."""
    out = tmp_path / "cli-run"
    proc = subprocess.run(
        [sys.executable, "-m", "coordinator_free", "run", "--out", str(out), "--quiet"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "true mean" in text and "rounds/s" in text and "bytes sent" in text
    assert "pairwise network DP" in text and "exact max" in text
    assert "(bitwise equal)" in text
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["results"]["nodes"]) == 64 and not summary["failed"]
    audit = json.loads((out / "audit.json").read_text())
    b = audit["baseline"]
    assert b["pairs"] == 64 * 63 and b["amplified"] == 3200  # distances 2, 3 and 4
    assert f"{b['amplified']} of {b['pairs']} ordered pairs" in text
    assert "fully exposed" in text and "local DP is eps = 4.377" in text


@pytest.mark.slow  # a real-process run of several seconds; the in-memory suites cover the rule
def test_killed_peer_is_recorded_and_the_run_still_ends(tmp_path):
    """Kill one peer after step 2: its neighbours record it, finish, and the audit accounts for it."""
    out = tmp_path / "kill"
    cfg = config.load(
        None,
        ["protocol.steps=12", "network.deadline_s=3", "protocol.accelerated=false"],
    )
    local.prepare_run_dir(cfg, out)
    victim = 3

    def on_event(node, ev, pid):
        # SIGKILL the victim as soon as the launcher sees it report step 2.
        if node == victim and ev.get("event") == "step" and ev.get("step") == 2:
            os.kill(pid, signal.SIGKILL)

    async def main():
        return await local.launch_peers(
            cfg, out, show_progress=False, timeout_s=180, on_event=on_event
        )

    run = asyncio.run(main())
    codes = {o.node: o.returncode for o in run.outcomes}
    assert codes[victim] == -signal.SIGKILL
    (failed,) = run.failed
    # The launcher reads step reports asynchronously, so the victim (and, in lock-step, the whole
    # cluster) may have got a step or two further before the signal landed; the error names the
    # last step it reported, which is what the survivors' logs must agree with.
    assert failed.node == victim and 2 <= failed.steps_done < 12, failed
    assert f"killed by SIGKILL after step {failed.steps_done}" in failed.error
    assert all(c == 0 for v, c in codes.items() if v != victim), run.outcomes
    for w in (victim - 1, victim + 1):
        vl = read_viewlog(out / "logs" / f"node-{w}.vlog")
        misses = [r for r in vl.records if r["k"] == "miss" and r["peer"] == victim]
        assert misses, f"node {w} did not record the dropout"
        assert {r["reason"] for r in misses} <= {"peer-down", "deadline"}
    # The survivors' audit is computed on the realised schedule; losses stay within LDP.
    assert_killed_node_audited(audit.audit_run(out), victim)


def test_concurrent_runs_do_not_clash(tmp_path):
    """Two clusters started at the same moment: every peer gets its own port, both finish."""
    cfgs = [config.load(None, [f"run.seed={s}", "graph.nodes=4"]) for s in (1, 2)]
    outs = [tmp_path / f"r{i}" for i in range(2)]
    for c, o in zip(cfgs, outs, strict=True):
        local.prepare_run_dir(c, o)

    async def both():
        return await asyncio.gather(
            *(
                local.launch_peers(c, o, show_progress=False, timeout_s=180)
                for c, o in zip(cfgs, outs, strict=True)
            )
        )

    runs = asyncio.run(both())
    for c, o, r in zip(cfgs, outs, runs, strict=True):
        assert not r.failed, [(x.node, x.error) for x in r.failed]
        ref = sim.simulate(c, streams=seeds.streams_of_run(o, 4))
        for v in range(4):
            est = np.asarray(json.loads((o / "results" / f"node-{v}.json").read_text())["estimate"])
            assert np.array_equal(est, ref.finals[v])
    ports = [json.loads((o / "roster.json").read_text()) for o in outs]
    all_ports = [n["port"] for r in ports for n in r["nodes"]]
    assert len(set(all_ports)) == 8 and 0 not in all_ports
    assert ports[0]["run_id"] != ports[1]["run_id"]


def _processes_mentioning(text: str, *, peers_only: bool = False) -> list[int]:
    """Processes whose command line mentions ``text``, or that hold a view log under it open
    (a peer forked from the fork server runs under the server's command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                args = (entry / "cmdline").read_bytes().split(b"\0")
                links = []
                for fd in (entry / "fd").iterdir():
                    try:
                        links.append(os.readlink(fd))
                    except OSError:
                        continue
            except OSError:
                continue
            holds_log = any(x.startswith(text) and x.endswith(".vlog") for x in links)
            named = any(text.encode() in a for a in args)
            if holds_log or (named and (not peers_only or b"peer" in args)):
                found.append(int(entry.name))
    return found


def _start_long_run(out: Path) -> subprocess.Popen:
    """`cfree run` of a very long run in its own session; returns once all 8 peers connected
    (the non-terminal progress output prints a line at that milestone)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "coordinator_free", "run", str(config.DEFAULT_CONFIG)]
        + ["--out", str(out)]
        + ["--set", "protocol.steps=100000", "--set", "network.deadline_s=30"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=sigint_default,  # the test interrupts it
    )
    deadline = time.monotonic() + 120
    seen = ""
    try:
        while "connected 8/8" not in seen:
            assert time.monotonic() < deadline, seen
            ready, _, _ = select.select([proc.stderr], [], [], deadline - time.monotonic())
            assert ready, seen
            chunk = os.read(proc.stderr.fileno(), 65536).decode(errors="replace")
            assert chunk, f"cfree run ended early: {seen}"
            seen += chunk
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        raise
    return proc


@pytest.mark.parametrize(
    # SIGTERM takes the same path as SIGINT past the handler: in CI's slow suite only
    "sig",
    [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)],
)
def test_interrupting_cfree_run_stops_every_peer(tmp_path, sig):
    out = tmp_path / "interrupted"
    proc = _start_long_run(out)
    try:
        assert _processes_mentioning(str(out)), "no peer processes found"
        os.kill(proc.pid, sig)
        rest = proc.communicate(timeout=60)[1].decode(errors="replace")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its peers
            proc.wait(timeout=30)
    assert proc.returncode == 130, rest
    assert "interrupted" in rest
    assert _processes_mentioning(str(out)) == []


@pytest.mark.slow  # about 40 s of process lifecycle; runs in CI's slow suite
def test_peers_stop_when_their_launcher_is_killed(tmp_path):
    """SIGKILL leaves the launcher no chance to clean up: the peers notice it is gone (their
    progress pipe breaks) and stop on their own instead of running on as orphans."""
    out = tmp_path / "orphans"
    proc = _start_long_run(out)
    try:
        peers = _processes_mentioning(str(out), peers_only=True)
        assert len(peers) == 8
        proc.kill()
        proc.wait(timeout=30)
        for pid in peers:
            assert wait_gone(pid, timeout=60), f"process {pid} still running after 60s"
    finally:
        for pid in _processes_mentioning(str(out)):
            os.kill(pid, signal.SIGKILL)
    for v in range(8):
        vl = read_viewlog(out / "logs" / f"node-{v}.vlog")
        assert vl.records[-1]["k"] == "aborted"


def test_a_nodes_noise_cannot_be_recomputed_from_the_config(ring_run):
    """The public run seed only feeds pure simulation: the step-0 value a node sends is not its
    public-seed value plus public-seed noise, and differs from the simulator without keys."""
    cfg, out, _ = ring_run
    public = sim.simulate(cfg)
    keyed = sim.simulate(cfg, streams=seeds.streams_of_run(out, N))
    assert not np.array_equal(public.finals, keyed.finals)
    vl = read_viewlog(out / "logs" / "node-0.vlog")
    (first,) = [r for r in vl.records if r["k"] == "recv" and r["step"] == 0 and r["peer"] == 1]
    pub = seeds.PublicSeedStreams(cfg.run.seed)
    from coordinator_free.families.averaging import protocol as mf

    guess = mf.private_value(cfg, 1, pub) + mf.local_noise(cfg, 1, pub)
    assert not np.allclose(first["value"], guess)


def _copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_audit_survives_damaged_logs_and_says_so(ring_run, tmp_path, capsys):
    from coordinator_free import cli

    _, out, _ = ring_run
    # A log swapped for another node's, a log that is a directory, a flipped byte mid-file.
    bad = _copy_run(out, tmp_path / "bad")
    (bad / "logs" / "node-3.vlog").write_bytes((bad / "logs" / "node-2.vlog").read_bytes())
    (bad / "logs" / "node-4.vlog").unlink()
    (bad / "logs" / "node-4.vlog").mkdir()
    raw = bytearray((bad / "logs" / "node-6.vlog").read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (bad / "logs" / "node-6.vlog").write_bytes(bytes(raw))
    rep = audit.audit_run(bad)
    kinds = {(f["node"], f["kind"]) for f in rep["integrity"]}
    assert (3, "wrong-log") in kinds and (4, "unreadable-log") in kinds
    assert (6, "bad-checksum") in kinds or (6, "bad-record") in kinds
    assert rep["fault_free"] is False and rep["complete"] is False
    # Every observer is reported; those without a usable log get the worst case, flagged.
    assert {o["observer"] for o in rep["observers"]} == set(range(8))
    for o in rep["observers"]:
        bases = {x["basis"] for x in o["losses"]}
        if o["observer"] in (3, 4):
            assert bases == {"worst-case"}
        else:
            assert bases and "worst-case" not in bases
    assert cli.main(["audit", str(bad), "--strict", "--json"]) == 1
    assert cli.main(["audit", str(out), "--strict", "--json"]) == 0
    capsys.readouterr()


def test_cli_simulate_run_reproduces_the_networked_run(ring_run, capsys):
    from coordinator_free import cli

    _, out, _ = ring_run
    assert cli.main(["simulate", "--run", str(out), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    for v in range(N):
        est = json.loads((out / "results" / f"node-{v}.json").read_text())["estimate"]
        assert rep["finals"][v] == est
