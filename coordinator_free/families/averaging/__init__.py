"""Muffliato private gossip averaging: local Gaussian noise, then synchronous gossip (optionally
Chebyshev-accelerated)."""

from __future__ import annotations

from coordinator_free.families import catalog
from coordinator_free.families.base import Family


class Gossip:
    """What the protocols built on gossip steps (averaging, randomized gossip, learning) share:
    plan, audit and calibration by the exact joint-view accountant and the papers' formulas
    (``families/averaging/accountant.py``), and the gossip rendering
    (``families/averaging/render.py``), from which a family's ``render_from`` takes the
    functions it prints differently."""

    def plan_report(self, cfg, plan, *, source, method):
        from coordinator_free.families.averaging import accountant

        return accountant.plan_report(cfg, plan, source=source, method=method)

    def audit(self, run_dir, cfg, plan, observers):
        from coordinator_free.families.averaging import accountant

        return accountant.audit_run(run_dir, cfg, plan, observers)

    def planned_losses(self, cfg, plan, observers):
        from coordinator_free.families.averaging import accountant

        return accountant.planned_losses(cfg, plan, observers)

    def worst_case_losses(self, cfg, plan, observers):
        from coordinator_free.families.averaging import accountant

        return accountant.worst_case_losses(cfg, plan, observers)

    def calibrate(self, cfg, target_eps, *, method, budget, **opts):
        from coordinator_free.families.averaging import accountant

        return accountant.calibrate(
            cfg, target_eps, method=method, budget=budget, make_plan=self.make_plan
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
