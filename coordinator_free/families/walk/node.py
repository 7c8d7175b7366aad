"""The node program of the token protocols: the hand-off engine
(:class:`~coordinator_free.engine.token.TokenEngine`) following the walk's hop loop
(:func:`~coordinator_free.families.walk.protocol.hops`) while the token stays here: the walk
hands the engine its rules, the engine knows no family."""

from __future__ import annotations

from coordinator_free.engine.token import TokenEngine, TokenRules
from coordinator_free.families.walk import protocol as wk

#: The walk's rules for the token engine.
RULES = TokenRules(initial_token=wk.initial_token, hops=wk.hops, next_hop=wk.next_hop)


def engine(cfg, plan, node: int, streams) -> TokenEngine:
    return TokenEngine(plan, cfg, node, streams, cfg.network.deadline_s, cfg.log.values, RULES)
