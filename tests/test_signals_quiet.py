"""Signals on real processes: Ctrl-C to a run's process group ends every peer quietly (no
traceback in any peer's stderr)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from netrun import sigint_default

pytestmark = pytest.mark.slow

EX = Path(__file__).resolve().parent.parent / "examples"


def test_ctrl_c_to_the_process_group_leaves_no_traceback_in_peer_stderr(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "coordinator_free", "run", str(EX / "muffliato-ring.toml"),
         "--set", "graph.nodes=8", "--set", "protocol.steps=100000", "--out", str(out)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=sigint_default,  # the test interrupts it
    )  # fmt: skip
    try:
        seen = ""
        while "connected 8/8" not in seen:  # every peer is running its steps
            ch = proc.stderr.read(1)
            assert ch, seen
            seen += ch
        os.killpg(proc.pid, signal.SIGINT)
        rest = proc.stderr.read()
        assert proc.wait(timeout=60) == 130, rest
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "interrupted" in rest
    logs = sorted((out / "logs").glob("node-*.stderr"))
    assert len(logs) == 8
    for f in logs:
        text = f.read_text()
        assert "Traceback" not in text and "KeyboardInterrupt" not in text, (f.name, text)


def test_sigterm_after_the_peers_finished_is_a_clean_exit_with_a_summary(tmp_path):
    """SIGTERM once every peer finished (the launcher is auditing): summary.json is written
    (without the audit), the command says so and exits as the run went (0), never rc -15."""
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "coordinator_free", "run", str(EX / "muffliato-gd-breast-cancer.toml"),
         "--set", "graph.nodes=8", "--set", "protocol.rounds=300", "--out", str(out)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        seen = ""
        while "finished 8/8" not in seen:
            ch = proc.stderr.read(1)
            assert ch, seen
            seen += ch
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()
        assert proc.wait(timeout=120) == 0, rest
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed_as_planned"] is True
    if "skipped" in summary.get("audit", {}):  # the SIGTERM came during the audit
        assert "SIGTERM after the peers finished: summary.json written" in rest
        assert summary["audit"]["command"] == f"cfree audit {out}"
    assert "Traceback" not in rest
