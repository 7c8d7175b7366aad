"""Network-namespace lab behind ``cfree lab``: N isolated hosts on one virtual switch, so that
peers talk across a real network stack instead of loopback.

A lab named NAME is a set of Linux network namespaces (creating them needs root)::

    NAME-sw      the switch: a bridge br0, and one port veth<i> per host
    NAME-h<i>    host i: lo, and eth0 with the (i+1)-th address of the lab's subnet

Host i's ``eth0`` and the switch's ``veth<i>`` are the two ends of one veth pair, so every
packet from one host to another leaves a network stack, crosses the bridge and enters another
one: real IP and TCP (handshakes, retransmissions, congestion control) over interfaces whose
counters can be read. The veth pairs are created directly inside the lab's namespaces: nothing
is created or changed in the namespace the command runs in, so the machine's own network is
never touched.

A link cut (:meth:`Lab.cut`) sets the switch-side port of a host down, like a pulled cable:
the host's ``eth0`` loses its carrier and every packet to or from it is dropped. TCP connections
are not reset, they just stop delivering. :meth:`Lab.heal` sets the port up again.

What a lab created is recorded in ``/run/cfree-lab/NAME.json`` (``/run`` is a tmpfs: a reboot
removes both the record and the namespaces). :func:`down` removes the namespaces that follow the
lab's naming pattern (``NAME-sw``, ``NAME-h<i>``), so it also cleans up after a lab whose record
is missing or damaged, and stops any process still running in them.

Python use (tests)::

    with netns.lab(8, name="mylab") as lab:
        run = asyncio.run(netns.launch_peers_in_lab(cfg, out, lab, on_event=...))
        lab.cut(3); lab.heal(3); lab.exec(0, ["ss", "-tn"], capture_output=True)
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from coordinator_free import roster as roster_mod
from coordinator_free import rundir
from coordinator_free.errors import LaunchError

if TYPE_CHECKING:  # the launcher and the families load on first use: `cfree lab --help` stays light
    from coordinator_free.cluster.local import LocalRun
    from coordinator_free.config import Config

DEFAULT_NAME = "cfree"
DEFAULT_SUBNET = "10.213.0.0/16"
DEFAULT_PORT = 7000
STATE_DIR = Path("/run/cfree-lab")
STATE_FORMAT = "cfree-lab"
STATE_VERSION = 1
BRIDGE = "br0"
HOST_IF = "eth0"
MAX_HOSTS = 1024  # ports one Linux bridge can have
MAX_NAME_LEN = 32
IFNAME_MAX = 15  # IFNAMSIZ - 1
IP_TIMEOUT_S = 60.0

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


class LabError(LaunchError):
    """A lab cannot be created, used or removed; the message says why and what to do."""


# ---------------------------------------------------------------------------- names, addresses


def check_name(name: object) -> str:
    if not isinstance(name, str) or len(name) > MAX_NAME_LEN or not _NAME.fullmatch(name):
        raise LabError(
            f"lab name {name!r}: use 1 to {MAX_NAME_LEN} letters, digits, '-' or '_', starting "
            "with a letter or a digit"
        )
    return name


def parse_subnet(subnet: str) -> ipaddress.IPv4Network:
    """The lab's IPv4 subnet in CIDR form (e.g. 10.213.0.0/16), with room for at least 2 hosts."""
    try:
        net = ipaddress.ip_network(subnet, strict=True)
    except ValueError:
        try:
            loose = ipaddress.ip_network(subnet, strict=False)
        except ValueError:
            raise LabError(
                f"subnet {subnet!r} is not a network in CIDR form, e.g. {DEFAULT_SUBNET}"
            ) from None
        raise LabError(f"subnet {subnet!r} has host bits set: did you mean {loose}?") from None
    if net.version != 4:
        raise LabError(f"subnet {subnet}: the lab uses IPv4 only, e.g. {DEFAULT_SUBNET}")
    if net.prefixlen > 30:
        raise LabError(
            f"subnet {subnet}: a /{net.prefixlen} has no room for two hosts; use /30 or larger"
        )
    return net


