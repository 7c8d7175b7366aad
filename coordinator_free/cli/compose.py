"""`cfree compose`: a docker-compose cluster for a config."""

from __future__ import annotations

import json
from pathlib import Path

from coordinator_free import config as config_mod
from coordinator_free.cli.common import CliError, add_config_args, examples


def add_parser(sub) -> None:
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
        **examples(
            "cfree compose examples/muffliato-ring.toml --dir /tmp/compose-ring",
            "cfree compose examples/ring-sum.toml --set graph.nodes=6 --dir /tmp/compose-sum --json",
        ),
    )
    add_config_args(p)
    p.add_argument(
        "--dir",
        type=Path,
        help="where to write the compose file and config (default: compose/<run.name>)",
    )
    p.add_argument("--file", default="docker-compose.yml", help="compose file name in DIR")
    p.add_argument(
        "--config-file",
        default="config.toml",
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


def cmd_compose(args) -> int:
    from coordinator_free.cluster import compose

    cfg = config_mod.load(args.config, args.set, args.fault)
    out_dir = args.dir if args.dir is not None else Path("compose") / cfg.run.name
    if not 1 <= args.port <= 65535:
        raise CliError(f"--port {args.port} is not in 1..65535")
    try:
        info = compose.write_compose(
            cfg,
            out_dir,
            file_name=args.file,
            config_file=args.config_file,
            run_dir=args.run_dir,
            port=args.port,
            force=args.force,
        )
    except compose.ComposeError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    f = info["compose_file"]
    print(f"wrote {f} ({info['nodes']} peers) and {info['config']}")
    if info["build_context"] is None:
        print(
            "  no build context (not run from a checkout): the image "
            f"{compose.IMAGE} must exist, or set CFREE_IMAGE to one that does"
        )
    print("next:")
    print(f"  docker compose -f {f} up --build      # or: docker-compose -f {f} up --build")
    print(
        "  (no registry: deploy/build-base-image.sh && deploy/fetch-wheels.sh, then "
        "CFREE_BASE_IMAGE=cfree-base:bookworm CFREE_PIP_OPTIONS=--no-index; see docs/deploy.md)"
    )
    return 0
