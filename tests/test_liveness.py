"""Liveness, link faults and the pre-authentication bound of PeerNet, over loopback TCP.

Heartbeats and the silence detector (a blocked link, a stopped process, an idle but healthy
channel, the node's own stalled event loop), recovery by the leader's redial, the injected
faults (drop, duplicate, delay, corrupt, block) and their counts, and the per-source bound on
pending handshakes. Small settings keep it quick: heartbeat 0.05 s, silence 0.3 s. Time bounds
are generous liveness bounds, never exact timings.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from asyncnet import bound_socket, next_of, wait_until
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from coordinator_free.net.linkfaults import FAULT_COUNTS, LinkFaults
from coordinator_free.net.transport import Inbound, PeerDown, PeerGone, PeerNet, PeerUp
from coordinator_free.net.wire import Message

RUN = b"liveness-test-run"
KEYS = {i: X25519PrivateKey.generate() for i in range(4)}
ROSTER = {i: k.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw) for i, k in KEYS.items()}
HB = 0.05
SILENCE = 0.3
#: A generous bound on how long anything that should happen "soon" may take on a loaded machine.
SOON = 5.0


class Nodes:
    """Nodes on pre-bound loopback sockets with a shared address map; closed on teardown."""

    def __init__(self) -> None:
        self.addresses: dict[int, tuple[str, int]] = {}
        self.socks: dict[int, socket.socket] = {}
        self.nets: dict[int, PeerNet] = {}

    def add(self, node: int, neighbours, *, addresses=None, **kw) -> PeerNet:
        """``addresses``: what this node may dial (default: every node)."""
        sock = bound_socket()
        self.socks[node] = sock
        self.addresses[node] = sock.getsockname()
        kw.setdefault("handshake_timeout", 0.5)
        kw.setdefault("backoff_max", 0.2)
        net = PeerNet(
            node_id=node,
            static_key=KEYS[node],
            roster_keys=ROSTER,
            addresses=self.addresses if addresses is None else addresses,
            run_id=RUN,
            neighbours=neighbours,
            **kw,
        )
        self.nets[node] = net
        return net

    async def pair(
        self, kw0: dict | None = None, kw1: dict | None = None
    ) -> tuple[PeerNet, PeerNet]:
        """Nodes 0 (the edge leader) and 1, connected."""
        a = self.add(0, [1], **(kw0 or {}))
        b = self.add(1, [0], **(kw1 or {}))
        for net in (a, b):
            await net.start(self.socks[net.node_id])
        await asyncio.gather(a.connect(SOON), b.connect(SOON))
        return a, b

    async def close(self) -> None:
        await asyncio.gather(*(net.close() for net in self.nets.values()))
        for sock in self.socks.values():
            sock.close()


@pytest.fixture
async def nodes():
    n = Nodes()
    try:
        yield n
    finally:
        await n.close()


def live(**kw) -> dict:
    return {"heartbeat_s": HB, "silence_s": SILENCE, **kw}


async def drain_inbound(net: PeerNet, quiet: float = 0.3) -> list[Inbound]:
    """Every event until ``quiet`` seconds pass without one; all must be Inbound."""
    got = []
    while (ev := await net.next_event(quiet)) is not None:
        assert isinstance(ev, Inbound), f"node {net.node_id}: unexpected {ev!r}"
        got.append(ev)
    return got


def cut(*pairs: tuple[LinkFaults, int]) -> None:
    for faults, peer in pairs:
        faults.block([peer])


# --------------------------------------------------------------------------- heartbeats, silence


async def test_idle_healthy_channel_stays_up_on_heartbeats(nodes):
    a, b = await nodes.pair(live(), live())
    assert await a.next_event(6 * SILENCE) is None  # several silence periods, nothing at all
    assert await b.next_event(0) is None
    assert a.connected == {1} and b.connected == {0}
    for net, peer in ((a, 1), (b, 0)):
        s = net.stats[peer]
        # One heartbeat per HB to HB * 1.5 of idleness; at least a few dozen over 1.8 s.
        assert s.heartbeats_sent >= 10 and s.heartbeats_received >= 10
        assert s.frames_sent == 0 and s.frames_received == 0  # heartbeats are not messages
        assert s.connections == 1


async def test_without_the_peers_heartbeats_an_idle_channel_is_silent(nodes):
    """The control case of the test above: the detector does judge idle channels; only the
    peer's heartbeats keep them up."""
    a, b = await nodes.pair({"silence_s": SILENCE}, {})
    t0 = time.monotonic()
    down = await next_of(a, PeerDown)
    assert down.peer == 1 and down.reason.startswith("silent for ")
    assert time.monotonic() - t0 >= SILENCE * 0.9
    assert b.stats[0].heartbeats_sent == 0


