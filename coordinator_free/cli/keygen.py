"""``cfree keygen``: keys and the public roster for a cluster of peers."""

from __future__ import annotations

import json
from pathlib import Path

from coordinator_free import config as config_mod
from coordinator_free import rundir
from coordinator_free.cli.common import CliError


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
    if roster_path.exists():
        raise CliError(
            f"{roster_path} already exists; choose another --out (keys are never overwritten)"
        )
    ros = roster_mod.generate_keys(n, out / "keys", hosts=hosts, name=args.name)
    roster_mod.save_roster(roster_path, ros)
    if args.json:
        print(
            json.dumps(
                {
                    "roster": str(roster_path),
                    "keys": str(out / "keys"),
                    "nodes": n,
                    "run_id": ros.run_id,
                }
            )
        )
    else:
        print(
            f"wrote {n} private keys to {out / 'keys'} (mode 0600) and the public roster {roster_path}"
        )
    return 0
