"""Cost of the network stack, as ratios to plain baselines measured in the same run.

Three layers, each against the cheapest way to do the same job without it:

1. **Wire envelope.** ``wire.encode_message`` / ``wire.decode_message`` of a float64 payload
   (8 B, 8 KiB, 1 MiB, 16 MiB) versus ``ndarray.tobytes()`` / ``np.frombuffer``.
2. **Channel framing.** One data frame through two in-memory :class:`SecureChannel` ends wired
   back to back (``send`` + ``data_to_send`` + ``receive_data``) versus a bare encrypt +
   decrypt, with the AEAD the channels negotiated (AES-256-GCM on a CPU with AES instructions,
   ChaCha20-Poly1305 otherwise), of the same bytes with the same 13-byte associated data.
   The ratio is the cost of the framing (header, sequence checks, buffering, copies).
3. **PeerNet end to end.** Two :class:`PeerNet` nodes in one event loop over loopback TCP: one
   sends N messages (``send``), the other consumes them (``next_event``); and a ping-pong of
   64-byte messages for the round-trip latency. The baseline is a pair of plain asyncio streams
   in the same loop carrying the same array bytes with a 4-byte length prefix
   (``tobytes`` + ``writelines`` + ``drain`` on one side, ``readexactly`` + ``np.frombuffer`` on
   the other).

Every ratio is measured time / baseline time (1.0: as fast as the baseline; 3.0: three times
slower). Micro-benchmarks report the best of several interleaved repetitions; end-to-end runs
alternate baseline and PeerNet with the same message count and keep the best of each. The
event loop is uvloop when it is installed (as for the peers), unless ``--loop asyncio``.

Everything stays on 127.0.0.1 (port 0), the run time is bounded by per-case budgets (about
30 s by default, about 10 s with ``--quick``) and the traffic by per-case message caps.

Run: ``python bench/bench_transport.py [--quick] [--json] [--loop auto|uvloop|asyncio]``.
Prints numbers; asserts nothing about timing.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import math
import os
import platform
import socket
import statistics
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import cryptography
import msgpack
import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from coordinator_free.net.channel import (
    CIPHER_NAMES,
    DEFAULT_MAX_FRAME,
    MessageReceived,
    SecureChannel,
    cipher_suites,
)
from coordinator_free.net.transport import CHUNK, Inbound, PeerNet
from coordinator_free.net.wire import Message, decode_message, encode_message

RUN_ID = b"bench-transport"
LOOPBACK = "127.0.0.1"
KIB = 1 << 10
MIB = 1 << 20
WIRE_SIZES = (8, 8 * KIB, MIB, 16 * MIB)
#: The baseline's StreamReader limit: a whole frame and a read beyond it, so the plain stream
#: never pauses reading part-way through a message (nor does PeerNet, whose established
#: channels read into buffers of their own).
BASELINE_LIMIT = DEFAULT_MAX_FRAME + CHUNK
FRAME_SIZES = (64, 8 * KIB, MIB, 16 * MIB)
#: Longest wait for any single network event before the run is declared broken.
EVENT_TIMEOUT = 30.0
#: Hard limit on the whole network part (a broken run fails instead of hanging).
NETWORK_DEADLINE = 300.0
_LEN = struct.Struct(">I")
_FRAME_HEADER = struct.Struct(">IBQ")


@dataclass(frozen=True)
class Budget:
    """Time budgets in seconds and repetition counts."""

    micro: float  # per micro-benchmark comparison (both sides together)
    micro_reps: int
    net: float  # target duration of one PeerNet repetition
    net_reps: int


DEFAULT = Budget(micro=0.8, micro_reps=5, net=1.5, net_reps=3)
QUICK = Budget(micro=0.15, micro_reps=3, net=0.4, net_reps=2)


@dataclass
class Row:
    section: str
    case: str
    payload_bytes: int
    measured_s: float  # seconds per operation (message, frame, round trip)
    baseline_s: float
    count: int = 0  # operations per repetition (end-to-end cases)
    extra: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.measured_s / self.baseline_s if self.baseline_s > 0 else math.inf


# --------------------------------------------------------------------------- formatting


def fmt_time(s: float) -> str:
    if s < 1e-6:
        return f"{s * 1e9:.0f} ns"
    if s < 1e-3:
        return f"{s * 1e6:.2f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def fmt_size(n: int) -> str:
    if n >= MIB and n % MIB == 0:
        return f"{n // MIB} MiB"
    if n >= KIB and n % KIB == 0:
        return f"{n // KIB} KiB"
    return f"{n} B"


def fmt_ratio(x: float) -> str:
    return f"{x:.2f}" if x < 100 else f"{x:,.0f}"


def fmt_rate(row: Row, seconds: float) -> str:
    if seconds <= 0:
        return "-"
    if row.section == "latency":
        return f"{1 / seconds:,.0f} rt/s"
    if row.payload_bytes >= 64 * KIB:
        return f"{row.payload_bytes / seconds / MIB:,.0f} MiB/s"
    return f"{1 / seconds:,.0f} op/s"


# --------------------------------------------------------------------------- environment


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _openssl_version() -> str:
    try:
        from cryptography.hazmat.backends.openssl.backend import backend

        return backend.openssl_version_text()
    except Exception:  # the version string is informative only
        return "unknown"


def cipher_suites_name() -> str:
    """The frame AEAD two nodes of this machine negotiate (network.cipher = "auto")."""
    return CIPHER_NAMES[cipher_suites("auto")[0]]


def environment(loop_name: str) -> dict:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = []
    return {
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpus_usable": usable,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cryptography": cryptography.__version__,
        "openssl": _openssl_version(),
        "msgpack": ".".join(map(str, msgpack.version)),
        "event_loop": loop_name,
        "frame_cipher": cipher_suites_name(),
        "load_average_start": load,
    }


# --------------------------------------------------------------------------- micro timing


def _per_call(fn: Callable[[], object], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def _calls_for(fn: Callable[[], object], seconds: float) -> int:
    """How many calls of ``fn`` take about ``seconds`` (at least one)."""
    n = 1
    while True:
        total = _per_call(fn, n) * n
        if total >= 0.005 or n >= 1 << 20:
            return max(1, int(seconds / (total / n)))
        n *= 4


def compare(
    measured: Callable[[], object], baseline: Callable[[], object], budget: Budget
) -> tuple[float, float]:
    """Best per-call seconds of both, over interleaved repetitions within ``budget.micro``."""
    measured()
    baseline()
    per_rep = budget.micro / (2 * budget.micro_reps)
    n_m = _calls_for(measured, per_rep)
    n_b = _calls_for(baseline, per_rep)
    best_m = best_b = math.inf
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(budget.micro_reps):
            best_b = min(best_b, _per_call(baseline, n_b))
            best_m = min(best_m, _per_call(measured, n_m))
    finally:
        if gc_was_enabled:
            gc.enable()
    return best_m, best_b


def payload_array(nbytes: int) -> np.ndarray:
    return np.random.default_rng(nbytes).standard_normal(max(1, nbytes // 8))


# --------------------------------------------------------------------------- 1. wire envelope


def wire_case(size: int, budget: Budget) -> list[Row]:
    arr = payload_array(size)
    msg = Message("value", round=3, step=7, payload=arr, meta={"from": 0})
    encoded = encode_message(msg)
    raw = arr.tobytes()
    if decode_message(encoded) != msg:
        raise RuntimeError(f"wire round trip of {size} bytes does not give the message back")
    enc = compare(lambda: encode_message(msg), arr.tobytes, budget)
    dec = compare(
        lambda: decode_message(encoded), lambda: np.frombuffer(raw, dtype=np.float64), budget
    )
    label = fmt_size(size)
    extra = {"envelope_bytes": len(encoded)}
    rows = [
        Row("wire", f"encode {label}", size, *enc, extra=extra),
        Row("wire", f"decode {label}", size, *dec, extra=extra),
        Row("wire", f"encode+decode {label}", size, enc[0] + dec[0], enc[1] + dec[1]),
    ]
    if size >= MIB:
        # np.frombuffer is O(1), so for large payloads the decode ratio above only says that
        # decoding is not free. A decoder that hands out an owned array costs one copy: this
        # row says how many such copies decode_message costs.
        copy = compare(
            lambda: decode_message(encoded),
            lambda: np.frombuffer(raw, dtype=np.float64).copy(),
            budget,
        )
        rows.append(Row("wire", f"decode {label} (vs frombuffer+copy)", size, *copy))
    return rows


def bench_wire(budget: Budget) -> list[Row]:
    return [row for size in WIRE_SIZES for row in wire_case(size, budget)]


# --------------------------------------------------------------------------- 2. channel frames


def _keys(n: int) -> tuple[dict[int, X25519PrivateKey], dict[int, bytes]]:
    keys = {i: X25519PrivateKey.generate() for i in range(n)}
    roster = {
        i: k.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw) for i, k in keys.items()
    }
    return keys, roster


def channel_pair() -> tuple[SecureChannel, SecureChannel]:
    """An established initiator/responder pair, handshake done in memory."""
    keys, roster = _keys(2)
    a = SecureChannel(
        local_id=0,
        static_key=keys[0],
        roster_keys=roster,
        run_id=RUN_ID,
        initiator=True,
        peer_id=1,
    )
    b = SecureChannel(
        local_id=1, static_key=keys[1], roster_keys=roster, run_id=RUN_ID, initiator=False
    )
    a.start()
    for _ in range(8):
        if a.established and b.established:
            return a, b
        out = a.data_to_send()
        if out:
            b.receive_data(out)
        out = b.data_to_send()
        if out:
            a.receive_data(out)
    raise RuntimeError("in-memory handshake did not complete")


def frame_case(a: SecureChannel, b: SecureChannel, size: int, budget: Budget) -> Row:
    payload = payload_array(size).tobytes()[:size]
    a.send(payload)
    got = b.receive_data(a.data_to_send())
    if len(got) != 1 or not isinstance(got[0], MessageReceived) or got[0].payload != payload:
        raise RuntimeError(f"channel did not deliver a {size}-byte frame intact")

    def frame() -> bytes:
        a.send(payload)
        (event,) = b.receive_data(a.data_to_send())
        return event.payload  # type: ignore[union-attr]

    # The bare AEAD, with a frame header as associated data and a fresh counter nonce per
    # frame like the channel's; the key is random and dropped after the run.
    aead = AESGCM if a.cipher == "aes-256-gcm" else ChaCha20Poly1305
    key = bytes(32)  # any 32 bytes: only the speed is measured
    sender, receiver = aead(key), aead(key)
    header = _FRAME_HEADER.pack(size + 16, 0, 0)
    counter = itertools.count()

    def bare() -> bytes:
        nonce = b"\x00\x00\x00\x00" + next(counter).to_bytes(8, "big")
        return receiver.decrypt(nonce, sender.encrypt(nonce, payload, header), header)

    return Row("frame", f"frame {fmt_size(size)}", size, *compare(frame, bare, budget))


def bench_frames(budget: Budget) -> list[Row]:
    a, b = channel_pair()
    try:
        return [frame_case(a, b, size, budget) for size in FRAME_SIZES]
    finally:
        a.close()
        b.close()


# --------------------------------------------------------------------------- 3. loopback


def loopback_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOOPBACK, 0))
    return sock


class PeerPair:
    """Two PeerNet nodes (0 sends, 1 receives) connected over loopback."""

    def __init__(self) -> None:
        keys, roster = _keys(2)
        self.socks = {i: loopback_socket() for i in (0, 1)}
        addresses = {i: s.getsockname()[:2] for i, s in self.socks.items()}
        self.nets = [
            PeerNet(
                node_id=i,
                static_key=keys[i],
                roster_keys=roster,
                addresses=addresses,
                run_id=RUN_ID,
                neighbours=[1 - i],
                reconnect=False,
                handshake_timeout=10.0,
            )
            for i in (0, 1)
        ]

    async def open(self) -> None:
        for net in self.nets:
            await net.start(self.socks[net.node_id])
        await asyncio.gather(*(net.connect(EVENT_TIMEOUT) for net in self.nets))

    async def close(self) -> None:
        await asyncio.gather(*(net.close() for net in self.nets))
        for sock in self.socks.values():
            sock.close()


class StreamPair:
    """A plain asyncio stream connection over loopback: client writes, server side reads."""

    def __init__(self) -> None:
        self.sock = loopback_socket()
        self.server: asyncio.Server | None = None
        self.client: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.accepted: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._extra: list[asyncio.StreamWriter] = []

    async def open(self) -> None:
        arrived: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
        arrived = asyncio.get_running_loop().create_future()

        def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if arrived.done():
                self._extra.append(writer)
                writer.close()
            else:
                arrived.set_result((reader, writer))

        self.server = await asyncio.start_server(
            on_connection, sock=self.sock, limit=BASELINE_LIMIT
        )
        host, port = self.sock.getsockname()[:2]
        async with asyncio.timeout(EVENT_TIMEOUT):
            self.client = await asyncio.open_connection(host, port, limit=BASELINE_LIMIT)
            self.accepted = await arrived

    async def close(self) -> None:
        writers = [pair[1] for pair in (self.client, self.accepted) if pair is not None]
        writers += self._extra
        for w in writers:
            w.close()
        for w in writers:
            try:
                async with asyncio.timeout(5.0):
                    await w.wait_closed()
            except (TimeoutError, OSError):
                w.transport.abort()
        if self.server is not None:
            self.server.close()
            async with asyncio.timeout(5.0):
                await self.server.wait_closed()
        self.sock.close()


async def _next_message(net: PeerNet) -> Message:
    ev = await net.next_event(EVENT_TIMEOUT)
    if not isinstance(ev, Inbound):
        raise RuntimeError(f"node {net.node_id}: expected a message, got {ev!r}")
    return ev.message


async def peer_stream(pair: PeerPair, msg: Message, n: int) -> float:
    """Seconds for node 0 to send n messages and node 1 to take all of them from next_event."""
    src, dst = pair.nets

    async def produce() -> None:
        for _ in range(n):
            await src.send(1, msg)

    async def consume() -> None:
        for _ in range(n):
            await _next_message(dst)

    t0 = time.perf_counter()
    await asyncio.gather(produce(), consume())
    return time.perf_counter() - t0


async def plain_stream(pair: StreamPair, arr: np.ndarray, n: int) -> float:
    """The same as :func:`peer_stream` with length-prefixed raw array bytes on plain streams."""
    assert pair.client is not None and pair.accepted is not None
    writer = pair.client[1]
    reader = pair.accepted[0]

    async def produce() -> None:
        for _ in range(n):
            data = arr.tobytes()
            writer.writelines([_LEN.pack(len(data)), data])
            await writer.drain()

    async def consume() -> None:
        for _ in range(n):
            (length,) = _LEN.unpack(await reader.readexactly(_LEN.size))
            np.frombuffer(await reader.readexactly(length), dtype=np.float64)

    t0 = time.perf_counter()
    await asyncio.gather(produce(), consume())
    return time.perf_counter() - t0


async def peer_pingpong(pair: PeerPair, msg: Message, n: int) -> list[float]:
    """Round-trip times: node 0 sends, node 1 echoes the message back as soon as it arrives."""
    a, b = pair.nets

    async def echo() -> None:
        for _ in range(n):
            await b.send(0, await _next_message(b))

    task = asyncio.create_task(echo())
    rtts = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            await a.send(1, msg)
            await _next_message(a)
            rtts.append(time.perf_counter() - t0)
        await task
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return rtts


async def plain_pingpong(pair: StreamPair, arr: np.ndarray, n: int) -> list[float]:
    assert pair.client is not None and pair.accepted is not None
    c_reader, c_writer = pair.client
    s_reader, s_writer = pair.accepted

    async def echo() -> None:
        for _ in range(n):
            (length,) = _LEN.unpack(await s_reader.readexactly(_LEN.size))
            data = await s_reader.readexactly(length)
            s_writer.writelines([_LEN.pack(length), data])
            await s_writer.drain()

    task = asyncio.create_task(echo())
    rtts = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            data = arr.tobytes()
            c_writer.writelines([_LEN.pack(len(data)), data])
            await c_writer.drain()
            (length,) = _LEN.unpack(await c_reader.readexactly(_LEN.size))
            np.frombuffer(await c_reader.readexactly(length), dtype=np.float64)
            rtts.append(time.perf_counter() - t0)
        await task
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return rtts


def _count_for(per_op: float, budget: Budget, lo: int, hi: int) -> int:
    return max(lo, min(hi, int(budget.net / max(per_op, 1e-9))))


async def bench_network(budget: Budget) -> tuple[list[Row], int]:
    rows: list[Row] = []
    traffic = 0
    peers, plain = PeerPair(), StreamPair()
    try:
        await peers.open()
        await plain.open()

        # A first message checks the path end to end before anything is timed.
        probe = Message("value", round=0, step=0, payload=payload_array(64))
        await peers.nets[0].send(1, probe)
        if await _next_message(peers.nets[1]) != probe:
            raise RuntimeError("the message received differs from the message sent")

        # (payload size, warm-up count, min and max count: the max bounds the traffic)
        for size, warm, lo, hi in ((64, 500, 1_000, 100_000), (MIB, 8, 16, 256)):
            arr = payload_array(size)
            msg = Message("value", round=1, step=0, payload=arr)
            per_op = await peer_stream(peers, msg, warm) / warm
            await plain_stream(plain, arr, warm)
            n = _count_for(per_op, budget, lo, hi)
            best_p = best_b = math.inf
            for _ in range(budget.net_reps):
                best_b = min(best_b, await plain_stream(plain, arr, n))
                best_p = min(best_p, await peer_stream(peers, msg, n))
            traffic += 2 * warm * size + budget.net_reps * 2 * n * size
            rows.append(
                Row(
                    "throughput",
                    f"stream {fmt_size(size)} x {n}",
                    size,
                    best_p / n,
                    best_b / n,
                    count=n,
                )
            )

        size = 64
        arr = payload_array(size)
        msg = Message("value", round=1, step=0, payload=arr)
        warm = 200
        per_op = statistics.median(await peer_pingpong(peers, msg, warm))
        await plain_pingpong(plain, arr, warm)
        n = _count_for(per_op, budget, 500, 20_000)
        peer_rtts: list[float] = []
        plain_rtts: list[float] = []
        for _ in range(budget.net_reps):
            plain_rtts += await plain_pingpong(plain, arr, n)
            peer_rtts += await peer_pingpong(peers, msg, n)
        traffic += 4 * warm * size + budget.net_reps * 4 * n * size
        p50_p, p50_b = statistics.median(peer_rtts), statistics.median(plain_rtts)
        p99_p = float(np.percentile(peer_rtts, 99))
        p99_b = float(np.percentile(plain_rtts, 99))
        rows.append(
            Row(
                "latency",
                f"ping-pong {fmt_size(size)}, median",
                size,
                p50_p,
                p50_b,
                count=n,
            )
        )
        rows.append(Row("latency", f"ping-pong {fmt_size(size)}, p99", size, p99_p, p99_b, count=n))
    finally:
        await plain.close()
        await peers.close()
    return rows, traffic


async def _network_main(budget: Budget) -> tuple[list[Row], int]:
    # Under asyncio debug mode (python -X dev) sending a burst of large messages legitimately
    # runs longer than the default 0.1 s slow-callback threshold; that is not worth a warning.
    asyncio.get_running_loop().slow_callback_duration = 5.0
    async with asyncio.timeout(NETWORK_DEADLINE):
        return await bench_network(budget)


def run_network(budget: Budget, loop_choice: str) -> tuple[list[Row], int, str]:
    factory = None
    name = "asyncio (stdlib)"
    if loop_choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if loop_choice == "uvloop":
                raise SystemExit("--loop uvloop: uvloop is not installed") from None
        else:
            factory = uvloop.new_event_loop
            name = f"uvloop {uvloop.__version__}"
    with asyncio.Runner(loop_factory=factory) as runner:
        rows, traffic = runner.run(_network_main(budget))
    return rows, traffic, name


# --------------------------------------------------------------------------- main


TITLES = {
    "wire": "wire envelope, float64 payload: encode_message / decode_message "
    "vs ndarray.tobytes / np.frombuffer",
    "frame": "SecureChannel data frame, send + receive_data in memory "
    "vs bare encrypt + decrypt with the negotiated AEAD",
    "throughput": "PeerNet send -> next_event over loopback "
    "vs plain asyncio streams (length prefix + raw bytes), time per message",
    "latency": "PeerNet ping-pong round trip vs plain asyncio streams",
}


def print_table(env: dict, rows: list[Row], traffic: int, elapsed: float, quick: bool) -> None:
    print("bench_transport: ratio = measured time / baseline time, same run (1.0 = baseline)")
    print(
        f"  machine: {env['machine']}, {env['cpu']}, {env['cpus_usable']} usable CPUs, "
        f"{env['platform']}"
    )
    print(
        f"  python {env['python']}, numpy {env['numpy']}, cryptography {env['cryptography']} "
        f"({env['openssl']}), msgpack {env['msgpack']}"
    )
    print(
        f"  event loop: {env['event_loop']}; frame cipher: {env['frame_cipher']}; "
        f"mode: {'quick' if quick else 'default'}"
    )
    print(f"  load average at start {env['load_average_start']}, at end {env['load_average_end']}")
    width = max(len(r.case) for r in rows) + 2
    for section, title in TITLES.items():
        sect = [r for r in rows if r.section == section]
        if not sect:
            continue
        print()
        print(f"[{section}] {title}")
        print(
            f"  {'case':<{width}}{'measured':>12}{'baseline':>12}{'ratio':>8}"
            f"{'measured rate':>18}{'baseline rate':>18}"
        )
        for r in sect:
            print(
                f"  {r.case:<{width}}{fmt_time(r.measured_s):>12}{fmt_time(r.baseline_s):>12}"
                f"{fmt_ratio(r.ratio):>10}{fmt_rate(r, r.measured_s):>18}{fmt_rate(r, r.baseline_s):>18}"
            )
    print()
    print(f"loopback traffic {traffic / MIB:,.0f} MiB of payload; total {elapsed:.1f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="about 10 s instead of about 30 s")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument(
        "--loop",
        choices=("auto", "uvloop", "asyncio"),
        default="auto",
        help="event loop for the network part (auto: uvloop if installed)",
    )
    args = ap.parse_args()
    budget = QUICK if args.quick else DEFAULT

    t0 = time.perf_counter()
    env = environment("")
    rows = bench_wire(budget)
    rows += bench_frames(budget)
    net_rows, traffic, loop_name = run_network(budget, args.loop)
    rows += net_rows
    elapsed = time.perf_counter() - t0
    env["event_loop"] = loop_name
    try:
        env["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        env["load_average_end"] = []

    if args.json:
        out = {
            "environment": env,
            "mode": "quick" if args.quick else "default",
            "budget": asdict(budget),
            "ratio": "measured time / baseline time, both measured in this run",
            "loopback_payload_bytes": traffic,
            "elapsed_s": elapsed,
            "results": [{**asdict(r), "ratio": r.ratio, "count": r.count or None} for r in rows],
        }
        print(json.dumps(out, indent=2))
    else:
        print_table(env, rows, traffic, elapsed, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
