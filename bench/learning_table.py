"""Muffliato-GD vs D-SGD (local DP) vs central DP at equal (eps, delta), from the CLI.

For every graph, budget (worst pair / mean over pairs) and accountant (exact / paper), each
protocol's noise is calibrated with ``cfree plan --target-eps`` and then run for real with
``cfree run`` (16 peer processes; central DP in one process). The table reports the final test
accuracy of the node-average model in that networked run, the mean and standard deviation of the
final test accuracy over ``--seeds`` runs of ``cfree simulate`` (``run.seed`` = 1..S: another
split, other shards, other noise), the calibrated sigma and the eps the auditor measured from the
networked run's view logs (worst pair and mean over pairs, exact and paper).

    python3 bench/learning_table.py --eps 10 --seeds 5 --out /tmp/table.md

Every command it runs is printed, so each row can be reproduced by hand.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PROTOCOLS = {
    "muffliato-gd": "examples/muffliato-gd-breast-cancer.toml",
    "dsgd": "examples/dsgd-breast-cancer.toml",
    "central-dp": "examples/central-dp-breast-cancer.toml",
}
GRAPHS = {
    "ring (n=16)": ["graph.kind=ring", "graph.nodes=16"],
    "hypercube (n=16)": ["graph.kind=hypercube", "graph.dim=4"],
}


def cfree(*args: str) -> dict:
    cmd = [sys.executable, "-m", "coordinator_free", *args]
    print("$ cfree " + " ".join(args), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"command failed ({out.returncode}): {' '.join(cmd)}\n{out.stderr}")
    return json.loads(out.stdout)


def sets(items: list[str]) -> list[str]:
    return [a for s in items for a in ("--set", s)]


def audit_summary(audit: dict) -> dict:
    out = {}
    for method in ("exact", "paper"):
        eps = [x["eps"] for o in audit["observers"] for x in o["losses"] if x["method"] == method]
        out[method] = {"worst": max(eps), "mean": sum(eps) / len(eps)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eps", type=float, default=5.0, help="target eps (delta from the configs)")
    ap.add_argument("--out", type=Path, help="write the markdown table here (default: stdout)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seeds", type=int, default=5, help="simulator repetitions per row")
    args = ap.parse_args()
    lines = [
        "| graph | budget | accountant | protocol | sigma | test acc (run) "
        f"| test acc (mean ± std, {args.seeds} seeds) | eps worst (exact/paper) "
        "| eps mean (exact/paper) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        k = 0
        for gname, gsets in GRAPHS.items():
            for budget in ("worst", "mean"):
                for method in ("exact", "paper"):
                    for proto, cfg in PROTOCOLS.items():
                        # the step size docs/results.md states (the examples now run 0.3)
                        over = [*gsets, f"protocol.rounds={args.rounds}", "protocol.step_size=0.5"]
                        cal = cfree(
                            "plan", cfg, *sets(over), "--target-eps", str(args.eps),
                            "--budget", budget, "--method", method, "--json",
                        )  # fmt: skip
                        sigma = cal["sigma"]
                        k += 1
                        run_dir = Path(tmp) / f"run-{k}"
                        summ = cfree(
                            "run", cfg, *sets([*over, f"privacy.sigma={sigma!r}"]),
                            "--out", str(run_dir), "--quiet", "--json",
                        )  # fmt: skip
                        acc = summ["results"]["metrics"][-1]["avg_test_accuracy"]
                        if summ.get("simulator_max_abs_diff") not in (None, 0.0):
                            raise SystemExit(f"run {run_dir} differs from the simulator")
                        a = audit_summary(json.loads((run_dir / "audit.json").read_text()))
                        accs = np.array(
                            [
                                cfree(
                                    "simulate", cfg, "--json",
                                    *sets([*over, f"privacy.sigma={sigma!r}", f"run.seed={s}"]),
                                )["metrics"][-1]["avg_test_accuracy"]
                                for s in range(1, args.seeds + 1)
                            ]
                        )  # fmt: skip
                        lines.append(
                            f"| {gname} | {budget} | {method} | {proto} | {sigma:.3f} | "
                            f"{acc:.3f} | {accs.mean():.3f} ± {accs.std():.3f} | "
                            f"{a['exact']['worst']:.2f} / {a['paper']['worst']:.2f} "
                            f"| {a['exact']['mean']:.2f} / {a['paper']['mean']:.2f} |"
                        )
                        print(lines[-1], file=sys.stderr, flush=True)
    emit("\n".join(lines) + "\n", args.out)
    return 0


def emit(text: str, out: Path | None) -> None:
    """The markdown table: to ``out`` if given, else stdout."""
    if out:
        out.write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    raise SystemExit(main())
