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


FAMILY = Averaging()
