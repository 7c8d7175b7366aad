"""Muffliato private gossip averaging: local Gaussian noise, then synchronous gossip (optionally
Chebyshev-accelerated)."""

from __future__ import annotations

from coordinator_free.families.base import Family


class Averaging(Family):
    name = "averaging"
    protocols = ("muffliato",)

    def make_plan(self, cfg):
        from coordinator_free.families.averaging.protocol import make_plan

        return make_plan(cfg)

    def node_engine(self, cfg, plan, node, streams):
        from coordinator_free.families.averaging.node import engine

        return engine(cfg, plan, node, streams)

    def simulate(self, cfg, plan=None, streams=None, **opts):
        from coordinator_free.families.averaging.simulate import simulate

        return simulate(cfg, plan, streams, **opts)


FAMILY = Averaging()
