"""`cfree run`: an experiment on a local cluster of peer processes, its summary and audit.

The steps after the peers are done (compare with the simulator, audit, write summary.json, print)
are shared with `cfree lab run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path

from coordinator_free import config as config_mod
from coordinator_free import rundir
from coordinator_free.cli.common import (
    AfterPeers,
    Terminated,
    _cancel_on_sigterm,
    add_config_args,
    examples,
)
from coordinator_free.families import family_of


def add_parser(sub) -> None:
    p = sub.add_parser(
        "run",
        help="run an experiment on a local cluster of peer processes",
        description="Start one peer process per node on loopback, run the protocol over encrypted "
        "TCP channels, then print the estimate error per node, rounds/s, bytes sent and the "
        "pairwise privacy losses the auditor computed from the view logs. Everything lands in a "
        "run directory (config, roster, keys, logs, results, audit).",
        **examples(
            "cfree run examples/muffliato-ring.toml",
            "cfree run examples/complete-sum.toml --json > /tmp/sum.json   # the summary",
            "cfree run examples/muffliato-ring.toml --fault dropout:0.3 --out /tmp/dropout",
        ),
    )
    add_config_args(p, showcase=True)
    p.add_argument("--out", type=Path, help="run directory (default: runs/<name>-<time>-<rand>)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument(
        "--spawn",
        choices=("fork", "exec"),
        default="fork",
        help="how peers start: forked from one process that imported the peer's modules once "
        "(fork, the default: milliseconds per peer), or each as a fresh interpreter (exec: "
        "about half a second of CPU per peer). Either way every peer is its own OS process",
    )
    p.add_argument("--no-audit", action="store_true", help="skip the audit at the end")
    add_memory_arg(p)


def add_memory_arg(p) -> None:
    """The override of the memory check `cfree run` and `cfree lab run` make before any peer
    starts (cluster.local.check_memory)."""
    p.add_argument(
        "--no-memory-check",
        action="store_true",
        help="start the peers even when the estimate of their memory (a measured figure per "
        "peer plus its copy of the plan) exceeds 80%% of the machine's available memory",
    )


def banner(cfg, plan) -> str:
    return family_of(cfg.protocol.name).banner(cfg, plan)


def print_run_summary(cfg, summary: dict, audit: dict | None) -> None:
    family_of(cfg.protocol.name).print_summary(summary, audit)


def simulator_diff(cfg, plan, out: Path, results: dict) -> float | None:
    """max |peer - simulator| over what finished (None if nothing did); the simulator is
    given the run's node streams, rebuilt from its keys."""
    from coordinator_free import seeds

    streams = seeds.streams_of_run(out, len(results["nodes"]))
    return family_of(cfg.protocol.name).simulator_diff(cfg, plan, out, results, streams)


def save_summary(args, out: Path, summary: dict, finished: list) -> dict | None:
    """Audit the run (unless --no-audit or nothing finished) into audit.json, note the verdict
    in the summary and write summary.json; return the audit."""
    from coordinator_free.accounting.audit import audit_run, save_audit

    audit = None
    if not args.no_audit and finished:
        audit = audit_run(out)
        save_audit(out, audit)
        summary["audit"] = {"fault_free": audit["fault_free"], "integrity": audit["integrity"]}
    rundir.write_json(rundir.summary_path(out), summary)
    return audit


def fault_schedule(cfg, *, announce: bool, cut=None, heal=None):
    """The launcher's schedule of the run's declared kill/stop/cut/heal faults."""
    from coordinator_free.cluster.faultsched import FaultSchedule

    return FaultSchedule(
        cfg.fault_plan,
        global_steps=family_of(cfg.protocol.name).walks(cfg),
        cut=cut,
        heal=heal,
        announce=announce,
    )


