"""The peer process: one node of a run, its node engine driven over encrypted channels.

Data flow through a peer (see docs/architecture.md):

    config + roster + own key  ->  plan, and the family's node engine (sans-IO)
    PeerNet events, timer expiries  ->  engine.handle(event, now)  ->  actions:
        send (bounded by the step deadline; a failed send comes back as a peer-down event),
        view-log record, progress event, finish (the result file, the models)

The engine holds the protocol (the step exchange with its deadlines, the token hand-off, the
node program of the family); this module only moves events in and actions out. Every await has
a deadline: a run always ends, with results or a clear error.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import signal
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from coordinator_free import roster as roster_mod
from coordinator_free import rundir, seeds
from coordinator_free.blas import one_thread_for_process
from coordinator_free.config import Config
from coordinator_free.engine.events import (
    HEARTBEAT_DEADLINES,
    SILENCE_DEADLINES,
    Finish,
    Log,
    PeerDown,
    Send,
    ValueLog,
)
from coordinator_free.engine.events import Progress as ProgressAction
from coordinator_free.families import family_of, shared_plan
from coordinator_free.faults import nan_message
from coordinator_free.net.transport import PeerNet, PeerUnreachable
from coordinator_free.viewlog import ViewLogWriter

log = logging.getLogger("coordinator_free.peer")


class PeerFailure(RuntimeError):
    pass


@dataclass
class PeerResult:
    node: int
    estimate: list[float]
    steps: int
    elapsed_s: float
    bytes_sent: int
    bytes_received: int
    messages_sent: int
    messages_received: int
    missed: list[dict] = field(default_factory=list)
    late: int = 0
    # Token protocols: how every walk ended ({"how", "at", "step"} by token id), the final value
    # of the walks that completed at this node, and this node's re-routes.
    walks: dict | None = None
    # The socket addresses of each neighbour's channel once connected ({"local", "remote"} as
    # "host:port"): where the node really talked to whom (containers, namespaces, LAN hosts).
    channels: dict | None = None
    # Declared faults this node applied ({"link": frame counts, "nan": [steps], "signals":
    # [cut/heal...]}); None when the run declares none.
    injected: dict | None = None

    def to_json(self) -> dict:
        return self.__dict__.copy()


class Progress:
    """JSON-lines progress events on a file descriptor (read by the local launcher).

    ``every_s > 0`` thins the ``step`` events to at most one per ``every_s`` seconds (the last
    step is always written), for a human reading a container's output; every other event is
    written as it comes. The local launcher reads every event (``every_s = 0``)."""

    def __init__(self, fd: int | None, every_s: float = 0.0):
        self._f = os.fdopen(fd, "w", buffering=1) if fd is not None else None
        # Set when the reader of the events (the launcher) has gone away: a peer started by a
        # launcher stops instead of running on as an orphan.
        self.reader_gone = False
        self._every_s = every_s
        self._last_step = -math.inf

    def emit(self, **event) -> None:
        self.emit_event(event)

    def emit_event(self, event: dict) -> None:
        """:meth:`emit` of the fields of ``event`` (read, not kept): an engine's progress
        action, passed on without a copy."""
        if (
            self._every_s > 0
            and event.get("event") == "step"
            and event.get("step") != event.get("of")
        ):
            now = time.monotonic()
            if now - self._last_step < self._every_s:
                return
            self._last_step = now
        if self._f is not None:
            try:
                self._f.write(json.dumps(event) + "\n")
            except (BrokenPipeError, ValueError):
                self._f = None
                self.reader_gone = True

    def close(self) -> None:
        if self._f is not None:
            try:
                self._f.close()
            except OSError:
                pass
            self._f = None


async def run_peer(
    cfg: Config,
    roster: roster_mod.Roster,
    node_id: int,
    key,
    out_dir: Path,
    *,
    listen_sock: socket.socket | None = None,
    progress: Progress | None = None,
    start_fd: int | None = None,
) -> PeerResult:
    """Run node ``node_id`` to its end. ``start_fd``: the launcher's start signal
    (:func:`wait_for_start`); the connect timeout counts, and the first step waits, until it
    comes."""
    progress = progress or Progress(None)
    family = family_of(cfg.protocol.name)
    if not family.has_peers(cfg):
        raise PeerFailure(
            f"{cfg.protocol.name} is the trusted-curator baseline: it runs in one process "
            "(cfree run or cfree simulate), not as peers"
        )
    # Forked from a fork server that made this run's plan: that one, shared.
    plan = shared_plan(cfg)
    if plan is None:
        plan = family.make_plan(cfg)
    if plan.n != len(roster.entries):
        raise PeerFailure(
            f"the config describes {plan.n} nodes but the roster lists {len(roster.entries)}"
        )
    if node_id not in roster.ids:
        raise PeerFailure(f"node id {node_id} is not in the roster (ids 0..{plan.n - 1})")
    roster_mod.check_key_matches(roster, node_id, key)
    neighbours = plan.neighbours(node_id)
    deadline = cfg.network.deadline_s

    rundir.logs_dir(out_dir).mkdir(parents=True, exist_ok=True)
    rundir.results_dir(out_dir).mkdir(parents=True, exist_ok=True)
    vlog = ViewLogWriter(
        rundir.log_path(out_dir, node_id),
        run_id=roster.run_id,
        node=node_id,
        params=node_params(cfg, plan, node_id),
        mode=0o600,  # what a node saw is its own business
    )
    # The node's value, noise and minibatches come from streams seeded by its own private key
    # (nobody else can recompute them, whatever they know of the config), salted by the run id,
    # the config's digest and a nonce drawn now: a second run never repeats them. The nonce is
    # public (useless without the key) and logged so the launcher can rebuild the streams.
    own = seeds.NodeSecretStreams(
        key,
        roster.run_id_bytes,
        node_id,
        config_digest=seeds.config_digest(cfg),
        nonce=seeds.fresh_nonce(),
    )
    own.peer_keys = {e.id: e.public_key for e in roster.entries}
    vlog.write(seeds.STREAMS_RECORD, **own.record())
    fp = cfg.fault_plan
    link = link_faults(cfg, node_id)
    injector = Injector(fp.nan_steps(node_id), link, neighbours, vlog)
    net = PeerNet(
        node_id=node_id,
        static_key=key,
        roster_keys=roster.public_keys(),
        addresses=roster.addresses(),
        run_id=roster.run_id_bytes,
        neighbours=neighbours,
        max_frame=cfg.network.max_frame_bytes,
        cipher=cfg.network.cipher,
        faults=link,
        heartbeat_s=HEARTBEAT_DEADLINES * deadline,
        silence_s=SILENCE_DEADLINES * deadline,
    )
    t_start = time.monotonic()
    loop = asyncio.get_running_loop()
    started = None
    try:
        injector.install(loop)
        addr = await net.start(listen_sock)
        vlog.write("listen", host=addr[0], port=addr[1])
        progress.emit(event="listening", node=node_id, port=addr[1])
        if start_fd is not None:
            started = asyncio.ensure_future(wait_for_start(start_fd))
        await connect(net, cfg.network.connect_timeout_s, started)
        channels = channel_addresses(net, neighbours)
        vlog.write("connected", peers=neighbours)
        progress.emit(event="connected", node=node_id)
        if started is not None:
            await started  # the first step, and its deadline, once every peer is connected

        engine = family.node_engine(cfg, plan, node_id, own)
        outgoing = injector.outgoing if injector.nan_steps else None
        finish = await drive(engine, net, vlog, progress, deadline, outgoing)
        result = PeerResult(
            **finish.result,
            **traffic(net),
            channels=channels,
            injected=injector.summary() if fp else None,
        )
        if finish.models is not None:
            # The node's own model after every round: its output, never sent or logged.
            rundir.write_npy(rundir.models_path(out_dir, node_id), finish.models)
        write_result(out_dir, result)
        progress.emit(event="finished", node=node_id, elapsed_s=time.monotonic() - t_start)
        return result
    finally:
        if started is not None and not started.done():
            started.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await started
        injector.uninstall(loop)
        await net.close()
        vlog.close()


async def wait_for_start(fd: int) -> float:
    """Wait until the descriptor ``fd`` is readable, close it and return the loop's time then.
    It is the local launcher's start signal (end of file once it closes its end, when every
    peer of the run has connected): the peers of a large run come up one after the other over
    a minute or more on a small machine, and the ones up first would otherwise give up on the
    last ones (connect timeout) or miss their first values (step deadline)."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    loop.add_reader(fd, _settle, ready)
    try:
        await ready
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return loop.time()


