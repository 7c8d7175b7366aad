"""Token forwarding: ring and complete-graph algorithms (sums, histograms, DP-SGD) and
random-walk DP-SGD on any graph."""

from __future__ import annotations

from coordinator_free.families.base import Family

#: The token protocols whose token is a model.
MODEL_TOKENS = ("complete-sgd", "walk-sgd")


class Walk(Family):
    name = "walk"
    protocols = (
        "ring-sum",
        "ring-histogram",
        "complete-sum",
        "complete-histogram",
        "complete-sgd",
        "walk-sgd",
    )

    def walks(self, cfg) -> bool:
        return True

    def sensitivity(self, cfg) -> float:
        return 2.0 * cfg.protocol.clip if cfg.protocol.name in MODEL_TOKENS else 1.0

    def make_plan(self, cfg):
        from coordinator_free.families.walk.protocol import make_plan

        return make_plan(cfg)

    # -------------------------------------------------------------- rendering (CLI output)

    def print_plan(self, rep: dict) -> None:
        from coordinator_free.families.walk import render

        render.print_plan(rep)

    def print_audit(self, rep: dict) -> None:
        from coordinator_free.families.averaging import render

        render.print_audit(rep)

    def print_audit_compact(self, audit: dict) -> None:
        from coordinator_free.families.averaging import render

        render.print_audit_compact(audit)

    def print_calibration(self, rep: dict) -> None:
        from coordinator_free.families.walk import render

        render.print_calibration(rep)

    def print_summary(self, summary: dict, audit: dict | None) -> None:
        from coordinator_free.families.walk import render

        render.print_summary(summary, audit)

    def run_banner(self, cfg, plan) -> str:
        from coordinator_free.families.walk import render

        return render.run_banner(cfg, plan)

    def simulator_diff(self, cfg, plan, run_dir, results: dict, streams) -> float | None:
        from coordinator_free.families.walk import render

        return render.simulator_diff(cfg, plan, run_dir, results, streams)

    def simulation(self, cfg, streams) -> dict:
        from coordinator_free.families.walk import render

        return render.simulation(cfg, streams)

    def print_simulation(self, out: dict) -> None:
        from coordinator_free.families.walk import render

        render.print_simulation(out)


FAMILY = Walk()
