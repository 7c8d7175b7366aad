"""Fixtures shared by several test modules (helpers shared as plain functions and constants
live in the helper modules beside the tests: ci.py, netnslab.py, memcases.py, ...)."""

from __future__ import annotations

import os
import shutil
import sys

#: In a worker of the parallel quick suite (one worker per core), BLAS and LAPACK on one thread,
#: for this process and the commands its tests start: OpenBLAS's threads, two a worker on two
#: cores, spun against the other worker's (the fast path's test of few sources took 31 s on a
#: worker, 0.9 s on one thread). Before numpy loads OpenBLAS, which reads it once; the results
#: do not depend on it (docs/architecture.md: what must agree bit for bit runs on one thread).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if "numpy" in sys.modules:  # pragma: no cover - a plugin loaded OpenBLAS first
        import scipy.linalg  # noqa: F401 - its own OpenBLAS, under the limit too

        from coordinator_free import blas

        blas.one_thread_for_process()

import pytest
from ci import unavailable
from netnslab import why_no_netns

from coordinator_free import forkwork

#: The marker expression of the quick default suite (pyproject.toml's ``addopts``).
QUICK_SUITE = "not slow and not docker"
#: At most this many worker processes for the quick suite: each test file runs whole on one
#: worker (``--dist loadfile``), and many start real peer processes of their own.
MAX_WORKERS = 4


def quick_suite_workers(markexpr: str, cores: int, whole: bool = True) -> int:
    """Worker processes for ``-n auto`` (0: the tests run in pytest's own process): one per core
    up to :data:`MAX_WORKERS` for the quick default suite run whole (``whole``: no argument, or
    only directories); none for chosen files or tests (starting the workers would take longer
    than most of them), for the slow and docker suites (their runs time themselves, use every
    core or build images and swarms) and on one core."""
    if markexpr.strip() != QUICK_SUITE or cores < 2 or not whole:
        return 0
    return min(cores, MAX_WORKERS)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject.toml): :func:`quick_suite_workers`, unless
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` says how many."""
    asked = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").strip()
    if asked:
        if not asked.isdigit():
            raise pytest.UsageError(
                f"PYTEST_XDIST_AUTO_NUM_WORKERS={asked!r}: expected a number of worker processes"
            )
        return int(asked)
    whole = all(os.path.isdir(a) for a in config.args)
    return quick_suite_workers(config.option.markexpr or "", forkwork.cores(), whole)


@pytest.fixture
def _netns_available() -> None:
    """Network namespaces can be made here (root and iproute2's `ip`)."""
    unavailable(why_no_netns())


@pytest.fixture
def _ip_available() -> None:
    unavailable(None if shutil.which("ip") else "needs iproute2's `ip` command")
