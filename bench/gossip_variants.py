"""Randomized gossip vs synchronous Muffliato, and fixed vs per-round graphs for Muffliato-GD.

Part 1, averaging at equal sigma: `cfree run` of each protocol (16 peer processes), the eps the
auditor measured from the view logs (worst pair and mean over pairs, exact and paper), the frames
each node sent (its values plus one ``done`` per neighbour), and the mean squared error to the true mean over ``--seeds`` runs of
`cfree simulate` (``run.seed`` = 1..S).

Part 2, learning at equal (eps, delta): Muffliato-GD on Erdős–Rényi graphs, one fixed graph vs a
fresh graph every round (graph.resample), sigma calibrated with `cfree plan --target-eps` (exact
accountant, worst-pair and mean budgets), then `cfree run` and ``--seeds`` simulations.

    python3 bench/gossip_variants.py --eps 10 --seeds 5 --out /tmp/variants.md

Every command it runs is printed, so each row can be reproduced by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from learning_table import audit_summary, cfree, emit, sets

AVERAGING = {
    "muffliato (Chebyshev)": "examples/muffliato-ring.toml",
    "randomized-gossip": "examples/randomized-gossip-ring.toml",
}
GRAPHS = {
    "ring (n=16)": ["graph.kind=ring", "graph.nodes=16"],
    "hypercube (n=16)": ["graph.kind=hypercube", "graph.dim=4"],
}
GD = "examples/muffliato-gd-breast-cancer.toml"
ER = ["graph.kind=erdos_renyi", "graph.nodes=16", "graph.p=0.35"]


def averaging(tmp: Path, seeds: int) -> list[str]:
    lines = [
        "| graph | protocol | steps | frames sent per node (mean) "
        f"| MSE to the true mean ({seeds} seeds) | eps worst (exact/paper) "
        "| eps mean (exact/paper) |",
        "|---|---|---|---|---|---|---|",
    ]
    for gname, gsets in GRAPHS.items():
        for proto, cfg in AVERAGING.items():
            over = [*gsets, "protocol.tick=0"] if "randomized" in proto else gsets
            run_dir = tmp / f"avg-{len(lines)}"
            summ = cfree("run", cfg, *sets(over), "--out", str(run_dir), "--quiet", "--json")
            if summ.get("simulator_max_abs_diff") != 0.0:
                raise SystemExit(f"run {run_dir} differs from the simulator")
            a = audit_summary(json.loads((run_dir / "audit.json").read_text()))
            sent = np.mean([r["messages_sent"] for r in summ["results"]["nodes"]])
            steps = json.loads((run_dir / "audit.json").read_text())["steps"]
            mse = [
                cfree("simulate", cfg, "--json", *sets([*over, f"run.seed={s}"]))["mse_by_step"][-1]
                for s in range(1, seeds + 1)
            ]
            lines.append(
                f"| {gname} | {proto} | {steps} | {sent:.1f} | {np.mean(mse):.4f} ± "
                f"{np.std(mse):.4f} | {a['exact']['worst']:.2f} / {a['paper']['worst']:.2f} | "
                f"{a['exact']['mean']:.2f} / {a['paper']['mean']:.2f} |"
            )
            print(lines[-1], file=sys.stderr, flush=True)
    return lines


def learning(tmp: Path, eps: float, seeds: int, rounds: int) -> list[str]:
    lines = [
        "| graphs | budget | sigma | test acc (run) "
        f"| test acc (mean ± std, {seeds} seeds) | eps worst (exact/paper) "
        "| eps mean (exact/paper) |",
        "|---|---|---|---|---|---|---|",
    ]
    for gname, extra in (
        ("one ER graph", []),
        ("fresh ER graph every round", ["graph.resample=true"]),
    ):
        for budget in ("worst", "mean"):
            over = [*ER, *extra, f"protocol.rounds={rounds}"]
            cal = cfree(
                "plan", GD, *sets(over), "--target-eps", str(eps),
                "--budget", budget, "--method", "exact", "--json",
            )  # fmt: skip
            sigma = cal["sigma"]
            run_dir = tmp / f"gd-{len(lines)}"
            summ = cfree(
                "run", GD, *sets([*over, f"privacy.sigma={sigma!r}"]),
                "--out", str(run_dir), "--quiet", "--json",
            )  # fmt: skip
            if summ.get("simulator_max_abs_diff") != 0.0:
                raise SystemExit(f"run {run_dir} differs from the simulator")
            acc = summ["results"]["metrics"][-1]["avg_test_accuracy"]
            a = audit_summary(json.loads((run_dir / "audit.json").read_text()))
            accs = np.array(
                [
                    cfree(
                        "simulate", GD, "--json",
                        *sets([*over, f"privacy.sigma={sigma!r}", f"run.seed={s}"]),
                    )["metrics"][-1]["avg_test_accuracy"]
                    for s in range(1, seeds + 1)
                ]
            )  # fmt: skip
            lines.append(
                f"| {gname} | {budget} | {sigma:.3f} | {acc:.3f} | {accs.mean():.3f} ± "
                f"{accs.std():.3f} | {a['exact']['worst']:.2f} / {a['paper']['worst']:.2f} | "
                f"{a['exact']['mean']:.2f} / {a['paper']['mean']:.2f} |"
            )
            print(lines[-1], file=sys.stderr, flush=True)
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eps", type=float, default=10.0, help="target eps for part 2")
    ap.add_argument("--seeds", type=int, default=5, help="simulator repetitions per row")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out", type=Path, help="write the markdown tables here (default: stdout)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        part1 = averaging(Path(tmp), args.seeds)
        part2 = learning(Path(tmp), args.eps, args.seeds, args.rounds)
    emit("\n".join(part1) + "\n\n" + "\n".join(part2) + "\n", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
