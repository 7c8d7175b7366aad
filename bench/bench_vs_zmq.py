"""cfree against a decentralizepy-style transport: the same ring gossip, in the same run.

Both sides run synchronous gossip averaging on a ring of N nodes (16 by default), every node its
own OS process on this machine, for S steps: each step a node sends its vector to both
neighbours, waits for both of theirs, and averages.

- **cfree**: ``cfree run``'s local launcher (peers forked from the fork server) with Muffliato,
  plain (non-accelerated) gossip: authenticated encrypted channels, msgpack envelopes, Gaussian
  noise, every received value written to the node's view log, as users run it.
- **zmq**: the transport decentralizepy uses: a ZeroMQ ROUTER socket per node to receive, a
  DEALER per neighbour to send (identity = node id), messages as pickled dicts holding the numpy
  vector; unencrypted, unauthenticated, nothing logged.

steps/s = S / (time the last node finished - time the last node was connected), on the same
monotonic clock for both (every process reports to the launcher); each side runs ``--repeat``
times (3), alternating, and its best run counts. The ratio is cfree's steps/s over zmq's: 1.0
means as fast. cfree runs twice: with every received value in the view logs (the default,
``log.values = true``) and with their digests only (``log.values = false``; the audit is the
same, only ``cfree attack`` needs the values).

Needs pyzmq (``pip install -e '.[bench]'``). Run: ``python bench/bench_vs_zmq.py [--nodes 16]
[--json]``. Prints numbers; asserts nothing about timing. ``--budget``: where one cfree peer's
CPU time per step goes, by part of the stack. ``--floor``: each side's CPU per node and step,
and the least a cfree step can cost (its digests, AEAD passes, logged values and loopback TCP
messages alone), so the highest ratio this machine allows and what the code around those
primitives costs. ``--skeleton``: ZeroMQ, a skeleton ring (nodes that do the same digests, AEAD
passes and logged values with the least Python and asyncio around them: no handshake, envelope,
validation, engine or faults), a ring on cfree's transport alone (its channels, frames,
envelopes, stream readers and event queue, with a bare step loop: no engine, digests or view
log) and cfree in the same run, values logged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import pickle
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from coordinator_free import config as config_mod
from coordinator_free.cluster import local
from coordinator_free.peer import budget as peer_budget

#: (label, float64 entries per vector, steps). Long enough that both sides run warm: over the
#: first few hundred steps of small vectors ZeroMQ is still speeding up, and over the first
#: sixty of 1 MiB cfree is (a ring of 1 MiB values with digests only: 8.8 steps/s over 60
#: steps, 12.9 over 240; its peers' buffers are still being allocated and first touched).
CASES = (("small (8 floats)", 8, 2000), ("1 MiB (131072 floats)", 131072, 300))


def _cases(args, least: int = 2):
    """``CASES`` (or the one ``--only`` names) with every case's steps scaled by
    ``--steps-scale`` (at least ``least``)."""
    for label, dim, steps in CASES:
        if args.only and (args.only == "small") != (dim == CASES[0][1]):
            continue
        yield label, dim, max(least, round(steps * args.steps_scale))


# --------------------------------------------------------------------------- zmq side


def _zmq_node(node: int, n: int, dim: int, steps: int, ports_in, report) -> None:
    import zmq

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    report.put(("port", node, port))
    ports = ports_in.get()
    nbrs = [(node - 1) % n, (node + 1) % n]
    dealers = {}
    for j in nbrs:
        d = ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.IDENTITY, str(node).encode())
        d.connect(f"tcp://127.0.0.1:{ports[j]}")
        dealers[j] = d
    # Connected once a hello has arrived from every neighbour (each sends one on each DEALER).
    hellos: set[int] = set()
    byes: set[int] = set()
    pending: dict[int, dict[int, np.ndarray]] = {}  # values by step, the future ones included

    def receive() -> None:
        _, data = router.recv_multipart()
        m = pickle.loads(data)
        if "hello" in m:
            hellos.add(m["hello"])
        elif "bye" in m:
            byes.add(m["bye"])
        else:
            pending.setdefault(m["step"], {})[m["sender"]] = m["params"]

    for d in dealers.values():
        d.send(pickle.dumps({"hello": node}))
    while len(hellos) < len(nbrs):
        receive()
    report.put(("connected", node, time.monotonic()))
    x = np.random.default_rng(node).random(dim)
    for t in range(steps):
        for d in dealers.values():
            d.send(pickle.dumps({"step": t, "sender": node, "params": x}))
        while len(pending.get(t, ())) < len(nbrs):
            receive()
        got = pending.pop(t)
        x = (x + got[nbrs[0]] + got[nbrs[1]]) / 3.0
    report.put(("finished", node, time.monotonic()))
    # Leave once both neighbours are done too (their last messages must not be cut off).
    for d in dealers.values():
        d.send(pickle.dumps({"bye": node}))
    while len(byes) < len(nbrs):
        receive()
    for s in (router, *dealers.values()):
        s.close(linger=1000)
    ctx.term()


def _ring(args_of, target, n: int, steps: int) -> float:
    """steps/s of a ring of ``n`` forked processes running ``target(*args_of(i, inbox,
    report))``: each reports ``("port", i, port)``, gets every node's port from its inbox, then
    reports when it is ``connected`` and when ``finished``; from the last connected to the last
    finished."""
    ctx = mp.get_context("fork")
    report = ctx.Queue()
    inboxes = [ctx.Queue() for _ in range(n)]
    procs = [ctx.Process(target=target, args=args_of(i, inboxes[i], report)) for i in range(n)]
    for p in procs:
        p.start()
    try:
        ports = {}
        while len(ports) < n:
            _, node, port = report.get(timeout=60)
            ports[node] = port
        for q in inboxes:
            q.put(ports)
        times: dict[str, dict[int, float]] = {"connected": {}, "finished": {}}
        while len(times["finished"]) < n:
            kind, node, t = report.get(timeout=600)
            times[kind][node] = t
        for p in procs:
            p.join(60)
            if p.exitcode != 0:
                raise SystemExit(f"{target.__name__}: a node exited with {p.exitcode}")
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return steps / (max(times["finished"].values()) - max(times["connected"].values()))


def zmq_gossip(n: int, dim: int, steps: int) -> float:
    """steps/s of the zmq ring."""
    return _ring(lambda i, inbox, report: (i, n, dim, steps, inbox, report), _zmq_node, n, steps)


# --------------------------------------------------------------------------- skeleton side


def _skeleton_node(
    node: int, n: int, dim: int, steps: int, log_path: str | None, ports_in, report
) -> None:
    """A ring node doing the work of a cfree step and nothing else: what the least Python
    around that work costs. One asyncio protocol (uvloop) per neighbour link, one callback per
    read and one per step; per step it digests the value it sends and the two it receives
    (SHA-256), seals a frame to each neighbour and opens one from each (AES-256-GCM, a counter
    nonce, the frame's length as associated data), appends the step's records (the sent
    value's digest, each received value's digest and, with ``log_path``, the value, each with
    a CRC-32) to its log in one write (its old pages advised out of the page cache, as a view
    log's are), and averages. No handshake (fixed keys), no envelope,
    no validation, no engine, no faults: not a peer, a measure of Python and asyncio."""
    import asyncio
    import hashlib
    import struct

    import uvloop
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from coordinator_free.viewlog import crc32, value_digest

    length = struct.Struct(">I")
    record = struct.Struct(">IIQI")  # length, CRC-32, step, sender
    nonce = struct.Struct(">4xQ")
    bye = (1 << 64) - 1
    left, right = (node - 1) % n, (node + 1) % n

    def key(a: int, b: int) -> AESGCM:
        return AESGCM(hashlib.sha256(b"skeleton %d %d" % (a, b)).digest())

    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND) if log_path else None
    if fd is None:
        fd = os.open(os.devnull, os.O_WRONLY)
    state = {"t": 0, "x": np.random.default_rng(node).random(dim), "links": {}, "byes": set()}
    pending: dict[int, dict[int, np.ndarray]] = {}
    pieces: list[bytes] = []
    done = asyncio.Event()

    def log(step: int, sender: int, value: np.ndarray, with_value: bool) -> None:
        body = value_digest(value).encode()
        if with_value:
            body += value.tobytes()
        pieces.append(record.pack(len(body) + 12, crc32(body), step, sender) + body)

    class Link(asyncio.Protocol):
        def __init__(self, peer: int | None = None) -> None:
            self.peer = peer
            self.buf = bytearray()
            self.sent = self.got = 0

        def connection_made(self, transport) -> None:
            self.transport = transport
            if self.peer is None:  # the server side: the only one to connect is the left
                self.peer = left
            self.seal, self.open = key(node, self.peer), key(self.peer, node)
            state["links"][self.peer] = self
            if len(state["links"]) == 2:
                report.put(("connected", node, time.monotonic()))
                for link in state["links"].values():
                    link.send(0, state["x"])

        def send(self, step: int, value: np.ndarray | None) -> None:
            plain = struct.pack(">Q", step) + (b"" if value is None else value.tobytes())
            head = length.pack(len(plain) + 16)
            sealed = self.seal.encrypt(nonce.pack(self.sent), plain, head)
            self.sent += 1
            self.transport.writelines((head, sealed))

        def data_received(self, data: bytes) -> None:
            buf = self.buf
            buf += data
            while len(buf) >= 4:
                size = length.unpack_from(buf)[0]
                if len(buf) < 4 + size:
                    break
                plain = self.open.decrypt(nonce.pack(self.got), bytes(buf[4 : 4 + size]), buf[:4])
                self.got += 1
                del buf[: 4 + size]
                step = struct.unpack_from(">Q", plain)[0]
                if step == bye:
                    state["byes"].add(self.peer)
                    if len(state["byes"]) == 2 and state["t"] == steps:
                        done.set()
                    continue
                pending.setdefault(step, {})[self.peer] = np.frombuffer(plain, offset=8)
            advance()

    def advance() -> None:
        t = state["t"]
        while t < steps and len(pending.get(t, ())) == 2:
            got = pending.pop(t)
            x = state["x"]
            log(t, node, x, False)
            for sender, value in got.items():
                log(t, sender, value, log_path is not None)
            state["written"] = state.get("written", 0) + os.writev(fd, pieces)
            pieces.clear()
            if state["written"] >= state.get("advised", 0) + (16 << 20):
                # As a view log does: pages more than 8 MiB behind the end leave the cache.
                state["advised"] = state["written"]
                os.posix_fadvise(fd, 0, state["written"] - (8 << 20), os.POSIX_FADV_DONTNEED)
            x = (x + got[left] + got[right]) / 3.0
            state["x"], t = x, t + 1
            state["t"] = t
            if t < steps:
                for link in state["links"].values():
                    link.send(t, x)
        if t == steps and "finished" not in state:
            state["finished"] = True
            report.put(("finished", node, time.monotonic()))
            for link in state["links"].values():
                link.send(bye, None)
            if len(state["byes"]) == 2:
                done.set()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Link, "127.0.0.1", 0)
        report.put(("port", node, server.sockets[0].getsockname()[1]))
        ports = await loop.run_in_executor(None, ports_in.get)
        await loop.create_connection(lambda: Link(right), "127.0.0.1", ports[right])
        await done.wait()
        for link in state["links"].values():
            link.transport.close()
        server.close()

    uvloop.run(main())
    os.close(fd)


def skeleton_gossip(n: int, dim: int, steps: int, work: Path, log_values: bool) -> float:
    """steps/s of the skeleton ring (:func:`_skeleton_node`)."""
    work.mkdir(parents=True, exist_ok=True)
    try:
        return _ring(
            lambda i, inbox, report: (
                i,
                n,
                dim,
                steps,
                str(work / f"log-{i}") if log_values else None,
                inbox,
                report,
            ),
            _skeleton_node,
            n,
            steps,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _transport_node(
    node: int, n: int, dim: int, steps: int, keys, roster, socks, ports_in, report
) -> None:
    """A ring node on cfree's transport alone (:class:`PeerNet`: authenticated channels, AEAD
    frames, envelopes, the stream readers and the event queue) with a bare step loop: no step
    engine, no digests, no view log. Between the skeleton and cfree: what the transport costs."""
    import asyncio

    import uvloop

    from coordinator_free.net.transport import Inbound, PeerNet
    from coordinator_free.net.wire import Message

    left, right = (node - 1) % n, (node + 1) % n
    addresses = {i: sock.getsockname()[:2] for i, sock in socks.items()}
    for i, sock in socks.items():
        if i != node:
            sock.close()

    async def main() -> None:
        net = PeerNet(
            node_id=node,
            static_key=keys[node],
            roster_keys=roster,
            addresses=addresses,
            run_id=b"bench-transport-ring",
            neighbours=[left, right],
            reconnect=False,
            handshake_timeout=60.0,
        )
        report.put(("port", node, addresses[node][1]))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, ports_in.get)
        await net.start(socks[node])
        await net.connect(120.0)
        report.put(("connected", node, time.monotonic()))
        pending: dict[int, dict[int, np.ndarray]] = {}
        done: set[int] = set()

        async def take() -> None:
            ev = await net.next_event(120.0)
            if isinstance(ev, Inbound):
                if ev.message.kind == "done":
                    done.add(ev.peer)
                else:
                    pending.setdefault(ev.message.step, {})[ev.peer] = ev.message.payload
            elif ev is None:
                raise SystemExit(f"transport node {node}: nothing arrived within 120 s")

        x = np.random.default_rng(node).random(dim)
        for t in range(steps):
            msg = Message(kind="value", round=0, step=t, payload=x)
            parts = net.encode(msg)
            for peer in (left, right):
                wait = net.send_now(peer, msg, parts=parts)
                if wait is not None:
                    await wait
            while len(pending.get(t, ())) < 2:
                await take()
            got = pending.pop(t)
            x = (x + got[left] + got[right]) / 3.0
        report.put(("finished", node, time.monotonic()))
        bye = Message(kind="done", round=0, step=steps)
        for peer in (left, right):
            await net.send(peer, bye)
        while len(done) < 2:
            await take()
        await net.close()

    uvloop.run(main())


def transport_gossip(n: int, dim: int, steps: int) -> float:
    """steps/s of the ring on cfree's transport alone (:func:`_transport_node`)."""
    import socket

    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    keys = {i: X25519PrivateKey.generate() for i in range(n)}
    roster = {
        i: k.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw) for i, k in keys.items()
    }
    socks = {}
    for i in range(n):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        socks[i] = sock
    try:
        return _ring(
            lambda i, inbox, report: (i, n, dim, steps, keys, roster, socks, inbox, report),
            _transport_node,
            n,
            steps,
        )
    finally:
        for sock in socks.values():
            sock.close()


