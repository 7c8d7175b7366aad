"""DECOR: D-SGD with pairwise-cancelling correlated noise from X25519 seeds per edge."""

from __future__ import annotations

from coordinator_free.families import catalog
from coordinator_free.families.base import Family
from coordinator_free.families.learning import Learning


class Decor(Family):
    name = "decor"
    protocols = catalog.DECOR

    correlated_noise = True

    def validate(self, cfg, source):
        from coordinator_free.families.decor.validate import validate_decor
        from coordinator_free.families.learning.validate import validate_learning

        validate_learning(cfg, source)
        validate_decor(cfg, source)

    def learns(self, cfg) -> bool:
        return True

    # A trained model, judged as learning's are.
    reference = Learning.reference

    def sensitivity(self, cfg) -> float:
        return 2.0 * cfg.protocol.clip

    def banner(self, cfg, plan):
        from coordinator_free.families.learning.render import banner

        return banner(cfg, plan)

    def make_plan(self, cfg):
        from coordinator_free.families.learning.protocol import make_plan

        return make_plan(cfg)

    def plan_report(self, cfg, plan, *, source, method):
        from coordinator_free.families.decor import accountant

        return accountant.plan_report(cfg, plan, source=source, method=method)

    def audit(self, run_dir, cfg, plan, observers):
        from coordinator_free.families.decor import accountant

        return accountant.audit_run(run_dir, cfg, plan, observers)

    def planned_losses(
        self, cfg, plan, observers: list[int]
    ) -> dict[int, dict[tuple[int, str], dict]]:
        """Observer -> {(source, method): {factor, rdp, eps}} under the fault-free plan: the
        pairwise (curious-user) entries ``cfree plan --json`` reports, ``exact`` and ``paper``."""
        from coordinator_free.families.decor import accountant

        return accountant.planned_losses(cfg, plan, observers)

    def worst_case_losses(
        self, cfg, plan, observers: list[int]
    ) -> dict[int, dict[tuple[int, str], dict]]:
        """The same entries for an observer about which nothing is known: each the larger of
        the planned loss and the source's local-DP loss over the rounds (its release with only
        sigma's noise, no correlated term hiding anything: the report's ``ldp``)."""
        from coordinator_free.families.decor import accountant

        return accountant.worst_case_losses(cfg, plan, observers)

    def coalition_plan(self, cfg, plan, observers):
        from coordinator_free.families.decor import accountant

        return accountant.coalition_plan(cfg, plan, observers)

    def coalition_audit(self, run_dir, cfg, plan, observers):
        from coordinator_free.families.decor import accountant

        return accountant.coalition_audit(run_dir, cfg, plan, observers)

    def calibrate(self, cfg, target_eps, *, method, budget, decor_pair="mid", **opts):
        # The SecLDP search is over (sigma, sigma_cor) pairs; ``decor_pair`` picks which.
        from coordinator_free.families.decor import accountant

        return accountant.calibrate(cfg, target_eps, which=decor_pair)

    def node_engine(self, cfg, plan, node, streams):
        from coordinator_free.families.decor.node import engine

        return engine(cfg, plan, node, streams)

    def simulate(self, cfg, plan=None, streams=None, **opts):
        from coordinator_free.families.decor.simulate import simulate

        return simulate(cfg, plan, streams, **opts)

    # -------------------------------------------------------------- rendering (CLI output)

    render_module = "coordinator_free.families.decor.render"
    render_from = dict.fromkeys(
        ("simulator_diff", "simulation", "print_simulation"),
        "coordinator_free.families.learning.render",
    )


FAMILY = Decor()
