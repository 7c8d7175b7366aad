"""Learning in one process with the peers' exact update order: the node programs (local step,
then K gossip steps) in lockstep, so a fault-free networked run gives bit-identical models
(given the same streams). The central-DP curator is one model, no nodes."""

from __future__ import annotations

import numpy as np

from coordinator_free import seeds
from coordinator_free.engine.lockstep import LearningSimResult, lockstep
from coordinator_free.engine.step import NullContext
from coordinator_free.families.learning import node, secret
from coordinator_free.families.learning import protocol as lp


def simulate(cfg, plan=None, streams=None, *, corr_of=None, kept=None) -> LearningSimResult:
    """``corr_of(v)``: node v's correlated-noise source (DECOR); ``kept``: a list that receives
    (round, node, term) of every correlated term, when the caller wants them."""
    plan = plan if plan is not None else lp.make_plan(cfg)
    task = lp.make_task(cfg, plan.n)
    streams = streams if streams is not None else seeds.PublicSeedStreams(cfg.run.seed)
    if not plan.decentralized:
        theta = task.model.init()
        history = [theta[None, :]]
        for r in range(plan.rounds):
            theta = lp.central_step(plan, task, r, theta, streams)
            history.append(theta[None, :])
        models = np.stack(history)
    else:
        n = plan.n
        if plan.secret and not plan.round_graphs:
            plan = secret.bind_all(plan, streams)  # every node's secrets: every graph

        def program(v):
            corr = corr_of(v) if corr_of is not None else None
            return node.rounds(NullContext(v), plan, task, v, streams, corr)

        # A node's partners change at most from one round to the next: look them up once a
        # round.
        K = plan.gossip_steps
        memo: dict[tuple[int, int], list[int]] = {}

        def partners_at(v: int, t: int) -> list[int]:
            key = (v, t // K)
            if key not in memo:
                memo[key] = plan.partners_at(v, t)
            return memo[key]

        outcomes = lockstep({v: program(v) for v in range(n)}, partners_at)
        models = np.stack(
            [np.stack([outcomes[v].models[r] for v in range(n)]) for r in range(plan.rounds + 1)]
        )
    metrics = [lp.round_metrics(task, r, models[r]) for r in range(models.shape[0])]
    correlated = None
    if kept:
        correlated = np.zeros((plan.rounds, plan.n, plan.dim))
        for r, v, term in kept:
            correlated[r, v] = term
    return LearningSimResult(plan=plan, models=models, metrics=metrics, correlated=correlated)