# --------------------------------------------------------------------------- cfree side


def cfree_gossip(
    n: int, dim: int, steps: int, work: Path, log_values: bool, budget: Path | None = None
) -> float:
    """steps/s of the cfree ring (real peers, fork-server start); ``log_values``: every
    received value in the view logs (the default), or only its digest (``log.values=false``).
    With ``budget``, node 0 counts where its CPU time goes and writes it there
    (``coordinator_free/peer/budget.py``)."""
    cfg = config_mod.load(
        None,
        [
            "graph.kind=ring",
            f"graph.nodes={n}",
            f"protocol.steps={steps}",
            "protocol.accelerated=false",
            f"data.dim={dim}",
            f"log.values={'true' if log_values else 'false'}",
        ],
    )
    out = work / f"cfree-{dim}-{log_values}"
    local.prepare_run_dir(cfg, out)
    times: dict[str, dict[int, float]] = {"connected": {}, "finished": {}}

    def on_event(node: int, ev: dict, pid: int) -> None:
        if ev.get("event") in times:
            times[ev["event"]][node] = time.monotonic()

    on_event.needs_steps = False  # as `cfree run` without faults: steps reported 10 times a second

    if budget is not None:
        os.environ[peer_budget.ENV] = f"0:{budget}"
    try:
        run = asyncio.run(local.launch_peers(cfg, out, show_progress=False, on_event=on_event))
    finally:
        os.environ.pop(peer_budget.ENV, None)
    # A 1 MiB ring with every value logged writes about 32 MiB of view logs a step (9.6 GB
    # over 300 steps): each run's directory goes as soon as it is measured.
    shutil.rmtree(out, ignore_errors=True)
    if run.failed or len(times["finished"]) != n:
        first = run.failed[0] if run.failed else None
        why = f"; node {first.node}: {first.error}" if first is not None and first.error else ""
        raise SystemExit(f"cfree: {len(run.failed)} peer(s) failed{why}")
    return steps / (max(times["finished"].values()) - max(times["connected"].values()))


