"""`cfree simulate`: the reference simulator, from the public seed or a run's keys."""

from __future__ import annotations

import json
from pathlib import Path

from coordinator_free import config as config_mod
from coordinator_free import rundir
from coordinator_free.cli.common import CliError, add_config_args, examples
from coordinator_free.families import family_of


def add_parser(sub) -> None:
    p = sub.add_parser(
        "simulate",
        help="the same protocol in one process (reference simulator; --run reproduces a run)",
        description="Run the reference simulator: the exact update math of the peers, no "
        "network. With --run RUN_DIR it rebuilds the run's node streams from its keys and ends "
        "with the same values as the fault-free networked run, bit for bit.",
        **examples(
            "cfree simulate examples/muffliato-ring.toml",
            "cfree simulate examples/walk-sgd.toml --json > /tmp/walk.json",
            "cfree run examples/ring-sum.toml --out /tmp/sum --quiet && cfree simulate --run /tmp/sum",
        ),
    )
    add_config_args(p, showcase=True)
    p.add_argument(
        "--run",
        type=Path,
        metavar="RUN_DIR",
        help="reproduce a local run exactly: its config and its nodes' private streams (needs "
        "the run's keys/); without it, values and noise come from the public run.seed",
    )
    p.add_argument("--json", action="store_true")


def cmd_simulate(args) -> int:
    streams = None
    if args.run is not None:
        from coordinator_free import seeds

        if args.config is not None:
            raise CliError("give either a config or --run, not both")
        cfg = config_mod.load(rundir.config_path(args.run), args.set)
        if not family_of(cfg.protocol.name).has_peers(cfg):
            raise CliError(
                f"{args.run} is a {cfg.protocol.name} run: it has no peers to reproduce, and the "
                "curator's noise came from a secret seed that is not kept"
            )
        roster = rundir.roster_path(args.run)
        if not roster.is_file():
            raise CliError(f"{args.run} has no roster.json: not a run directory of `cfree run`")
        n = len(json.loads(roster.read_text())["nodes"])
        streams = seeds.streams_of_run(args.run, n)
    else:
        cfg = config_mod.load(
            args.config, args.set, args.fault, default=config_mod.RUN_DEFAULT_CONFIG
        )
    family = family_of(cfg.protocol.name)
    out = family.simulation(cfg, streams)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        family.print_simulation(out)
    return 0
