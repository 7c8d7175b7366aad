"""One networked `cfree run` from a test: real peer processes on loopback, JSON summary back."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from coordinator_free.accounting import audit
from tests import gossipviews as gossip


def cfree_run_json(config: Path, overrides: list[str], out: Path, timeout: float = 240) -> dict:
    """`cfree run CONFIG --set ... --out OUT --json --quiet`; asserts it succeeded."""
    sets = [a for o in overrides for a in ("--set", o)]
    proc = subprocess.run(
        [sys.executable, "-m", "coordinator_free", "run", str(config), *sets]
        + ["--out", str(out), "--json", "--quiet"],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def assert_audit_equals_plan(rep: dict, plan, tol: float) -> dict[str, np.ndarray]:
    """Every (observer, source, method) factor of an audit report equals ``cfree plan``'s, to
    ``tol`` (relative and absolute), and every ordered pair is there; returns the plan's factors."""
    F = {m: gossip.plan_factors(plan, m) for m in audit.METHODS}
    checked = 0
    for o in rep["observers"]:
        v = o["observer"]
        for x in o["losses"]:
            want = float(F[x["method"]][v, x["source"]])
            assert x["factor"] == pytest.approx(want, rel=tol, abs=tol), (v, x)
            checked += 1
    assert checked == plan.n * (plan.n - 1) * len(audit.METHODS)
    return F


def assert_killed_node_audited(rep: dict, victim: int) -> None:
    """The audit of a run whose node ``victim`` was killed: not fault-free, the victim named
    unfinished, and every exact loss within local DP (computed on the realised schedule)."""
    assert rep["fault_free"] is False
    assert any(f["node"] == victim and f["kind"] == "unfinished" for f in rep["integrity"])
    ldp = rep["ldp"]["rdp"]
    for o in rep["observers"]:
        for x in o["losses"]:
            if x["method"] == "exact":
                assert 0 <= x["rdp"] <= ldp * (1 + 1e-9), (o["observer"], x)


def cfree(*args, cwd, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m coordinator_free ARGS`` in ``cwd`` with this checkout first on the path; the
    finished process, for the test to judge."""
    repo = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "coordinator_free", *map(str, args)],
        capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def sigint_default() -> None:
    """``preexec_fn`` of a child that a test interrupts with SIGINT: the signal's default
    disposition, whatever this process inherited. A background job of a non-interactive shell
    starts with SIGINT ignored, its children too, and a Python program that starts so never
    raises KeyboardInterrupt: such a child would run on, and the test fail after its timeout."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_gone(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` (any process, not only a child) exits within ``timeout`` seconds:
    a pidfd becomes readable when it ends (an event, not a polling loop)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        return bool(ready)
    finally:
        os.close(fd)
