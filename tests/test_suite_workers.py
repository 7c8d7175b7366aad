"""How many worker processes the test suites run on (tests/conftest.py, pyproject.toml)."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path

from conftest import MAX_WORKERS, QUICK_SUITE, quick_suite_workers

ROOT = Path(__file__).resolve().parent.parent


def test_the_quick_suite_runs_on_one_worker_per_core_up_to_the_cap():
    assert quick_suite_workers(QUICK_SUITE, 2) == 2
    assert quick_suite_workers(f"  {QUICK_SUITE} ", 3) == 3
    assert quick_suite_workers(QUICK_SUITE, 64) == MAX_WORKERS == 4


def test_slow_docker_chosen_tests_and_one_core_run_in_pytests_own_process():
    for markexpr in ("slow", "docker", "slow or docker", "not docker", ""):
        assert quick_suite_workers(markexpr, 8) == 0, markexpr
    assert quick_suite_workers(QUICK_SUITE, 1) == 0
    assert quick_suite_workers(QUICK_SUITE, 8, whole=False) == 0


def test_the_default_options_select_the_quick_suite_and_ask_for_auto_workers():
    opts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    args = shlex.split(opts["addopts"])
    assert args[args.index("-m") + 1] == QUICK_SUITE
    assert args[args.index("-n") + 1] == "auto"
    assert args[args.index("--dist") + 1] == "loadfile"
