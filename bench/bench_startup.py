"""Peer start-up cost, as a ratio to starting an empty interpreter, measured in the same run.

A peer's start-up is the time from the launcher asking for it until it reports ``listening``:
process up, config, roster and key loaded, plan made, port open. For N peers started the way
``cfree run`` starts them (``--spawn fork``: forked from one process that imported everything
once; ``--spawn exec``: each a fresh interpreter), the cost per peer is the wall time from the
first spawn until the last ``listening``, divided by N. The baseline is the wall time of
``python3 -c pass`` run N times one after the other, divided by N (the same interpreter).
The launcher's own work (plan, keys, roster) comes before the first spawn and is not counted.

Each mode runs a ring of N peers for one gossip step (every peer must also finish, or the
measurement is refused). Run: ``python bench/bench_startup.py [--nodes 32] [--json]``.
Prints numbers; asserts nothing about timing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from coordinator_free import config as config_mod
from coordinator_free.cluster import local


def python_pass(n: int) -> float:
    """Mean wall seconds of ``python -c pass``, over n runs in a row."""
    t0 = time.perf_counter()
    for _ in range(n):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    return (time.perf_counter() - t0) / n


def peers(n: int, spawn: str, work: Path) -> dict:
    """Start n peers of a one-step ring in mode ``spawn``; seconds per peer until all listen."""
    cfg = config_mod.load(
        None,
        ["graph.kind=ring", f"graph.nodes={n}", "protocol.steps=1", "protocol.accelerated=false"],
        default=config_mod.RUN_DEFAULT_CONFIG,
    )
    out = work / f"{spawn}-{n}"
    local.prepare_run_dir(cfg, out)
    first: list[float] = []
    listening: list[float] = []

    def on_event(node: int, ev: dict, pid: int) -> None:
        if ev.get("event") == "listening":
            listening.append(time.perf_counter())

    on_event.needs_steps = False  # as `cfree run` without faults: steps reported 10 times a second

    # The first spawn: when the launcher starts its first peer (after the plan, keys, roster).
    orig = local.peer_argv

    def first_argv(out_dir, node, *rest):
        if not first:
            first.append(time.perf_counter())
        return orig(out_dir, node, *rest)

    local.peer_argv = first_argv
    try:
        run = asyncio.run(
            local.launch_peers(cfg, out, show_progress=False, on_event=on_event, spawn=spawn)
        )
    finally:
        local.peer_argv = orig
    if run.failed or len(listening) != n:
        raise SystemExit(
            f"{spawn}: {len(run.failed)} peer(s) failed, {len(listening)}/{n} listened"
        )
    wall = max(listening) - first[0]
    return {"mode": spawn, "nodes": n, "wall_s": wall, "per_peer_s": wall / n}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=32, help="peers per measurement (default 32)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = ap.parse_args()
    base = python_pass(args.nodes)
    rows = []
    with tempfile.TemporaryDirectory(prefix="cfree-bench-startup-") as tmp:
        for mode in ("fork", "exec"):
            row = peers(args.nodes, mode, Path(tmp))
            row["ratio_to_python_pass"] = row["per_peer_s"] / base
            rows.append(row)
    out = {"python_pass_s": base, "nodes": args.nodes, "modes": rows}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"python -c pass: {base * 1000:.1f} ms per run ({args.nodes} in a row)")
    print(
        f"{'spawn':<6} {'peers':>5} {'all listening':>14} {'per peer':>9} {'x python -c pass':>17}"
    )
    for r in rows:
        print(
            f"{r['mode']:<6} {r['nodes']:>5} {r['wall_s']:>12.2f} s {r['per_peer_s'] * 1000:>6.1f} ms"
            f" {r['ratio_to_python_pass']:>16.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
