"""What the CLI prints for token walks, and what each token of a run or a simulation is worth
(the estimate against the truth, or the model's test quality)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from coordinator_free.accounting.render import below_mark, capped, fmt, table
from coordinator_free.families.averaging import render as gossip
from coordinator_free.ml.reference import lines as reference_lines


def print_audit(rep: dict) -> None:
    """The generic audit, then the observers whose 'exact' losses are the worst case."""
    gossip.print_audit(rep)
    worst = rep.get("worst_case", [])
    if worst:
        print(f"\n'exact' is the worst case for {len(worst)} observer(s):")
        for x in worst:
            print(f"  {x['message']}")


def print_plan(rep: dict) -> None:
    print(
        f"protocol={rep['protocol']}  n={rep['n']}  hops per token={rep['hops']}  "
        f"tokens={rep['tokens']}  cap={rep['cap'] or 'none'}  method={rep['method']}  "
        f"alpha={rep['alpha']}  delta={rep['delta']:g}"
    )
    ldp = rep["ldp"]
    print(
        f"LDP baseline ({ldp['contributions']:g} contributions per node, each seen directly): "
        f"eps={fmt(ldp['eps'])}"
    )
    print(f"accounting: {rep['accounting']}")
    if rep.get("hidden_sender"):
        h = rep["hidden_sender"]
        print(
            f"for comparison, {h['note']}: worst pair eps={fmt(h['worst_pair']['eps'])}, "
            f"mean over pairs eps={fmt(h['mean_over_pairs']['eps'])}"
        )
    if rep.get("source") is not None:
        rows = [
            [str(x["observer"]), str(x["distance"]), fmt(x["factor"]), capped(x, "rdp"),
             capped(x, "eps") + below_mark(x)]
            for x in rep["losses"]
        ]  # fmt: skip
        print(f"losses from source {rep['source']}:")
        head = ["observer", "dist", "factor", "rdp", "eps"]
        head, rows = gossip.with_exact_column(head, rows, rep)
        print(table(head, rows))
        if rep.get("typical_walk"):
            print_typical_walk(rep)
        else:
            gossip.print_plan_ending(rep)
        return
    rows = [
        [str(r["distance"]), str(r["pairs"]), fmt(r["factor_mean"]), fmt(r["factor_max"]),
         capped(r, "eps_mean"), capped(r, "eps_max") + gossip.row_below_mark(r),
         gossip.amplified_cell(r)]
        for r in rep["by_distance"]
    ]  # fmt: skip
    head = ["dist", "pairs", "factor mean", "factor max", "eps mean", "eps max", "below LDP"]
    head, rows = gossip.with_below_exact_column(head, rows, rep)
    print(table(head, rows))
    w = rep["worst_pair"]
    print(f"worst pair: {w['source']} -> {w['observer']}  eps={capped(w, 'eps')}")
    print(f"mean over pairs: eps={capped(rep['mean_over_pairs'], 'eps')}")
    if rep.get("typical_walk"):
        print_typical_walk(rep)
        return
    gossip.print_plan_ending(rep)


def print_typical_walk(rep: dict) -> None:
    """Off the ring: the guarantee is local DP for every pair, and one sampled walk beside it."""
    t = rep["typical_walk"]
    if rep.get("baseline", {}).get("paper_above_ldp"):
        print(baseline_legend())
    gossip.print_below_exact(rep)
    print(
        f"typical walk (ONE walk sampled from the public run seed, conditional on it; not a "
        f"guarantee): worst pair eps={fmt(t['worst_pair']['eps'])}, mean over pairs "
        f"eps={fmt(t['mean_over_pairs']['eps'])}"
    )
    print(
        "every walk is possible, and one that brings a source's every contribution to an "
        "observer alone costs local DP: the plan's 'exact' is that guarantee for every pair; "
        "cfree audit of a run gives the cost of the walk it really took."
    )


def baseline_legend() -> str:
    from coordinator_free.accounting import baseline

    return baseline.LEGEND


def print_calibration(rep: dict) -> None:
    gossip.print_calibration(rep, unit="hops")


def banner(cfg, plan) -> str:
    what = {"sum": "a running sum", "histogram": "a count histogram", "sgd": "a model"}[plan.kind]
    noise = (
        f"eps0={plan.eps0} randomized responses"
        if plan.kind == "histogram"
        else f"sigma={plan.sigma}"
    )
    cap = f", cap {plan.cap} contributions per node" if plan.cap else ""
    return (
        f"starting {plan.n} peers: {cfg.protocol.name} on {cfg.graph.kind}, {plan.tokens} "
        f"token(s) carrying {what}, {plan.hops} hops each{cap}, {noise}"
    )


def walk_outcomes(cfg, plan, traces) -> list[dict]:
    """Per token: where it ended, its final value, and what it is worth (|estimate - truth| for
    sums and histograms, test accuracy and loss for models)."""
    from coordinator_free.families.walk import protocol as wk

    task = None
    if plan.kind == "sgd":
        from coordinator_free.families.learning import protocol as lp

        task = lp.make_task(cfg, plan.n)
    out = []
    for t in traces:
        row = {
            "token": t.token,
            "end": {"how": "completed", "at": t.holders[-1], "step": len(t.holders)},
            "final": t.final.tolist(),
            "contributions": int(np.sum(t.data)),
        }
        if task is not None:
            ds, model = task.dataset, task.model
            row["test_accuracy"] = model.accuracy(t.final, ds.X_test, ds.y_test)
            row["test_loss"] = float(model.loss(t.final, ds.X_test, ds.y_test))
        else:
            est = wk.estimate(plan, t.final)
            row.update(estimate=est.tolist(), truth=t.truth.tolist(),
                       error=float(np.linalg.norm(est - t.truth)))  # fmt: skip
        out.append(row)
    return out


def mean_token_quality(cfg, sim) -> tuple[float | None, float]:
    """(test accuracy, test loss) of a model-carrying walk's final models, averaged over its
    tokens (one token: that token's)."""
    rows = walk_outcomes(cfg, sim.plan, sim.traces)
    accs = [r["test_accuracy"] for r in rows]
    acc = None if any(a is None for a in accs) else float(np.mean(accs))
    return acc, float(np.mean([r["test_loss"] for r in rows]))


def simulator_diff(cfg, plan, run_dir: Path, results: dict, simulate) -> float | None:
    """Add to every completed token the simulator's verdict on it (estimate, truth and error,
    or test accuracy); return max |peer - simulator| over the completed tokens (None if none
    completed). The truth is that of the fault-free walk: meaningful when the walk completed as
    planned (a re-routed walk sums other contributions)."""
    sim = simulate()
    ref = walk_outcomes(cfg, plan, sim.traces)
    diffs = []
    for t in results["tokens"]:
        if "final" not in t:
            continue
        trace = sim.traces[t["token"]]
        t["simulator_max_abs_diff"] = float(
            np.max(np.abs(np.asarray(t["final"], dtype=np.float64) - trace.final))
        )
        diffs.append(t["simulator_max_abs_diff"])
        if t["simulator_max_abs_diff"] == 0:
            keep = ("test_accuracy", "test_loss", "estimate", "truth", "error")
            t.update({k: v for k, v in ref[t["token"]].items() if k in keep})
        elif plan.kind == "sgd":  # a re-routed walk: its model is still a model to test
            mine = walk_outcomes(
                cfg, plan, [dataclasses.replace(trace, final=np.asarray(t["final"], dtype=float))]
            )[0]
            t.update(test_accuracy=mine["test_accuracy"], test_loss=mine["test_loss"])
    return max(diffs) if diffs else None


def token_quality(t: dict) -> str:
    """What a finished token is worth: test accuracy and loss, or its error."""
    if "test_accuracy" in t:
        acc = "-" if t["test_accuracy"] is None else f"{t['test_accuracy']:.4f}"
        return f"test acc {acc}, test loss {fmt(t['test_loss'])}"
    if "error" in t:
        est = np.array2string(np.asarray(t["estimate"]), precision=3)
        if "truth" not in t:
            return f"estimate {est}, |estimate - truth| = {fmt(t['error'])}"
        truth = np.array2string(np.asarray(t["truth"]), precision=3)
        return f"estimate {est}, truth {truth}, |estimate - truth| = {fmt(t['error'])}"
    return "-"


def print_summary(summary: dict, audit: dict | None) -> None:
    res = summary["results"]
    rows = []
    for t in res["tokens"]:
        e = t["end"]
        where = f"{e['how']} at node {e['at']}, step {e['step']}"
        rows.append([str(t["token"]), where, token_quality(t)])
    print()
    print(table(["token", "walk", "result"], rows))
    fin = [r for r in res["nodes"] if r["finished"]]
    lost = [r["node"] for r in res["nodes"] if not r["finished"]]
    rer = sum(len(r["reroutes"]) for r in fin)
    print(
        f"{res['hops']} hops per token; {len(fin)}/{len(res['nodes'])} nodes finished"
        + (f" (no result from {lost})" if lost else "")
        + f"; {rer} re-route(s); total bytes sent {sum(r['bytes_sent'] for r in fin)}; "
        f"wall time {summary['wall_s']:.2f}s"
    )
    gossip.print_footer(summary, audit)


def simulation(cfg, r) -> dict:
    """``cfree simulate --json`` of a token protocol, from the simulator's result."""
    return {
        "protocol": cfg.protocol.name,
        "n": r.plan.n,
        "hops": r.plan.hops,
        "tokens": walk_outcomes(cfg, r.plan, r.traces),
    }


def print_simulation(out: dict) -> None:
    print(f"{out['protocol']}: n={out['n']}, {out['hops']} hops per token")
    rows = [
        [str(t["token"]), str(t["contributions"]), str(t["end"]["at"]), token_quality(t)]
        for t in out["tokens"]
    ]
    print(table(["token", "contributions", "ends at", "result"], rows))
    for line in reference_lines(out.get("reference")):
        print(line)
