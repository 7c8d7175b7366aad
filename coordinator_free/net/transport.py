"""Thin asyncio shell around :class:`~coordinator_free.net.channel.SecureChannel`.

A :class:`PeerNet` listens for its neighbours, dials them with bounded exponential back-off
(peers start in any order), authenticates every connection against the roster, keeps exactly one
channel per edge (:func:`~coordinator_free.net.channel.dup_dial_action`), and turns what arrives
into events: :class:`Inbound` messages in arrival order, :class:`PeerDown` when a neighbour's
channel closes, fails or falls silent, :class:`PeerUp` when a lost neighbour is back.

All crypto and framing decisions live in the sans-IO channel; this module only moves bytes,
with a deadline on every await that can block progress: connecting, the handshake, the
leader's choice of connection, the rest of a frame once its header has arrived, draining a send.
Once a channel is selected, the socket's bytes are read straight into the channel's own buffer
(a buffered protocol takes over from the stream's) and decrypted, decoded and queued in the read
callback; the connection's task then waits only for the end of the stream, a failure in that
callback, or a frame's deadline.

Liveness: with ``heartbeat_s`` set, every established channel carries an authenticated
heartbeat (a control frame of the channel, not a data message) whenever nothing was sent on it
for ``heartbeat_s``; with ``silence_s`` set, a channel on which nothing at all arrived for
``silence_s`` is closed and a :class:`PeerDown` emitted (a cut link or a stopped peer, which TCP
alone would not notice for minutes). Both run from one timer task. A channel is only declared
silent if it still is at the next tick, so the node's own stalls (a long computation that blocks
the event loop while the peer's heartbeats pile up in the socket) never produce a verdict: the
readers get a turn first. Without ``silence_s`` an idle channel may stay silent as long as it
likes; TCP keep-alive is enabled on every socket in any case.

Pre-authentication: at most ``max_pending_handshakes`` inbound connections may be in their
handshake at once, and at most ``max_pending_per_source`` from one source address (plus one per
neighbour whose roster address is that address, so neighbours sharing a host, as on loopback,
never crowd each other out). A source over its share loses its oldest pending connection; when
the global cap is reached, the source with the most pending connections loses its oldest.
Connections that do not complete the handshake within ``handshake_timeout`` are closed.

Connections that fail (non-neighbours, unknown ids, wrong keys, other runs, garbage, oversized
or tampered frames, malformed messages) are closed and logged on the ``coordinator_free.net``
logger; the node keeps running, and if the connection was a neighbour's established channel a
:class:`PeerDown` is emitted. When an established channel drops and ``reconnect`` is on, the
edge's leader (the lower id) redials with back-off for ``reconnect_timeout`` seconds and a
:class:`PeerUp` follows if it succeeds.

``faults`` (:class:`~coordinator_free.net.linkfaults.LinkFaults`) injects drops, duplicates,
corruption, delays and cut links on the node's own channels, for fault experiments.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import itertools
import logging
import math
import os
import random
import socket
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from coordinator_free.engine.events import Inbound, NetEvent, PeerDown, PeerUp
from coordinator_free.net.channel import (
    DEFAULT_MAX_FRAME,
    HEADER_SIZE,
    RECV_ROOM,
    TAG_SIZE,
    AuthenticationError,
    ChannelError,
    ControlReceived,
    DupAction,
    Event,
    HandshakeCut,
    HandshakeError,
    MessageReceived,
    RosterKeys,
    SecureChannel,
    cipher_suites,
    dup_dial_action,
    edge_leader,
)
from coordinator_free.net.linkfaults import LinkFaults
from coordinator_free.net.wire import (
    Message,
    WireError,
    decode_message,
    encode_parts,
)

__all__ = [
    "Inbound",
    "NetEvent",
    "PeerDown",
    "PeerGone",
    "PeerNet",
    "PeerStats",
    "PeerUnreachable",
    "PeerUp",
    "silence_reason",
]

log = logging.getLogger("coordinator_free.net")

#: Control frame payload with which an edge's leader selects the connection to use.
SELECT = b"select"
#: Control frame payload of a heartbeat: proof of life on an otherwise idle channel.
HEARTBEAT = b"heartbeat"
#: A frame body longer than this is read as it arrives rather than in one piece, so that a large
#: frame in transit counts as life for the silence detector.
CHUNK = 64 << 10
#: Small writes made in one turn of the event loop go to the socket together at its end, up to
#: this many bytes (more is written at once).
COALESCE = 64 << 10
#: StreamReader buffer limit: reading pauses once about twice this much is buffered and not yet
#: consumed (readexactly of a larger frame still works, it resumes reading as it goes). Keeps
#: what an unauthenticated connection can make us hold small.
STREAM_LIMIT = 256 << 10


# --------------------------------------------------------------------------- events, errors


# The events are the node engines' own (coordinator_free.engine.events): the peer shell hands
# them to its engine as they come.


class PeerUnreachable(ConnectionError):
    """:meth:`PeerNet.connect` timed out. ``errors`` maps each missing neighbour to the last
    error seen while trying to reach it; ``missing`` lists their ids."""

    def __init__(self, errors: Mapping[int, str], timeout: float) -> None:
        self.errors = dict(sorted(errors.items()))
        self.missing = list(self.errors)
        self.timeout = timeout
        detail = "; ".join(f"node {p}: {e}" for p, e in self.errors.items())
        super().__init__(
            f"neighbour(s) {', '.join(map(str, self.missing))} not connected within "
            f"{timeout:g} s ({detail})"
        )


class PeerGone(ConnectionError):
    """A send found no working channel to ``peer``."""

    def __init__(self, peer: int, reason: str) -> None:
        self.peer = peer
        self.reason = reason
        super().__init__(f"no channel to node {peer}: {reason}")


@dataclass
class PeerStats:
    """Traffic with one neighbour. Bytes count everything on the wire (handshakes, framing,
    control, heartbeats) over connections authenticated as that neighbour; frames count data
    messages (frames written to the wire: a message dropped by fault injection is not counted,
    a duplicated one twice); heartbeats are counted apart."""

    bytes_sent: int = 0
    bytes_received: int = 0
    frames_sent: int = 0
    frames_received: int = 0
    heartbeats_sent: int = 0
    heartbeats_received: int = 0
    dial_attempts: int = 0
    connections: int = 0  # channels adopted for this edge (1 + reconnections)


def silence_reason(quiet: float) -> str:
    """The :class:`PeerDown` reason of a channel on which nothing arrived for ``quiet`` s."""
    return f"silent for {quiet:.1f} s: no message or heartbeat (link cut, or the peer stopped)"


class _Drop(Exception):
    """Close a connection for ``reason``; logged at ``level``."""

    def __init__(self, reason: str, level: int = logging.WARNING) -> None:
        super().__init__(reason)
        self.level = level


# --------------------------------------------------------------------------- connection


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


#: What takes the events while a reader is idle (:meth:`PeerNet.idle`), and what it calls once
#: the events that arrived together are taken.
Sink = Callable[[NetEvent], Any]
After = Callable[[], Any]


#: The events of a frame received (blocked with the link when fault injection pulls it).
_FRAMES = (MessageReceived, ControlReceived)


class _EventQueue(deque):
    """The node's events in arrival order: a deque, plus a wait for the next one when empty
    (one reader: :meth:`PeerNet.next_event`), or a handler that takes them as they come while
    the reader is idle (:meth:`idle`)."""

    def __init__(self) -> None:
        super().__init__()
        self._waiter: asyncio.Future | None = None
        self._sink: Sink | None = None
        self._after: After | None = None
        self._sink_scheduled = False
        # ``end(ok)`` once the events of a callback are taken and ``after()`` has run (True
        # when nothing failed): the transport hands the writes they made to their sockets
        # there, not in a callback of their own a turn of the loop later. ``in_sink``: while
        # the events are being taken (their writes wait for ``end``).
        self.end: Callable[[bool], Any] | None = None
        self.in_sink = False

    def put(self, ev: NetEvent) -> None:
        self.append(ev)
        w = self._waiter
        if w is not None and not w.done():
            if self._sink is None:
                w.set_result(None)
            elif not self._sink_scheduled:
                # Handled in a callback of its own, after the transport's callback that
                # decoded it (never inside it), with whatever else arrives meanwhile.
                self._sink_scheduled = True
                w.get_loop().call_soon(self._run_sink)  # (get_running_loop: a system call)

    def _run_sink(self) -> None:
        self._sink_scheduled = False
        w, sink, after = self._waiter, self._sink, self._after
        if w is None or sink is None or w.done() or not self:
            return  # the reader takes the events itself
        back, failure, ok = None, None, False
        self.in_sink = True
        try:
            try:
                while self:
                    back = sink(self.popleft())
                    if back is not None:
                        break
            except Exception as exc:
                failure = exc
            if after is not None:
                # Also after a failure: what the callbacks hold (a peer's records) is handed
                # on before the loop runs anything else (the turn's socket writes).
                try:
                    after()
                except Exception as exc:
                    failure = failure if failure is not None else exc
            ok = failure is None
        finally:
            self.in_sink = False
            if self.end is not None:
                self.end(ok)  # never raises: a failed write is the loop's to report
        if failure is not None:  # the reader raises it (the sink's, when both failed)
            w.set_exception(failure)
            return
        if back is not None:
            w.set_result(back)

    async def idle(self, timeout: float, sink: Sink, after: After | None = None) -> Any:
        """Wait, at most ``timeout`` seconds, while ``sink(event)`` takes the events as they
        come, until it returns something other than None, which this returns (None after the
        timeout). ``after()`` is called when the events that arrived together have been taken.
        What ``sink`` or ``after`` raise is raised here. The reader's task sleeps through the
        events ``sink`` takes on its own: no task switch, future or timer per event."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        self._sink, self._after = sink, after
        timer = loop.call_later(timeout, _wake, waiter)
        try:
            if self and not self._sink_scheduled:
                self._sink_scheduled = True
                loop.call_soon(self._run_sink)
            return await waiter
        finally:
            timer.cancel()
            self._waiter = self._sink = self._after = None

    async def get_within(self, timeout: float) -> NetEvent | None:
        """The next event, or None after ``timeout`` seconds without one (a timer on the
        wait itself: cheaper than a timeout context around :meth:`get`, once per step)."""
        if not self:
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(timeout, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        return self.popleft() if self else None

    async def get(self) -> NetEvent:
        while not self:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.popleft()


class _Conn:
    __slots__ = (
        "cid",
        "reader",
        "writer",
        "channel",
        "peer",
        "selected",
        "closed",
        "counted",
        "rx",
        "tx",
        "select_deadline",
        "settled",
        "remote",
        "source",
        "pending",
        "task",
        "last_rx",
        "last_tx",
        "suspect",
        "frame_deadline",
        "delayed",
        "delay_handle",
        "corrupted",
        "hs_suppressed",
        "wbuf",
        "transport",
        "wbytes",
        "shared",
        "seen",
        "wake",
        "failure",
        "deadline_seq",
    )

    def __init__(
        self,
        cid: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        channel: SecureChannel,
        settled: asyncio.Future[str | None],
    ) -> None:
        self.cid = cid
        self.reader = reader
        self.writer = writer
        self.channel = channel
        self.peer: int | None = None  # set once authenticated
        self.selected = False
        self.closed = False
        self.counted = False  # bytes go to the peer's stats once authenticated
        self.rx = 0
        self.tx = 0
        self.select_deadline = 0.0
        self.settled = settled  # None when selected, else the reason it was dropped
        peer = writer.get_extra_info("peername")
        self.remote = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.source = _source_address(peer)  # the remote IP, the key of the per-source bound
        self.pending = False  # an inbound connection counted among the pending handshakes
        self.task: asyncio.Task[Any] | None = None
        now = time.monotonic()
        self.last_rx = now  # the last time bytes arrived (liveness)
        self.last_tx = now  # the last time bytes were written (heartbeats)
        self.suspect = False  # found silent at the previous liveness tick
        self.frame_deadline: float | None = None  # the rest of the current frame is due by then
        self.delayed: deque[tuple[float, bytes]] | None = None  # fault injection: delay queue
        self.delay_handle: asyncio.TimerHandle | None = None
        self.corrupted: int | None = None  # fault injection: the frame sent with a flipped bit
        self.hs_suppressed = False  # fault injection: handshake bytes were withheld (blocked)
        # Bytes written in this turn of the event loop, handed to the socket together at its
        # end (one system call for a step's small frames): None when nothing is waiting.
        self.wbuf: list[bytes] | None = None
        self.transport = writer.transport  # the writer's, for good (read at every send)
        self.wbytes = 0
        # Established: the channel reads its frames straight from the stream's receive buffer
        # (no copy into a bytes object, none into the channel); ``seen`` of its bytes counted.
        self.shared = False
        self.seen = 0
        # Selected: frames are decoded in the read callback (_read_direct) and the connection's
        # task only waits for what needs it (``wake``): the end of the stream, a failure in the
        # callback (``failure``, raised by the task) or a frame's deadline.
        self.wake: asyncio.Future[None] | None = None
        self.failure: BaseException | None = None
        self.deadline_seq = -1  # the frame (its sequence number) frame_deadline is for

    @property
    def label(self) -> str:
        ch = self.channel
        if ch.initiator:
            return f"connection #{self.cid} to node {ch.peer_id} at {self.remote}"
        who = "" if ch.peer_id is None else f" claiming node {ch.peer_id}"
        if self.peer is not None:
            who = f" of node {self.peer}"
        return f"connection #{self.cid} from {self.remote}{who}"


def _source_address(peer: object) -> str:
    """The normalised IP of a socket address (IPv4-mapped IPv6 as IPv4), or its text."""
    host = peer[0] if isinstance(peer, tuple) and peer else peer
    try:
        ip = ipaddress.ip_address(host)  # type: ignore[arg-type]
    except ValueError:
        return str(host)
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)


