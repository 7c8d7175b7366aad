"""Regenerate the golden contract files of tests/test_contracts.py.

    python3 tests/golden/make_golden.py                 # everything (about a minute and a half)
    python3 tests/golden/make_golden.py --cli           # plan/ and simulate/ only (seconds)
    python3 tests/golden/make_golden.py --runs decor ring-sum

REGENERATE ONLY FOR AN INTENTIONAL CONTRACT CHANGE. These files pin the JSON that users and
scripts read (``cfree plan/simulate/audit --json``, summary.json, results/node-*.json, the view
logs). If a refactor makes tests/test_contracts.py fail, the refactor changed a contract: fix
the code, do not regenerate. When a change is meant (a new key, a corrected value), regenerate,
review ``git diff tests/golden`` line by line, and say in the commit what changed and why.

Every real run is made twice: the two contracts (run-dependent values masked) must be
identical, or this script refuses to write the golden, naming the paths that differed (a value
that depends on the run and is not masked in test_contracts.py). A run's audit must also
equal its plan.

The code measured is that of the checkout this file is in (it goes first on sys.path and on
the peers' PYTHONPATH), whatever copy of coordinator_free is installed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(TESTS.parent), str(TESTS)]  # this checkout; test_contracts, netrun
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(TESTS.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
)

import test_contracts as tc  # noqa: E402


def make_cli_goldens() -> None:
    for case in tc.CLI_CASES:
        path = tc.write_golden(
            case.name, {"argv": list(case.argv), "output": tc.cli_json(case.argv)}
        )
        print(f"wrote {path.relative_to(tc.ROOT)}")


def make_run_golden(case: tc.RunCase) -> None:
    with tempfile.TemporaryDirectory(prefix=f"golden-{case.name}-") as tmp:
        docs = []
        for i in range(2):
            run = tc.do_run(case, Path(tmp) / f"run{i}")
            diffs = tc.audit_plan_diffs(run)
            if diffs:
                raise SystemExit(f"{case.name}: the audit is not the plan:\n" + "\n".join(diffs))
            docs.append(tc.run_contract(run.out, run.summary, run.audit))
    diffs = tc.json_diff(docs[1], docs[0], case.name)
    if diffs:
        raise SystemExit(
            f"{case.name}: two runs differ outside the masked values; mask these in "
            "test_contracts.py (or find out why they vary):\n" + "\n".join(diffs[:60])
        )
    doc = {"config": f"examples/{case.example}.toml", "overrides": list(case.overrides), **docs[0]}
    print(f"wrote {tc.write_golden(f'runs/{case.name}', doc).relative_to(tc.ROOT)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cli", action="store_true", help="only the plan/ and simulate/ goldens")
    p.add_argument(
        "--runs",
        nargs="+",
        metavar="NAME",
        choices=[c.name for c in tc.RUNS],
        help="only these runs",
    )
    args = p.parse_args(argv)
    if args.runs is None:
        make_cli_goldens()
    if not args.cli:
        for case in tc.RUNS:
            if args.runs is None or case.name in args.runs:
                make_run_golden(case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
