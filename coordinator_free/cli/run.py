"""``cfree run``: launch the peers of a config (or the central curator), collect, compare with the
simulator, audit, print the summary."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import numpy as np

from coordinator_free import config as config_mod
from coordinator_free import rundir
from coordinator_free.accounting.render import fmt as _fmt
from coordinator_free.accounting.render import print_secldp as _print_secldp
from coordinator_free.accounting.render import table as _table
from coordinator_free.cli.common import (
    _cancel_on_sigterm,
    _print_learning_summary,
    _token_quality,
    walk_outcomes,
)
from coordinator_free.families import family_of


def simulator_diff(cfg, plan, out: Path, results: dict) -> float | None:
    """max |peer - simulator| over the nodes that finished (None if none did); the simulator is
    given the run's node streams, rebuilt from its keys."""
    from coordinator_free import seeds
    from coordinator_free.cluster.local import models_path
    from coordinator_free.sim import simulate, simulate_learning

    streams = seeds.streams_of_run(out, len(results["nodes"]))
    fam = family_of(cfg.protocol.name)
    if fam.walks(cfg):
        return _walk_against_simulator(cfg, plan, results, streams)
    finished = [r for r in results["nodes"] if r["finished"]]
    if not finished:
        return None
    if fam.learns(cfg):
        sim_models = simulate_learning(cfg, streams=streams).models  # (R+1, n, dim)
        return max(
            float(np.max(np.abs(np.load(models_path(out, r["node"])) - sim_models[:, r["node"]])))
            for r in finished
        )
    sim = simulate(cfg, streams=streams)
    return max(
        float(np.max(np.abs(np.asarray(r["estimate"]) - sim.finals[r["node"]]))) for r in finished
    )


def save_summary(args, out: Path, summary: dict, finished: list) -> dict | None:
    """Audit the run (unless --no-audit or nothing finished) into audit.json, note the verdict
    in the summary and write summary.json; return the audit."""
    from coordinator_free.accounting.audit import audit_run, write_json

    audit = None
    if not args.no_audit and finished:
        audit = audit_run(out)
        write_json(rundir.audit_path(out), audit)
        summary["audit"] = {"fault_free": audit["fault_free"], "integrity": audit["integrity"]}
    write_json(rundir.summary_path(out), summary)
    return audit


def cmd_run(args) -> int:
    from coordinator_free.cluster import local
    from coordinator_free.families import make_plan

    cfg = config_mod.load(args.config, args.set)
    plan = make_plan(cfg)
    out = args.out or local.default_run_dir(cfg)
    local.prepare_run_dir(cfg, out)
    if not args.quiet:
        print(f"run directory: {out}", file=sys.stderr)
        print(_run_banner(cfg, plan), file=sys.stderr)
    if not family_of(cfg.protocol.name).has_peers(cfg):
        return _run_central(args, cfg, out)
    run = asyncio.run(
        _cancel_on_sigterm(local.launch_peers(cfg, out, show_progress=not args.quiet))
    )
    results = local.collect_results(cfg, out)
    finished = [r for r in results["nodes"] if r["finished"]]
    match = simulator_diff(cfg, plan, out, results)
    summary = {
        "run_dir": str(out),
        "wall_s": run.wall_s,
        "results": results,
        "simulator_max_abs_diff": match,
        "failed": [
            {"node": o.node, "returncode": o.returncode, "error": o.error} for o in run.failed
        ],
    }
    audit = save_summary(args, out, summary, finished)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        _print_run_summary(summary, audit)
    if run.failed:
        for o in run.failed:
            print(
                f"cfree run: node {o.node} failed (exit {o.returncode}): {o.error}", file=sys.stderr
            )
        return 1
    return 0


def _walk_against_simulator(cfg, plan, results: dict, streams) -> float | None:
    """Add to every completed token the simulator's verdict on it (estimate, truth and error,
    or test accuracy); return max |peer - simulator| over the completed tokens (None if none
    completed). The truth is that of the fault-free walk: meaningful when the walk completed as
    planned (a re-routed walk sums other contributions)."""
    from coordinator_free.sim import simulate_walk

    sim = simulate_walk(cfg, streams=streams)
    ref = walk_outcomes(cfg, plan, sim.traces)
    diffs = []
    for t in results["tokens"]:
        if "final" not in t:
            continue
        trace = sim.traces[t["token"]]
        t["simulator_max_abs_diff"] = float(
            np.max(np.abs(np.asarray(t["final"], dtype=np.float64) - trace.final))
        )
        diffs.append(t["simulator_max_abs_diff"])
        if t["simulator_max_abs_diff"] == 0:
            keep = ("test_accuracy", "test_loss", "estimate", "truth", "error")
            t.update({k: v for k, v in ref[t["token"]].items() if k in keep})
        elif plan.kind == "sgd":  # a re-routed walk: its model is still a model to test
            import dataclasses

            mine = walk_outcomes(
                cfg, plan, [dataclasses.replace(trace, final=np.asarray(t["final"], dtype=float))]
            )[0]
            t.update(test_accuracy=mine["test_accuracy"], test_loss=mine["test_loss"])
    return max(diffs) if diffs else None


