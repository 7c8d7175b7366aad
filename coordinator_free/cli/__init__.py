"""Command line: ``cfree`` (also ``python -m coordinator_free``).

One module per command (``cli/run.py``, ``cli/plan.py``...), each declaring its arguments
(``add_parser``) and doing its work (``cmd_*``); :func:`main` parses, dispatches and turns the
errors of the package into exit codes through their common root,
:class:`coordinator_free.errors.CfreeError`. What a command prints about a protocol comes from
the protocol's family (``family_of(name).print_*``): nothing here knows a protocol by name.
"""

from __future__ import annotations

import argparse
import os
import sys

from coordinator_free import __version__
from coordinator_free.cli import attack as attack_cmd
from coordinator_free.cli import audit as audit_cmd
from coordinator_free.cli import compose as compose_cmd
from coordinator_free.cli import k8s as k8s_cmd
from coordinator_free.cli import keygen as keygen_cmd
from coordinator_free.cli import lan as lan_cmd
from coordinator_free.cli import logs as logs_cmd
from coordinator_free.cli import peer as peer_cmd
from coordinator_free.cli import plan as plan_cmd
from coordinator_free.cli import run as run_cmd
from coordinator_free.cli import simulate as simulate_cmd
from coordinator_free.cli import stack as stack_cmd
from coordinator_free.cli.common import CliError, _emit, _fmt, _table, add_config_args
from coordinator_free.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, CfreeError

#: Exit status when stdout's reader went away, as a shell reports a process killed by SIGPIPE.
EXIT_BROKEN_PIPE = 141

__all__ = ["CliError", "build_parser", "main", "_emit", "_fmt", "_table", "add_config_args"]

EPILOG = """\
examples:
  cfree run                                   # 64 peers on a hypercube, built-in default config
  cfree run examples/muffliato-ring.toml --set graph.nodes=12
  cfree plan examples/muffliato-ring.toml --source 0 --method exact --json
  cfree audit runs/<run-dir> --observer 3
  cfree report runs/<run-dir>                 # PNG plots of a run (audits it first if needed)
  cfree simulate examples/muffliato-ring.toml
  cfree attack runs/<run-dir> --attackers 0,5  # what nodes 0 and 5 together reconstruct
  cfree ls                                    # the runs under runs/: status, worst eps
  cfree log dump runs/<run-dir>/logs/node-0.vlog --jsonl   # a view log, a record per line
  cfree run examples/ring-sum.toml            # a token around a ring of 64 peers
  cfree plan examples/walk-sgd.toml --method paper --target-eps 10 --budget mean
  cfree plan examples/decor-ring.toml --target-eps 10   # (sigma, sigma_cor) for DECOR
  cfree keygen --hosts 127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002 --out cluster/
  cfree compose examples/ring-sum.toml --dir cluster/ && docker-compose -f cluster/docker-compose.yml up --build
  cfree k8s examples/muffliato-ring.toml --dir k8s/ring && kubectl apply -k k8s/ring
  cfree stack examples/muffliato-ring.toml --dir stack/ring   # a Docker Swarm stack
  cfree keypair --out key/ --address 192.168.1.11     # on each LAN host: prints its public line
  cfree roster --hosts hosts.txt --out lan/             # roster + start.sh + systemd unit per host
  cfree lab run                                         # 8 peers, each in its own network namespace (root)

Without a config, run, plan and simulate use examples/muffliato-hypercube.toml; lab run and
compose use examples/muffliato-ring.toml (one host, namespace or container per peer).
Configuration keys are documented in docs/config.md; privacy quantities in docs/privacy.md.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cfree",
        description="coordinator-free: run differentially private decentralized learning as real "
        "peer processes over encrypted channels, and audit the pairwise privacy loss each node "
        "experienced from its view log.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"cfree {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (run_cmd, peer_cmd, keygen_cmd, compose_cmd, plan_cmd, audit_cmd, simulate_cmd):
        module.add_parser(sub)
    attack_cmd.add_parser(sub)
    logs_cmd.add_parser(sub)
    k8s_cmd.add_parser(sub)
    stack_cmd.add_parser(sub)

    from coordinator_free import report
    from coordinator_free.cli import lab as lab_cli

    report.add_parser(sub)
    lan_cmd.add_parser(sub)
    lab_cli.add_lab_parser(sub)
    return parser


def cmd_lab(args) -> int:
    from coordinator_free.cli import lab as lab_cli

    return lab_cli.cmd_lab(args)


COMMANDS = {
    "run": run_cmd.cmd_run,
    "peer": peer_cmd.cmd_peer,
    "keygen": keygen_cmd.cmd_keygen,
    "compose": compose_cmd.cmd_compose,
    "plan": plan_cmd.cmd_plan,
    "audit": audit_cmd.cmd_audit,
    "simulate": simulate_cmd.cmd_simulate,
    "attack": attack_cmd.cmd_attack,
    "report": lambda args: args.func(args),  # report.cmd_report, set by report.add_parser
    "keypair": lan_cmd.cmd_lan,
    "roster": lan_cmd.cmd_lan,
    "lab": cmd_lab,
    "log": lambda args: args.func(args),  # logs.cmd_log_dump
    "ls": logs_cmd.cmd_ls,
    "k8s": k8s_cmd.cmd_k8s,
    "stack": stack_cmd.cmd_stack,
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        return COMMANDS[args.command](args)
    except CfreeError as exc:  # every user-facing error: a message, never a traceback
        print(f"cfree {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"cfree {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of stdout went away (`cfree plan | head`): stop quietly, and point stdout
        # at /dev/null so the interpreter's final flush does not raise again.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass
        return EXIT_BROKEN_PIPE
