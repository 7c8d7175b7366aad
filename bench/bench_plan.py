"""Timings of the fault-free privacy plan on the paper's synthetic graph.

Hypercube of dimension 11 (n = 2048), Metropolis weights, Chebyshev-accelerated Muffliato with
T from the spectral gap (Theorem 2, sigma = 1, spread 0.25). Measures, for both methods
(exact joint-view loss and the paper's Eq. (6)):

* one source u = 0 towards every observer v;
* all pairs, summarised by hop distance (mean / max factor).

Run: ``python bench/bench_plan.py [--dim 11] [--json]``. Prints timings; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from coordinator_free.graphs import (
    auto_steps,
    build_graph,
    chebyshev_gamma,
    gossip_matrix,
    spectral_gap,
)
from coordinator_free.privacy.muffliato import distance_summary, plan_factors


def hop_distances(g, n: int) -> np.ndarray:
    import networkx as nx

    d = np.full((n, n), -1, dtype=np.int64)
    for v, lengths in nx.all_pairs_shortest_path_length(g):
        for u, k in lengths.items():
            d[v, u] = k
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=11)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    g = build_graph("hypercube", dim=args.dim)
    w = gossip_matrix(g, "metropolis")
    n = w.shape[0]
    lam = spectral_gap(w)
    steps = auto_steps(lam, n, 1.0, 0.25, 1, True)
    gamma = chebyshev_gamma(lam)
    dist = hop_distances(g, n)
    res: dict = {"n": n, "T": steps, "lambda_W": lam, "gamma": gamma, "timings_s": {}}

    for method in ("paper", "exact"):
        t0 = time.perf_counter()
        f1 = plan_factors(w, steps, True, method=method, sources=[0])[:, 0]
        t1 = time.perf_counter()
        fa = plan_factors(w, steps, True, method=method)
        summ = distance_summary(fa, dist)
        t2 = time.perf_counter()
        res["timings_s"][f"{method}_one_source"] = t1 - t0
        res["timings_s"][f"{method}_all_pairs"] = t2 - t1
        res[f"{method}_by_distance"] = {
            str(k): {"mean": v["mean"], "max": v["max"]} for k, v in summ.items()
        }
        # one-source result agrees with the all-pairs column
        res[f"{method}_one_source_vs_all_pairs_maxdiff"] = float(np.abs(f1 - fa[:, 0]).max())

    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"hypercube dim {args.dim}: n={n} T={steps} lambda_W={lam:.4f} gamma={gamma:.5f}")
    for k, v in res["timings_s"].items():
        print(f"  {k:<22} {v:8.2f} s")
    print("  distance  paper mean  paper max   exact mean  exact max")
    for d in sorted(res["exact_by_distance"], key=int):
        p, e = res["paper_by_distance"][d], res["exact_by_distance"][d]
        print(
            f"  {int(d):>8}  {p['mean']:10.3e} {p['max']:10.3e}  {e['mean']:10.3e} {e['max']:10.3e}"
        )


if __name__ == "__main__":
    main()
