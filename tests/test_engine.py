"""The sans-IO step engine on its own: events and times in, actions out, no network, no clock."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

from coordinator_free.engine.events import Finish, Inbound, Log, PeerDown, PeerUp, Send
from coordinator_free.engine.step import Exchange, Outcome, StepEngine
from coordinator_free.net.wire import Message

PKG = Path(__file__).resolve().parent.parent / "coordinator_free"


def two_steps(ctx):
    got0 = yield Exchange(0, np.full(2, 1.0))
    got1 = yield Exchange(1, np.full(2, 2.0))
    return Outcome(np.array([float(len(got0)), float(len(got1))]))


def make(program=two_steps, deadline=1.0):
    return StepEngine(
        node=0, neighbours=[1, 2], steps=2, deadline=deadline, log_values=False, dim=2,
        program=program,
    )  # fmt: skip


def value(step, x=0.0):
    return Message(kind="value", round=0, step=step, payload=np.full(2, x))


def kinds(actions):
    return [a.kind for a in actions if isinstance(a, Log)]


def test_exchange_buffers_early_values_misses_at_the_deadline_and_says_goodbye():
    e = make()
    out = e.start(0.0)
    sends = [a for a in out if isinstance(a, Send)]
    assert [(s.peer, s.message.step) for s in sends] == [(1, 0), (2, 0)]
    assert all(s.on_sent.kind == "send" for s in sends)  # logged only once sent
    assert e.next_wakeup() == 1.0
    assert kinds(e.handle(Inbound(2, value(1)), 0.1)) == ["recv"]  # early: buffered
    assert (1, 2) in e.buffered
    assert kinds(e.handle(Inbound(2, value(0)), 0.15)) == ["recv"]
    out = e.handle(Inbound(1, value(0)), 0.2)  # step 0 complete -> step 1, 2's value waiting
    assert kinds(out) == ["recv"] and [s.message.step for s in out if isinstance(s, Send)] == [1, 1]
    assert e.next_wakeup() == 1.2
    assert e.handle(None, 1.1) == []  # nothing happens before the deadline
    out = e.handle(None, 1.2)
    assert kinds(out) == ["miss"] and out[0].fields == {"step": 1, "peer": 1, "reason": "deadline"}
    assert [a.message.kind for a in out if isinstance(a, Send)] == ["done", "done"]
    out = e.handle(Inbound(1, value(1)), 1.3)  # after the end: late
    assert kinds(out) == ["late"] and e.late == 1
    e.handle(Inbound(1, Message(kind="done", round=0, step=2)), 1.4)
    out = e.handle(Inbound(2, Message(kind="done", round=0, step=2)), 1.5)
    assert kinds(out) == ["finished"]
    (fin,) = [a for a in out if isinstance(a, Finish)]
    assert fin.result["estimate"] == [2.0, 1.0] and fin.result["elapsed_s"] == 1.2
    assert fin.result["missed"] == [{"step": 1, "peer": 1, "reason": "deadline"}]
    assert e.finished and e.next_wakeup() is None


def test_duplicates_and_bad_messages_are_logged_not_used():
    e = make()
    e.start(0.0)
    assert kinds(e.handle(Inbound(1, value(0)), 0.0)) == ["recv"]
    assert kinds(e.handle(Inbound(2, value(1)), 0.0)) == ["recv"]
    assert kinds(e.handle(Inbound(2, value(1)), 0.0)) == ["duplicate"]
    assert kinds(e.handle(Inbound(2, value(7)), 0.0)) == ["bad-message"]
    bad = Message(kind="value", round=0, step=0, payload=np.zeros(3))
    assert kinds(e.handle(Inbound(2, bad), 0.0)) == ["bad-message"]


def test_a_down_neighbour_is_waited_for_only_during_the_grace_period():
    def many(ctx):
        for t in range(6):
            yield Exchange(t, np.zeros(2))
        return Outcome(np.zeros(2))

    e = StepEngine(node=0, neighbours=[1], steps=6, deadline=1.0, log_values=False, dim=2,
                   program=many)  # fmt: skip
    e.start(0.0)
    out = e.handle(PeerDown(1, "send failed: PeerGone: gone"), 0.5)
    assert kinds(out) == ["peer-down"] and out[0].fields["reason"].startswith("send failed")
    now = 0.5
    while e.next_wakeup() is not None and now < 10:
        now = e.next_wakeup()
        e.handle(None, now)
    # Steps 0-2 begin within the grace (2 deadlines from 0.5) and wait for their deadline;
    # later ones skip the neighbour at once.
    assert [m["reason"] for m in e.missed] == ["peer-down"] * 6
    assert now == 3.0
    assert e.finished


def test_a_neighbour_back_up_gets_the_current_value_again():
    e = make()
    e.start(0.0)
    e.handle(PeerDown(1, "connection lost"), 0.1)
    out = e.handle(PeerUp(1), 0.2)
    assert kinds(out)[0] == "peer-up"
    assert [(a.peer, a.message.step) for a in out if isinstance(a, Send)] == [(1, 0)]


def test_no_engine_or_family_module_imports_asyncio_or_reads_a_clock():
    clock = {"monotonic", "time", "perf_counter", "now", "utcnow", "time_ns", "monotonic_ns"}
    for path in [*(PKG / "engine").rglob("*.py"), *(PKG / "families").rglob("*.py")]:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = {a.name.split(".")[0] for a in node.names}
                assert not names & {"asyncio", "time", "datetime"}, path
            elif isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] not in {"asyncio", "time", "datetime"}
                if node.module == "coordinator_free.net.transport":
                    raise AssertionError(f"{path} imports the asyncio transport")
            elif isinstance(node, ast.Attribute) and node.attr in clock:
                base = node.value
                assert not (
                    isinstance(base, ast.Name) and base.id in {"time", "datetime", "loop"}
                ), (
                    path,
                    node.lineno,
                )
