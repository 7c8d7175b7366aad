"""What goes into a sans-IO node engine (events) and what comes out of it (actions).

An engine never touches a socket, a file or a clock. Its driver (the peer shell on its event loop, the
in-memory network, the lockstep simulator) feeds it network events with the current time,
``engine.handle(event, now)``, calls ``engine.handle(None, now)`` once ``now`` has reached
``engine.next_wakeup()``, and performs the actions it returns, in order. A send that fails is
fed back as a :class:`PeerDown` whose reason starts with ``send failed``.

The events and actions made at every step (:class:`Inbound`, :class:`Log`, :class:`Send`,
:class:`Progress`) are slotted dataclasses, not frozen ones: a frozen dataclass's constructor
sets each field through ``object.__setattr__`` and costs about four times as much. Nobody
changes one once it is made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from coordinator_free.net.wire import Message
from coordinator_free.viewlog import value_fields

# ------------------------------------------------------------------------------------ events


@dataclass(slots=True)
class Inbound:
    """A message from neighbour ``peer``."""

    peer: int
    message: Message


@dataclass(frozen=True)
class PeerDown:
    """The channel to neighbour ``peer`` closed or failed; ``reason`` says why."""

    peer: int
    reason: str


@dataclass(frozen=True)
class PeerUp:
    """Neighbour ``peer``, earlier reported down, has a channel again."""

    peer: int


NetEvent = Inbound | PeerDown | PeerUp

#: Liveness of a channel, in units of the step deadline: a peer's transport sends a heartbeat
#: after HEARTBEAT_DEADLINES of silence on a channel and declares the neighbour down after
#: SILENCE_DEADLINES without hearing anything from it (a cut link, a stopped process). The
#: in-memory network models the same delays.
HEARTBEAT_DEADLINES = 0.25
SILENCE_DEADLINES = 3.0

# ----------------------------------------------------------------------------------- actions


@dataclass(slots=True)
class Log:
    """Append a record to the node's view log."""

    kind: str
    fields: dict


class ValueLog(Log):
    """A value record (a ``send`` or ``recv`` at every step: ``step``, ``peer``, ``digest``,
    ``nbytes`` and, logged, the ``value``) held field by field: the peer's driver writes it
    without building a dict (``ViewLogWriter.write_value``). ``fields`` gives the same record
    as a :class:`Log`'s dict, for every other reader; equal to the :class:`Log` of that dict."""

    __slots__ = ("step", "peer", "digest", "nbytes", "value")

    def __init__(
        self, kind: str, step: int, peer: int, digest: str, nbytes: int, value=None
    ) -> None:
        self.kind, self.step, self.peer = kind, step, peer
        self.digest, self.nbytes, self.value = digest, nbytes, value

    @property
    def fields(self) -> dict:  # type: ignore[override]
        return value_fields(self.step, self.peer, self.digest, self.nbytes, self.value)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Log):
            return (self.kind, self.fields) == (other.kind, other.fields)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # as a Log's

    def __reduce__(self):  # copied and pickled by its fields (``fields`` cannot be set)
        return ValueLog, (self.kind, self.step, self.peer, self.digest, self.nbytes, self.value)


@dataclass(slots=True)
class Send:
    """Send ``message`` to ``peer`` within the step deadline; once it went out, write the
    ``on_sent`` record (a send is logged only when it happened)."""

    peer: int
    message: Message
    on_sent: Log | None = None


@dataclass(slots=True)
class Progress:
    """A progress event for the launcher. ``abort`` ``(what, when)``, e.g. ``("after step",
    3)``: when the launcher has gone away, the peer logs ``aborted`` at ``fields["step"]`` and
    stops, saying when."""

    fields: dict
    abort: tuple[str, int] | None = None


@dataclass(frozen=True)
class Finish:
    """The node's run is over: ``result`` holds the result-file fields the engine knows (the
    driver adds traffic counters and channel addresses), ``models`` the node's model after every
    round (learning), written next to the result."""

    result: dict
    models: np.ndarray | None = None


Action = Log | Send | Progress | Finish


class Engine(Protocol):
    """The interface every node engine offers its drivers."""

    finished: bool

    def start(self, now: float) -> list[Action]: ...

    def handle(self, event: NetEvent | None, now: float) -> list[Action]: ...

    def next_wakeup(self) -> float | None: ...


@dataclass
class Outbox:
    """Where an engine and its node program queue actions while handling one event."""

    node: int
    actions: list[Action] = field(default_factory=list)

    def log(self, kind: str, /, **fields: Any) -> None:
        self.actions.append(Log(kind, fields))

    def send(self, peer: int, message: Message, on_sent: Log | None = None) -> None:
        self.actions.append(Send(peer, message, on_sent))

    def progress(self, abort: tuple[str, int] | None = None, /, **fields: Any) -> None:
        self.actions.append(Progress(fields, abort))

    def take(self) -> list[Action]:
        out, self.actions = self.actions, []
        return out
