"""Private learning over gossip: Muffliato-GD/SGD, D-SGD with local DP, and the central-DP
curator baseline (no peers)."""

from __future__ import annotations

from coordinator_free.families import catalog
from coordinator_free.families.averaging import Gossip
from coordinator_free.families.base import Family


class Learning(Gossip, Family):
    name = "learning"
    protocols = catalog.LEARNING

    def views(self):
        from coordinator_free.families.learning.accountant import VIEWS

        return VIEWS

    def validate(self, cfg, source):
        from coordinator_free.families.learning.validate import validate_learning

        validate_learning(cfg, source)

    def learns(self, cfg) -> bool:
        return True

    def reference(self, cfg):
        from coordinator_free.families.learning.reference import final_average, references

        return references(cfg, lambda c: final_average(self.simulate(c)))

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

    def attack(self, run_dir, cfg, plan, attackers, logs):
        from coordinator_free.families.learning import attack

        return attack.run(run_dir, cfg, plan, attackers, logs)

    def print_attack(self, result):
        from coordinator_free.families.learning import attack

        attack.print_result(result)

    def coalition_plan(self, cfg, plan, observers):
        from coordinator_free.families.learning import coalition

        return coalition.plan_report(cfg, plan, observers)

    def coalition_audit(self, run_dir, cfg, plan, observers):
        from coordinator_free.families.learning import coalition

        return coalition.audit_report(run_dir, cfg, plan, observers)

    def node_engine(self, cfg, plan, node, streams):
        from coordinator_free.families.learning.node import engine

        return engine(cfg, plan, node, streams)

    def run_one_process(self, cfg, out, streams):
        """central-dp: the curator's run; its models and per-round metrics into the run
        directory."""
        from coordinator_free import rundir

        sim = self.simulate_as_peers(cfg, None, streams)
        rundir.write_npy(rundir.central_models_path(out), sim.models[:, 0])
        rundir.write_jsonl(rundir.metrics_path(out), sim.metrics)
        final = sim.metrics[-1]
        results = {
            "protocol": cfg.protocol.name,
            "rounds": sim.plan.rounds,
            "gossip_steps": 0,
            "steps": 0,
            "nodes": [],
            "metrics": sim.metrics,
            "central": {
                "test_loss": final["avg_test_loss"],
                "test_accuracy": final["avg_test_accuracy"],
            },
        }
        return results, sim.plan

    def simulate(self, cfg, plan=None, streams=None, *, keep_correlated=False, **opts):
        # keep_correlated: no correlated noise here, nothing to keep.
        from coordinator_free.families.learning.simulate import simulate

        return simulate(cfg, plan, streams, **opts)

    # -------------------------------------------------------------- rendering (CLI output)

    render_from = dict.fromkeys(
        ("print_plan", "print_summary", "simulator_diff", "simulation", "print_simulation"),
        "coordinator_free.families.learning.render",
    )


FAMILY = Learning()