# --------------------------------------------------------------------------- PeerNet


def _checked_identity(
    node_id: int,
    static_key: X25519PrivateKey,
    roster_keys: Mapping[int, bytes],
    run_id: bytes,
    neighbours: Iterable[int],
    max_frame: int,
    cipher: str,
) -> tuple[RosterKeys, Any, frozenset[int]]:
    """The roster (id -> public key bytes), the cipher suites and the neighbours of a
    :class:`PeerNet`, after checking them: the neighbours are other nodes of the roster, and
    ids, keys, run id and frame size pass the channel's own checks. Raises ValueError."""
    # Checked here once (by the channel's own checks, below), not again by every channel.
    roster = RosterKeys(roster_keys)
    suites = cipher_suites(cipher)  # raises ValueError naming the choices
    nbrs = frozenset(neighbours)
    if node_id in nbrs:
        raise ValueError(f"node {node_id} lists itself as a neighbour")
    unknown = sorted(p for p in nbrs if p not in roster)
    if unknown:
        raise ValueError(f"neighbour(s) {unknown} of node {node_id} are not in the roster")
    # Validates ids, keys, run_id and max_frame with the channel's own checks.
    SecureChannel(
        local_id=node_id,
        static_key=static_key,
        roster_keys=roster,
        run_id=run_id,
        initiator=False,
        max_frame=max_frame,
        ciphers=suites,
    )
    return roster, suites, nbrs


def _check_timing(
    *,
    handshake_timeout: float,
    io_timeout: float,
    send_timeout: float,
    reconnect_timeout: float,
    backoff_initial: float,
    backoff_max: float,
    heartbeat_s: float | None,
    silence_s: float | None,
) -> None:
    """A :class:`PeerNet`'s timeouts and backoffs are positive; heartbeat and silence are
    positive finite seconds or None, and silence exceeds twice the heartbeat. Raises
    ValueError naming the first that is not."""
    for name, value in (
        ("handshake_timeout", handshake_timeout),
        ("io_timeout", io_timeout),
        ("send_timeout", send_timeout),
        ("reconnect_timeout", reconnect_timeout),
        ("backoff_initial", backoff_initial),
        ("backoff_max", backoff_max),
    ):
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")
    for name, value in (
        ("heartbeat_s", heartbeat_s),
        ("silence_s", silence_s),
    ):
        if value is not None and not (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value > 0
        ):
            raise ValueError(f"{name} must be a positive number of seconds or None, got {value!r}")
    if heartbeat_s is not None and silence_s is not None and not silence_s > 2 * heartbeat_s:
        raise ValueError(
            f"silence_s ({silence_s:g} s) must exceed twice heartbeat_s ({heartbeat_s:g} s), "
            "or healthy idle channels would be declared silent"
        )


