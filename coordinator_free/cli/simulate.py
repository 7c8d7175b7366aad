"""``cfree simulate``: the same protocol in one process (reference simulator; --run reproduces a
run)."""

from __future__ import annotations

import json

import numpy as np

from coordinator_free import config as config_mod
from coordinator_free import rundir
from coordinator_free.accounting.render import fmt as _fmt
from coordinator_free.accounting.render import table as _table
from coordinator_free.cli.common import (
    CliError,
    _print_learning_summary,
    _token_quality,
    walk_outcomes,
)
from coordinator_free.families import family_of


def cmd_simulate(args) -> int:
    from coordinator_free.sim import simulate

    streams = None
    if args.run is not None:
        from coordinator_free import seeds

        if args.config is not None:
            raise CliError("give either a config or --run, not both")
        cfg = config_mod.load(rundir.config_path(args.run), args.set)
        if not family_of(cfg.protocol.name).has_peers(cfg):
            raise CliError(
                f"{args.run} is a central-dp run: it has no peers to reproduce, and the curator's "
                "noise came from a secret seed that is not kept"
            )
        if not (rundir.roster_path(args.run)).is_file():
            raise CliError(f"{args.run} has no roster.json: not a run directory of `cfree run`")
        n = len(json.loads((rundir.roster_path(args.run)).read_text())["nodes"])
        streams = seeds.streams_of_run(args.run, n)
    else:
        cfg = config_mod.load(args.config, args.set)
    fam = family_of(cfg.protocol.name)
    if fam.learns(cfg):
        return _simulate_learning(args, cfg, streams)
    if fam.walks(cfg):
        return _simulate_walk(args, cfg, streams)
    r = simulate(cfg, streams=streams)
    out = {
        "n": r.plan.n,
        "steps": r.plan.steps,
        "true_mean": r.true_mean.tolist(),
        "finals": r.finals.tolist(),
        "errors": [float(np.linalg.norm(r.finals[v] - r.true_mean)) for v in range(r.plan.n)],
        "mse_by_step": r.history_mse,
    }
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(
            f"n={out['n']} steps={out['steps']} true mean={np.array2string(r.true_mean, precision=4)}"
        )
        rows = [
            [str(v), np.array2string(r.finals[v], precision=4), _fmt(out["errors"][v])]
            for v in range(r.plan.n)
        ]
        print(_table(["node", "final value", "|est - mean|"], rows))
        print("mean squared error by step: " + " ".join(_fmt(x) for x in r.history_mse))
    return 0


def _simulate_walk(args, cfg, streams) -> int:
    from coordinator_free.sim import simulate_walk

    r = simulate_walk(cfg, streams=streams)
    out = {
        "protocol": cfg.protocol.name,
        "n": r.plan.n,
        "hops": r.plan.hops,
        "tokens": walk_outcomes(cfg, r.plan, r.traces),
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{out['protocol']}: n={out['n']}, {out['hops']} hops per token")
    rows = [
        [str(t["token"]), str(t["contributions"]), str(t["end"]["at"]), _token_quality(t)]
        for t in out["tokens"]
    ]
    print(_table(["token", "contributions", "ends at", "result"], rows))
    return 0


def _simulate_learning(args, cfg, streams) -> int:
    from coordinator_free.sim import simulate_learning

    r = simulate_learning(cfg, streams=streams)
    out = {
        "protocol": cfg.protocol.name,
        "n": r.plan.n,
        "rounds": r.plan.rounds,
        "gossip_steps": r.plan.gossip_steps,
        "model": r.plan.model,
        "dim": r.plan.dim,
        "metrics": r.metrics,
        "finals": r.finals.tolist(),
    }
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(
            f"{out['protocol']}: n={out['n']} rounds={out['rounds']} K={out['gossip_steps']} "
            f"model={out['model']} ({out['dim']} parameters)"
        )
        _print_learning_summary({"results": {"nodes": [], "metrics": r.metrics}})
    return 0
