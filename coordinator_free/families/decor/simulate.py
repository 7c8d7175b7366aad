"""DECOR in one process: the learning node programs in lockstep, each with every pair active
(a fault-free run), each edge's noise drawn once per round and used by both ends."""

from __future__ import annotations

from coordinator_free import seeds
from coordinator_free.families.decor.node import SimulatedPairs
from coordinator_free.families.learning import protocol as lp
from coordinator_free.families.learning import simulate as learning_sim


def simulate(cfg, plan=None, streams=None, *, keep_correlated: bool = False):
    plan = plan if plan is not None else lp.make_plan(cfg)
    streams = streams if streams is not None else seeds.PublicSeedStreams(cfg.run.seed)
    kept: list | None = [] if keep_correlated else None
    pairs = SimulatedPairs(plan, streams, kept)
    return learning_sim.simulate(cfg, plan, streams, corr_of=pairs.of, kept=kept)
