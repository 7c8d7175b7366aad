"""The ``cfree`` command line: the parser and ``main``; one module per command (``cli.run``,
``cli.plan``, ``cli.audit``, ``cli.simulate``, ``cli.keygen``, ``cli.compose``, ``cli.peer``,
``cli.lan`` for keypair and roster, ``cli.lab``) and ``cli.common`` for what they share.
Nothing outside ``cli/`` imports it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from coordinator_free import __version__, rundir
from coordinator_free.cli import lab as lab_cli
from coordinator_free.cli.audit import cmd_audit
from coordinator_free.cli.common import _add_config_args
from coordinator_free.cli.compose import cmd_compose
from coordinator_free.cli.keygen import cmd_keygen
from coordinator_free.cli.lan import cmd_lan
from coordinator_free.cli.peer import cmd_peer
from coordinator_free.cli.plan import cmd_plan
from coordinator_free.cli.run import cmd_run
from coordinator_free.cli.simulate import cmd_simulate
from coordinator_free.errors import EXIT_INTERRUPTED, CfreeError


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

    p = sub.add_parser(
        "run",
        help="run an experiment on a local cluster of peer processes",
        description="Start one peer process per node on loopback, run the protocol over encrypted "
        "TCP channels, then print the estimate error per node, rounds/s, bytes sent and the "
        "pairwise privacy losses the auditor computed from the view logs. Everything lands in a "
        "run directory (config, roster, keys, logs, results, audit).",
    )
    _add_config_args(p)
    p.add_argument("--out", type=Path, help="run directory (default: runs/<name>-<time>-<rand>)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument("--no-audit", action="store_true", help="skip the audit at the end")

    p = sub.add_parser(
        "peer",
        help="run ONE node (what `cfree run` starts per node; use it on LAN hosts or containers)",
        description="Run a single peer: load its private key, dial its graph neighbours from the "
        "roster, run the protocol and write its view log and result under --out.",
    )
    p.add_argument("--config", required=True, help="experiment config (TOML)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--roster", required=True, type=Path, help="public roster (roster.json)")
    p.add_argument("--key", required=True, type=Path, help="this node's private key file")
    p.add_argument("--id", required=True, type=int, help="this node's id in the roster")
    p.add_argument("--out", required=True, type=Path, help="run directory for logs/ and results/")
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="bind this address instead of the roster's (e.g. 0.0.0.0:7000 in a container or "
        "behind NAT, where the roster lists the name others dial)",
    )
    p.add_argument("--listen-fd", type=int, help="inherited listening socket (set by the launcher)")
    p.add_argument("--progress-fd", type=int, help="write JSON-lines progress events to this fd")
    p.add_argument("-v", "--verbose", action="store_true")

    p = sub.add_parser(
        "keygen",
        help="write one X25519 private key per node and the public roster",
        description="Generate node keys (PEM, mode 0600) under OUT/keys and the public roster "
        "OUT/roster.json. The roster (ids, addresses, public keys) is the only shared state of a "
        "run; private keys never leave their node.",
    )
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--nodes", type=int, help="number of nodes (addresses 127.0.0.1, port 0)")
    g.add_argument("--hosts", help="comma-separated host:port list, one per node in id order")
    g.add_argument("--config", help="take the number of nodes from this config")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--name", default="run", help="run name recorded in the roster")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser(
        "compose",
        help="write a docker-compose cluster for a config (keygen, one service per peer, auditor)",
        description="Write DIR/docker-compose.yml and the config its containers read "
        "(DIR/config.toml, plus copies of any graph or data file under DIR/files). Then "
        "`docker compose -f DIR/docker-compose.yml up --build` (or docker-compose v1) runs the "
        "whole experiment: a one-shot keygen service, one peer service per node on a bridge "
        "network (each mounting only its own key volume), and an auditor that writes audit.json "
        "next to the logs in DIR/run (or $CFREE_RUN_DIR). Without a registry, build the base "
        "image from Debian's packages first: see docs/deploy.md.",
    )
    _add_config_args(p)
    p.add_argument(
        "--dir",
        type=Path,
        help="where to write the compose file and config (default: compose/<run.name>)",
    )
    p.add_argument("--file", default="docker-compose.yml", help="compose file name in DIR")
    p.add_argument(
        "--config-file",
        default=rundir.CONFIG,
        help="where the containers' config goes, relative to DIR (default: config.toml)",
    )
    p.add_argument(
        "--run-dir",
        default="./run",
        help="host directory for logs, results and the audit, relative to DIR (default: ./run; "
        "CFREE_RUN_DIR overrides it when the cluster starts)",
    )
    p.add_argument("--port", type=int, default=7000, help="port every peer listens on (7000)")
    p.add_argument("--force", action="store_true", help="overwrite an existing compose file")
    p.add_argument("--json", action="store_true", help="print what was written as JSON")

    p = sub.add_parser(
        "plan",
        help="pairwise privacy losses from public parameters only (before running)",
        description="Compute, from the config alone, the loss from a source node to every "
        "observer (the fault-free schedule). --method exact: the exact Rényi divergence of the "
        "observer's whole view; --method paper: Eq. (6) of the Muffliato paper. Token protocols: "
        "exact is the loss conditional on the walk (the ring's, or one walk sampled from the "
        "public seed), paper the theorem of the protocol's paper with senders known. decor: the "
        "SecLDP guarantee at privacy.collusion (exact: Algorithms 2/3 of the DECOR paper; paper: "
        "its closed form) and the pairwise losses to curious users. Without --source, a summary "
        "over all pairs by graph distance.",
    )
    _add_config_args(p)
    p.add_argument("--source", type=int, help="source node u (default: summary over all pairs)")
    p.add_argument("--method", choices=["exact", "paper"], default="exact")
    p.add_argument(
        "--target-eps",
        type=float,
        metavar="E",
        help="calibrate instead: find the smallest privacy.sigma whose eps (at privacy.delta) "
        "is at most E, and name the binding pair",
    )
    p.add_argument(
        "--budget",
        choices=["worst", "mean"],
        default="worst",
        help="with --target-eps: 'worst' (default) bounds every pair; 'mean' bounds the mean "
        "loss over pairs (the Muffliato paper's summary, not a guarantee for any pair)",
    )
    p.add_argument(
        "--pair",
        choices=["low", "mid", "high"],
        default="mid",
        help="decor with --target-eps: which of the (sigma, sigma_cor) pairs that meet the "
        "target to use: the smallest sigma (largest sigma_cor), the middle of the grid "
        "(default) or the largest sigma (sigma_cor near 0, local DP); all are listed in --json",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser(
        "audit",
        help="replay a finished run's view logs and compute the per-pair losses",
        description="Rebuild the schedule that really happened (missed deadlines, late messages) "
        "from the view logs of RUN_DIR, then compute every observer's loss about every source "
        "with both methods, and check the logs' integrity.",
    )
    p.add_argument("run_dir", type=Path, help="run directory written by `cfree run`")
    p.add_argument("--observer", type=int, action="append", help="only this observer (repeatable)")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 if any log is missing, damaged, unfinished or inconsistent",
    )

    p = sub.add_parser(
        "simulate",
        help="the same protocol in one process (reference simulator; --run reproduces a run)",
        description="Run the reference simulator: the exact update math of the peers, no "
        "network. With --run RUN_DIR it rebuilds the run's node streams from its keys and ends "
        "with the same values as the fault-free networked run, bit for bit.",
    )
    _add_config_args(p)
    p.add_argument(
        "--run",
        type=Path,
        metavar="RUN_DIR",
        help="reproduce a local run exactly: its config and its nodes' private streams (needs "
        "the run's keys/); without it, values and noise come from the public run.seed",
    )
    p.add_argument("--json", action="store_true")

    from coordinator_free import report
    from coordinator_free.cli import lab as lab_cli
    from coordinator_free.cluster import lan

    report.add_parser(sub)
    lan.add_parsers(sub)
    lab_cli.add_lab_parser(sub)
    return parser


COMMANDS = {
    "run": cmd_run,
    "peer": cmd_peer,
    "keygen": cmd_keygen,
    "compose": cmd_compose,
    "plan": cmd_plan,
    "audit": cmd_audit,
    "simulate": cmd_simulate,
    "report": lambda args: args.func(args),  # report.cmd_report, set by report.add_parser
    "keypair": cmd_lan,
    "roster": cmd_lan,
    "lab": lab_cli.cmd_lab,
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return COMMANDS[args.command](args)
    except CfreeError as exc:  # every user-facing error: a message, never a traceback
        print(f"cfree {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"cfree {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


EPILOG = """\
examples:
  cfree run                                   # 8 peers on a ring, built-in default config
  cfree run examples/muffliato-ring.toml --set graph.nodes=12
  cfree plan examples/muffliato-ring.toml --source 0 --method exact --json
  cfree audit runs/<run-dir> --observer 3
  cfree simulate examples/muffliato-ring.toml
  cfree run examples/ring-sum.toml            # a token around a ring of 64 peers
  cfree plan examples/walk-sgd.toml --method paper --target-eps 10 --budget mean
  cfree plan examples/decor-ring.toml --target-eps 10   # (sigma, sigma_cor) for DECOR
  cfree keygen --nodes 4 --out cluster/ --hosts 10.0.0.1:7000,10.0.0.2:7000,...
  cfree compose examples/ring-sum.toml --dir cluster/ && docker compose -f cluster/docker-compose.yml up --build
  cfree keypair --out key/ --address 192.168.1.11     # on each LAN host: prints its public line
  cfree roster --hosts hosts.txt --out lan/             # roster + start.sh + systemd unit per host
  cfree lab run                                         # 8 peers, each in its own network namespace (root)

Configuration keys are documented in docs/config.md; privacy quantities in docs/privacy.md.
"""