def _settle(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


async def connect(net, timeout: float, started: asyncio.Future | None = None) -> None:
    """Connect to every neighbour within ``timeout`` seconds (PeerUnreachable otherwise),
    counted from the start signal ``started`` (:func:`wait_for_start`) when there is one:
    until it comes, the run is still starting its peers, and the neighbours not up yet are
    dialled again and again."""
    loop = asyncio.get_running_loop()
    while True:
        left = timeout
        if started is not None and started.done():
            left = started.result() + timeout - loop.time()
        try:
            await net.connect(left)
            return
        except PeerUnreachable as exc:
            if started is None:
                raise
            if started.done() and loop.time() >= started.result() + timeout:
                raise PeerUnreachable(exc.errors, timeout) from None


def link_faults(cfg: Config, node_id: int):
    """The node's transport faults from the run's declared ones (drop, duplicate, corrupt,
    delay), drawn from a stream of the public run seed and the node id."""
    from coordinator_free.net.linkfaults import LinkFaults

    fp = cfg.fault_plan
    seed = int.from_bytes(
        hashlib.sha256(b"cfree link faults %d %d" % (cfg.run.seed, node_id)).digest()[:8], "big"
    )
    return LinkFaults(
        drop=fp.drop, duplicate=fp.duplicate, corrupt=fp.corrupt, delay_s=fp.delay_s, seed=seed
    )


class Injector:
    """The declared faults a peer applies itself: NaN in place of the values (or token) it
    sends at the ``nan`` steps, and the cut / heal signals of the launcher (SIGUSR1 / SIGUSR2:
    block / unblock every neighbour in the transport). Each one is written to the view log as
    a ``fault`` record, so the audit can show it beside what the neighbours saw."""

    def __init__(self, nan_steps, link, neighbours: list[int], vlog):
        self.nan_steps = frozenset(nan_steps)
        self.link = link
        self.neighbours = list(neighbours)
        self.vlog = vlog
        self.nan_sent: list[dict] = []
        self.signals: list[str] = []

    def install(self, loop) -> None:
        try:
            loop.add_signal_handler(signal.SIGUSR1, self._signal, "cut")
            loop.add_signal_handler(signal.SIGUSR2, self._signal, "heal")
        except (NotImplementedError, RuntimeError, ValueError):  # pragma: no cover - no signals
            pass

    def uninstall(self, loop) -> None:
        for sig in (signal.SIGUSR1, signal.SIGUSR2):
            try:
                loop.remove_signal_handler(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # pragma: no cover
                pass
        ignore_fault_signals()

    def _signal(self, what: str) -> None:
        if what == "cut":
            self.link.block(self.neighbours)
        else:
            self.link.unblock(self.neighbours)
        self.signals.append(what)
        self.vlog.write("fault", fault=what, peers=self.neighbours)

    def outgoing(self, send: Send) -> Send:
        bad = nan_message(send.message, self.nan_steps)
        if bad is None:
            return send
        self.nan_sent.append({"step": bad.step, "peer": send.peer})
        self.vlog.write("fault", fault="nan", step=bad.step, peer=send.peer)
        return Send(send.peer, bad, send.on_sent)

    def summary(self) -> dict:
        return {"link": dict(self.link.counts), "nan": self.nan_sent, "signals": self.signals}


def ignore_fault_signals() -> None:
    """A cut or heal that reaches the process before its loop runs or after it closed must
    not kill it (the default action of SIGUSR1/SIGUSR2): there is nothing left to cut."""
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        try:
            signal.signal(sig, signal.SIG_IGN)
        except (OSError, ValueError):  # pragma: no cover - not the main thread
            pass


def node_params(cfg: Config, plan, node_id: int) -> dict:
    """The public parameters in the header of a node's view log (checked by the auditor)."""
    return {
        **plan.public_params(),
        "node": node_id,
        "neighbours": plan.neighbours(node_id),
        # A secret graph's weights change every round and are the node's own business.
        "weights": {}
        if getattr(plan, "secret", False)
        else {str(w): wt for w, wt in plan.row(node_id).items()},
        "weights_scheme": cfg.protocol.weights,
        "deadline_s": cfg.network.deadline_s,
        "config": cfg.to_dict(),
    }


async def drive(engine, net, vlog, progress: Progress, deadline: float, outgoing=None) -> Finish:
    """The peer's one loop: feed network events and timer expiries into the engine, perform
    its actions, until it finishes. ``outgoing(send)`` may replace what is sent (a declared
    ``nan`` fault)."""
    return await _Driver(engine, net, vlog, progress, deadline, outgoing).run()


class _Driver:
    """The loop of :func:`drive`. While the engine waits for the network, the events are
    handed to it in callbacks of their own (:meth:`PeerNet.idle`) and its actions performed
    there, as long as nothing needs to wait: the common step (values in, records written,
    values sent) costs no task switch, future or timer. Whatever needs waiting (a socket that
    does not take a send), a failed send, the finish, an earlier wake-up, or an error goes
    back to the task, which goes on from where the callback stopped.

    The view log's records of the events handled back to back are held and handed to the
    operating system together, in one vectored write, before the driver gives the event loop
    back (the callbacks' end, or the task waiting on anything: the network, a timer, a socket
    that is not taking a send). The transport hands the frames made in the callbacks to their
    sockets as the callbacks end, after that write (other frames at the end of their turn of
    the loop), so what the peer saw reaches the operating system before anything it sent after
    it: a step's records leave in one write. A send that the transport would
    write at once (:meth:`PeerNet.writes_at_once`: a large frame, injected faults) has the
    records held so far written first."""

    def __init__(self, engine, net, vlog, progress, deadline, outgoing) -> None:
        self.engine, self.net, self.vlog = engine, net, vlog
        self.progress, self.deadline, self.outgoing = progress, deadline, outgoing
        self.failed: deque[PeerDown] = deque()
        self.wake_at = math.inf  # when the task's timer wakes it, while it is idle

    async def run(self) -> Finish:
        engine, net, vlog, failed = self.engine, self.net, self.vlog, self.failed
        vlog.hold()
        try:
            actions = self._outgoing(engine.start(time.monotonic()))
            rest: tuple = (0, None)
            while True:
                finish = await self._perform(actions, *rest)
                rest = (0, None)
                if finish is not None:
                    return finish
                if failed:
                    actions = self._handle(failed.popleft())
                    continue
                ev = net.ready_event()
                if ev is not None:
                    actions = self._handle(ev)
                    continue
                wake = engine.next_wakeup()
                now = time.monotonic()
                if wake is None:
                    timeout = 3600.0
                    wake = now + timeout
                elif wake <= now:
                    actions = self._handle(None)
                    continue
                else:
                    timeout = wake - now
                # The engine's own wake-up time, not one read from the clock again: an event
                # handled in a callback that leaves it unchanged must not count as wanting an
                # earlier wake-up than the timer's (``_take``), or every step would wake the task.
                self.wake_at = wake
                vlog.flush()
                back = await net.idle(timeout, self._take, vlog.flush)
                vlog.hold()
                if back is None:  # the timer
                    actions = self._handle(None)
                else:  # what the callbacks left to do
                    actions, *rest = back
        finally:
            self.wake_at = math.inf
            vlog.flush()

    def _outgoing(self, actions: list) -> list:
        outgoing = self.outgoing
        if outgoing is None:
            return actions
        return [outgoing(a) if isinstance(a, Send) else a for a in actions]

    def _handle(self, ev) -> list:
        """The engine's actions for ``ev`` (None: the time has come), as they are sent."""
        return self._outgoing(self.engine.handle(ev, time.monotonic()))

    def _take(self, ev) -> tuple | None:
        """An event that arrived while the task is idle: handled, and its actions performed
        up to the first that needs the task. None when all is done, else what the task goes
        on with: the actions, the index to go on from and the sends it has to wait for. The
        records of the events taken back to back are held until the callbacks end (the view
        log's flush is ``idle``'s last call)."""
        self.vlog.hold()
        actions = self._handle(ev)
        stop = self._perform_now(actions, 0)
        if stop is not None:
            return (actions, *stop)
        if self.failed:
            return ([], 0, None)
        wake = self.engine.next_wakeup()
        if wake is not None and wake < self.wake_at:
            return ([], 0, None)  # the task's timer would wake it too late
        return None

    async def _perform(self, actions: list, i: int = 0, sending=None) -> Finish | None:
        """Perform the engine's actions from ``actions[i]`` on, in order, waiting where needed
        (``sending``: the sends of a batch already queued, to wait for first)."""
        while True:
            if sending is not None:
                batch, outcomes, waits = sending
                self.vlog.flush()  # nothing held while waiting on a socket
                done = await asyncio.gather(*(w for _, w in waits), return_exceptions=True)
                self.vlog.hold()
                for (k, _), res in zip(waits, done, strict=True):
                    outcomes[k] = res
                self._sent(batch, outcomes)
            stop = self._perform_now(actions, i)
            if stop is None:
                return None
            i, sending = stop
            if sending is None:
                return actions[i]  # the finish

    def _perform_now(self, actions: list, i: int) -> tuple | None:
        """Perform actions from ``actions[i]`` on until one needs waiting: None when all are
        done, else ``(index, sending)``: a batch of sends queued (``sending``: the batch, the
        outcomes so far, the sends to wait for; the index is that of the action after the
        batch), or the finish (``sending`` None, the index is the finish's). Consecutive sends
        go out concurrently (each bounded by the deadline; two to the same peer keep their
        order); a failed one is queued as a PeerDown for the engine."""
        vlog, net, deadline = self.vlog, self.net, self.deadline
        n = len(actions)
        while i < n:
            a = actions[i]
            kind = type(a)
            if kind is ValueLog:  # the most common action: a value record
                vlog.write_value(a.kind, a.step, a.peer, a.digest, a.nbytes, a.value)
                i += 1
                continue
            if kind is Log:
                vlog.write_record(a.kind, a.fields)
                i += 1
                continue
            if kind is Send:
                batch, peers = [], set()
                while i < n and type(actions[i]) is Send:
                    if actions[i].peer in peers:
                        break
                    peers.add(actions[i].peer)
                    batch.append(actions[i])
                    i += 1
                # Each send is queued at once; only those the socket does not take at once are
                # waited for, together.
                outcomes: list = []
                waits = []
                encoded, parts = None, None  # one message to several peers is encoded once
                held = True  # records held that no frame has passed yet
                for s in batch:
                    if s.message is not encoded:
                        encoded, parts = s.message, net.encode(s.message)
                    if held and net.writes_at_once(s.peer, parts):
                        # What the node received reaches the operating system before anything
                        # it sends after it: a frame that goes to its socket now waits for it.
                        vlog.flush()
                        vlog.hold()
                        held = False
                    try:
                        wait = net.send_now(s.peer, s.message, deadline, parts)
                    except (ConnectionError, OSError) as exc:  # PeerGone
                        outcomes.append(exc)
                        continue
                    outcomes.append(None)
                    if wait is not None:
                        waits.append((len(outcomes) - 1, wait))
                if waits:
                    return i, (batch, outcomes, waits)
                self._sent(batch, outcomes)
                continue
            if kind is ProgressAction:
                self.progress.emit_event(a.fields)
                if a.abort is not None and self.progress.reader_gone:
                    what, when = a.abort
                    vlog.write("aborted", step=a.fields["step"], reason="the launcher went away")
                    raise PeerFailure(f"the launcher went away ({what} {when}); stopping")
            elif kind is Finish:
                return i, None
            i += 1
        return None

    def _sent(self, batch: list, outcomes: list) -> None:
        """The outcomes of a batch of sends: a ``send`` record for each one sent, a PeerDown
        queued for each one that failed."""
        vlog = self.vlog
        for s, res in zip(batch, outcomes, strict=True):
            if res is None or not isinstance(res, BaseException):  # sent
                a = s.on_sent
                if type(a) is ValueLog:
                    vlog.write_value(a.kind, a.step, a.peer, a.digest, a.nbytes, a.value)
                elif a is not None:
                    vlog.write_record(a.kind, a.fields)
            elif isinstance(res, (ConnectionError, OSError)):  # PeerGone, PeerUnreachable
                self.failed.append(PeerDown(s.peer, f"send failed: {type(res).__name__}: {res}"))
            else:
                raise res


def channel_addresses(net, neighbours) -> dict:
    """``{neighbour: {"local": "host:port", "remote": "host:port"}}`` of the open channels."""
    out = {}
    for j in neighbours:
        ends = net.channel_endpoints(j)
        if ends is not None:
            (lh, lp), (rh, rp) = ends
            out[str(j)] = {"local": f"{lh}:{lp}", "remote": f"{rh}:{rp}"}
    return out


def traffic(net) -> dict:
    """A node's traffic counters over all its channels (the PeerResult fields)."""
    stats = net.stats.values()
    return {
        "bytes_sent": int(sum(s.bytes_sent for s in stats)),
        "bytes_received": int(sum(s.bytes_received for s in stats)),
        "messages_sent": int(sum(s.frames_sent for s in stats)),
        "messages_received": int(sum(s.frames_received for s in stats)),
    }


def write_result(out_dir: Path, result: PeerResult) -> None:
    """results/node-<id>.json, written to a temporary file and renamed into place."""
    rundir.write_json(rundir.result_path(out_dir, result.node), result.to_json())


def listen_socket(spec: str) -> socket.socket:
    """A listening TCP socket on ``HOST:PORT`` (``[v6]:PORT`` for IPv6)."""
    host, sep, port = spec.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("expected HOST:PORT with a port in 1..65535")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, int(port)))
        s.listen(128)
    except OSError:
        s.close()
        raise
    return s


