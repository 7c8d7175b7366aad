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

Run: ``python bench/bench_growth.py [--max-dim 14] [--max-gib 4] [--json]``. Prints numbers;
asserts nothing about timing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

from coordinator_free.graphs import DENSE_MAX_N

STAGES = ("plan", "paper", "exact", "simulate")
#: n x n float64 matrices held at once (W, its Chebyshev recurrences, the simulator's state).
DENSE_COPIES = 4


def measure(dim: int) -> dict:
    """One size, in this process: seconds per stage and the peak resident memory."""
    import resource

    from coordinator_free import config as config_mod
    from coordinator_free.families import family_of
    from coordinator_free.privacy.muffliato import plan_factors

    cfg = config_mod.load(None, ["graph.kind=hypercube", f"graph.dim={dim}"])
    out: dict = {"n": 2**dim}
    t0 = time.perf_counter()
    plan = family_of(cfg.protocol.name).make_plan(cfg)
    out["plan"] = time.perf_counter() - t0
    out["steps"] = plan.steps
    for method in ("paper", "exact"):
        t0 = time.perf_counter()
        plan_factors(
            plan.W, plan.steps, plan.accelerated, method=method, sources=[0], gamma=plan.gamma
        )
        out[method] = time.perf_counter() - t0
    t0 = time.perf_counter()
    family_of(cfg.protocol.name).simulate_as_peers(cfg, plan)
    out["simulate"] = time.perf_counter() - t0
    out["peak_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return out


def fit_exponent(ns: list[int], ts: list[float]) -> float | None:
    if len(ns) < 2:
        return None
    k, _ = np.polyfit(np.log(ns), np.log(ts), 1)
    return float(k)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-dim", type=int, default=8, help="smallest n = 2^dim (default 8)")
    ap.add_argument("--max-dim", type=int, default=14, help="largest n = 2^dim (default 14)")
    ap.add_argument("--max-gib", type=float, default=4.0, help="memory budget (default 4 GiB)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # child: measure this dim
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one)))
        return 0
    rows = []
    for dim in range(args.min_dim, args.max_dim + 1):
        n = 2**dim
        need = DENSE_COPIES * 8 * n * n / 2**30
        if n <= DENSE_MAX_N and need > args.max_gib:
            rows.append({"n": n, "skipped": f"dense n x n matrices need about {need:.0f} GiB"})
            continue
        print(f"n = {n} ...", file=sys.stderr, flush=True)
        done = subprocess.run(
            [sys.executable, __file__, "--one", str(dim)], capture_output=True, text=True
        )
        if done.returncode != 0:
            rows.append({"n": n, "skipped": f"failed: {done.stderr.strip().splitlines()[-1]}"})
            continue
        rows.append(json.loads(done.stdout))
    ran = [r for r in rows if "skipped" not in r]
    fits = {s: fit_exponent([r["n"] for r in ran], [max(r[s], 1e-6) for r in ran]) for s in STAGES}
    out = {"budget_gib": args.max_gib, "rows": rows, "exponents": fits}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"Muffliato on the hypercube; seconds per stage; memory budget {args.max_gib:g} GiB")
    head = "".join(f"{s:>10}" for s in STAGES)
    print(f"{'n':>6} {'T':>4}{head} {'peak GiB':>9}")
    for r in rows:
        if "skipped" in r:
            print(f"{r['n']:>6}  not run: {r['skipped']}")
            continue
        cells = "".join(f"{r[s]:>10.3f}" for s in STAGES)
        print(f"{r['n']:>6} {r['steps']:>4}{cells} {r['peak_gib']:>9.2f}")
    exps = "".join(f"{'-' if fits[s] is None else format(fits[s], '.2f'):>10}" for s in STAGES)
    print(f"{'n^k, k':>11}{exps}")
    print(f"dense gossip matrix up to n = {DENSE_MAX_N}, sparse above (the exponents mix both)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
