"""Local launcher behind ``cfree run``: a cluster of real peer processes on loopback.

The launcher binds every peer's listening socket itself (port 0: the OS picks a free port) and
hands each socket to its peer process as an inherited file descriptor. So the roster holds real,
already-reserved addresses before any peer starts, and concurrent runs can never clash on ports.

Layout of a run directory::

    config.toml        the exact configuration of the run (after --set overrides)
    roster.json        public roster: node id, address, public key
    keys/node-<i>.key  private keys (mode 0600)
    logs/node-<i>.vlog view logs;  logs/node-<i>.stderr  each peer's diagnostics
    results/node-<i>.json  each peer's final estimate and traffic counters
    results/node-<i>.models.npy  (learning) each peer's model after every round
    metrics.jsonl      (learning) test loss/accuracy of the node-average model, spread, per round
    summary.json       what ``cfree run`` printed, for machines
    audit.json         the auditor's per-pair losses (same shape as ``cfree audit --json``)
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from coordinator_free import roster as roster_mod
from coordinator_free import rundir, seeds
from coordinator_free.cluster.forkserver import ForkServer
from coordinator_free.config import Config
from coordinator_free.errors import CfreeError, LaunchError  # noqa: F401  (re-exported)
from coordinator_free.families import family_of, make_plan
from coordinator_free.families.averaging import protocol as mf
from coordinator_free.families.learning.protocol import models_path
from coordinator_free.verdict import read_result

#: How ``cfree run`` starts its peers: forked from a fork server (default), or as fresh
#: interpreters.
SPAWN_MODES = ("fork", "exec")


@dataclass
class PeerOutcome:
    node: int
    returncode: int | None
    error: str | None = None
    steps_done: int = 0


@dataclass
class LocalRun:
    out_dir: Path
    outcomes: list[PeerOutcome] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def failed(self) -> list[PeerOutcome]:
        return [o for o in self.outcomes if o.returncode != 0]


def default_run_dir(cfg: Config, base: Path | None = None) -> Path:
    base = base or Path.cwd() / "runs"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return base / f"{cfg.run.name}-{stamp}-{secrets.token_hex(2)}"


def prepare_run_dir(cfg: Config, out_dir: Path) -> None:
    if out_dir.exists() and any(out_dir.iterdir()):
        raise LaunchError(f"run directory {out_dir} already exists and is not empty")
    out_dir.mkdir(parents=True, exist_ok=True)
    (rundir.config_path(out_dir)).write_text(cfg.to_toml())


def check_loopback(host: str) -> None:
    """The local launcher only ever binds loopback addresses (LAN hosts run `cfree peer`)."""
    import ipaddress

    if host == "localhost":
        return
    try:
        ok = ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise LaunchError(
            f"network.host {host!r} is not a loopback address: `cfree run` starts every peer on "
            "this machine; to run across machines use `cfree keygen --hosts` and `cfree peer`"
        )


#: What one peer process costs, in MiB, with a margin over what was measured (the default
#: hypercube, 20 steps; bench/bench_run_memory.py): PSS (its share of the pages it shares with
#: others counted pro rata) plus the kernel's memory for it (page tables, kernel stack,
#: sockets: about 1 MiB, in no PSS). A forked peer: 9.5 MiB of PSS at 1024 peers, 9.4 at 256,
#: 10 to 11.5 at 64 (tests/test_memory.py measures it again), counted as 13; the plan is
#: shared with the fork server (counted once, :class:`MemoryEstimate`). A fresh interpreter
#: (``--spawn exec``; ``cfree lab run`` starts every peer so): 66 MiB each for 16, counted as
#: 72, plus its own copy of the plan.
PEER_BASE_MIB = {"fork": 13.0, "exec": 72.0}
#: The share of the machine's available memory a run may plan to use: the launcher, the
#: auditor afterwards and everything else keep the rest.
MEMORY_SHARE = 0.8


def plan_nbytes(plan) -> int:
    """The bytes of the numpy arrays a plan holds (each counted once). A Muffliato ring of n
    nodes holds an n x n float64 matrix: 31 MiB at n = 2000."""
    seen: set[int] = set()
    total = 0
    stack = [plan]
    while stack:
        x = stack.pop()
        if id(x) in seen or x is None or isinstance(x, (str, bytes, int, float, bool)):
            continue
        seen.add(id(x))
        if isinstance(x, np.ndarray):
            total += x.nbytes if x.base is None or id(x.base) not in seen else 0
            if x.base is not None:
                seen.add(id(x.base))
        elif hasattr(x, "data") and hasattr(x, "indices") and hasattr(x, "indptr"):
            stack += [x.data, x.indices, x.indptr]  # a scipy sparse matrix
        elif isinstance(x, dict):
            stack += list(x.values())
        elif isinstance(x, (list, tuple, set, frozenset)):
            stack += list(x)
        elif hasattr(x, "__dict__"):
            stack += list(vars(x).values())
        elif hasattr(x, "__slots__"):
            stack += [getattr(x, a, None) for a in x.__slots__]
    return total


def available_memory() -> int | None:
    """``MemAvailable`` of /proc/meminfo in bytes (None where there is no such file)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class MemoryEstimate:
    """What a run's peers take: ``base_bytes`` each (:data:`PEER_BASE_MIB`) and the plan,
    ``plan_bytes``: once when the peers are forked (the fork server makes it and every peer
    shares its pages), once per peer when each is a fresh interpreter that makes its own."""

    peers: int
    spawn: str
    base_bytes: int
    plan_bytes: int
    available_bytes: int | None

    @property
    def shared_plan(self) -> bool:
        return self.spawn == "fork"

    @property
    def per_peer_bytes(self) -> int:
        return self.base_bytes + (0 if self.shared_plan else self.plan_bytes)

    @property
    def total_bytes(self) -> int:
        return self.peers * self.per_peer_bytes + (self.plan_bytes if self.shared_plan else 0)

    @property
    def fits(self) -> bool:
        return self.available_bytes is None or (
            self.total_bytes <= MEMORY_SHARE * self.available_bytes
        )