async def test_blocked_link_is_declared_down_with_a_reason(nodes):
    fa, fb = LinkFaults(), LinkFaults()
    a, b = await nodes.pair(live(faults=fa), live(faults=fb))
    t0 = time.monotonic()
    cut((fa, 1), (fb, 0))
    downs = [await next_of(a, PeerDown), await next_of(b, PeerDown)]
    elapsed = time.monotonic() - t0
    for down, peer in zip(downs, (1, 0), strict=True):
        assert down.peer == peer
        assert "no message or heartbeat (link cut, or the peer stopped)" in down.reason
        quiet = float(down.reason.removeprefix("silent for ").split(" s:")[0])
        assert quiet >= SILENCE - 0.05  # formatted to 0.1 s
    # Not before the silence period (the last heartbeat came at most ~HB before the cut), and
    # within it plus about one heartbeat interval (generously, for a loaded machine).
    assert SILENCE - 2 * HB <= elapsed < SILENCE + HB + 2.0
    assert a.connected == frozenset() and b.connected == frozenset()
    with pytest.raises(PeerGone, match="silent for"):
        await a.send(1, Message("value", 0, 0))
    assert fa.counts["blocked"] > 0 and fb.counts["blocked"] > 0  # heartbeats were withheld


async def test_unblocked_link_comes_back_and_messages_flow(nodes):
    fa, fb = LinkFaults(), LinkFaults()
    a, b = await nodes.pair(live(faults=fa), live(faults=fb))
    cut((fa, 1), (fb, 0))
    await next_of(a, PeerDown)
    await next_of(b, PeerDown)
    # Stay cut through a few redial attempts (their handshakes time out), then heal.
    await wait_until(lambda: a.stats[1].dial_attempts >= 2, SOON)
    assert a.connected == frozenset()
    fa.unblock([1])
    fb.unblock([0])
    assert (await next_of(a, PeerUp)).peer == 1  # node 0 leads the edge and redials
    assert (await next_of(b, PeerUp)).peer == 0
    for k in range(5):
        await a.send(1, Message("value", 0, k))
        await b.send(0, Message("value", 0, k))
    assert [ev.message.step for ev in await drain_inbound(b)] == list(range(5))
    assert [ev.message.step for ev in await drain_inbound(a)] == list(range(5))
    assert a.stats[1].connections == 2 and b.stats[0].connections == 2


async def test_one_sided_block_is_noticed_at_both_ends(nodes):
    """Node 1 alone drops everything to and from node 0; node 0 hears nothing and declares it
    silent, and node 1 hears nothing it accepts and does the same."""
    fb = LinkFaults()
    a, b = await nodes.pair(live(), live(faults=fb))
    fb.block(0)
    for net, peer in ((a, 1), (b, 0)):
        down = await next_of(net, PeerDown)
        assert down.peer == peer and down.reason.startswith("silent for ")
    fb.unblock(0)
    assert (await next_of(a, PeerUp)).peer == 1
    assert (await next_of(b, PeerUp)).peer == 0


@pytest.mark.slow  # exhaustive or long: in the slow suite, which CI runs
async def test_own_stalled_event_loop_gives_no_false_verdict(nodes):
    """Both nodes share this event loop; blocking it for several silence periods stalls both.
    Each end's heartbeats sit in the other's socket meanwhile; the detector lets the readers
    take them before it judges, so nobody is declared down."""
    a, b = await nodes.pair(live(), live())
    for _ in range(2):
        time.sleep(3 * SILENCE)  # a long computation on the event loop
        assert await a.next_event(3 * SILENCE) is None
        assert await b.next_event(0) is None
    assert a.connected == {1} and b.connected == {0}
    assert a.stats[1].connections == 1


