"""Running a run across LAN machines: per-host keys, the roster, and what each host must do.

Two commands (docs/deploy.md walks through them on three machines):

``cfree keypair --out DIR [--address HOST:PORT]``
    On each host: a fresh X25519 private key in ``DIR/node.key`` (mode 0600, never
    overwritten) and its public half in ``DIR/node.pub``, as the line of ``hosts.txt`` that
    describes this host (``HOST:PORT PUBLIC_KEY``). Only that line leaves the host.

``cfree roster --hosts hosts.txt [--config CONFIG] --out DIR``
    On any one machine (the organiser's): assigns node ids to the hosts in file order, writes
    the public roster and the resolved config, and for every host a directory with the exact
    command that starts its peer (``start.sh``), the same command as a systemd unit, and a
    README.txt naming the files to copy and the port to open to which neighbours. ``collect.sh``
    fetches every node's view log and result into ``DIR/run`` for ``cfree audit``.

hosts.txt
---------
One host per line, in node id order; ``#`` starts a comment, blank lines are skipped::

    # address            public key (printed by `cfree keypair` on that host)
    192.168.1.11:7000    6c1f...64 hex characters
    192.168.1.12         ...                          <- port: --port (default 7000)
    [fd00::13]:7000      ...                          <- IPv6 in brackets

The second column is required unless ``cfree roster --generate-keys`` makes every key on the
organiser's machine (a test where one person owns all the machines: private keys then have to
be copied to the hosts). Errors name the file and the line.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from coordinator_free import rundir
from coordinator_free.config import portable_config
from coordinator_free.errors import CfreeError
from coordinator_free.helptext import HelpFormatter

DEFAULT_PORT = 7000
DEFAULT_REMOTE_DIR = "/opt/cfree/run"
DEFAULT_KEY_PATH = "/etc/cfree/node.key"
DEFAULT_USER = "cfree"
DEFAULT_CFREE_CMD = "cfree"
KEY_FILE = "node.key"
PUB_FILE = "node.pub"
MAX_HOSTS_FILE_BYTES = 16 << 20

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_PORT = re.compile(r"[0-9]{1,5}")
_HOST_CHARS = re.compile(r"[A-Za-z0-9_.:%-]+")


class LanError(CfreeError, ValueError):
    """A hosts file, an option or an output directory cannot be used; the message says where."""


# --------------------------------------------------------------------------------------------
# hosts.txt


@dataclass(frozen=True)
class HostLine:
    """One host of hosts.txt: where it was written, its address and (if given) its public key."""

    line: int
    host: str
    port: int
    public_key: bytes | None = None

    @property
    def address(self) -> str:
        return format_address(self.host, self.port)


def format_address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _port(text: str) -> int:
    if not _PORT.fullmatch(text):
        raise LanError(f"port {text!r} is not a number")
    port = int(text)
    if port == 0:
        raise LanError(
            "port 0 means 'any free port', which only works when one launcher starts every "
            "peer; across machines every peer needs a fixed port"
        )
    if port > 65535:
        raise LanError(f"port {port} is not in 1..65535")
    return port


def parse_address(text: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """``host``, ``host:port``, ``[ipv6]`` or ``[ipv6]:port`` -> ``(host, port)``."""
    from coordinator_free.roster import RosterError, _check_host

    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise LanError(f"{text!r}: '[' without a closing ']'")
        host, rest = text[1:end], text[end + 1 :]
        if rest and not rest.startswith(":"):
            raise LanError(f"{text!r}: expected ':PORT' after ']', got {rest!r}")
        port = _port(rest[1:]) if rest else default_port
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise LanError(f"{text!r}: {host!r} in brackets is not an IPv6 address") from None
    else:
        if text.count(":") > 1:
            raise LanError(f"{text!r}: write an IPv6 address in brackets, e.g. [{text}]:PORT")
        host, sep, port_text = text.partition(":")
        port = _port(port_text) if sep else default_port
    if not _HOST_CHARS.fullmatch(host):
        raise LanError(f"{text!r}: {host!r} is not a host name or IP address")
    try:
        _check_host(host)
    except RosterError as exc:
        raise LanError(f"{text!r}: {exc}") from None
    return host, port


def _public_key(text: str) -> bytes:
    from coordinator_free.roster import RosterError, _check_public_key

    if not _HEX64.fullmatch(text):
        raise LanError(
            f"public key {text[:80]!r} is not 64 hex characters (the line `cfree keypair` "
            "prints on the host)"
        )
    try:
        return _check_public_key(bytes.fromhex(text))
    except RosterError as exc:
        raise LanError(str(exc)) from None


def _host_key(host: str) -> str:
    """Spellings of one host that name the same address compare equal."""
    host = host.lower().rstrip(".")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def parse_hosts(
    text: str, *, source: str = "<hosts>", default_port: int = DEFAULT_PORT
) -> list[HostLine]:
    """Parse hosts.txt text; every error is a :class:`LanError` naming ``source`` and the line."""
    hosts: list[HostLine] = []
    seen_addr: dict[tuple[str, int], int] = {}
    seen_key: dict[bytes, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        fields = raw.split("#", 1)[0].split()
        if not fields:
            continue
        where = f"{source}:{number}"
        if len(fields) > 2:
            raise LanError(
                f"{where}: expected 'HOST[:PORT] [PUBLIC_KEY]', got {len(fields)} fields: "
                f"{raw.strip()!r}"
            )
        try:
            host, port = parse_address(fields[0], default_port)
            key = _public_key(fields[1]) if len(fields) == 2 else None
        except LanError as exc:
            raise LanError(f"{where}: {exc}") from None
        addr = (_host_key(host), port)
        if addr in seen_addr:
            raise LanError(
                f"{where}: {format_address(host, port)} is already used by line "
                f"{seen_addr[addr]}; two peers cannot listen on the same address"
            )
        seen_addr[addr] = number
        if key is not None:
            if key in seen_key:
                raise LanError(
                    f"{where}: the same public key as line {seen_key[key]} (one host's line "
                    "pasted twice?); every node needs its own key"
                )
            seen_key[key] = number
        hosts.append(HostLine(number, host, port, key))
    if not hosts:
        raise LanError(f"{source}: lists no hosts (one 'HOST[:PORT] PUBLIC_KEY' per line)")
    return hosts


def read_hosts(path: str | os.PathLike, *, default_port: int = DEFAULT_PORT) -> list[HostLine]:
    """Read and parse a hosts file; errors name the file (and the line)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_HOSTS_FILE_BYTES + 1)
    except FileNotFoundError:
        raise LanError(f"hosts file {path} does not exist") from None
    except IsADirectoryError:
        raise LanError(f"hosts file {path} is a directory") from None
    except OSError as exc:
        raise LanError(f"cannot read hosts file {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_HOSTS_FILE_BYTES:
        raise LanError(f"hosts file {path} is larger than {MAX_HOSTS_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise LanError(f"{path}:{line}: not UTF-8 text") from None
    return parse_hosts(text, source=str(path), default_port=default_port)


# --------------------------------------------------------------------------------------------
# Quoting for the generated files


_SHELL_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


def _check_text(what: str, text: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise LanError(f"{what} {text!r} contains a control character")
    return text


def _systemd_word(word: str) -> str:
    """One argument of an ExecStart= line (systemd's quoting, specifiers and $ escaped)."""
    word = word.replace("%", "%%").replace("$", "$$")
    if _SHELL_SAFE.fullmatch(word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _systemd_path(path: str) -> str:
    """A path setting (WorkingDirectory=): specifiers escaped; spaces are allowed as is."""
    return path.replace("%", "%%")


def split_command(cmd: str) -> list[str]:
    """``--cfree-cmd`` as words (shell syntax), e.g. ``/opt/cfree/venv/bin/cfree`` or
    ``/usr/bin/python3 -m coordinator_free``."""
    try:
        words = shlex.split(cmd)
    except ValueError as exc:
        raise LanError(f"--cfree-cmd {cmd!r}: {exc}") from None
    if not words:
        raise LanError("--cfree-cmd is empty")
    for w in words:
        _check_text("--cfree-cmd", w)
    return words


# --------------------------------------------------------------------------------------------
# The deployment: everything computed before a single file is written


@dataclass(frozen=True)
class NodeDeploy:
    """What one host runs: node ``id`` at ``host:port``, its paths on that host, its
    neighbours, and the text of its generated files."""

    id: int
    line: int
    host: str
    port: int
    remote_dir: str
    key_path: str
    neighbours: tuple[int, ...]
    files: dict[str, str]  # name -> text, written to hosts/node-<id>/


@dataclass(frozen=True)
class Deployment:
    cfg: object  # config.Config (with file paths made relative to the config)
    roster: object  # roster.Roster
    nodes: tuple[NodeDeploy, ...]
    config_text: str
    extra_files: dict[str, Path]  # name in the run directory -> source file (graph, data)
    private_keys: dict[int, object]  # --generate-keys only: node id -> X25519PrivateKey
    collect_sh: str
    readme: str


def _node_path(template: str, option: str, node_id: int) -> str:
    path = _check_text(option, template.replace("{id}", str(node_id)))
    if not PurePosixPath(path).is_absolute():
        raise LanError(
            f"{option} {template!r} must be an absolute path on the hosts (systemd and the "
            "generated scripts use it as is)"
        )
    return str(PurePosixPath(path))


def _with_id(path: str) -> str:
    p = PurePosixPath(path)
    return str(p.with_name(f"{p.stem}-{{id}}{p.suffix}"))


def _check_host_count(plan, cfg, hosts: list[HostLine], hosts_source: str) -> None:
    """The run has peers, one per host: else a LanError that says what to change."""
    from coordinator_free.config import SIZED_BY_NODES
    from coordinator_free.families import family_of

    if not family_of(cfg.protocol.name).has_peers(cfg):
        raise LanError(
            f"{cfg.protocol.name} is the trusted-curator baseline: it runs in one process "
            "(cfree run), not as peers on several machines"
        )
    if plan.n != len(hosts):
        g = cfg.graph
        least = 3 if g.kind == "ring" else 2
        if g.kind not in SIZED_BY_NODES:
            how = "change the graph or the hosts"
        elif len(hosts) < least:
            how = (
                f"a {g.kind} graph needs at least {least} nodes: list at least {least} lines "
                "(several nodes can share a machine on different ports)"
            )
        else:
            how = f"use --set graph.nodes={len(hosts)}"
        raise LanError(
            f"{hosts_source} lists {len(hosts)} hosts but the config's graph "
            f"(graph.kind = {g.kind!r}, {cfg.source}) has {plan.n} nodes; {how}"
        )


def _checked_command(user: str, cfree_cmd: str, name: str | None) -> list[str]:
    """``--cfree-cmd`` as argv words, after checking it, ``--user`` and ``--name`` (LanError)."""
    from coordinator_free.config import NAME_CHARS

    if not user or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\$?", user):
        raise LanError(f"--user {user!r} is not a user name")
    cmd = split_command(cfree_cmd)
    if name is not None and (not name or not set(name) <= NAME_CHARS or name.startswith(".")):
        raise LanError(f"--name {name!r} must be letters, digits, '-', '_' or '.'")
    return cmd


def _host_keys(
    hosts: list[HostLine], hosts_source: str, generate_keys: bool
) -> tuple[dict[int, object], list[bytes]]:
    """Every host's public key, in node order, from the hosts file or, with
    ``generate_keys``, made here (then also returned: node id -> private key)."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    from coordinator_free import roster as roster_mod

    private: dict[int, X25519PrivateKey] = {}
    keys: list[bytes] = []
    for i, h in enumerate(hosts):
        if generate_keys:
            if h.public_key is not None:
                raise LanError(
                    f"{hosts_source}:{h.line}: gives a public key, but --generate-keys makes "
                    "every key here; drop the key column or drop --generate-keys"
                )
            private[i] = X25519PrivateKey.generate()
            keys.append(roster_mod.public_bytes(private[i]))
        elif h.public_key is None:
            raise LanError(
                f"{hosts_source}:{h.line}: {h.address} has no public key; run "
                f"`cfree keypair --out DIR --address {h.address}` on that host and put the line "
                "it prints here (or, to make every key on this machine for a test, "
                "--generate-keys)"
            )
        else:
            keys.append(h.public_key)
    return private, keys


def _node_paths(
    hosts: list[HostLine], hosts_source: str, remote_dir: str, key_path: str
) -> tuple[list[str], list[str]]:
    """Each node's run directory and key path on its host (``{id}`` replaced), refusing two
    nodes on one host that would share either."""
    dirs = [_node_path(remote_dir, "--remote-dir", i) for i in range(len(hosts))]
    key_paths = [_node_path(key_path, "--key-path", i) for i in range(len(hosts))]
    on_host: dict[str, int] = {}
    for i, h in enumerate(hosts):
        j = on_host.setdefault(_host_key(h.host), i)
        if j == i:
            continue
        for option, paths in (("--remote-dir", dirs), ("--key-path", key_paths)):
            if paths[i] == paths[j]:
                raise LanError(
                    f"{hosts_source}:{h.line}: nodes {j} and {i} both run on {h.host} and would "
                    f"share {option} {paths[i]}; put {{id}} in it (it becomes the node id), "
                    f"e.g. {option} '{_with_id(paths[i])}'"
                )
    return dirs, key_paths


def plan_deployment(
    hosts: list[HostLine],
    cfg,
    *,
    hosts_source: str = "hosts.txt",
    generate_keys: bool = False,
    remote_dir: str = DEFAULT_REMOTE_DIR,
    key_path: str = DEFAULT_KEY_PATH,
    user: str = DEFAULT_USER,
    cfree_cmd: str = DEFAULT_CFREE_CMD,
    name: str | None = None,
    run_id: str | None = None,
) -> Deployment:
    """Check the hosts against the config and build every file's text (nothing is written)."""
    from coordinator_free import roster as roster_mod
    from coordinator_free.families import make_plan

    plan = make_plan(cfg)
    _check_host_count(plan, cfg, hosts, hosts_source)
    cmd = _checked_command(user, cfree_cmd, name)
    private, keys = _host_keys(hosts, hosts_source, generate_keys)
    ros = roster_mod.Roster(
        run_id=run_id if run_id is not None else os.urandom(roster_mod.RUN_ID_BYTES).hex(),
        name=name or cfg.run.name,
        entries=tuple(
            roster_mod.RosterEntry(i, h.host, h.port, k)
            for i, (h, k) in enumerate(zip(hosts, keys, strict=True))
        ),
    )
    dirs, key_paths = _node_paths(hosts, hosts_source, remote_dir, key_path)

    # Files the config uses travel beside it, under names relative to it.
    portable, extra = portable_config(cfg)
    config_text = portable.to_toml()
    neighbours = {v: tuple(plan.neighbours(v)) for v in range(plan.n)}
    nodes = []
    for i, h in enumerate(hosts):
        node = NodeDeploy(
            id=i,
            line=h.line,
            host=h.host,
            port=h.port,
            remote_dir=dirs[i],
            key_path=key_paths[i],
            neighbours=neighbours[i],
            files={},
        )
        files = {
            "start.sh": _start_sh(node, ros, cfg, cmd),
            f"cfree-peer-{i}.service": _unit(node, ros, cmd, user),
            "README.txt": _host_readme(node, ros, cfg, hosts, user, extra, generate_keys),
        }
        nodes.append(replace(node, files=files))
    return Deployment(
        cfg=portable,
        roster=ros,
        nodes=tuple(nodes),
        config_text=config_text,
        extra_files=extra,
        private_keys=private,
        collect_sh=_collect_sh(nodes, ros, user, extra),
        readme=_overview(nodes, ros, cfg, hosts_source),
    )


def _peer_argv(node: NodeDeploy, cmd: list[str]) -> list[str]:
    d = PurePosixPath(node.remote_dir)
    return [
        *cmd,
        "peer",
        "--config",
        str(rundir.config_path(d)),
        "--roster",
        str(rundir.roster_path(d)),
        "--key",
        node.key_path,
        "--id",
        str(node.id),
        "--out",
        str(d),
    ]


def _neighbour_lines(node: NodeDeploy, ros, indent: str) -> list[str]:
    out = []
    for w in node.neighbours:
        e = ros.get(w)
        out.append(f"{indent}node {w}  {format_address(e.host, e.port)}")
    return out


def _start_sh(node: NodeDeploy, ros, cfg, cmd: list[str]) -> str:
    addr = format_address(node.host, node.port)
    any_addr = format_address("::" if ":" in node.host else "0.0.0.0", node.port)
    lines = [
        "#!/bin/sh",
        f"# Node {node.id} of run {ros.name!r} (run id {ros.run_id}), on {node.host}.",
        f"# Run it on {node.host} as the account that owns {node.key_path}, once, with",
        f"# config.toml and roster.json in {node.remote_dir}.",
        f"# It listens on {addr} (TCP) and talks to its graph neighbours only:",
        *_neighbour_lines(node, ros, "#   "),
        f"# They must all start within network.connect_timeout_s = "
        f"{cfg.network.connect_timeout_s:g} s of each other.",
        f"# Its view log goes to {node.remote_dir}/logs/node-{node.id}.vlog, its result to",
        f"# {node.remote_dir}/results/node-{node.id}.json.",
        "# The peer binds the roster address above; to bind every interface instead (NAT,",
        f"# several addresses) add this option to the command:  --listen {any_addr}",
        "set -eu",
        f"cd {shlex.quote(node.remote_dir)}",
        "exec " + " ".join(shlex.quote(a) for a in _peer_argv(node, cmd)),
        "",
    ]
    return "\n".join(lines)


def _unit(node: NodeDeploy, ros, cmd: list[str], user: str) -> str:
    argv = _peer_argv(node, cmd)
    if not PurePosixPath(argv[0]).is_absolute():
        # systemd wants an absolute executable; env finds the command on systemd's PATH.
        argv = ["/usr/bin/env", *argv]
    addr = format_address(node.host, node.port)
    lines = [
        f"# cfree peer: node {node.id} of run {ros.name!r} (run id {ros.run_id}),",
        f"# listening on {addr}/tcp. Install and start it on {node.host}:",
        f"#   sudo cp cfree-peer-{node.id}.service /etc/systemd/system/",
        f"#   sudo systemctl daemon-reload && sudo systemctl start cfree-peer-{node.id}",
        "# A run happens once: start the unit, do not enable it (a second start would find this",
        "# run's view log and refuse to overwrite it).",
        "[Unit]",
        f"Description=coordinator-free peer, node {node.id} of run {ros.name}".replace("%", "%%"),
        "Wants=network-online.target",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"User={user}",
        f"WorkingDirectory={_systemd_path(node.remote_dir)}",
        "ExecStart=" + " ".join(_systemd_word(a) for a in argv),
        "Restart=no",
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
        "ProtectSystem=full",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)


def _firewall_lines(node: NodeDeploy, ros) -> list[str]:
    sources: list[str] = []
    for w in node.neighbours:
        h = ros.get(w).host
        if _host_key(h) != _host_key(node.host) and h not in sources:
            sources.append(h)
    if not sources:
        return ["   (all its neighbours run on this same host: nothing to open)"]
    lines = ["   ufw:"]
    for h in sources:
        lines.append(f"     sudo ufw allow from {h} to any port {node.port} proto tcp")
    v4 = [h for h in sources if ":" not in h]
    v6 = [h for h in sources if ":" in h]
    lines.append("   nftables (with the usual 'inet filter' table and 'input' chain):")
    for family, group in (("ip", v4), ("ip6", v6)):
        if group:
            lines.append(
                f"     sudo nft add rule inet filter input {family} saddr "
                f"{{ {', '.join(group)} }} tcp dport {node.port} accept"
            )
    if any(not _is_ip(h) for h in sources):
        lines.append(
            "   (write firewall rules with IP addresses: replace the host names by theirs)"
        )
    return lines


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def _host_readme(node, ros, cfg, hosts, user, extra, generate_keys) -> str:
    i, d = node.id, node.remote_dir
    unit = f"cfree-peer-{i}.service"
    files = [
        (rundir.CONFIG, "the run's configuration (the same on every host)"),
        (rundir.ROSTER, "the public roster: every node's address and public key"),
        *((name, "a file the config refers to") for name in sorted(extra)),
        ("start.sh", "the exact command that starts this node's peer"),
        (unit, "the same command as a systemd unit"),
    ]
    width = max(len(f) for f, _ in files)
    target = f"{user}@{_scp_host(node.host)}"
    h = hosts[i]
    lines = [
        f"Node {i} of run {ros.name!r} (run id {ros.run_id}): {node.host}, line {h.line} of "
        "the hosts file.",
        "",
        f"It listens on {format_address(node.host, node.port)} (TCP) and exchanges messages "
        "with its graph neighbours only:",
        *_neighbour_lines(node, ros, "  "),
        "",
        f"1. Copy these files to {d}/ on {node.host} (owned by {user}):",
        *(f"     {f.ljust(width)}  {what}" for f, what in files),
        "   e.g. from the directory `cfree roster` wrote (where roster.json is):",
        # The files are named one by one, never globbed: a node.key made by --generate-keys
        # sits in the same directory and must not travel with the shared files.
        f"     (cd hosts/node-{i} && scp -p {shlex.join(f for f, _ in files)} {target}:{d}/)",
    ]
    if generate_keys:
        lines += [
            f"   The private key is in hosts/node-{i}/{KEY_FILE} (--generate-keys made it on the",
            "   organiser's machine). It is not one of the shared files above: it goes to this",
            "   host only, on its own, to the key path start.sh reads (--key-path):",
            f"     scp -p hosts/node-{i}/{KEY_FILE} {target}:{node.key_path}",
            f"   Its directory must exist first; it must be owned by {user} with mode 0600",
            f"   (scp -p keeps 0600; otherwise: chmod 600 {node.key_path} on {node.host}).",
        ]
    else:
        lines += [
            f"   The private key stays where `cfree keypair` wrote it on this host: {node.key_path}",
            f"   (owner {user}, mode 0600). It never leaves the host.",
        ]
    lines += [
        "",
        f"2. Open TCP port {node.port} to the neighbours' addresses (each side dials the other;",
        "   one connection per pair is kept):",
        *_firewall_lines(node, ros),
        "",
        "3. Start the peer on every host within network.connect_timeout_s = "
        f"{cfg.network.connect_timeout_s:g} s of each other",
        f"   (for a run without missed steps: within network.deadline_s = "
        f"{cfg.network.deadline_s:g} s), in any order:",
        f"     sudo -u {user} {d}/start.sh",
        "   or as a systemd service:",
        f"     sudo cp {d}/{unit} /etc/systemd/system/",
        f"     sudo systemctl daemon-reload && sudo systemctl start cfree-peer-{i}",
        f"     systemctl status cfree-peer-{i}; journalctl -u cfree-peer-{i}",
        "",
        "4. When it has finished, the auditor needs this node's view log and result:",
        f"     {d}/logs/node-{i}.vlog",
        f"     {d}/results/node-{i}.json",
        "   (collect.sh, next to roster.json on the organiser's machine, fetches them).",
        "",
    ]
    return "\n".join(lines)


def _scp_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _collect_sh(nodes, ros, user, extra) -> str:
    lines = [
        "#!/bin/sh",
        f"# Fetch the view log and result of every node of run {ros.name!r} (run id {ros.run_id})",
        "# into run/ next to this script, then audit them:  cfree audit run",
        "# Copies with scp as CFREE_SSH_USER (default: the account that ran the peers; an",
        "# empty value uses your ssh configuration). View logs are mode 0600: copy as that",
        "# account or as root.",
        "set -u",
        'cd "$(dirname "$0")"',
        f"user=${{CFREE_SSH_USER-{user}}}",
        "mkdir -p run/logs run/results",
        "cp "
        + " ".join(shlex.quote(n) for n in [rundir.CONFIG, rundir.ROSTER, *sorted(extra)])
        + " run/",
        "failed=0",
        "fetch() {  # fetch HOST REMOTE_FILE LOCAL_DIR",
        '    if ! scp -q -p "${user:+$user@}$1:$2" "$3/"; then',
        '        echo "collect.sh: could not fetch $2 from $1" >&2',
        "        failed=1",
        "    fi",
        "}",
    ]
    for n in nodes:
        d = PurePosixPath(n.remote_dir)
        host = shlex.quote(_scp_host(n.host))
        lines.append(f"fetch {host} {shlex.quote(str(d / 'logs' / f'node-{n.id}.vlog'))} run/logs")
        lines.append(
            f"fetch {host} {shlex.quote(str(d / 'results' / f'node-{n.id}.json'))} run/results"
        )
    lines += [
        'if [ "$failed" = 1 ]; then',
        '    echo "collect.sh: some files are missing; cfree audit reports them as integrity '
        'findings" >&2',
        "else",
        '    echo "collected every log into $(pwd)/run; next:  cfree audit $(pwd)/run"',
        "fi",
        'exit "$failed"',
        "",
    ]
    return "\n".join(lines)


def _overview(nodes, ros, cfg, hosts_source) -> str:
    rows = [("node", "address", "neighbours", "run directory")]
    for n in nodes:
        rows.append(
            (
                str(n.id),
                format_address(n.host, n.port),
                " ".join(str(w) for w in n.neighbours),
                n.remote_dir,
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    table = ["  " + "  ".join(r[c].ljust(widths[c]) for c in range(4)).rstrip() for r in rows]
    return "\n".join(
        [
            f"Run {ros.name!r} (run id {ros.run_id}): {len(nodes)} peers from {hosts_source}, "
            f"protocol {cfg.protocol.name} on graph {cfg.graph.kind}.",
            "",
            *table,
            "",
            "Shared files (public): roster.json, config.toml, hosts/node-<id>/ (except a node.key",
            "made by --generate-keys, which belongs to that one host only).",
            "",
            "In this directory:",
            "1. For every node, follow hosts/node-<id>/README.txt: copy the files, open the port,",
            "   start the peer (all within network.connect_timeout_s of each other).",
            "2. When every peer has finished:  ./collect.sh   (fetches logs and results into run/)",
            "3. Audit:                         cfree audit run",
            "   The plan to compare with:      cfree plan config.toml",
            "",
        ]
    )


def write_deployment(dep: Deployment, out: str | os.PathLike) -> None:
    """Write a planned deployment into ``out`` (which must be absent or empty).

    Everything is written into a temporary directory next to ``out`` and checked (the config
    loads as the hosts will load it) before it is renamed to ``out``: an error leaves nothing.
    """
    from coordinator_free import config as config_mod
    from coordinator_free import roster as roster_mod

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise LanError(f"output directory {out} already exists and is not empty")
    for src in dep.extra_files.values():
        if not src.is_file():
            raise LanError(f"{src} (named by the config) is not a file")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        roster_mod.save_roster(rundir.roster_path(tmp), dep.roster)
        (rundir.config_path(tmp)).write_text(dep.config_text)
        for name, src in dep.extra_files.items():
            shutil.copyfile(src, tmp / name)
        _write_exec(tmp / "collect.sh", dep.collect_sh)
        (tmp / "README.txt").write_text(dep.readme)
        for node in dep.nodes:
            d = tmp / "hosts" / f"node-{node.id}"
            d.mkdir(parents=True)
            for name in (rundir.ROSTER, rundir.CONFIG, *dep.extra_files):
                shutil.copyfile(tmp / name, d / name)
            for name, text in node.files.items():
                if name.endswith(".sh"):
                    _write_exec(d / name, text)
                else:
                    (d / name).write_text(text)
            if node.id in dep.private_keys:
                roster_mod.save_private_key(d / KEY_FILE, dep.private_keys[node.id])
        # The written config must load as the hosts will load it (paths relative to it).
        try:
            config_mod.load(rundir.config_path(tmp))
        except config_mod.ConfigError as exc:
            raise LanError(f"the config written for the hosts does not load: {exc}") from None
        os.chmod(tmp, 0o755)
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_exec(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


# --------------------------------------------------------------------------------------------
# cfree keypair


def make_keypair(out_dir: str | os.PathLike) -> tuple[bytes, bool]:
    """``out_dir/node.key`` (new, mode 0600) or the key already there; returns its public key
    and whether it was made now. An existing key is never replaced."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    from coordinator_free import roster as roster_mod

    path = Path(out_dir) / KEY_FILE
    if path.exists() or path.is_symlink():
        return roster_mod.public_bytes(roster_mod.load_private_key(path)), False
    key = X25519PrivateKey.generate()
    try:
        roster_mod.save_private_key(path, key)
    except OSError as exc:
        raise LanError(f"cannot write key file {path}: {exc.strerror or exc}") from None
    return roster_mod.public_bytes(key), True


def _atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    rundir.write_text(path, text, mode=mode)


# --------------------------------------------------------------------------------------------
# Command line


def add_parsers(sub) -> None:
    """Add ``keypair`` and ``roster`` to the ``cfree`` subcommands."""
    p = sub.add_parser(
        "keypair",
        help="on a LAN host: make this host's private key and print its public line",
        description="Make this host's X25519 private key in DIR/node.key (PEM, mode 0600; an "
        "existing key is kept, never replaced) and write its public half to DIR/node.pub as "
        "the line of hosts.txt that describes this host: 'HOST:PORT PUBLIC_KEY' (just the key "
        "without --address). The line is printed too. Only that line leaves the host: send it "
        "to whoever runs `cfree roster`. See docs/deploy.md.",
        formatter_class=HelpFormatter,
        epilog="examples:\n"
        "  cfree keypair --out /tmp/host-0 --address 192.0.2.10:7000 > /tmp/hosts.txt\n"
        "  cfree keypair --out /tmp/host-1 --address 192.0.2.11:7000 >> /tmp/hosts.txt\n"
        "  cfree keypair --out /tmp/host-2 --address 192.0.2.12:7000 >> /tmp/hosts.txt",
    )
    p.add_argument(
        "--out",
        required=True,
        type=Path,
        metavar="DIR",
        help="directory for node.key and node.pub (created with mode 0700 if missing)",
    )
    p.add_argument(
        "--address",
        metavar="HOST[:PORT]",
        help="the address this host's peer will listen on, as other hosts reach it (an IPv6 "
        "address in brackets: [fd00::11]:7000)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port when --address has none (default {DEFAULT_PORT})",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")

    p = sub.add_parser(
        "roster",
        help="for LAN machines: roster, config and per-host start commands from hosts.txt",
        description="Assign node ids to the hosts of HOSTS (one 'HOST[:PORT] PUBLIC_KEY' per "
        "line, ids in line order; the public keys are the lines `cfree keypair` prints on each "
        "host) and write into OUT: roster.json (the public roster, a fresh run id), config.toml "
        "(the resolved config), README.txt, collect.sh (fetches every node's view log and "
        "result into OUT/run for `cfree audit`) and, per host, hosts/node-<id>/ with the files "
        "to copy to it: start.sh (the exact `cfree peer` command), cfree-peer-<id>.service (a "
        "systemd unit) and a README.txt naming the port to open to which neighbours. Private "
        "keys never pass through here, unless --generate-keys. See docs/deploy.md.",
        formatter_class=HelpFormatter,
        epilog="examples (hosts.txt: the public lines of `cfree keypair`, one per host):\n"
        "  cfree keypair --out /tmp/h0 --address 192.0.2.10:7000 > /tmp/hosts.txt\n"
        "  cfree keypair --out /tmp/h1 --address 192.0.2.11:7000 >> /tmp/hosts.txt\n"
        "  cfree keypair --out /tmp/h2 --address 192.0.2.12:7000 >> /tmp/hosts.txt\n"
        "  cfree roster --hosts /tmp/hosts.txt --set graph.nodes=3 --out /tmp/lan/ \\\n"
        "      --cfree-cmd /opt/cfree/venv/bin/cfree --user cfree",
    )
    p.add_argument(
        "--hosts", required=True, type=Path, metavar="HOSTS", help="the hosts file (hosts.txt)"
    )
    p.add_argument(
        "--config",
        help="experiment config (TOML); without it the built-in default (Muffliato on a ring)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config key, e.g. --set graph.nodes=3 (repeatable)",
    )
    p.add_argument("--out", required=True, type=Path, help="output directory (absent or empty)")
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port for hosts written without one (default {DEFAULT_PORT})",
    )
    p.add_argument(
        "--remote-dir",
        default=DEFAULT_REMOTE_DIR,
        metavar="PATH",
        help="run directory on each host: config.toml, roster.json, start.sh, logs/ and "
        f"results/ live there (default {DEFAULT_REMOTE_DIR}; {{id}} is replaced by the node id)",
    )
    p.add_argument(
        "--key-path",
        default=DEFAULT_KEY_PATH,
        metavar="PATH",
        help=f"private key on each host (default {DEFAULT_KEY_PATH}, where `cfree keypair "
        "--out /etc/cfree` puts it; {id} is replaced by the node id)",
    )
    p.add_argument(
        "--user",
        default=DEFAULT_USER,
        help=f"account that runs the peers and owns their keys and logs (systemd User=; "
        f"default {DEFAULT_USER})",
    )
    p.add_argument(
        "--cfree-cmd",
        default=DEFAULT_CFREE_CMD,
        metavar="CMD",
        help="how the hosts invoke cfree, e.g. /opt/cfree/venv/bin/cfree or "
        "'/usr/bin/python3 -m coordinator_free' (default: cfree, found on PATH)",
    )
    p.add_argument("--name", help="run name recorded in the roster (default: run.name)")
    p.add_argument(
        "--generate-keys",
        action="store_true",
        help="TEST ONLY, when one person owns every machine: make every private key here, in "
        "hosts/node-<id>/node.key, instead of reading public keys from HOSTS",
    )
    p.add_argument("--json", action="store_true", help="print a summary as JSON")


def _fail(command: str, exc: Exception) -> int:
    print(f"cfree {command}: error: {exc}", file=sys.stderr)
    return 2


def _errors():
    from coordinator_free.config import ConfigError
    from coordinator_free.graphs import GraphError
    from coordinator_free.roster import RosterError

    return (LanError, ConfigError, GraphError, RosterError)


def cmd_keypair(args) -> int:
    try:
        address = None
        if args.address is not None:
            if not 1 <= args.port <= 65535:
                raise LanError(f"--port {args.port} is not in 1..65535")
            host, port = parse_address(args.address.strip(), args.port)
            address = format_address(host, port)
        public, made = make_keypair(args.out)
    except _errors() as exc:
        return _fail("keypair", exc)
    line = public.hex() if address is None else f"{address} {public.hex()}"
    pub_path = Path(args.out) / PUB_FILE
    try:
        _atomic_write(pub_path, line + "\n")
    except OSError as exc:
        return _fail("keypair", LanError(f"cannot write {pub_path}: {exc.strerror or exc}"))
    key_path = Path(args.out) / KEY_FILE
    if args.json:
        print(
            json.dumps(
                {
                    "key": str(key_path),
                    "public": str(pub_path),
                    "public_key": public.hex(),
                    "address": address,
                    "line": line,
                    "new": made,
                }
            )
        )
        return 0
    if made:
        print(
            f"wrote the private key {key_path} (mode 0600; it never leaves this host)",
            file=sys.stderr,
        )
    else:
        print(f"{key_path} already exists: kept it (it is never replaced)", file=sys.stderr)
    print(
        f"public line (also in {pub_path}); send it to whoever runs `cfree roster`:",
        file=sys.stderr,
    )
    print(line)
    return 0


def cmd_roster(args) -> int:
    from coordinator_free import config as config_mod

    try:
        if not 1 <= args.port <= 65535:
            raise LanError(f"--port {args.port} is not in 1..65535")
        hosts = read_hosts(args.hosts, default_port=args.port)
        cfg = config_mod.load(args.config, args.set, getattr(args, "fault", []))
        dep = plan_deployment(
            hosts,
            cfg,
            hosts_source=str(args.hosts),
            generate_keys=args.generate_keys,
            remote_dir=args.remote_dir,
            key_path=args.key_path,
            user=args.user,
            cfree_cmd=args.cfree_cmd,
            name=args.name,
        )
        write_deployment(dep, args.out)
    except _errors() as exc:
        return _fail("roster", exc)
    except OSError as exc:
        return _fail("roster", LanError(f"cannot write {args.out}: {exc}"))
    out = Path(args.out)
    summary = {
        "out": str(out),
        "roster": str(rundir.roster_path(out)),
        "config": str(rundir.config_path(out)),
        "collect": str(out / "collect.sh"),
        "run_id": dep.roster.run_id,
        "name": dep.roster.name,
        "generated_keys": bool(dep.private_keys),
        "nodes": [
            {
                "id": n.id,
                "host": n.host,
                "port": n.port,
                "neighbours": list(n.neighbours),
                "dir": str(out / "hosts" / f"node-{n.id}"),
                "remote_dir": n.remote_dir,
                "key_path": n.key_path,
            }
            for n in dep.nodes
        ],
    }
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(dep.readme, end="")
    print(
        f"wrote {out}/ (roster.json, config.toml, collect.sh, hosts/node-0..{len(dep.nodes) - 1}/)"
    )
    if dep.private_keys:
        print(
            "--generate-keys: every private key is in hosts/node-<id>/node.key; each must reach "
            "its own host only"
        )
    return 0


COMMANDS = {"keypair": cmd_keypair, "roster": cmd_roster}
