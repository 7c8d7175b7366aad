"""The peer's driver: events taken in callbacks while its task is idle (``PeerNet.idle``), and
what goes back to the task (a send that must wait, a failure, the finish, an error)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import numpy as np
import pytest

from coordinator_free.engine.events import Finish, Inbound, Log, PeerDown, Send
from coordinator_free.net.transport import _EventQueue
from coordinator_free.net.wire import Message
from coordinator_free.peer import runner
from coordinator_free.viewlog import read_viewlog


def _value(peer: int, step: int) -> Inbound:
    return Inbound(peer, Message("value", 0, step, np.zeros(2)))


async def test_idle_hands_events_to_the_sink_in_arrival_order_and_flushes_once_per_batch():
    q = _EventQueue()
    taken, flushed = [], []

    def sink(ev):
        taken.append(ev.message.step)
        return "stop" if ev.message.step == 4 else None

    async def arrive():
        # Each yield to the loop lets the sink take what was put before it: the batches are
        # the puts between two yields, whatever the clock says.
        await asyncio.sleep(0)
        q.put(_value(1, 0))
        q.put(_value(2, 1))  # the same turn of the loop: one batch, one flush
        await asyncio.sleep(0)
        q.put(_value(1, 2))
        await asyncio.sleep(0)
        for step in (3, 4, 5):
            q.put(_value(1, step))

    feeder = asyncio.ensure_future(arrive())
    back = await q.idle(10.0, sink, lambda: flushed.append(len(taken)))
    await feeder
    assert back == "stop"
    assert taken == [0, 1, 2, 3, 4]
    assert flushed == [2, 3, 5]  # after each batch, the handed-back one included
    assert [ev.message.step for ev in q] == [5]  # left for the task, in order


async def test_idle_takes_events_that_arrived_before_it_began():
    q = _EventQueue()
    q.put(_value(1, 0))
    back = await q.idle(10.0, lambda ev: ev.message.step)
    assert back == 0 and not q


async def test_idle_returns_none_at_its_timeout_and_leaves_later_events_to_the_task():
    q = _EventQueue()
    assert await q.idle(0.01, lambda ev: pytest.fail("no event arrived")) is None
    q.put(_value(1, 0))  # nobody idle: queued
    assert len(q) == 1


async def test_idle_raises_what_the_sink_or_the_flush_raise():
    q = _EventQueue()
    q.put(_value(1, 0))

    def bad(ev):
        raise ValueError("engine failed")

    with pytest.raises(ValueError, match="engine failed"):
        await q.idle(10.0, bad)
    q.put(_value(1, 1))

    def bad_flush():
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        await q.idle(10.0, lambda ev: None, bad_flush)
    q.put(_value(1, 2))  # a flush that fails as the sink hands back is not lost either
    with pytest.raises(OSError, match="disk full"):
        await q.idle(10.0, lambda ev: "back", bad_flush)
    # A sink that fails still has what it holds flushed before the loop goes on (the turn's
    # socket writes come after); when both fail, the sink's error is the one raised.
    flushed = []
    q.put(_value(1, 3))
    with pytest.raises(ValueError, match="engine failed"):
        await q.idle(10.0, bad, lambda: flushed.append(True))
    assert flushed == [True]
    q.put(_value(1, 4))
    with pytest.raises(ValueError, match="engine failed"):
        await q.idle(10.0, bad, bad_flush)


class _Vlog:
    """Records written, and ``order``: each record's kind and each flush (``"flush"``) as they
    come (a shared list, with the sends of a :class:`_Net` given the same one)."""

    def __init__(self, order=None):
        self.records, self.held = [], False
        self.order = [] if order is None else order

    def hold(self):
        self.held = True

    def flush(self):
        self.held = False
        self.order.append("flush")

    def write_record(self, kind, fields):
        self.records.append((kind, dict(fields)))
        self.order.append(kind)


class _Net:
    """A network that takes sends at once, or makes them wait, or fails them (pure fake)."""

    def __init__(self, wait_for=(), gone=(), at_once=(), order=None):
        self.q = _EventQueue()
        self.sent, self.wait_for, self.gone = [], set(wait_for), set(gone)
        self.at_once = set(at_once)  # peers whose sends go to the socket before send_now returns
        self.waited = []
        self.order = [] if order is None else order

    def encode(self, msg):
        return [b"x"]

    def writes_at_once(self, peer, parts):
        return peer in self.at_once

    def send_now(self, peer, msg, timeout, parts):
        if peer in self.gone:
            raise ConnectionError(f"node {peer} gone")
        self.sent.append((peer, msg.step))
        self.order.append(("send", peer))
        if peer in self.wait_for:

            async def wait():
                self.waited.append(peer)

            return wait()
        return None

    def ready_event(self):
        return self.q.popleft() if self.q else None

    async def idle(self, timeout, sink, after=None):
        return await self.q.idle(timeout, sink, after)


class _Engine:
    """Sends one value to each of ``peers`` per inbound event, logs it, finishes at step 3."""

    def __init__(self, peers):
        self.peers, self.handled, self.step = peers, [], 0

    def _step(self):
        msg = Message("value", 0, self.step, np.zeros(2))
        out = [Log("recv", {"step": self.step})] if self.step else []
        for w in self.peers:
            out.append(Send(w, msg, Log("send", {"step": self.step, "peer": w})))
        return out

    def start(self, now):
        return self._step()

    def handle(self, ev, now):
        self.handled.append(ev)
        if type(ev) is PeerDown:
            return [Log("peer-down", {"peer": ev.peer})]
        if ev is None:
            return []
        self.step += 1
        if self.step == 3:
            return [Finish({"node": 0}, None)]
        return self._step()

    def next_wakeup(self):
        return None


class _Progress:
    reader_gone = False

    def emit_event(self, fields):
        pass


async def _drive(engine, net, vlog, events, outgoing=None):
    """Run the driver, each event put once it waits in ``idle`` (so its callbacks take it)."""

    async def arrive():
        for ev in events:
            while net.q._sink is None:
                await asyncio.sleep(0)
            net.q.put(ev)

    feeder = asyncio.ensure_future(arrive())
    try:
        return await asyncio.wait_for(
            runner.drive(engine, net, vlog, _Progress(), 1.0, outgoing), 10.0
        )
    finally:
        feeder.cancel()


async def test_the_driver_waits_for_a_send_the_socket_did_not_take_and_logs_it_sent():
    engine, net, vlog = _Engine([1, 2]), _Net(wait_for={2}), _Vlog()
    finish = await _drive(engine, net, vlog, [_value(1, 0), _value(1, 1), _value(1, 2)])
    assert finish.result == {"node": 0}
    assert net.waited == [2, 2, 2]
    sends = [(f["step"], f["peer"]) for k, f in vlog.records if k == "send"]
    assert sends == [(0, 1), (0, 2), (1, 1), (1, 2), (2, 1), (2, 2)]
    assert [k for k, _ in vlog.records] == ["send", "send"] + ["recv", "send", "send"] * 2


async def test_a_step_s_records_leave_together_unless_a_send_goes_to_its_socket_at_once():
    """The records the driver holds are flushed once, when it hands the loop back (after its
    sends, which the transport writes at the end of the turn); a send the transport would write
    at once has them flushed before it. The three values arrive together: one batch."""
    sends = [("send", 1), ("send", 2), "send", "send"]
    order: list = []
    engine, net, vlog = _Engine([1, 2]), _Net(order=order), _Vlog(order)
    await _drive(engine, net, vlog, [_value(1, 0), _value(1, 1), _value(1, 2)])
    # The start's sends, then the batch (two steps and the finish), then the driver's end.
    assert order == [*sends, "flush", "recv", *sends, "recv", *sends, "flush", "flush"]

    order = []
    engine, net, vlog = _Engine([1, 2]), _Net(at_once={2}, order=order), _Vlog(order)
    await _drive(engine, net, vlog, [_value(1, 0), _value(1, 1), _value(1, 2)])
    sends = [("send", 1), "flush", ("send", 2), "send", "send"]
    assert order == [*sends, "flush", "recv", *sends, "recv", *sends, "flush", "flush"]


async def test_the_driver_turns_a_failed_send_into_a_peer_down_for_the_engine():
    engine, net, vlog = _Engine([1, 2]), _Net(gone={2}), _Vlog()
    await _drive(engine, net, vlog, [_value(1, 0), _value(1, 1), _value(1, 2)])
    downs = [ev.peer for ev in engine.handled if type(ev) is PeerDown]
    assert downs == [2, 2, 2]  # one per failed send: every step's, the ones from callbacks too
    assert ("peer-down", {"peer": 2}) in vlog.records
    assert not any(k == "send" and f["peer"] == 2 for k, f in vlog.records)


async def test_the_driver_replaces_each_send_once_by_its_outgoing_hook():
    engine, net, vlog = _Engine([1, 2]), _Net(wait_for={1}), _Vlog()
    seen = []

    def outgoing(send):
        seen.append((send.peer, send.message.step))
        return Send(send.peer, Message("value", 0, send.message.step + 100), send.on_sent)

    await _drive(engine, net, vlog, [_value(1, 0), _value(1, 1), _value(1, 2)], outgoing)
    assert seen == [(1, 0), (2, 0), (1, 1), (2, 1), (1, 2), (2, 2)]
    assert net.sent == [(p, s + 100) for p, s in seen]


def test_a_nan_fault_replaces_each_value_sent_at_its_step_once(tmp_path):
    # Real peers: the steps after the first are made in the callbacks that take the values.
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "coordinator_free", "run", "--set", "graph.kind=ring",
         "--set", "graph.nodes=4", "--set", "protocol.steps=8", "--set",
         "network.deadline_s=2", "--fault", "nan:2@5", "--out", str(out), "--quiet",
         "--no-audit"],
        capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    # The refused values make the run end as not planned (exit 1), saying so.
    assert proc.returncode == 1, proc.stderr
    assert "node 2, step 5: its values were missed by all 2 of its neighbours" in proc.stderr
    faults = [
        (r["step"], r["peer"])
        for r in read_viewlog(out / "logs" / "node-2.vlog").records
        if r["k"] == "fault"
    ]
    assert sorted(faults) == [(5, 1), (5, 3)]
    for w in (1, 3):
        bad = [
            r
            for r in read_viewlog(out / "logs" / f"node-{w}.vlog").records
            if r["k"] == "bad-message" and r["peer"] == 2
        ]
        assert [(r["kind"], r["at"]) for r in bad] == [("non-finite", 5)]


async def test_an_earlier_wake_up_set_in_a_callback_reaches_the_task_s_timer():
    class Engine(_Engine):
        """Waits for a value (its timer far away), then for a short while, then finishes."""

        def __init__(self):
            super().__init__([])
            self.until, self.timed_out = time.monotonic() + 3600.0, False

        def handle(self, ev, now):
            self.handled.append(ev)
            if ev is None:
                if now < self.until:
                    return []
                self.timed_out = True
                return [Finish({"node": 0}, None)]
            self.until = now + 0.02  # earlier than the timer the task is sleeping on
            return [Log("recv", {"step": 0})]

        def next_wakeup(self):
            return self.until

    engine, net, vlog = Engine(), _Net(), _Vlog()
    finish = await _drive(engine, net, vlog, [_value(1, 0)])
    assert finish.result == {"node": 0} and engine.timed_out
    assert vlog.records == [("recv", {"step": 0})]


async def test_events_that_leave_the_wake_up_time_as_it_was_stay_in_the_callbacks():
    """The common step: a value arrives, the exchange's deadline stays where it was. The
    driver's task sleeps through it; only an earlier wake-up than its timer's needs it."""

    class Engine(_Engine):
        def __init__(self):
            super().__init__([])
            self.until = time.monotonic() + 3600.0  # the deadline, the same for every event

        def handle(self, ev, now):
            self.handled.append(ev)
            if len(self.handled) == 5:
                return [Finish({"node": 0}, None)]
            return [Log("recv", {"step": len(self.handled)})]

        def next_wakeup(self):
            return self.until

    class Net(_Net):
        def __init__(self):
            super().__init__()
            self.idles = 0

        async def idle(self, timeout, sink, after=None):
            self.idles += 1
            return await super().idle(timeout, sink, after)

    engine, net, vlog = Engine(), Net(), _Vlog()

    async def arrive():  # each value once the one before it is handled and the driver waits
        for t in range(5):
            while len(engine.handled) < t or net.q._sink is None:
                await asyncio.sleep(0)
            net.q.put(_value(1, t))

    feeder = asyncio.ensure_future(arrive())
    try:
        drive = runner.drive(engine, net, vlog, _Progress(), 1.0)
        finish = await asyncio.wait_for(drive, 10.0)
    finally:
        feeder.cancel()
    assert finish.result == {"node": 0}
    assert len(engine.handled) == 5
    assert net.idles == 1  # the task waited once; the five events were taken in callbacks
    assert [f["step"] for _, f in vlog.records] == [1, 2, 3, 4]
