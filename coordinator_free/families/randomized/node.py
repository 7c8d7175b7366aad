"""The node program of randomized gossip: this node's exchanges in clock order, each at its clock
time (``tick`` seconds per clock unit after the start); a late partner is waited for (up to the
deadline), never overtaken."""

from __future__ import annotations

from coordinator_free.engine.step import Exchange, Outcome, StepEngine, WaitUntil, engine_for
from coordinator_free.families.averaging.node import start_value
from coordinator_free.families.randomized import protocol as rg


def exchanges(ctx, plan, node: int, current, used=None):
    """The exchange loop (a generator). ``used(t, v)``: the simulator's replay of a realised
    schedule (whether v averaged at exchange t); a peer averages whenever the value came."""
    for e in plan.exchanges_of(node):
        if plan.tick > 0:
            yield WaitUntil(ctx.t0 + e.time * plan.tick)
        got = yield Exchange(e.t, current)
        if used is not None and not used(e.t, node):
            got = {}
        current = rg.exchange_update(plan, node, e.t, current, got)
        partner = e.partner(node)
        ctx.out.log(
            "exchange",
            step=e.t,
            peer=partner,
            initiator=e.initiator,
            clock=e.time,
            averaged=partner in got,
        )
        # Progress in global exchange numbers: this node is done up to exchange t.
        ctx.out.progress(("at exchange", e.t), event="step", node=node, step=e.t + 1, of=plan.steps)
    ctx.out.progress(None, event="step", node=node, step=plan.steps, of=plan.steps)
    return current


def program(cfg, plan, node: int, streams, used=None):
    def run(ctx):
        current = yield from exchanges(ctx, plan, node, start_value(cfg, node, streams), used)
        return Outcome(current)

    return run


def engine(cfg, plan, node: int, streams) -> StepEngine:
    return engine_for(cfg, plan, node, program(cfg, plan, node, streams))
