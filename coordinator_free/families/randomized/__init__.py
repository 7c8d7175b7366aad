"""Randomized (asynchronous pairwise) gossip on Poisson clocks."""

from __future__ import annotations

from coordinator_free.families import catalog
from coordinator_free.families.averaging import Gossip
from coordinator_free.families.base import Family


class Randomized(Gossip, Family):
    name = "randomized"
    protocols = catalog.RANDOMIZED

    def views(self):
        from coordinator_free.families.randomized.accountant import VIEWS

        return VIEWS

    clocks = True

    def yardstick(self, cfg, plan, summary):
        from coordinator_free import yardstick

        return yardstick.averaging(plan, summary["results"])

    def validate(self, cfg, source):
        from coordinator_free.families.averaging.validate import validate_values

        validate_values(cfg, source)

    def banner(self, cfg, plan):
        from coordinator_free.families.randomized.render import banner

        return banner(cfg, plan)

    def make_plan(self, cfg):
        from coordinator_free.families.randomized.protocol import make_plan

        return make_plan(cfg)

    def coalition_plan(self, cfg, plan, observers):
        from coordinator_free.families.randomized import coalition

        return coalition.plan_report(cfg, plan, observers)

    def coalition_audit(self, run_dir, cfg, plan, observers):
        from coordinator_free.families.randomized import coalition

        return coalition.audit_report(run_dir, cfg, plan, observers)

    def node_engine(self, cfg, plan, node, streams):
        from coordinator_free.families.randomized.node import engine

        return engine(cfg, plan, node, streams)

    def simulate(self, cfg, plan=None, streams=None, **opts):
        from coordinator_free.families.randomized.simulate import simulate

        return simulate(cfg, plan, streams, **opts)

    # -------------------------------------------------------------- rendering (CLI output)

    render_from = {"print_plan": "coordinator_free.families.randomized.render"}


FAMILY = Randomized()
