"""The step machinery alone: one peer's engine, view log and driver, in one process, no network.

What a cfree gossip step costs above its transport, without the noise of sixteen processes
sharing two cores: node 0 of a 16-node ring runs Muffliato averaging (plain gossip) with its real
step engine (``engine/step.py``), its real view log (``viewlog.py``, in a temporary directory)
and the peer's real driver loop (``peer/runner.py``: ``drive``, its task's path). Only the
network is a stand-in: once node 0 has sent its value of step t to both neighbours, both
neighbours' values of step t are ready, as the transport hands them over (decoded envelopes
whose payload is a read-only view on the received bytes). Sends go nowhere.

So a step here is: two inbound values checked, digested and logged (``recv``), the gossip update,
one progress event, the next value digested once, two sends and their ``send`` records, two
vectored writes of the view log. The transport's part (frames, AEAD, envelopes, sockets, the
event loop) is left out: ``bench_vs_zmq.py --skeleton`` measures a ring on the transport alone.

Prints the thread CPU time per step (the best of ``--repeat`` runs, 5) for 8 floats (4 000
steps) and 1 MiB vectors (100 steps), with every received value logged (the default) and with
digests only. Asserts nothing about timing. Run: ``python bench/bench_step.py [--json]``.

``--instructions`` counts machine instructions per step instead (valgrind's callgrind, which
must be installed): each case runs twice in a fresh interpreter under callgrind, with
``--steps-scale`` times 400 and 1 400 steps (8 floats; 1 MiB: 10 and 35), and the difference,
divided by the steps between, is what one step costs with start-up and set-up cancelled out.
With a fixed hash seed (set for those runs) the count barely moves from one run to the next,
whatever else the machine is doing, where CPU times on a shared machine swing by a third: it
compares two versions of the code, not the machine's speed. About 2 minutes a case (callgrind
runs Python some 50 times slower).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from coordinator_free import config as config_mod
from coordinator_free import seeds
from coordinator_free.blas import one_thread_for_process
from coordinator_free.engine.events import Inbound
from coordinator_free.families import family_of
from coordinator_free.net.wire import Message, decode_message, encode_message
from coordinator_free.peer import runner
from coordinator_free.viewlog import ViewLogWriter

#: (label, float64 entries per vector, steps).
CASES = (("small (8 floats)", 8, 4000), ("1 MiB (131072 floats)", 131072, 100))
NODES = 16


class _Neighbours:
    """The network as node 0's driver sees it (``encode``, ``send_now``, ``ready_event``,
    ``idle``): each step's values of nodes 1 and 15 are ready once node 0 has sent its
    own to node 15 (its second send), a ``done`` from each once it has said its own."""

    def __init__(self, dim: int, steps: int) -> None:
        self.queue: list = []
        self.sends = 0
        # One envelope per neighbour, decoded once per step from its own bytes: the payload is a
        # read-only view on those bytes, as the transport delivers it (no copy to keep it).
        self._bytes = {
            w: bytes(
                encode_message(Message("value", 0, 0, payload=np.random.default_rng(w).random(dim)))
            )
            for w in (1, NODES - 1)
        }
        self._ready = [[Inbound(w, self._at(w, t)) for w in (1, NODES - 1)] for t in range(steps)]

    def _at(self, w: int, t: int) -> Message:
        m = decode_message(self._bytes[w])
        return Message("value", 0, t, payload=m.payload)

    def encode(self, msg: Message):
        return None

    def writes_at_once(self, peer: int, parts) -> bool:
        return False  # as a peer's transport says of a small frame: written at the turn's end

    def send_now(self, peer: int, msg: Message, timeout=None, parts=None):
        self.sends += 1
        if msg.kind == "value" and peer == NODES - 1:
            self.queue.extend(self._ready[msg.step])
        elif msg.kind == "done":
            self.queue.append(Inbound(peer, Message("done", 0, msg.step)))
        return None

    def ready_event(self):
        return self.queue.pop(0) if self.queue else None

    async def idle(self, timeout: float, sink, after=None):
        # Every value is ready when the driver looks (``ready_event``): it never waits here,
        # and would take an empty queue as its deadline passing.
        return None


def ring_config(nodes: int, dim: int, steps: int, log_values: bool):
    """The configuration both modes run: plain gossip (Muffliato averaging, not accelerated)
    on a ring of ``nodes``, ``steps`` steps of ``dim`` floats, received values logged or not."""
    overrides = {
        "graph.kind": "ring",
        "graph.nodes": nodes,
        "protocol.steps": steps,
        "protocol.accelerated": "false",
        "data.dim": dim,
        "log.values": "true" if log_values else "false",
    }
    return config_mod.load(None, [f"{key}={value}" for key, value in overrides.items()])


def step_cpu(dim: int, steps: int, log_values: bool, work: Path) -> float:
    """Thread CPU seconds per step of node 0's engine, view log and driver (one run)."""
    # BLAS held to one thread, as in a peer, in both OpenBLAS libraries (numpy's, and the one
    # scipy.linalg brings, loaded first): the plan's spectral gap would otherwise leave OpenBLAS
    # threads spinning through the steps (up to a fifth of the instructions callgrind counts a
    # step, varying from run to run, in threads a peer does not have).
    import scipy.linalg  # noqa: F401

    one_thread_for_process()
    cfg = ring_config(NODES, dim, steps, log_values)
    fam = family_of(cfg.protocol.name)
    plan = fam.make_plan(cfg)
    net = _Neighbours(dim, steps)
    path = work / f"node-0-{dim}-{log_values}-{time.monotonic_ns()}.cfvlog"
    vlog = ViewLogWriter(path, run_id="bench-step", node=0, params={})
    engine = fam.node_engine(cfg, plan, 0, seeds.PublicSeedStreams(1))

    async def run() -> float:
        t0 = time.thread_time()
        finish = await runner.drive(engine, net, vlog, runner.Progress(None), 1.0)
        spent = time.thread_time() - t0
        if finish.result["missed"]:
            raise SystemExit(f"node 0 missed values: {finish.result['missed'][:3]}")
        return spent

    try:
        spent = asyncio.run(run())
    finally:
        vlog.close()
        path.unlink(missing_ok=True)
    if net.sends != 2 * steps + 2:
        raise SystemExit(f"node 0 sent {net.sends} messages, expected {2 * steps + 2}")
    return spent / steps


