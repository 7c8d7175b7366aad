"""``cfree compose``: a docker-compose file for any config."""

from __future__ import annotations

import json
from pathlib import Path

from coordinator_free import config as config_mod
from coordinator_free.cli.common import CliError


def cmd_compose(args) -> int:
    from coordinator_free.cluster import compose

    cfg = config_mod.load(args.config, args.set)
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
