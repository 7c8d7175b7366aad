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


FAMILY = Decor()