#: Peers of the ring ``--ring`` runs in one process.
RING_NODES = 4


def ring_cpu(dim: int, steps: int, log_values: bool, work: Path) -> float:
    """Thread CPU seconds of a whole run of a ring of :data:`RING_NODES` real peers in this
    process (``--ring``): each peer is what ``cfree run`` forks (``runner.run_peer``: its own
    keys, listening socket, authenticated channels over loopback TCP, step engine and view
    log), all of them on one event loop (uvloop, as a peer's), so that every part of a step,
    the transport's included, runs on this thread. Start-up and connection are in it: the
    difference of two runs of different lengths is what the steps between them cost."""
    import scipy.linalg  # noqa: F401  (its OpenBLAS, held to one thread below)

    from coordinator_free import roster as roster_mod
    from coordinator_free.cluster import local

    one_thread_for_process()
    cfg = ring_config(RING_NODES, dim, steps, log_values)
    out = work / f"ring-{dim}-{log_values}-{steps}-{time.monotonic_ns()}"
    local.prepare_run_dir(cfg, out)
    socks = local.bind_sockets(cfg.network.host, RING_NODES, 0)
    try:
        hosts = [(cfg.network.host, s.getsockname()[1]) for s in socks]
        ros = roster_mod.generate_keys(RING_NODES, out / "keys", hosts=hosts, name="bench-ring")
        keys = [roster_mod.load_private_key(out / "keys" / f"node-{i}.key") for i in ros.ids]

        async def run() -> float:
            t0 = time.thread_time()
            results = await asyncio.gather(
                *(runner.run_peer(cfg, ros, i, keys[i], out, listen_sock=socks[i]) for i in ros.ids)
            )
            spent = time.thread_time() - t0
            missed = [m for r in results for m in r.missed]
            if missed:
                raise SystemExit(f"the ring missed values: {missed[:3]}")
            return spent

        return runner._run_loop(run())
    finally:
        for s in socks:
            s.close()
        shutil.rmtree(out, ignore_errors=True)