def _json_or_head(args, rows: list, load0: tuple, head: str) -> bool:
    """Print a mode's rows as JSON (``--json``: True), or its heading and the load averages at
    its start and now."""
    load1 = os.getloadavg()
    if args.json:
        print(json.dumps({"nodes": args.nodes, "load": [load0, load1], "rows": rows}, indent=1))
        return True
    print(head)
    print(f"load average at start {load0[0]:.2f}, at end {load1[0]:.2f}")
    return False


def budget_main(args) -> int:
    """Node 0's CPU time per step, by part (``coordinator_free/peer/budget.py``), for every
    case, with every received value logged (the default) and with digests only."""
    rows = []
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="cfree-bench-budget-") as tmp:
        for label, dim, steps in _cases(args):
            for log_values in (True, False):
                best = None
                for k in range(args.repeat):
                    path = Path(tmp) / f"budget-{dim}-{log_values}-{k}.json"
                    rate = cfree_gossip(
                        args.nodes, dim, steps, Path(tmp) / str(k), log_values, budget=path
                    )
                    got = json.loads(path.read_text())
                    got["steps_per_s"] = rate
                    if best is None or got["cpu_s"] < best["cpu_s"]:
                        best = got
                assert best is not None
                best.update(case=label, dim=dim, log_values=log_values)
                rows.append(best)
    head = (
        f"ring of {args.nodes} nodes; node 0's CPU time per step by part, in microseconds "
        f"(share of its total), the run with the least CPU of {args.repeat}"
    )
    if _json_or_head(args, rows, load0, head):
        return 0
    for r in rows:
        per = 1e6 / r["steps"]
        total = r["cpu_s"] * per
        what = "values logged" if r["log_values"] else "digests only"
        print(
            f"\n{r['case']}, {what}: {total:.0f} us per step "
            f"(ring {r['steps_per_s']:.1f} steps/s, {r['steps']} steps; "
            f"{r['page_faults'] / r['steps']:.0f} page faults per step)"
        )
        for part in peer_budget.PARTS:
            us = r["parts_s"][part] * per
            print(f"  {part:<18} {us:>9.1f} us {100 * us / total:>6.1f} %")
    return 0


