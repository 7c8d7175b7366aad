"""The node program of the token protocols: the hand-off engine
(:class:`~coordinator_free.engine.token.TokenEngine`) following the walk's hop loop
(:func:`~coordinator_free.families.walk.protocol.hops`) while the token stays here."""

from __future__ import annotations

from coordinator_free.engine.token import TokenEngine


def engine(cfg, plan, node: int, streams) -> TokenEngine:
    return TokenEngine(plan, cfg, node, streams, cfg.network.deadline_s, cfg.log.values)
