"""PeerNet over real loopback TCP: connecting, dup-dials, late and missing peers, refusals,
failures mid-stream, PeerDown/PeerUp, clean shutdown.

Every node binds 127.0.0.1 port 0 through a pre-bound socket; waits are on events or on
conditions polled under a deadline, never fixed sleeps.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time

import numpy as np
import pytest
from asyncnet import bound_socket, next_of, wait_until
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from coordinator_free.net.channel import ControlReceived, SecureChannel
from coordinator_free.net.transport import (
    HEARTBEAT,
    SELECT,
    Inbound,
    PeerDown,
    PeerGone,
    PeerNet,
    PeerUnreachable,
    PeerUp,
)
from coordinator_free.net.wire import Message, decode_message, encode_message

RUN = b"transport-test-run"
N = 6
KEYS = {i: X25519PrivateKey.generate() for i in range(N)}
ROSTER = {i: k.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw) for i, k in KEYS.items()}


class Cluster:
    """Nodes with pre-bound sockets and a shared address map; closes everything on teardown."""

    def __init__(self) -> None:
        self.addresses: dict[int, tuple[str, int]] = {}
        self.socks: dict[int, socket.socket] = {}
        self.nets: list[PeerNet] = []

    def add(self, node: int, neighbours, *, key=None, roster=None, bind=True, **kw) -> PeerNet:
        if bind and node not in self.socks:
            sock = bound_socket()
            self.socks[node] = sock
            self.addresses[node] = sock.getsockname()
        kw.setdefault("handshake_timeout", 2.0)
        net = PeerNet(
            node_id=node,
            static_key=key or KEYS[node],
            roster_keys=roster or ROSTER,
            addresses=self.addresses,
            run_id=RUN,
            neighbours=neighbours,
            **kw,
        )
        self.nets.append(net)
        return net

    async def start(self, net: PeerNet) -> None:
        await net.start(self.socks[net.node_id])

    async def close(self) -> None:
        await asyncio.gather(*(net.close() for net in self.nets))
        for sock in self.socks.values():
            sock.close()


@pytest.fixture
async def cluster():
    c = Cluster()
    try:
        yield c
    finally:
        await c.close()


def graph(edges) -> dict[int, set[int]]:
    adj: dict[int, set[int]] = {}
    for a, b in edges:
        adj.setdefault(a, set()).add(b)
        adj.setdefault(b, set()).add(a)
    return adj


async def build(cluster: Cluster, edges, **kw) -> dict[int, PeerNet]:
    adj = graph(edges)
    nets = {i: cluster.add(i, sorted(nbrs), **kw) for i, nbrs in sorted(adj.items())}
    for net in nets.values():
        await cluster.start(net)
    await asyncio.gather(*(net.connect(5.0) for net in nets.values()))
    return nets


def assert_one_channel_per_edge(nets: dict[int, PeerNet], edges) -> None:
    for a, b in edges:
        assert nets[a].connection_count(b) == 1, (a, b)
        assert nets[b].connection_count(a) == 1, (b, a)
        local_a, remote_a = nets[a].channel_endpoints(b)
        local_b, remote_b = nets[b].channel_endpoints(a)
        assert (local_a, remote_a) == (remote_b, local_b)  # the same TCP connection


# --------------------------------------------------------------------------- connect + exchange


async def exchange_all(nets: dict[int, PeerNet], step: int = 0) -> None:
    for i, net in nets.items():
        for j in sorted(net.neighbours):
            payload = np.array([i, j, step], dtype=np.float64)
            await net.send(j, Message("value", round=1, step=step, payload=payload, meta={"f": i}))
    for i, net in nets.items():
        got = {}
        for _ in net.neighbours:
            ev = await next_of(net, Inbound)
            got[ev.peer] = ev.message
        assert set(got) == set(net.neighbours)
        for j, msg in got.items():
            assert msg.kind == "value" and msg.step == step and msg.meta == {"f": j}
            assert np.array_equal(msg.payload, [j, i, step])


EDGES4 = [(0, 1), (1, 2), (2, 3), (3, 0), (0, 2)]


async def test_four_nodes_connect_and_exchange(cluster):
    nets = await build(cluster, EDGES4)
    await wait_until(
        lambda: all(n.connection_count(p) == 1 for n in nets.values() for p in n.neighbours)
    )
    assert_one_channel_per_edge(nets, EDGES4)
    for step in range(3):
        await exchange_all(nets, step)
    for net in nets.values():
        assert net.connected == net.neighbours
        stats = net.stats
        assert set(stats) == net.neighbours
        for s in stats.values():
            assert s.frames_sent == 3 and s.frames_received == 3
            assert s.bytes_sent > 3 * 24 and s.bytes_received > 3 * 24
            assert s.connections == 1
    assert await nets[0].next_event(0.01) is None  # nothing else happened (no spurious PeerDown)


async def test_messages_arrive_in_order_and_large_payload(cluster):
    nets = await build(cluster, [(0, 1)])
    big = np.random.default_rng(3).standard_normal(1 << 20)  # 8 MiB
    for k in range(20):
        await nets[0].send(1, Message("value", 0, k))
    await nets[0].send(1, Message("value", 0, 20, payload=big))
    for k in range(20):
        assert (await next_of(nets[1], Inbound)).message.step == k
    ev = await next_of(nets[1], Inbound)
    assert ev.message.step == 20 and np.array_equal(ev.message.payload, big)


async def test_simultaneous_dial_leaves_one_channel_per_edge(cluster, caplog):
    caplog.set_level(logging.DEBUG, logger="coordinator_free.net")
    edges = [(0, 1), (1, 2), (0, 2)]
    for _ in range(5):  # several rounds to hit different interleavings
        c = Cluster()
        try:
            nets = await build(c, edges)
            # Duplicates are closed right after the handshake; wait for the teardown to finish.
            await wait_until(
                lambda nets=nets: all(
                    n.connection_count(p) == 1 for n in nets.values() for p in n.neighbours
                )
            )
            assert_one_channel_per_edge(nets, edges)
            attempts = sum(s.dial_attempts for n in nets.values() for s in n.stats.values())
            assert attempts >= len(edges)  # both ends dialled
            await exchange_all(nets)
            for net in nets.values():
                assert await net.next_event(0) is None
        finally:
            await c.close()
    # Both ends really did dial: the edge leaders closed the surplus connections.
    assert any("duplicate of the existing channel" in r.getMessage() for r in caplog.records)


async def test_late_peer_is_reached(cluster):
    a = cluster.add(0, [1])
    b = cluster.add(1, [0])  # bound but not listening yet: a's dials are refused
    await cluster.start(a)
    t0 = time.monotonic()
    connecting = asyncio.create_task(a.connect(5.0))
    await wait_until(lambda: a.stats[1].dial_attempts >= 3)
    assert not connecting.done()
    await cluster.start(b)
    await asyncio.gather(connecting, b.connect(5.0))
    assert time.monotonic() - t0 < 5.0
    await a.send(1, Message("done", 0, 0))
    assert (await next_of(b, Inbound)).message.kind == "done"


async def test_unreachable_neighbour_is_named(cluster):
    a = cluster.add(0, [1, 2])
    c = cluster.add(2, [0])
    cluster.add(1, [0])  # never started
    await cluster.start(a)
    await cluster.start(c)
    c_connect = asyncio.create_task(c.connect(5.0))
    t0 = time.monotonic()
    with pytest.raises(PeerUnreachable) as err:
        await a.connect(0.6)
    elapsed = time.monotonic() - t0
    assert 0.5 < elapsed < 1.5
    assert err.value.missing == [1]
    assert "refused" in err.value.errors[1].lower()
    assert "node 1" in str(err.value)
    await c_connect
    assert a.connected == {2}
    await a.send(2, Message("value", 0, 0))
    assert (await next_of(c, Inbound)).peer == 0


async def test_unreachable_without_address(cluster):
    a = cluster.add(0, [5])
    await cluster.start(a)
    with pytest.raises(PeerUnreachable, match="no address known for node 5"):
        await a.connect(0.2)


# --------------------------------------------------------------------------- refusals


async def test_impostor_is_refused_and_good_channels_keep_working(cluster, caplog):
    caplog.set_level(logging.INFO, logger="coordinator_free.net")
    nets = await build(cluster, [(0, 1), (0, 2)])
    fake = X25519PrivateKey.generate()
    fake_pub = fake.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    # Claims to be node 1 (connected right now) but holds another key.
    impostor = cluster.add(
        1, [0], key=fake, roster={**ROSTER, 1: fake_pub}, bind=False, reconnect=False
    )
    impostor_sock = bound_socket()
    try:
        await impostor.start(impostor_sock)
        with pytest.raises(PeerUnreachable) as err:
            await impostor.connect(0.3)
        assert err.value.missing == [0]
    finally:
        await impostor.close()
        impostor_sock.close()
    assert any("claiming node 1 did not prove" in r.getMessage() for r in caplog.records)
    assert nets[0].connected == {1, 2}
    assert nets[0].connection_count(1) == 1
    await exchange_all(nets)
    assert await nets[0].next_event(0) is None  # no PeerDown for the genuine node 1


async def test_non_neighbour_is_refused(cluster, caplog):
    caplog.set_level(logging.INFO, logger="coordinator_free.net")
    nets = await build(cluster, [(0, 1)])
    outsider = cluster.add(3, [0], reconnect=False)  # node 0 does not list 3 as a neighbour
    await cluster.start(outsider)
    with pytest.raises(PeerUnreachable):
        await outsider.connect(0.3)
    assert any("node 3 is not an allowed peer" in r.getMessage() for r in caplog.records)
    await exchange_all(nets)


async def test_other_run_is_refused(cluster, caplog):
    caplog.set_level(logging.INFO, logger="coordinator_free.net")
    nets = await build(cluster, [(0, 1)])
    sock = bound_socket()
    other = PeerNet(
        node_id=2,
        static_key=KEYS[2],
        roster_keys=ROSTER,
        addresses=cluster.addresses,
        run_id=b"some-other-run",
        neighbours=[0],
        reconnect=False,
    )
    try:
        await other.start(sock)
        with pytest.raises(PeerUnreachable):
            await other.connect(0.3)
    finally:
        await other.close()
        sock.close()
    assert any("different run" in r.getMessage() for r in caplog.records)
    await exchange_all(nets)


async def test_garbage_connection_is_closed(cluster):
    nets = await build(cluster, [(0, 1)])
    reader, writer = await asyncio.open_connection(*cluster.addresses[0])
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 2.0) == b""  # closed on us, nothing sent back
    writer.close()
    await writer.wait_closed()
    await exchange_all(nets)


async def test_silent_connection_times_out(cluster):
    a = cluster.add(0, [1], handshake_timeout=0.3)
    await cluster.start(a)
    reader, writer = await asyncio.open_connection(*cluster.addresses[0])
    t0 = time.monotonic()
    assert await asyncio.wait_for(reader.read(), 3.0) == b""
    assert time.monotonic() - t0 < 2.0
    writer.close()
    await writer.wait_closed()


# --------------------------------------------------------------------------- failures mid-stream


class Rogue:
    """Holds a genuine neighbour key but drives the channel by hand, to misbehave later."""

    def __init__(self, node: int, target: int, address) -> None:
        self.ch = SecureChannel(
            local_id=node,
            static_key=KEYS[node],
            roster_keys=ROSTER,
            run_id=RUN,
            initiator=True,
            peer_id=target,
        )
        self.address = address

    async def connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(*self.address)
        self.ch.start()
        self.writer.write(self.ch.data_to_send())
        events: list = []
        while not any(isinstance(e, ControlReceived) for e in events):
            data = await asyncio.wait_for(self.reader.readexactly(self.ch.bytes_needed()), 2.0)
            events += self.ch.receive_data(data)
            self.writer.write(self.ch.data_to_send())
        assert ControlReceived(SELECT) in events  # the leader chose this connection

    def frame(self, msg: Message) -> bytes:
        self.ch.send(encode_message(msg))
        return self.ch.data_to_send()

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except OSError:
            pass


def _tamper(frame: bytes) -> bytes:
    b = bytearray(frame)
    b[-1] ^= 1
    return bytes(b)


@pytest.mark.parametrize(
    ("attack", "reason"),
    [
        ("tamper", "failed authentication"),
        ("replay", "replayed"),
        ("oversize", "over max_frame"),
        ("malformed", "malformed message"),
        ("truncate", "closed in the middle of frame"),
    ],
)
async def test_bad_frame_from_established_peer(cluster, attack, reason):
    a = cluster.add(0, [2], reconnect=False, max_frame=1 << 16)
    await cluster.start(a)
    rogue = Rogue(2, 0, cluster.addresses[0])
    try:
        await rogue.connect()
        good = rogue.frame(Message("value", 0, 0))
        rogue.writer.write(good)
        ev = await next_of(a, Inbound)
        assert ev.peer == 2 and ev.message.step == 0
        if attack == "tamper":
            rogue.writer.write(_tamper(rogue.frame(Message("value", 0, 1))))
        elif attack == "replay":
            rogue.writer.write(good)
        elif attack == "oversize":
            rogue.writer.write(struct.pack(">IBQ", (1 << 16) + 1, 0, 1))
        elif attack == "malformed":
            rogue.ch.send(b"\x93\x01\x02\x03")  # authentic frame, but not an envelope
            rogue.writer.write(rogue.ch.data_to_send())
        else:
            rogue.writer.write(rogue.frame(Message("value", 0, 1))[:-4])
            rogue.writer.write_eof()
        down = await next_of(a, PeerDown)
        assert down.peer == 2 and reason in down.reason
        assert await asyncio.wait_for(rogue.reader.read(), 2.0) == b""  # a closed the connection
        with pytest.raises(PeerGone, match="no channel to node 2"):
            await a.send(2, Message("value", 0, 2))
    finally:
        await rogue.close()


async def test_a_frame_stalled_part_way_ends_at_its_deadline(cluster):
    """Half a frame, then nothing: the channel is dropped once the rest is io_timeout late (a
    peer still sending its frames keeps the connection: the deadline is per frame)."""
    a = cluster.add(0, [2], reconnect=False, io_timeout=0.4)
    await cluster.start(a)
    rogue = Rogue(2, 0, cluster.addresses[0])
    try:
        await rogue.connect()
        # Three frames each completed within the deadline, with pauses between them longer
        # than it: between frames nothing is due.
        for step in range(3):
            frame = rogue.frame(Message("value", 0, step, payload=np.full(64, float(step))))
            rogue.writer.write(frame[:100])
            await rogue.writer.drain()
            assert await a.next_event(0.1) is None
            rogue.writer.write(frame[100:])
            ev = await next_of(a, Inbound)
            assert ev.peer == 2 and ev.message.step == step
            assert await a.next_event(0.5) is None
        assert a.connected == {2}
        frame = rogue.frame(Message("value", 0, 3, payload=np.zeros(64)))
        rogue.writer.write(frame[:100])
        t0 = time.monotonic()
        down = await next_of(a, PeerDown)
        assert down.peer == 2 and "rest of the frame not received within 0.4 s" in down.reason
        assert time.monotonic() - t0 >= 0.3
    finally:
        await rogue.close()


async def test_each_frame_gets_its_own_deadline(cluster):
    """Frames streamed so that every read ends part-way into the next frame (each write
    carries the end of one and the start of the next): each frame completes well within
    io_timeout, and the channel stays up for longer than io_timeout in all."""
    a = cluster.add(0, [2], reconnect=False, io_timeout=0.4)
    await cluster.start(a)
    rogue = Rogue(2, 0, cluster.addresses[0])
    try:
        await rogue.connect()
        frames = [
            rogue.frame(Message("value", 0, t, payload=np.full(200, float(t)))) for t in range(24)
        ]
        stream, f = b"".join(frames), len(frames[0])
        cuts = [0, *range(f // 2, len(stream), f), len(stream)]
        got = []
        t0 = time.monotonic()
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            rogue.writer.write(stream[lo:hi])
            await rogue.writer.drain()
            while (ev := await a.next_event(0.05)) is not None:  # 50 ms between writes
                assert isinstance(ev, Inbound), ev
                got.append(ev.message.step)
        assert got == list(range(24))
        assert time.monotonic() - t0 > 0.8  # twice io_timeout, a frame always part-way in
        assert a.connected == {2}
    finally:
        await rogue.close()


@pytest.mark.parametrize("pattern", ["bytewise", "all-at-once"])
async def test_frames_arriving_in_any_pieces_decode_in_order(cluster, pattern):
    """Frames split anywhere (one byte at a time) or many in one write, a 2 MiB one among them
    (over the stream's buffer limit while unauthenticated): every message, in order, intact."""
    a = cluster.add(0, [2], reconnect=False, max_frame=4 << 20)
    await cluster.start(a)
    rogue = Rogue(2, 0, cluster.addresses[0])
    try:
        await rogue.connect()
        payloads = [np.arange(k + 1, dtype=np.float64) * k for k in range(6)]
        if pattern == "all-at-once":
            payloads.insert(3, np.random.default_rng(0).random(1 << 18))  # 2 MiB
        stream = b"".join(
            rogue.frame(Message("value", 0, t, payload=p)) for t, p in enumerate(payloads)
        )
        if pattern == "bytewise":
            for i in range(len(stream)):
                rogue.writer.write(stream[i : i + 1])
                if i % 64 == 0:
                    await rogue.writer.drain()
                    await asyncio.sleep(0)
        else:
            rogue.writer.write(stream)
        await rogue.writer.drain()
        for t, p in enumerate(payloads):
            ev = await next_of(a, Inbound)
            assert ev.peer == 2 and ev.message.step == t
            assert np.array_equal(ev.message.payload, p)
        assert a.connected == {2}
        assert a.stats[2].bytes_received >= len(stream)
    finally:
        await rogue.close()


async def test_a_send_waits_for_a_slow_reader_and_gives_up_on_a_stopped_one(cluster):
    """The writer's pacing still works on a selected channel (whose reading a buffered protocol
    took over): a send the socket cannot take at once waits until the peer reads, and a peer
    that reads nothing is given up after send_timeout."""
    a = cluster.add(0, [2], reconnect=False, send_timeout=1.5)
    await cluster.start(a)
    rogue = Rogue(2, 0, cluster.addresses[0])
    try:
        await rogue.connect()
        big = np.random.default_rng(1).random(2 << 20)  # 16 MiB: more than the sockets hold
        send = asyncio.ensure_future(a.send(2, Message("value", 0, 0, payload=big)))
        done, _ = await asyncio.wait({send}, timeout=0.3)
        assert not done  # waiting for the peer to read
        got: list = []
        while not got:
            data = await asyncio.wait_for(rogue.reader.read(1 << 20), 5.0)
            assert data
            got.extend(rogue.ch.receive_data(data))
        await asyncio.wait_for(send, 5.0)  # taken once the peer read
        (ev,) = got
        assert np.array_equal(decode_message(ev.payload).payload, big)
        # Now nobody reads: the sends fill the sockets, then one waits and gives up.
        with pytest.raises(PeerGone, match=r"did not drain within 1.5 s \(peer not reading\)"):
            for step in range(1, 16):
                await a.send(2, Message("value", 0, step, payload=big))
        down = await next_of(a, PeerDown)
        assert down.peer == 2 and "did not drain" in down.reason
    finally:
        await rogue.close()


async def test_closing_a_peer_emits_peer_down(cluster):
    nets = await build(cluster, [(0, 1), (1, 2), (0, 2)])
    await nets[2].close()
    await nets[2].close()  # idempotent
    for i in (0, 1):
        down = await next_of(nets[i], PeerDown)
        assert down.peer == 2 and "closed" in down.reason
        assert nets[i].connected == {1 - i}
        with pytest.raises(PeerGone):
            await nets[i].send(2, Message("value", 0, 0))
    await nets[0].send(1, Message("value", 0, 9))
    assert (await next_of(nets[1], Inbound)).message.step == 9


async def test_leader_reconnects_after_a_drop(cluster):
    nets = await build(cluster, [(0, 1)])
    # Cut the channel under both ends (as a network failure would).
    nets[1]._selected[0].writer.transport.abort()
    assert (await next_of(nets[0], PeerDown)).peer == 1
    assert (await next_of(nets[1], PeerDown)).peer == 0
    assert (await next_of(nets[0], PeerUp)).peer == 1  # node 0 is the edge leader and redials
    assert (await next_of(nets[1], PeerUp)).peer == 0
    await exchange_all({0: nets[0], 1: nets[1]})
    assert nets[0].stats[1].connections == 2


async def test_send_and_event_api_edges(cluster):
    a = cluster.add(0, [1])
    await cluster.start(a)
    with pytest.raises(ValueError, match="not a neighbour"):
        await a.send(4, Message("value", 0, 0))
    with pytest.raises(PeerGone, match="not connected"):
        await a.send(1, Message("value", 0, 0))
    t0 = time.monotonic()
    assert await a.next_event(0.05) is None
    assert time.monotonic() - t0 < 1.0
    with pytest.raises(RuntimeError, match="already listening"):
        await a.start()
    with pytest.raises(ValueError, match="does not match the roster key"):
        PeerNet(
            node_id=0,
            static_key=KEYS[1],
            roster_keys=ROSTER,
            addresses={},
            run_id=RUN,
            neighbours=[1],
        )
    with pytest.raises(ValueError, match="not in the roster"):
        PeerNet(
            node_id=0,
            static_key=KEYS[0],
            roster_keys=ROSTER,
            addresses={},
            run_id=RUN,
            neighbours=[1, 42],
        )


async def test_start_binds_from_addresses(cluster):
    addresses = {0: ("127.0.0.1", 0)}
    net = PeerNet(
        node_id=0,
        static_key=KEYS[0],
        roster_keys=ROSTER,
        addresses=addresses,
        run_id=RUN,
        neighbours=[1],
    )
    try:
        host, port = await net.start()
        assert host == "127.0.0.1" and port > 0 and net.address == (host, port)
    finally:
        await net.close()


def test_runs_under_uvloop():
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> None:
        c = Cluster()
        try:
            nets = await build(c, EDGES4)
            await exchange_all(nets)
            await nets[3].close()
            assert (await next_of(nets[0], PeerDown)).peer == 3
        finally:
            await c.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())


