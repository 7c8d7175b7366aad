"""Decentralized private ADMM against random-walk DP-SGD and D-SGD over real peers, at equal
epsilon (docs/results.md, "Decentralized private ADMM over real peers").

For each target eps, each config's sigma comes from ``cfree plan CONFIG --target-eps E`` (its worst
pair at E), then ``cfree run CONFIG --set privacy.sigma=SIGMA`` runs 16 peer processes. Printed:
the exact commands and, per run, the released model's test least-squares loss
(``(1/(2m)) ||y - X w||^2`` on the test set; admm's test objective minus its l1 term), that of the
same run without noise and of the zero model.

    python3 bench/admm_peers/compare.py --eps 2 5 10 --md /tmp/admm_peers.md
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
RUNS = {
    "admm (record level)": ("examples/admm-lasso.toml", []),
    "admm (user level)": ("examples/admm-lasso.toml", ["privacy.unit=user"]),
    "walk-sgd": ("bench/admm_peers/walk-sgd-sparse.toml", []),
    "dsgd": ("bench/admm_peers/dsgd-sparse.toml", []),
}


def cfree(*args: str) -> dict:
    p = subprocess.run(
        [sys.executable, "-m", "coordinator_free", *args],
        cwd=REPO, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    if p.returncode != 0:
        raise SystemExit(f"cfree {' '.join(args)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    return json.loads(p.stdout)


def sets_args(sets: list[str]) -> list[str]:
    return [x for s in sets for x in ("--set", s)]


def lstsq_of_admm(summary: dict, cfg_path: Path) -> tuple[float, float]:
    """(test least-squares loss, l1 term) of the admm run's released model (token mean)."""
    from coordinator_free import config
    from coordinator_free.families.admm import protocol as ap

    cfg = config.load(cfg_path)
    plan = ap.make_plan(cfg)
    ds = ap.make_task(cfg, plan.n).dataset
    vals = []
    for t in summary["results"]["tokens"]:
        z = ap.z_of(plan, np.asarray(t["final"], dtype=np.float64))
        r = ds.y_test - ds.X_test @ z
        vals.append(float(r @ r) / (2.0 * len(r)))
    return float(np.mean(vals)), float(summary["yardstick"]["measured"] - np.mean(vals))


def main() -> None:
    ap_ = argparse.ArgumentParser()
    ap_.add_argument("--eps", type=float, nargs="+", default=[2.0, 5.0, 10.0])
    ap_.add_argument("--md", type=Path, default=None)
    args = ap_.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for eps in args.eps:
            for name, (path, sets) in RUNS.items():
                cal = cfree("plan", path, *sets_args(sets), "--target-eps", f"{eps:g}", "--json")
                sigma = cal["sigma"]
                run_sets = [*sets, f"privacy.sigma={sigma:.6g}"]
                out = Path(tmp) / f"run{len(rows)}"
                cmd = ["run", path, *sets_args(run_sets), "--out", str(out), "--json", "--quiet"]
                s = cfree(*cmd)
                y = s["yardstick"]
                if name.startswith("admm"):
                    test, l1 = lstsq_of_admm(s, out / "config.toml")
                    nf = y["expected"]  # the noise-free run's test objective (with its l1 term)
                    note = f"test objective {y['measured']:.4g} (noise-free {nf:.4g})"
                else:
                    test, note = y["measured"], f"noise-free {y['expected']:.4g}"
                row = {
                    "eps": eps, "method": name, "sigma": sigma,
                    "pair_eps": cal["eps"], "ldp": cal["ldp"]["eps"],
                    "test": test, "trivial": y["trivial"], "ratio": y["ratio"], "note": note,
                    "command": "cfree " + " ".join(cmd[:-4]),
                }  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.md:
        lines = [
            "| target ε | method | σ | worst pair ε | local DP ε | test loss | vs noise-free | "
            "trivial |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            lines.append(
                f"| {r['eps']:g} | {r['method']} | {r['sigma']:.4g} | {r['pair_eps']:.3g} | "
                f"{r['ldp']:.3g} | {r['test']:.4g} | ratio {r['ratio']:.2f}; {r['note']} | "
                f"{r['trivial']:.4g} |"
            )
        args.md.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
