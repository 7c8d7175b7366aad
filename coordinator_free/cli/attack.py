"""`cfree attack`: what a coalition of curious nodes reconstructs from its own view logs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from coordinator_free import rundir
from coordinator_free.cli.common import CliError, _table, node_ids

EPILOG = """\
examples:
  cfree run examples/muffliato-ring.toml --set graph.nodes=10 --set protocol.steps=3 --out runs/ring10
  cfree attack runs/ring10 --attackers 0           # node 0 alone: its neighbours and beyond
  cfree attack runs/ring10 --attackers 0,5 --json  # a coalition of two
  cfree run examples/muffliato-ring.toml --set graph.nodes=10 --set protocol.steps=3 \
      --set privacy.sigma=0 --out runs/plain10     # plain gossip: no noise, no privacy
  cfree attack runs/plain10 --attackers 0          # the private values themselves

The attack reads only the attackers' view logs, the run's public config and the attackers'
own keys (for their own inputs, which a member knows and a view log never holds). Where the run
directory holds every node's key (a local `cfree run`), the reconstructed values are compared
with the truth rebuilt from those keys; that comparison never feeds the attack.
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "attack",
        help="reconstruct private inputs from a coalition's view logs (gossip averaging)",
        description="The reconstruction attack on gossip averaging (Muffliato): stack what the "
        "attackers received as linear equations in every node's noisy input (the knowledge "
        "matrix), reduce it exactly to reduced row echelon form, and solve for every node it "
        "determines. A node is reconstructed exactly when the coalition's exact privacy loss "
        "about it (cfree plan/audit) equals local DP: its noisy input is known to float "
        "precision.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument(
        "--attackers",
        required=True,
        metavar="A,B,...",
        help="node ids of the coalition, comma-separated (one id: a single curious node)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable result")


def _own_inputs(run_dir: Path, cfg, ids: list[int], n: int):
    """``(inputs, streams)``: the members' own noisy inputs from their keys (None without keys),
    and the run's streams (None unless every key is there, for the comparison with the truth)."""
    from coordinator_free import seeds
    from coordinator_free.families.averaging import node

    if not rundir.roster_path(run_dir).is_file():
        return None, None
    try:
        streams = seeds.streams_of_run(run_dir, n)
        own = {a: node.start_value(cfg, a, streams.node(a)) for a in ids}
    except (OSError, seeds.StreamsError):
        return None, None
    try:
        for u in range(n):
            streams.node(u).stream(0, u)
    except (OSError, seeds.StreamsError, AttributeError):
        return own, None
    return own, streams


def cmd_attack(args) -> int:
    import networkx as nx

    from coordinator_free.accounting.audit import load_run
    from coordinator_free.families.averaging import attack, node
    from coordinator_free.privacy import muffliato as acct
    from coordinator_free.viewlog import ViewLogError, read_viewlog

    run_dir = args.run_dir
    cfg, plan = load_run(run_dir)
    attack.check_run(run_dir, cfg, plan)
    n = plan.n
    ids = node_ids(args.attackers, "--attackers", n)
    logs = {}
    for a in ids:
        path = rundir.log_path(run_dir, a)
        try:
            logs[a] = read_viewlog(path)
        except FileNotFoundError:
            raise CliError(f"{path} does not exist: attacker {a} has no view log") from None
        except ViewLogError as exc:
            raise CliError(f"{path}: {exc}") from None
    received = attack.from_logs(run_dir, cfg, plan, ids, logs)
    own, streams = _own_inputs(run_dir, cfg, ids, n)
    k = attack.knowledge(plan, ids, received, own)
    out = attack.reconstruct(k, n)
    factors = acct.coalition_factors(plan.W, plan.steps, ids)
    hops = nx.multi_source_dijkstra_path_length(plan.graph, set(ids))
    nodes = []
    for u in range(n):
        if u in ids:
            continue
        row = {
            "node": u,
            "distance": int(hops.get(u, -1)),
            "reconstructed": u in out["values"],
            "factor": float(factors[u]),
            "error": None,
        }
        if u in out["values"]:
            row["value"] = out["values"][u].tolist()
            if streams is not None:
                truth = node.start_value(cfg, u, streams.node(u))
                row["error"] = float(np.max(np.abs(out["values"][u] - truth)))
        nodes.append(row)
    result = {
        "run_dir": str(run_dir),
        "attackers": ids,
        "sigma": cfg.privacy.sigma,
        "steps": plan.steps,
        "own_inputs": own is not None,
        "rank": out["rank"],
        "messages": len(received),
        "nodes": nodes,
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    _print(result, n)
    return 0


def _print(res: dict, n: int) -> None:
    ids = res["attackers"]
    got = [r for r in res["nodes"] if r["reconstructed"]]
    print(
        f"coalition {ids}: {res['messages']} messages received over {res['steps']} steps; "
        f"knowledge matrix rank {res['rank']} of {n}"
    )
    if not res["own_inputs"]:
        print(
            "  (the attackers' own inputs are unknown here: no keys in the run directory; the "
            "attack used the received values only)"
        )
    rows = []
    for r in res["nodes"]:
        err = "" if r["error"] is None else f"{r['error']:.2e}"
        yes = "yes" if r["reconstructed"] else "no"
        rows.append([str(r["node"]), str(r["distance"]), yes, f"{r['factor']:.4f}", err])
    print(_table(["node", "dist", "reconstructed", "exact factor", "max |error|"], rows))
    what = (
        "their private value x itself is known to the coalition (sigma = 0: plain gossip, NO "
        "PRIVACY)"
        if res["sigma"] == 0
        else f"their noisy input x + N(0, {res['sigma']:g}^2) is known to the coalition"
    )
    print(
        f"{len(got)} of {n - len(ids)} other nodes reconstructed: {what} (exact factor 1: the "
        "loss equals local DP, nothing is amplified). What it saw does not determine the others "
        "(exact factor below 1)."
    )
