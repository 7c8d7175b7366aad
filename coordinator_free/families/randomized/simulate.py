"""Randomized gossip in one process: the node programs in lockstep, one exchange at a time in
clock order (only the pair's values change)."""

from __future__ import annotations

import numpy as np

from coordinator_free import seeds
from coordinator_free.engine.lockstep import SimResult
from coordinator_free.families.averaging.simulate import run_programs


def _pair_history(true_mean, n):
    history: list[float] = []
    sq: list[float] = []

    def on_step(t, nodes, current):
        if t < 0:
            sq.extend(float(np.sum((current[v] - true_mean) ** 2)) for v in range(n))
        else:
            for v in nodes:
                sq[v] = float(np.sum((current[v] - true_mean) ** 2))
        history.append(float(np.mean(sq)))

    return history, on_step


def simulate(cfg, plan=None, streams=None, *, used=None) -> SimResult:
    """``used(t, v) -> bool``: whether node v averaged with its partner's value at exchange t;
    replaying a realised schedule from the logs with it reproduces a faulty run's values
    (default: every exchange completed)."""
    from coordinator_free.families.randomized import node
    from coordinator_free.families.randomized import protocol as rg

    plan = plan if plan is not None else rg.make_plan(cfg)
    streams = streams if streams is not None else seeds.PublicSeedStreams(cfg.run.seed)
    return run_programs(
        cfg, plan, streams, lambda v: node.program(cfg, plan, v, streams, used), _pair_history
    )