def host_addresses(subnet: str, nodes: int) -> list[str]:
    """Addresses of hosts 0..nodes-1 with the subnet's prefix length: host i has the (i+1)-th
    address (the network address itself is never used, nor the broadcast address)."""
    net = parse_subnet(subnet)
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise LabError(f"a lab needs at least 1 host, got {nodes!r}")
    if nodes > MAX_HOSTS:
        raise LabError(
            f"{nodes} hosts asked: a lab has at most {MAX_HOSTS} (the ports of one Linux bridge)"
        )
    room = net.num_addresses - 2
    if nodes > room:
        raise LabError(
            f"subnet {net} has room for {room} hosts, {nodes} asked: use a larger subnet "
            f"(e.g. {DEFAULT_SUBNET})"
        )
    return [f"{net.network_address + i + 1}/{net.prefixlen}" for i in range(nodes)]


def switch_namespace(name: str) -> str:
    return f"{name}-sw"


def host_namespace(name: str, node: int) -> str:
    return f"{name}-h{node}"


def switch_port(node: int) -> str:
    """The switch-side end of host ``node``'s veth pair (inside the switch namespace)."""
    return f"veth{node}"


def namespace_pattern(name: str) -> re.Pattern[str]:
    """Every namespace a lab named ``name`` can create: ``name-sw`` and ``name-h<i>``
    (not those of a lab whose name merely starts with ``name-``)."""
    return re.compile(re.escape(name) + r"-(?:sw|h(?:0|[1-9][0-9]*))")


# ------------------------------------------------------------------------------------- the lab


