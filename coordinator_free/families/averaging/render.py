"""What the CLI prints for gossip averaging, and the gossip rendering the other gossip-based
families (randomized gossip, learning, DECOR) reuse with their own lines plugged in.

Every printer takes the JSON report the accountant or the run produced, so the human output
is always a view of exactly what ``--json`` prints.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np

from coordinator_free import yardstick
from coordinator_free.accounting import baseline
from coordinator_free.accounting import render as _generic_audit
from coordinator_free.accounting.baseline import BELOW_MARK
from coordinator_free.accounting.render import (
    below_mark,
    capped,
    fmt,
    print_baseline,
    print_below_exact,
    print_central,
    table,
)
from coordinator_free.ml.reference import lines as reference_lines

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
    graph = (
        ""
        if rep.get("central")
        else f"steps={rep['steps']}  accelerated={rep['accelerated']}  "
        f"spectral gap={rep['spectral_gap']:.4g}  "
    )
    print(
        f"n={rep['n']}  {graph}method={rep['method']}  alpha={rep['alpha']}  delta={rep['delta']:g}"
    )
    if detail is not None:
        detail(rep)
    print(f"LDP baseline: rdp={fmt(rep['ldp']['rdp'])}  eps={fmt(rep['ldp']['eps'])}")
    if rep.get("accounting"):
        print(f"accounting: {rep['accounting']}")
    if rep.get("central"):
        print_central(rep)
        return
    if extra is not None and not extra(rep):
        return
    if rep.get("private_graph_bound"):
        print_private_graph_bound(rep["private_graph_bound"])
    if rep.get("source") is not None:
        rows = [
            [
                str(x["observer"]) + ("+" if x.get("upper_bound") else ""),
                str(x["distance"]),
                fmt(x["factor"]),
                capped(x, "rdp"),
                capped(x, "eps") + below_mark(x),
            ]
            for x in rep["losses"]
        ]
        print(f"losses from source {rep['source']}:")
        head, rows = with_exact_column(["observer", "dist", "factor", "rdp", "eps"], rows, rep)
        print(table(head, rows))
        print_plan_ending(rep)
        return
    rows = [
        [str(r["distance"]), str(r["pairs"]), fmt(r["factor_mean"]), fmt(r["factor_max"]),
         capped(r, "rdp_mean"), capped(r, "rdp_max"), capped(r, "eps_max") + row_below_mark(r),
         amplified_cell(r)]
        for r in rep["by_distance"]
    ]  # fmt: skip
    head = ["dist", "pairs", "factor mean", "factor max", "rdp mean", "rdp max", "eps max",
            "below LDP"]  # fmt: skip
    head, rows = with_below_exact_column(head, rows, rep)
    print(table(head, rows))
    w = rep["worst_pair"]
    print(
        f"worst pair: {w['source']} -> {w['observer']}  rdp={capped(w, 'rdp')}  "
        f"eps={capped(w, 'eps')}"
    )
    m = rep["mean_over_pairs"]
    print(f"mean over pairs: rdp={capped(m, 'rdp')}  eps={capped(m, 'eps')}")
    print_plan_ending(rep)


def _theorem_figure(x: dict) -> str:
    """A Theorem 4/9 figure: its eps at the allowed orders, the order used and, where local DP
    is below it, the usable value."""
    if x.get("eps") is None:
        return f"none (no allowed order): local DP eps={fmt(x.get('eps_usable'))}"
    out = f"eps={fmt(x['eps'])} (alpha={fmt(x.get('alpha'))})"
    if x.get("eps_usable") is not None and x["eps_usable"] < x["eps"]:
        out += f", usable eps={fmt(x['eps_usable'])} (local DP)"
    return out


def print_private_graph_bound(pg: dict) -> None:
    """Theorem 4/9 on per-round Erdős–Rényi graphs: its per-pair figures, its order interval
    and condition, and (secret graphs) its expectation over the graphs, labelled as such."""
    lead = "guarantee" if pg.get("secret") else "for comparison"
    if pg.get("secret"):
        print(
            f"{lead}, {pg['note']}. Per pair: worst eps={fmt(pg['worst_pair']['eps'])} "
            "(R-fold local DP)"
        )
        ex = pg.get("expected")
        if ex:
            print(
                f"  expected over the graphs (not a per-pair bound): factor={fmt(ex['factor'])}  "
                + _theorem_figure(ex)
            )
        return
    print(
        f"{lead}, {pg['note']}: worst pair {_theorem_figure(pg['worst_pair'])}, "
        f"mean over pairs {_theorem_figure(pg['mean_over_pairs'])}"
        + ("" if pg["condition_holds"] else " (the condition fails at the config's alpha)")
    )


def row_below_mark(row: dict) -> str:
    """``!`` after a paper plan's figure by distance when the accountant counted pairs of that
    distance below their exact loss (the row's ``below_exact``), else ''."""
    return BELOW_MARK if _count(row.get("below_exact")) else ""


def _count(x) -> int:
    return int(x) if isinstance(x, int) and not isinstance(x, bool) else 0


def with_exact_column(
    head: list[str], rows: list[list[str]], rep: dict
) -> tuple[list[str], list[list[str]]]:
    """A one-source paper plan's table with the exact loss beside each figure marked ``!``
    (its ``eps_exact``; '-' elsewhere), when any is marked."""
    losses = rep.get("losses") or []
    if not any(below_mark(x) for x in losses):
        return head, rows
    return head + ["exact eps"], [
        r + [fmt(x["eps_exact"]) if below_mark(x) else "-"]
        for r, x in zip(rows, losses, strict=True)
    ]


def with_below_exact_column(
    head: list[str], rows: list[list[str]], rep: dict
) -> tuple[list[str], list[list[str]]]:
    """A paper plan's table by distance with how many pairs of each distance the accountant
    found below their exact loss, when it counted them (the rows' ``below_exact``)."""
    by = rep.get("by_distance") or []
    if not any("below_exact" in r for r in by):
        return head, rows
    return head + ["below exact"], [
        r + [str(_count(x.get("below_exact")))] for r, x in zip(rows, by, strict=True)
    ]


def amplified_cell(row: dict) -> str:
    """How many of a distance row's pairs are below local DP (paper plans: by the formula)."""
    return str(row["amplified"]) if "amplified" in row else "-"


def print_plan_ending(rep: dict) -> None:
    """The legend of capped paper values and the plan's reading against local DP."""
    if rep.get("baseline", {}).get("paper_above_ldp"):
        print(baseline.LEGEND)
    print_below_exact(rep)
    print_baseline(rep)


def print_plan(rep: dict) -> None:
    print_gossip_plan(rep)


# ----------------------------------------------------------------------------------- audit


# The audit's matrices (and DECOR's SecLDP block, present when the report has one) are the
# generic audit rendering.
print_audit = _generic_audit.print_audit


#: The columns of the compact audit, said once (docs/privacy.md, "Glossary").
TERMS = (
    "exact: the loss the observer's view actually gives (the Gaussian privacy profile of what it "
    "saw); paper: the paper's formula for the same pair; below LDP: pairs amplified, below "
    "local DP (glossary: docs/privacy.md)"
)


def print_audit_compact(
    audit: dict, *, extra: Callable[[dict], None] | None = None, terms: str = TERMS
) -> None:
    """PNDP table by graph distance: mean and max eps over pairs, both methods (paper capped at
    local DP, marked ^; marked ! where the accountant found a pair of that distance whose paper
    figure is below its exact loss, with how many), how many pairs are below local DP, then
    what it means in words."""
    if audit.get("central"):
        print_central(audit)
        return
    ldp_eps = audit["ldp"]["eps"]
    by: dict[tuple[str, int], list[float]] = {}
    raw_above: dict[int, int] = {}
    below_exact: dict[int, int] = {}
    for o in audit["observers"]:
        for x in o["losses"]:
            by.setdefault((x["method"], x["distance"]), []).append(x.get("eps_usable", x["eps"]))
            if x["method"] == "paper" and x["eps"] > x.get("eps_usable", x["eps"]):
                raw_above[x["distance"]] = raw_above.get(x["distance"], 0) + 1
            if x["method"] == "paper" and below_mark(x):
                below_exact[x["distance"]] = below_exact.get(x["distance"], 0) + 1
    dists = sorted({d for _, d in by})
    rows = []
    for d in dists:
        e = by.get(("exact", d), [0.0])
        p = by.get(("paper", d), [0.0])
        mark = (baseline.MARK if raw_above.get(d) else "") + (
            BELOW_MARK if below_exact.get(d) else ""
        )
        rows.append(
            [
                str(d),
                str(len(e)),
                str(sum(1 for x in e if baseline.below(x, ldp_eps))),
                fmt(float(np.mean(e))),
                fmt(max(e)),
                fmt(float(np.mean(p))) + mark,
                fmt(max(p)) + mark,
            ]
            + ([str(below_exact.get(d, 0))] if below_exact else [])
        )
    print(
        f"pairwise network DP: eps_(u->v) at delta={audit['delta']:g} that observer v's view "
        f"(its log) gives about source u, by graph distance; local DP: eps={fmt(ldp_eps)}"
    )
    print(
        table(
            ["dist", "pairs", "below LDP", "exact mean", "exact max", "paper mean", "paper max"]
            + (["paper below exact"] if below_exact else []),
            rows,
        )
    )
    print(textwrap.fill(terms, 100, subsequent_indent="  "))
    if raw_above:
        print(baseline.LEGEND)
    print_below_exact(audit)
    print_baseline(audit)
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
    if rep.get("method") == "paper":
        print(
            "  the paper's formula is capped at local DP pair by pair (where it is above, local "
            "DP is the valid bound)"
        )
    if rep.get("accounting"):
        print(f"  accounting: {rep['accounting']}")
    gain = rep.get("gain")
    if gain is not None:
        if gain["gains_over_ldp"]:
            print(
                f"  local DP alone would need sigma = {rep['ldp_sigma']:.6g}: the protocol needs "
                f"{gain['sigma_ratio']:.3g} x that noise"
            )
        else:
            print(f"  local DP alone needs the same sigma = {rep['ldp_sigma']:.6g}:")
            print(
                textwrap.fill(gain["why"], width=100, initial_indent="  ", subsequent_indent="  ")
            )
    print(f"use it: --set privacy.sigma={rep['sigma']:.6g}")


# ------------------------------------------------------------------------------- run output


def banner(cfg, plan) -> str:
    acc = " (Chebyshev)" if plan.accelerated else ""
    return (
        f"starting {plan.n} peers: {cfg.protocol.name} on {cfg.graph.kind}, "
        f"{plan.steps} steps{acc}, sigma={plan.sigma}"
        + (f" ({baseline.NO_PRIVACY})" if plan.sigma == 0 else "")
    )


def print_footer(
    summary: dict, audit: dict | None, compact: Callable[[dict], None] = print_audit_compact
) -> None:
    """The end of every run summary: the references a trained model is judged against, the
    simulator comparison, the compact audit, the run dir."""
    for line in reference_lines(summary.get("reference")):
        print(line)
    for line in yardstick.lines(summary.get("yardstick")):
        print(line)
    drop = summary.get("dropout")
    if drop:
        counts = ", ".join(f"{v}: {c}" for v, c in enumerate(drop["sat_out"]))
        print(
            f"dropout {drop['p']:g} (public schedule): steps each node sat out, of "
            f"{drop['steps']}: {counts}"
        )
    d = summary["simulator_max_abs_diff"]
    if d is not None:
        note = summary.get("simulator_note")
        print(
            f"reference simulator: max |peer - simulator| = {d:.3g}"
            + (" (bitwise equal)" if d == 0 else f" ({note})" if note else "")
        )
    if audit is not None:
        print()
        compact(audit)
    print(f"\nrun directory: {summary['run_dir']}  (details: cfree audit {summary['run_dir']})")


#: Above this many nodes the run summary prints the spread over nodes, not one row per node.
PER_NODE_ROWS_MAX = 16


def print_summary(summary: dict, audit: dict | None) -> None:
    res = summary["results"]
    nodes = res["nodes"]
    print(f"\ntrue mean: {np.array2string(np.asarray(res['true_mean']), precision=4)}")
    head = ["node", "|est - mean|", "rounds/s", "bytes sent", "bytes recv", "missed"]
    fin = [r for r in nodes if r["finished"]]

    def row(label: str, r: dict) -> list[str]:
        if not r.get("finished", True):
            return [label, "-", "-", "-", "-", "did not finish"]
        return [label, fmt(r["error"]), f"{r['steps_per_s']:.1f}", str(r["bytes_sent"]),
                str(r["bytes_received"]), str(r["missed"])]  # fmt: skip

    if len(nodes) <= PER_NODE_ROWS_MAX:
        print(table(head, [row(str(r["node"]), r) for r in nodes]))
    else:
        # Many nodes: the spread over the nodes that finished, then every node that stands out
        # (did not finish, or missed a deadline). Each node's numbers: summary.json.
        keys = ("error", "steps_per_s", "bytes_sent", "bytes_received", "missed")
        rows = []
        if fin:
            for label, f in (("min", np.min), ("median", np.median), ("max", np.max)):
                stat = {k: f([r[k] for r in fin]) for k in keys}
                rows.append(row(label, {k: stat[k] if k in ("error", "steps_per_s") else
                                        int(round(float(stat[k]))) for k in keys}))  # fmt: skip
        odd = [r for r in nodes if not r["finished"] or r["missed"]]
        rows += [row(f"node {r['node']}", r) for r in odd]
        print(f"{len(nodes)} nodes, {len(fin)} finished; each node's numbers are in summary.json")
        print(table(["over nodes", *head[1:]], rows))
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
