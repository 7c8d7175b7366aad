"""The node program of decentralized ADMM: the token engine
(:class:`~coordinator_free.engine.token.TokenEngine`) following ADMM's hop loop
(:func:`~coordinator_free.families.admm.protocol.hops`) while the token stays here. The engine
keeps the per-token state the hop loop hands it (this user's :class:`~.protocol.Block`: its
contributions and its dual block u_i) across the token's visits."""

from __future__ import annotations

from coordinator_free.engine.token import TokenEngine, TokenRules
from coordinator_free.families.admm import protocol as ap
from coordinator_free.families.walk import protocol as wk

#: ADMM's rules for the token engine (the walk's hand-off and re-route draw).
RULES = TokenRules(
    initial_token=ap.initial_token, hops=ap.hops, next_hop=wk.next_hop, step_values=True
)


def engine(cfg, plan, node: int, streams) -> TokenEngine:
    return TokenEngine(plan, cfg, node, streams, cfg.network.deadline_s, cfg.log.values, RULES)
