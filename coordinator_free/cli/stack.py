"""`cfree stack`: a Docker Swarm stack for a config."""

from __future__ import annotations

import json
from pathlib import Path

from coordinator_free.cli.common import (
    CliError,
    HelpFormatter,
    add_config_args,
    add_deploy_args,
    deploy_config,
)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "stack",
        help="write a Docker Swarm stack for a config (a job per peer, an auditor job)",
        description="Make the run's keys here and write DIR/docker-stack.yml for `docker stack "
        "deploy`: each key a Swarm secret mounted only into its peer's container, the config "
        "and roster as Swarm configs, an overlay network, one job per peer that is never "
        "restarted, and an auditor job that audits once every peer has a result. DIR/run is "
        "the run directory (a bind mount) and DIR/README.md has the commands, also for "
        "spreading the peers over LAN hosts (--groups). The image is written by its ID, "
        "resolved here, so build it (or load it) before writing the stack.",
        epilog="examples:\n  cfree stack examples/muffliato-ring.toml --dir stack/ring\n"
        "  docker stack deploy --resolve-image never -c stack/ring/docker-stack.yml cfree\n"
        "  cfree stack examples/ring-sum.toml --dir stack/lan --groups 3   # hosts labelled "
        "cfree.group=0,1,2",
        formatter_class=HelpFormatter,
    )
    add_config_args(p)
    p.add_argument("--dir", type=Path, required=True, help="where to write the stack")
    p.add_argument(
        "--image",
        default=None,
        help="the peer image on every host: a name resolved here to its image ID (docker image "
        "inspect), an ID (sha256:...) or a digest (name@sha256:...); the stack names it by ID "
        "or digest only, so no node asks a registry (default: coordinator-free-peer:latest, "
        "built from peer/Dockerfile)",
    )
    p.add_argument(
        "--groups",
        type=int,
        default=0,
        metavar="K",
        help="run peer i only on Swarm nodes labelled cfree.group=<i mod K> (default 0: no "
        "constraint, Swarm places the peers)",
    )
    p.add_argument(
        "--run-dir",
        type=Path,
        help="the run directory, a host path on every node (default: DIR/run)",
    )
    p.add_argument(
        "--no-ship-logs",
        dest="ship_logs",
        action="store_false",
        help="do not have each peer send its finished log and result to the auditor (only "
        "for a run directory that is one shared disk on every host)",
    )
    add_deploy_args(p)
    p.add_argument(
        "--audit-idle",
        type=float,
        metavar="SECONDS",
        help="once a peer has finished, the auditor takes peers without a result for gone "
        "when the run directory stays untouched this long (default: 3 step deadlines + 10 s)",
    )


def cmd_stack(args) -> int:
    from coordinator_free.cluster import compose, stack

    cfg = deploy_config(args, "stack", "the stack")
    try:
        info = stack.write_stack(
            cfg,
            args.dir,
            image=args.image or compose.IMAGE,
            port=args.port,
            groups=args.groups,
            run_dir=args.run_dir,
            audit_timeout_s=args.audit_after,
            audit_idle_s=args.audit_idle,
            ship_logs=args.ship_logs,
        )
    except compose.ComposeError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print(
        f"wrote {info['stack_file']}: {info['nodes']} peer jobs, an auditor job, keys/ "
        f"(private); run directory {info['run_dir']}"
    )
    if info["image"] != info["image_ref"]:
        print(f"image {info['image_ref']} = {info['image']} (the stack names it by this ID)")
    print("next:")
    print(f"  docker stack deploy --resolve-image never -c {info['stack_file']} cfree")
    print(f"  (see {info['dir']}/README.md)")
    return 0
