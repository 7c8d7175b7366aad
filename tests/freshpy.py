"""Code run in a fresh interpreter, for the tests of what OpenBLAS reads when it loads: one whose
BLAS may use every core (the tests of what holds BLAS to one thread, since the parallel suite's
workers, tests/conftest.py, hold it there themselves, for their own process and every command
they start), or one with an environment of the test's own."""

from __future__ import annotations

import os
import subprocess
import sys


def run_with_free_blas(code: str) -> str:
    """``python -c code`` without ``OPENBLAS_NUM_THREADS`` in its environment; asserts it
    succeeded and returns its standard output, stripped."""
    return run_fresh(code, {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"})


def run_fresh(code: str, env: dict[str, str]) -> str:
    """``python -c code`` in the environment ``env``; asserts it succeeded and returns its
    standard output, stripped (OpenBLAS reads its variables once, when a process loads it)."""
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()
