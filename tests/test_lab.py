"""The network-namespace lab: every peer on its own host (network namespace) behind a virtual
switch, so runs cross a real network stack; link cuts; cleanup however a lab ends; `cfree lab`.

Pure parts first (addresses, names, records, the cut schedule). The tests that create
namespaces need root and iproute2's `ip`, and are skipped, saying so, without them (in CI,
CI=true, they fail instead). Every lab gets a name unique to this test process, so parallel or
leftover runs cannot clash. Tests named *_cli_* run `python -m coordinator_free lab ...` in a subprocess; the others call the commands
in process through :func:`coordinator_free.cli.lab.add_lab_parser`.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from netnslab import lab_name, needs_netns
from netrun import assert_audit_equals_plan, sigint_default

import coordinator_free
from coordinator_free import config, seeds, sim
from coordinator_free.accounting import audit
from coordinator_free.cli import lab as lab_cli
from coordinator_free.cluster import local, netns
from coordinator_free.families import make_plan
from coordinator_free.viewlog import read_viewlog

N = 8
REPO = Path(coordinator_free.__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def namespaces_of(name: str) -> list[str]:
    """Namespaces whose name starts with ``name-`` (read from `ip netns list` directly)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return sorted(
        line.split()[0] for line in out.stdout.splitlines() if line.startswith(f"{name}-")
    )


def lab_main(*argv) -> int:
    """`cfree lab ARGV`, parsed and run in process as cfree would run it."""
    parser = argparse.ArgumentParser(prog="cfree")
    sub = parser.add_subparsers(dest="command")
    lab_cli.add_lab_parser(sub)
    args = parser.parse_args(["lab", *map(str, argv)])
    return lab_cli.cmd_lab(args)


# ----------------------------------------------------------------------------- pure parts


def test_host_addresses_come_from_the_subnet_in_order():
    assert netns.host_addresses("10.213.0.0/16", 3) == [
        "10.213.0.1/16",
        "10.213.0.2/16",
        "10.213.0.3/16",
    ]
    full = netns.host_addresses("192.168.7.0/24", 254)
    assert full[0] == "192.168.7.1/24" and full[-1] == "192.168.7.254/24"  # never .0 nor .255
    assert len(set(full)) == 254
    assert netns.host_addresses("10.9.9.4/30", 2) == ["10.9.9.5/30", "10.9.9.6/30"]
    lab = netns.Lab.plan(300, "big", "10.213.0.0/16")
    assert (
        lab.ip(0) == "10.213.0.1" and lab.ip(255) == "10.213.1.0" and lab.ip(299) == "10.213.1.44"
    )
    assert all(
        ipaddress.ip_address(lab.ip(i)) in ipaddress.ip_network(lab.subnet) for i in range(300)
    )


@pytest.mark.parametrize(
    ("subnet", "nodes", "message"),
    [
        ("10.213.0.0/24", 255, "has room for 254 hosts, 255 asked"),
        ("10.9.9.4/30", 3, "has room for 2 hosts"),
        ("10.0.0.0/8", netns.MAX_HOSTS + 1, "at most 1024"),
        ("10.213.0.0/16", 0, "at least 1 host"),
        ("10.213.0.5/16", 2, "host bits set: did you mean 10.213.0.0/16"),
        ("not-a-net", 2, "not a network in CIDR form"),
        ("10.1.2.0/31", 2, "no room for two hosts"),
        ("fd00::/64", 2, "IPv4 only"),
    ],
)
def test_bad_subnet_or_size_is_a_clear_error(subnet, nodes, message):
    with pytest.raises(netns.LabError, match=re.escape(message)):
        netns.Lab.plan(nodes, "x", subnet)


