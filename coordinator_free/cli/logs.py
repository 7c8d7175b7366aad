"""`cfree log dump` (a view log as JSON lines or a table) and `cfree ls` (the runs of a
directory, a line each)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from coordinator_free import rundir
from coordinator_free.cli.common import CliError, _table, examples


def add_parser(sub) -> None:
    p = sub.add_parser(
        "log",
        help="read a view log: `cfree log dump LOG` (a record per line; --jsonl for machines)",
        description="Read one node's view log (runs/<run>/logs/node-<i>.vlog).",
    )
    logsub = p.add_subparsers(dest="log_command", metavar="ACTION", required=True)
    d = logsub.add_parser(
        "dump",
        help="every record of a view log, the header first",
        description="Print every record of a view log, the header first: a line per record "
        "(seq, kind, step, peer and the other fields, values shortened), or with --jsonl one "
        "JSON object per record with every field (arrays as lists). A damaged log prints "
        "every record that can still be read, then names each problem and where it is (byte "
        "offset) on stderr, and exits 1.",
        **examples(
            "cfree run examples/muffliato-ring.toml --out /tmp/ring --quiet",
            "cfree log dump /tmp/ring/logs/node-0.vlog",
            "cfree log dump /tmp/ring/logs/node-0.vlog --jsonl | head -3",
        ),
    )
    d.add_argument("log", type=Path, help="a view log (node-<i>.vlog)")
    d.add_argument("--jsonl", action="store_true", help="one JSON object per record, in full")
    d.set_defaults(func=cmd_log_dump)

    ls = sub.add_parser(
        "ls",
        help="list the runs in a directory (default runs/): protocol, n, status, worst eps",
        description="List the run directories under DIR (default ./runs), newest first: "
        "the launcher that made it (local, lab, central, compose, stack, k8s), protocol, number "
        "of nodes, status (ok: completed as planned; problems (k); interrupted: stopped by "
        "Ctrl-C or SIGTERM; unfinished: neither summary nor audit yet, the run is going on "
        "or was stopped without a word), whether the audit found the run fault-free, and the "
        "largest exact pairwise eps it reports. Runs without a launcher's summary (compose, "
        "stack, k8s) are judged from the peers' result files, as cfree run judges its own.",
        **examples(
            "cfree run examples/muffliato-ring.toml --quiet   # into runs/",
            "cfree ls",
            "cfree ls runs/ --json",
        ),
    )
    ls.add_argument("dir", nargs="?", type=Path, default=Path("runs"), help="default: runs/")
    ls.add_argument("--json", action="store_true", help="print the list as JSON")
    ls.set_defaults(func=cmd_ls)


def _plain(value):
    """A record's value as JSON can hold it (arrays as lists, bytes as hex)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, bytes | bytearray):
        return value.hex()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _short(value) -> str:
    if hasattr(value, "shape"):
        return f"<{value.dtype} array {'x'.join(map(str, value.shape)) or 'scalar'}>"
    text = json.dumps(_plain(value))
    return text if len(text) <= 60 else text[:57] + "..."


def cmd_log_dump(args) -> int:
    from coordinator_free.viewlog import read_viewlog

    try:
        log = read_viewlog(args.log)
    except FileNotFoundError:
        raise CliError(f"{args.log}: no such view log") from None
    except IsADirectoryError:
        raise CliError(f"{args.log} is a directory; name a view log (logs/node-<i>.vlog)") from None
    records = ([{"k": "header", **log.header}] if log.header else []) + log.records
    for rec in records:
        if args.jsonl:
            print(json.dumps(_plain(rec)))
            continue
        rest = {k: v for k, v in rec.items() if k not in ("k", "seq", "step", "peer", "t_wall")}
        fields = " ".join(f"{k}={_short(v)}" for k, v in rest.items())
        seq = rec.get("seq", "-")
        print(f"{seq:>6} {rec.get('k', '?'):<14} step={rec.get('step', '-')} "
              f"peer={rec.get('peer', '-')} {fields}")  # fmt: skip
    for prob in log.problems:
        print(f"cfree log dump: {args.log}: byte {prob.offset}: {prob.kind}: {prob.message}",
              file=sys.stderr)  # fmt: skip
    return 1 if log.problems else 0


#: The files an orchestrator's directory holds beside (or around) its run directory.
_ORCHESTRATED = (("docker-compose.yml", "compose"), ("docker-stack.yml", "stack"),
                 ("kustomization.yaml", "k8s"))  # fmt: skip


