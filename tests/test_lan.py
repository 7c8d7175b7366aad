"""Running across LAN machines: `cfree keypair` on each host, `cfree roster` from hosts.txt.

Pure parts first (the hosts file and its errors, the generated scripts and systemd unit), then
the whole flow for real on loopback: every "host" is a directory with its own key, the roster
is built from the public keys alone, the generated start.sh scripts start real `cfree peer`
processes in parallel, the generated collect.sh fetches their logs (through a stand-in for scp
that copies local paths) and the audit of the collected directory equals the plan.

Tests named *_cli_* run `python -m coordinator_free keypair|roster` as subprocesses; the others
call the commands in process through :func:`coordinator_free.cluster.lan.add_parsers`.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from netrun import assert_audit_equals_plan

import coordinator_free
from coordinator_free import config, roster, seeds, sim
from coordinator_free.accounting import audit
from coordinator_free.cluster import lan
from coordinator_free.families import make_plan

REPO = Path(coordinator_free.__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
CFREE_CMD = f"{shlex.quote(sys.executable)} -m coordinator_free"
KEY_A = "11" * 32
KEY_B = "22" * 32
KEY_C = "33" * 32


def key_hex() -> str:
    return roster.public_bytes(X25519PrivateKey.generate()).hex()


def lan_main(*argv) -> int:
    """A command of coordinator_free.cluster.lan, parsed and run as cfree would run it."""
    parser = argparse.ArgumentParser(prog="cfree")
    sub = parser.add_subparsers(dest="command")
    lan.add_parsers(sub)
    args = parser.parse_args([str(a) for a in argv])
    return lan.COMMANDS[args.command](args)


def cfree(*argv, cwd=None, timeout=120) -> subprocess.CompletedProcess:
    """`python -m coordinator_free ARGV` in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "coordinator_free", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


def write_config(path: Path, *overrides: str) -> Path:
    path.write_text(config.load(None, list(overrides)).to_toml())
    return path


# ------------------------------------------------------------------------------ hosts files


def test_hosts_file_lines_ports_ipv6_comments():
    a, b, c, d = key_hex(), key_hex(), key_hex(), key_hex()
    text = f"""
# three machines and a v6 one
192.168.1.11:7001   {a}
node-b.lan          {b}   # default port

[fd00::13]:7003     {c}
[fd00::14]  {d}
"""
    hosts = lan.parse_hosts(text, source="h.txt", default_port=7100)
    assert [(h.line, h.host, h.port) for h in hosts] == [
        (3, "192.168.1.11", 7001),
        (4, "node-b.lan", 7100),
        (6, "fd00::13", 7003),
        (7, "fd00::14", 7100),
    ]
    assert [h.public_key.hex() for h in hosts] == [a, b, c, d]
    assert [h.address for h in hosts] == [
        "192.168.1.11:7001",
        "node-b.lan:7100",
        "[fd00::13]:7003",
        "[fd00::14]:7100",
    ]
    # Without keys (--generate-keys), with a CRLF file.
    hosts = lan.parse_hosts("10.0.0.1\r\n10.0.0.2:7001\r\n", source="h.txt")
    assert [(h.host, h.port, h.public_key) for h in hosts] == [
        ("10.0.0.1", lan.DEFAULT_PORT, None),
        ("10.0.0.2", 7001, None),
    ]


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("10.0.0.1:7000\n10.0.0.2:70000\n", 2, "not in 1..65535"),
        ("10.0.0.1:http\n", 1, "not a number"),
        ("10.0.0.1:0\n", 1, "fixed port"),
        ("10.0.0.1:-5\n", 1, "not a number"),
        ("# a\n10.0.0.1:7000\n\n10.0.0.1:7000\n", 4, "already used by line 2"),
        ("Host-A:7000\nhost-a.:7000\n", 2, "already used by line 1"),
        ("[fd00::1]:7000\n[fd00:0::1]:7000\n", 2, "already used by line 1"),
        ("fd00::1:7000\n", 1, "IPv6 address in brackets"),
        ("[fd00::1:7000\n", 1, "without a closing"),
        ("[10.0.0.1]:7000\n", 1, "not an IPv6 address"),
        ("[fd00::1]7000\n", 1, "expected ':PORT'"),
        ("bad_host!:7000\n", 1, "not a host name"),
        ("-bad.example:7000\n", 1, "neither an IP address nor a valid host name"),
        ("999.1.1.1:7000\n", 1, "not a valid IP address"),
        (f"10.0.0.1 {KEY_A} extra\n", 1, "3 fields"),
        ("10.0.0.1 abcd\n", 1, "not 64 hex characters"),
        (f"10.0.0.1 {'00' * 32}\n", 1, "low-order point"),
        (f"10.0.0.1 {KEY_A}\n10.0.0.2 {KEY_A.upper()}\n", 2, "same public key as line 1"),
    ],
)
def test_hosts_file_errors_name_file_and_line(tmp_path, text, line, words):
    path = tmp_path / "hosts.txt"
    path.write_text(text)
    with pytest.raises(lan.LanError) as ei:
        lan.read_hosts(path)
    msg = str(ei.value)
    assert msg.startswith(f"{path}:{line}: "), msg
    assert words in msg, msg