@pytest.mark.parametrize(
    "scenario",
    [
        pytest.param(lambda c: test_a_frame_stalled_part_way_ends_at_its_deadline(c), id="stall"),
        pytest.param(lambda c: test_each_frame_gets_its_own_deadline(c), id="deadlines"),
        pytest.param(
            lambda c: test_frames_arriving_in_any_pieces_decode_in_order(c, "all-at-once"),
            id="pieces",
        ),
        pytest.param(
            lambda c: test_a_send_waits_for_a_slow_reader_and_gives_up_on_a_stopped_one(c),
            id="pacing",
        ),
        pytest.param(
            lambda c: test_bad_frame_from_established_peer(c, "tamper", "failed authentication"),
            id="tamper",
        ),
        pytest.param(
            lambda c: test_bad_frame_from_established_peer(
                c, "truncate", "closed in the middle of frame"
            ),
            id="truncate",
        ),
    ],
)
def test_selected_channels_read_alike_under_uvloop(scenario):
    """The peers' loop switches a selected channel's reading to a buffered protocol its own
    way (uvloop restarts reading in its buffered mode): the same scenarios hold there."""
    uvloop = pytest.importorskip("uvloop")

    async def run() -> None:
        c = Cluster()
        try:
            await scenario(c)
        finally:
            await c.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run())


