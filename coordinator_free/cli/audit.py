"""``cfree audit``: the losses every observer experienced, from a run directory's view logs."""

from __future__ import annotations

import sys

from coordinator_free.accounting.render import print_audit as _print_audit
from coordinator_free.cli.common import _emit


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
