"""`cfree attack`: what a coalition of curious nodes reconstructs from its own view logs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from coordinator_free import rundir
from coordinator_free.cli.common import CliError, HelpFormatter, node_ids

EPILOG = """\
examples:
  cfree run examples/muffliato-ring.toml --set graph.nodes=10 --set protocol.steps=3 --out runs/ring10
  cfree attack runs/ring10 --attackers 0           # node 0 alone: its neighbours and beyond
  cfree attack runs/ring10 --attackers 0,5 --json  # a coalition of two
  cfree run examples/muffliato-ring.toml --set graph.nodes=10 --set protocol.steps=3 \
      --set privacy.sigma=0 --out runs/plain10     # plain gossip: no noise, no privacy
  cfree attack runs/plain10 --attackers 0          # the private values themselves
  cfree run examples/dsgd-breast-cancer.toml --set graph.kind=path --set graph.nodes=8 \
      --set protocol.rounds=8 --set protocol.step_size=0.001 --set privacy.sigma=0 \
      --set data.partition=fixed --set data.per_node=1 --out runs/line8
  cfree attack runs/line8 --attackers 0            # D-GD: every gradient, then every example

The attack reads only the attackers' view logs, the run's public config and the attackers'
own keys (for their own inputs or gradients, which a member knows and a view log never holds).
Where the run directory holds every node's key (a local `cfree run`), the reconstructed values
are compared with the truth; that comparison never feeds the attack.
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "attack",
        help="reconstruct private inputs from a coalition's view logs (gossip averaging, D-GD)",
        description="The reconstruction attacks of E. Cyffers' thesis (Chapter 4). Gossip averaging "
        "(muffliato): stack what the attackers received as linear equations in every node's "
        "noisy input (the knowledge matrix), reduce it exactly to reduced row echelon form, and "
        "solve for every node it determines; a node is reconstructed exactly when the "
        "coalition's exact privacy loss about it (cfree plan/audit) equals local DP. Gradient "
        "descent over gossip (dsgd, muffliato-gd): estimate every node's gradient by (generalized) "
        "least squares, taking it as constant over the rounds up to noise, and, when each node "
        "holds one example of a linear model with intercept, invert it into the example.",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument(
        "--attackers",
        required=True,
        metavar="A,B,...",
        help="node ids of the coalition, comma-separated (one id: a single curious node)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable result")


def cmd_attack(args) -> int:
    from coordinator_free.accounting.audit import load_run
    from coordinator_free.families import family_of
    from coordinator_free.viewlog import ViewLogError, read_viewlog

    run_dir = args.run_dir
    cfg, plan = load_run(run_dir)
    family = family_of(cfg.protocol.name)
    ids = node_ids(args.attackers, "--attackers", plan.n)
    logs = {}
    for a in ids:
        path = rundir.log_path(run_dir, a)
        try:
            logs[a] = read_viewlog(path)
        except FileNotFoundError:
            raise CliError(f"{path} does not exist: attacker {a} has no view log") from None
        except ViewLogError as exc:
            raise CliError(f"{path}: {exc}") from None
    try:
        result = family.attack(run_dir, cfg, plan, ids, logs)
    except NotImplementedError as exc:
        raise CliError(str(exc)) from None
    damaged = {a: [p.message for p in logs[a].problems] for a in ids if logs[a].problems}
    result["damaged_logs"] = {str(a): msgs for a, msgs in damaged.items()}
    for a, msgs in damaged.items():
        print(
            f"cfree attack: warning: attacker {a}'s log is damaged ({msgs[0]}); the attack used "
            "the records that could be read",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    family.print_attack(result)
    return 0