def ring_step_cpu(dim: int, steps: int, log_values: bool, work: Path) -> float:
    """CPU seconds per node and step of the in-process ring (``--ring``): a run of ``steps``
    less one of a quarter as many, over the steps between, over the nodes."""
    lo = max(2, steps // 4)
    short = ring_cpu(dim, lo, log_values, work)
    long = ring_cpu(dim, steps, log_values, work)
    return (long - short) / (steps - lo) / RING_NODES


#: Steps of the two runs of a case under callgrind (``--instructions``), by vector length.
INSTRUCTION_STEPS = {8: (400, 1400), 131072: (10, 35)}


def _one_run(dim: int, steps: int, log_values: bool, ring: bool = False) -> None:
    """One run of a case, no output: what ``--instructions`` counts under callgrind."""
    with tempfile.TemporaryDirectory(prefix="cfree-bench-step-") as tmp:
        (ring_cpu if ring else step_cpu)(dim, steps, log_values, Path(tmp))


def instructions_per_step(dim: int, log_values: bool, scale: float, ring: bool = False) -> dict:
    """Machine instructions per step of a case: two runs under callgrind, their difference."""
    import subprocess

    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (Debian: apt-get install valgrind)")
    counts = []
    lo, hi = (max(2, int(n * scale)) for n in INSTRUCTION_STEPS[dim])
    if hi <= lo:
        raise SystemExit("--steps-scale leaves no steps between the two runs")
    # A run at native speed first: a module changed since its bytecode was cached is compiled
    # (and its bytecode written) there, not in the first counted run alone, whose count would
    # then hold the compilation (a difference of 41 thousand instructions a step instead of
    # 360 thousand, after an edit of the view log).
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}
    case = f"{int(log_values)}:{int(ring)}"
    warm = [sys.executable, __file__, "--one-run", f"{dim}:2:{case}"]
    run = subprocess.run(warm, capture_output=True, text=True, env=env)
    if run.returncode != 0:
        raise SystemExit(f"warm-up run failed ({run.returncode}): {run.stderr[-2000:]}")
    with tempfile.TemporaryDirectory(prefix="cfree-bench-step-cg-") as tmp:
        for steps in (lo, hi):
            out = Path(tmp) / f"callgrind-{steps}.out"
            cmd = [
                "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                sys.executable, __file__, "--one-run", f"{dim}:{steps}:{case}",
            ]  # fmt: skip
            # A fixed hash seed: string hashes, and so the dicts' and sets' probing, are the
            # same in every run. No OpenBLAS threads at all (a peer, forked from a process that
            # loaded OpenBLAS, has none): threads started at import spin for as long as they
            # like, and their instructions (up to 60 million a run) would differ from run to run.
            run = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if run.returncode != 0:
                raise SystemExit(f"callgrind run failed ({run.returncode}): {run.stderr[-2000:]}")
            summary = [ln for ln in out.read_text().splitlines() if ln.startswith("summary:")]
            if not summary:
                raise SystemExit(f"no instruction count in {out}")
            counts.append(int(summary[0].split()[1]))
    return {
        "steps": [lo, hi],
        "instructions": counts,
        # A ring's steps are every node's: per node and step, as a peer's.
        "per_step": (counts[1] - counts[0]) / (hi - lo) / (RING_NODES if ring else 1),
    }


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--one-run":  # a run under callgrind
        dim, steps, log_values, ring = (int(x) for x in sys.argv[2].split(":"))
        _one_run(dim, steps, bool(log_values), bool(ring))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=5, help="runs of each case; the best counts")
    p.add_argument("--steps-scale", type=float, default=1.0, help="scale every case's steps")
    p.add_argument(
        "--only", choices=("small", "large"), help="run only the 8-floats or the 1 MiB case"
    )
    p.add_argument(
        "--digests-only", action="store_true", help="run only with digests (log.values = false)"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument(
        "--instructions",
        action="store_true",
        help="count machine instructions per step under valgrind's callgrind instead of CPU "
        "time (the same count whatever the load; about 2 minutes a case)",
    )
    p.add_argument(
        "--ring",
        action="store_true",
        help=f"run a ring of {RING_NODES} real peers in this process instead (their transport, "
        "loopback TCP and AEAD included; per node and step, from two runs of different "
        "lengths)",
    )
    args = p.parse_args()
    if args.repeat < 1 or args.steps_scale <= 0:
        p.error("--repeat must be at least 1 and --steps-scale positive")
    rows = []
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="cfree-bench-step-") as tmp:
        for label, dim, steps in CASES:
            if args.only and (args.only == "small") != (dim == CASES[0][1]):
                continue
            steps = max(4, int(steps * args.steps_scale))
            for log_values in (False,) if args.digests_only else (True, False):
                what = "values logged" if log_values else "digests only"
                if args.instructions:
                    got = instructions_per_step(dim, log_values, args.steps_scale, args.ring)
                    rows.append({"case": label, "dim": dim, "log_values": log_values, **got})
                    if not args.json:
                        print(
                            f"{label:<24} {what:<14} {got['per_step']:11,.0f} instructions per "
                            f"step ({got['steps'][1] - got['steps'][0]} steps between two runs)",
                            flush=True,
                        )
                    continue
                measure = ring_step_cpu if args.ring else step_cpu
                runs = [measure(dim, steps, log_values, Path(tmp)) for _ in range(args.repeat)]
                rows.append(
                    {
                        "case": label,
                        "dim": dim,
                        "steps": steps,
                        "log_values": log_values,
                        "cpu_per_step_s": min(runs),
                        "runs_s": runs,
                    }
                )
                if not args.json:
                    print(
                        f"{label:<24} {what:<14} {min(runs) * 1e6:9.1f} us per step "
                        f"(best of {len(runs)}; worst {max(runs) * 1e6:.1f})",
                        flush=True,
                    )
    load1 = os.getloadavg()
    if args.json:
        json.dump({"load_start": load0[0], "load_end": load1[0], "rows": rows}, sys.stdout)
        print()
    else:
        print(f"load average at start {load0[0]:.2f}, at end {load1[0]:.2f}")
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except BrokenPipeError:  # the reader of the table went away (`| head`): stop quietly
        # Python flushes stdout once more at exit: /dev/null takes what is left.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None
