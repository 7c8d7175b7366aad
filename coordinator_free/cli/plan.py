"""`cfree plan`: pairwise privacy losses from the public parameters, or a calibration."""

from __future__ import annotations

from coordinator_free import config as config_mod
from coordinator_free import progress
from coordinator_free.cli.common import (
    CliError,
    _emit,
    add_config_args,
    coalition,
    examples,
    node_ids,
)
from coordinator_free.families import family_of


def add_parser(sub) -> None:
    p = sub.add_parser(
        "plan",
        help="pairwise privacy losses from public parameters only (before running)",
        description="Compute, from the config alone, the loss from a source node to every "
        "observer (the fault-free schedule). --method exact: the exact loss of the observer's "
        "whole view (the Gaussian privacy profile of what it sees); --method paper: Eq. (6) of the Muffliato paper. Token protocols: "
        "exact is the loss conditional on the walk (the ring's, or one walk sampled from the "
        "public seed), paper the theorem of the protocol's paper with senders known. decor: the "
        "SecLDP guarantee at privacy.collusion (exact: Algorithms 2/3 of the DECOR paper; paper: "
        "its closed form) and the pairwise losses to curious users. Without --source, a summary "
        "over all pairs by graph distance.",
        **examples(
            "cfree plan examples/muffliato-ring.toml",
            "cfree plan examples/muffliato-ring.toml --source 0 --method paper",
            "cfree plan examples/ring-sum.toml --target-eps 2",
        ),
    )
    add_config_args(p, showcase=True)
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
    p.add_argument(
        "--observers",
        metavar="A,B,...",
        help="the exact loss of every other node towards this coalition's joint view (node "
        "ids, comma-separated; one row per source; every protocol with peers)",
    )
    p.add_argument(
        "--coalition-growth",
        type=int,
        metavar="K",
        help="how the worst and mean loss of the other nodes grow as 1..K colluders join "
        "(every protocol with peers); --join picks who joins next",
    )
    p.add_argument(
        "--join",
        choices=["greedy", "degree"],
        default="greedy",
        help="with --coalition-growth: 'greedy' (default) adds the node that raises the mean "
        "loss most, a worst case found step by step; 'degree' the highest-degree nodes first",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_plan(args) -> int:
    from coordinator_free.accounting.audit import calibrate, plan_report

    cfg = config_mod.load(args.config, args.set, args.fault, default=config_mod.RUN_DEFAULT_CONFIG)
    family = family_of(cfg.protocol.name)
    if args.coalition_growth is not None:
        if args.observers is not None or args.target_eps is not None or args.source is not None:
            raise CliError("--coalition-growth builds its own coalitions: drop --observers, "
                           "--source and --target-eps")  # fmt: skip
        plan = family.make_plan(cfg)
        with progress.reporting("cfree plan"):
            return coalition(
                args,
                family,
                lambda: family.coalition_growth(cfg, plan, args.coalition_growth, args.join),
                family.print_growth,
            )
    if args.observers is not None:
        if args.target_eps is not None or args.source is not None or args.method != "exact":
            raise CliError("--observers gives the exact loss of every source: drop --source, "
                           "--target-eps and --method paper")  # fmt: skip
        ids = node_ids(args.observers, "--observers")
        return coalition(
            args, family, lambda: family.coalition_plan(cfg, family.make_plan(cfg), ids)
        )
    if args.target_eps is not None:
        if args.source is not None:
            raise CliError("--target-eps calibrates over all pairs; drop --source")
        with progress.reporting("cfree plan"):  # on a terminal only
            rep = calibrate(
                cfg, args.target_eps, method=args.method, budget=args.budget, decor_pair=args.pair
            )
        return _emit(args, rep, family.print_calibration)
    with progress.reporting("cfree plan"):
        rep = plan_report(cfg, source=args.source, method=args.method)
    return _emit(args, rep, family.print_plan)
