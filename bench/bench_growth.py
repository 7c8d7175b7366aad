"""How the planner and the simulator grow with n: time and peak memory from n = 256 up.

Muffliato on the hypercube of n = 2^d nodes (Metropolis weights, Chebyshev acceleration, T from
the spectral gap, sigma = 1, one coordinate). For every n, in a fresh process (so the peak
resident memory is that n's own):

* ``plan``: the public plan (graph, gossip matrix, spectral gap, T): what every peer computes;
* ``paper``: the paper's Eq. (6) factors for one source towards every observer;
* ``exact``: the exact joint-view factors for one source;
* ``simulate``: the reference simulator, fault-free, every node's value to the end.

Up to ``graphs.DENSE_MAX_N`` nodes the plan holds a dense gossip matrix (an n whose dense
matrices would not fit the memory budget, ``--max-gib``, 4 GiB by default, is not run); past
it a sparse one, its spectral gap from the Walsh-Hadamard transform of its first row (the
hypercube's XOR translations diagonalise it): paper and exact then take the translation
symmetry (observer 0's row moved to every observer), and the simulator the node programs,
none of them an n x n matrix. The exponent k of time ~ n^k is fitted by least squares on log time against log n over
the sizes that ran.

``--graph erdos_renyi|geometric|grid``: the same table for a graph without translation
symmetry, its size n = 2^d and its density chosen so that n = 2048 is the graph of
``bench_plan.py --graph`` (mean degree held as n grows): Erdos-Renyi with p = 0.005 * 2048 / n,
geometric with radius 0.05 * sqrt(2048 / n), the 2^floor(d/2) x 2^ceil(d/2) grid. There the
exact plan runs one Lanczos basis per observer (no symmetry to use), so the table gains a
column ``exact all`` (every observer, every source), and the largest n defaults to 2048.
``--max-seconds`` (default 900) bounds each size: a size that takes longer is stopped and
reported, and no larger one is run. ``--steps T`` fixes T instead of the plan's own; ``--lax``
plans with ``strict=False`` (the geometric graph's reference raises ``NumericalRankError`` at
some observers at its own T).

Run: ``python bench/bench_growth.py [--graph KIND] [--max-dim 14] [--max-gib 4] [--json]``.
Prints numbers, the load average at the start and the end of each size; asserts nothing about
timing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

from coordinator_free import blas
from coordinator_free.graphs import DENSE_MAX_N

#: --graph kinds; the hypercube is the one with translation symmetry.
KINDS = ("hypercube", "erdos_renyi", "geometric", "grid")
#: n x n float64 matrices held at once (W, its Chebyshev recurrences, the simulator's state).
DENSE_COPIES = 4


def stages(kind: str) -> tuple[str, ...]:
    if kind == "hypercube":
        return ("plan", "paper", "exact", "simulate")
    return ("plan", "paper", "exact", "exact_all", "simulate")


def graph_sets(kind: str, dim: int) -> list[str]:
    """The config of the graph of 2^dim nodes of this kind (n = 2048: ``bench_plan.py``'s)."""
    n = 2**dim
    if kind == "hypercube":
        return ["graph.kind=hypercube", f"graph.dim={dim}"]
    if kind == "erdos_renyi":
        return ["graph.kind=erdos_renyi", f"graph.nodes={n}", f"graph.p={0.005 * 2048 / n!r}"]
    if kind == "geometric":
        radius = 0.05 * math.sqrt(2048 / n)
        return ["graph.kind=geometric", f"graph.nodes={n}", f"graph.radius={radius!r}"]
    if kind == "grid":
        return [
            "graph.kind=grid",
            f"graph.rows={2 ** (dim // 2)}",
            f"graph.cols={2 ** (dim - dim // 2)}",
        ]
    raise ValueError(f"unknown graph kind {kind!r}; expected one of {', '.join(KINDS)}")


def measure(kind: str, dim: int, steps: int | None, strict: bool) -> dict:
    """One size, in this process: seconds per stage and the peak resident memory."""
    import resource

    from coordinator_free import config as config_mod
    from coordinator_free.families import family_of
    from coordinator_free.privacy.muffliato import plan_factors

    sets = graph_sets(kind, dim) + ([f"protocol.steps={steps}"] if steps else [])
    cfg = config_mod.load(None, sets)
    out: dict = {"n": 2**dim, "config": sets}
    t0 = time.perf_counter()
    plan = family_of(cfg.protocol.name).make_plan(cfg)
    out["plan"] = time.perf_counter() - t0
    out["steps"] = plan.steps
    runs = [("paper", "paper", [0]), ("exact", "exact", [0])]
    if kind != "hypercube":
        runs.append(("exact_all", "exact", None))
    for name, method, sources in runs:
        t0 = time.perf_counter()
        plan_factors(
            plan.W, plan.steps, plan.accelerated, method=method, sources=sources,
            gamma=plan.gamma, strict=strict,
        )  # fmt: skip
        out[name] = time.perf_counter() - t0
    t0 = time.perf_counter()
    family_of(cfg.protocol.name).simulate_as_peers(cfg, plan)
    out["simulate"] = time.perf_counter() - t0
    out["peak_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    out["blas"] = blas.kernels_in_use()
    return out


def fit_exponent(ns: list[int], ts: list[float]) -> float | None:
    if len(ns) < 2:
        return None
    k, _ = np.polyfit(np.log(ns), np.log(ts), 1)
    return float(k)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", choices=KINDS, default="hypercube", help="default: hypercube")
    ap.add_argument("--min-dim", type=int, default=8, help="smallest n = 2^dim (default 8)")
    ap.add_argument(
        "--max-dim", type=int, help="largest n = 2^dim (default 14; 11 with a --graph other "
        "than the hypercube)",
    )  # fmt: skip
    ap.add_argument("--max-gib", type=float, default=4.0, help="memory budget (default 4 GiB)")
    ap.add_argument(
        "--max-seconds", type=float, default=900.0,
        help="time budget of one size; a size over it stops the table (default 900)",
    )  # fmt: skip
    ap.add_argument("--steps", type=int, help="T for every n instead of the plan's own")
    ap.add_argument("--lax", action="store_true", help="exact plan with strict=False")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # child: measure this dim
    args = ap.parse_args()
    if args.steps is not None and args.steps < 1:
        ap.error("--steps must be at least 1")
    if args.max_seconds <= 0:
        ap.error("--max-seconds must be positive")
    if args.one is not None:
        print(json.dumps(measure(args.graph, args.one, args.steps, not args.lax)))
        return 0
    max_dim = (
        args.max_dim if args.max_dim is not None else (14 if args.graph == "hypercube" else 11)
    )
    cols = stages(args.graph)
    rows = []
    over = None
    for dim in range(args.min_dim, max_dim + 1):
        n = 2**dim
        need = DENSE_COPIES * 8 * n * n / 2**30
        dense = n <= DENSE_MAX_N or args.graph != "hypercube"
        if over is not None:
            rows.append({"n": n, "skipped": f"a smaller size passed the time budget ({over})"})
            continue
        if dense and need > args.max_gib:
            rows.append({"n": n, "skipped": f"dense n x n matrices need about {need:.0f} GiB"})
            continue
        print(f"n = {n} ...", file=sys.stderr, flush=True)
        cmd = [sys.executable, __file__, "--one", str(dim), "--graph", args.graph]
        cmd += (["--steps", str(args.steps)] if args.steps else []) + (
            ["--lax"] if args.lax else []
        )
        load_start = os.getloadavg()[0]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.max_seconds)
        except subprocess.TimeoutExpired:
            over = f"n = {n} stopped after {args.max_seconds:g} s"
            rows.append(
                {"n": n, "skipped": f"over the time budget: stopped after {args.max_seconds:g} s"}
            )
            continue
        if done.returncode != 0:
            rows.append({"n": n, "skipped": f"failed: {done.stderr.strip().splitlines()[-1]}"})
            continue
        row = json.loads(done.stdout)
        row["load"] = [load_start, os.getloadavg()[0]]
        rows.append(row)
    ran = [r for r in rows if "skipped" not in r]
    fits = {s: fit_exponent([r["n"] for r in ran], [max(r[s], 1e-6) for r in ran]) for s in cols}
    kernels = sorted({r["blas"] for r in ran})
    out = {"graph": args.graph, "budget_gib": args.max_gib, "budget_s": args.max_seconds,
           "blas": kernels, "rows": rows, "exponents": fits}  # fmt: skip
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    what = {"hypercube": "the hypercube", "erdos_renyi": "Erdos-Renyi graphs (mean degree 10.2)",
            "geometric": "random geometric graphs (mean degree about 16)",
            "grid": "2^floor(d/2) x 2^ceil(d/2) grids"}[args.graph]  # fmt: skip
    print(f"Muffliato on {what}; seconds per stage (one source; exact_all: every pair); memory "
          f"budget {args.max_gib:g} GiB, time budget {args.max_seconds:g} s per size")  # fmt: skip
    print(f"BLAS: {'; '.join(kernels) or 'no size ran'}")
    head = "".join(f"{s:>10}" for s in cols)
    print(f"{'n':>6} {'T':>4}{head} {'peak GiB':>9} {'load avg':>12}")
    for r in rows:
        if "skipped" in r:
            print(f"{r['n']:>6}  not run: {r['skipped']}")
            continue
        cells = "".join(f"{r[s]:>10.3f}" for s in cols)
        load = f"{r['load'][0]:.1f}->{r['load'][1]:.1f}"
        print(f"{r['n']:>6} {r['steps']:>4}{cells} {r['peak_gib']:>9.2f} {load:>12}")
    exps = "".join(f"{'-' if fits[s] is None else format(fits[s], '.2f'):>10}" for s in cols)
    print(f"{'n^k, k':>11}{exps}")
    if args.graph == "hypercube":
        print(f"dense gossip matrix up to n = {DENSE_MAX_N}, sparse above (the exponents mix both)")
    else:
        print("dense gossip matrix at every n (no translation symmetry to keep it sparse)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