def _print_walk_summary(summary: dict) -> None:
    res = summary["results"]
    rows = []
    for t in res["tokens"]:
        e = t["end"]
        where = f"{e['how']} at node {e['at']}, step {e['step']}"
        rows.append([str(t["token"]), where, _token_quality(t)])
    print()
    print(_table(["token", "walk", "result"], rows))
    fin = [r for r in res["nodes"] if r["finished"]]
    lost = [r["node"] for r in res["nodes"] if not r["finished"]]
    rer = sum(len(r["reroutes"]) for r in fin)
    print(
        f"{res['hops']} hops per token; {len(fin)}/{len(res['nodes'])} nodes finished"
        + (f" (no result from {lost})" if lost else "")
        + f"; {rer} re-route(s); total bytes sent {sum(r['bytes_sent'] for r in fin)}; "
        f"wall time {summary['wall_s']:.2f}s"
    )


def _run_banner(cfg, plan) -> str:
    return family_of(cfg.protocol.name).banner(cfg, plan)


def _run_central(args, cfg, out: Path) -> int:
    """The trusted-curator baseline: one process holds every shard (no peers, no view logs)."""
    import secrets
    import time

    from coordinator_free import seeds
    from coordinator_free.accounting.audit import audit_run, write_json
    from coordinator_free.sim import simulate_learning

    t0 = time.monotonic()
    # The curator's noise must be secret: a fresh 256-bit seed, not the public run seed.
    streams = seeds.PublicSeedStreams(int.from_bytes(secrets.token_bytes(32), "big"))
    sim = simulate_learning(cfg, streams=streams)
    wall = time.monotonic() - t0
    rundir.results_dir(out).mkdir(exist_ok=True)
    np.save(rundir.central_models_path(out), sim.models[:, 0], allow_pickle=False)
    from coordinator_free.cluster.local import write_jsonl

    write_jsonl(rundir.metrics_path(out), sim.metrics)
    final = sim.metrics[-1]
    results = {
        "protocol": cfg.protocol.name,
        "rounds": sim.plan.rounds,
        "gossip_steps": 0,
        "steps": 0,
        "nodes": [],
        "metrics": sim.metrics,
        "central": {
            "test_loss": final["avg_test_loss"],
            "test_accuracy": final["avg_test_accuracy"],
        },
    }
    summary = {"run_dir": str(out), "wall_s": wall, "results": results,
               "simulator_max_abs_diff": None, "failed": []}  # fmt: skip
    audit = None
    if not args.no_audit:
        audit = audit_run(out)
        write_json(rundir.audit_path(out), audit)
        summary["audit"] = {"fault_free": True, "integrity": []}
    write_json(rundir.summary_path(out), summary)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        _print_run_summary(summary, audit)
    return 0


def _print_run_summary(summary: dict, audit: dict | None) -> None:
    res = summary["results"]
    if "tokens" in res:
        _print_walk_summary(summary)
        _print_run_footer(summary, audit)
        return
    if "metrics" in res:
        _print_learning_summary(summary)
        _print_run_footer(summary, audit)
        return
    nodes = res["nodes"]
    print(f"\ntrue mean: {np.array2string(np.asarray(res['true_mean']), precision=4)}")
    rows = []
    for r in nodes:
        if not r["finished"]:
            rows.append([str(r["node"]), "-", "-", "-", "-", "did not finish"])
            continue
        rows.append(
            [str(r["node"]), _fmt(r["error"]), f"{r['steps_per_s']:.1f}", str(r["bytes_sent"]),
             str(r["bytes_received"]), str(r["missed"])]
        )  # fmt: skip
    print(_table(["node", "|est - mean|", "rounds/s", "bytes sent", "bytes recv", "missed"], rows))
    fin = [r for r in nodes if r["finished"]]
    if fin:
        print(
            f"mean error {_fmt(float(np.mean([r['error'] for r in fin])))}, "
            f"total bytes sent {sum(r['bytes_sent'] for r in fin)}, "
            f"wall time {summary['wall_s']:.2f}s"
        )
    _print_run_footer(summary, audit)


def _print_run_footer(summary: dict, audit: dict | None) -> None:
    d = summary["simulator_max_abs_diff"]
    if d is not None:
        print(
            f"reference simulator: max |peer - simulator| = {d:.3g}{' (bitwise equal)' if d == 0 else ''}"
        )
    if audit is not None:
        print()
        _print_audit_compact(audit)
    print(f"\nrun directory: {summary['run_dir']}  (details: cfree audit {summary['run_dir']})")


def _print_audit_compact(audit: dict) -> None:
    """PNDP table by graph distance: mean and max eps over pairs, both methods."""
    by: dict[tuple[str, int], list[float]] = {}
    for o in audit["observers"]:
        for x in o["losses"]:
            by.setdefault((x["method"], x["distance"]), []).append(x["eps"])
    dists = sorted({d for _, d in by})
    rows = []
    for d in dists:
        e = by.get(("exact", d), [0.0])
        p = by.get(("paper", d), [0.0])
        rows.append(
            [
                str(d),
                str(len(e)),
                _fmt(float(np.mean(e))),
                _fmt(max(e)),
                _fmt(float(np.mean(p))),
                _fmt(max(p)),
            ]
        )
    print(
        f"pairwise network DP (eps at delta={audit['delta']:g}, from the view logs; "
        f"LDP would be eps={_fmt(audit['ldp']['eps'])}):"
    )
    print(_table(["dist", "pairs", "exact mean", "exact max", "paper mean", "paper max"], rows))
    if "secldp" in audit:
        print("(observer = a curious user who sees every message)")
        _print_secldp(audit)
    if audit["integrity"]:
        print(f"integrity findings: {len(audit['integrity'])} (see cfree audit)")
