"""DECOR: D-SGD with pairwise-cancelling correlated noise from X25519 seeds per edge."""

from __future__ import annotations

from coordinator_free.families.base import Family


class Decor(Family):
    name = "decor"
    protocols = ("decor",)

    def learns(self, cfg) -> bool:
        return True

    def sensitivity(self, cfg) -> float:
        return 2.0 * cfg.protocol.clip

    def make_plan(self, cfg):
        from coordinator_free.families.learning.protocol import make_plan

        return make_plan(cfg)

    def node_engine(self, cfg, plan, node, streams):
        from coordinator_free.families.decor.node import engine

        return engine(cfg, plan, node, streams)

    def simulate(self, cfg, plan=None, streams=None, **opts):
        from coordinator_free.families.decor.simulate import simulate

        return simulate(cfg, plan, streams, **opts)


FAMILY = Decor()