async def test_data_counts_as_life(nodes):
    """Node 0 sends no heartbeats, only a steady stream of messages: node 1's detector stays
    quiet while they flow, and names node 0 silent once they stop."""
    a, b = await nodes.pair({}, {"silence_s": SILENCE})
    t_end = time.monotonic() + 4 * SILENCE
    k = 0
    while time.monotonic() < t_end:
        await a.send(1, Message("value", 0, k, payload=np.zeros(1000)))
        k += 1
        await asyncio.sleep(HB / 5)
    got = await drain_inbound(b, quiet=0.0)
    assert [ev.message.step for ev in got] == list(range(k))
    assert b.connected == {0}
    t0 = time.monotonic()
    down = await next_of(b, PeerDown)
    assert down.peer == 0 and down.reason.startswith("silent for ")
    assert time.monotonic() - t0 >= SILENCE * 0.5


CHILD = r"""
import asyncio, socket, sys
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from coordinator_free.net.transport import PeerNet

priv, pub0, pub1, run, host, port = sys.argv[1:7]

async def main():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    addresses = {0: (host, int(port)), 1: sock.getsockname()}
    net = PeerNet(
        node_id=1,
        static_key=X25519PrivateKey.from_private_bytes(bytes.fromhex(priv)),
        roster_keys={0: bytes.fromhex(pub0), 1: bytes.fromhex(pub1)},
        addresses=addresses,
        run_id=run.encode(),
        neighbours=[0],
        heartbeat_s=float(sys.argv[7]),
        silence_s=float(sys.argv[8]),
        handshake_timeout=0.5,
        backoff_max=0.2,
    )
    await net.start(sock)
    print(sock.getsockname()[1], flush=True)
    while True:  # keep the channel serviced; events are not needed
        await net.next_event(3600)

asyncio.run(main())
"""


