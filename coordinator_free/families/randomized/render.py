"""What the CLI prints for the randomized gossip."""

from __future__ import annotations


def banner(cfg, plan) -> str:
    pace = f"{plan.tick:g} s per clock unit" if plan.tick else "as fast as the network allows"
    return (
        f"starting {plan.n} peers: randomized-gossip on {cfg.graph.kind}, {plan.steps} "
        f"pairwise exchanges on Poisson clocks ({pace}), sigma={plan.sigma}"
    )