def estimate_memory(plan, spawn: str = "fork", available: int | None = None) -> MemoryEstimate:
    """What the peers of ``plan`` will take, from the measured per-peer figure and the plan's
    own size, against the machine's available memory (``available``: measured when None)."""
    return MemoryEstimate(
        peers=plan.n,
        spawn=spawn,
        base_bytes=int(PEER_BASE_MIB[spawn] * 2**20),
        plan_bytes=plan_nbytes(plan),
        available_bytes=available if available is not None else available_memory(),
    )


def size_keys(cfg: Config, n: int) -> str:
    """The config keys that set the number of nodes, with their values."""
    g = cfg.graph
    if g.kind == "hypercube" and g.dim is not None:
        return f"graph.dim={g.dim} ({n} nodes)"
    if g.rows is not None and g.cols is not None and g.kind in ("torus", "grid"):
        return f"graph.rows={g.rows} x graph.cols={g.cols} ({n} nodes)"
    if g.path:
        return f"graph.path={g.path} ({n} nodes)"
    return f"graph.nodes={n}"


#: The flag of `cfree run` and `cfree lab run` that starts a run the estimate says will not fit.
MEMORY_FLAG = "--no-memory-check"


def check_memory(cfg: Config, plan, *, spawn: str = "fork", allow: bool = False) -> MemoryEstimate:
    """Refuse (LaunchError) a run whose peers will not fit in the machine's available memory,
    before any peer starts, naming the key that sets the size, the estimate and the override
    (``allow``: go ahead anyway)."""
    est = estimate_memory(plan, spawn)
    if est.fits or allow or not family_of(cfg.protocol.name).has_peers(cfg):
        return est
    gib = 2**30
    if est.shared_plan:
        each = (
            f"{est.per_peer_bytes / 2**20:.1f} MiB per forked peer (measured, with a margin), "
            f"and {est.plan_bytes / 2**20:.1f} MiB for the plan they share"
        )
    else:
        each = (
            f"{est.per_peer_bytes / 2**20:.1f} MiB each: {PEER_BASE_MIB[spawn]:g} MiB per peer "
            f"interpreter (measured, with a margin) + {est.plan_bytes / 2**20:.1f} MiB for its "
            "copy of the plan"
        )
    raise LaunchError(
        f"{size_keys(cfg, plan.n)}: {plan.n} peer processes need about "
        f"{est.total_bytes / gib:.1f} GiB ({each}), more than "
        f"{MEMORY_SHARE:.0%} of the {est.available_bytes / gib:.1f} GiB this machine has "
        f"available; nothing was started. Lower the size, or pass {MEMORY_FLAG} to start anyway"
    )