def test_names_fit_the_kernel_limits_and_never_reach_another_labs_namespaces():
    name = "n" * netns.MAX_NAME_LEN
    lab = netns.Lab.plan(netns.MAX_HOSTS, name, "10.0.0.0/8")
    assert all(len(i) <= netns.IFNAME_MAX for i in lab.interfaces())
    assert len(set(lab.namespaces())) == netns.MAX_HOSTS + 1
    assert lab.namespaces()[-1] == f"{name}-sw" and lab.ns(1023) == f"{name}-h1023"
    assert lab.port_name(1023) == "veth1023"
    for bad in ("", "n" * (netns.MAX_NAME_LEN + 1), "-x", "a b", "a/b", "a.b", "é"):
        with pytest.raises(netns.LabError, match="lab name"):
            netns.Lab.plan(2, bad)
    pat = netns.namespace_pattern("lab")
    assert all(pat.fullmatch(s) for s in ("lab-sw", "lab-h0", "lab-h12"))
    # A lab named "lab-x" or "labx" is another lab; "lab-h01" is no name this lab ever makes.
    assert not any(
        pat.fullmatch(s) for s in ("lab-x-h0", "lab-x-sw", "labx-h0", "lab-h", "lab-h01")
    )
    with pytest.raises(netns.LabError, match="hosts 0..3, not 4"):
        netns.Lab.plan(4, "lab").ip(4)


def test_a_lab_record_round_trips_and_a_tampered_one_is_refused():
    lab = netns.Lab.plan(5, "rec", "10.44.0.0/16")
    d = json.loads(json.dumps(lab.to_dict()))
    assert netns.Lab.from_dict(d, "r.json") == lab
    for tamper in (
        lambda d: d["hosts"][2].update(namespace="someone-elses-ns"),
        lambda d: d["hosts"][0].update(address="10.44.0.9"),
        lambda d: d.update(subnet="10.44.0.0/33"),
        lambda d: d.update(format="other"),
        lambda d: d.pop("hosts"),
    ):
        bad = json.loads(json.dumps(lab.to_dict()))
        tamper(bad)
        with pytest.raises(netns.LabError, match="r.json is damaged"):
            netns.Lab.from_dict(bad, "r.json")
    with pytest.raises(netns.LabError, match="damaged"):
        netns.Lab.from_dict(["not", "a", "dict"], "r.json")


