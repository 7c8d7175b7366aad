"""Declared faults on real peer processes: a sample per family (kill, stop, cut; a cut in the
network-namespace lab). The fault matrix in memory (tests/test_fault_matrix.py) covers every
kind x every protocol; these prove that the launcher, the peers' transport and the lab apply
them for real, that the run ends by itself, exits non-zero and names the node, and that the
audit is conservative."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netnslab import lab_name, needs_netns

pytestmark = pytest.mark.slow

EX = Path(__file__).resolve().parent.parent / "examples"
DEADLINE = 1.0

CASES = {
    # family: (config, --set overrides, fault)
    "averaging-kill": (
        EX / "muffliato-ring.toml",
        ["graph.nodes=5", "protocol.steps=20"],
        "kill:2@4",
    ),
    "randomized-stop": (
        EX / "randomized-gossip-ring.toml",
        ["graph.nodes=5", "protocol.steps=40"],
        "stop:2@3+5",
    ),
    "learning-cut": (
        EX / "dsgd-breast-cancer.toml",
        ["graph.nodes=5", "protocol.rounds=10"],
        "cut:2@3",
    ),
    "decor-kill": (EX / "decor-ring.toml", ["graph.nodes=5", "protocol.rounds=10"], "kill:2@3"),
    "ring-cut": (EX / "ring-sum.toml", ["graph.nodes=6"], "cut:2@10"),
    "complete-stop": (
        EX / "complete-sum.toml",
        ["graph.nodes=5", "protocol.hops=60"],
        "stop:2@5+6",
    ),
    "walk-sgd-kill": (EX / "walk-sgd.toml", ["protocol.hops=40"], "kill:2@6"),  # 16 nodes
}


def _cfree(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "coordinator_free", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _check(proc, out: Path, fault: str, elapsed: float, bound: float) -> None:
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "did not complete as planned" in proc.stderr, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["completed_as_planned"] is False
    assert any(p["node"] == 2 for p in summary["problems"]), summary["problems"]
    faults = json.loads((out / "faults.json").read_text())
    assert faults["declared"] == [fault]
    assert [f["spec"] for f in faults["injected"] if "spec" in f] == [fault]
    assert elapsed < bound, (elapsed, bound)
    audit = _cfree("audit", str(out), "--json")
    assert audit.returncode in (0, 1) and "Traceback" not in audit.stderr, audit.stderr
    rep = json.loads(audit.stdout)
    assert rep["fault_free"] is False
    assert rep["faults"]["declared"] == [fault]


@pytest.mark.parametrize("case", list(CASES))
def test_declared_fault_on_real_peers(case, tmp_path):
    config, sets, fault = CASES[case]
    out = tmp_path / "run"
    args = ["run"] + ([str(config)] if config else [])
    for s in [*sets, f"network.deadline_s={DEADLINE}"]:
        args += ["--set", s]
    t0 = time.monotonic()
    proc = _cfree(*args, "--fault", fault, "--out", str(out), "--json", "--quiet")
    elapsed = time.monotonic() - t0
    # Start-up, the fault-free work, and a few deadlines for the fault (silence verdict,
    # grace, goodbye, a stop's seconds): never the launcher's run timeout.
    _check(proc, out, fault, elapsed, bound=90.0)


@needs_netns
def test_a_cut_in_the_lab_is_noticed_and_named(tmp_path):
    out = tmp_path / "run"
    fault = "cut:2@4"
    t0 = time.monotonic()
    proc = _cfree(
        "lab", "run", "--name", lab_name("f"), "--set", "graph.nodes=5", "--set",
        "protocol.steps=20", "--set", f"network.deadline_s={DEADLINE}", "--fault", fault,
        "--out", str(out), "--json", "--quiet",
    )  # fmt: skip
    _check(proc, out, fault, time.monotonic() - t0, bound=120.0)
    summary = json.loads(proc.stdout)
    assert [d["action"] for d in summary["lab"]["links"]] == ["cut"]
