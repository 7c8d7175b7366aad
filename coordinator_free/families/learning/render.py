"""What the CLI prints for the learning protocols (DECOR included)."""

from __future__ import annotations


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
    )
