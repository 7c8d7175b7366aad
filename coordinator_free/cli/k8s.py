"""`cfree k8s`: Kubernetes manifests (Kustomize) for a config."""

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
        "k8s",
        help="write Kubernetes manifests for a config (a Job per peer, an auditor Job)",
        description="Make the run's keys here and write DIR as a Kustomize directory: a Secret "
        "per node key (each mounted only by that node's pod), a ConfigMap with the config and "
        "the roster, a headless Service naming the peers, a ReadWriteMany volume for the run "
        "directory, one Job per peer and an auditor Job that audits once every peer has "
        "written its result. `kubectl apply -k DIR` starts it. The manifests are validated "
        "offline by the project's tests (kubectl kustomize, kubernetes-validate --strict); "
        "they are not run on a cluster there.",
        epilog="examples:\n  cfree k8s examples/muffliato-ring.toml --dir k8s/ring\n"
        "  kubectl kustomize k8s/ring | kubernetes-validate --strict -",
        formatter_class=HelpFormatter,
    )
    add_config_args(p)
    p.add_argument("--dir", type=Path, required=True, help="where to write the manifests")
    p.add_argument(
        "--image",
        default=None,
        help="the peer image the cluster pulls (default: coordinator-free-peer:latest, built "
        "from peer/Dockerfile)",
    )
    p.add_argument("--storage", default="1Gi", help="size of the run volume (default 1Gi)")
    add_deploy_args(p)


def cmd_k8s(args) -> int:
    from coordinator_free.cluster import compose, k8s

    cfg = deploy_config(args, "k8s", "the manifests")
    try:
        info = k8s.write_k8s(
            cfg,
            args.dir,
            image=args.image or compose.IMAGE,
            port=args.port,
            storage=args.storage,
            audit_after_s=args.audit_after,
        )
    except compose.ComposeError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print(f"wrote {info['dir']}: {info['nodes']} peer Jobs, an auditor Job, keys/ (private)")
    print("next:")
    print(f"  kubectl apply -k {info['dir']}            # see {info['dir']}/README.md")
    return 0
