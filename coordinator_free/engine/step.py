"""The synchronous step exchange as a sans-IO engine, driving a node program.

A node program is a generator (one per family, in ``families/<family>/node.py``) holding the
family's round loop. It yields requests and gets their answers back:

* :class:`Exchange` ``(t, value)``: send ``value`` to step t's partners, collect theirs; the
  answer is ``{peer: value}`` of the partners heard from in time.
* :class:`WaitUntil` ``(at)``: resume once the time is ``at`` (randomized gossip's clock).
* :class:`Gather` ``(message, kind, accept, timeout)``: a one-off exchange with every neighbour
  (DECOR's seed exchange); the answer is the set of neighbours not heard from in time.

and returns an :class:`Outcome`. It writes to the view log and the progress channel through
``ctx.out``. The same program runs under :class:`StepEngine` (a peer, the in-memory network)
and under the lockstep driver of the simulator (:mod:`coordinator_free.engine.lockstep`), so a
fault-free networked run and the simulator compute with the same code, bit for bit.

Exchange rules (the behaviour the view logs and the auditor rely on):

* Values for a later step (a neighbour that gave up waiting for us can be several steps ahead)
  are buffered until their step; values for an earlier step are logged as late and not used.
* A neighbour whose channel is down is waited for only during a grace period after it went
  down; a PeerUp brings it back and it gets our current value again at once.
* Every value received is logged, used or not: the auditor counts what the node saw.
* A value holding NaN or an infinity is refused: logged as a ``bad-message`` of kind
  ``non-finite``, never used. For its step it counts as not received (the ``miss`` record says
  ``refused``), and the node does not wait for that neighbour's step value any longer.
* At the end the node says ``done`` and waits (one deadline at most) for its neighbours', so a
  normal end is never mistaken for a crash.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import numpy as np

from coordinator_free.engine.events import (
    Action,
    Finish,
    Inbound,
    Log,
    NetEvent,
    Outbox,
    PeerDown,
    PeerUp,
    ValueLog,
)
from coordinator_free.net.wire import Message, value_message
from coordinator_free.viewlog import value_digest

# How long after a neighbour's channel went down we keep waiting for it at step deadlines (the
# transport redials meanwhile), in units of the step deadline. Past that a down neighbour is
# skipped at once, so a crashed neighbour costs a bounded amount of time, not T deadlines.
DOWN_GRACE_DEADLINES = 2.0


#: The digest every view-log record of a value carries (one definition, in viewlog).
digest = value_digest


def own_copy(payload: np.ndarray) -> np.ndarray:
    """A received value as the node keeps it: an aligned float64 array nobody else can change.
    A decoded message's payload already is one when its data lies aligned in the frame's
    plaintext (a read-only view on bytes nothing else holds): it is kept as it is, without a
    copy; anything else is copied (numpy would otherwise copy an unaligned array piecewise in
    every operation on it)."""
    flags = payload.flags
    if payload.dtype == np.float64 and flags.aligned and not flags.writeable:
        base = payload.base
        while isinstance(base, np.ndarray):
            base = base.base
        if type(base) is bytes:  # immutable memory
            return payload
    return np.array(payload, dtype=np.float64)


def all_finite(value: np.ndarray) -> bool:
    """Whether every entry of a received value is finite. A small value is checked as Python
    floats, which spares numpy's boolean array and its reduction (8 floats: 0.7 against 2.0
    us); a larger one entry by entry in numpy."""
    if value.size <= _FINITE_AS_FLOATS:
        return all(map(math.isfinite, (value if value.ndim == 1 else value.ravel()).tolist()))
    return bool(np.isfinite(value).all())


#: Up to this many entries :func:`all_finite` checks a value as Python floats.
_FINITE_AS_FLOATS = 32


# ---------------------------------------------------------------------------------- requests


@dataclass(slots=True)
class Exchange:
    t: int
    value: np.ndarray


@dataclass(frozen=True)
class WaitUntil:
    at: float


@dataclass(frozen=True)
class Gather:
    message: Message
    kind: str
    accept: Callable[[int, Message], bool]
    timeout: float


@dataclass
class Outcome:
    """What a node program ends with: its estimate (or final model) and, for learning, its
    model after every round."""

    estimate: np.ndarray
    models: list[np.ndarray] | None = None


Program = Generator[Any, Any, Outcome]


class NullContext:
    """The context of a program run by the simulator: nothing is logged or sent, nothing is
    ever missed."""

    def __init__(self, node: int):
        self.node = node
        self.t0 = 0.0
        self.out = _NullOutbox()
        self.missed: list[dict] = []
        self.heard: dict[int, int] = {}
        self.down: dict[int, float] = {}
        self.finished_peers: set[int] = set()
        self.handlers: dict = {}


class _NullOutbox:
    def log(self, kind: str, /, **fields: Any) -> None:
        pass

    def send(self, *args: Any, **kw: Any) -> None:
        pass

    def progress(self, abort: tuple[str, int] | None = None, /, **fields: Any) -> None:
        pass


# ------------------------------------------------------------------------------------ engine


class StepEngine:
    """Runs one node program over the network, one event at a time (sans-IO)."""

    def __init__(
        self,
        *,
        node: int,
        neighbours: list[int],
        steps: int,
        deadline: float,
        log_values: bool,
        dim: int,
        program: Callable[[StepEngine], Program],
        partners_at: Callable[[int], list[int]] | None = None,
    ):
        self.node = node
        self.neighbours = list(neighbours)
        # Whom the node exchanges with at step t: every neighbour (synchronous gossip) or the
        # partner of its exchange (randomized gossip).
        self.partners_at = partners_at or (lambda t: self.neighbours)
        self.steps, self.deadline, self.log_values = steps, deadline, log_values
        self.shape = (dim,)
        self._program = program
        self.out = Outbox(node)
        self.t0 = 0.0
        self.down: dict[int, float] = {}  # peer -> time its channel went down
        self.finished_peers: set[int] = set()  # neighbours that said "done"
        self.buffered: dict[tuple[int, int], np.ndarray] = {}  # (step, peer) -> value
        self.missed: list[dict] = []
        self.late = 0
        self.refused: set[tuple[int, int]] = set()  # (step, peer) of non-finite values
        # Protocol messages other than values (kind -> handler(peer, message)), e.g. decor's.
        self.handlers: dict[str, Callable[[int, Message], None]] = {}
        # peer -> the latest step of which a value arrived from it (on time, early or late):
        # a neighbour that is late but still sending is alive and progressing.
        self.heard: dict[int, int] = {}
        self.finished = False
        self._queue: deque[NetEvent] = deque()
        self._gen: Program | None = None
        self._phase = "init"
        self._req: Any = None
        self._got: dict[int, np.ndarray] = {}
        self._until = 0.0  # the current phase's deadline (or wake-up time)
        self._pending: set[int] = set()
        self._outcome: Outcome | None = None
        self._run_s = 0.0
        self._now = 0.0  # the time of the event being handled
        self._partners: list[int] = []  # partners_at(self._partners_step), the exchange's
        self._partners_step = -1

    # ------------------------------------------------------------------ driver interface

    def start(self, now: float) -> list[Action]:
        self.t0 = self._now = now
        self._gen = self._program(self)
        self._resume(None, now)
        self._pump(now)
        return self.out.take()

    def handle(self, event: NetEvent | None, now: float) -> list[Action]:
        if self.finished:
            return []
        self._now = now
        if event is not None:
            if (
                type(event) is Inbound
                and self._phase == "exchange"
                and not self._queue
                and not self.down
                and now < self._until
            ):
                # The common event, a neighbour's message during an exchange, handled at once.
                # Nothing queued, no neighbour down and the deadline ahead: the exchange was
                # incomplete when the last event left it, and nothing but an event can change
                # that, so this is what the queue would do.
                self._inbound(self._req.t, event.peer, event.message, self._got)
            else:
                self._queue.append(event)
        self._pump(now)
        return self.out.take()

    def next_wakeup(self) -> float | None:
        if self._phase in ("exchange", "wait", "gather", "goodbye"):
            return self._until
        return None

    # ------------------------------------------------------------------ the program

    def _resume(self, answer: Any, now: float) -> None:
        assert self._gen is not None
        try:
            req = self._gen.send(answer)
        except StopIteration as stop:
            self._outcome = stop.value
            self._run_s = now - self.t0
            self._begin_goodbye(now)
            return
        self._req = req
        if isinstance(req, Exchange):
            self._begin_exchange(req, now)
        elif isinstance(req, WaitUntil):
            self._phase, self._until = "wait", req.at
        elif isinstance(req, Gather):
            self._phase, self._until = "gather", now + req.timeout
            self._pending = set(self.neighbours)
            for w in self.neighbours:
                self.out.send(w, req.message)
        else:  # pragma: no cover - a programming error in a node program
            raise TypeError(f"unknown request {req!r}")

    def _pump(self, now: float) -> None:
        """Process queued events and time until the program waits for something that has not
        happened yet."""
        while True:
            phase = self._phase
            if phase == "exchange":
                if self._exchange_complete(now):
                    self._complete_exchange(now)
                elif self._queue:
                    self._exchange_event(self._queue.popleft())
                else:
                    return
            elif phase == "wait":
                if now >= self._until:
                    self._resume(None, now)
                else:
                    return
            elif phase == "gather":
                if not self._pending or now >= self._until:
                    self._phase = "busy"
                    self._resume(set(self._pending), now)
                elif self._queue:
                    self._gather_event(self._queue.popleft())
                else:
                    return
            elif phase == "goodbye":
                if not self._pending or now >= self._until:
                    self._finish()
                elif self._queue:
                    self._goodbye_event(self._queue.popleft())
                else:
                    return
            else:
                return

    # ------------------------------------------------------------------ exchange

    def _send_value(
        self,
        peer: int,
        step: int,
        value: np.ndarray,
        sha: str | None = None,
        msg: Message | None = None,
    ) -> None:
        sha = digest(value) if sha is None else sha
        on_sent = ValueLog("send", step, peer, sha, value.nbytes)
        if msg is None:
            msg = value_message(step, value)
        self.out.send(peer, msg, on_sent)

    def _begin_exchange(self, req: Exchange, now: float) -> None:
        t = req.t
        partners = self.partners_at(t)
        # One value to every partner: one digest, one message (the driver encodes it once).
        sha = digest(req.value)
        msg = value_message(t, req.value)
        for w in partners:
            if w not in self.down and w not in self.finished_peers:
                self._send_value(w, t, req.value, sha, msg)
        buffered = self.buffered
        self._got = (
            {w: buffered.pop((t, w)) for w in partners if (t, w) in buffered} if buffered else {}
        )
        self._partners, self._partners_step = partners, t
        self._phase, self._until = "exchange", now + self.deadline

    def _waitable(self, peer: int, now: float) -> bool:
        if peer in self.finished_peers:
            return False
        since = self.down.get(peer)
        return since is None or now - since < DOWN_GRACE_DEADLINES * self.deadline

    def _exchange_complete(self, now: float) -> bool:
        if now >= self._until:
            return True
        t = self._req.t
        got, refused = self._got, self.refused
        for w in self._partners:
            if w not in got and (t, w) not in refused and self._waitable(w, now):
                return False
        return True

    def _complete_exchange(self, now: float) -> None:
        t = self._req.t
        for w in self._partners:
            if w not in self._got:
                if (t, w) in self.refused:
                    reason = "refused"
                elif w in self.finished_peers:
                    reason = "finished"
                elif w in self.down:
                    reason = "peer-down"
                else:
                    reason = "deadline"
                self.missed.append({"step": t, "peer": w, "reason": reason})
                self.out.log("miss", step=t, peer=w, reason=reason)
        got, self._got = self._got, {}
        self._phase = "busy"
        self._resume(got, now)

    def mark_down(self, peer: int, step: int, reason: str) -> None:
        if peer not in self.down:
            self.down[peer] = self._now
            self.out.log("peer-down", step=step, peer=peer, reason=reason)

    def _exchange_event(self, ev: NetEvent) -> None:
        t = self._req.t
        if isinstance(ev, PeerDown):
            self.mark_down(ev.peer, t, str(ev.reason))
        elif isinstance(ev, PeerUp):
            if self.down.pop(ev.peer, None) is not None:
                self.out.log("peer-up", step=t, peer=ev.peer)
                if ev.peer in self._partners:
                    self._send_value(ev.peer, t, self._req.value)
        elif isinstance(ev, Inbound):
            self._inbound(t, ev.peer, ev.message, self._got)

    def _log_value(self, kind: str, step: int, peer: int, value: np.ndarray, **extra) -> None:
        if not extra:  # a recv: its fields held one by one
            logged = value if self.log_values else None
            self.out.actions.append(ValueLog(kind, step, peer, digest(value), value.nbytes, logged))
            return
        fields = {"step": step, "peer": peer, "digest": digest(value), "nbytes": value.nbytes}
        fields.update(extra)
        if self.log_values:
            fields["value"] = value
        self.out.actions.append(Log(kind, fields))

    def _inbound(self, t: int, peer: int, m: Message, got: dict) -> None:
        if m.kind in self.handlers:
            self.handlers[m.kind](peer, m)
            return
        if m.kind == "done":
            self.finished_peers.add(peer)
            self.out.log("peer-done", step=t, peer=peer, at=m.step)
            return
        if m.kind != "value" or m.payload is None or m.payload.shape != self.shape:
            self.out.log("bad-message", step=t, peer=peer, kind=m.kind)
            return
        value = own_copy(m.payload)
        if not 0 <= m.step < self.steps:
            self.out.log("bad-message", step=t, peer=peer, kind="beyond-last-step", at=m.step)
            return
        if peer not in (
            self._partners if m.step == self._partners_step else self.partners_at(m.step)
        ):
            self.out.log("bad-message", step=t, peer=peer, kind="not-a-partner", at=m.step)
            return
        if not all_finite(value):
            self._refuse(t, peer, m.step, got)
            return
        self.heard[peer] = max(m.step, self.heard.get(peer, -1))
        if m.step < t:
            self.late += 1
            self._log_value("late", m.step, peer, value, now=t)
        elif (m.step == t and peer in got) or (m.step, peer) in self.buffered:
            self.out.log("duplicate", step=m.step, peer=peer)
        elif m.step == t:
            got[peer] = value
            self._log_value("recv", t, peer, value)
        else:
            self.buffered[(m.step, peer)] = value
            self._log_value("recv", m.step, peer, value)

    def _refuse(self, t: int, peer: int, step: int, got: dict) -> None:
        """A value with NaN or an infinity: logged, never used. Unless a good value of that
        step already arrived, the step counts it as not received (a ``refused`` miss)."""
        self.out.log("bad-message", step=t, peer=peer, kind="non-finite", at=step)
        have = (step == t and peer in got) or (step, peer) in self.buffered
        if step >= t and not have:
            self.refused.add((step, peer))

    # ------------------------------------------------------------------ gather

    def _gather_event(self, ev: NetEvent) -> None:
        req: Gather = self._req
        if isinstance(ev, PeerDown):
            self.mark_down(ev.peer, 0, str(ev.reason))
        elif isinstance(ev, PeerUp):
            self.down.pop(ev.peer, None)
            self.out.send(ev.peer, req.message)
        elif isinstance(ev, Inbound):
            if ev.message.kind == req.kind:
                if req.accept(ev.peer, ev.message):
                    self._pending.discard(ev.peer)
            else:
                # A value (or another message) that arrived before the first step: values
                # are kept for their step, other kinds go to their handler.
                self._inbound(-1, ev.peer, ev.message, {})

    # ------------------------------------------------------------------ goodbye

    def _begin_goodbye(self, now: float) -> None:
        live = [w for w in self.neighbours if w not in self.down]
        done = Message(kind="done", round=0, step=self.steps)
        for w in live:
            self.out.send(w, done)
        self._pending = {w for w in live if w not in self.finished_peers}
        self._phase, self._until = "goodbye", now + self.deadline

    def _goodbye_event(self, ev: NetEvent) -> None:
        if isinstance(ev, PeerDown):
            self._pending.discard(ev.peer)
        elif isinstance(ev, Inbound):
            m = ev.message
            if m.kind == "done":
                self._pending.discard(ev.peer)
            elif (
                m.kind == "value"
                and m.payload is not None
                and 0 <= m.step < self.steps
                and ev.peer in self.partners_at(m.step)
            ):
                value = own_copy(m.payload)
                if not all_finite(value):
                    self._refuse(self.steps, ev.peer, m.step, {})
                    return
                # Values still arriving are logged as late.
                self.late += 1
                self._log_value("late", m.step, ev.peer, value, now=self.steps)

    def _finish(self) -> None:
        self._phase = "done"
        self.finished = True
        outcome = self._outcome
        assert outcome is not None
        self.out.log("finished", steps=self.steps, missed=len(self.missed), late=self.late)
        result = {
            "node": self.node,
            "estimate": np.asarray(outcome.estimate, dtype=np.float64).tolist(),
            "steps": self.steps,
            "elapsed_s": self._run_s,
            "missed": self.missed,
            "late": self.late,
        }
        models = np.stack(outcome.models) if outcome.models else None
        self.out.actions.append(Finish(result, models))


__all__ = [
    "DOWN_GRACE_DEADLINES",
    "Exchange",
    "Gather",
    "NullContext",
    "Outcome",
    "StepEngine",
    "WaitUntil",
    "digest",
]


def engine_for(cfg, plan, node: int, program: Callable[[StepEngine], Program]) -> StepEngine:
    """The step engine of ``node`` running ``program`` over a plan's steps and partners, with
    the run's deadline and logging options (every gossip family builds its engine so)."""
    return StepEngine(
        node=node,
        neighbours=plan.neighbours(node),
        steps=plan.steps,
        deadline=cfg.network.deadline_s,
        log_values=cfg.log.values,
        dim=plan.dim,
        program=program,
        partners_at=lambda t: plan.partners_at(node, t),
    )