# --------------------------------------------------------------------------- liveness frames


async def test_heartbeats_are_life_but_not_messages(cluster):
    a = cluster.add(0, [2], reconnect=False, silence_s=0.3)
    await cluster.start(a)
    rogue = Rogue(2, 0, cluster.addresses[0])
    try:
        await rogue.connect()
        for _ in range(8):  # 0.8 s, over two silence periods, kept up by heartbeats alone
            rogue.ch.send_control(HEARTBEAT)
            rogue.writer.write(rogue.ch.data_to_send())
            assert await a.next_event(0.1) is None
        assert a.connected == {2}
        s = a.stats[2]
        assert s.heartbeats_received == 8 and s.frames_received == 0
        rogue.ch.send_control(b"heartbeat?")  # any other control payload is still refused
        rogue.writer.write(rogue.ch.data_to_send())
        down = await next_of(a, PeerDown)
        assert "unexpected control frame" in down.reason
    finally:
        await rogue.close()


async def test_a_large_frame_in_transit_counts_as_life(cluster):
    """A frame that takes longer than the silence period to arrive keeps the channel up while
    its bytes keep coming (they are read as they arrive, not in one piece)."""
    a = cluster.add(0, [2], reconnect=False, silence_s=0.3)
    await cluster.start(a)
    rogue = Rogue(2, 0, cluster.addresses[0])
    try:
        await rogue.connect()
        payload = np.arange(100_000, dtype=np.float64)  # 800 kB
        frame = rogue.frame(Message("value", 0, 0, payload=payload))
        pieces = 12
        size = -(-len(frame) // pieces)
        for k in range(pieces):  # 12 x 0.1 s: four silence periods for one frame
            rogue.writer.write(frame[k * size : (k + 1) * size])
            await rogue.writer.drain()
            if k < pieces - 1:
                assert await a.next_event(0.1) is None
        ev = await next_of(a, Inbound)
        assert ev.peer == 2 and np.array_equal(ev.message.payload, payload)
        assert a.connected == {2}
    finally:
        await rogue.close()


async def test_writes_at_once_says_whether_a_send_reaches_its_socket_before_returning(cluster):
    """``writes_at_once`` (what a peer's driver asks before it sends, to have its view-log
    records written first when the frame goes out at once) agrees with what ``send_now`` does:
    a small frame reaches the socket at the end of the loop's turn, one past ``COALESCE`` bytes
    before ``send_now`` returns, and with injected faults the answer is yes."""
    from coordinator_free.net.linkfaults import LinkFaults
    from coordinator_free.net.transport import COALESCE
    from coordinator_free.net.wire import encode_parts

    nets = await build(cluster, [(0, 1)])
    await wait_until(lambda: nets[0].connection_count(1) == 1)
    writer = nets[0]._selected[1].writer
    written: list[int] = []
    real_write, real_writelines = writer.write, writer.writelines

    def write(data):
        written.append(len(data))
        real_write(data)

    def writelines(parts):
        written.append(sum(map(len, parts)))
        real_writelines(parts)

    writer.write, writer.writelines = write, writelines
    for k, floats in enumerate((8, COALESCE // 8 + 1, 8)):
        msg = Message("value", 0, k, payload=np.ones(floats))
        parts = encode_parts(msg)
        at_once = nets[0].writes_at_once(1, parts)
        assert at_once == (floats > 8)
        assert nets[0].send_now(1, msg, parts=parts) is None
        assert bool(written) == at_once, k  # before the turn ends
        await asyncio.sleep(0)
        assert written, k  # at its end at the latest
        written.clear()
        assert (await next_of(nets[1], Inbound)).message.step == k
    assert not nets[0].writes_at_once(2, parts)  # no channel: send_now raises, writes nothing
    with pytest.raises(ValueError, match="not a neighbour"):
        nets[0].send_now(2, msg, parts=parts)

    faulty = cluster.add(3, [4], faults=LinkFaults(delay_s=0.01))
    cluster.add(4, [3])
    for net in cluster.nets[-2:]:
        await cluster.start(net)
    await asyncio.gather(*(net.connect(5.0) for net in cluster.nets[-2:]))
    assert faulty.writes_at_once(4, encode_parts(Message("value", 0, 0, payload=np.ones(8))))


async def test_what_events_taken_in_a_callback_send_leaves_as_that_callback_ends(cluster):
    """A node idle in ``idle(sink, after)`` (a peer's driver) sends from the sink: the frames
    reach their sockets as the callback ends, after ``after()`` (the view log's records
    first), before anything the loop runs next; when the sink fails, at the end of the turn,
    and the failure reaches the caller."""
    nets = await build(cluster, [(0, 1), (0, 2)])
    await wait_until(lambda: all(nets[0].connection_count(p) == 1 for p in (1, 2)))
    order: list = []
    for p in (1, 2):
        writer = nets[0]._selected[p].writer
        real = writer.writelines

        def writelines(parts, p=p, real=real):
            order.append(("write", p))
            real(parts)

        writer.writelines = writelines
    loop = asyncio.get_running_loop()

    def sink(ev):
        loop.call_soon(order.append, "next callback")  # runs after the sink's callback
        for p in (1, 2):
            nets[0].send_now(p, Message("value", 0, ev.message.step, payload=np.ones(8)))
        return "done"

    idle = asyncio.ensure_future(nets[0].idle(10.0, sink, lambda: order.append("after")))
    await asyncio.sleep(0)
    await nets[1].send(0, Message("value", 0, 7, payload=np.ones(8)))
    assert await idle == "done"
    await wait_until(lambda: "next callback" in order)
    assert order == ["after", ("write", 1), ("write", 2), "next callback"]
    for p in (1, 2):
        assert (await next_of(nets[p], Inbound)).message.step == 7

    def failing(ev):
        nets[0].send_now(1, Message("value", 0, 8, payload=np.ones(8)))
        raise RuntimeError("engine failed")

    order.clear()
    idle = asyncio.ensure_future(nets[0].idle(10.0, failing))
    await asyncio.sleep(0)
    await nets[2].send(0, Message("value", 0, 8, payload=np.ones(8)))
    with pytest.raises(RuntimeError, match="engine failed"):
        await idle
    assert (await next_of(nets[1], Inbound)).message.step == 8  # sent all the same
    assert order == [("write", 1)]