def run_kind(path: Path, summary: dict | None, roster: dict | None) -> str:
    """Which launcher made the run directory: ``local`` (cfree run), ``lab`` (cfree lab run),
    ``central`` (the central-DP curator), ``compose``, ``stack``, ``k8s``, or ``peers`` (the
    peers wrote it with no launcher's summary and no orchestrator's file around it)."""
    if isinstance(summary, dict):
        if "lab" in summary:
            return "lab"
        if isinstance(summary.get("results"), dict) and summary["results"].get("central"):
            return "central"
        return "local"
    for where in (path, path.resolve().parent):
        for name, kind in _ORCHESTRATED:
            if (where / name).is_file():
                return kind
    hosts = [x.get("host") for x in (roster or {}).get("nodes", []) if isinstance(x, dict)]
    if hosts and all(isinstance(h, str) and h.startswith("peer-") for h in hosts):
        return "compose"  # compose and stack name their services peer-<i>
    if hosts and all(isinstance(h, str) and ".cfree" in h for h in hosts):
        return "k8s"
    if hosts and all(h in ("127.0.0.1", "::1", "localhost") for h in hosts):
        return "local"  # cfree run's loopback roster, stopped before its summary
    return "peers"


def run_status(path: Path, cfg, summary: dict | None) -> str:
    """``ok`` (completed as planned), ``problems (k)``, ``interrupted (k/n results)``,
    ``unfinished (k/n results)`` (neither summary nor audit: going on, or stopped without a
    word), from summary.json when a launcher wrote one, else, once audited, from the peers'
    result files (compose, stack and k8s runs write no summary) by the verdict cfree run
    gives its own runs."""
    from coordinator_free import verdict
    from coordinator_free.families import family_of

    if isinstance(summary, dict):
        if "completed_as_planned" in summary:
            if summary["completed_as_planned"]:
                return "ok"
            return f"problems ({len(summary.get('problems') or [])})"
        res = summary.get("results")
        if isinstance(res, dict) and res.get("central"):
            return "ok"  # the curator is one process: it finished or wrote no summary
        return "problems (summary.json without a verdict)"
    if cfg is None:
        return "unfinished"
    fam = family_of(cfg.protocol.name)
    plan = fam.make_plan(cfg)
    results = verdict.read_results(path, plan.n)
    have = sum(r is not None for r in results.values())
    if rundir.interrupted_path(path).is_file():
        return f"interrupted ({have}/{plan.n} results)"
    if not rundir.audit_path(path).is_file():
        # No summary and no audit yet: the peers (or the auditor) may still be at work.
        return f"unfinished ({have}/{plan.n} results)"
    problems = verdict.problems(plan, results, [], walks=fam.walks(cfg))
    return "ok" if not problems else f"problems ({len(problems)})"


def _run_row(path: Path) -> dict:
    row: dict = {"run": path.name, "path": str(path)}
    cfg = None
    try:
        from coordinator_free import config as config_mod

        cfg = config_mod.load(rundir.config_path(path))
        row["protocol"] = cfg.protocol.name
        row["n"] = cfg.graph_n()
    except Exception as exc:  # a config this version cannot read: say so, list the run anyway
        row["protocol"] = None
        row["n"] = None
        row["error"] = f"config: {exc}"
    summary = _read_json(rundir.summary_path(path))
    row["kind"] = run_kind(path, summary, _read_json(rundir.roster_path(path)))
    try:
        row["status"] = run_status(path, cfg, summary)
    except Exception as exc:  # a run this version cannot judge: list it anyway
        row["status"] = "unknown"
        row.setdefault("error", f"status: {exc}")
    audit = _read_json(rundir.audit_path(path))
    row["fault_free"] = None if not isinstance(audit, dict) else audit.get("fault_free")
    from coordinator_free.accounting.summary import worst_exact_eps

    row["worst_eps"] = worst_exact_eps(audit)
    row["mtime"] = path.stat().st_mtime
    return row


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def cmd_ls(args) -> int:
    base: Path = args.dir
    if not base.is_dir():
        raise CliError(f"{base}: no such directory (run directories are made by `cfree run`)")
    runs = sorted(
        (_run_row(p) for p in base.iterdir() if rundir.config_path(p).is_file()),
        key=lambda r: -r["mtime"],
    )
    if args.json:
        print(json.dumps(runs, indent=1))
        return 0
    if not runs:
        print(f"no runs in {base}")
        return 0

    def cell(v, fmt="{}"):
        return "-" if v is None else fmt.format(v)

    rows = [
        [r["run"], r["kind"], cell(r["protocol"]), cell(r["n"]), r["status"],
         cell(r["fault_free"], "{}").lower(), cell(r["worst_eps"], "{:.3f}")]
        for r in runs
    ]  # fmt: skip
    print(_table(["run", "kind", "protocol", "n", "status", "fault-free", "worst eps"], rows))
    return 0
