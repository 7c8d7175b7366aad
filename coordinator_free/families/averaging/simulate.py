"""Averaging in one process: the node programs in lockstep (the reference simulator)."""

from __future__ import annotations

import numpy as np

from coordinator_free import seeds
from coordinator_free.engine.lockstep import SimResult, lockstep
from coordinator_free.engine.step import NullContext
from coordinator_free.families.averaging import protocol as mf


def run_programs(cfg, plan, streams, program_of, history_of, partners_at=None) -> SimResult:
    """Run ``program_of(v)`` of every node in lockstep; ``history_of(true_mean)`` gives the
    on_step callback filling the error history."""
    n = plan.n
    inputs = np.stack([mf.private_value(cfg, v, streams) for v in range(n)])
    history, on_step = history_of(inputs.mean(axis=0), n)
    programs = {v: program_of(v)(NullContext(v)) for v in range(n)}
    outcomes = lockstep(programs, partners_at or plan.partners_at, on_step)
    finals = np.stack([outcomes[v].estimate for v in range(n)])
    return SimResult(plan=plan, inputs=inputs, finals=finals, history_mse=history)


def _sync_history(true_mean, n):
    history: list[float] = []

    def on_step(t, nodes, current):
        sq = [float(np.sum((current[v] - true_mean) ** 2)) for v in range(n)]
        history.append(float(np.mean(sq)))

    return history, on_step


def simulate(cfg, plan=None, streams=None, *, used=None) -> SimResult:
    from coordinator_free.families.averaging import node

    if used is not None:
        raise ValueError("used= replays a randomized-gossip schedule; this plan is synchronous")
    plan = plan if plan is not None else mf.make_plan(cfg)
    streams = streams if streams is not None else seeds.PublicSeedStreams(cfg.run.seed)
    # Synchronous gossip: every neighbour at every step (looked up once, not every step).
    nbrs = [plan.neighbours(v) for v in range(plan.n)]
    return run_programs(
        cfg,
        plan,
        streams,
        lambda v: node.program(cfg, plan, v, streams),
        _sync_history,
        plan.partners_at if plan.dropped else (lambda v, t: nbrs[v]),
    )