# --------------------------------------------------------------------------- floor


def _cpu_children() -> float:
    """CPU time (user + system) of this process and of every process it has waited for."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def ring_cpu_per_step(run, n: int, steps: int) -> tuple[float, float]:
    """(CPU seconds per node and step, steps/s) of a ring: ``run(steps)`` once with ``steps``
    and once with a quarter of them, so that what a run spends once (start-up, connecting,
    closing) cancels out of the difference."""
    few = max(1, steps // 4)
    c0 = _cpu_children()
    run(few)
    c1 = _cpu_children()
    rate = run(steps)
    c2 = _cpu_children()
    return max(0.0, (c2 - c1) - (c1 - c0)) / ((steps - few) * n), rate


def _per_call(fn, seconds: float = 0.2) -> float:
    """Thread CPU seconds of one call of ``fn`` (repeated for about ``seconds``)."""
    fn()
    reps, spent = 1, 0.0
    while spent < seconds:
        t = time.thread_time()
        for _ in range(reps):
            fn()
        spent = time.thread_time() - t
        if spent < seconds:
            reps *= 4
    return spent / reps


def step_floor(dim: int, log_values: bool, seconds: float = 0.2) -> dict[str, float]:
    """What one node's gossip step cannot cost less than, whatever the code around it: the
    primitives alone, on this machine, in seconds of CPU. A ring node sends its value to two
    neighbours and receives two: three SHA-256 digests (the value it sends and the two it
    receives, as the audit needs), four AES-256-GCM passes (a frame per neighbour, each way),
    with ``log_values`` two view-log records holding a value (CRC-32 and an append to a file:
    the page cache takes a fresh page for every 4 KiB), two loopback TCP
    messages each way (the kernel's work at both ends, counted once per message), and the
    average of three vectors. Nothing of the step engine, the envelopes, the frames, the
    records' encoding or the event loop is in it. Each primitive repeats for about ``seconds``
    of CPU."""
    import socket

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from coordinator_free import viewlog

    size = 8 * dim
    frame = os.urandom(size + 64)  # the value and an envelope of a few dozen bytes
    value = np.frombuffer(frame[:size], dtype=np.float64)
    aead, nonce = AESGCM(os.urandom(32)), os.urandom(12)
    sealed = aead.encrypt(nonce, frame, b"header")
    out: dict[str, float] = {}
    out["digests (3)"] = 3 * _per_call(lambda: viewlog.value_digest(value), seconds)
    out["AEAD (2 seal, 2 open)"] = 2 * _per_call(
        lambda: aead.encrypt(nonce, frame, b"header"), seconds
    ) + 2 * _per_call(lambda: aead.decrypt(nonce, sealed, b"header"), seconds)
    if log_values:
        with tempfile.TemporaryFile() as fh:
            fd = fh.fileno()

            def record() -> None:  # appended, as a view log's records are
                viewlog.crc32(value)
                os.write(fd, value)

            out["view log values (2)"] = 2 * _per_call(record, seconds)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    a = socket.create_connection(srv.getsockname())
    b, _ = srv.accept()
    srv.close()
    buf = bytearray(1 << 16)
    piece = memoryview(frame)

    def message() -> None:  # both ends in this thread, 64 KiB at a time
        for i in range(0, len(frame), 1 << 16):
            chunk = piece[i : i + (1 << 16)]
            a.sendall(chunk)
            got = 0
            while got < len(chunk):
                got += b.recv_into(buf)

    try:
        out["TCP loopback (2 messages)"] = 2 * _per_call(message, seconds)
    finally:
        a.close()
        b.close()
    x, y, z = (np.random.default_rng(k).random(dim) for k in range(3))
    out["average"] = _per_call(lambda: (x + y + z) / 3.0, seconds)
    return out


def floor_main(args) -> int:
    """Each side's CPU per node and step, and what a cfree step cannot cost less than: the
    highest ratio the targets could reach on this machine with the protocol's work done by
    free code, and what the code around the primitives costs now."""
    rows = []
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="cfree-bench-floor-") as tmp:
        for label, dim, steps in _cases(args, least=4):
            zmq_cpu, zmq_rate = ring_cpu_per_step(
                lambda s, dim=dim: zmq_gossip(args.nodes, dim, s), args.nodes, steps
            )
            # cfree's transport with a bare step loop (no digests, no view log): once per case.
            tr_cpu, tr_rate = ring_cpu_per_step(
                lambda s, dim=dim: transport_gossip(args.nodes, dim, s), args.nodes, steps
            )
            for log_values in (True, False):
                work = Path(tmp) / f"{dim}-{log_values}"

                def cfree(s: int, dim=dim, log_values=log_values, work=work) -> float:
                    return cfree_gossip(args.nodes, dim, s, work / str(s), log_values)

                def skeleton(s: int, dim=dim, log_values=log_values, work=work) -> float:
                    return skeleton_gossip(args.nodes, dim, s, work / f"s{s}", log_values)

                cpu, rate = ring_cpu_per_step(cfree, args.nodes, steps)
                sk_cpu, sk_rate = ring_cpu_per_step(skeleton, args.nodes, steps)
                floor = step_floor(dim, log_values)
                least = sum(floor.values())
                rows.append(
                    {
                        "case": label,
                        "dim": dim,
                        "steps": steps,
                        "log_values": log_values,
                        "zmq_cpu_per_step_s": zmq_cpu,
                        "zmq_steps_per_s": zmq_rate,
                        "cfree_cpu_per_step_s": cpu,
                        "cfree_steps_per_s": rate,
                        "skeleton_cpu_per_step_s": sk_cpu,
                        "skeleton_steps_per_s": sk_rate,
                        "transport_cpu_per_step_s": tr_cpu,
                        "transport_steps_per_s": tr_rate,
                        "floor_s": floor,
                        "floor_per_step_s": least,
                        "ceiling_ratio": zmq_cpu / least,
                        "cpu_ratio": zmq_cpu / cpu if cpu else None,
                    }
                )
    head = (
        f"ring of {args.nodes} nodes; CPU per node and step (start-up cancelled out), and the "
        "floor of a cfree step: its primitives alone"
    )
    if _json_or_head(args, rows, load0, head):
        return 0
    for r in rows:
        what = "values logged" if r["log_values"] else "digests only"
        us = 1e6
        print(f"\n{r['case']}, {what}, {r['steps']} steps")
        print(
            f"  zmq   {r['zmq_cpu_per_step_s'] * us:9.1f} us per step ({r['zmq_steps_per_s']:.1f} "
            "steps/s)"
        )
        print(
            f"  cfree {r['cfree_cpu_per_step_s'] * us:9.1f} us per step "
            f"({r['cfree_steps_per_s']:.1f} steps/s); zmq / cfree CPU: {r['cpu_ratio']:.2f}"
        )
        print(
            f"  skeleton {r['skeleton_cpu_per_step_s'] * us:6.1f} us per step "
            f"({r['skeleton_steps_per_s']:.1f} steps/s): the same primitives, the least Python"
        )
        print(
            f"  transport {r['transport_cpu_per_step_s'] * us:5.1f} us per step "
            f"({r['transport_steps_per_s']:.1f} steps/s): cfree's transport, a bare step loop"
        )
        print(f"  floor {r['floor_per_step_s'] * us:9.1f} us per step:")
        for part, s in r["floor_s"].items():
            print(f"    {part:<28} {s * us:9.1f} us")
        print(
            f"  highest ratio the floor allows (zmq CPU / floor): {r['ceiling_ratio']:.2f}; "
            f"cfree's code around the primitives: "
            f"{(r['cfree_cpu_per_step_s'] - r['floor_per_step_s']) * us:.1f} us per step"
        )
    return 0


def skeleton_main(args) -> int:
    """ZeroMQ, the skeleton ring, the ring on cfree's transport alone and cfree in the same run,
    values logged: how far cfree's per-step code is from the least Python and asyncio around the
    same work, and how much of the distance its transport makes."""
    rows = []
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="cfree-bench-skeleton-") as tmp:
        for label, dim, steps in _cases(args):
            best = {"zmq": 0.0, "skeleton": 0.0, "transport": 0.0, "cfree": 0.0}
            for k in range(args.repeat):  # alternating, so a busy moment hits every side
                work = Path(tmp) / str(k)
                rates = {
                    "zmq": zmq_gossip(args.nodes, dim, steps),
                    "skeleton": skeleton_gossip(args.nodes, dim, steps, work / "skeleton", True),
                    "transport": transport_gossip(args.nodes, dim, steps),
                    "cfree": cfree_gossip(args.nodes, dim, steps, work, True),
                }
                best = {side: max(best[side], rate) for side, rate in rates.items()}
            rows.append(
                {
                    "case": label,
                    "dim": dim,
                    "steps": steps,
                    **{f"{side}_steps_per_s": rate for side, rate in best.items()},
                    **{
                        f"{side}_ratio": best[side] / best["zmq"]
                        for side in ("skeleton", "transport", "cfree")
                    },
                }
            )
    head = (
        f"ring of {args.nodes} nodes, values logged, best of {args.repeat} alternating runs: "
        "steps/s, and the ratio to ZeroMQ"
    )
    if _json_or_head(args, rows, load0, head):
        return 0
    sides = ("skeleton", "transport", "cfree")
    print(
        f"{'case':<24} {'steps':>6} {'ZeroMQ':>9}" + "".join(f" {s:>9} {'ratio':>6}" for s in sides)
    )
    for r in rows:
        print(
            f"{r['case']:<24} {r['steps']:>6} {r['zmq_steps_per_s']:>9.1f}"
            + "".join(f" {r[s + '_steps_per_s']:>9.1f} {r[s + '_ratio']:>6.2f}" for s in sides)
        )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=16, help="ring size (default 16)")
    ap.add_argument("--steps-scale", type=float, default=1.0, help="scale every case's steps")
    ap.add_argument(
        "--repeat", type=int, default=3, help="runs of each side, alternating; the best counts"
    )
    ap.add_argument(
        "--only", choices=("small", "large"), help="run only the 8-floats or the 1 MiB case"
    )
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument(
        "--budget",
        action="store_true",
        help="instead of the comparison: where one peer's CPU time per step goes (cfree only)",
    )
    ap.add_argument(
        "--floor",
        action="store_true",
        help="instead of the comparison: each side's CPU per node and step, and the least a "
        "cfree step can cost (its digests, AEAD, logged values and loopback TCP alone)",
    )
    ap.add_argument(
        "--skeleton",
        action="store_true",
        help="instead of the comparison: ZeroMQ, a skeleton ring (the same digests, AEAD and "
        "logged values with the least Python and asyncio around them), a ring on cfree's "
        "transport alone, and cfree, values logged",
    )
    args = ap.parse_args()
    if args.nodes < 3:
        ap.error("--nodes must be at least 3 (a ring where every node has two neighbours)")
    if args.budget:
        return budget_main(args)
    if args.skeleton:
        return skeleton_main(args)
    if args.floor:
        return floor_main(args)
    try:
        import zmq
    except ImportError:
        print("bench_vs_zmq needs pyzmq: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    rows = []
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="cfree-bench-zmq-") as tmp:
        for label, dim, steps in _cases(args):
            theirs = logged = digests = 0.0
            for k in range(args.repeat):  # alternating, so a busy moment hits every side
                theirs = max(theirs, zmq_gossip(args.nodes, dim, steps))
                work = Path(tmp) / str(k)
                logged = max(logged, cfree_gossip(args.nodes, dim, steps, work, True))
                digests = max(digests, cfree_gossip(args.nodes, dim, steps, work, False))
            rows.append(
                {
                    "case": label,
                    "dim": dim,
                    "steps": steps,
                    "zmq_steps_per_s": theirs,
                    "cfree_steps_per_s": logged,
                    "ratio": logged / theirs,
                    "cfree_digests_steps_per_s": digests,
                    "ratio_digests": digests / theirs,
                }
            )
    load1 = os.getloadavg()
    out = {"nodes": args.nodes, "pyzmq": zmq.__version__, "load": [load0, load1], "cases": rows}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"ring of {args.nodes} nodes, one process each; pyzmq {zmq.__version__}")
    print(f"load average at start {load0[0]:.2f}, at end {load1[0]:.2f}")
    print("steps/s; cfree with every received value in its view logs (log.values = true, the")
    print("default), and with only their digests (log.values = false; the audit is the same)")
    print(
        f"{'vectors':<24} {'steps':>5} {'zmq':>8} {'cfree':>8} {'cfree/zmq':>10} "
        f"{'cfree, digests':>15} {'cfree/zmq':>10}"
    )
    for r in rows:
        print(
            f"{r['case']:<24} {r['steps']:>5} {r['zmq_steps_per_s']:>8.1f} "
            f"{r['cfree_steps_per_s']:>8.1f} {r['ratio']:>10.2f} "
            f"{r['cfree_digests_steps_per_s']:>15.1f} {r['ratio_digests']:>10.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
