"""Randomized (asynchronous pairwise) gossip on Poisson clocks."""

from __future__ import annotations

from coordinator_free.families import catalog
from coordinator_free.families.averaging import GossipAccounting
from coordinator_free.families.base import Family


class Randomized(GossipAccounting, Family):
    name = "randomized"
    protocols = catalog.RANDOMIZED

    clocks = True

    def validate(self, cfg, source):
        from coordinator_free.families.averaging.validate import validate_values

        validate_values(cfg, source)

    def banner(self, cfg, plan):
        from coordinator_free.families.randomized.render import banner

        return banner(cfg, plan)

    def make_plan(self, cfg):
        from coordinator_free.families.randomized.protocol import make_plan

        return make_plan(cfg)

    def node_engine(self, cfg, plan, node, streams):
        from coordinator_free.families.randomized.node import engine

        return engine(cfg, plan, node, streams)

    def simulate(self, cfg, plan=None, streams=None, **opts):
        from coordinator_free.families.randomized.simulate import simulate

        return simulate(cfg, plan, streams, **opts)

    # -------------------------------------------------------------- rendering (CLI output)

    def print_plan(self, rep: dict) -> None:
        from coordinator_free.families.randomized import render

        render.print_plan(rep)

    def print_audit(self, rep: dict) -> None:
        from coordinator_free.families.averaging import render

        render.print_audit(rep)

    def print_audit_compact(self, audit: dict) -> None:
        from coordinator_free.families.averaging import render

        render.print_audit_compact(audit)

    def print_calibration(self, rep: dict) -> None:
        from coordinator_free.families.averaging import render

        render.print_calibration(rep)

    def print_summary(self, summary: dict, audit: dict | None) -> None:
        from coordinator_free.families.averaging import render

        render.print_summary(summary, audit)

    def simulator_diff(self, cfg, plan, run_dir, results: dict, streams) -> float | None:
        from coordinator_free.families.averaging import render

        return render.simulator_diff(
            cfg, plan, run_dir, results, lambda: self.simulate(cfg, None, streams)
        )

    def simulation(self, cfg, streams) -> dict:
        from coordinator_free.families.averaging import render

        return render.simulation(cfg, self.simulate(cfg, None, streams))

    def print_simulation(self, out: dict) -> None:
        from coordinator_free.families.averaging import render

        render.print_simulation(out)


FAMILY = Randomized()
