"""Random-walk DP-SGD vs Muffliato-GD at equal mean privacy loss, and ring summation vs local DP.

Table A (the random-walk paper's Table 1 set-up, scaled down): logistic regression on
breast_cancer, 16 peers, on a complete graph, a hypercube, a random geometric graph and a 4x4
grid. For every target eps_bar (mean over ordered pairs, delta 1e-5) each method's sigma is
calibrated with ``cfree plan --target-eps E --budget mean``:

* gossip: Muffliato-GD (``examples/muffliato-gd-breast-cancer.toml``), ``--method exact`` (the
  joint-view accountant, a guarantee);
* walk (paper): walk-sgd (``examples/walk-sgd.toml``), ``--method paper`` (Theorem 3, a
  guarantee);
* walk (exact, sampled): walk-sgd, ``--method exact``: realised-walk accounting on ONE walk drawn
  from the public ``run.seed`` = 1 (what a run typically gets, not a guarantee).

Each cell gives the sigma, the final test accuracy (mean ± std over ``--seeds`` runs of
``cfree simulate`` with ``run.seed`` = 1..S) and the worst-pair eps at that sigma (from the same
``cfree plan``). Step sizes are fixed (no tuning per cell). Under the table: one real ``cfree run``
of walk-sgd on the hypercube at eps_bar = 10 with the walk's paper sigma (token accuracy,
``simulator_max_abs_diff``, the audit's exact and paper eps).

Table B: ring summation (``examples/ring-sum.toml``, K = 4 turns, dim 1, sensitivity 1,
delta 1e-5) vs local DP as n grows, at equal WORST-pair eps. sigma_ring from
``cfree plan --target-eps E --budget worst --method exact`` (the ring's walk is fixed, so this is a
guarantee); sigma_LDP such that K Gaussian mechanisms (zCDP rho = K Delta^2 / (2 sigma^2)) meet
the same (eps, delta), by bisection on ``privacy.rdp.eps_from_rho``. Ring error: the RMSE of the
simulated estimate over ``--ring-seeds`` runs (in-process, ``run.seed`` = 1..S) vs the theory
sqrt(ceil(K n / (n - 1))) sigma_ring; LDP error: sqrt(K n) sigma_LDP (analytic, plus a numpy
Monte-Carlo of as many runs). Last column: Theorem 1's eps at sigma_ring
(``cfree plan --method paper``).

    python3 bench/walk_table.py --eps 5 10 20 --seeds 5 --out /tmp/walk.md

Every command it runs is printed, so each cell can be reproduced by hand.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from learning_table import audit_summary, cfree, emit, sets

from coordinator_free import config, sim
from coordinator_free.privacy.rdp import eps_from_rho

WALK = "examples/walk-sgd.toml"
GOSSIP = "examples/muffliato-gd-breast-cancer.toml"
RING = "examples/ring-sum.toml"
GRAPHS = {
    "complete": ["graph.kind=complete", "graph.nodes=16"],
    "hypercube": ["graph.kind=hypercube", "graph.dim=4"],
    "geometric": ["graph.kind=geometric", "graph.nodes=16", "graph.radius=0.5", "graph.seed=0"],
    "grid 4x4": ["graph.kind=grid", "graph.rows=4", "graph.cols=4"],
}
# (column label, config, plan --method)
METHODS = {
    "gossip": (GOSSIP, "exact"),
    "walk (paper)": (WALK, "paper"),
    "walk (exact, sampled)": (WALK, "exact"),
}
RING_K = 4
RING_SETS = [
    f"protocol.cycles={RING_K}",
    "data.dim=1",
    "privacy.sensitivity=1.0",
    "privacy.delta=1e-5",
]
CHECK = ("hypercube", 10.0)  # the networked run: graph and eps_bar, walk's paper sigma

FAILED: list[str] = []


def try_cfree(*args: str) -> dict | None:
    """``cfree`` that records a failure (and returns None) instead of stopping the bench."""
    try:
        return cfree(*args)
    except SystemExit as exc:
        msg = str(exc).strip()
        print(msg, file=sys.stderr, flush=True)
        lines = msg.splitlines() or ["cfree " + " ".join(args)]
        FAILED.append(f"`{lines[0]}`: {lines[-1]}")
        return None


def accuracy(cfg: str, over: list[str], seed: int) -> float:
    out = cfree("simulate", cfg, "--json", *sets([*over, f"run.seed={seed}"]))
    if "metrics" in out:
        return out["metrics"][-1]["avg_test_accuracy"]
    return out["tokens"][0]["test_accuracy"]


def table_a(eps_list: list[float], seeds: int) -> tuple[list[str], dict]:
    labels = list(METHODS)
    head = " | ".join(f"{m} σ | {m} acc | {m} ε worst" for m in labels)
    lines = [
        f"| graph | ε̄ (mean) | {head} |",
        "|" + "---|" * (2 + 3 * len(labels)),
    ]
    sigmas: dict = {}
    for gname, gsets in GRAPHS.items():
        for eps in eps_list:
            cells = []
            for label, (cfg, method) in METHODS.items():
                cal = try_cfree(
                    "plan", cfg, *sets(gsets), "--target-eps", str(eps),
                    "--budget", "mean", "--method", method, "--json",
                )  # fmt: skip
                if cal is None or cal.get("sigma") is None:
                    cells.append("unreachable | — | —")
                    continue
                sigma = cal["sigma"]
                sigmas[gname, eps, label] = sigma
                over = [*gsets, f"privacy.sigma={sigma!r}"]
                accs = np.array([accuracy(cfg, over, s) for s in range(1, seeds + 1)])
                cells.append(
                    f"{sigma:.3f} | {accs.mean():.3f} ± {accs.std():.3f} | "
                    f"{cal['worst_pair']['eps']:.2f}"
                )
            lines.append(f"| {gname} | {eps:g} | " + " | ".join(cells) + " |")
            print(lines[-1], file=sys.stderr, flush=True)
    return lines, sigmas


def networked_check(tmp: Path, sigmas: dict) -> str:
    gname, eps = CHECK
    gsets = GRAPHS[gname]
    sigma = sigmas.get((gname, eps, "walk (paper)"))
    if sigma is None:
        cal = try_cfree(
            "plan", WALK, *sets(gsets), "--target-eps", str(eps),
            "--budget", "mean", "--method", "paper", "--json",
        )  # fmt: skip
        if cal is None:
            return f"Networked check ({gname}, ε̄ = {eps:g}): calibration failed."
        sigma = cal["sigma"]
    run_dir = tmp / "walk-run"
    summ = try_cfree(
        "run", WALK, *sets([*gsets, f"privacy.sigma={sigma!r}"]),
        "--out", str(run_dir), "--quiet", "--json",
    )  # fmt: skip
    if summ is None:
        return f"Networked check ({gname}, ε̄ = {eps:g}, σ = {sigma:.3f}): `cfree run` failed."
    tok = summ["results"]["tokens"][0]
    a = audit_summary(json.loads((run_dir / "audit.json").read_text()))
    failed = f", failed nodes: {summ['failed']}" if summ.get("failed") else ""
    return (
        f"Networked check: one `cfree run` of walk-sgd, 16 peers, {gname}, walk (paper) σ = "
        f"{sigma:.3f} (ε̄ = {eps:g}): token test acc {tok['test_accuracy']:.3f} "
        f"(ended {tok['end']['how']} at node {tok['end']['at']}), simulator_max_abs_diff = "
        f"{summ.get('simulator_max_abs_diff')}{failed}; audit of the run's own walk: "
        f"exact ε worst {a['exact']['worst']:.2f} / mean {a['exact']['mean']:.2f}, "
        f"paper ε worst {a['paper']['worst']:.2f} / mean {a['paper']['mean']:.2f}; "
        f"wall {summ.get('wall_s', float('nan')):.1f} s."
    )


def ldp_sigma(eps: float, delta: float, k: int, sens: float) -> float:
    """sigma such that k Gaussian mechanisms of sensitivity sens are (eps, delta)-DP (zCDP)."""

    def eps_at(s: float) -> float:
        return eps_from_rho(k * sens * sens / (2.0 * s * s), delta)[0]

    lo, hi = 1e-6, 1e6  # eps_at(lo) > eps > eps_at(hi): eps decreases in sigma
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if eps_at(mid) > eps:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-12:
            break
    return hi


def table_b(ns: list[int], eps: float, seeds: int) -> list[str]:
    delta, sens = 1e-5, 1.0
    lines = [
        f"| n | σ_ring | ring RMSE (measured, {seeds} runs) | ring std (theory) | σ_LDP "
        f"| LDP std (analytic / MC, {seeds} runs) | LDP/ring error | Thm 1 ε at σ_ring |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rng = np.random.default_rng(0)
    for n in ns:
        over = [*RING_SETS, "graph.kind=ring", f"graph.nodes={n}"]
        cal = try_cfree(
            "plan", RING, *sets(over), "--target-eps", str(eps),
            "--budget", "worst", "--method", "exact", "--json",
        )  # fmt: skip
        sig_l = ldp_sigma(eps, delta, RING_K, sens)
        ldp_std = math.sqrt(RING_K * n) * sig_l
        ldp_mc = float(np.sqrt(np.mean(rng.normal(0.0, sig_l, (seeds, RING_K * n)).sum(1) ** 2)))
        if cal is None or cal.get("sigma") is None:
            lines.append(
                f"| {n} | unreachable | — | — | {sig_l:.3f} | {ldp_std:.2f} / {ldp_mc:.2f} "
                "| — | — |"
            )
            continue
        sigma = cal["sigma"]
        print(f"# {seeds} ring-sum simulations in-process, n = {n}", file=sys.stderr, flush=True)
        errs = []
        for s in range(1, seeds + 1):
            cfg = config.load(RING, [*over, f"privacy.sigma={sigma!r}", f"run.seed={s}"])
            tr = sim.simulate_walk(cfg).traces[0]
            errs.append(float(np.asarray(tr.final - tr.truth).reshape(-1)[0]))
        rmse = math.sqrt(float(np.mean(np.square(errs))))
        theory = math.sqrt(math.ceil(RING_K * n / (n - 1))) * sigma
        paper = try_cfree(
            "plan", RING, *sets([*over, f"privacy.sigma={sigma!r}"]), "--method", "paper", "--json"
        )
        thm = f"{paper['worst_pair']['eps']:.2f}" if paper else "failed"
        lines.append(
            f"| {n} | {sigma:.3f} | {rmse:.2f} | {theory:.2f} | {sig_l:.3f} | "
            f"{ldp_std:.2f} / {ldp_mc:.2f} | {ldp_std / theory:.2f} | {thm} |"
        )
        print(lines[-1], file=sys.stderr, flush=True)
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eps", type=float, nargs="+", default=[5.0, 10.0, 20.0],
                    help="Table A: target mean-over-pairs eps values (delta 1e-5)")  # fmt: skip
    ap.add_argument("--seeds", type=int, default=5, help="Table A: simulator runs per cell")
    ap.add_argument("--ring-n", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256])
    ap.add_argument("--ring-eps", type=float, default=2.0, help="Table B: target worst-pair eps")
    ap.add_argument("--ring-seeds", type=int, default=200, help="Table B: simulations per n")
    ap.add_argument("--no-run", action="store_true", help="skip the networked cfree run")
    ap.add_argument("--out", type=Path, help="also write the markdown tables here")
    args = ap.parse_args()
    t0 = time.monotonic()
    lines, sigmas = table_a(args.eps, args.seeds)
    with tempfile.TemporaryDirectory() as tmp:
        check = "Networked check skipped (--no-run)." if args.no_run else networked_check(
            Path(tmp), sigmas
        )  # fmt: skip
    ring = table_b(args.ring_n, args.ring_eps, args.ring_seeds)
    text = "\n".join(
        [
            "### A. Random walk vs Muffliato gossip at equal mean privacy loss",
            "",
            "Logistic regression on breast_cancer, n = 16, δ = 1e-5, sensitivity 2C = 2. Gossip: "
            "Muffliato-GD, 30 rounds, step size 0.5, K auto (Chebyshev), σ from the exact "
            "accountant (guarantee). Walk: walk-sgd, 320 hops, cap 25, step size 0.2 (fixed "
            "for every cell), Metropolis transitions; σ from Theorem 3 (paper, guarantee) or "
            "from the exact accountant on one walk sampled from run.seed = 1 (not a guarantee). "
            f"acc: final test accuracy, mean ± std over {args.seeds} `cfree simulate` runs "
            "(run.seed = 1..S); ε worst: worst-pair ε at that σ (same accountant). Geometric: "
            "radius 0.5, graph.seed 0.",
            "",
            *lines,
            "",
            check,
            "",
            "### B. Ring summation (network DP) vs local DP as n grows",
            "",
            f"examples/ring-sum.toml, K = {RING_K} turns, dim 1, sensitivity 1, δ = 1e-5, "
            f"equal worst-pair ε = {args.ring_eps:g}. Ring std (theory) = "
            "sqrt(ceil(K n/(n-1))) σ_ring; LDP std = sqrt(K n) σ_LDP (analytic; MC: numpy "
            "draws); LDP/ring error is the ratio of the two theory stds.",
            "",
            *ring,
            "",
        ]
    )
    if FAILED:
        text += "\nFailed commands:\n\n" + "\n".join(f"- {f}" for f in FAILED) + "\n"
    text += f"\nWall time: {time.monotonic() - t0:.0f} s\n"
    print(text)
    if args.out:
        emit(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