def conclude(cfg, plan, out: Path, run, schedule) -> tuple[dict, list]:
    """After the peers: the summary every launcher writes (results, the simulator comparison,
    the failed processes, whether the protocol completed as planned and, when not, the
    problems by node, step and cause; the run's faults, also written to faults.json when any
    were declared), and the results of the nodes that finished."""
    from coordinator_free import verdict
    from coordinator_free.cluster import local

    results = verdict.read_results(out, plan.n)
    faults_doc = None
    if cfg.fault_plan:
        peers = {}
        for v, res in results.items():
            inj = res.get("injected") if res is not None else None
            if isinstance(inj, dict) and (
                any((inj.get("link") or {}).values()) or inj.get("nan") or inj.get("signals")
            ):
                peers[v] = inj
        faults_doc = schedule.record(out, peers, results)
    failed = [
        {"node": o.node, "returncode": o.returncode, "error": o.error, "step": o.steps_done}
        for o in run.failed
    ]
    walks = family_of(cfg.protocol.name).walks(cfg)
    problems = verdict.problems(plan, results, failed, walks=walks)
    collected = local.collect_results(cfg, out)
    summary = {
        "run_dir": str(out),
        "wall_s": run.wall_s,
        "results": collected,
        "simulator_max_abs_diff": simulator_diff(cfg, plan, out, collected),
        "failed": [{k: f[k] for k in ("node", "returncode", "error")} for f in failed],
        "completed_as_planned": not problems,
        "problems": problems,
    }
    if faults_doc is not None:
        summary["faults"] = faults_doc
        note = simulator_note(faults_doc, summary["simulator_max_abs_diff"])
        if note:
            summary["simulator_note"] = note
        explain_failures(summary["failed"], problems, faults_doc)
    dropped = getattr(plan, "dropped", ())
    if dropped:
        summary["dropout"] = {
            "p": plan.dropout,
            "steps": len(dropped),
            "sat_out": [sum(v in out for out in dropped) for v in range(plan.n)],
        }
    ref = family_of(cfg.protocol.name).reference(cfg)
    if ref is not None:
        summary["reference"] = ref
    summary["yardstick"] = family_of(cfg.protocol.name).yardstick(cfg, plan, summary)
    return summary, [r for r in collected["nodes"] if r["finished"]]


def simulator_note(faults_doc: dict, diff: float | None) -> str | None:
    """Why the peers differ from the simulator, when declared faults explain it: the
    simulator runs the fault-free plan (dropout is in the plan: it replays that)."""
    others = [s for s in faults_doc.get("declared", []) if not s.startswith("dropout:")]
    if not diff or not others:
        return None
    return (
        f"expected under the declared faults ({', '.join(others)}): the simulator runs the "
        "fault-free plan, the peers ran with the faults"
    )


def _fired(f: dict) -> str:
    """An injected fault: the step it was declared for and when it fired."""
    declared = f["spec"].partition("@")[2].partition("+")[0] or None
    who = f.get("reported_by")
    at = (
        f"fired when node {who} reported step {f['step']}"
        if who is not None
        else (f"fired at step {f['step']}")
    )
    head = f"declared for step {declared}, " if declared is not None else ""
    return f"{f['spec']} ({head}{at}, {f['t_s']:.1f}s)"


def explain_failures(failed: list[dict], problems: list[dict], faults_doc: dict) -> None:
    """Name the declared fault beside the failure it caused (a killed or stopped node's
    process), in ``failed`` and ``problems``, so a reader does not take it for a crash."""
    by_node = {
        f["node"]: _fired(f)
        for f in faults_doc.get("injected", [])
        if "spec" in f and isinstance(f.get("node"), int)
    }
    tagged = [(row, "error") for row in failed] + [
        (row, "cause") for row in problems if str(row.get("cause", "")).startswith("process")
    ]
    for row, key in tagged:
        why = by_node.get(row.get("node"))
        if why is not None:
            row[key] = f"{row[key]} [the declared fault {why}]"


def print_problems(command: str, summary: dict) -> None:
    """The faults injected and the problems of a run (stderr), after its summary."""
    from coordinator_free import verdict

    problems, faults_doc = summary["problems"], summary.get("faults")
    if faults_doc is not None:
        fired = ", ".join(_fired(f) for f in faults_doc["injected"] if "spec" in f)
        if fired:
            print(f"{command}: injected {fired}", file=sys.stderr)
        for f in faults_doc["not_applied"]:
            print(f"{command}: --fault {f['spec']} never applied: {f['reason']}", file=sys.stderr)
        for e in faults_doc["errors"]:
            print(f"{command}: fault injection failed: {e}", file=sys.stderr)
    if problems:
        print(f"{command}: the protocol did not complete as planned:", file=sys.stderr)
        for line in verdict.render(problems):
            print(f"  {line}", file=sys.stderr)