def _check_limits(
    max_pending_handshakes: int, max_pending_per_source: int, faults: LinkFaults | None
) -> None:
    """The pending-handshake bounds are positive integers and ``faults`` a LinkFaults or None
    (ValueError, TypeError)."""
    for name, count in (
        ("max_pending_handshakes", max_pending_handshakes),
        ("max_pending_per_source", max_pending_per_source),
    ):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"{name} must be a positive integer, got {count!r}")
    if faults is not None and not isinstance(faults, LinkFaults):
        raise TypeError(f"faults must be a LinkFaults or None, got {type(faults).__name__}")


def _tick_interval(heartbeat_s: float | None, silence_s: float | None) -> float | None:
    """The liveness tick: half the heartbeat, a quarter of the silence, the shorter of the two
    (at least 5 ms); None when both are off."""
    ticks = []
    if heartbeat_s is not None:
        ticks.append(heartbeat_s / 2)
    if silence_s is not None:
        ticks.append(silence_s / 4)
    return max(0.005, min(ticks)) if ticks else None


class _FrameReader(asyncio.BufferedProtocol):
    """The protocol of a selected channel's connection: the socket's bytes are read straight
    into the channel's own buffer (``get_buffer``, ``buffer_updated``: the transport's
    callbacks); the end of the stream and the writer's flow control still go to the stream's
    own protocol (``inner``), so its reader sees the end and its writer's ``drain`` works."""

    __slots__ = ("_inner", "get_buffer", "buffer_updated")

    def __init__(self, inner: asyncio.BaseProtocol, get_buffer, buffer_updated) -> None:
        self._inner = inner
        self.get_buffer = get_buffer
        self.buffer_updated = buffer_updated

    def connection_lost(self, exc: Exception | None) -> None:
        self._inner.connection_lost(exc)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()  # type: ignore[attr-defined]

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class PeerNet:
    """The networking of one node: authenticated encrypted channels to its graph neighbours.

    ``addresses`` is read when dialling, so it may be a mapping the caller fills in after
    construction (e.g. once every node has bound port 0). ``neighbours`` are the only nodes this
    node dials or accepts. Timeouts are in seconds.

    ``heartbeat_s``: send a heartbeat on every channel idle (nothing sent) for that long.
    ``silence_s``: declare a channel down when nothing (data or heartbeat) arrived on it for that
    long; the :class:`PeerDown` follows within about ``silence_s`` plus two ticks, a tick being
    half of ``heartbeat_s`` (a quarter of ``silence_s`` without heartbeats). The neighbours must
    send heartbeats more often than ``silence_s`` for idle channels to stay up; every node of a
    run should use the same values. ``None`` (the default) turns either off.
    ``max_pending_per_source``: pending inbound handshakes allowed from one source address (see
    the module docstring). ``faults``: fault injection on this node's links.
    """

    def __init__(
        self,
        *,
        node_id: int,
        static_key: X25519PrivateKey,
        roster_keys: Mapping[int, bytes],
        addresses: Mapping[int, tuple[str, int]],
        run_id: bytes,
        neighbours: Iterable[int],
        max_frame: int = DEFAULT_MAX_FRAME,
        handshake_timeout: float = 5.0,
        io_timeout: float = 60.0,
        send_timeout: float = 60.0,
        reconnect: bool = True,
        reconnect_timeout: float = 60.0,
        backoff_initial: float = 0.05,
        backoff_max: float = 1.0,
        max_pending_handshakes: int = 64,
        max_pending_per_source: int = 8,
        heartbeat_s: float | None = None,
        silence_s: float | None = None,
        faults: LinkFaults | None = None,
        cipher: str = "auto",
    ) -> None:
        roster, suites, nbrs = _checked_identity(
            node_id, static_key, roster_keys, run_id, neighbours, max_frame, cipher
        )
        self._suites = suites
        _check_timing(
            handshake_timeout=handshake_timeout,
            io_timeout=io_timeout,
            send_timeout=send_timeout,
            reconnect_timeout=reconnect_timeout,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
            heartbeat_s=heartbeat_s,
            silence_s=silence_s,
        )
        _check_limits(max_pending_handshakes, max_pending_per_source, faults)
        self._node_id = node_id
        self._static_key = static_key
        self._roster = roster
        self._addresses = addresses
        self._run_id = bytes(run_id)
        self._neighbours = nbrs
        self._max_frame = max_frame
        self._handshake_timeout = handshake_timeout
        self._io_timeout = io_timeout
        self._send_timeout = send_timeout
        self._reconnect = reconnect
        self._reconnect_timeout = reconnect_timeout
        self._backoff_initial = backoff_initial
        self._backoff_max = max(backoff_max, backoff_initial)
        self._max_pending = max_pending_handshakes
        self._max_per_source = max_pending_per_source
        self._heartbeat_s = None if heartbeat_s is None else float(heartbeat_s)
        self._silence_s = None if silence_s is None else float(silence_s)
        self._tick = _tick_interval(self._heartbeat_s, self._silence_s)
        self._faults = faults
        self._init_state(nbrs)

    def _init_state(self, nbrs: frozenset[int]) -> None:
        """The run-time state: channels, their statistics and events, pending handshakes,
        tasks, the listening server and closing."""
        self._stats = {p: PeerStats() for p in sorted(nbrs)}
        self._selected: dict[int, _Conn] = {}
        self._up = {p: asyncio.Event() for p in nbrs}
        self._down_reported: set[int] = set()
        self._last_reason: dict[int, str] = {}
        self._events = _EventQueue()
        self._conns: set[_Conn] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._redials: dict[int, asyncio.Task[None]] = {}
        # Inbound connections in their handshake, by source address, oldest first.
        self._pending: dict[str, dict[_Conn, None]] = {}
        self._pending_total = 0
        self._evicted = 0
        self._evict_logged: dict[str, float] = {}
        self._neighbour_hosts: dict[str, int] = {}  # neighbours per roster host (cached)
        self._hosts_at = -math.inf
        # Fault injection: connections closed while their peer was blocked, kept open silently.
        self._parked: dict[int, list[asyncio.WriteTransport]] = {}
        self._cids = itertools.count(1)
        self._rng = random.Random()
        self._server: asyncio.Server | None = None
        self._address: tuple[str, int] | None = None
        self._closing = False
        self._close_done: asyncio.Event | None = None
        # The connections written to in this turn of the event loop, flushed together at its
        # end by one callback; the loop, once known (asyncio.get_running_loop() makes a
        # system call in this Python, and a step writes to every neighbour).
        self._turn: list[_Conn] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events.end = self._end_of_events

    # ----------------------------------------------------------------- introspection

    @property
    def node_id(self) -> int:
        return self._node_id

    @property
    def neighbours(self) -> frozenset[int]:
        return self._neighbours

    @property
    def address(self) -> tuple[str, int] | None:
        """The bound listening address, once started."""
        return self._address

    @property
    def connected(self) -> frozenset[int]:
        """Neighbours that currently have an established, selected channel."""
        return frozenset(self._selected)

    @property
    def stats(self) -> dict[int, PeerStats]:
        """A snapshot of per-neighbour traffic counters."""
        return {p: dataclasses.replace(s) for p, s in self._stats.items()}

    @property
    def pending_handshakes(self) -> dict[str, int]:
        """Inbound connections in their handshake right now, by source address."""
        return {src: len(conns) for src, conns in self._pending.items()}

    @property
    def handshakes_evicted(self) -> int:
        """Pending inbound connections closed to make room (per-source share or global cap)."""
        return self._evicted

    @property
    def faults(self) -> LinkFaults | None:
        return self._faults

    def connection_count(self, peer: int) -> int:
        """Open authenticated connections with ``peer`` (1 once duplicates are resolved)."""
        return sum(1 for c in self._conns if c.peer == peer and not c.closed)

    def channel_endpoints(self, peer: int) -> tuple[tuple[str, int], tuple[str, int]] | None:
        """(local, remote) socket addresses of the channel to ``peer``, or None."""
        conn = self._selected.get(peer)
        if conn is None:
            return None
        local = conn.writer.get_extra_info("sockname")
        remote = conn.writer.get_extra_info("peername")
        return (tuple(local[:2]), tuple(remote[:2]))  # type: ignore[return-value]

    # ----------------------------------------------------------------- lifecycle

    async def start(self, sock: socket.socket | None = None) -> tuple[str, int]:
        """Listen for neighbours; return the bound ``(host, port)``.

        ``sock``: an already bound (and possibly listening) socket to serve on, e.g. one
        inherited from a launcher; otherwise ``addresses[node_id]`` is bound.
        """
        if self._server is not None:
            raise RuntimeError(f"node {self._node_id} is already listening")
        if self._closing:
            raise RuntimeError(f"node {self._node_id} is closed")
        if sock is not None:
            server = await asyncio.start_server(self._on_inbound, sock=sock, limit=STREAM_LIMIT)
        else:
            addr = self._addresses.get(self._node_id)
            if addr is None:
                raise ValueError(f"no listening address for node {self._node_id}")
            server = await asyncio.start_server(
                self._on_inbound, addr[0], addr[1], limit=STREAM_LIMIT, reuse_address=True
            )
        self._server = server
        name = server.sockets[0].getsockname()
        self._address = (name[0], name[1])
        log.info("node %d: listening on %s:%d", self._node_id, *self._address)
        if self._tick is not None:
            self._spawn(self._liveness())
        if self._faults is not None:
            self._faults.subscribe(self._on_faults_changed)
        return self._address

    async def connect(self, timeout: float) -> None:
        """Return once every neighbour has an authenticated channel.

        Dials every neighbour not yet connected (with back-off) while inbound connections keep
        being accepted. Raises :class:`PeerUnreachable` naming the missing neighbours and the
        last error for each if that does not happen within ``timeout`` seconds.
        """
        if self._server is None:
            raise RuntimeError("call start() before connect()")
        if self._closing:
            raise RuntimeError(f"node {self._node_id} is closed")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        todo = [p for p in sorted(self._neighbours) if p not in self._selected]
        if not todo:
            return
        errors = {p: "no connection attempt completed" for p in todo}
        tasks = [self._spawn(self._dial_loop(p, deadline, errors)) for p in todo]
        try:
            await asyncio.wait(tasks, timeout=max(0.0, timeout))
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        missing = {p: errors[p] for p in todo if p not in self._selected}
        if missing:
            raise PeerUnreachable(missing, timeout)

    async def send(self, peer: int, msg: Message, *, timeout: float | None = None) -> None:
        """Encrypt and write ``msg`` to ``peer``, waiting (at most ``timeout``, default
        ``send_timeout``) until the transport has taken it. Raises :class:`PeerGone` if there is
        no working channel (the channel is then closed and a :class:`PeerDown` emitted).

        With ``faults``, the message may be dropped, duplicated, corrupted or delayed, or lost
        to a blocked link; the call returns normally in every case (it does not wait for a
        delay)."""
        wait = self.send_now(peer, msg, timeout=timeout)
        if wait is not None:
            await wait

    def encode(self, msg: Message) -> list:
        """``msg``'s envelope as pieces (``wire.encode_parts``), for :meth:`send_now`'s
        ``parts`` when one message goes to several peers."""
        return encode_parts(msg)

    def writes_at_once(self, peer: int, parts: list) -> bool:
        """Whether :meth:`send_now` of the envelope ``parts`` to ``peer`` may hand bytes to the
        socket before it returns, instead of at the end of the event loop's turn (when the
        writes of the turn go out together): a connection whose writes of this turn would pass
        :data:`COALESCE` bytes, or one with injected faults (copies, corruption, delays).
        What a caller must have on record before anything it sends leaves (a peer's view log)
        it writes first only then; otherwise before it hands the loop back."""
        conn = self._selected.get(peer)
        if conn is None or conn.closed:
            return False  # send_now raises PeerGone: nothing is written
        faults = self._faults
        if (faults is not None and faults.declared_any) or conn.delayed:
            return True
        return conn.wbytes + sum(map(len, parts)) + HEADER_SIZE + TAG_SIZE >= COALESCE

    def send_now(
        self,
        peer: int,
        msg: Message,
        timeout: float | None = None,
        parts: list | None = None,
    ) -> Coroutine[Any, Any, None] | None:
        """What :meth:`send` does without waiting: encrypt and queue ``msg`` now, and return
        None when the socket takes it without waiting (the common case), or the coroutine that
        waits (at most ``timeout``) until it has, which the caller must await. Raises
        :class:`PeerGone` at once when there is no working channel. ``parts``: ``msg``
        already encoded (``wire.encode_parts(msg)``), for a message sent to several peers."""
        if peer not in self._neighbours:
            raise ValueError(f"node {peer} is not a neighbour of node {self._node_id}")
        conn = self._selected.get(peer)
        if conn is None or conn.closed:
            raise PeerGone(peer, self._last_reason.get(peer, "not connected"))
        if conn.transport.is_closing():  # lost, and the reader has not noticed yet
            self._drop(conn, "connection lost", graceful=False)
            raise PeerGone(peer, "connection lost")
        if parts is None:
            parts = encode_parts(msg)
        size = sum(map(len, parts))
        if size > self._max_frame - TAG_SIZE:
            raise WireError(
                f"encoded message is {size} bytes, over the limit {self._max_frame - TAG_SIZE}"
            )
        faults = self._faults
        if faults is None or not faults.declared_any:
            if faults is not None and faults.is_blocked(peer):  # a pulled cable: lost, silently
                faults.count_blocked()
                return None
            copies, corrupt, faults = 1, False, None
        elif faults.is_blocked(peer):  # the cable is pulled: the message is lost, silently
            faults.count_blocked()
            return None
        else:
            plan = faults.plan_send(peer)
            copies, corrupt = plan.copies, plan.corrupt
        for copy in range(copies):
            try:
                conn.channel.send_parts(parts, size)
            except ChannelError as exc:  # counter exhausted: this connection cannot send more
                self._drop(conn, str(exc), level=logging.WARNING, graceful=False)
                raise PeerGone(peer, str(exc)) from None
            if faults is None and not conn.delayed:
                out = conn.channel.take_output()  # header and body, not joined
                # (their sizes known: the frame's header, the payload and its tag)
                self._write(conn, out, HEADER_SIZE + size + TAG_SIZE if len(out) == 2 else -1)
            else:
                frame = conn.channel.data_to_send()
                if corrupt and copy == 0:
                    frame = self._corrupt(conn, peer, frame)
                self._write_frame(conn, frame, faults.delay_s if faults is not None else 0.0)
            self._stats[peer].frames_sent += 1
        if copies == 0 or not conn.transport.get_write_buffer_size():
            return None  # all handed to the kernel: nothing to wait for (the common case)
        return self._drain(conn, peer, self._send_timeout if timeout is None else timeout)

    async def _drain(self, conn: _Conn, peer: int, limit: float) -> None:
        try:
            async with asyncio.timeout(limit):
                await conn.writer.drain()
        except TimeoutError:
            reason = f"send did not drain within {limit:g} s (peer not reading)"
            self._drop(conn, reason, graceful=False)
            raise PeerGone(peer, reason) from None
        except OSError as exc:  # ConnectionResetError and friends: the connection is gone
            reason = f"{type(exc).__name__}: {exc}"
            self._drop(conn, reason, graceful=False)
            raise PeerGone(peer, reason) from None

    def ready_event(self) -> NetEvent | None:
        """The next event if one has already arrived (no waiting), else None."""
        return self._events.popleft() if self._events else None

    async def next_event(self, timeout: float) -> NetEvent | None:
        """The next :class:`Inbound` / :class:`PeerDown` / :class:`PeerUp`, or None after
        ``timeout`` seconds without one."""
        if self._events:
            return self._events.popleft()
        if timeout <= 0:
            return None
        return await self._events.get_within(timeout)

    async def idle(self, timeout: float, sink: Sink, after: After | None = None) -> Any:
        """Wait at most ``timeout`` seconds while ``sink(event)`` handles the events as they
        arrive, in a callback of their own (not in the reading task, nor in the transport's
        callback that decoded them), until it returns something other than None: that is
        returned, or None after the timeout. ``after()`` runs once the events that arrived
        together are taken. What they raise is raised here. The events that arrived before
        are handed to ``sink`` first. The cheap way to wait for a stream of events that mostly
        need no task (a peer's steps)."""
        return await self._events.idle(timeout, sink, after)

    async def close(self) -> None:
        """Close every connection, the listener and all background tasks. Idempotent."""
        if self._close_done is not None:
            await self._close_done.wait()
            return
        self._close_done = asyncio.Event()
        self._closing = True
        try:
            if self._server is not None:
                self._server.close()
            if self._faults is not None:
                self._faults.unsubscribe(self._on_faults_changed)
            for transports in self._parked.values():
                for transport in transports:
                    transport.abort()
            self._parked.clear()
            for conn in list(self._conns):
                self._drop(conn, "node shutting down", level=logging.DEBUG)
            tasks = list(self._tasks)
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=5.0)
            if self._server is not None:
                await self._bounded(self._server.wait_closed(), 1.0)
            writers = list(self._writers)
            self._writers.clear()
            for w in writers:
                if not await self._bounded(w.wait_closed(), 1.0):
                    w.transport.abort()
            log.info("node %d: network closed", self._node_id)
        finally:
            self._close_done.set()

    # ----------------------------------------------------------------- connections

    @staticmethod
    async def _bounded(aw: Coroutine[Any, Any, Any], timeout: float) -> bool:
        try:
            async with asyncio.timeout(timeout):
                await aw
            return True
        except TimeoutError:
            return False
        except Exception:  # wait_closed re-raises the connection's error; it is closed anyway
            return True

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "node %d: internal error in a network task",
                self._node_id,
                exc_info=task.exception(),
            )

    def _new_conn(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        peer: int | None,
    ) -> _Conn:
        channel = SecureChannel(
            local_id=self._node_id,
            static_key=self._static_key,
            roster_keys=self._roster,
            run_id=self._run_id,
            initiator=peer is not None,
            peer_id=peer,
            allowed_peers=self._neighbours,
            max_frame=self._max_frame,
            ciphers=self._suites,
        )
        conn = _Conn(
            next(self._cids), reader, writer, channel, asyncio.get_running_loop().create_future()
        )
        sock = writer.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            except (OSError, AttributeError):
                pass
        self._conns.add(conn)
        self._writers.add(writer)
        return conn

    def _on_inbound(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closing:
            writer.close()
            return
        conn = self._new_conn(reader, writer, peer=None)
        self._admit(conn)
        conn.task = self._spawn(self._run_conn(conn))

    # ----------------------------------------------------------------- pre-authentication bound

    def _source_share(self, source: str) -> int:
        """Pending handshakes allowed from ``source``: the per-source bound, plus one for each
        neighbour whose roster address is ``source`` (each has at most one dial in flight)."""
        now = time.monotonic()
        if now - self._hosts_at > 1.0:  # the address map may be filled in late: re-read it
            hosts: dict[str, int] = {}
            for p in self._neighbours:
                addr = self._addresses.get(p)
                if addr is not None:
                    host = _source_address(addr)
                    hosts[host] = hosts.get(host, 0) + 1
            self._neighbour_hosts, self._hosts_at = hosts, now
        return self._max_per_source + self._neighbour_hosts.get(source, 0)

    def _admit(self, conn: _Conn) -> None:
        """Count a new inbound connection among the pending handshakes, first closing the oldest
        pending connection of its source if the source is over its share, or of the busiest
        source if the node is at its global cap."""
        src = conn.source
        bucket = self._pending.get(src)
        if bucket is not None:
            share = self._source_share(src)
            while len(bucket) >= share:
                self._evict(next(iter(bucket)), f"source {src} exceeds its share of {share}")
                bucket = self._pending.get(src)
                if bucket is None:
                    break
        if self._pending_total >= self._max_pending:
            # The busiest source pays (ties: the one whose oldest connection is oldest, since
            # dicts keep insertion order and max() keeps the first maximum).
            busiest = max(self._pending, key=lambda k: len(self._pending[k]))
            self._evict(
                next(iter(self._pending[busiest])),
                f"{self._max_pending} handshakes pending (the cap); {busiest} holds the most",
            )
        self._pending.setdefault(src, {})[conn] = None
        self._pending_total += 1
        conn.pending = True

    def _unpend(self, conn: _Conn) -> None:
        if not conn.pending:
            return
        conn.pending = False
        self._pending_total -= 1
        bucket = self._pending.get(conn.source)
        if bucket is not None:
            bucket.pop(conn, None)
            if not bucket:
                del self._pending[conn.source]

    def _evict(self, conn: _Conn, why: str) -> None:
        self._unpend(conn)
        self._evicted += 1
        # One INFO line per source and minute; the rest at DEBUG (a flood must not flood logs).
        now = time.monotonic()
        last = self._evict_logged.get(conn.source)
        if last is None or now - last > 60.0:
            if len(self._evict_logged) > 1024:
                self._evict_logged.clear()
            self._evict_logged[conn.source] = now
            log.info(
                "node %d: %s: closing pending unauthenticated connections, oldest first "
                "(%d closed so far; further closes for this source are logged at DEBUG)",
                self._node_id,
                why,
                self._evicted,
            )
        self._drop(
            conn,
            f"closed to make room for new connections: {why}",
            level=logging.DEBUG,
            graceful=False,
        )

    # ----------------------------------------------------------------- a connection's life

    async def _run_conn(self, conn: _Conn) -> None:
        reason, level, graceful = "connection closed", logging.INFO, True
        try:
            try:
                await self._handshake(conn)
            finally:
                self._unpend(conn)
            self._on_established(conn)
            await self._read_loop(conn)
        except asyncio.CancelledError:
            reason, level = "cancelled", logging.DEBUG
            raise
        except _Drop as exc:
            reason, level = str(exc), exc.level
        except ChannelError as exc:
            reason, graceful = str(exc), False
            level = logging.WARNING
            if isinstance(exc, HandshakeError) and conn.channel.initiator:
                # Our own dial failing is reported through connect(); only impostors are loud.
                if not isinstance(exc, AuthenticationError):
                    level = logging.INFO
            elif isinstance(exc, HandshakeCut):
                # A caller that hung up before the handshake completed (port scans, health
                # probes, the orchestrator's readiness checks): it was accepted for nothing
                # and costs nothing, so it is no alarm in a healthy run.
                level = logging.DEBUG
        except WireError as exc:
            reason, level, graceful = f"malformed message: {exc}", logging.WARNING, False
        except TimeoutError as exc:
            reason, level, graceful = str(exc) or "timed out", logging.WARNING, False
            if not conn.channel.established:
                # Half-open strangers, or our own dial across a cut link (reported through
                # connect() and the redial): routine, not an alarm.
                level = logging.INFO
        except OSError as exc:
            reason, level = f"{type(exc).__name__}: {exc}", logging.INFO
        except Exception as exc:  # a bug: close the connection, let _task_done log the trace
            reason, level, graceful = f"internal error: {exc!r}", logging.ERROR, False
            raise
        finally:
            self._drop(conn, reason, level=level, graceful=graceful)
            if not self._closing:
                self._writers.discard(conn.writer)

    def _blocked(self, conn: _Conn) -> bool:
        """Fault injection: is the node at the other end (authenticated, dialled or claimed in
        the first message) cut off right now?"""
        faults = self._faults
        if faults is None or not faults.blocked:
            return False
        peer = conn.peer if conn.peer is not None else conn.channel.peer_id
        return faults.is_blocked(peer)

    def _share(self, conn: _Conn) -> None:
        """Let an established channel read from its stream's own buffer (asyncio's
        ``StreamReader`` keeps the arrived bytes in a bytearray it only appends to and cuts from
        the front): every byte is then copied once, from the socket into that buffer."""
        buf = getattr(conn.reader, "_buffer", None)
        if type(buf) is bytearray and not conn.channel.mid_frame:
            conn.channel.share_buffer(buf)
            conn.shared = True
            conn.seen = 0

    async def _read_shared(self, conn: _Conn, timeout: float | None, what: str) -> None:
        """:meth:`_read` for a channel that shares the stream's buffer (:meth:`_share`)."""
        ch, reader = conn.channel, conn.reader
        buf = reader._buffer
        n = ch.bytes_needed()
        try:
            if n > 0 or len(buf) == conn.seen:  # nothing complete to decode yet: wait
                if reader._exception is not None:
                    raise reader._exception
                if reader._eof:
                    raise asyncio.IncompleteReadError(b"", n)
                if timeout is None:  # between frames: no deadline to arm
                    await reader._wait_for_data("read")
                else:
                    async with asyncio.timeout(timeout):
                        await reader._wait_for_data("read")
                if len(buf) == conn.seen:
                    if reader._exception is not None:
                        raise reader._exception
                    raise asyncio.IncompleteReadError(b"", n)  # woken by the end of stream
        except TimeoutError:
            raise TimeoutError(f"{what} not received within {timeout:g} s") from None
        except (asyncio.IncompleteReadError, ConnectionError):
            await self._end_of_stream(conn, timeout, what)
        if conn.closed:
            raise _Drop("connection closed", logging.DEBUG)
        self._consume(conn)

    def _consume(self, conn: _Conn) -> None:
        """Take what arrived in a shared buffer beyond what was seen (:meth:`_take`)."""
        reader = conn.reader

        def receive(_n: int) -> list[Event]:
            events = conn.channel.receive_buffered()
            conn.seen = len(reader._buffer)
            reader._maybe_resume_transport()
            return events

        self._take(conn, len(reader._buffer) - conn.seen, receive)

    def _take(self, conn: _Conn, n: int, receive: Callable[[int], list[Event]]) -> None:
        """Take ``n`` bytes that arrived: count them (as life, unless the link is cut), decode
        the frames they complete (``receive(n)``, the channel's), dispatch their events,
        those of a frame that failed included."""
        self._count_rx(conn, n)
        if not self._blocked(conn):
            conn.last_rx = time.monotonic()
        try:
            events = receive(n)
        except ChannelError as exc:
            for ev in exc.events:
                self._dispatch(conn, ev)
            raise
        for ev in events:
            self._dispatch(conn, ev)

    async def _read_direct(self, conn: _Conn) -> None:
        """The reading of a selected channel: its stream's protocol is replaced by a buffered
        one (:class:`_FrameReader`) that reads straight into the channel's own buffer, and every
        arrival is decrypted, decoded and dispatched in that protocol's callback, without a
        turn of this task (one task switch and two copies of every byte less than a stream
        reader). The task waits for the end of the stream, a failure in the callback (raised
        here, so the connection ends as any read's failure ends it) and, while a frame is
        part-way in, its deadline. Returns only by raising."""
        loop = asyncio.get_running_loop()
        reader, ch = conn.reader, conn.channel
        transport = conn.writer.transport
        feed_eof, set_exception = reader.feed_eof, reader.set_exception
        discard: bytearray | None = None  # room for bytes that arrive after a failure

        def wake() -> None:
            w = conn.wake
            if w is not None and not w.done():
                w.set_result(None)

        def get_buffer(sizehint: int) -> memoryview | bytearray:
            nonlocal discard
            if conn.closed or conn.failure is not None or ch.closed:
                if discard is None:
                    discard = bytearray(RECV_ROOM)
                return discard
            return ch.receive_space()

        def buffer_updated(n: int) -> None:
            if conn.closed or conn.failure is not None or ch.closed:
                return
            try:
                self._take(conn, n, ch.receive_into)
            except BaseException as exc:  # raised by the task, as a read's failure
                conn.failure = exc
                wake()
                return
            if not ch.mid_frame:
                conn.frame_deadline = None
            elif self._arm_frame_deadline(conn):
                wake()  # to arm its timer

        def on_eof() -> None:
            feed_eof()
            wake()

        def on_exception(exc: BaseException) -> None:
            set_exception(exc)
            wake()

        # The stream's protocol still ends the stream (eof_received, connection_lost: the
        # reader's end, which wakes this task) and paces the writer; reading goes to the channel.
        reader.feed_eof, reader.set_exception = on_eof, on_exception
        try:
            if len(reader._buffer) > conn.seen and not conn.closed:
                self._consume(conn)  # what arrived before this mode began
            if not (conn.closed or ch.closed or transport.is_closing()):
                ch.own_buffer()  # the bytes of a frame part-way in move with it
                del reader._buffer[:]
                conn.seen = 0
                inner = transport.get_protocol()
                transport.set_protocol(_FrameReader(inner, get_buffer, buffer_updated))
                if reader._paused:  # paused by the stream's limit: the channel reads on
                    reader._paused = False
                    transport.resume_reading()
            while True:
                conn.wake = loop.create_future()
                if conn.failure is not None:
                    exc, conn.failure = conn.failure, None
                    raise exc
                if conn.closed:
                    raise _Drop("connection closed", logging.DEBUG)
                timeout = self._frame_time_left(conn)
                if reader._exception is not None or reader._eof:
                    what = "frame" if timeout is None else "rest of the frame"
                    await self._end_of_stream(conn, timeout, what)
                if timeout is None:
                    await conn.wake
                else:
                    try:
                        async with asyncio.timeout(timeout):
                            await conn.wake
                    except TimeoutError:
                        pass  # checked at the top
        finally:
            conn.wake = None
            del reader.feed_eof, reader.set_exception

    async def _end_of_stream(self, conn: _Conn, timeout: float | None, what: str) -> None:
        """The stream of a channel that reads from the stream's buffer or its own ended (closed
        or failed): raise what a read raises then (a cut frame, the connection error, or the
        end), after staying quiet while the link is blocked by fault injection (a pulled cable
        carries no close either), at most ``timeout``."""
        reader = conn.reader
        if self._blocked(conn):
            await self._quiet_while_blocked(conn, timeout, what)
        if reader._exception is not None:
            raise reader._exception
        conn.channel.receive_eof()  # raises if the close cut a frame short (its bytes are in buf)
        raise _Drop("connection closed by peer", logging.INFO) from None

    async def _read(self, conn: _Conn, timeout: float | None, what: str) -> None:
        """Read what the channel needs next and feed it; dispatch resulting events.

        Once the channel is established, whatever has arrived is taken at once (every frame
        it completes is dispatched; a large frame's progress counts as life); handshake
        messages are read exactly.
        """
        if conn.shared:
            await self._read_shared(conn, timeout, what)
            return
        ch = conn.channel
        n = ch.bytes_needed()
        try:
            if ch.established:
                if timeout is None:  # between frames: no deadline to arm
                    data = await conn.reader.read(max(n, CHUNK))
                else:
                    async with asyncio.timeout(timeout):
                        data = await conn.reader.read(max(n, CHUNK))
                if not data:
                    raise asyncio.IncompleteReadError(b"", n)
            else:
                async with asyncio.timeout(timeout):
                    data = await conn.reader.readexactly(n)
        except TimeoutError:
            raise TimeoutError(f"{what} not received within {timeout:g} s") from None
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            if self._blocked(conn):
                # A close from a node cut off by fault injection cannot cross the pulled cable:
                # stay quiet until the link is unblocked, the silence detector ends this, or the
                # read's deadline passes.
                await self._quiet_while_blocked(conn, timeout, what)
            if isinstance(exc, ConnectionError):
                raise
            self._count_rx(conn, len(exc.partial))
            if exc.partial:
                self._feed(conn, exc.partial)
            ch.receive_eof()  # raises if the close cut a handshake or frame short
            raise _Drop("connection closed by peer", logging.INFO) from None
        if conn.closed:
            raise _Drop("connection closed", logging.DEBUG)
        self._count_rx(conn, len(data))
        if not self._blocked(conn):
            conn.last_rx = time.monotonic()
        self._feed(conn, data)

    async def _quiet_while_blocked(self, conn: _Conn, timeout: float | None, what: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self._blocked(conn) and not conn.closed:
            if deadline is not None and loop.time() >= deadline:
                raise TimeoutError(f"{what} not received within {timeout:g} s")
            await asyncio.sleep(0.05)

    def _feed(self, conn: _Conn, data: bytes) -> None:
        ch = conn.channel
        try:
            events = ch.receive_data(data)
        except ChannelError as exc:
            for ev in exc.events:
                self._dispatch(conn, ev)
            raise
        out = ch.data_to_send()
        if out:
            self._write_handshake(conn, out)
        for ev in events:
            self._dispatch(conn, ev)

    def _write_handshake(self, conn: _Conn, data: bytes) -> None:
        if self._blocked(conn):  # a pulled cable: the handshake will time out
            conn.hs_suppressed = True
            self._faults.count_blocked()  # type: ignore[union-attr]
            return
        self._write(conn, data)

    async def _handshake(self, conn: _Conn) -> None:
        ch = conn.channel
        if ch.initiator:
            ch.start()
            self._write_handshake(conn, ch.data_to_send())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._handshake_timeout
        while not ch.established:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(
                    f"handshake did not complete within {self._handshake_timeout:g} s"
                )
            await self._read(conn, remaining, "handshake message")

    def _on_established(self, conn: _Conn) -> None:
        peer = conn.channel.peer_id
        assert peer is not None and peer in self._neighbours
        conn.peer = peer
        conn.counted = True
        stats = self._stats[peer]
        stats.bytes_sent += conn.tx
        stats.bytes_received += conn.rx
        if self._closing:
            raise _Drop("node shutting down", logging.DEBUG)
        action = dup_dial_action(self._node_id, peer, edge_has_connection=peer in self._selected)
        if action is DupAction.DROP:
            raise _Drop(f"duplicate of the existing channel to node {peer}", logging.DEBUG)
        if action is DupAction.SELECT:
            self._send_control(conn, SELECT)
            self._adopt(conn)
        else:
            conn.select_deadline = asyncio.get_running_loop().time() + self._handshake_timeout
            log.debug("node %d: %s authenticated, awaiting selection", self._node_id, conn.label)

    async def _read_loop(self, conn: _Conn) -> None:
        loop = asyncio.get_running_loop()
        self._share(conn)
        while True:
            if not conn.selected:
                remaining = conn.select_deadline - loop.time()
                if remaining <= 0:
                    raise _Drop(
                        f"node {conn.peer} did not select this connection within "
                        f"{self._handshake_timeout:g} s",
                        logging.INFO,
                    )
                await self._read(conn, remaining, "selection by the edge leader")
            elif conn.shared:
                await self._read_direct(conn)
            else:
                left = self._frame_time_left(conn)
                await self._read(conn, left, "frame" if left is None else "rest of the frame")

    def _arm_frame_deadline(self, conn: _Conn) -> bool:
        """Give the frame part-way in its deadline, ``io_timeout`` from now, unless it has one:
        a frame that began after the last one armed (in the same read as that one's end) gets
        its own. True if no deadline was armed before (the task has no timer yet)."""
        fresh = conn.frame_deadline is None
        seq = conn.channel.frames_received
        if fresh or conn.deadline_seq != seq:
            conn.frame_deadline = asyncio.get_running_loop().time() + self._io_timeout
            conn.deadline_seq = seq
        return fresh

    def _frame_time_left(self, conn: _Conn) -> float | None:
        """While a frame is part-way in, the time left until its deadline (armed at its first
        bytes: the rest is due within ``io_timeout``), or TimeoutError once it has passed; None
        between frames, when nothing is due."""
        if not conn.channel.mid_frame:
            conn.frame_deadline = None
            return None
        self._arm_frame_deadline(conn)
        assert conn.frame_deadline is not None
        left = conn.frame_deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise TimeoutError(f"rest of the frame not received within {self._io_timeout:g} s")
        return left

    def _dispatch(self, conn: _Conn, ev: Event) -> None:
        peer = conn.peer
        if isinstance(ev, _FRAMES) and self._blocked(conn):
            self._faults.count_blocked()  # type: ignore[union-attr]  # the cable is pulled
            return
        if isinstance(ev, MessageReceived):
            if not conn.selected:
                raise _Drop(f"node {peer} sent data on a connection it had not selected")
            assert peer is not None
            msg = decode_message(ev.payload, max_size=self._max_frame)
            self._stats[peer].frames_received += 1
            if self._selected.get(peer) is conn and not self._closing:
                self._events.put(Inbound(peer, msg))
        elif isinstance(ev, ControlReceived):
            assert peer is not None
            if ev.payload == HEARTBEAT:
                self._stats[peer].heartbeats_received += 1
            elif ev.payload == SELECT and edge_leader(self._node_id, peer) == peer:
                self._adopt(conn)
            else:
                raise _Drop(f"unexpected control frame {ev.payload[:32]!r} from node {peer}")
        # HandshakeComplete: handled by _handshake's loop condition.

    def _adopt(self, conn: _Conn) -> None:
        peer = conn.peer
        assert peer is not None
        old = self._selected.get(peer)
        if old is conn:
            return
        if old is not None:
            del self._selected[peer]
            self._peer_down(peer, "replaced by a new connection chosen by the peer")
            self._drop(old, "replaced by a new connection", level=logging.INFO)
        self._selected[peer] = conn
        conn.selected = True
        conn.last_rx = time.monotonic()  # the silence clock starts now
        conn.suspect = False
        self._stats[peer].connections += 1
        self._up[peer].set()
        if not conn.settled.done():
            conn.settled.set_result(None)
        log.info("node %d: channel to node %d up (%s)", self._node_id, peer, conn.label)
        if peer in self._down_reported:
            self._down_reported.discard(peer)
            if not self._closing:
                self._events.put(PeerUp(peer))

    def _peer_down(self, peer: int, reason: str, level: int = logging.WARNING) -> None:
        self._up[peer].clear()
        self._last_reason[peer] = reason
        if self._closing:
            return
        log.log(level, "node %d: channel to node %d down: %s", self._node_id, peer, reason)
        self._down_reported.add(peer)
        self._events.put(PeerDown(peer, reason))
        self._start_redial(peer)

    def _start_redial(self, peer: int) -> None:
        if (
            self._reconnect
            and not self._closing
            and edge_leader(self._node_id, peer) == self._node_id
            and peer not in self._redials
            and peer not in self._selected
        ):
            task = self._spawn(self._redial(peer))
            self._redials[peer] = task
            task.add_done_callback(lambda _t: self._redials.pop(peer, None))

    def _drop(
        self, conn: _Conn, reason: str, *, level: int = logging.INFO, graceful: bool = True
    ) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._unpend(conn)
        self._conns.discard(conn)
        conn.channel.close(reason)
        if conn.delay_handle is not None:
            conn.delay_handle.cancel()
            conn.delay_handle = None
        conn.delayed = None
        if conn.corrupted is not None and "authentication" not in reason:
            reason = (
                f"{reason} (after fault injection flipped a bit of data frame {conn.corrupted}, "
                "which fails the peer's authentication check)"
            )
        transport = conn.writer.transport
        if self._blocked(conn) and not self._closing:
            # A pulled cable carries no FIN or RST either: keep the socket open, unread, until
            # the link is unblocked (or the node closes).
            peer = conn.peer if conn.peer is not None else conn.channel.peer_id
            assert peer is not None
            transport.pause_reading()
            self._parked.setdefault(peer, []).append(transport)
            self._writers.discard(conn.writer)
            if conn.task is not None and conn.task is not asyncio.current_task():
                conn.task.cancel()
        elif graceful and not transport.is_closing():
            self._flush(conn)  # what was written before the close goes out before it
            conn.writer.close()
        elif not graceful:
            transport.abort()  # do not flush anything to a misbehaving peer
        peer = conn.peer
        if peer is not None and self._selected.get(peer) is conn:
            del self._selected[peer]
            self._peer_down(peer, reason, max(level, logging.INFO))
        else:
            log.log(level, "node %d: closed %s: %s", self._node_id, conn.label, reason)
        if not conn.settled.done():
            conn.settled.set_result(reason)
        if conn.wake is not None and not conn.wake.done():
            conn.wake.set_result(None)  # a directly read channel's task ends at once

    # ----------------------------------------------------------------- writing

    def _write(self, conn: _Conn, data: bytes | list[bytes], size: int = -1) -> None:
        """Queue ``data`` (bytes, or a list of byte strings sent back to back; ``size`` their
        bytes, when the caller knows them) for ``conn``.

        Writes made in the same turn of the event loop are coalesced: they reach the socket
        together, in order, when the turn ends, or as the callback that takes the node's events
        ends when they were made there (:meth:`_end_of_events`), or at once past
        :data:`COALESCE` bytes."""
        if conn.closed:
            return
        parts = data if isinstance(data, list) else [data]
        if size < 0:
            size = sum(map(len, parts))
        if not size:
            return
        if conn.wbuf is None:
            conn.wbuf = parts
            turn = self._turn
            if not turn and not self._events.in_sink:  # (else flushed as the events end)
                self._schedule_turn()
            turn.append(conn)
        else:
            conn.wbuf.extend(parts)
        conn.wbytes += size
        if conn.wbytes >= COALESCE:
            self._flush(conn)
        conn.last_tx = time.monotonic()
        if conn.counted and conn.peer is not None:
            self._stats[conn.peer].bytes_sent += size
        else:
            conn.tx += size

    def _flush(self, conn: _Conn) -> None:
        """Hand the coalesced writes of ``conn`` to its socket."""
        parts = conn.wbuf
        if not parts:
            return
        conn.wbuf, conn.wbytes = [], 0  # [] (not None): the scheduled flush is still to come
        if conn.transport.is_closing():
            return
        if len(parts) == 1:
            conn.writer.write(parts[0])
        else:
            conn.writer.writelines(parts)

    def _schedule_turn(self) -> None:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        loop.call_soon(self._flush_turn)

    def _end_of_events(self, ok: bool) -> None:
        """The events of a callback are taken (:meth:`_EventQueue.end`): the writes they made
        go to their sockets now, after what the taker holds (its view log's records) was
        handed on; after a failure, at the end of the turn, as any other write."""
        if not self._turn:
            return
        if not ok:
            self._schedule_turn()
            return
        try:
            self._flush_turn()
        except Exception as exc:  # as it would be from a callback of its own
            asyncio.get_running_loop().call_exception_handler(
                {"message": "failed to hand a turn's writes to their sockets", "exception": exc}
            )

    def _flush_turn(self) -> None:
        """The end of a turn: hand every connection's coalesced writes to its socket, in the
        order the connections were first written to (one callback for all of them)."""
        conns, self._turn = self._turn, []
        failure = None
        for conn in conns:
            try:
                self._flush(conn)
            except Exception as exc:  # the others are still flushed; the first is raised
                failure = failure if failure is not None else exc
            finally:
                conn.wbuf = None
        if failure is not None:
            raise failure

    def _send_control(self, conn: _Conn, payload: bytes) -> bool:
        """Encrypt and write one control frame (behind any delayed data); False if it could
        not go out (blocked link, dead channel)."""
        if conn.closed or conn.transport.is_closing():
            return False
        if self._blocked(conn):
            self._faults.count_blocked()  # type: ignore[union-attr]
            return False
        try:
            conn.channel.send_control(payload)
        except ChannelError as exc:
            self._drop(conn, str(exc), level=logging.WARNING, graceful=False)
            return False
        self._write_frame(conn, conn.channel.data_to_send(), 0.0)
        return True

    def _write_frame(self, conn: _Conn, frame: bytes, delay: float) -> None:
        """Write an encrypted frame after ``delay`` seconds, never ahead of an earlier one."""
        queue = conn.delayed
        if not queue and delay <= 0:
            self._write(conn, frame)
            return
        now = time.monotonic()
        due = now + delay
        if queue:
            due = max(due, queue[-1][0])  # frames leave in sequence order
        else:
            queue = conn.delayed = deque()
        queue.append((due, frame))
        if conn.delay_handle is None:
            self._schedule_flush(conn)

    def _schedule_flush(self, conn: _Conn) -> None:
        assert conn.delayed
        loop = asyncio.get_running_loop()
        wait = max(0.0, conn.delayed[0][0] - time.monotonic())
        conn.delay_handle = loop.call_later(wait, self._flush_delayed, conn)

    def _flush_delayed(self, conn: _Conn) -> None:
        conn.delay_handle = None
        queue = conn.delayed
        if conn.closed or not queue:
            return
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            self._write(conn, queue.popleft()[1])
        if queue:
            self._schedule_flush(conn)

    def _corrupt(self, conn: _Conn, peer: int, frame: bytes) -> bytes:
        """Flip one bit of the ciphertext or tag (never the header, so the frame boundaries
        hold and the receiver's authentication check is what fails)."""
        assert self._faults is not None
        bits = (len(frame) - HEADER_SIZE) * 8
        bit = HEADER_SIZE * 8 + self._faults.corrupt_bit(peer, bits)
        out = bytearray(frame)
        out[bit // 8] ^= 1 << (bit % 8)
        if conn.corrupted is None:
            conn.corrupted = conn.channel.frames_sent - 1
        return bytes(out)

    def _count_rx(self, conn: _Conn, n: int) -> None:
        if conn.counted and conn.peer is not None:
            self._stats[conn.peer].bytes_received += n
        else:
            conn.rx += n

    # ----------------------------------------------------------------- liveness

    async def _liveness(self) -> None:
        """Send heartbeats on idle channels and close silent ones, every tick."""
        assert self._tick is not None
        heartbeat, silence = self._heartbeat_s, self._silence_s
        while not self._closing:
            await asyncio.sleep(self._tick)
            now = time.monotonic()
            for peer, conn in list(self._selected.items()):
                if conn.closed:
                    continue
                if heartbeat is not None and now - conn.last_tx >= heartbeat:
                    if self._send_control(conn, HEARTBEAT):
                        self._stats[peer].heartbeats_sent += 1
                if silence is None:
                    continue
                quiet = now - conn.last_rx
                if quiet < silence:
                    conn.suspect = False
                elif not conn.suspect:
                    # Judge at the next tick: if this node's own loop was blocked, what arrived
                    # meanwhile is still in the socket, and the reader needs a turn first.
                    conn.suspect = True
                else:
                    self._drop(conn, silence_reason(quiet), level=logging.WARNING, graceful=False)

    # ----------------------------------------------------------------- fault injection

    def _on_faults_changed(self, peers: frozenset[int], blocked: bool) -> None:
        if blocked or self._closing:
            return
        for peer in peers & self._neighbours:
            for transport in self._parked.pop(peer, []):
                transport.abort()
            # Handshakes whose bytes were withheld cannot complete: end them now so the dial
            # loop retries at once rather than after the handshake timeout.
            for conn in list(self._conns):
                if conn.hs_suppressed and not conn.channel.established:
                    if conn.channel.peer_id == peer:
                        self._drop(
                            conn,
                            "handshake messages were lost while the link was blocked",
                            level=logging.DEBUG,
                            graceful=False,
                        )
            if peer in self._down_reported:
                self._start_redial(peer)

    # ----------------------------------------------------------------- dialling

    async def _dial_once(self, peer: int, budget: float) -> str | None:
        """One attempt; None once a channel to ``peer`` is selected, else the failure reason."""
        self._stats[peer].dial_attempts += 1
        addr = self._addresses.get(peer)
        if addr is None:
            return f"no address known for node {peer}"
        host, port = addr
        try:
            async with asyncio.timeout(min(budget, self._handshake_timeout)):
                reader, writer = await asyncio.open_connection(host, port, limit=STREAM_LIMIT)
        except TimeoutError:
            return f"connecting to {host}:{port} timed out"
        except OSError as exc:
            why = os.strerror(exc.errno) if exc.errno else str(exc)
            return f"connecting to {host}:{port} failed: {why}"
        if self._closing:
            writer.close()
            return "node shutting down"
        conn = self._new_conn(reader, writer, peer=peer)
        conn.task = self._spawn(self._run_conn(conn))
        try:
            result = await asyncio.shield(conn.settled)
        except asyncio.CancelledError:
            if not conn.selected:
                self._drop(conn, "dial abandoned", level=logging.DEBUG)
            raise
        return None if result is None else f"{host}:{port}: {result}"

    async def _dial_loop(self, peer: int, deadline: float, errors: dict[int, str]) -> None:
        loop = asyncio.get_running_loop()
        up = self._up[peer]
        delay = self._backoff_initial
        while not up.is_set() and not self._closing:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            attempt = asyncio.ensure_future(self._dial_once(peer, remaining))
            waiter = asyncio.ensure_future(up.wait())
            try:
                await asyncio.wait(
                    {attempt, waiter}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for t in (attempt, waiter):
                    t.cancel()
                await asyncio.gather(attempt, waiter, return_exceptions=True)
            if up.is_set():
                return
            if attempt.cancelled():
                errors[peer] = "connection attempt did not finish before the deadline"
            elif attempt.exception() is not None:
                exc = attempt.exception()
                errors[peer] = f"internal error: {type(exc).__name__}: {exc}"
                log.error("node %d: dialling node %d failed", self._node_id, peer, exc_info=exc)
            elif attempt.result() is not None:
                errors[peer] = attempt.result()
                log.debug("node %d: dial to node %d: %s", self._node_id, peer, errors[peer])
            pause = min(delay * self._rng.uniform(0.5, 1.0), deadline - loop.time())
            if pause > 0:
                try:
                    async with asyncio.timeout(pause):
                        await up.wait()
                    return
                except TimeoutError:
                    pass
            delay = min(delay * 2, self._backoff_max)

    async def _redial(self, peer: int) -> None:
        loop = asyncio.get_running_loop()
        errors = {peer: "no connection attempt completed"}
        await self._dial_loop(peer, loop.time() + self._reconnect_timeout, errors)
        if not self._up[peer].is_set() and not self._closing:
            log.warning(
                "node %d: gave up reconnecting to node %d after %g s: %s",
                self._node_id,
                peer,
                self._reconnect_timeout,
                errors[peer],
            )
