"""Decentralized ADMM in one process: every token's hop loop to its end, fault-free, with the
peers' exact step math and hop draws (bit-identical to a fault-free networked run given the
same streams)."""

from __future__ import annotations

from coordinator_free import seeds
from coordinator_free.engine.lockstep import WalkSimResult
from coordinator_free.families.admm import protocol as ap


def simulate(cfg, plan=None, streams=None) -> WalkSimResult:
    plan = plan if plan is not None else ap.make_plan(cfg)
    streams = streams if streams is not None else seeds.PublicSeedStreams(cfg.run.seed)
    return WalkSimResult(
        plan=plan, traces=[ap.walk_token(plan, cfg, j, streams) for j in range(plan.tokens)]
    )
