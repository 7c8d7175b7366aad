"""Private learning over gossip: Muffliato-GD/SGD, D-SGD with local DP, and the central-DP
curator baseline (no peers)."""

from __future__ import annotations

from coordinator_free.families import catalog
from coordinator_free.families.averaging import Gossip
from coordinator_free.families.base import Family


class Learning(Gossip, Family):
    name = "learning"
    protocols = catalog.LEARNING

    def validate(self, cfg, source):
        from coordinator_free.families.learning.validate import validate_learning

        validate_learning(cfg, source)

    def learns(self, cfg) -> bool:
        return True

    def has_peers(self, cfg) -> bool:
        return cfg.protocol.name != "central-dp"

    def sensitivity(self, cfg) -> float:
        # One node's whole shard replaced: two clipped mean gradients differ by at most 2C.
        return 2.0 * cfg.protocol.clip

    def banner(self, cfg, plan):
        from coordinator_free.families.learning.render import banner

        return banner(cfg, plan)

    def make_plan(self, cfg):
        from coordinator_free.families.learning.protocol import make_plan

        return make_plan(cfg)

    def node_engine(self, cfg, plan, node, streams):
        from coordinator_free.families.learning.node import engine

        return engine(cfg, plan, node, streams)

    def simulate(self, cfg, plan=None, streams=None, *, keep_correlated=False, **opts):
        # keep_correlated: no correlated noise here, nothing to keep.
        from coordinator_free.families.learning.simulate import simulate

        return simulate(cfg, plan, streams, **opts)

    # -------------------------------------------------------------- rendering (CLI output)

    def print_plan(self, rep: dict) -> None:
        from coordinator_free.families.learning import render

        render.print_plan(rep)

    def print_summary(self, summary: dict, audit: dict | None) -> None:
        from coordinator_free.families.learning import render

        render.print_summary(summary, audit)

    def simulator_diff(self, cfg, plan, run_dir, results: dict, streams) -> float | None:
        from coordinator_free.families.learning import render

        return render.simulator_diff(
            cfg, plan, run_dir, results, lambda: self.simulate(cfg, None, streams)
        )

    def simulation(self, cfg, streams) -> dict:
        from coordinator_free.families.learning import render

        return render.simulation(cfg, self.simulate(cfg, None, streams))

    def print_simulation(self, out: dict) -> None:
        from coordinator_free.families.learning import render

        render.print_simulation(out)


FAMILY = Learning()
