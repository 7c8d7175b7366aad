"""Private ADMM for consensus ERM (Chapter 8 of the thesis, CBB23): ``admm``, decentralized over a
token walk between real peers (Algorithm 8.4), and the one-process baselines ``admm-central``
(Algorithm 8.2, record level), ``admm-federated`` (Algorithm 8.3, users sampled per round) and
``prox-sgd`` (private proximal SGD)."""

from __future__ import annotations

from coordinator_free.families import catalog
from coordinator_free.families.base import Family

#: The protocols run in one process (no peers, no view logs).
ONE_PROCESS = ("admm-central", "admm-federated", "prox-sgd")


class Admm(Family):
    name = "admm"
    protocols = catalog.ADMM
    own_keys = (
        "protocol.gamma",
        "protocol.lam",
        "protocol.users_per_round",
        "protocol.secure_aggregation",
        "model.l1",
    )

    def validate(self, cfg, source):
        from coordinator_free.families.admm.validate import validate_admm

        validate_admm(cfg, source)

    def privacy_units(self, cfg) -> tuple[str, ...]:
        # The decentralized protocol also takes one record of one user as the unit; the
        # one-process baselines are accounted at user level (admm-central's users are records).
        return ("user", "record") if cfg.protocol.name == "admm" else ("user",)

    def walks(self, cfg) -> bool:
        return cfg.protocol.name == "admm"

    def has_peers(self, cfg) -> bool:
        return cfg.protocol.name == "admm"

    def sensitivity(self, cfg) -> float:
        """A contribution's Gaussian shift: the block u_i moves by at most 4 lam gamma L under
        noise lam sigma, i.e. sensitivity 4 gamma L at noise sigma, L the unit's
        (``privacy.admm.effective_lipschitz``: L / m_min at record level, plus the certified
        tolerance of the prox solves); prox-sgd: 2, sigma being its noise multiplier on the
        clipped gradients."""
        from coordinator_free.families.admm.protocol import gamma_of

        if cfg.protocol.name == "prox-sgd":
            return 2.0
        if cfg.protocol.name == "admm":
            from coordinator_free.families.admm.protocol import make_plan

            return make_plan(cfg).sensitivity
        return 4.0 * gamma_of(cfg) * cfg.protocol.clip

    def banner(self, cfg, plan):
        from coordinator_free.families.admm.render import banner

        return banner(cfg, plan)

    def make_plan(self, cfg):
        if cfg.protocol.name == "admm":
            from coordinator_free.families.admm.protocol import make_plan

            return make_plan(cfg)
        from coordinator_free.families.admm.central import make_plan

        return make_plan(cfg)

    def plan_report(self, cfg, plan, *, source, method):
        if cfg.protocol.name == "admm":
            from coordinator_free.families.admm import accountant

            return accountant.plan_report(cfg, plan, source=source, method=method)
        from coordinator_free.families.admm import central

        return central.plan_report(cfg, plan, method=method)

    def audit(self, run_dir, cfg, plan, observers):
        if cfg.protocol.name == "admm":
            from coordinator_free.families.admm import accountant

            return accountant.audit_run(run_dir, cfg, plan, observers)
        from coordinator_free.families.admm import central

        return central.audit_run(run_dir, cfg, plan)

    def planned_losses(self, cfg, plan, observers):
        if cfg.protocol.name == "admm":
            from coordinator_free.families.admm import accountant

            return accountant.planned_losses(cfg, plan, observers)
        from coordinator_free.families.admm import central

        return central.planned_losses(cfg, plan, observers)

    def worst_case_losses(self, cfg, plan, observers):
        if cfg.protocol.name == "admm":
            from coordinator_free.families.admm import accountant

            return accountant.worst_case_losses(cfg, plan, observers)
        from coordinator_free.families.admm import central

        return central.planned_losses(cfg, plan, observers)

    def calibrate(self, cfg, target_eps, *, method, budget, **opts):
        if cfg.protocol.name == "admm":
            from coordinator_free.families.admm import accountant

            return accountant.calibrate(cfg, target_eps, method=method, budget=budget)
        from coordinator_free.families.admm import central

        return central.calibrate(cfg, target_eps, method=method, budget=budget)

    def node_engine(self, cfg, plan, node, streams):
        from coordinator_free.families.admm.node import engine

        return engine(cfg, plan, node, streams)

    def simulate(self, cfg, plan=None, streams=None, **opts):
        if cfg.protocol.name == "admm":
            from coordinator_free.families.admm.simulate import simulate

            return simulate(cfg, plan, streams)
        from coordinator_free.families.admm import central

        return central.simulate(cfg, plan, streams)

    def run_one_process(self, cfg, out, streams) -> tuple[dict, object]:
        from coordinator_free.families.admm import central

        return central.run(cfg, out, streams)

    def reference(self, cfg):
        from coordinator_free.families.admm import render

        return render.references(cfg, lambda c: self.simulate_as_peers(c))

    def yardstick(self, cfg, plan, summary):
        from coordinator_free.families.admm import render

        return render.yardstick(cfg, plan, summary)

    # -------------------------------------------------------------- rendering (CLI output)

    render_module = "coordinator_free.families.admm.render"


FAMILY = Admm()
