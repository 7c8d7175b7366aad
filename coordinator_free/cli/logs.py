"""`cfree log dump` (a view log as JSON lines or a table) and `cfree ls` (the runs of a
directory, a line each)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from coordinator_free import rundir
from coordinator_free.cli.common import CliError, _table


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
        epilog="examples:\n  cfree log dump runs/<run-dir>/logs/node-0.vlog\n"
        "  cfree log dump runs/<run-dir>/logs/node-0.vlog --jsonl | head",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d.add_argument("log", type=Path, help="a view log (node-<i>.vlog)")
    d.add_argument("--jsonl", action="store_true", help="one JSON object per record, in full")
    d.set_defaults(func=cmd_log_dump)

    ls = sub.add_parser(
        "ls",
        help="list the runs in a directory (default runs/): protocol, n, status, worst eps",
        description="List the run directories under DIR (default ./runs), newest first: "
        "protocol, number of nodes, status (ok: completed as planned; problems; unfinished: "
        "no summary yet, the run is going on or was stopped), whether the audit found the run "
        "fault-free, and the largest exact pairwise eps it reports.",
        epilog="examples:\n  cfree ls\n  cfree ls runs/ --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
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


def _run_row(path: Path) -> dict:
    row: dict = {"run": path.name, "path": str(path)}
    try:
        from coordinator_free import config as config_mod

        cfg = config_mod.load(rundir.config_path(path))
        row["protocol"] = cfg.protocol.name
        row["n"] = cfg.graph_n()
    except Exception as exc:  # a config this version cannot read: say so, list the run anyway
        row["protocol"] = None
        row["n"] = None
        row["error"] = f"config: {exc}"
    summary = _read_json(path / "summary.json")
    if summary is None:
        row["status"] = "unfinished"
    elif summary.get("completed_as_planned"):
        row["status"] = "ok"
    else:
        row["status"] = f"problems ({len(summary.get('problems') or [])})"
    audit = _read_json(path / "audit.json")
    row["fault_free"] = None if audit is None else audit.get("fault_free")
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
        [r["run"], cell(r["protocol"]), cell(r["n"]), r["status"],
         cell(r["fault_free"], "{}").lower(), cell(r["worst_eps"], "{:.3f}")]
        for r in runs
    ]  # fmt: skip
    print(_table(["run", "protocol", "n", "status", "fault-free", "worst eps"], rows))
    return 0
