"""Protocols: each module holds the pure update math shared by the peers and the simulator."""

from __future__ import annotations

from ..config import Config


def make_plan(cfg: Config):
    """The public plan of a run: a MuffliatoPlan or RandomizedPlan (averaging), a LearningPlan
    (learning) or a WalkPlan (token forwarding)."""
    if cfg.walk:
        from .walk import make_plan as walk_plan

        return walk_plan(cfg)
    if cfg.learning:
        from .learning import make_plan as learning_plan

        return learning_plan(cfg)
    if cfg.protocol.name == "randomized-gossip":
        from .randomized import make_plan as randomized_plan

        return randomized_plan(cfg)
    from .muffliato import make_plan as averaging_plan

    return averaging_plan(cfg)
