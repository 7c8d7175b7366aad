"""The Muffliato paper's Table 3 (App. H.6, user dropout) with ``--fault dropout:P``.

At every gossip step every node sits out with probability P (0, 10, 50, 90 %), drawn from the
public seed, so the plan knows who sat out when. For each P and each seed:

1. steps to converge: the simulator runs Muffliato (no acceleration) for up to ``--max-steps``
   steps; it has converged at the first step t where the mean squared distance of the nodes'
   values to the mean of the noisy inputs falls below 3 x the squared distance of that mean to
   the true mean (the paper code's stopping rule, ``||x^t - mean(x^0)||^2 / n < 3 (mean(x^0) -
   mean(x))^2``);
2. the privacy loss: ``cfree plan --source 0`` of the same config with ``protocol.steps`` set to
   the steps it took, and the paper's measure, node 0's mean Rényi loss (alpha = 2, sigma = 1)
   over all other nodes, by the exact accountant and by the paper's formula (Eq. 6).

    python3 bench/dropout_table.py --nodes 64 --seeds 5

prints a Markdown table (mean +- std over the seeds) and, for each row, the equivalent commands.
The paper used n = 1000 with a fresh Erdos-Renyi graph (p = 0.002) over the available nodes at
every step; here the graph is one Erdos-Renyi graph, and a node that sits out keeps its value
while its neighbours keep its weight.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coordinator_free import config  # noqa: E402
from coordinator_free.accounting.audit import plan_report  # noqa: E402
from coordinator_free.families import family_of  # noqa: E402

LEVELS = (0.0, 0.1, 0.5, 0.9)


def sets_of(args, seed: int, steps: int | str) -> list[str]:
    return [
        "graph.kind=erdos_renyi",
        f"graph.nodes={args.nodes}",
        f"graph.p={args.p}",
        f"graph.seed={seed}",
        f"run.seed={seed}",
        "protocol.accelerated=false",
        f"protocol.steps={steps}",
        "privacy.sigma=1.0",
        "privacy.alpha=2.0",
        "data.kind=uniform",
    ]


def faults_of(p: float) -> list[str]:
    return [f"dropout:{p:g}"] if p else []


def steps_to_converge(args, seed: int, p: float) -> int | None:
    cfg = config.load(None, sets_of(args, seed, args.max_steps), faults_of(p))
    sim = family_of(cfg.protocol.name).simulate(cfg)
    noisy_mean = sim.finals.mean(axis=0)  # gossip keeps the mean of x^0
    gap = float(np.sum((noisy_mean - sim.inputs.mean(axis=0)) ** 2))
    for t, mse in enumerate(sim.history_mse):
        # history_mse is to the true mean: ||x - xbar||^2 = ||x - xbar0||^2 + ||xbar0 - xbar||^2
        if mse - gap < 3 * gap:
            return t
    return None


def mean_loss(args, seed: int, p: float, steps: int) -> dict[str, float]:
    cfg = config.load(None, sets_of(args, seed, max(steps, 1)), faults_of(p))
    out = {}
    for method in ("exact", "paper"):
        rep = plan_report(cfg, source=0, method=method)
        rdp = [x["rdp"] for x in rep["losses"] if x["observer"] != 0]
        out[method] = float(np.mean(rdp))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--p", type=float, default=0.1, help="Erdos-Renyi edge probability")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--max-steps", type=int, default=400)
    args = ap.parse_args()
    rows = []
    t0 = time.monotonic()
    for p in LEVELS:
        steps, exact, paper = [], [], []
        for seed in range(1, args.seeds + 1):
            t = steps_to_converge(args, seed, p)
            if t is None:
                print(f"dropout {p:g}, seed {seed}: no convergence in {args.max_steps} steps",
                      file=sys.stderr)  # fmt: skip
                continue
            loss = mean_loss(args, seed, p, t)
            steps.append(t)
            exact.append(loss["exact"])
            paper.append(loss["paper"])
            print(
                f"  dropout {p:>4.0%} seed {seed}: {t} steps, mean loss exact {loss['exact']:.4g}"
                f" paper {loss['paper']:.4g}  ({time.monotonic() - t0:.0f}s)",
                file=sys.stderr,
            )
        rows.append((p, steps, exact, paper))
    print(f"\nn = {args.nodes}, Erdos-Renyi p = {args.p}, sigma = 1, alpha = 2, "
          f"{args.seeds} seeds, no acceleration\n")  # fmt: skip
    print(
        "| dropout | steps to converge | mean loss of node 0, exact (RDP) | paper's Eq. (6) (RDP) |"
    )
    print("|---|---|---|---|")
    for p, steps, exact, paper in rows:
        if not steps:
            print(f"| {p:.0%} | no convergence | | |")
            continue
        short = len(steps) < args.seeds
        print(
            f"| {p:.0%} | {np.mean(steps):.1f} ± {np.std(steps):.1f}"
            + (
                f" ({len(steps)} of {args.seeds} seeds converge within {args.max_steps})"
                if short
                else ""
            )  # fmt: skip
            + " "
            f"| {np.mean(exact):.4f} ± {np.std(exact):.4f} "
            f"| {np.mean(paper):.4f} ± {np.std(paper):.4f} |"
        )
    print("\nEach row's plan, for seed 1 (STEPS: the steps it took):")
    for p, _, _, _ in rows:
        sets = " ".join(f"--set {s}" for s in sets_of(args, 1, "STEPS"))
        fault = "".join(f" --fault {f}" for f in faults_of(p))
        print(f"  cfree plan {sets} --source 0{fault}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