def test_hosts_file_empty_missing_and_binary(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing here\n\n   \n")
    with pytest.raises(lan.LanError, match=rf"^{re.escape(str(empty))}: lists no hosts"):
        lan.read_hosts(empty)
    with pytest.raises(lan.LanError, match="does not exist"):
        lan.read_hosts(tmp_path / "nope.txt")
    with pytest.raises(lan.LanError, match="is a directory"):
        lan.read_hosts(tmp_path)
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"10.0.0.1:7000\n10.0.0.2:\xff\xfe\n")
    with pytest.raises(lan.LanError, match=rf"^{re.escape(str(binary))}:2: not UTF-8"):
        lan.read_hosts(binary)


# ------------------------------------------------------------------------- cfree roster errors


def hosts_file(tmp_path: Path, n: int) -> Path:
    """n hosts 10.0.0.1.. on port 7000, each with a fresh public key."""
    path = tmp_path / "hosts.txt"
    path.write_text("".join(f"10.0.0.{i + 1}:7000  {key_hex()}\n" for i in range(n)))
    return path


def test_roster_node_count_must_match_the_config(tmp_path, capsys):
    hosts = hosts_file(tmp_path, 3)
    code = lan_main("roster", "--hosts", hosts, "--out", tmp_path / "lan")
    err = capsys.readouterr().err
    assert code == 2
    assert f"{hosts} lists 3 hosts but the config's graph" in err and "has 8 nodes" in err
    assert "--set graph.nodes=3" in err
    assert not (tmp_path / "lan").exists()
    cfg = write_config(tmp_path / "hyper.toml", "graph.kind=hypercube", "graph.dim=2")
    code = lan_main("roster", "--hosts", hosts, "--config", cfg, "--out", tmp_path / "lan")
    err = capsys.readouterr().err
    assert code == 2 and "has 4 nodes" in err and "change the graph or the hosts" in err
    # Too few hosts for any ring: no advice to set an invalid node count.
    (tmp_path / "two").mkdir()
    two = hosts_file(tmp_path / "two", 2)
    code = lan_main("roster", "--hosts", two, "--out", tmp_path / "lan")
    err = capsys.readouterr().err
    assert code == 2 and "graph.nodes=2" not in err
    assert "a ring graph needs at least 3 nodes: list at least 3 lines" in err