@contextlib.contextmanager
def note_interruption(command: str, out: Path):
    """Leave interrupted.json in the run directory when the launcher is interrupted (Ctrl-C,
    SIGTERM), so `cfree ls` tells a stopped run from one still going."""
    import time

    try:
        yield
    except KeyboardInterrupt:
        with contextlib.suppress(OSError):
            rundir.write_json(
                rundir.interrupted_path(out), {"command": command, "t_wall": time.time()}
            )
        raise


def cmd_run(args) -> int:
    from coordinator_free.cluster import local

    cfg = config_mod.load(args.config, args.set, args.fault, default=config_mod.RUN_DEFAULT_CONFIG)
    family = family_of(cfg.protocol.name)
    plan = family.make_plan(cfg)
    local.check_memory(cfg, plan, spawn=args.spawn, allow=args.no_memory_check)
    out = args.out or local.default_run_dir(cfg)
    local.prepare_run_dir(cfg, out)
    if not args.quiet:
        print(f"run directory: {out}", file=sys.stderr)
        print(family.banner(cfg, plan), file=sys.stderr)
        if cfg.fault_plan:
            print(f"declared faults: {', '.join(cfg.fault_plan.specs)}", file=sys.stderr)
    if not family.has_peers(cfg):
        return _run_central(args, cfg, out)
    schedule = fault_schedule(cfg, announce=not args.quiet)
    term = AfterPeers(peers_done=lambda: len(schedule.finished) >= plan.n)
    with note_interruption("cfree run", out):
        run = asyncio.run(
            _cancel_on_sigterm(
                local.launch_peers(
                    cfg, out, show_progress=not args.quiet, on_event=schedule, spawn=args.spawn
                ),
                after=term,
            )
        )
    with term:
        summary, finished = conclude(cfg, plan, out, run, schedule)
        try:
            with term.interruptible():
                audit = save_summary(args, out, summary, finished)
        except Terminated:
            audit = None
            summary["audit"] = {
                "skipped": "SIGTERM after the peers finished",
                "command": f"cfree audit {out}",
            }
            rundir.write_json(rundir.summary_path(out), summary)
            print(f"cfree run: SIGTERM after the peers finished: summary.json written without "
                  f"the audit (cfree audit {out} makes it)", file=sys.stderr)  # fmt: skip
        if args.json:
            print(json.dumps(summary, indent=1))
        else:
            family.print_summary(summary, audit)
        print_problems("cfree run", summary)
    return 1 if summary["problems"] else 0


def _run_central(args, cfg, out: Path) -> int:
    """A protocol without peers (a trusted-curator baseline): one process holds every shard;
    no view logs. The family runs it and writes its results into the run directory."""
    import secrets
    import time

    from coordinator_free import seeds
    from coordinator_free.accounting.audit import audit_run, save_audit

    family = family_of(cfg.protocol.name)
    t0 = time.monotonic()
    # The curator's noise must be secret: a fresh 256-bit seed, not the public run seed.
    streams = seeds.PublicSeedStreams(int.from_bytes(secrets.token_bytes(32), "big"))
    rundir.results_dir(out).mkdir(exist_ok=True)
    results, plan = family.run_one_process(cfg, out, streams)
    wall = time.monotonic() - t0
    summary = {"run_dir": str(out), "wall_s": wall, "results": results,
               "simulator_max_abs_diff": None, "failed": []}  # fmt: skip
    summary["reference"] = family.reference(cfg)
    summary["yardstick"] = family.yardstick(cfg, plan, summary)
    audit = None
    if not args.no_audit:
        audit = audit_run(out)
        save_audit(out, audit)
        summary["audit"] = {"fault_free": True, "integrity": []}
    rundir.write_json(rundir.summary_path(out), summary)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print_run_summary(cfg, summary, audit)
    return 0
