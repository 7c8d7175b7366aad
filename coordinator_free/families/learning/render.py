"""What the CLI prints for private learning over gossip (and the curator baseline): the plan's
round schedule, the per-node and per-round model quality, the simulator comparison of models."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from coordinator_free.accounting import baseline
from coordinator_free.accounting.render import fmt, table
from coordinator_free.families.averaging import render as gossip
from coordinator_free.ml.reference import lines as reference_lines
from coordinator_free.rundir import models_path


def rounds_line(rep: dict) -> None:
    if "rounds" in rep:
        print(
            f"protocol={rep['protocol']}  rounds={rep['rounds']}  gossip steps per round="
            f"{rep['gossip_steps']}  sigma={rep['sigma']:g}  sensitivity={rep['sensitivity']:g}"
        )


def print_plan(rep: dict) -> None:
    gossip.print_gossip_plan(rep, detail=rounds_line)


def banner(cfg, plan) -> str:
    acc = " (Chebyshev)" if plan.accelerated else ""
    head = f"{cfg.protocol.name}: {plan.model} model ({plan.dim} parameters) on {cfg.data.kind}"
    if not plan.decentralized:
        return (
            f"{head}, trusted curator over {plan.n} users, {plan.rounds} rounds, sigma={plan.sigma}"
        )
    return (
        f"starting {plan.n} peers: {head} on {cfg.graph.kind}, {plan.rounds} rounds x "
        f"{plan.gossip_steps} gossip steps{acc}, step size {plan.step_size}, clip {plan.clip}, "
        f"sigma={plan.sigma}"
        + (f" ({baseline.NO_PRIVACY.replace('gossip', 'D-GD')})" if plan.sigma == 0 else "")
    )


def print_learning_summary(summary: dict) -> None:
    """Per-node test quality (when there are peers), then the node-average model by round."""
    res = summary["results"]
    metrics = res["metrics"]
    if res["nodes"]:
        rows = []
        for r in res["nodes"]:
            if not r["finished"]:
                rows.append([str(r["node"]), "-", "-", "-", "-", "did not finish"])
                continue
            acc = "-" if r["test_accuracy"] is None else f"{r['test_accuracy']:.4f}"
            rows.append(
                [str(r["node"]), acc, fmt(r["test_loss"]), f"{r['steps_per_s']:.1f}",
                 str(r["bytes_sent"]), str(r["missed"])]
            )  # fmt: skip
        print()
        print(table(["node", "test acc", "test loss", "steps/s", "bytes sent", "missed"], rows))
    if metrics:
        every = max(1, (len(metrics) - 1) // 10)
        shown = [m for m in metrics if m["round"] % every == 0 or m is metrics[-1]]
        rows = [
            [str(m["round"]),
             "-" if m["avg_test_accuracy"] is None else f"{m['avg_test_accuracy']:.4f}",
             fmt(m["avg_test_loss"]), fmt(m["avg_train_loss"]),
             "-" if m["node_test_accuracy_min"] is None
             else f"{m['node_test_accuracy_min']:.3f}..{m['node_test_accuracy_max']:.3f}",
             fmt(m["consensus_distance"])]
            for m in shown
        ]  # fmt: skip
        print("\nnode-average model by round (metrics.jsonl has every round):")
        print(
            table(
                ["round", "test acc", "test loss", "train loss", "node acc range", "consensus"],
                rows,
            )
        )
        print(
            "consensus: the consensus distance, mean squared distance of the nodes' models to "
            "their average (consensus_distance in metrics.jsonl)"
        )


def print_summary(summary: dict, audit: dict | None) -> None:
    print_learning_summary(summary)
    gossip.print_footer(summary, audit)


def simulator_diff(cfg, plan, run_dir: Path, results: dict, simulate) -> float | None:
    """max |peer model - simulator model| over every round of the nodes that finished;
    ``simulate()`` runs the family's simulator with the run's streams (only when needed)."""
    finished = [r for r in results["nodes"] if r["finished"]]
    if not finished:
        return None
    sim_models = simulate().models  # (R+1, n, dim)
    return max(
        float(np.max(np.abs(np.load(models_path(run_dir, r["node"])) - sim_models[:, r["node"]])))
        for r in finished
    )


def simulation(cfg, r) -> dict:
    """``cfree simulate --json`` of a learning protocol, from the simulator's result."""
    return {
        "protocol": cfg.protocol.name,
        "n": r.plan.n,
        "rounds": r.plan.rounds,
        "gossip_steps": r.plan.gossip_steps,
        "model": r.plan.model,
        "dim": r.plan.dim,
        "metrics": r.metrics,
        "finals": r.finals.tolist(),
    }


def print_simulation(out: dict) -> None:
    print(
        f"{out['protocol']}: n={out['n']} rounds={out['rounds']} K={out['gossip_steps']} "
        f"model={out['model']} ({out['dim']} parameters)"
    )
    print_learning_summary({"results": {"nodes": [], "metrics": out["metrics"]}})
    for line in reference_lines(out.get("reference")):
        print(line)