def test_roster_needs_public_keys_unless_generate_keys(tmp_path, capsys):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(f"10.0.0.1:7000 {key_hex()}\n\n10.0.0.2:7000\n10.0.0.3:7000 {key_hex()}\n")
    code = lan_main("roster", "--hosts", hosts, "--set", "graph.nodes=3", "--out", tmp_path / "lan")
    err = capsys.readouterr().err
    assert code == 2
    assert f"{hosts}:3: 10.0.0.2:7000 has no public key" in err
    assert "cfree keypair --out DIR --address 10.0.0.2:7000" in err
    code = lan_main(
        "roster",
        "--hosts",
        hosts,
        "--set",
        "graph.nodes=3",
        "--generate-keys",
        "--out",
        tmp_path / "lan",
    )
    err = capsys.readouterr().err
    assert code == 2 and f"{hosts}:1: gives a public key, but --generate-keys" in err
    assert not (tmp_path / "lan").exists()


def test_roster_refuses_shared_paths_on_one_host_and_bad_options(tmp_path, capsys):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("".join(f"127.0.0.1:{7000 + i} {key_hex()}\n" for i in range(3)))
    base = ["roster", "--hosts", hosts, "--set", "graph.nodes=3", "--out", tmp_path / "lan"]
    assert lan_main(*base) == 2
    err = capsys.readouterr().err
    assert f"{hosts}:2: nodes 0 and 1 both run on 127.0.0.1 and would share --remote-dir" in err
    assert "{id}" in err
    assert lan_main(*base, "--remote-dir", "/srv/cfree/{id}") == 2
    err = capsys.readouterr().err
    assert "share --key-path /etc/cfree/node.key" in err and "/etc/cfree/node-{id}.key" in err
    for option, value, words in [
        ("--remote-dir", "relative/{id}", "must be an absolute path"),
        ("--key-path", "/k/{id}\n.key", "control character"),
        ("--user", "bad user", "is not a user name"),
        ("--cfree-cmd", "'unclosed", "--cfree-cmd"),
        ("--name", "a/b", "--name"),
        ("--port", "0", "--port 0"),
    ]:
        code = lan_main(
            *base, "--remote-dir", "/srv/{id}", "--key-path", "/k/{id}.key", option, value
        )
        err = capsys.readouterr().err
        assert code == 2 and words in err, (option, err)
    assert not (tmp_path / "lan").exists()


def test_roster_refuses_a_non_empty_output_and_leaves_nothing_behind(tmp_path, capsys):
    hosts = hosts_file(tmp_path, 3)
    out = tmp_path / "lan"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    code = lan_main("roster", "--hosts", hosts, "--set", "graph.nodes=3", "--out", out)
    assert code == 2 and "already exists and is not empty" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    # An empty output directory is fine, and no temporary directory is left next to it.
    (out / "keep.txt").unlink()
    assert lan_main("roster", "--hosts", hosts, "--set", "graph.nodes=3", "--out", out) == 0
    capsys.readouterr()
    assert (out / "roster.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hosts.txt", "lan"]


def test_roster_refuses_central_dp(tmp_path, capsys):
    hosts = hosts_file(tmp_path, 4)
    cfg = REPO / "examples" / "central-dp-breast-cancer.toml"
    code = lan_main(
        "roster", "--hosts", hosts, "--config", cfg, "--set", "graph.nodes=4", "--out",
        tmp_path / "lan",
    )  # fmt: skip
    assert code == 2 and "trusted-curator baseline" in capsys.readouterr().err


# ----------------------------------------------------------------------------- cfree keypair


def test_keypair_writes_a_private_key_and_its_public_line(tmp_path, capsys):
    d = tmp_path / "etc" / "cfree"
    assert lan_main("keypair", "--out", d, "--address", "[fd00::11]", "--port", "7005") == 0
    out, err = capsys.readouterr()
    key = roster.load_private_key(d / "node.key")
    pub = roster.public_bytes(key).hex()
    assert out == f"[fd00::11]:7005 {pub}\n"
    assert "never leaves this host" in err
    assert (d / "node.pub").read_text() == out
    assert stat.S_IMODE((d / "node.key").stat().st_mode) == 0o600
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    # The public line is a valid hosts.txt line.
    (h,) = lan.parse_hosts(out, source="x")
    assert (h.host, h.port, h.public_key.hex()) == ("fd00::11", 7005, pub)
    # A second run keeps the key and prints the same key (with the new address).
    before = (d / "node.key").read_bytes()
    assert lan_main("keypair", "--out", d, "--address", "10.0.0.9", "--json") == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["new"] is False and rep["public_key"] == pub
    assert rep["line"] == f"10.0.0.9:7000 {pub}"
    assert (d / "node.key").read_bytes() == before
    assert (d / "node.pub").read_text() == rep["line"] + "\n"
    # Without --address: the key alone.
    assert lan_main("keypair", "--out", tmp_path / "k2") == 0
    assert len(capsys.readouterr().out.strip()) == 64


