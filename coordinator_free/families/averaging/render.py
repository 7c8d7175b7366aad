"""What the CLI prints for gossip averaging, and the gossip rendering the other gossip-based
families (randomized gossip, learning, DECOR) reuse with their own lines plugged in.

Every printer takes the JSON report the accountant or the run produced, so the human output
is always a view of exactly what ``--json`` prints.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from coordinator_free.accounting import render as _generic_audit
from coordinator_free.accounting.render import fmt, table

# ------------------------------------------------------------------------------------ plan


def print_gossip_plan(
    rep: dict,
    *,
    detail: Callable[[dict], None] | None = None,
    extra: Callable[[dict], bool] | None = None,
) -> None:
    """The plan of a gossip protocol. ``detail`` prints the family's schedule line after the
    header; ``extra`` prints its guarantees after the LDP baseline and returns False when the
    pairwise part is not to follow."""
    print(
        f"n={rep['n']}  steps={rep['steps']}  accelerated={rep['accelerated']}  "
        f"spectral gap={rep['spectral_gap']:.4g}  method={rep['method']}  alpha={rep['alpha']}  "
        f"delta={rep['delta']:g}"
    )
    if detail is not None:
        detail(rep)
    print(f"LDP baseline: rdp={fmt(rep['ldp']['rdp'])}  eps={fmt(rep['ldp']['eps'])}")
    if rep.get("accounting"):
        print(f"accounting: {rep['accounting']}")
    if extra is not None and not extra(rep):
        return
    if rep.get("private_graph_bound"):
        pg = rep["private_graph_bound"]
        print(
            f"for comparison, {pg['note']}: worst pair eps={fmt(pg['worst_pair']['eps'])}, "
            f"mean over pairs eps={fmt(pg['mean_over_pairs']['eps'])}"
            + (
                ""
                if pg["condition_holds"]
                else " (its condition sigma^2 >= Delta^2 a(a-1)/2 fails)"
            )
        )
    if rep.get("source") is not None:
        rows = [
            [
                str(x["observer"]),
                str(x["distance"]),
                fmt(x["factor"]),
                fmt(x["rdp"]),
                fmt(x["eps"]),
            ]
            for x in rep["losses"]
        ]
        print(f"losses from source {rep['source']}:")
        print(table(["observer", "dist", "factor", "rdp", "eps"], rows))
        return
    rows = [
        [str(r["distance"]), str(r["pairs"]), fmt(r["factor_mean"]), fmt(r["factor_max"]),
         fmt(r["rdp_mean"]), fmt(r["rdp_max"]), fmt(r["eps_max"])]
        for r in rep["by_distance"]
    ]  # fmt: skip
    print(
        table(
            ["dist", "pairs", "factor mean", "factor max", "rdp mean", "rdp max", "eps max"], rows
        )
    )
    w = rep["worst_pair"]
    print(f"worst pair: {w['source']} -> {w['observer']}  rdp={fmt(w['rdp'])}  eps={fmt(w['eps'])}")
    m = rep["mean_over_pairs"]
    print(f"mean over pairs: rdp={fmt(m['rdp'])}  eps={fmt(m['eps'])}")


def print_plan(rep: dict) -> None:
    print_gossip_plan(rep)


# ----------------------------------------------------------------------------------- audit


# The audit's matrices (and DECOR's SecLDP block, present when the report has one) are the
# generic audit rendering.
print_audit = _generic_audit.print_audit


def print_audit_compact(audit: dict, *, extra: Callable[[dict], None] | None = None) -> None:
    """PNDP table by graph distance: mean and max eps over pairs, both methods."""
    by: dict[tuple[str, int], list[float]] = {}
    for o in audit["observers"]:
        for x in o["losses"]:
            by.setdefault((x["method"], x["distance"]), []).append(x["eps"])
    dists = sorted({d for _, d in by})
    rows = []
    for d in dists:
        e = by.get(("exact", d), [0.0])
        p = by.get(("paper", d), [0.0])
        rows.append(
            [
                str(d),
                str(len(e)),
                fmt(float(np.mean(e))),
                fmt(max(e)),
                fmt(float(np.mean(p))),
                fmt(max(p)),
            ]
        )
    print(
        f"pairwise network DP (eps at delta={audit['delta']:g}, from the view logs; "
        f"LDP would be eps={fmt(audit['ldp']['eps'])}):"
    )
    print(table(["dist", "pairs", "exact mean", "exact max", "paper mean", "paper max"], rows))
    if extra is not None:
        extra(audit)
    if audit["integrity"]:
        print(f"integrity findings: {len(audit['integrity'])} (see cfree audit)")
    raised = {
        basis: sum(1 for o in audit["observers"] for x in o["losses"] if x.get("basis") == basis)
        for basis in ("plan", "worst-case")
    }
    if any(raised.values()):
        print(
            f"conservative: {raised['plan']} loss(es) raised to the plan's, "
            f"{raised['worst-case']} worst case (an observer's log is missing or unusable)"
        )


# ----------------------------------------------------------------------------- calibration


def print_calibration(rep: dict, *, unit: str = "exchange steps") -> None:
    """The smallest sigma meeting a target eps; ``unit`` names what the steps are."""
    b = rep["binding"]
    what = (
        f"binding pair {b['source']} -> {b['observer']}"
        if rep["budget"] == "worst"
        else "binding: the mean over pairs"
    )
    print(
        f"{rep['protocol']}: sigma = {rep['sigma']:.6g} meets eps <= {rep['target_eps']:g} at "
        f"delta = {rep['delta']:g} ({rep['method']} method, {rep['budget']} budget, "
        f"sensitivity {rep['sensitivity']:g}, {rep['steps']} {unit})"
    )
    print(f"  {what}: rdp = {fmt(b.get('rdp'))}, eps = {fmt(b['eps'])}")
    w, m = rep["worst_pair"], rep["mean_over_pairs"]
    print(f"  worst pair {w['source']} -> {w['observer']}: eps = {fmt(w['eps'])}")
    print(
        f"  mean over pairs: eps = {fmt(m['eps'])};  local DP at this sigma: eps = {fmt(rep['ldp']['eps'])}"
    )
    if rep.get("accounting"):
        print(f"  accounting: {rep['accounting']}")
    print(f"use it: --set privacy.sigma={rep['sigma']:.6g}")


# ------------------------------------------------------------------------------- run output


def banner(cfg, plan) -> str:
    acc = " (Chebyshev)" if plan.accelerated else ""
    return (
        f"starting {plan.n} peers: {cfg.protocol.name} on {cfg.graph.kind}, "
        f"{plan.steps} steps{acc}, sigma={plan.sigma}"
    )


def print_footer(
    summary: dict, audit: dict | None, compact: Callable[[dict], None] = print_audit_compact
) -> None:
    """The end of every run summary: the simulator comparison, the compact audit, the run dir."""
    d = summary["simulator_max_abs_diff"]
    if d is not None:
        print(
            f"reference simulator: max |peer - simulator| = {d:.3g}{' (bitwise equal)' if d == 0 else ''}"
        )
    if audit is not None:
        print()
        compact(audit)
    print(f"\nrun directory: {summary['run_dir']}  (details: cfree audit {summary['run_dir']})")


def print_summary(summary: dict, audit: dict | None) -> None:
    res = summary["results"]
    nodes = res["nodes"]
    print(f"\ntrue mean: {np.array2string(np.asarray(res['true_mean']), precision=4)}")
    rows = []
    for r in nodes:
        if not r["finished"]:
            rows.append([str(r["node"]), "-", "-", "-", "-", "did not finish"])
            continue
        rows.append(
            [str(r["node"]), fmt(r["error"]), f"{r['steps_per_s']:.1f}", str(r["bytes_sent"]),
             str(r["bytes_received"]), str(r["missed"])]
        )  # fmt: skip
    print(table(["node", "|est - mean|", "rounds/s", "bytes sent", "bytes recv", "missed"], rows))
    fin = [r for r in nodes if r["finished"]]
    if fin:
        print(
            f"mean error {fmt(float(np.mean([r['error'] for r in fin])))}, "
            f"total bytes sent {sum(r['bytes_sent'] for r in fin)}, "
            f"wall time {summary['wall_s']:.2f}s"
        )
    print_footer(summary, audit)


def simulator_diff(cfg, plan, run_dir: Path, results: dict, simulate) -> float | None:
    """max |peer estimate - simulator| over the nodes that finished (None if none did);
    ``simulate()`` runs the family's simulator with the run's streams (only when needed)."""
    finished = [r for r in results["nodes"] if r["finished"]]
    if not finished:
        return None
    sim = simulate()
    return max(
        float(np.max(np.abs(np.asarray(r["estimate"]) - sim.finals[r["node"]]))) for r in finished
    )


# ------------------------------------------------------------------------------- simulation


def simulation(cfg, r) -> dict:
    """``cfree simulate --json`` of a gossip-averaging protocol, from the simulator's result."""
    return {
        "n": r.plan.n,
        "steps": r.plan.steps,
        "true_mean": r.true_mean.tolist(),
        "finals": r.finals.tolist(),
        "errors": [float(np.linalg.norm(r.finals[v] - r.true_mean)) for v in range(r.plan.n)],
        "mse_by_step": r.history_mse,
    }


def print_simulation(out: dict) -> None:
    true_mean = np.asarray(out["true_mean"], dtype=np.float64)
    finals = np.asarray(out["finals"], dtype=np.float64)
    print(f"n={out['n']} steps={out['steps']} true mean={np.array2string(true_mean, precision=4)}")
    rows = [
        [str(v), np.array2string(finals[v], precision=4), fmt(out["errors"][v])]
        for v in range(out["n"])
    ]
    print(table(["node", "final value", "|est - mean|"], rows))
    print("mean squared error by step: " + " ".join(fmt(x) for x in out["mse_by_step"]))
