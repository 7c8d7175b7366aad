"""Muffliato private gossip averaging: local Gaussian noise, then synchronous gossip (optionally
Chebyshev-accelerated)."""

from __future__ import annotations

from coordinator_free.accounting import gossip
from coordinator_free.families import catalog
from coordinator_free.families.base import Family


class Gossip:
    """What the protocols built on gossip steps (averaging, randomized gossip, learning) share:
    plan, audit and calibration by the gossip accountant (``accounting/gossip.py``) over the
    family's views (its ``accountant.py``: what an observer sees), and the gossip rendering
    (``families/averaging/render.py``), from which a family's ``render_from`` takes the
    functions it prints differently."""

    def views(self) -> gossip.Views:
        """What the family's observers see (its ``accountant.VIEWS``)."""
        raise NotImplementedError(f"{self}: views")

    def plan_report(self, cfg, plan, *, source, method):
        return gossip.plan_report(self.views(), cfg, plan, source=source, method=method)

    def audit(self, run_dir, cfg, plan, observers):
        return gossip.audit_run(self.views(), run_dir, cfg, plan, observers)

    def planned_losses(self, cfg, plan, observers):
        return gossip.planned_losses(self.views(), cfg, plan, observers)

    def worst_case_losses(self, cfg, plan, observers):
        return gossip.worst_case_losses(self.views(), cfg, plan, observers)

    def calibrate(self, cfg, target_eps, *, method, budget, **opts):
        return gossip.calibrate(
            self.views(), cfg, target_eps, method=method, budget=budget, make_plan=self.make_plan
        )

    # -------------------------------------------------------------- rendering (CLI output)

    render_module = "coordinator_free.families.averaging.render"


class Averaging(Gossip, Family):
    name = "averaging"
    protocols = catalog.AVERAGING

    def validate(self, cfg, source):
        from coordinator_free.families.averaging.validate import validate_values

        validate_values(cfg, source)

    def dropout(self, cfg) -> bool:
        return True

    def yardstick(self, cfg, plan, summary):
        from coordinator_free import yardstick

        return yardstick.averaging(plan, summary["results"])

    def views(self):
        from coordinator_free.families.averaging.accountant import VIEWS

        return VIEWS

    def banner(self, cfg, plan):
        from coordinator_free.families.averaging.render import banner

        return banner(cfg, plan)

    def make_plan(self, cfg):
        from coordinator_free.families.averaging.protocol import make_plan

        return make_plan(cfg)

    def coalition_plan(self, cfg, plan, observers):
        from coordinator_free.families.averaging import coalition

        return coalition.plan_report(cfg, plan, observers)

    def coalition_audit(self, run_dir, cfg, plan, observers):
        from coordinator_free.families.averaging import coalition

        return coalition.audit_report(run_dir, cfg, plan, observers)

    def attack(self, run_dir, cfg, plan, attackers, logs):
        from coordinator_free.families.averaging import attack

        return attack.run(run_dir, cfg, plan, attackers, logs)

    def print_attack(self, result):
        from coordinator_free.families.averaging import attack

        attack.print_result(result)

    def node_engine(self, cfg, plan, node, streams):
        from coordinator_free.families.averaging.node import engine

        return engine(cfg, plan, node, streams)

    def simulate(self, cfg, plan=None, streams=None, **opts):
        from coordinator_free.families.averaging.simulate import simulate

        return simulate(cfg, plan, streams, **opts)


FAMILY = Averaging()