def test_keypair_errors(tmp_path, capsys):
    assert lan_main("keypair", "--out", tmp_path / "a", "--address", "10.0.0.1:0") == 2
    assert "fixed port" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
    d = tmp_path / "b"
    assert lan_main("keypair", "--out", d) == 0
    os.chmod(d / "node.key", 0o644)
    capsys.readouterr()
    assert lan_main("keypair", "--out", d) == 2
    assert "chmod 600" in capsys.readouterr().err


# ------------------------------------------------------------------------- generated files


def build_lan(tmp_path: Path, *extra: str, n: int = 3, keys: bool = True) -> Path:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(
        "".join(
            f"192.168.1.{11 + i}:7000" + (f" {key_hex()}" if keys else "") + "\n" for i in range(n)
        )
    )
    out = tmp_path / "lan"
    code = lan_main(
        "roster", "--hosts", hosts, "--set", f"graph.nodes={n}", "--out", out, "--json", *extra
    )
    assert code == 0
    return out


def test_roster_output_layout_and_contents(tmp_path, capsys):
    out = build_lan(tmp_path, "--set", "graph.kind=ring", n=4)
    summary = json.loads(capsys.readouterr().out)
    ros = roster.load_roster(out / "roster.json")
    hosts = lan.read_hosts(tmp_path / "hosts.txt")
    assert [(e.host, e.port, e.public_key) for e in ros] == [
        (h.host, h.port, h.public_key) for h in hosts
    ]
    assert ros.name == "muffliato-ring" and summary["run_id"] == ros.run_id
    assert [x["neighbours"] for x in summary["nodes"]] == [[1, 3], [0, 2], [1, 3], [0, 2]]
    cfg = config.load(out / "config.toml")
    assert cfg.graph_n() == 4
    for i in range(4):
        d = out / "hosts" / f"node-{i}"
        assert sorted(p.name for p in d.iterdir()) == sorted(
            ["README.txt", "config.toml", "roster.json", "start.sh", f"cfree-peer-{i}.service"]
        )
        assert (d / "roster.json").read_bytes() == (out / "roster.json").read_bytes()
        assert (d / "config.toml").read_bytes() == (out / "config.toml").read_bytes()
        assert os.access(d / "start.sh", os.X_OK)
        readme = (d / "README.txt").read_text()
        assert f"listens on 192.168.1.{11 + i}:7000" in readme
        # The firewall rules allow exactly the neighbours' addresses.
        nbrs = [f"192.168.1.{11 + w}" for w in summary["nodes"][i]["neighbours"]]
        rules = [x.strip() for x in readme.splitlines() if "ufw allow" in x]
        assert rules == [f"sudo ufw allow from {h} to any port 7000 proto tcp" for h in nbrs]
        nft = f"ip saddr {{ {', '.join(nbrs)} }} tcp dport 7000 accept"
        assert nft in readme
        assert f"{lan.DEFAULT_REMOTE_DIR}/logs/node-{i}.vlog" in readme
    assert os.access(out / "collect.sh", os.X_OK)
    assert "cfree audit run" in (out / "README.txt").read_text()


