"""Command line: ``cfree`` (also ``python -m coordinator_free``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

import numpy as np

from coordinator_free import config as config_mod
from coordinator_free import rundir
from coordinator_free.accounting.render import (  # noqa: F401  (the CLI's text helpers)
    audit_matrix as _audit_matrix,
)
from coordinator_free.accounting.render import (
    fmt as _fmt,
)
from coordinator_free.accounting.render import (
    print_audit as _print_audit,
)
from coordinator_free.accounting.render import (
    print_secldp as _print_secldp,
)
from coordinator_free.accounting.render import (
    table as _table,
)
from coordinator_free.errors import CfreeError
from coordinator_free.families import family_of


class CliError(CfreeError):
    pass


def _add_config_args(p: argparse.ArgumentParser, optional: bool = True) -> None:
    p.add_argument(
        "config",
        nargs="?" if optional else None,
        help="experiment config (TOML); without it the built-in default: Muffliato on a ring of 8"
        if optional
        else "experiment config (TOML)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config key, e.g. --set graph.nodes=16 (repeatable; value parsed as TOML)",
    )


# --------------------------------------------------------------------------------- formatting


def _print_walk_plan(rep: dict) -> None:
    print(
        f"protocol={rep['protocol']}  n={rep['n']}  hops per token={rep['hops']}  "
        f"tokens={rep['tokens']}  cap={rep['cap'] or 'none'}  method={rep['method']}  "
        f"alpha={rep['alpha']}  delta={rep['delta']:g}"
    )
    ldp = rep["ldp"]
    print(
        f"LDP baseline ({ldp['contributions']:g} contributions per node, each seen directly): "
        f"eps={_fmt(ldp['eps'])}"
    )
    print(f"accounting: {rep['accounting']}")
    if rep.get("hidden_sender"):
        h = rep["hidden_sender"]
        print(
            f"for comparison, {h['note']}: worst pair eps={_fmt(h['worst_pair']['eps'])}, "
            f"mean over pairs eps={_fmt(h['mean_over_pairs']['eps'])}"
        )
    if rep.get("source") is not None:
        rows = [
            [str(x["observer"]), str(x["distance"]), _fmt(x["factor"]), _fmt(x["rdp"]),
             _fmt(x["eps"])]
            for x in rep["losses"]
        ]  # fmt: skip
        print(f"losses from source {rep['source']}:")
        print(_table(["observer", "dist", "factor", "rdp", "eps"], rows))
        return
    rows = [
        [str(r["distance"]), str(r["pairs"]), _fmt(r["factor_mean"]), _fmt(r["factor_max"]),
         _fmt(r["eps_mean"]), _fmt(r["eps_max"])]
        for r in rep["by_distance"]
    ]  # fmt: skip
    print(_table(["dist", "pairs", "factor mean", "factor max", "eps mean", "eps max"], rows))
    w = rep["worst_pair"]
    print(f"worst pair: {w['source']} -> {w['observer']}  eps={_fmt(w['eps'])}")
    print(f"mean over pairs: eps={_fmt(rep['mean_over_pairs']['eps'])}")


def _print_plan(rep: dict) -> None:
    if "hops" in rep:
        _print_walk_plan(rep)
        return
    print(
        f"n={rep['n']}  steps={rep['steps']}  accelerated={rep['accelerated']}  "
        f"spectral gap={rep['spectral_gap']:.4g}  method={rep['method']}  alpha={rep['alpha']}  "
        f"delta={rep['delta']:g}"
    )
    if "rounds" in rep:
        print(
            f"protocol={rep['protocol']}  rounds={rep['rounds']}  gossip steps per round="
            f"{rep['gossip_steps']}  sigma={rep['sigma']:g}  sensitivity={rep['sensitivity']:g}"
        )
    if "exchanges_per_node" in rep:
        x = rep["exchanges_per_node"]
        print(
            f"protocol={rep['protocol']}  clock rate={rep['clock_rate']:.4g} exchanges per clock "
            f"unit  exchanges per node: min {x['min']}, mean {x['mean']:.1f}, max {x['max']}  "
            f"Corollary 2 mean bound: factor <= {_fmt(rep['cor2_mean_factor_max'])}"
        )
    print(f"LDP baseline: rdp={_fmt(rep['ldp']['rdp'])}  eps={_fmt(rep['ldp']['eps'])}")
    if rep.get("accounting"):
        print(f"accounting: {rep['accounting']}")
    if "secldp" in rep:
        print(f"sigma_cor={rep['sigma_cor']:g}  Gamma_W={_fmt(rep['gamma_w'])}")
        _print_secldp(rep)
        if rep.get("pairwise", True) is None:
            print("(no pairwise table above 256 nodes)")
            return
        print("pairwise, observer = a curious user:")
    if rep.get("private_graph_bound"):
        pg = rep["private_graph_bound"]
        print(
            f"for comparison, {pg['note']}: worst pair eps={_fmt(pg['worst_pair']['eps'])}, "
            f"mean over pairs eps={_fmt(pg['mean_over_pairs']['eps'])}"
            + (
                ""
                if pg["condition_holds"]
                else " (its condition sigma^2 >= Delta^2 a(a-1)/2 fails)"
            )
        )
    if rep.get("source") is not None:
        rows = [
            [
                str(x["observer"]),
                str(x["distance"]),
                _fmt(x["factor"]),
                _fmt(x["rdp"]),
                _fmt(x["eps"]),
            ]
            for x in rep["losses"]
        ]
        print(f"losses from source {rep['source']}:")
        print(_table(["observer", "dist", "factor", "rdp", "eps"], rows))
        return
    rows = [
        [str(r["distance"]), str(r["pairs"]), _fmt(r["factor_mean"]), _fmt(r["factor_max"]),
         _fmt(r["rdp_mean"]), _fmt(r["rdp_max"]), _fmt(r["eps_max"])]
        for r in rep["by_distance"]
    ]  # fmt: skip
    print(
        _table(
            ["dist", "pairs", "factor mean", "factor max", "rdp mean", "rdp max", "eps max"], rows
        )
    )
    w = rep["worst_pair"]
    print(
        f"worst pair: {w['source']} -> {w['observer']}  rdp={_fmt(w['rdp'])}  eps={_fmt(w['eps'])}"
    )
    m = rep["mean_over_pairs"]
    print(f"mean over pairs: rdp={_fmt(m['rdp'])}  eps={_fmt(m['eps'])}")


# ----------------------------------------------------------------------------------- commands


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


def _token_quality(t: dict) -> str:
    """What a finished token is worth: test accuracy and loss, or its error."""
    if "test_accuracy" in t:
        acc = "-" if t["test_accuracy"] is None else f"{t['test_accuracy']:.4f}"
        return f"test acc {acc}, test loss {_fmt(t['test_loss'])}"
    if "error" in t:
        est = np.array2string(np.asarray(t["estimate"]), precision=3)
        return f"estimate {est}, |estimate - truth| = {_fmt(t['error'])}"
    return "-"


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


async def _cancel_on_sigterm(coro):
    """SIGTERM ends the run like Ctrl-C: the main task is cancelled (so the launcher stops every
    peer it started) and the command ends as interrupted."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    terminated = False

    def on_term() -> None:
        nonlocal terminated
        terminated = True
        task.cancel()

    loop.add_signal_handler(signal.SIGTERM, on_term)
    try:
        return await coro
    except asyncio.CancelledError:
        if terminated:
            raise KeyboardInterrupt from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def _print_learning_summary(summary: dict) -> None:
    res = summary["results"]
    metrics = res["metrics"]
    if res["nodes"]:
        rows = []
        for r in res["nodes"]:
            if not r["finished"]:
                rows.append([str(r["node"]), "-", "-", "-", "-", "did not finish"])
                continue
            acc = "-" if r["test_accuracy"] is None else f"{r['test_accuracy']:.4f}"
            rows.append(
                [str(r["node"]), acc, _fmt(r["test_loss"]), f"{r['steps_per_s']:.1f}",
                 str(r["bytes_sent"]), str(r["missed"])]
            )  # fmt: skip
        print()
        print(_table(["node", "test acc", "test loss", "steps/s", "bytes sent", "missed"], rows))
    if metrics:
        every = max(1, (len(metrics) - 1) // 10)
        shown = [m for m in metrics if m["round"] % every == 0 or m is metrics[-1]]
        rows = [
            [str(m["round"]),
             "-" if m["avg_test_accuracy"] is None else f"{m['avg_test_accuracy']:.4f}",
             _fmt(m["avg_test_loss"]), _fmt(m["avg_train_loss"]),
             "-" if m["node_test_accuracy_min"] is None
             else f"{m['node_test_accuracy_min']:.3f}..{m['node_test_accuracy_max']:.3f}",
             _fmt(m["consensus_distance"])]
            for m in shown
        ]  # fmt: skip
        print("\nnode-average model by round (metrics.jsonl has every round):")
        print(
            _table(
                ["round", "test acc", "test loss", "train loss", "node acc range", "spread"], rows
            )
        )


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


def _emit(args, report: dict, printer) -> int:
    """JSON on stdout with --json, else the human rendering."""
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        printer(report)
    return 0


def cmd_plan(args) -> int:
    from coordinator_free.accounting.audit import calibrate, plan_report

    cfg = config_mod.load(args.config, args.set)
    if args.target_eps is not None:
        if args.source is not None:
            raise CliError("--target-eps calibrates over all pairs; drop --source")
        rep = calibrate(
            cfg, args.target_eps, method=args.method, budget=args.budget, decor_pair=args.pair
        )
        return _emit(args, rep, _print_calibration)
    return _emit(args, plan_report(cfg, source=args.source, method=args.method), _print_plan)


def _print_decor_calibration(rep: dict) -> None:
    print(
        f"decor: sigma = {rep['sigma']:.6g}, sigma_cor = {rep['sigma_cor']:.6g} ({rep['choice']} "
        f"of {len(rep['pairs'])} pairs) meet eps <= {rep['target_eps']:g} at delta = "
        f"{rep['delta']:g} over {rep['rounds']} rounds, {rep['budget']}"
    )
    print(
        f"  sigma ranges over ({rep['sigma_cdp_floor']:.6g}, {rep['sigma_ldp']:.6g}]: central-DP "
        "noise per node at the floor, local DP at the top"
    )
    for k in ("low", "mid", "high"):
        x = rep[k]
        print(f"  {k:>4}: sigma = {x['sigma_cdp']:.6g}, sigma_cor = {x['sigma_cor']:.6g}")
    _print_secldp(rep)
    print(
        f"use it: --set privacy.sigma={rep['sigma']:.6g} --set privacy.sigma_cor={rep['sigma_cor']:.6g}"
    )


def _print_calibration(rep: dict) -> None:
    if "secldp" in rep:  # DECOR's search is over (sigma, sigma_cor) pairs
        _print_decor_calibration(rep)
        return
    b = rep["binding"]
    what = (
        f"binding pair {b['source']} -> {b['observer']}"
        if rep["budget"] == "worst"
        else "binding: the mean over pairs"
    )
    print(
        f"{rep['protocol']}: sigma = {rep['sigma']:.6g} meets eps <= {rep['target_eps']:g} at "
        f"delta = {rep['delta']:g} ({rep['method']} method, {rep['budget']} budget, "
        f"sensitivity {rep['sensitivity']:g}, {rep['steps']} "
        f"{'hops' if family_of(rep['protocol']).walks(None) else 'exchange steps'})"
    )
    print(f"  {what}: rdp = {_fmt(b.get('rdp'))}, eps = {_fmt(b['eps'])}")
    w, m = rep["worst_pair"], rep["mean_over_pairs"]
    print(f"  worst pair {w['source']} -> {w['observer']}: eps = {_fmt(w['eps'])}")
    print(
        f"  mean over pairs: eps = {_fmt(m['eps'])};  local DP at this sigma: eps = {_fmt(rep['ldp']['eps'])}"
    )
    if rep.get("accounting"):
        print(f"  accounting: {rep['accounting']}")
    print(f"use it: --set privacy.sigma={rep['sigma']:.6g}")


def cmd_audit(args) -> int:
    from coordinator_free.accounting.audit import audit_run

    rep = audit_run(args.run_dir, observers=args.observer)
    _emit(args, rep, _print_audit)
    if args.strict and rep["integrity"]:
        print(
            f"cfree audit: {len(rep['integrity'])} integrity finding(s) (--strict)", file=sys.stderr
        )
        return 1
    return 0


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


def walk_outcomes(cfg, plan, traces) -> list[dict]:
    """Per token: where it ended, its final value, and what it is worth (|estimate - truth| for
    sums and histograms, test accuracy and loss for models)."""
    from coordinator_free.families.walk import protocol as wk

    task = None
    if plan.kind == "sgd":
        from coordinator_free.families.learning import protocol as lp

        task = lp.make_task(cfg, plan.n)
    out = []
    for t in traces:
        row = {
            "token": t.token,
            "end": {"how": "completed", "at": t.holders[-1], "step": len(t.holders)},
            "final": t.final.tolist(),
            "contributions": int(np.sum(t.data)),
        }
        if task is not None:
            ds, model = task.dataset, task.model
            row["test_accuracy"] = model.accuracy(t.final, ds.X_test, ds.y_test)
            row["test_loss"] = float(model.loss(t.final, ds.X_test, ds.y_test))
        else:
            est = wk.estimate(plan, t.final)
            row.update(estimate=est.tolist(), truth=t.truth.tolist(),
                       error=float(np.linalg.norm(est - t.truth)))  # fmt: skip
        out.append(row)
    return out


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


def cmd_peer(args) -> int:
    from coordinator_free.peer.runner import peer_main

    return peer_main(args)


def cmd_lan(args) -> int:
    from coordinator_free.cluster import lan

    return lan.COMMANDS[args.command](args)
