"""The node program of Muffliato averaging: x^0 = x + noise, then T synchronous gossip steps.

:func:`gossip` is the one gossip round loop of the package: the averaging program, the learning
program (K steps per round) and the simulator all run it.
"""

from __future__ import annotations

import numpy as np

from coordinator_free.engine.step import Exchange, Outcome, StepEngine, engine_for
from coordinator_free.families.averaging import protocol as mf


def gossip(ctx, plan, node: int, t0: int, count: int, current: np.ndarray):
    """``count`` synchronous gossip steps from global step ``t0`` (a generator: yields one
    :class:`Exchange` per step, returns the node's value after the last)."""
    previous: np.ndarray | None = None
    # The weights change at most from one round to the next (time-varying graphs), never
    # within the steps of one call.
    items = sorted(plan.row_at(node, t0).items())  # the step_terms order, made once
    for t in range(t0, t0 + count):
        got = yield Exchange(t, current)
        terms = mf.ordered_terms(items, node, current, got)
        nxt = mf.gossip_update(terms, plan.gamma_at(t), previous)
        previous, current = current, nxt
        ctx.out.progress(("after step", t + 1), event="step", node=node, step=t + 1, of=plan.steps)
    return current


def start_value(cfg, node: int, streams) -> np.ndarray:
    """x_v^0: the private value plus the node's own noise (the raw input is never kept)."""
    x = mf.private_value(cfg, node, streams)
    return mf.initial_value(x, mf.local_noise(cfg, node, streams))


def program(cfg, plan, node: int, streams):
    """The averaging node program (see :mod:`coordinator_free.engine.step`)."""

    def run(ctx):
        current = yield from gossip(ctx, plan, node, 0, plan.steps, start_value(cfg, node, streams))
        return Outcome(current)

    return run


def engine(cfg, plan, node: int, streams) -> StepEngine:
    return engine_for(cfg, plan, node, program(cfg, plan, node, streams))
