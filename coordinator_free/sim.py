"""In-process reference simulator: the node programs the peers run, driven in lockstep.

A fault-free networked run of a config and ``simulate`` of the same config produce the same final
values bit for bit: each family's simulation runs its node program
(``families/<family>/node.py``) under the lockstep driver
(:mod:`coordinator_free.engine.lockstep`), the same program a peer's step engine runs, on
values drawn from the same seed streams. The family is found by the registry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from coordinator_free import seeds
from coordinator_free.engine.lockstep import LearningSimResult, SimResult, WalkSimResult
from coordinator_free.families import family_of
from coordinator_free.families.averaging import protocol as mf  # noqa: F401 (sim.mf: the math)

if TYPE_CHECKING:
    from coordinator_free.config import Config

__all__ = [
    "LearningSimResult",
    "SimResult",
    "WalkSimResult",
    "simulate",
    "simulate_learning",
    "simulate_walk",
]


def simulate(cfg: Config, plan=None, streams: seeds.Streams | None = None, *, used=None):
    """Simulate a fault-free gossip run. ``streams``: where values and noise come from; by
    default the public run seed (pure simulation), or a run's node streams to reproduce that run
    exactly (:func:`seeds.streams_of_run`).

    ``used(t, v) -> bool`` (randomized gossip only): whether node v averaged with its partner's
    value at exchange t; replaying a realised schedule from the logs with it reproduces a faulty
    run's values (default: every exchange completed)."""
    opts = {} if used is None else {"used": used}
    return family_of(cfg.protocol.name).simulate_as_peers(cfg, plan, streams, **opts)


def simulate_learning(
    cfg: Config, streams: seeds.Streams | None = None, *, keep_correlated: bool = False
) -> LearningSimResult:
    """Run a learning protocol in one process with the peers' exact update order (each node's
    local step, then K gossip steps), so a fault-free networked run gives bit-identical models
    (given the same streams). ``keep_correlated`` (decor): also return every node's correlated
    term per round."""
    opts = {"keep_correlated": True} if keep_correlated else {}
    return family_of(cfg.protocol.name).simulate_as_peers(cfg, None, streams, **opts)


def simulate_walk(cfg: Config, streams: seeds.Streams | None = None) -> WalkSimResult:
    """Run every token of a token protocol to its end in one process, fault-free."""
    return family_of(cfg.protocol.name).simulate_as_peers(cfg, None, streams)