def test_start_script_is_the_exact_peer_command(tmp_path, capsys):
    weird_dir = "/srv/c free/it's %h $HOME/{id}"
    out = build_lan(
        tmp_path,
        "--remote-dir",
        weird_dir,
        "--key-path",
        "/keys/n{id}.key",
        "--cfree-cmd",
        "/opt/cfree/venv/bin/cfree",
    )
    capsys.readouterr()
    for i in range(3):
        script = out / "hosts" / f"node-{i}" / "start.sh"
        assert subprocess.run(["sh", "-n", str(script)]).returncode == 0
        lines = [x for x in script.read_text().splitlines() if x and not x.startswith("#")]
        d = weird_dir.replace("{id}", str(i))
        assert lines[0] == "set -eu"
        assert shlex.split(lines[1]) == ["cd", d]
        assert shlex.split(lines[2]) == [
            "exec", "/opt/cfree/venv/bin/cfree", "peer", "--config", f"{d}/config.toml",
            "--roster", f"{d}/roster.json", "--key", f"/keys/n{i}.key", "--id", str(i),
            "--out", d,
        ]  # fmt: skip
        assert "--listen 0.0.0.0:7000" in script.read_text()  # a comment only
    # The shell really sees those words (printf stands in for the peer).
    fake = tmp_path / "fakecfree"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    text = (out / "hosts" / "node-1" / "start.sh").read_text()
    text = text.replace("/opt/cfree/venv/bin/cfree", str(fake))
    text = text.replace(f"cd {shlex.quote(weird_dir.replace('{id}', '1'))}", "cd /")
    probe = tmp_path / "probe.sh"
    probe.write_text(text)
    got = subprocess.run(["sh", str(probe)], capture_output=True, text=True, check=True)
    assert got.stdout.splitlines()[-1] == weird_dir.replace("{id}", "1")