def test_without_root_or_ip_the_error_says_so(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(shutil, "which", lambda _cmd: "/usr/sbin/ip")
    with pytest.raises(netns.LabError, match="needs root"):
        netns.up(2, "noroot")
    monkeypatch.setattr(shutil, "which", lambda _cmd: None)
    with pytest.raises(netns.LabError, match=r"`ip` command \(iproute2\)"):
        netns.down("noroot")
    assert lab_main("up", "--nodes", "2", "--name", "noroot") == 2


class _FakeIp:
    """Stands in for :func:`netns.ip`: keeps a set of namespaces; deleting one of ``busy`` fails
    as a namespace still in use would, and so does any command starting with ``fail_on``."""

    def __init__(self, busy=(), fail_on=None):
        self.namespaces: set[str] = set()
        self.busy = set(busy)
        self.fail_on = fail_on
        self.deleted: list[str] = []

    def __call__(self, *args, ns=None):
        if self.fail_on and args[: len(self.fail_on)] == self.fail_on:
            raise netns.LabError(f"`ip {' '.join(args)}` failed (exit 2): injected")
        if args[:2] == ("netns", "add"):
            self.namespaces.add(args[2])
        elif args[:2] == ("netns", "list"):
            return "".join(f"{n} (id: 1)\n" for n in sorted(self.namespaces))
        elif args[:2] == ("netns", "delete"):
            if args[2] in self.busy:
                raise netns.LabError(
                    f"`ip netns delete {args[2]}` failed (exit 1): Device or resource busy"
                )
            self.namespaces.discard(args[2])
            self.deleted.append(args[2])
        return ""


@pytest.fixture
def fake_ip(monkeypatch, tmp_path):
    fake = _FakeIp()
    monkeypatch.setattr(netns, "ip", fake)
    monkeypatch.setattr(netns, "check_environment", lambda: None)
    monkeypatch.setattr(netns, "STATE_DIR", tmp_path)
    return fake


def test_down_tries_every_namespace_and_keeps_the_record_while_one_remains(fake_ip):
    lab = netns.up(3, "del")
    record = netns.state_path("del")
    assert record.exists() and fake_ip.namespaces == set(lab.namespaces())
    fake_ip.busy = {lab.ns(1)}
    with pytest.raises(netns.LabError) as exc:
        netns.down("del")
    msg = str(exc.value)
    assert f"ip netns delete {lab.ns(1)}` failed" in msg and "Device or resource busy" in msg
    assert "1 failure(s)" in msg and "record" in msg and "--name del" in msg
    assert msg.count("ip netns delete") == 1  # only the failure is named
    assert fake_ip.deleted == [lab.ns(0), lab.ns(2), lab.switch]  # the rest went, switch last
    assert fake_ip.namespaces == {lab.ns(1)}
    assert record.exists()  # a namespace remains: the record stays, so `down` finds the lab
    fake_ip.busy = set()
    r = netns.down("del")
    assert r.namespaces == [lab.ns(1)] and r.record
    assert not fake_ip.namespaces and not record.exists()


def test_down_names_every_namespace_it_could_not_delete(fake_ip):
    lab = netns.up(3, "del2")
    fake_ip.busy = {lab.ns(0), lab.ns(2)}
    with pytest.raises(netns.LabError, match=r"2 failure\(s\)") as exc:
        netns.down("del2")
    assert lab.ns(0) in str(exc.value) and lab.ns(2) in str(exc.value)
    assert fake_ip.namespaces == {lab.ns(0), lab.ns(2)} and netns.state_path("del2").exists()


def test_a_failed_up_removes_every_namespace_it_can_and_keeps_the_record_otherwise(fake_ip):
    fake_ip.fail_on = ("addr", "add")  # the first host's address: sw and h0 exist by then
    fake_ip.busy = {"upf-h0"}
    with pytest.raises(netns.LabError, match="injected") as exc:
        netns.up(3, "upf")
    assert fake_ip.deleted == ["upf-sw"]  # tried although the host (deleted first) failed
    assert fake_ip.namespaces == {"upf-h0"} and netns.state_path("upf").exists()
    assert "ip netns delete upf-h0" in "\n".join(exc.value.__notes__)
    fake_ip.busy = set()
    with pytest.raises(netns.LabError, match="injected"):
        netns.up(3, "upf2")
    assert not netns.state_path("upf2").exists()  # cleaned up entirely: no record left


@pytest.mark.usefixtures("_ip_available")
def test_a_failing_ip_command_is_named_with_its_error():
    with pytest.raises(netns.LabError) as exc:
        netns.ip("link", "show", "no-such-dev0")
    msg = str(exc.value)
    assert "`ip link show no-such-dev0` failed (exit 1)" in msg and "does not exist" in msg


class _FakeLab:
    def __init__(self):
        self.calls = []

    def cut(self, node):
        self.calls.append(("cut", node))

    def heal(self, node):
        if node == 5:
            raise netns.LabError("heal failed")
        self.calls.append(("heal", node))


def test_cut_schedule_fires_once_at_or_after_its_step_in_step_order():
    """The lab's cuts and heals go through the launcher's fault schedule: each fires once, at
    the first report of its node at or past its step, heals after cuts of the same step."""
    from coordinator_free import faults
    from coordinator_free.cluster.faultsched import FaultSchedule

    fake = _FakeLab()
    fp = faults.plan_of(["heal:1@4", "cut:1@2", "cut:2@0", "heal:5@1", "cut:3@9"])
    s = FaultSchedule(fp, global_steps=False, cut=fake.cut, heal=fake.heal)
    s(2, {"event": "connected"}, 0)
    s(1, {"event": "step", "step": 1}, 0)
    s(1, {"event": "listening", "step": 7}, 0)  # not progress
    assert fake.calls == [("cut", 2)]
    s(1, {"event": "step", "step": 3}, 0)  # step 2 never seen: fires at the next report
    s(1, {"event": "step", "step": 3}, 0)
    s(1, {"event": "step", "step": 6}, 0)
    s(5, {"event": "step", "step": 1}, 0)
    assert fake.calls == [("cut", 2), ("cut", 1), ("heal", 1)]
    assert [(d["fault"], d["node"], d["step"]) for d in s.injected] == [
        ("cut", 2, 0),
        ("cut", 1, 3),
        ("heal", 1, 6),
    ]
    assert s.errors == ["heal:5@1: heal failed"]
    assert s.never_fired() == ["cut:3@9"]
    assert [d["action"] for d in lab_cli._link_changes(s)] == ["cut", "cut", "heal"]


def test_cut_option_must_be_node_at_step(capsys):
    with pytest.raises(SystemExit):
        lab_main("run", "--cut", "3")
    assert "is not NODE@STEP" in capsys.readouterr().err


# ------------------------------------------------------------------------ real namespaces


@needs_netns
def test_eight_peers_on_eight_hosts_equal_the_simulator_and_the_plan(tmp_path):
    """The default experiment with each peer on its own host: every byte between peers crosses
    a veth pair and the switch, and the outcome is the simulator's, bit for bit."""
    cfg = config.load(None, ["network.deadline_s=20"])
    out = tmp_path / "run"
    local.prepare_run_dir(cfg, out)
    with netns.lab(N, name=lab_name("a")) as lab:
        before = [lab.link_stats(v) for v in range(N)]
        run = asyncio.run(
            netns.launch_peers_in_lab(cfg, out, lab, show_progress=False, timeout_s=240)
        )
        after = [lab.link_stats(v) for v in range(N)]
    assert [o.returncode for o in run.outcomes] == [0] * N, [o.error for o in run.outcomes]
    # The roster: eight distinct lab addresses, one port.
    ros = json.loads((out / "roster.json").read_text())
    hosts = [e["host"] for e in ros["nodes"]]
    assert hosts == [f"10.213.0.{v + 1}" for v in range(N)]
    assert {e["port"] for e in ros["nodes"]} == {netns.DEFAULT_PORT}
    ref = sim.simulate(cfg, streams=seeds.streams_of_run(out, N))
    for v in range(N):
        res = json.loads((out / "results" / f"node-{v}.json").read_text())
        est = np.asarray(res["estimate"], dtype=np.float64)
        assert np.array_equal(est, ref.finals[v]), f"node {v}: {est} != {ref.finals[v]}"
        assert res["missed"] == []
        vl = read_viewlog(out / "logs" / f"node-{v}.vlog")
        assert vl.intact, vl.problems
        (listen,) = [r for r in vl.records if r["k"] == "listen"]
        assert (listen["host"], listen["port"]) == (lab.ip(v), netns.DEFAULT_PORT)
        # What the peer sent and received went through its host's eth0: the interface
        # counted at least those bytes (plus TCP/IP headers).
        tx = after[v]["tx_bytes"] - before[v]["tx_bytes"]
        rx = after[v]["rx_bytes"] - before[v]["rx_bytes"]
        assert tx >= res["bytes_sent"] > 0 and rx >= res["bytes_received"] > 0, (v, tx, rx, res)
    rep = audit.audit_run(out)
    assert rep["fault_free"] is True and rep["integrity"] == []
    assert_audit_equals_plan(rep, make_plan(cfg), tol=1e-9)
    assert namespaces_of(lab.name) == []


@pytest.mark.slow  # the quick suite keeps the lab's fault-free run and its up/down
@needs_netns
def test_a_cut_link_is_seen_on_both_sides_and_the_run_still_ends(tmp_path):
    """Pull node 3's cable once it reports step 2: the peers are not told anything (no reset),
    values sent across the cut are lost; both sides give up at their deadline, record the
    misses, and every peer finishes its steps."""
    steps, victim = 16, 3
    cfg = config.load(
        None,
        [f"protocol.steps={steps}", "network.deadline_s=0.3", "protocol.accelerated=false"],
    )
    out = tmp_path / "cut"
    local.prepare_run_dir(cfg, out)
    cut_at = []
    with netns.lab(N, name=lab_name("b")) as lab:

        def on_event(node, ev, pid):
            if node == victim and ev.get("event") == "step" and ev["step"] >= 2 and not cut_at:
                lab.cut(victim)
                cut_at.append(ev["step"])

        run = asyncio.run(
            netns.launch_peers_in_lab(
                cfg, out, lab, show_progress=False, timeout_s=240, on_event=on_event
            )
        )
        assert lab.is_cut(victim) and not lab.is_cut(victim + 1)
        lab.heal(victim)
        assert not lab.is_cut(victim)
    assert cut_at, "the victim never reported step 2"
    assert not run.failed, [(o.node, o.error) for o in run.failed]  # a cut is not a crash
    mine = read_viewlog(out / "logs" / f"node-{victim}.vlog").records
    for w in (victim - 1, victim + 1):
        theirs = read_viewlog(out / "logs" / f"node-{w}.vlog").records
        heard = [r["step"] for r in theirs if r["k"] in ("recv", "late") and r["peer"] == victim]
        # The launcher sees step reports late, so the cut may land a few steps after step 2;
        # where it landed is the last value of the victim's that got through.
        last = max(heard)
        assert 1 <= last < steps - 1, (w, last)
        missed = {r["step"] for r in theirs if r["k"] == "miss" and r["peer"] == victim}
        assert set(range(last + 1, steps)) <= missed, (w, last, sorted(missed))
        reasons = {r["reason"] for r in theirs if r["k"] == "miss" and r["peer"] == victim}
        assert reasons <= {"peer-down", "deadline"}
        # The victim did send its later values: they were lost on the cut link.
        sent = {r["step"] for r in mine if r["k"] == "send" and r["peer"] == w}
        assert any(t > last for t in sent), (w, last, sorted(sent))
        # And on its side it missed w until the end.
        its_misses = {r["step"] for r in mine if r["k"] == "miss" and r["peer"] == w}
        assert steps - 1 in its_misses
    res = json.loads((out / "results" / f"node-{victim}.json").read_text())
    assert res["steps"] == steps and res["missed"]
    rep = audit.audit_run(out)
    assert rep["fault_free"] is False
    ldp = rep["ldp"]["rdp"]
    assert all(
        0 <= x["rdp"] <= ldp * (1 + 1e-9)
        for o in rep["observers"]
        for x in o["losses"]
        if x["method"] == "exact"
    )


def _listener(lab, node: int, port: int) -> subprocess.Popen:
    """A TCP server on host ``node`` answering every connection with b"hi"; returns once it
    listens."""
    code = (
        "import socket,sys\n"
        f"s=socket.create_server(({lab.ip(node)!r},{port}))\n"
        "print('ready',flush=True)\n"
        "while True:\n"
        "    c,_=s.accept(); c.sendall(b'hi'); c.close()\n"
    )
    p = lab.popen(node, [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def _reaches(lab, src: int, dst: int, port: int, timeout: float) -> bool:
    code = (
        "import socket,sys\n"
        "try:\n"
        f"    c=socket.create_connection(({lab.ip(dst)!r},{port}),timeout={timeout})\n"
        "    sys.exit(0 if c.recv(2)==b'hi' else 3)\n"
        "except OSError as e:\n"
        "    print(e); sys.exit(1)\n"
    )
    r = lab.exec(src, [sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode in (0, 1), r
    return r.returncode == 0


@needs_netns
def test_hosts_are_separate_a_cut_isolates_a_heal_reconnects_and_the_lab_always_goes():
    name = lab_name("c")
    port = 9100
    with pytest.raises(RuntimeError, match="the body failed"):
        with netns.lab(3, name=name, subnet="10.77.0.0/24") as lab:
            assert namespaces_of(name) == sorted([f"{name}-h0", f"{name}-h1", f"{name}-h2",
                                                  f"{name}-sw"])  # fmt: skip
            # Each host has its own stack: lo and eth0 with its address, nothing else.
            for v in range(3):
                addrs = json.loads(lab.exec(v, ["ip", "-j", "addr", "show"],
                                            capture_output=True, text=True, check=True).stdout)  # fmt: skip
                v4 = sorted(
                    (a["ifname"], i["local"])
                    for a in addrs
                    for i in a.get("addr_info", [])
                    if i["family"] == "inet"
                )
                assert v4 == [("eth0", f"10.77.0.{v + 1}"), ("lo", "127.0.0.1")]
            server = _listener(lab, 1, port)
            assert _reaches(lab, 0, 1, port, timeout=10)
            assert _reaches(lab, 2, 1, port, timeout=10)
            lab.cut(1)
            assert lab.is_cut(1)
            assert not _reaches(lab, 0, 1, port, timeout=1.5)
            lab.heal(1)
            assert _reaches(lab, 0, 1, port, timeout=10)
            raise RuntimeError("the body failed")
    # The lab went even so, and the process still running on host 1 was stopped.
    assert namespaces_of(name) == []
    assert not (netns.STATE_DIR / f"{name}.json").exists()
    assert server.wait(timeout=30) == -signal.SIGKILL


@needs_netns
def test_up_twice_is_refused_and_down_is_idempotent_and_finds_leftovers(capsys):
    name = lab_name("d")
    other = f"{name}-x"  # a lab whose name starts with "<name>-": never touched
    try:
        assert lab_main("up", "--nodes", 3, "--name", name, "--subnet", "10.78.0.0/24") == 0
        text = capsys.readouterr().out
        assert f"lab {name} is up: 3 hosts on 10.78.0.0/24" in text and "10.78.0.3" in text
        assert lab_main("up", "--nodes", 2, "--name", name) == 2
        err = capsys.readouterr().err
        assert f"lab '{name}' already exists" in err and f"cfree lab down --name {name}" in err
        assert len(namespaces_of(name)) == 4  # the refused `up` changed nothing

        assert lab_main("cut", 2, "--name", name) == 0
        capsys.readouterr()
        assert lab_main("status", "--name", name, "--json") == 0
        (st,) = json.loads(capsys.readouterr().out)
        assert [(h["address"], h["link"]) for h in st["hosts"]] == [
            ("10.78.0.1", "up"), ("10.78.0.2", "up"), ("10.78.0.3", "cut")]  # fmt: skip
        sw = subprocess.run(["ip", "-n", f"{name}-sw", "-j", "link", "show", "veth2"],
                            capture_output=True, text=True, check=True)  # fmt: skip
        assert "UP" not in json.loads(sw.stdout)[0]["flags"]
        assert lab_main("heal", 2, "--name", name) == 0
        assert lab_main("cut", 3, "--name", name) == 2
        assert "hosts 0..2, not 3" in capsys.readouterr().err

        assert lab_main("down", "--name", name) == 0
        assert f"lab {name} removed: 4 namespaces" in capsys.readouterr().out
        assert namespaces_of(name) == [] and not netns.state_path(name).exists()
        assert lab_main("down", "--name", name) == 0
        assert "nothing to remove" in capsys.readouterr().out
        assert lab_main("status", "--name", name) == 1
        assert f"no lab named '{name}'" in capsys.readouterr().out

        # Leftovers of a crashed lab: namespaces without a record, then a damaged record.
        for ns in (f"{name}-h0", f"{name}-h7", f"{name}-sw", f"{other}-h0"):
            subprocess.run(["ip", "netns", "add", ns], check=True)
        with pytest.raises(netns.LabError, match="already exist but no lab record does"):
            netns.up(2, name)
        assert not netns.state_path(name).exists()
        netns.state_path(name).write_text("{not json")
        with pytest.raises(netns.LabError, match="already exists"):
            netns.up(2, name)
        with pytest.raises(netns.LabError, match="is damaged"):
            netns.require(name)
        capsys.readouterr()
        assert lab_main("status", "--name", name) == 0
        text = capsys.readouterr().out
        assert "is damaged" in text and f"{name}-h7" in text and f"{other}-h0" not in text
        r = netns.down(name)
        assert r.namespaces == [f"{name}-h0", f"{name}-h7", f"{name}-sw"]
        assert r.record and "damaged" in r.note
        assert namespaces_of(name) == [f"{other}-h0"]
        assert not netns.state_path(name).exists()
    finally:
        netns.down(name)
        netns.down(other)
        subprocess.run(["ip", "netns", "delete", f"{other}-h0"], capture_output=True)
    assert namespaces_of(name) == []


@pytest.mark.slow
@needs_netns
def test_lab_run_on_a_temporary_lab_with_a_cut(tmp_path, capsys):
    """`cfree lab run` with no lab up: brings one up for the run, cuts node 1 at step 2 as
    asked, writes summary and audit, and removes the lab."""
    name = lab_name("e")
    out = tmp_path / "run"
    rc = lab_main(
        "run", "--name", name, "--out", out, "--json", "--quiet", "--cut", "1@2",
        "--set", "graph.nodes=4", "--set", "protocol.steps=16",
        "--set", "protocol.accelerated=false", "--set", "network.deadline_s=0.3",
    )  # fmt: skip
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    # The cut kept the protocol from completing as planned: exit 1, naming node 1.
    assert rc == 1, summary["failed"]
    assert summary["completed_as_planned"] is False and summary["failed"] == []
    assert summary["problems"][0]["node"] == 1, summary["problems"]
    assert "did not complete as planned" in captured.err and "node 1" in captured.err
    assert namespaces_of(name) == [] and not netns.state_path(name).exists()
    lab = summary["lab"]
    assert lab["temporary"] is True and lab["name"] == name
    assert [h["host"] for h in lab["hosts"]] == [f"10.213.0.{v + 1}" for v in range(4)]
    (cut,) = lab["links"]
    assert (cut["action"], cut["node"], cut["at_step"]) == ("cut", 1, 2)
    assert cut["reported_step"] >= 2 and lab["not_applied"] == [] and lab["errors"] == []
    assert summary["audit"]["fault_free"] is False
    assert json.loads((out / "audit.json").read_text())["fault_free"] is False
    assert json.loads((out / "summary.json").read_text())["lab"] == lab
    nodes = summary["results"]["nodes"]
    assert all(r["finished"] for r in nodes)
    assert nodes[0]["missed"] > 0 and nodes[2]["missed"] > 0  # node 1's neighbours


@needs_netns
def test_lab_run_that_fails_removes_its_temporary_lab(tmp_path, capsys):
    name = lab_name("f")
    out = tmp_path / "taken"
    out.mkdir()
    (out / "x").write_text("")
    assert lab_main("run", "--name", name, "--out", out, "--quiet") == 2
    assert "already exists and is not empty" in capsys.readouterr().err
    assert namespaces_of(name) == [] and not netns.state_path(name).exists()


def cfree_lab(*argv, timeout=120) -> subprocess.CompletedProcess:
    """`python -m coordinator_free lab ARGV` in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "coordinator_free", "lab", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        stdin=subprocess.DEVNULL,
    )


@needs_netns
def test_cli_lab_up_status_down():
    name = lab_name("g")
    try:
        up = cfree_lab("up", "--nodes", 2, "--name", name)
        assert up.returncode == 0, up.stderr
        st = cfree_lab("status", "--name", name)
        assert st.returncode == 0, st.stderr
        assert f"{name}-h1" in st.stdout and "10.213.0.2" in st.stdout
    finally:
        down = cfree_lab("down", "--name", name)
    assert down.returncode == 0, down.stderr
    assert namespaces_of(name) == []


@needs_netns
def test_cli_interrupted_lab_run_stops_its_peers_and_removes_its_lab(tmp_path):
    name = lab_name("h")
    out = tmp_path / "interrupted"
    proc = subprocess.Popen(
        [sys.executable, "-m", "coordinator_free", "lab", "run", "--name", name, "--out", str(out),
         "--set", "graph.nodes=3", "--set", "protocol.steps=100000",
         "--set", "network.deadline_s=30"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=ENV,
        start_new_session=True,
        preexec_fn=sigint_default,  # the test interrupts it
    )  # fmt: skip
    seen = ""
    try:
        deadline = time.monotonic() + 120
        while "connected 3/3" not in seen:
            assert time.monotonic() < deadline, seen
            ready, _, _ = select.select([proc.stderr], [], [], deadline - time.monotonic())
            assert ready, seen
            chunk = os.read(proc.stderr.fileno(), 65536).decode(errors="replace")
            assert chunk, f"cfree lab run ended early: {seen}"
            seen += chunk
        peers = subprocess.run(["ip", "netns", "pids", f"{name}-h0"], capture_output=True,
                               text=True, check=True).stdout.split()  # fmt: skip
        assert peers, "no peer on host 0"
        os.kill(proc.pid, signal.SIGINT)
        rest = proc.communicate(timeout=60)[1].decode(errors="replace")
        left = namespaces_of(name), netns.state_path(name).exists()
        running = [pid for pid in peers if _is_peer(int(pid))]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        netns.down(name)  # only if the test failed is there anything to remove
    assert proc.returncode == 130, seen + rest
    assert "interrupted" in rest
    assert running == []
    assert left == ([], False)


def _is_peer(pid: int) -> bool:
    try:
        return b"peer" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
