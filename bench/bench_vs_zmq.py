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
[--json]``. Prints numbers; asserts nothing about timing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import pickle
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from coordinator_free import config as config_mod
from coordinator_free.cluster import local

#: (label, float64 entries per vector, steps)
CASES = (("small (8 floats)", 8, 200), ("1 MiB (131072 floats)", 131072, 30))


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


def zmq_gossip(n: int, dim: int, steps: int) -> float:
    """steps/s of the zmq ring."""
    ctx = mp.get_context("fork")
    report = ctx.Queue()
    inboxes = [ctx.Queue() for _ in range(n)]
    procs = [
        ctx.Process(target=_zmq_node, args=(i, n, dim, steps, inboxes[i], report)) for i in range(n)
    ]
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
                raise SystemExit(f"zmq node exited with {p.exitcode}")
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return steps / (max(times["finished"].values()) - max(times["connected"].values()))


# --------------------------------------------------------------------------- cfree side


def cfree_gossip(n: int, dim: int, steps: int, work: Path, log_values: bool) -> float:
    """steps/s of the cfree ring (real peers, fork-server start); ``log_values``: every
    received value in the view logs (the default), or only its digest (``log.values=false``)."""
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

    run = asyncio.run(local.launch_peers(cfg, out, show_progress=False, on_event=on_event))
    if run.failed or len(times["finished"]) != n:
        raise SystemExit(f"cfree: {len(run.failed)} peer(s) failed")
    return steps / (max(times["finished"].values()) - max(times["connected"].values()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=16, help="ring size (default 16)")
    ap.add_argument("--steps-scale", type=float, default=1.0, help="scale every case's steps")
    ap.add_argument(
        "--repeat", type=int, default=3, help="runs of each side, alternating; the best counts"
    )
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = ap.parse_args()
    try:
        import zmq
    except ImportError:
        print("bench_vs_zmq needs pyzmq: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="cfree-bench-zmq-") as tmp:
        for label, dim, steps in CASES:
            steps = max(2, round(steps * args.steps_scale))
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
    out = {"nodes": args.nodes, "pyzmq": zmq.__version__, "cases": rows}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"ring of {args.nodes} nodes, one process each; pyzmq {zmq.__version__}")
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