@dataclass(frozen=True)
class Lab:
    """A lab's layout: its name, subnet and the address of every host (see the module doc)."""

    name: str
    subnet: str
    addresses: tuple[str, ...]  # host i's address with prefix length, e.g. "10.213.0.1/16"
    created: float = 0.0  # time.time() when it was brought up

    @classmethod
    def plan(cls, nodes: int, name: str = DEFAULT_NAME, subnet: str = DEFAULT_SUBNET) -> Lab:
        """The layout of a lab of ``nodes`` hosts (checks the name, subnet and size; creates
        nothing)."""
        check_name(name)
        return cls(name=name, subnet=str(parse_subnet(subnet)),
                   addresses=tuple(host_addresses(subnet, nodes)))  # fmt: skip

    @property
    def n(self) -> int:
        return len(self.addresses)

    @property
    def switch(self) -> str:
        """The switch namespace."""
        return switch_namespace(self.name)

    def _node(self, node: int) -> int:
        if not isinstance(node, int) or isinstance(node, bool) or not 0 <= node < self.n:
            raise LabError(f"lab {self.name!r} has hosts 0..{self.n - 1}, not {node!r}")
        return node

    def ns(self, node: int) -> str:
        """The namespace of host ``node``."""
        return host_namespace(self.name, self._node(node))

    def ip(self, node: int) -> str:
        """The address of host ``node`` (without prefix length)."""
        return self.addresses[self._node(node)].split("/")[0]

    def port_name(self, node: int) -> str:
        """The switch-side interface of host ``node`` (what a cut sets down)."""
        return switch_port(self._node(node))

    def namespaces(self) -> list[str]:
        """Every namespace of the lab: the hosts, then the switch."""
        return [self.ns(i) for i in range(self.n)] + [self.switch]

    def interfaces(self) -> list[str]:
        """Every interface name the lab creates (all within the kernel's 15-character limit)."""
        return ["lo", BRIDGE, HOST_IF] + [switch_port(i) for i in range(self.n)]

    # ---- commands inside the lab

    def command(self, node: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside host ``node`` (``ip netns exec``; it execs, so a process started
        from this command line has the pid of ``argv`` itself)."""
        return ["ip", "netns", "exec", self.ns(node), *argv]

    def exec(self, node: int, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        """``subprocess.run(argv, **kwargs)`` inside host ``node``."""
        return subprocess.run(self.command(node, argv), **kwargs)

    def popen(self, node: int, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """``subprocess.Popen(argv, **kwargs)`` inside host ``node``."""
        return subprocess.Popen(self.command(node, argv), **kwargs)

    # ---- links

    def cut(self, node: int) -> None:
        """Cut host ``node`` off the switch: its switch port goes down, its packets are lost."""
        ip("link", "set", self.port_name(node), "down", ns=self.switch)

    def heal(self, node: int) -> None:
        """Reconnect host ``node`` to the switch."""
        ip("link", "set", self.port_name(node), "up", ns=self.switch)

    def links(self) -> dict[int, bool]:
        """For every host whose switch port exists: True if its link is up, False if cut."""
        ports = {switch_port(i): i for i in range(self.n)}
        out = {}
        for dev in json.loads(ip("-j", "link", "show", ns=self.switch) or "[]"):
            if dev.get("ifname") in ports:
                out[ports[dev["ifname"]]] = "UP" in dev.get("flags", [])
        return out

    def is_cut(self, node: int) -> bool:
        self._node(node)
        return not self.links().get(node, False)

    def link_stats(self, node: int) -> dict[str, int]:
        """Counters of host ``node``'s ``eth0``: bytes and packets received and sent."""
        (dev,) = json.loads(ip("-j", "-s", "link", "show", HOST_IF, ns=self.ns(node)))
        s = dev["stats64"]
        return {"rx_bytes": s["rx"]["bytes"], "rx_packets": s["rx"]["packets"],
                "tx_bytes": s["tx"]["bytes"], "tx_packets": s["tx"]["packets"]}  # fmt: skip

    def missing(self) -> list[str]:
        """The lab's namespaces that do not exist (a lab is usable only when this is empty)."""
        present = set(existing_namespaces())
        return [ns for ns in self.namespaces() if ns not in present]

    # ---- record

    def to_dict(self) -> dict:
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "name": self.name,
            "subnet": self.subnet,
            "created": self.created,
            "hosts": [
                {
                    "node": i,
                    "namespace": self.ns(i),
                    "address": self.ip(i),
                    "interface": HOST_IF,
                    "switch_port": switch_port(i),
                }
                for i in range(self.n)
            ],  # fmt: skip
            "switch": {"namespace": self.switch, "bridge": BRIDGE},
        }

    @classmethod
    def from_dict(cls, d: object, source: str) -> Lab:
        """The lab a record describes; the record must match the layout its name, subnet and
        size imply (so it can never name a namespace outside the lab)."""
        try:
            if d.get("format") != STATE_FORMAT or d.get("version") != STATE_VERSION:
                raise ValueError(f"not a {STATE_FORMAT} record of version {STATE_VERSION}")
            lab = cls.plan(len(d["hosts"]), d["name"], d["subnet"])
            lab = cls(lab.name, lab.subnet, lab.addresses, float(d.get("created", 0.0)))
            if d != lab.to_dict():
                raise ValueError("it does not match the layout its name, subnet and size imply")
        except (AttributeError, KeyError, TypeError, ValueError, LabError) as exc:
            raise LabError(f"lab record {source} is damaged: {exc}") from None
        return lab


# ------------------------------------------------------------------------------- ip commands


def check_environment() -> None:
    """Network namespaces need root and iproute2's ``ip``; say so plainly if either is missing."""
    if shutil.which("ip") is None:
        raise LabError(
            "the lab needs the `ip` command (iproute2) to create network namespaces, and it is "
            "not installed (Debian/Ubuntu: apt-get install iproute2)"
        )
    if os.geteuid() != 0:
        raise LabError(
            "creating and using network namespaces needs root: run the lab as root, "
            "e.g. `sudo cfree lab up --nodes 8`"
        )


