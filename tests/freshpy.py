"""Code run in a fresh interpreter whose BLAS may use every core: for the tests of what holds
BLAS to one thread, since the parallel suite's workers (tests/conftest.py) hold it there
themselves, for their own process and every command they start."""

from __future__ import annotations

import os
import subprocess
import sys


def run_with_free_blas(code: str) -> str:
    """``python -c code`` without ``OPENBLAS_NUM_THREADS`` in its environment; asserts it
    succeeded and returns its standard output, stripped."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()
