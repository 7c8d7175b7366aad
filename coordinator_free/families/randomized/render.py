"""What the CLI prints for randomized gossip: the gossip rendering with its Poisson-clock lines."""

from __future__ import annotations

from coordinator_free.accounting.render import fmt
from coordinator_free.families.averaging import render as gossip


def _exchanges_line(rep: dict) -> None:
    if "exchanges_per_node" in rep:
        x = rep["exchanges_per_node"]
        print(
            f"protocol={rep['protocol']}  clock rate={rep['clock_rate']:.4g} exchanges per clock "
            f"unit  exchanges per node: min {x['min']}, mean {x['mean']:.1f}, max {x['max']}  "
            f"Corollary 2 mean bound: factor <= {fmt(rep['cor2_mean_factor_max'])}"
        )


def print_plan(rep: dict) -> None:
    gossip.print_gossip_plan(rep, detail=_exchanges_line)


def banner(cfg, plan) -> str:
    pace = f"{plan.tick:g} s per clock unit" if plan.tick else "as fast as the network allows"
    return (
        f"starting {plan.n} peers: randomized-gossip on {cfg.graph.kind}, {plan.steps} "
        f"pairwise exchanges on Poisson clocks ({pace}), sigma={plan.sigma}"
    )