def run_command(argv: Sequence[str], *, stdin: str | None = None) -> str:
    """Run a command, return its stdout; any failure is a LabError naming the command and
    quoting its error output."""
    shown = shlex.join(argv)
    try:
        proc = subprocess.run(
            list(argv),
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=IP_TIMEOUT_S,
        )
    except FileNotFoundError:
        raise LabError(f"`{shown}`: {argv[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise LabError(f"`{shown}` did not finish within {IP_TIMEOUT_S:.0f}s") from None
    if proc.returncode != 0:
        err = " ".join(proc.stderr.split()) or "(no error message)"
        raise LabError(f"`{shown}` failed (exit {proc.returncode}): {err}")
    return proc.stdout


def ip(*args: str, ns: str | None = None) -> str:
    """``ip [-n NS] ARGS...``: stdout, or a LabError naming the command and its error output."""
    return run_command(["ip", *(("-n", ns) if ns else ()), *args])


def existing_namespaces() -> list[str]:
    """The names ``ip netns list`` shows."""
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def leftovers(name: str) -> list[str]:
    """Existing namespaces that follow the naming pattern of lab ``name``."""
    pat = namespace_pattern(check_name(name))
    return [ns for ns in existing_namespaces() if pat.fullmatch(ns)]


# ----------------------------------------------------------------------------- lab records


def state_path(name: str) -> Path:
    return STATE_DIR / f"{check_name(name)}.json"


def load(name: str = DEFAULT_NAME) -> Lab | None:
    """The lab named ``name`` from its record, or None if there is no record."""
    path = state_path(name)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LabError(f"cannot read lab record {path}: {exc.strerror}") from None
    try:
        d = json.loads(text)
    except ValueError as exc:
        raise LabError(f"lab record {path} is damaged: {exc}") from None
    lab = Lab.from_dict(d, str(path))
    if lab.name != name:
        raise LabError(f"lab record {path} is damaged: it names lab {lab.name!r}")
    return lab


def require(name: str = DEFAULT_NAME) -> Lab:
    """The lab named ``name``; a LabError saying how to create it if there is none."""
    lab = load(name)
    if lab is None:
        hint = "" if name == DEFAULT_NAME else f" --name {name}"
        raise LabError(f"no lab named {name!r}: create it with `cfree lab up --nodes N{hint}`")
    return lab


def lab_names() -> list[str]:
    """Names of the labs that have a record."""
    if not STATE_DIR.is_dir():
        return []
    return sorted(p.stem for p in STATE_DIR.glob("*.json") if _NAME.fullmatch(p.stem))


# -------------------------------------------------------------------------------- up and down


def up(nodes: int, name: str = DEFAULT_NAME, subnet: str = DEFAULT_SUBNET) -> Lab:
    """Create the lab (see the module doc); refuses if a lab of that name exists. On any
    failure, or Ctrl-C, whatever was already created is removed again."""
    lab = Lab.plan(nodes, name, subnet)
    lab = Lab(lab.name, lab.subnet, lab.addresses, time.time())
    check_environment()
    STATE_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    path = state_path(name)
    hint = "" if name == DEFAULT_NAME else f" --name {name}"
    try:
        # O_EXCL: of two concurrent `up`s of the same name, exactly one gets the record.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise LabError(
            f"lab {name!r} already exists (record {path}): remove it with "
            f"`cfree lab down{hint}`, or choose another --name"
        ) from None
    created: list[str] = []
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(lab.to_dict(), indent=1) + "\n")
        stray = leftovers(name)
        if stray:
            raise LabError(
                f"namespace(s) {', '.join(stray)} already exist but no lab record does (left "
                f"by an interrupted lab?): `cfree lab down{hint}` removes them"
            )
        _create(lab, created)
    except BaseException as exc:
        _, errors = _delete_namespaces(reversed(created))
        if errors:
            # Some namespaces could not be removed: keep the record, so `down` finds the lab.
            exc.add_note(
                f"could not remove every namespace of lab {name!r} (its record {path} is kept; "
                f"`cfree lab down{hint}` removes what remains):\n" + "\n".join(errors)
            )
        else:
            path.unlink(missing_ok=True)
        raise
    return lab


