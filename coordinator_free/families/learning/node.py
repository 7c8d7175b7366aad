"""The node program of private learning over gossip: every round a local noisy step, then K
gossip steps (:func:`~coordinator_free.families.averaging.node.gossip`, the same loop as
averaging). DECOR plugs its correlated noise in through ``corr``."""

from __future__ import annotations

from coordinator_free.engine.step import Outcome, StepEngine, engine_for
from coordinator_free.families.averaging.node import gossip
from coordinator_free.families.learning import protocol as lp
from coordinator_free.families.learning import secret


def rounds(ctx, plan, task, node: int, streams, corr=None):
    """The round loop (a generator): returns an :class:`Outcome` with the node's model after
    every round. ``corr`` (DECOR): ``term(r)`` is the round's correlated noise, ``after_round(r,
    ctx)`` its pair bookkeeping."""
    theta = task.model.init()
    models = [theta]
    K = plan.gossip_steps
    for r in range(plan.rounds):
        if plan.secret:  # the node's own neighbours of the round, for the auditor
            ctx.out.log(secret.RECORD, round=r, peers=plan.partners_at(node, r * K))
        term = corr.term(r) if corr is not None else None
        thetahat = lp.local_step(plan, task, node, r, theta, streams, term)
        theta = yield from gossip(ctx, plan, node, r * K, K, thetahat)
        if corr is not None:
            corr.after_round(r, ctx)
        models.append(theta)
    return Outcome(theta, models)


def program(cfg, plan, node: int, streams):
    def run(ctx):
        task = lp.make_task(cfg, plan.n)
        return (yield from rounds(ctx, plan, task, node, streams))

    return run


def step_engine(cfg, plan, node: int, program) -> StepEngine:
    """The step engine of a learning node (decentralized protocols)."""
    return engine_for(cfg, plan, node, program)


def engine(cfg, plan, node: int, streams) -> StepEngine:
    if plan.secret and plan.bound_node is None:
        plan = secret.bind_node(plan, node, streams)  # its own neighbours, from its secrets
    return step_engine(cfg, plan, node, program(cfg, plan, node, streams))