async def test_stopped_process_is_declared_down_and_comes_back(nodes):
    """A real peer process stopped with SIGSTOP for several silence periods is named silent;
    after SIGCONT the leader's redial brings it back."""
    a = nodes.add(0, [1], **live())
    await a.start(nodes.socks[0])
    raw = KEYS[1].private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    host, port = nodes.addresses[0]
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, raw.hex(), ROSTER[0].hex(), ROSTER[1].hex(), RUN.decode()]
        + [host, str(port), str(HB), str(SILENCE)],
        stdout=subprocess.PIPE,
        env=env,
        cwd=root,
    )
    try:
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 30.0)
        nodes.addresses[1] = ("127.0.0.1", int(line))
        await a.connect(30.0)
        assert await a.next_event(2 * SILENCE) is None  # its heartbeats keep the channel up
        os.kill(child.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        down = await next_of(a, PeerDown, timeout=SILENCE + SOON)
        assert down.peer == 1 and down.reason.startswith("silent for ")
        assert time.monotonic() - t0 >= SILENCE - 2 * HB
        await asyncio.sleep(3 * SILENCE)
        os.kill(child.pid, signal.SIGCONT)
        assert (await next_of(a, PeerUp, timeout=3 * SOON)).peer == 1
        assert await a.next_event(2 * SILENCE) is None  # and it stays up
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.wait()
        child.stdout.close()


# --------------------------------------------------------------------------- injected faults


async def test_drop_loses_messages_but_keeps_the_channel(nodes):
    fa = LinkFaults(drop=0.5, seed=11)
    a, b = await nodes.pair(live(faults=fa), live())
    n = 200
    for k in range(n):
        await a.send(1, Message("value", 0, k))  # returns normally, dropped or not
    got = [ev.message.step for ev in await drain_inbound(b)]
    dropped = fa.counts["dropped"]
    assert 0 < dropped < n and len(got) == n - dropped
    assert got == sorted(got)  # the survivors in order
    # The same seed drops the same messages.
    twin = LinkFaults(drop=0.5, seed=11)
    expected = [k for k in range(n) if twin.plan_send(1).copies == 1]
    assert got == expected
    assert a.stats[1].frames_sent == n - dropped == b.stats[0].frames_received
    # The nonce sequence is intact: with dropping off, the next message arrives.
    fa.drop = 0.0
    await a.send(1, Message("value", 0, n))
    assert (await next_of(b, Inbound)).message.step == n
    assert a.connected == {1}


async def test_duplicate_sends_every_message_twice(nodes):
    fa = LinkFaults(duplicate=1.0)
    a, b = await nodes.pair(live(faults=fa), live())
    for k in range(10):
        await a.send(1, Message("value", 0, k))
    got = [ev.message.step for ev in await drain_inbound(b)]
    assert got == [k for k in range(10) for _ in range(2)]
    assert fa.counts["duplicated"] == 10
    assert a.stats[1].frames_sent == 20 and b.stats[0].frames_received == 20


async def test_delay_holds_frames_back_in_order_without_blocking_the_sender(nodes):
    delay = 0.15  # below the silence period less a heartbeat: the channel must stay up
    fa = LinkFaults(delay_s=delay)
    a, b = await nodes.pair(live(faults=fa), live())
    t0 = time.monotonic()
    for k in range(20):
        await a.send(1, Message("value", 0, k))
        await asyncio.sleep(0.01)  # heartbeats interleave with the delayed data
    assert time.monotonic() - t0 < 20 * delay  # send() did not wait for the delay each time
    first = await next_of(b, Inbound)
    assert time.monotonic() - t0 >= delay * 0.9
    rest = await drain_inbound(b, quiet=2 * delay)
    assert [first.message.step] + [ev.message.step for ev in rest] == list(range(20))
    assert fa.counts["delayed"] == 20
    assert a.connected == {1} and b.connected == {0}  # control frames kept their place
    assert b.stats[0].heartbeats_received > 0


async def test_corrupt_frame_fails_authentication_and_the_edge_recovers(nodes):
    fa = LinkFaults(corrupt=1.0, seed=3)
    a, b = await nodes.pair(live(faults=fa), live())
    await a.send(1, Message("value", 0, 0))
    down_b = await next_of(b, PeerDown)
    assert down_b.peer == 0 and "failed authentication" in down_b.reason
    down_a = await next_of(a, PeerDown)
    assert down_a.peer == 1 and "authentication" in down_a.reason
    assert "flipped a bit of data frame" in down_a.reason
    assert fa.counts["corrupted"] == 1
    assert (await next_of(a, PeerUp)).peer == 1
    assert (await next_of(b, PeerUp)).peer == 0
    fa.corrupt = 0.0
    await a.send(1, Message("value", 0, 1))
    assert (await next_of(b, Inbound)).message.step == 1


async def test_blocked_peer_cannot_handshake(nodes):
    """A blocked link carries no handshake either: connecting fails (timeouts), then works
    once unblocked."""
    fa = LinkFaults()
    fa.block([1])
    a = nodes.add(0, [1], faults=fa)
    b = nodes.add(1, [0])
    await a.start(nodes.socks[0])
    await b.start(nodes.socks[1])
    with pytest.raises(Exception, match="not connected within"):
        await asyncio.gather(a.connect(1.2), b.connect(1.2))
    assert a.connected == frozenset() and fa.counts["blocked"] >= 1
    fa.unblock([1])
    await asyncio.gather(a.connect(SOON), b.connect(SOON))
    await a.send(1, Message("done", 0, 0))
    assert (await next_of(b, Inbound)).message.kind == "done"


# --------------------------------------------------------------------------- LinkFaults itself


def test_link_faults_checks_and_counts():
    f = LinkFaults()
    assert f.counts == dict.fromkeys(FAULT_COUNTS, 0) and f.blocked == set()
    assert [f.plan_send(3).copies for _ in range(50)] == [1] * 50  # no faults declared
    assert f.counts == dict.fromkeys(FAULT_COUNTS, 0)
    f.block([1, 2])
    f.block(5)
    f.unblock([2])
    assert f.blocked == {1, 5}
    for bad in (dict(drop=1.5), dict(duplicate=-0.1), dict(delay_s=-1), dict(delay_s=float("inf"))):
        with pytest.raises(ValueError, match="LinkFaults"):
            LinkFaults(**bad)
    with pytest.raises(TypeError, match="seed"):
        LinkFaults(seed="x")
    with pytest.raises(ValueError, match="node ids"):
        f.block(["a"])


def test_link_faults_are_deterministic_per_seed_and_neighbour():
    def fates(seed: int, peer: int) -> list[tuple[int, bool]]:
        f = LinkFaults(drop=0.2, duplicate=0.2, corrupt=0.2, seed=seed)
        return [(p.copies, p.corrupt) for p in (f.plan_send(peer) for _ in range(300))]

    assert fates(1, 2) == fates(1, 2)
    assert fates(1, 2) != fates(2, 2) and fates(1, 2) != fates(1, 3)
    # Interleaving sends to other neighbours does not change a neighbour's stream.
    f = LinkFaults(drop=0.2, duplicate=0.2, corrupt=0.2, seed=1)
    mixed = []
    for _ in range(300):
        f.plan_send(3)
        p = f.plan_send(2)
        mixed.append((p.copies, p.corrupt))
    assert mixed == fates(1, 2)
    f = LinkFaults(drop=0.3, duplicate=0.5, corrupt=0.1, delay_s=0.1, seed=5)
    plans = [f.plan_send(0) for _ in range(2000)]
    assert f.counts["dropped"] == sum(p.copies == 0 for p in plans)
    assert f.counts["duplicated"] == sum(p.copies == 2 for p in plans)
    assert f.counts["corrupted"] == sum(p.corrupt for p in plans)
    assert f.counts["delayed"] == sum(p.copies for p in plans)
    assert 0.25 < f.counts["dropped"] / 2000 < 0.35


def test_liveness_parameters_are_checked():
    base = dict(node_id=0, static_key=KEYS[0], roster_keys=ROSTER, addresses={}, run_id=RUN)
    with pytest.raises(ValueError, match="silence_s .* must exceed twice heartbeat_s"):
        PeerNet(neighbours=[1], heartbeat_s=0.5, silence_s=0.9, **base)
    with pytest.raises(ValueError, match="heartbeat_s must be a positive number"):
        PeerNet(neighbours=[1], heartbeat_s=0, **base)
    with pytest.raises(ValueError, match="silence_s must be a positive number"):
        PeerNet(neighbours=[1], silence_s=float("nan"), **base)
    with pytest.raises(ValueError, match="max_pending_per_source must be a positive integer"):
        PeerNet(neighbours=[1], max_pending_per_source=0, **base)
    with pytest.raises(TypeError, match="faults must be a LinkFaults"):
        PeerNet(neighbours=[1], faults={"drop": 0.1}, **base)


# --------------------------------------------------------------------------- pre-authentication


async def half_open(address, source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(*address, local_addr=(source, 0))


async def closed_by_server(conns, timeout: float = 0.0) -> int:
    """How many of ``conns`` the server has closed (EOF or reset) within ``timeout``."""

    async def one(reader: asyncio.StreamReader) -> bool:
        try:
            async with asyncio.timeout(timeout):
                return await reader.read(1) == b""
        except TimeoutError:
            return False
        except OSError:
            return True

    return sum(await asyncio.gather(*(one(r) for r, _ in conns)))


async def test_a_probe_that_hangs_up_is_logged_at_debug_not_as_a_warning(nodes, caplog):
    """A port scan or health probe connects and closes before the handshake: the node notes it
    at debug level (no WARNING in a healthy run) and still takes its neighbour."""
    caplog.set_level(logging.DEBUG, logger="coordinator_free.net")
    a = nodes.add(0, [1], addresses={})
    b = nodes.add(1, [0])
    await a.start(nodes.socks[0])
    await b.start(nodes.socks[1])
    for _ in range(2):  # (bytes that are not a channel's stay a warning: another test)
        _, w = await half_open(nodes.addresses[0], "127.0.0.6")
        w.close()

    def cut() -> list:
        return [r for r in caplog.records if "closed during the handshake" in r.getMessage()]

    await wait_until(lambda: len(cut()) >= 2, SOON)
    assert all(r.levelno == logging.DEBUG for r in cut())
    await asyncio.gather(b.connect(SOON), a.connect(SOON))
    assert a.connected == {1}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_half_open_flood_from_one_source_leaves_room_for_a_neighbour(nodes, caplog):
    caplog.set_level(logging.DEBUG, logger="coordinator_free.net")
    a = nodes.add(0, [1], handshake_timeout=3.0, addresses={})
    b = nodes.add(1, [0], handshake_timeout=3.0)
    await a.start(nodes.socks[0])
    await b.start(nodes.socks[1])
    flood = [await half_open(nodes.addresses[0], "127.0.0.5") for _ in range(80)]
    try:
        # Every connection was accepted; the source keeps at most its share pending.
        await wait_until(lambda: a.handshakes_evicted >= 72, SOON)
        assert a.pending_handshakes.get("127.0.0.5", 0) <= 8
        assert await closed_by_server(flood, 0.5) >= 72
        # The neighbour connects from 127.0.0.1 (node 0 knows no address to dial, so the
        # channel has to come in through node 0's listener).
        t0 = time.monotonic()
        await asyncio.gather(b.connect(SOON), a.connect(SOON))
        assert time.monotonic() - t0 < SOON
        assert a.connected == {1}
        await b.send(0, Message("done", 0, 0))
        assert (await next_of(a, Inbound)).peer == 1
    finally:
        for _, w in flood:
            w.close()
    evictions = [r for r in caplog.records if "closing pending unauthenticated" in r.getMessage()]
    assert evictions and all(r.levelno <= logging.INFO for r in evictions)
    assert len([r for r in evictions if r.levelno == logging.INFO]) == 1  # no log flood
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_global_cap_evicts_from_the_busiest_source(nodes):
    a = nodes.add(0, [1], max_pending_handshakes=12, max_pending_per_source=8, addresses={})
    b = nodes.add(1, [0])
    await a.start(nodes.socks[0])
    await b.start(nodes.socks[1])
    conns = []
    for src, count in (("127.0.0.5", 8), ("127.0.0.6", 8), ("127.0.0.7", 3)):
        conns += [await half_open(nodes.addresses[0], src) for _ in range(count)]
    try:
        # All 19 accepted: 12 pending at most, the rest evicted from the busiest sources.
        await wait_until(
            lambda: sum(a.pending_handshakes.values()) + a.handshakes_evicted >= 19, SOON
        )
        pending = a.pending_handshakes
        assert sum(pending.values()) <= 12
        assert pending.get("127.0.0.7") == 3  # the lightest source kept all it had
        await asyncio.gather(b.connect(SOON), a.connect(SOON))
        assert a.connected == {1}
    finally:
        for _, w in conns:
            w.close()


async def test_neighbours_sharing_an_address_get_extra_share(nodes):
    """Three neighbours all on 127.0.0.1 (as in a local run) with a per-source share of 1: the
    node still admits one pending handshake per neighbour on top."""
    a = nodes.add(0, [1, 2, 3], max_pending_per_source=1)
    others = [nodes.add(i, [0]) for i in (1, 2, 3)]
    for net in (a, *others):
        await net.start(nodes.socks[net.node_id])
    assert a._source_share("127.0.0.1") == 4
    assert a._source_share("127.0.0.9") == 1
    await asyncio.gather(*(n.connect(SOON) for n in others), a.connect(SOON))
    assert a.connected == {1, 2, 3}


async def test_half_open_connections_are_closed_after_the_handshake_timeout(nodes):
    a = nodes.add(0, [1], handshake_timeout=0.4)
    await a.start(nodes.socks[0])
    silent = [await half_open(nodes.addresses[0], "127.0.0.5") for _ in range(5)]
    partial = await half_open(nodes.addresses[0], "127.0.0.6")
    partial[1].write(b"CFCH\x00\x01")  # the start of a first message, then nothing
    t0 = time.monotonic()
    try:
        assert await closed_by_server(silent + [partial], SOON) == 6
        assert 0.3 < time.monotonic() - t0 < SOON
        assert a.pending_handshakes == {} and a.handshakes_evicted == 0
    finally:
        for _, w in silent + [partial]:
            w.close()