def _create(lab: Lab, created: list[str]) -> None:
    sw = lab.switch
    ip("netns", "add", sw)
    created.append(sw)
    ip("link", "set", "lo", "up", ns=sw)
    ip("link", "add", BRIDGE, "up", "type", "bridge", ns=sw)
    for i in range(lab.n):
        h = lab.ns(i)
        ip("netns", "add", h)
        created.append(h)
        # Both ends are created where they live: the switch port in the switch, eth0 in the host.
        ip("link", "add", switch_port(i), "up", "master", BRIDGE,
           "type", "veth", "peer", "name", HOST_IF, "netns", h, ns=sw)  # fmt: skip
        ip("addr", "add", lab.addresses[i], "dev", HOST_IF, ns=h)
        ip("link", "set", HOST_IF, "up", ns=h)
        ip("link", "set", "lo", "up", ns=h)


def _stop_processes(ns: str) -> list[int]:
    """SIGKILL every process still running in namespace ``ns``; their pids."""
    pids = [int(p) for p in ip("netns", "pids", ns).split() if p.isdigit()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def _delete_namespaces(names) -> tuple[list[int], list[str]]:
    """Stop what runs in each namespace and delete it, in order. A failure does not stop the
    others from being tried; returns the pids stopped and one message per failure."""
    stopped: list[int] = []
    errors: list[str] = []
    for ns in names:
        try:
            stopped += _stop_processes(ns)
        except LabError as exc:
            errors.append(f"{ns}: {exc}")
        try:
            ip("netns", "delete", ns)
        except LabError as exc:
            errors.append(f"{ns}: {exc}")
    return stopped, errors


@dataclass
class Removed:
    """What :func:`down` did."""

    name: str
    namespaces: list[str]  # the namespaces it deleted
    stopped: list[int]  # pids of processes that were still running in them (killed)
    record: bool  # a lab record existed (and was removed)
    note: str | None = None  # why the record was not used (damaged)


def down(name: str = DEFAULT_NAME) -> Removed:
    """Remove lab ``name``: stop what still runs in its namespaces, delete them (hosts first,
    the switch last) and its record. Removing a lab that does not exist does nothing."""
    check_name(name)
    check_environment()
    note = None
    try:
        load(name)  # only to report a damaged record; the naming pattern decides what goes
    except LabError as exc:
        note = f"{exc}; removed the namespaces named like the lab's"
    sw = switch_namespace(name)
    targets = sorted(leftovers(name), key=lambda ns: (ns == sw, len(ns), ns))
    stopped, errors = _delete_namespaces(targets)
    try:
        remaining = leftovers(name)
    except LabError as exc:
        remaining = None  # unknown: keep the record
        errors.append(f"cannot tell which namespaces remain: {exc}")
    if remaining and not errors:
        errors.append(f"namespace(s) {', '.join(remaining)} still exist")
    path = state_path(name)
    record = path.exists()
    if remaining == []:  # the record goes only once none of the lab's namespaces is left
        path.unlink(missing_ok=True)
    if errors:
        hint = "" if name == DEFAULT_NAME else f" --name {name}"
        kept = (
            f"; its record {path} is kept, `cfree lab down{hint}` again removes what remains"
            if record and remaining != []
            else ""
        )
        raise LabError(
            f"lab {name!r} was not entirely removed ({len(errors)} failure(s){kept}):\n"
            + "\n".join(f"  {e}" for e in errors)
        )
    return Removed(name=name, namespaces=targets, stopped=stopped, record=record, note=note)


def cut(node: int, name: str = DEFAULT_NAME) -> Lab:
    """Cut host ``node`` of lab ``name`` off its switch (see :meth:`Lab.cut`)."""
    lab = require(name)
    lab.cut(node)
    return lab


def heal(node: int, name: str = DEFAULT_NAME) -> Lab:
    """Reconnect host ``node`` of lab ``name`` (see :meth:`Lab.heal`)."""
    lab = require(name)
    lab.heal(node)
    return lab


def status(name: str) -> dict | None:
    """A lab's state for ``cfree lab status``: its layout, which namespaces exist, every host's
    link (up or cut) and how many processes run in it; None if there is neither a record nor a
    namespace of that name. A lab whose record is damaged is reported with its namespaces."""
    check_environment()
    try:
        lab = load(name)
    except LabError as exc:
        return {"name": name, "record": False, "damaged": str(exc), "leftovers": leftovers(name)}
    if lab is None:
        stray = leftovers(name)
        return {"name": name, "record": False, "leftovers": stray} if stray else None
    missing = set(lab.missing())
    links = lab.links() if lab.switch not in missing else {}
    hosts = []
    for i in range(lab.n):
        ns = lab.ns(i)
        present = ns not in missing
        pids = ip("netns", "pids", ns).split() if present else []
        link = "missing" if not present or i not in links else ("up" if links[i] else "cut")
        hosts.append({"node": i, "namespace": ns, "address": lab.ip(i), "link": link,
                      "processes": len(pids)})  # fmt: skip
    return {
        "name": lab.name,
        "record": True,
        "subnet": lab.subnet,
        "created": lab.created,
        "switch": lab.switch,
        "missing": sorted(missing),
        "hosts": hosts,
    }


@contextlib.contextmanager
def lab(nodes: int, name: str = DEFAULT_NAME, subnet: str = DEFAULT_SUBNET) -> Iterator[Lab]:
    """``with lab(8, name=...) as lb:`` a lab that exists for the body of the block and is
    removed when it ends, however it ends."""
    the_lab = up(nodes, name, subnet)
    try:
        yield the_lab
    finally:
        down(name)


# --------------------------------------------------------------------------------- peers


async def launch_peers_in_lab(
    cfg: Config,
    out_dir: Path,
    lab: Lab,
    *,
    show_progress: bool = True,
    timeout_s: float | None = None,
    on_event: Callable[[int, dict, int], None] | None = None,
    port: int | None = None,
) -> LocalRun:
    """What :func:`~coordinator_free.cluster.local.launch_peers` does, with node i's peer
    inside host i of ``lab``, listening on ``lab.ip(i):port``.

    ``out_dir`` must be prepared (``local.prepare_run_dir``); keys and a roster listing the lab
    addresses are written there. ``port``: default ``network.base_port`` of the config if set,
    else 7000 (every host has its own address, so all nodes use the same port).
    ``on_event(node, event, pid)`` is called for every progress event a peer reports; ``pid`` is
    the peer's own process.
    """
    from coordinator_free.cluster.local import supervise_peers
    from coordinator_free.families import family_of, make_plan

    plan = make_plan(cfg)
    n = plan.n
    if not family_of(cfg.protocol.name).has_peers(cfg):
        raise LabError(
            f"{cfg.protocol.name} is the trusted-curator baseline: one process, no peers to "
            "place on lab hosts (use cfree run)"
        )
    if n > lab.n:
        raise LabError(
            f"the config has {n} nodes but lab {lab.name!r} has {lab.n} hosts: bring up a lab "
            f"with at least {n} (cfree lab down, then cfree lab up --nodes {n})"
        )
    missing = lab.missing()
    if missing:
        raise LabError(
            f"lab {lab.name!r} is incomplete, namespace(s) {', '.join(missing)} do not exist: "
            "remove it with `cfree lab down` and bring it up again"
        )
    port = port or cfg.network.base_port or DEFAULT_PORT
    if not 0 < port < 65536:
        raise LabError(f"port {port} is not in 1..65535")
    hosts = [(lab.ip(i), port) for i in range(n)]
    ros = roster_mod.generate_keys(n, rundir.keys_dir(out_dir), hosts=hosts, name=cfg.run.name)
    roster_mod.save_roster(rundir.roster_path(out_dir), ros)
    return await supervise_peers(
        cfg,
        plan,
        out_dir,
        lambda i, argv: (lab.command(i, argv), ()),
        show_progress=show_progress,
        timeout_s=timeout_s,
        on_event=on_event,
    )