def bind_sockets(host: str, n: int, base_port: int) -> list[socket.socket]:
    check_loopback(host)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    socks = []
    try:
        for i in range(n):
            s = socket.socket(family, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            port = base_port + i if base_port else 0
            try:
                s.bind((host, port))
            except OSError as exc:
                s.close()
                raise LaunchError(
                    f"cannot bind node {i} to {host}:{port}: {exc.strerror}"
                ) from None
            s.listen(128)
            s.set_inheritable(True)
            socks.append(s)
    except BaseException:
        for s in socks:
            s.close()
        raise
    return socks


class ProgressDisplay:
    """One status line on stderr; plain periodic lines when stderr is not a terminal."""

    def __init__(self, n: int, steps: int, enabled: bool, token: bool = False):
        # token: a walk's progress is the furthest step any node has made (a node may never be
        # visited), not the step every node has reached.
        self.n, self.steps, self.enabled, self.token = n, steps, enabled, token
        self.tty = sys.stderr.isatty()
        self.up: set[int] = set()  # processes listening: started, keys loaded, port bound
        self.connected: set[int] = set()
        self.step = [0] * n
        self.finished: set[int] = set()
        self._last_milestone: tuple | None = None
        self._t0 = time.monotonic()
        # When each node last said anything, and the nodes whose process has ended (at their
        # step): the line names whom the run waits for, and since when.
        self.seen = [self._t0] * n
        self.exited: dict[int, int] = {}
        self._drawn = float("-inf")

    #: A node silent this long while the others wait for it is named on the line.
    SILENT_S = 3.0
    #: The line is drawn at most this often as events come (each drawing looks at every node:
    #: with 512 peers, drawing at every event took the launcher 2.5 s of CPU, 1.1 s in all
    #: drawn so); what comes in between shows at the next event, at the redraw every second
    #: (:func:`_redraw`) and at the end.
    DRAW_S = 0.1

    def waiting(self, now: float) -> tuple[list[int], float]:
        """The nodes the run waits for (still running, not finished, at the lowest step; a
        walk: none) that have been silent at least SILENT_S, and since how long."""
        live = [v for v in range(self.n) if v not in self.exited and v not in self.finished]
        if self.token or not live or not self.connected:
            return [], 0.0
        low = min(self.step[v] for v in live)
        slow = [v for v in live if self.step[v] == low and now - self.seen[v] >= self.SILENT_S]
        return slow, (min(now - self.seen[v] for v in slow) if slow else 0.0)

    def gone(self) -> list[int]:
        """The nodes whose process ended before they finished."""
        return sorted(v for v in self.exited if v not in self.finished)

    def waiting_text(self, now: float) -> str:
        slow, silent = self.waiting(now)
        gone = self.gone()
        out = ""
        if slow:
            who = ", ".join(map(str, slow[:5])) + (f" +{len(slow) - 5}" if len(slow) > 5 else "")
            out += f"  waiting for node {who} (silent for {silent:.0f}s)"
        if gone:
            out += "  exited early: " + ", ".join(f"{v} at step {self.exited[v]}" for v in gone)
        return out

    def update(self, ev: dict) -> None:
        node = ev.get("node")
        if not isinstance(node, int) or not 0 <= node < self.n:
            return
        self.seen[node] = time.monotonic()
        kind = ev.get("event")
        if kind == "exited":
            self.exited[node] = self.step[node]
        elif kind == "listening":
            self.up.add(node)
        elif kind == "connected":
            self.up.add(node)
            self.connected.add(node)
        elif kind == "step":
            self.step[node] = int(ev.get("step", 0))
        elif kind == "finished":
            self.finished.add(node)
        self.render()

    def render(self, final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not final and now - self._drawn < self.DRAW_S:
            return
        self._drawn = now
        gone = self.gone()
        live = [self.step[v] for v in range(self.n) if v not in gone] or self.step
        low = max(self.step) if self.token else min(live)
        pct = int(100 * low / max(1, self.steps))
        width = 30
        bar = "#" * (width * pct // 100) + "-" * (width - width * pct // 100)
        # While peers start (interpreter, imports, keys: seconds each on a small machine),
        # how many processes are up; then how many have all their channels.
        starting = f"up {len(self.up)}/{self.n}  " if len(self.connected) < self.n else ""
        line = (
            f"  [{bar}] {'hop' if self.token else 'step'} {low}/{self.steps}  {starting}"
            f"connected {len(self.connected)}/{self.n}  "
            f"finished {len(self.finished)}/{self.n}  {now - self._t0:5.1f}s"
            + self.waiting_text(now)
        )
        if self.tty:
            sys.stderr.write("\r" + line + ("\n" if final else ""))
            sys.stderr.flush()
        else:
            # Not a terminal: one line per milestone (each quarter of the processes up, every
            # quarter of the steps, everyone connected, everyone finished) instead of a redrawn
            # line.
            milestone = (
                4 * len(self.up) // self.n,
                pct // 25,
                len(self.connected) == self.n,
                len(self.finished) == self.n,
                # and whenever whom the run waits for changes, or every 10 s it stays so
                tuple(self.waiting(now)[0]),
                int(self.waiting(now)[1] // 10),
                tuple(gone),
            )
            if final or milestone != self._last_milestone:
                self._last_milestone = milestone
                sys.stderr.write(line + "\n")
                sys.stderr.flush()


async def _redraw(display: ProgressDisplay, every_s: float = 1.0) -> None:
    """Redraw the progress line every second, so a run that waits says whom for and since when
    even while no peer reports anything."""
    while True:
        await asyncio.sleep(every_s)
        display.render()


class StartGate:
    """The start signal of a run's peers: a pipe whose read end every peer gets (``cfree peer
    --start-fd``) and whose write end the launcher closes once every peer has connected to its
    neighbours or has ended, or ``wait_s`` after every peer was listening (or had ended),
    whichever comes first (or when the launcher ends).

    Started one after the other, the peers of a large run come up over a minute or more on a
    small machine (1024 forked peers: 60 s on 2 loaded cores). A peer dials its neighbours as
    soon as it is up (the handshakes spread over the start), but its connect timeout counts,
    and its first step waits, from the signal. Without it, the first peers gave up on the last
    ones (connect timeout), or missed the first value of a neighbour that was connected but
    still waiting for its own neighbours (step deadline)."""

    def __init__(self, n: int):
        self.read_fd, self._write_fd = os.pipe()
        self._listening: set[int] = set(range(n))
        self._connecting: set[int] = set(range(n))
        self._all_listening = asyncio.Event()
        self._all_connected = asyncio.Event()
        self._note(set(), self._listening, self._all_listening)

    @staticmethod
    def _note(nodes: set[int], waiting: set[int], done: asyncio.Event) -> None:
        waiting -= nodes
        if not waiting:
            done.set()

    def event(self, node: int, kind: str) -> None:
        """What node ``node`` reported ("listening", "connected", "failed"), or "exited"."""
        if kind in ("listening", "connected", "failed", "exited"):
            self._note({node}, self._listening, self._all_listening)
        if kind in ("connected", "failed", "exited"):
            self._note({node}, self._connecting, self._all_connected)

    def spawned(self) -> None:
        """Every peer has its copy of the read end: the launcher's is closed."""
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1

    async def open_when_ready(self, wait_s: float) -> None:
        await self._all_listening.wait()
        try:
            await asyncio.wait_for(self._all_connected.wait(), wait_s)
        except TimeoutError:
            pass
        self.open()

    def open(self) -> None:
        if self._write_fd >= 0:
            os.close(self._write_fd)
            self._write_fd = -1

    def close(self) -> None:
        self.spawned()
        self.open()


async def _watch_peer(
    node: int,
    proc: asyncio.subprocess.Process,
    outcome: PeerOutcome,
    display: ProgressDisplay,
    stderr_path: Path,
    on_event: Callable[[int, dict, int], None] | None,
    gate: StartGate | None = None,
) -> None:
    async def pump_stdout():
        assert proc.stdout is not None
        while True:
            line = await proc.stdout.readline()
            if not line:
                return
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict):
                if ev.get("event") == "failed":
                    outcome.error = str(ev.get("error"))
                if ev.get("event") == "step":
                    outcome.steps_done = int(ev.get("step", 0))
                display.update(ev)
                if on_event is not None:
                    on_event(node, ev, proc.pid)
                # After on_event: a fault it injects at "connected" lands before the signal.
                if gate is not None:
                    gate.event(node, str(ev.get("event")))

    async def pump_stderr():
        assert proc.stderr is not None
        with open(stderr_path, "wb") as f:
            while True:
                chunk = await proc.stderr.read(65536)
                if not chunk:
                    return
                f.write(chunk)
                f.flush()

    await asyncio.gather(pump_stdout(), pump_stderr())
    outcome.returncode = await proc.wait()
    if gate is not None:
        gate.event(node, "exited")
    display.update({"event": "exited", "node": node})


#: Without an ``on_event`` that acts on steps, a peer reports its step at most this often (the
#: last step always; every other event as it comes): a progress line needs no more, and
#: hundreds of peers each reporting thousands of steps a second would keep the launcher busy.
STEP_EVENTS_S = 0.1


def peer_argv(
    out_dir: Path, node: int, progress_every: float = 0.0, start_fd: int | None = None
) -> list[str]:
    """The ``cfree peer`` command line of ``node`` in the run directory ``out_dir`` (config,
    roster and keys already there), reporting progress as JSON lines on its stdout (step
    events at most every ``progress_every`` seconds; 0: every step), taking its first step
    once ``start_fd`` reads end-of-file (:class:`StartGate`) when given."""
    every = ["--progress-every", f"{progress_every:g}"] if progress_every else []
    if start_fd is not None:
        every += ["--start-fd", str(start_fd)]
    return [
        sys.executable, "-m", "coordinator_free", "peer",
        "--config", str(rundir.config_path(out_dir)),
        "--roster", str(rundir.roster_path(out_dir)),
        "--key", str(roster_mod.key_path(out_dir / "keys", node)),
        "--id", str(node),
        "--out", str(out_dir),
        "--progress-fd", "1",
        *every,
    ]  # fmt: skip


def run_timeout(cfg: Config, plan) -> float:
    """How long a run may take before its remaining peers are killed: connecting, then every
    step at twice its deadline (plus the clock time of a paced randomized gossip), plus a minute."""
    timeout_s = cfg.network.connect_timeout_s + (plan.steps + 2) * cfg.network.deadline_s * 2 + 60.0
    if getattr(plan, "tick", 0.0):  # randomized gossip paced on its clocks
        timeout_s += plan.tick * plan.edges[-1].time
    return timeout_s


async def supervise_peers(
    cfg: Config,
    plan,
    out_dir: Path,
    command: Callable[[int, list[str]], tuple[list[str], tuple[int, ...]]],
    *,
    show_progress: bool = True,
    timeout_s: float | None = None,
    on_event: Callable[[int, dict, int], None] | None = None,
    after_spawn: Callable[[], None] | None = None,
    forkserver: ForkServer | None = None,
) -> LocalRun:
    """Start one peer process per node, follow their progress, wait for all of them.

    The run directory must already hold the config, roster and keys. ``command(node, argv)``
    turns a node's ``cfree peer`` command line (:func:`peer_argv`) into the one to execute and
    the file descriptors it inherits. ``after_spawn()`` runs once every process has started.
    With a ``forkserver``, each peer is forked from it (the command must then be the plain
    ``cfree peer`` one, not wrapped) instead of starting a fresh interpreter.
    Peers still running at ``timeout_s`` are killed, and so is every peer still running when
    this coroutine ends in any other way (error, Ctrl-C, cancellation). The peers take their
    first step together, once all are connected (:class:`StartGate`).
    """
    n = plan.n
    procs: list = []  # asyncio subprocesses, or ForkedProcess
    gate = StartGate(n)
    opener = None
    try:
        rundir.logs_dir(out_dir).mkdir(exist_ok=True)
        display = ProgressDisplay(
            n, plan.steps, show_progress, token=family_of(cfg.protocol.name).walks(cfg)
        )
        outcomes = [PeerOutcome(node=i, returncode=None) for i in range(n)]
        # Every step event only for an on_event that acts on steps (fault injection, tests).
        every = 0.0 if getattr(on_event, "needs_steps", on_event is not None) else STEP_EVENTS_S
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        t0 = time.monotonic()
        watchers = []
        display.render()  # "up 0/n" until the peers report in
        for i in range(n):
            base = peer_argv(out_dir, i, every, gate.read_fd)
            argv, fds = command(i, base)
            fds = (*fds, gate.read_fd)
            if forkserver is not None:
                if argv[:4] != base[:4]:
                    raise LaunchError(f"the fork server runs `cfree peer`, not {argv[0]}")
                proc = await forkserver.spawn(argv[3:], pass_fds=fds, env=env)
            else:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    pass_fds=fds,
                    env=env,
                )
            procs.append(proc)
            # Followed from the start: progress shows while the rest are still starting.
            watchers.append(
                asyncio.ensure_future(
                    _watch_peer(
                        i,
                        proc,
                        outcomes[i],
                        display,
                        rundir.stderr_path(out_dir, i),
                        on_event,
                        gate,
                    )
                )
            )
        gate.spawned()
        opener = asyncio.ensure_future(gate.open_when_ready(cfg.network.connect_timeout_s))
        if after_spawn is not None:
            after_spawn()
        if timeout_s is None:
            timeout_s = run_timeout(cfg, plan)
        ticker = asyncio.ensure_future(_redraw(display)) if show_progress else None
        try:
            done, pending = await asyncio.wait(watchers, timeout=timeout_s)
        finally:
            if ticker is not None:
                ticker.cancel()
        if pending:
            for i, p in enumerate(procs):
                if p.returncode is None:
                    outcomes[
                        i
                    ].error = f"still running after the run timeout of {timeout_s:.0f}s; killed"
                    p.kill()
            await asyncio.wait(pending, timeout=10)
        display.render(final=True)
        for o in outcomes:
            if o.returncode not in (0, None) and o.error is None:
                tail = _stderr_tail(rundir.stderr_path(out_dir, o.node))
                if o.returncode < 0:
                    try:
                        name = signal.Signals(-o.returncode).name
                    except ValueError:
                        name = f"signal {-o.returncode}"
                    o.error = f"killed by {name} after step {o.steps_done}; {tail}"
                else:
                    o.error = tail
        return LocalRun(out_dir=out_dir, outcomes=outcomes, wall_s=time.monotonic() - t0)
    finally:
        gate.close()
        if opener is not None:
            opener.cancel()
        # Interrupted (Ctrl-C, cancellation) or failed while spawning: never leave peer
        # processes behind. Every one is killed first, then all are awaited together under one
        # deadline (one at a time, a run of hundreds took a minute to end).
        live = [p for p in procs if p.returncode is None]
        for p in live:
            p.kill()
        if live:
            try:
                await asyncio.wait([asyncio.ensure_future(p.wait()) for p in live], timeout=10)
            except asyncio.CancelledError:
                pass


async def launch_peers(
    cfg: Config,
    out_dir: Path,
    *,
    show_progress: bool = True,
    timeout_s: float | None = None,
    on_event: Callable[[int, dict, int], None] | None = None,
    spawn: str = "fork",
) -> LocalRun:
    """Generate keys and a roster, spawn one process per node, wait for all of them.

    ``spawn``: "fork" forks every peer from a fork server that imported the peer's modules once
    (:mod:`~coordinator_free.cluster.forkserver`); "exec" starts each as a fresh interpreter.
    ``on_event(node, event, pid)`` is called for every progress event a peer reports (used by
    fault-injection tests to act at a precise point of a run); one with ``needs_steps = False``
    lets the peers thin their step events (:data:`STEP_EVENTS_S`).
    """
    if spawn not in SPAWN_MODES:
        raise LaunchError(f"spawn mode {spawn!r}: expected one of {', '.join(SPAWN_MODES)}")
    # Started first: the server imports while the keys are made.
    server = ForkServer.start() if spawn == "fork" else None
    socks: list[socket.socket] = []
    try:
        plan = make_plan(cfg)
        n = plan.n
        socks = bind_sockets(cfg.network.host, n, cfg.network.base_port)
        hosts = [(cfg.network.host, s.getsockname()[1]) for s in socks]
        ros = roster_mod.generate_keys(n, out_dir / "keys", hosts=hosts, name=cfg.run.name)
        roster_mod.save_roster(rundir.roster_path(out_dir), ros)
        if server is not None:  # the plan and the roster, made once for every peer to share
            await server.share_run(rundir.config_path(out_dir), rundir.roster_path(out_dir))

        def with_socket(i: int, argv: list[str]) -> tuple[list[str], tuple[int, ...]]:
            fd = socks[i].fileno()
            return [*argv, "--listen-fd", str(fd)], (fd,)

        def close_sockets() -> None:
            # The children hold their own copies of the listening sockets now.
            for s in socks:
                s.close()
            socks.clear()

        return await supervise_peers(
            cfg,
            plan,
            out_dir,
            with_socket,
            show_progress=show_progress,
            timeout_s=timeout_s,
            on_event=on_event,
            after_spawn=close_sockets,
            forkserver=server,
        )
    finally:
        for s in socks:
            s.close()
        if server is not None:
            await server.close()


def _stderr_tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no diagnostics)"
    return " | ".join(text[-lines:]) if text else "(exited without diagnostics)"


def _traffic(res: dict) -> dict:
    return {
        "bytes_sent": res["bytes_sent"],
        "bytes_received": res["bytes_received"],
        "messages_sent": res["messages_sent"],
        "elapsed_s": res["elapsed_s"],
        "steps_per_s": mf.steps_per_second(res["steps"], res["elapsed_s"]),
        "missed": len(res.get("missed", [])),
    }


def collect_learning_results(cfg: Config, out_dir: Path) -> dict:
    """Per-node final test accuracy/loss and traffic; metrics.jsonl of the node-average model
    per round (over the nodes that finished)."""
    from coordinator_free.families.learning import protocol as lp

    plan = make_plan(cfg)
    task = lp.make_task(cfg, plan.n)
    ds, model = task.dataset, task.model
    nodes, histories = [], {}
    for v in range(plan.n):
        res = read_result(out_dir, v)
        path = models_path(out_dir, v)
        try:
            hist = np.load(path, allow_pickle=False) if res is not None else None
        except (OSError, ValueError):
            hist = None
        if res is None or hist is None or hist.shape != (plan.rounds + 1, plan.dim):
            nodes.append({"node": v, "finished": False})
            continue
        histories[v] = hist
        theta = hist[-1]
        nodes.append(
            {
                "node": v,
                "finished": True,
                "test_loss": float(model.loss(theta, ds.X_test, ds.y_test)),
                "test_accuracy": model.accuracy(theta, ds.X_test, ds.y_test),
                **_traffic(res),
            }
        )
    metrics = []
    if histories:
        stacked = np.stack([histories[v] for v in sorted(histories)], axis=1)  # (R+1, n', dim)
        metrics = [lp.round_metrics(task, r, stacked[r]) for r in range(stacked.shape[0])]
        write_jsonl(rundir.metrics_path(out_dir), metrics)
    return {
        "protocol": plan.protocol,
        "rounds": plan.rounds,
        "gossip_steps": plan.gossip_steps,
        "steps": plan.steps,
        "nodes": nodes,
        "metrics": metrics,
    }


def collect_walk_results(cfg: Config, out_dir: Path) -> dict:
    """Token protocols: how every walk ended, the final token of the completed walks (from the
    node where each completed), and per-node traffic."""
    plan = make_plan(cfg)
    nodes, ends, finals = [], {}, {}
    for v in range(plan.n):
        res = read_result(out_dir, v)
        if res is None or not isinstance(res.get("walks"), dict):
            nodes.append({"node": v, "finished": False})
            continue
        walks = res["walks"]
        for j, e in walks.get("ended", {}).items():
            ends.setdefault(int(j), e)
        for j, val in walks.get("finals", {}).items():
            finals[int(j)] = {"node": v, "value": val}
        nodes.append(
            {"node": v, "finished": True, "steps_made": res["steps"], "reroutes": res["missed"],
             **_traffic(res)}
        )  # fmt: skip
    tokens = []
    for j in range(plan.tokens):
        t = {"token": j, "end": ends.get(j, {"how": "unknown", "at": None, "step": None})}
        if j in finals:
            t["final_at"] = finals[j]["node"]
            t["final"] = finals[j]["value"]
        tokens.append(t)
    return {"protocol": plan.protocol, "hops": plan.hops, "steps": plan.hops, "tokens": tokens,
            "nodes": nodes}  # fmt: skip


def collect_results(cfg: Config, out_dir: Path) -> dict:
    """Per-node estimate errors against the true mean, traffic, and rate."""
    fam = family_of(cfg.protocol.name)
    if fam.learns(cfg):
        return collect_learning_results(cfg, out_dir)
    if fam.walks(cfg):
        return collect_walk_results(cfg, out_dir)
    plan = make_plan(cfg)
    streams = seeds.streams_of_run(out_dir, plan.n)
    inputs = np.stack([mf.private_value(cfg, v, streams) for v in range(plan.n)])
    true_mean = inputs.mean(axis=0)
    nodes = []
    for v in range(plan.n):
        res = read_result(out_dir, v)
        if res is None:
            nodes.append({"node": v, "finished": False})
            continue
        est = np.asarray(res["estimate"], dtype=np.float64)
        nodes.append(
            {
                "node": v,
                "finished": True,
                "estimate": res["estimate"],
                "error": float(np.linalg.norm(est - true_mean)),
                **_traffic(res),
            }
        )
    return {"true_mean": true_mean.tolist(), "steps": plan.steps, "nodes": nodes}


def write_jsonl(path: Path, rows: list[dict]) -> None:
    """One JSON object per line, written atomically (rundir.write_jsonl)."""
    rundir.write_jsonl(path, rows)
