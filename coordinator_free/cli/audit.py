"""`cfree audit`: replay a finished run's view logs into per-pair losses."""

from __future__ import annotations

import sys
from pathlib import Path

from coordinator_free.cli.common import CliError, _emit, coalition, examples, node_ids
from coordinator_free.families import family_of


def add_parser(sub) -> None:
    p = sub.add_parser(
        "audit",
        help="replay a finished run's view logs and compute the per-pair losses",
        description="Rebuild the schedule that really happened (missed deadlines, late messages) "
        "from the view logs of RUN_DIR, then compute every observer's loss about every source "
        "with both methods, and check the logs' integrity. A full audit (no --observer) is "
        "written to RUN_DIR/audit.json, with the fingerprint of the logs it read, for `cfree "
        "report`, and who wrote it; an audit.json another auditor wrote (e.g. the auditor job of a "
        "stack, on another host) is kept as audit-<n>.json, never silently replaced. A missing or "
        "damaged log is named and never lowers a loss below the plan's.",
        **examples(
            "cfree run examples/muffliato-ring.toml --out /tmp/ring --quiet --no-audit",
            "cfree audit /tmp/ring",
            "cfree audit /tmp/ring --observers 0,4 --json > /tmp/coalition.json",
        ),
    )
    p.add_argument("run_dir", type=Path, help="run directory written by `cfree run`")
    p.add_argument("--observer", type=int, action="append", help="only this observer (repeatable)")
    p.add_argument(
        "--observers",
        metavar="A,B,...",
        help="a coalition: the exact loss of every other node towards the joint view of these "
        "nodes' logs (comma-separated ids; one row per source; every protocol with peers). A member "
        "without a usable log puts every source at local DP; nothing is written",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--no-write",
        action="store_true",
        help="do not write RUN_DIR/audit.json (it is written only for a full audit anyway)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an audit.json another auditor wrote (another host, container or path to "
        "the run directory); without it that audit is kept as audit-<n>.json",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 if any log is missing, damaged, unfinished or inconsistent",
    )


def print_audit(rep: dict) -> None:
    """The full audit report, rendered by the family of the protocol it audited."""
    family_of(rep["protocol"]).print_audit(rep)


def cmd_audit(args) -> int:
    from coordinator_free.accounting.audit import audit_run, save_audit

    if args.observers is not None:
        if args.observer is not None:
            raise CliError("--observers audits one coalition; drop --observer")
        return _coalition_audit(args)
    rep = audit_run(args.run_dir, observers=args.observer)
    _emit(args, rep, print_audit)
    if args.observer is None and not args.no_write:
        try:
            path = save_audit(args.run_dir, rep, role="cfree audit", force=args.force)
        except OSError as exc:
            print(f"cfree audit: warning: audit.json not written: {exc}", file=sys.stderr)
        else:
            print(f"wrote {path}", file=sys.stderr)
    if args.strict and rep["integrity"]:
        print(
            f"cfree audit: {len(rep['integrity'])} integrity finding(s) (--strict)", file=sys.stderr
        )
        return 1
    return 0


def _coalition_audit(args) -> int:
    from coordinator_free.accounting.audit import coalition_audit, load_run

    ids = node_ids(args.observers, "--observers")
    cfg, plan = load_run(args.run_dir)
    family = family_of(cfg.protocol.name)
    return coalition(args, family, lambda: coalition_audit(args.run_dir, cfg, plan, ids))
