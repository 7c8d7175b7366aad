"""Progress output: the planner's terminal progress line and the peer's thinned step events."""

from __future__ import annotations

import io
import json
import os

import networkx as nx
import numpy as np
import pytest

from coordinator_free import graphs, progress
from coordinator_free.cli import main
from coordinator_free.peer.runner import Progress
from coordinator_free.privacy import muffliato


def _ring_w(n: int) -> np.ndarray:
    return graphs.gossip_matrix(nx.cycle_graph(n))


def test_planner_ticks_every_observer_when_reporting():
    buf = io.StringIO()
    w = _ring_w(12)
    with progress.reporting("plan", buf, every_s=0.0, enabled=True):
        muffliato.plan_factors(w, 5, False, method="exact", symmetry=False)  # every observer
    text = buf.getvalue()
    shown = [x for x in text.split("\r") if x.startswith("plan: ")]
    assert len(shown) == 12
    assert shown[-1].startswith("plan: exact loss, observer 12/12")
    assert text.endswith("\r\033[K")  # the line is cleared at the end


def test_reporting_is_silent_off_a_terminal_and_ticks_are_free_outside_it():
    buf = io.StringIO()  # not a terminal
    with progress.reporting("plan", buf):
        muffliato.plan_factors(_ring_w(8), 4, False, method="paper")
    assert buf.getvalue() == ""
    progress.tick(1, 2, "nothing listening")  # outside any block: a no-op


def test_reporting_throttles_but_always_shows_the_last_unit():
    buf = io.StringIO()
    with progress.reporting("x", buf, every_s=3600.0, enabled=True):
        for i in range(1, 101):
            progress.tick(i, 100, "unit")
    shown = [x for x in buf.getvalue().split("\r") if x.startswith("x: ")]
    assert [s.split()[2] for s in shown] == ["1/100", "100/100"]


def _events(every_s: float, steps: int) -> list[dict]:
    r, w = os.pipe()
    prog = Progress(w, every_s)
    prog.emit(event="listening", node=0, port=1)
    for t in range(1, steps + 1):
        prog.emit(event="step", node=0, step=t, of=steps)
    prog.emit(event="finished", node=0, elapsed_s=1.0)
    prog.close()
    with os.fdopen(r) as f:
        return [json.loads(line) for line in f]


def test_peer_progress_thins_step_events_only_when_asked():
    every = _events(0.0, 200)  # the local launcher's mode: every event
    assert [e["step"] for e in every if e["event"] == "step"] == list(range(1, 201))
    thin = _events(3600.0, 200)  # the peer image's mode
    assert [e["event"] for e in thin] == ["listening", "step", "step", "finished"]
    assert [e["step"] for e in thin if e["event"] == "step"] == [1, 200]


@pytest.mark.parametrize("bad", ["-1", "soon", "1e9"])
def test_progress_every_is_validated(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["peer", "--config", "c", "--roster", "r", "--key", "k", "--id", "0", "--out", "o",
              "--progress-every", bad])  # fmt: skip
    assert exc.value.code == 2
    assert "--progress-every" in capsys.readouterr().err


def test_the_launcher_thins_step_events_unless_something_acts_on_steps(tmp_path):
    """Without faults (or a callback that acts on steps) peers report a step at most every
    STEP_EVENTS_S; a declared kill, or a test's own callback, gets every step."""
    from coordinator_free import config
    from coordinator_free.cli.run import fault_schedule
    from coordinator_free.cluster import local

    argv = local.peer_argv(tmp_path, 3, local.STEP_EVENTS_S)
    assert argv[argv.index("--progress-every") + 1] == f"{local.STEP_EVENTS_S:g}"
    assert "--progress-every" not in local.peer_argv(tmp_path, 3)
    quiet = fault_schedule(config.load(None), announce=False)
    assert quiet.needs_steps is False
    killing = fault_schedule(config.load(None, faults=["kill:2@3"]), announce=False)
    assert killing.needs_steps is True


def test_thinned_step_events_keep_the_last_step_and_every_other_event():
    r, w = os.pipe()
    p = Progress(w, every_s=3600.0)
    for s in range(1, 6):
        p.emit(event="step", node=0, step=s, of=5)
    p.emit(event="finished", node=0)
    p.close()
    with os.fdopen(r) as f:
        events = [json.loads(line) for line in f]
    assert [(e["event"], e.get("step")) for e in events] == [
        ("step", 1),
        ("step", 5),
        ("finished", None),
    ]


def test_the_run_progress_line_names_whom_it_waits_for_and_since_when() -> None:
    """cluster/local.py's line: the nodes at the lowest step that have been silent, for how
    long, and the nodes whose process ended before they finished (no clock: times are set)."""
    from coordinator_free.cluster.local import ProgressDisplay

    d = ProgressDisplay(4, 10, enabled=False)
    for v in range(4):
        d.update({"event": "connected", "node": v})
        d.update({"event": "step", "node": v, "step": 5 if v != 1 else 4})
    now = max(d.seen) + 0.5
    assert d.waiting(now) == ([], 0.0)  # nobody silent long enough
    d.seen[1] = now - 12.0
    assert d.waiting(now) == ([1], 12.0)
    assert "waiting for node 1 (silent for 12s)" in d.waiting_text(now)
    d.update({"event": "exited", "node": 1})  # killed: no longer waited for
    later = d.seen[1] + 0.5
    assert d.waiting(later)[0] == [] and d.gone() == [1]
    assert "exited early: 1 at step 4" in d.waiting_text(later)
    d.update({"event": "finished", "node": 0})
    d.update({"event": "exited", "node": 0})
    assert d.gone() == [1]  # a node that finished and exited is not "gone"


def test_the_audit_of_a_run_shows_its_progress_with_the_environment_variable(
    tmp_path, monkeypatch, capsys
):
    """Not a terminal, but CFREE_PROGRESS=1: the audit says what it is doing (the logs it
    reads, the observers whose losses it computes), on stderr only, and clears the line."""
    from memcases import ALL, DEADLINE

    from coordinator_free import config
    from coordinator_free.accounting.audit import audit_run
    from coordinator_free.inmemory import run_config
    from tests.memrun import write_run_dir

    path, sets = ALL["dsgd"]
    cfg = config.load(path, [*sets, f"network.deadline_s={DEADLINE}"])
    out = write_run_dir(cfg, run_config(cfg, seed=3), tmp_path / "run")
    capsys.readouterr()
    monkeypatch.setenv("CFREE_PROGRESS", "1")
    rep = audit_run(out)
    cap = capsys.readouterr()
    assert cap.out == ""
    assert "audit: reading view log 0/6" in cap.err
    assert "audit: paper loss, observer 12/12" in cap.err  # the last tick is always shown
    assert cap.err.endswith("\r\x1b[K")
    monkeypatch.delenv("CFREE_PROGRESS")
    assert audit_run(out)["observers"] == rep["observers"]
    assert capsys.readouterr().err == ""
