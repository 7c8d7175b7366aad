"""Randomized (asynchronous pairwise) gossip on Poisson clocks."""

from __future__ import annotations

from coordinator_free.families.averaging import GossipAccounting
from coordinator_free.families.base import Family


class Randomized(GossipAccounting, Family):
    name = "randomized"
    protocols = ("randomized-gossip",)

    def make_plan(self, cfg):
        from coordinator_free.families.randomized.protocol import make_plan

        return make_plan(cfg)


FAMILY = Randomized()
