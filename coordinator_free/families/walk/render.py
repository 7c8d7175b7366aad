"""What the CLI prints for the token protocols."""

from __future__ import annotations


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