def unit_sections(text: str) -> dict[str, dict[str, str]]:
    sections: dict[str, dict[str, str]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"setting outside a section: {line}"
        key, sep, value = line.partition("=")
        assert sep and key.strip() == key and key.isidentifier(), line
        assert key not in current, f"{key} set twice"
        current[key] = value
    return sections


def test_systemd_unit_is_sane(tmp_path, capsys):
    out = build_lan(tmp_path, "--user", "alice", "--remote-dir", "/srv/run-{id}")
    capsys.readouterr()
    for i in range(3):
        unit = out / "hosts" / f"node-{i}" / f"cfree-peer-{i}.service"
        s = unit_sections(unit.read_text())
        assert set(s) == {"Unit", "Service", "Install"}
        svc = s["Service"]
        assert svc["Type"] == "simple" and svc["Restart"] == "no" and svc["User"] == "alice"
        assert svc["WorkingDirectory"] == f"/srv/run-{i}"
        argv = shlex.split(svc["ExecStart"])
        assert argv[0] == "/usr/bin/env" and argv[1:3] == ["cfree", "peer"]  # default cmd
        assert argv[argv.index("--id") + 1] == str(i)
        assert argv[argv.index("--key") + 1] == lan.DEFAULT_KEY_PATH
        assert argv[argv.index("--out") + 1] == f"/srv/run-{i}"
        assert s["Unit"]["After"] == "network-online.target"
        assert s["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_analyze_verifies_the_unit(tmp_path, capsys):
    out = build_lan(tmp_path, "--cfree-cmd", CFREE_CMD, "--remote-dir", str(tmp_path / "r {id}"))
    capsys.readouterr()
    unit = out / "hosts" / "node-0" / "cfree-peer-0.service"
    proc = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert unit.name not in proc.stderr and "Unknown" not in proc.stderr, proc.stderr
    # The same check fails for a unit whose executable does not exist.
    bad = tmp_path / "bad-0.service"
    bad.write_text(unit.read_text().replace(sys.executable, "/nonexistent/python"))
    proc = subprocess.run(
        ["systemd-analyze", "verify", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0 and "/nonexistent/python" in proc.stderr


def test_config_files_travel_with_the_config(tmp_path, capsys):
    elsewhere = tmp_path / "inputs"
    elsewhere.mkdir()
    edges = elsewhere / "triangle.edges"
    edges.write_text("0 1\n1 2\n2 0\n")
    cfg = elsewhere / "exp.toml"
    cfg.write_text(
        config.load(None, ["graph.kind=edgelist", f"graph.path={edges}"])
        .to_toml()
        .replace(str(edges), "triangle.edges")
    )
    hosts = hosts_file(tmp_path, 3)
    out = tmp_path / "lan"
    assert lan_main("roster", "--hosts", hosts, "--config", cfg, "--out", out) == 0
    capsys.readouterr()
    assert 'path = "graph-triangle.edges"' in (out / "config.toml").read_text()
    # A host directory moved anywhere still loads (the path is relative to the config).
    moved = tmp_path / "elsewhere-host"
    shutil.copytree(out / "hosts" / "node-2", moved)
    edges.unlink()
    assert config.load(moved / "config.toml").graph_n() == 3
    assert (moved / "graph-triangle.edges").read_text() == "0 1\n1 2\n2 0\n"
    assert "graph-triangle.edges" in (out / "collect.sh").read_text()
    assert "graph-triangle.edges" in (moved / "README.txt").read_text()


# --------------------------------------------------------------------------------- secrets


def secret_forms(key_file: Path) -> list[bytes]:
    """Ways a private key could leak into a file: PEM body, raw bytes, hex, base64."""
    pem = key_file.read_bytes()
    key = serialization.load_pem_private_key(pem, password=None)
    raw = key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    body = b"".join(pem.splitlines()[1:-1])
    return [body, raw, raw.hex().encode(), raw.hex().upper().encode(), base64.b64encode(raw)]


def files_under(*dirs: Path) -> list[Path]:
    return [p for d in dirs for p in sorted(d.rglob("*")) if p.is_file()]


def assert_no_secret(files: list[Path], key_files: list[Path]) -> None:
    assert files
    forms = [f for k in key_files for f in secret_forms(k)]
    for path in files:
        data = path.read_bytes()
        for form in forms:
            assert form not in data, f"a private key leaks into {path}"


def test_generate_keys_only_for_a_test_and_each_key_stays_in_its_host_dir(tmp_path, capsys):
    out = build_lan(tmp_path, "--generate-keys", keys=False)
    assert json.loads(capsys.readouterr().out)["generated_keys"] is True
    ros = roster.load_roster(out / "roster.json")
    keys = [out / "hosts" / f"node-{i}" / "node.key" for i in range(3)]
    for i, k in enumerate(keys):
        assert stat.S_IMODE(k.stat().st_mode) == 0o600
        roster.check_key_matches(ros, i, roster.load_private_key(k))
        assert "--generate-keys made it" in (k.parent / "README.txt").read_text()
    for k in keys:
        # Each node's key is nowhere but in its own node.key.
        others = [p for p in files_under(out) if p != k]
        assert_no_secret(others, [k])


def _readme_copy_commands(readme: str) -> tuple[str, list[str], str, list[str]]:
    """The README's command copying the shared files: (source dir, file names, destination
    dir), and every other scp line."""
    copy = [x.strip() for x in readme.splitlines() if "&& scp -p" in x]
    assert len(copy) == 1, readme
    m = re.fullmatch(r"\(cd (\S+) && scp -p (.+) \S+@\S+?:(\S+)/\)", copy[0])
    assert m, copy[0]
    others = [x.strip() for x in readme.splitlines() if "scp" in x and "&& scp -p" not in x]
    return m[1], shlex.split(m[2]), m[3], [x for x in others if x.startswith("scp ")]


@pytest.mark.parametrize("generate", [True, False])
def test_readme_copies_the_shared_files_and_never_a_generated_key_with_them(
    tmp_path, capsys, generate
):
    extra = ("--generate-keys",) if generate else ()
    out = build_lan(tmp_path, *extra, "--key-path", "/etc/cfree/node-{id}.key", keys=not generate)
    capsys.readouterr()
    for i in range(3):
        d = out / "hosts" / f"node-{i}"
        src, names, dest, key_lines = _readme_copy_commands((d / "README.txt").read_text())
        assert (src, dest) == (f"hosts/node-{i}", lan.DEFAULT_REMOTE_DIR)
        # Named one by one (no glob that could match node.key), each a file of that directory.
        assert not any(c in n for n in names for c in "*?[{")
        assert lan.KEY_FILE not in names and all("key" not in n for n in names)
        assert set(names) == {p.name for p in d.iterdir()} - {lan.KEY_FILE, "README.txt"}
        key_path = f"/etc/cfree/node-{i}.key"
        assert f"--key {key_path}" in (d / "start.sh").read_text()
        if generate:
            assert (d / lan.KEY_FILE).is_file()
            # The key has its own line, to the key path start.sh reads, not the run directory.
            assert key_lines == [f"scp -p {src}/{lan.KEY_FILE} cfree@192.168.1.{11 + i}:{key_path}"]
            assert "chmod 600" in (d / "README.txt").read_text()
        else:
            assert not (d / lan.KEY_FILE).exists() and key_lines == []


# ----------------------------------------------------------------------------- real LAN flow


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


FAKE_SCP = """#!/bin/sh
# Stand-in for scp on one machine: the source "[user@]host:path" is a local path.
src= dst=
for a in "$@"; do
    case "$a" in -*) ;; *) if [ -z "$src" ]; then src=$a; else dst=$a; fi ;; esac
done
echo "$src" >> "$SCP_LOG"
exec cp -p "${src#*:}" "$dst"
"""

N_LAN = 4


def run_lan_flow(tmp_path: Path, invoke) -> None:
    """Keys per host, roster from public keys only, generated start.sh per host in parallel,
    collect.sh, audit. ``invoke(argv)`` runs one cfree command and returns its stdout."""
    ports = free_ports(N_LAN)
    hosts_dir = tmp_path / "machines"
    # 1. On every host: its own key; only the printed line leaves the host.
    lines = [
        invoke(["keypair", "--out", hosts_dir / f"h{i}" / "etc", "--address",
                f"127.0.0.1:{ports[i]}"])
        for i in range(N_LAN)
    ]  # fmt: skip
    hosts = tmp_path / "organiser" / "hosts.txt"
    hosts.parent.mkdir()
    hosts.write_text("# the lines cfree keypair printed\n" + "".join(lines))
    cfg_path = write_config(
        tmp_path / "organiser" / "exp.toml",
        f"graph.nodes={N_LAN}",
        "run.name=lan-test",
        "network.deadline_s=20",
        "network.connect_timeout_s=60",
    )
    # 2. On the organiser's machine: the roster from the public lines alone.
    out = tmp_path / "organiser" / "lan"
    invoke(
        ["roster", "--hosts", hosts, "--config", cfg_path, "--out", out,
         "--remote-dir", f"{hosts_dir}/h{{id}}/run", "--key-path", f"{hosts_dir}/h{{id}}/etc/node.key",
         "--cfree-cmd", CFREE_CMD, "--user", "tester"]
    )  # fmt: skip
    ros = roster.load_roster(out / "roster.json")
    assert ros.name == "lan-test" and [e.port for e in ros] == ports
    key_files = [hosts_dir / f"h{i}" / "etc" / "node.key" for i in range(N_LAN)]
    assert_no_secret(files_under(out), key_files)
    # 3. Copy each host's directory to it, then start every generated start.sh at once.
    for i in range(N_LAN):
        run_dir = hosts_dir / f"h{i}" / "run"
        run_dir.mkdir()
        for f in (out / "hosts" / f"node-{i}").iterdir():
            shutil.copy2(f, run_dir / f.name)
        text = (run_dir / "start.sh").read_text()
        assert str(key_files[i]) in text
        assert not any(str(k) in text for j, k in enumerate(key_files) if j != i)
    procs = []
    try:
        for i in range(N_LAN):
            log = open(tmp_path / f"peer-{i}.log", "wb")  # closed below
            procs.append(
                (
                    subprocess.Popen(
                        [str(hosts_dir / f"h{i}" / "run" / "start.sh")],
                        cwd="/",
                        env=ENV,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    ),
                    log,
                )
            )
        deadline = time.monotonic() + 240
        for i, (p, _) in enumerate(procs):
            code = p.wait(timeout=max(1.0, deadline - time.monotonic()))
            assert code == 0, (tmp_path / f"peer-{i}.log").read_text()
    finally:
        for p, log in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
            log.close()
    # 4. Collect with the generated collect.sh (scp replaced by a local copy).
    fakebin = tmp_path / "fakebin"
    fakebin.mkdir()
    (fakebin / "scp").write_text(FAKE_SCP)
    (fakebin / "scp").chmod(0o755)
    scp_log = tmp_path / "scp.log"
    env = dict(ENV, PATH=f"{fakebin}{os.pathsep}{os.environ['PATH']}", SCP_LOG=str(scp_log))
    env.pop("CFREE_SSH_USER", None)
    proc = subprocess.run(
        [str(out / "collect.sh")], cwd="/", env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    wanted = [
        f"tester@127.0.0.1:{hosts_dir}/h{i}/run/{kind}/node-{i}.{ext}"
        for i in range(N_LAN)
        for kind, ext in (("logs", "vlog"), ("results", "json"))
    ]
    assert scp_log.read_text().splitlines() == wanted
    run = out / "run"
    assert_no_secret(files_under(run), key_files)
    # 5. The audit of the collected directory: fault-free and equal to the plan.
    cfg = config.load(run / "config.toml")
    rep = audit.audit_run(run)
    assert rep["fault_free"] is True and rep["integrity"] == [], rep["integrity"]
    assert [o["observer"] for o in rep["observers"]] == list(range(N_LAN))
    assert_audit_equals_plan(rep, make_plan(cfg), tol=1e-9)

    # And the peers computed exactly what the reference simulator computes with their keys.
    def own_streams(v: int) -> seeds.NodeSecretStreams:
        # The nonce and config digest each peer drew its streams with are in its view log.
        nonce, digest = seeds.read_streams_record(run / "logs" / f"node-{v}.vlog")
        key = roster.load_private_key(key_files[v])
        return seeds.NodeSecretStreams(key, ros.run_id_bytes, v, config_digest=digest, nonce=nonce)

    streams = seeds.PerNodeStreams({v: own_streams(v) for v in range(N_LAN)})
    ref = sim.simulate(cfg, streams=streams)
    for v in range(N_LAN):
        res = json.loads((run / "results" / f"node-{v}.json").read_text())
        assert np.array_equal(np.asarray(res["estimate"]), ref.finals[v]), v
        assert res["missed"] == []


def test_lan_flow_on_loopback(tmp_path, capsys):
    def invoke(argv) -> str:
        code = lan_main(*argv)
        out, err = capsys.readouterr()
        assert code == 0, err
        return out

    run_lan_flow(tmp_path, invoke)


# ------------------------------------------------------- the same through `python -m coordinator_free`


@pytest.mark.slow  # the same flow through the library stays quick (test_lan_flow_on_loopback)
def test_cli_lan_flow_on_loopback(tmp_path):
    """Every command as its own process, as on separate machines."""

    def invoke(argv) -> str:
        proc = cfree(*argv)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    run_lan_flow(tmp_path, invoke)


def test_cli_help_and_errors(tmp_path):
    for command in ("keypair", "roster"):
        proc = cfree(command, "--help")
        assert proc.returncode == 0 and "docs/deploy.md" in proc.stdout
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(f"10.0.0.1:7000 {KEY_A}\n10.0.0.1:7000 {KEY_B}\n10.0.0.3 {KEY_C}\n")
    proc = cfree("roster", "--hosts", hosts, "--set", "graph.nodes=3", "--out", tmp_path / "o")
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"cfree roster: error: {hosts}:2: 10.0.0.1:7000 is already")
    assert not (tmp_path / "o").exists()
    proc = cfree("keypair", "--out", tmp_path / "k", "--address", "[fd00::1")
    assert proc.returncode == 2 and "without a closing" in proc.stderr
