"""`cfree keygen`: one private key per node and the public roster."""

from __future__ import annotations

import json
from pathlib import Path

from coordinator_free import config as config_mod
from coordinator_free import rundir
from coordinator_free.cli.common import CliError, examples


def add_parser(sub) -> None:
    p = sub.add_parser(
        "keygen",
        help="write one X25519 private key per node and the public roster",
        description="Generate node keys (PEM, mode 0600) under OUT/keys and the public roster "
        "OUT/roster.json. The roster (ids, addresses, public keys) is the only shared state of a "
        "run; private keys never leave their node.",
        **examples(
            "cfree keygen --config examples/muffliato-ring.toml --out /tmp/ring-keys",
            "cfree keygen --hosts 127.0.0.1:7301,127.0.0.1:7302 --out /tmp/pair --name pair",
        ),
    )
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--nodes", type=int, help="number of nodes (addresses 127.0.0.1, port 0)")
    g.add_argument("--hosts", help="comma-separated host:port list, one per node in id order")
    g.add_argument("--config", help="take the number of nodes from this config")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--name", default="run", help="run name recorded in the roster")
    p.add_argument("--json", action="store_true")


def cmd_keygen(args) -> int:
    from coordinator_free import roster as roster_mod

    if args.hosts:
        hosts = []
        for item in args.hosts.split(","):
            host, _, port = item.strip().rpartition(":")
            if not host or not port.isdigit():
                raise CliError(f"--hosts: {item!r} is not host:port")
            hosts.append((host.strip("[]"), int(port)))
        n = len(hosts)
    elif args.config:
        from coordinator_free.families.averaging.protocol import build_graph_from_config

        cfg = config_mod.load(args.config)
        n = build_graph_from_config(cfg).number_of_nodes()
        hosts = None
    else:
        n = args.nodes
        hosts = None
        if n < 2:
            raise CliError("--nodes must be at least 2")
    out: Path = args.out
    roster_path = rundir.roster_path(out)
    keys = rundir.keys_dir(out)
    if roster_path.exists():
        raise CliError(
            f"{roster_path} already exists; choose another --out (keys are never overwritten)"
        )
    ros = roster_mod.generate_keys(n, keys, hosts=hosts, name=args.name)
    roster_mod.save_roster(roster_path, ros)
    if args.json:
        print(
            json.dumps(
                {
                    "roster": str(roster_path),
                    "keys": str(keys),
                    "nodes": n,
                    "run_id": ros.run_id,
                }
            )
        )
    else:
        print(f"wrote {n} private keys to {keys} (mode 0600) and the public roster {roster_path}")
    return 0
