"""Run a config's protocol on the in-memory network (:mod:`coordinator_free.engine.memnet`):
the family's node engines, one per node, found by the registry. It lives above ``engine/``,
which knows no family."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from coordinator_free.engine.events import Engine
from coordinator_free.engine.memnet import Faults, MemNet, MemRun, node_streams
from coordinator_free.families import family_of


def run_config(
    cfg,
    faults: Faults | None = None,
    *,
    seed: int = 0,
    max_time: float = 1e7,
    engine_of: Callable[[Any, Any, int, Any], Engine] | None = None,
    net_seed: int | None = None,
) -> MemRun:
    """Run ``cfg``'s protocol on the in-memory network: the family's node engines, one per
    node, with ``faults``. ``seed`` seeds the nodes' streams and, unless ``net_seed`` is
    given, the network's draws (delays, losses); ``net_seed`` varies the timing alone."""
    family = family_of(cfg.protocol.name)
    plan = family.make_plan(cfg)
    streams = node_streams(seed, plan.n, cfg)
    if faults is None and cfg.faults.inject:
        faults = Faults.of_config(cfg)
    make = engine_of or family.node_engine
    engines = {v: make(cfg, plan, v, streams.node(v)) for v in range(plan.n)}
    net = MemNet(
        engines,
        {v: plan.neighbours(v) for v in range(plan.n)},
        faults,
        seed=seed if net_seed is None else net_seed,
        max_time=max_time,
    )
    run = net.run()
    run.streams = streams
    return run
