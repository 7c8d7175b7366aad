"""Signals on real processes: Ctrl-C to a run's process group ends every peer quietly (no
traceback in any peer's stderr)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

EX = Path(__file__).resolve().parent.parent / "examples"


def test_ctrl_c_to_the_process_group_leaves_no_traceback_in_peer_stderr(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "coordinator_free", "run", str(EX / "muffliato-ring.toml"),
         "--set", "graph.nodes=8", "--set", "protocol.steps=100000", "--out", str(out)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
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