#: The exit code of a peer ended by SIGINT (128 + 2, as a shell reports it).
INTERRUPTED_EXIT = 130


#: glibc ``mallopt`` parameters (malloc.h): M_TRIM_THRESHOLD, M_MMAP_THRESHOLD.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory(largest: int = 32 << 20) -> bool:
    """Let this process (a peer) reuse the memory of the large buffers it frees instead of
    giving it back to the kernel at once. A step allocates and frees the same few buffers of a
    value's size over and over (numpy results, cipher output, received frames); past glibc's
    default threshold (128 KiB, adapting only to blocks strictly larger than the last one
    freed) each comes from a fresh ``mmap`` whose every page faults on first touch, which cost
    more than the arithmetic on a 1 MiB value. Blocks up to ``largest`` bytes now come from
    the heap, which keeps up to twice that much free memory (32 MiB is the largest threshold
    glibc accepts on 64-bit systems). No-op (False) where the C library is not glibc."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(_M_MMAP_THRESHOLD, largest)) and bool(
        mallopt(_M_TRIM_THRESHOLD, 2 * largest)
    )


def peer_main(args) -> int:
    """Entry point of ``cfree peer``. Ctrl-C (SIGINT, which reaches every peer of a launcher's
    process group) ends the peer quietly: the node's task is cancelled, its channels and view
    log closed, one line on stderr and exit code 130, never a traceback."""
    try:
        return _peer_main(args)
    except KeyboardInterrupt:
        with contextlib.suppress(BaseException):
            print(f"cfree peer: node {args.id} interrupted (SIGINT)", file=sys.stderr)
        return INTERRUPTED_EXIT


def _peer_main(args) -> int:
    from coordinator_free import config as config_mod

    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format=f"node-{args.id} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        cfg = config_mod.load(args.config, args.set or [])
        ros = roster_mod.load_roster(args.roster)
        key = roster_mod.load_private_key(args.key)
    except (config_mod.ConfigError, roster_mod.RosterError, OSError) as exc:
        print(f"cfree peer: {exc}", file=sys.stderr)
        return 2
    sock = None
    if args.listen_fd is not None:
        sock = socket.socket(fileno=args.listen_fd)
    elif getattr(args, "listen", None):
        try:
            sock = listen_socket(args.listen)
        except (ValueError, OSError) as exc:
            print(f"cfree peer: --listen {args.listen}: {exc}", file=sys.stderr)
            return 2
    start_fd = getattr(args, "start_fd", None)
    if start_fd is not None:
        try:
            os.fstat(start_fd)
        except OSError as exc:
            print(f"cfree peer: --start-fd {start_fd}: {exc.strerror}", file=sys.stderr)
            return 2
    progress = Progress(args.progress_fd, args.progress_every)
    from coordinator_free.peer import budget

    budget.maybe_install(args.id)  # counters of bench_vs_zmq --budget; off unless asked
    ignore_fault_signals()
    one_thread_for_process()  # one process of many: no spinning BLAS threads
    keep_freed_memory()
    collector = None
    if getattr(args, "ship_to", None) is not None:
        from coordinator_free.cluster import shiplogs

        try:
            collector = shiplogs.load_collector(args.ship_to)
        except shiplogs.ShipError as exc:
            print(f"cfree peer: --ship-to: {exc}", file=sys.stderr)
            return 2
    rc = 0
    try:
        try:
            _run_loop(
                run_peer(
                    cfg,
                    ros,
                    args.id,
                    key,
                    Path(args.out),
                    listen_sock=sock,
                    progress=progress,
                    start_fd=start_fd,
                )
            )
        except Exception as exc:  # report the cause, never a silent hang
            msg = f"node {args.id} failed: {type(exc).__name__}: {exc}"
            print(f"cfree peer: {msg}", file=sys.stderr)
            progress.emit(event="failed", node=args.id, error=msg)
            rc = 1
        if collector is not None:  # what the node logged goes to the auditor, finished or not
            # (before the progress fd closes: it may be stdout, which no socket may take over)
            _run_loop(
                shiplogs.ship(
                    Path(args.out), args.id, key, ros, collector,
                    say=lambda m: print(f"cfree peer: {m}", file=sys.stderr, flush=True),
                )
            )  # fmt: skip
    finally:
        progress.close()
    return rc


def _run_loop(coro):
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        return asyncio.run(coro)
    return uvloop.run(coro)
