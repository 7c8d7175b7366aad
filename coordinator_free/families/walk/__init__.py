"""Token forwarding: ring and complete-graph algorithms (sums, histograms, DP-SGD) and
random-walk DP-SGD on any graph."""

from __future__ import annotations

from coordinator_free.families import catalog
from coordinator_free.families.base import Family

#: The token protocols whose token is a model.
MODEL_TOKENS = ("complete-sgd", "walk-sgd")


class Walk(Family):
    name = "walk"
    protocols = catalog.WALK

    def validate(self, cfg, source):
        from coordinator_free.families.averaging.validate import refuse_resample
        from coordinator_free.families.walk.validate import validate_walk

        refuse_resample(cfg, source)
        validate_walk(cfg, source)

    def walks(self, cfg) -> bool:
        return True

    def sensitivity(self, cfg) -> float:
        return 2.0 * cfg.protocol.clip if cfg.protocol.name in MODEL_TOKENS else 1.0

    def banner(self, cfg, plan):
        from coordinator_free.families.walk.render import banner

        return banner(cfg, plan)

    def make_plan(self, cfg):
        from coordinator_free.families.walk.protocol import make_plan

        return make_plan(cfg)

    def plan_report(self, cfg, plan, *, source, method):
        from coordinator_free.families.walk import accountant

        return accountant.plan_report(cfg, plan, source=source, method=method)

    def audit(self, run_dir, cfg, plan, observers):
        from coordinator_free.families.walk import accountant

        return accountant.audit_run(run_dir, cfg, plan, observers)

    def planned_losses(
        self, cfg, plan, observers: list[int]
    ) -> dict[int, dict[tuple[int, str], dict]]:
        """Observer -> {(source, method): {factor, rdp, eps}} under the fault-free plan: the
        entries ``cfree plan --json`` reports (``exact``: the ring's public walk, or the walk
        sampled from the public run seed; ``paper``: the theorem)."""
        from coordinator_free.families.walk import accountant

        return accountant.planned_losses(cfg, plan, observers)

    def worst_case_losses(
        self, cfg, plan, observers: list[int]
    ) -> dict[int, dict[tuple[int, str], dict]]:
        """The same entries for an observer about which nothing is known: each the larger of
        the planned loss and the local-DP loss of every contribution the source makes to the
        tokens (``ldp`` of the report), what an observer that saw every token value could learn
        (accountant.worst_case_losses says why that caps every view of the walk)."""
        from coordinator_free.families.walk import accountant

        return accountant.worst_case_losses(cfg, plan, observers)

    def calibrate(self, cfg, target_eps, *, method, budget, **opts):
        from coordinator_free.families.walk import accountant

        return accountant.calibrate(cfg, target_eps, method=method, budget=budget)

    def coalition_plan(self, cfg, plan, observers):
        from coordinator_free.families.walk import coalition

        return coalition.plan_report(cfg, plan, observers)

    def coalition_audit(self, run_dir, cfg, plan, observers):
        from coordinator_free.families.walk import coalition

        return coalition.audit_report(run_dir, cfg, plan, observers)

    def node_engine(self, cfg, plan, node, streams):
        from coordinator_free.families.walk.node import engine

        return engine(cfg, plan, node, streams)

    def simulate(self, cfg, plan=None, streams=None, **opts):
        from coordinator_free.families.walk.simulate import simulate

        return simulate(cfg, plan, streams, **opts)

    def reference(self, cfg):
        # Sums and histograms carry their truth; a model-carrying walk (walk-sgd) is judged
        # against the same walks without noise, averaged over the tokens.
        if cfg.protocol.name not in MODEL_TOKENS:
            return None
        from coordinator_free.families.learning.reference import references
        from coordinator_free.families.walk.render import mean_token_quality

        return references(cfg, lambda c: mean_token_quality(c, self.simulate(c)))

    def yardstick(self, cfg, plan, summary):
        import numpy as np

        from coordinator_free import yardstick

        if cfg.protocol.name not in MODEL_TOKENS:
            return yardstick.walk(plan, summary["results"])
        done = [t for t in summary["results"].get("tokens", []) if "test_loss" in t]
        accs = [t["test_accuracy"] for t in done]
        return yardstick.learning(
            float(np.mean([t["test_loss"] for t in done])) if done else None,
            None if not done or None in accs else float(np.mean(accs)),
            summary.get("reference"),
        )

    # -------------------------------------------------------------- rendering (CLI output)

    render_module = "coordinator_free.families.walk.render"
    render_from = {"print_audit_compact": "coordinator_free.families.averaging.render"}


FAMILY = Walk()
