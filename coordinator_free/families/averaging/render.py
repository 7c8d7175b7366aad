"""What the CLI prints for the gossip averaging."""

from __future__ import annotations


def banner(cfg, plan) -> str:
    acc = " (Chebyshev)" if plan.accelerated else ""
    return (
        f"starting {plan.n} peers: {cfg.protocol.name} on {cfg.graph.kind}, "
        f"{plan.steps} steps{acc}, sigma={plan.sigma}"
    )
