"""Declared faults: what to break in a run, and when.

A run declares its faults in the ``[faults]`` config section (``inject = ["kill:3@5",
"drop:0.01"]``) or with ``--fault SPEC`` on the command line (repeatable, appended to the
section). Each spec is one of:

==========================  =============================================================
``kill:N@STEP``             node N's process is killed (SIGKILL) at STEP
``stop:N@STEP+SECONDS``     node N is stopped (SIGSTOP) at STEP, resumed SECONDS later
``cut:N@STEP``              every link of node N is cut at STEP (no packet passes)
``heal:N@STEP``             node N's links are restored at STEP
``nan:N@STEP``              node N sends NaN instead of its values (or token) of STEP
``drop:P``                  every message is lost with probability P
``duplicate:P``             every message is delivered twice with probability P
``delay:MS``                every message is held MS milliseconds before it is sent
``corrupt:P``               a bit of an encrypted frame is flipped with probability P (the
                            receiver's authentication fails and the channel is rebuilt)
``dropout:P``               at every step every node sits out with probability P, drawn from
                            the public seed (the Muffliato paper's user dropout): the plan
                            and the auditor know who sat out when
==========================  =============================================================

"At STEP" means: at the first progress report of node N at or past STEP (step 0: once it has
connected). In a token walk the step is the walk's hop count, which only the token's holder
reports, so there it is the first report of *any* node at or past STEP.

Who applies what: the launcher (``cfree run``, ``cfree lab run``) kills and stops processes;
``cut``/``heal`` are real link changes in the lab and the peer's transport blocking every
neighbour on loopback; the peers' transport applies ``drop``/``duplicate``/``delay``/
``corrupt``; a peer applies ``nan`` to what it sends; ``dropout`` is part of the protocol's
public schedule. The in-memory network applies all of them in tests. What was injected, and
when, is written to ``faults.json`` in the run directory.

Pure code: no asyncio, no processes, no clock.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from coordinator_free.errors import ConfigError

#: Faults aimed at one node at a step.
NODE_KINDS = ("kill", "stop", "cut", "heal", "nan")
#: Faults of every link, with a probability (or a delay).
LINK_KINDS = ("drop", "duplicate", "delay", "corrupt")
KINDS = (*NODE_KINDS, *LINK_KINDS, "dropout")

_NODE_RE = re.compile(r"^(\d+)@(\d+)$")
_STOP_RE = re.compile(r"^(\d+)@(\d+)\+([0-9]*\.?[0-9]+)$")

#: How the spec of each kind is written (for error messages and --help).
SYNTAX = {
    "kill": "kill:N@STEP",
    "stop": "stop:N@STEP+SECONDS",
    "cut": "cut:N@STEP",
    "heal": "heal:N@STEP",
    "nan": "nan:N@STEP",
    "drop": "drop:P",
    "duplicate": "duplicate:P",
    "delay": "delay:MS",
    "corrupt": "corrupt:P",
    "dropout": "dropout:P",
}


@dataclass(frozen=True)
class Fault:
    """One declared fault (see the module docstring for the kinds)."""

    kind: str
    node: int | None = None
    step: int | None = None
    seconds: float | None = None  # stop: how long the node stays stopped
    value: float | None = None  # drop/duplicate/corrupt/dropout: P; delay: milliseconds

    @property
    def spec(self) -> str:
        if self.kind == "stop":
            return f"stop:{self.node}@{self.step}+{self.seconds:g}"
        if self.kind in NODE_KINDS:
            return f"{self.kind}:{self.node}@{self.step}"
        return f"{self.kind}:{self.value:g}"


def parse(spec: str, where: str = "--fault") -> Fault:
    """One fault spec, e.g. ``"cut:2@10"``; a ConfigError names the spec and the syntax."""
    if not isinstance(spec, str):
        raise ConfigError(f"{where}: a fault spec must be a string like 'kill:3@5', got {spec!r}")
    kind, sep, arg = spec.strip().partition(":")
    if not sep or kind not in KINDS:
        raise ConfigError(
            f"{where}: {spec!r} is not a fault spec; expected one of "
            + ", ".join(SYNTAX[k] for k in KINDS)
        )
    syntax = SYNTAX[kind]
    if kind == "stop":
        m = _STOP_RE.match(arg)
        if not m:
            raise ConfigError(f"{where}: {spec!r}: expected {syntax}, e.g. stop:2@5+3.5")
        seconds = float(m.group(3))
        if not 0 < seconds <= 86400:
            raise ConfigError(f"{where}: {spec!r}: SECONDS must be in (0, 86400]")
        return Fault(kind, int(m.group(1)), int(m.group(2)), seconds=seconds)
    if kind in NODE_KINDS:
        m = _NODE_RE.match(arg)
        if not m:
            raise ConfigError(f"{where}: {spec!r}: expected {syntax}, e.g. {kind}:2@5")
        return Fault(kind, int(m.group(1)), int(m.group(2)))
    try:
        value = float(arg)
    except ValueError:
        raise ConfigError(f"{where}: {spec!r}: expected {syntax} with a number") from None
    if kind == "delay":
        if not 0 <= value <= 60_000 or not math.isfinite(value):
            raise ConfigError(f"{where}: {spec!r}: MS must be in [0, 60000] milliseconds")
    elif not 0 <= value < 1:
        raise ConfigError(f"{where}: {spec!r}: P must be a probability in [0, 1)")
    return Fault(kind, value=value)


@dataclass(frozen=True)
class FaultPlan:
    """The faults of one run, parsed and checked against its size."""

    faults: tuple[Fault, ...] = ()

    @property
    def specs(self) -> list[str]:
        return [f.spec for f in self.faults]

    def _value(self, kind: str) -> float:
        # A kind given twice: the last one counts (a --fault overrides the config's).
        vals = [f.value for f in self.faults if f.kind == kind]
        return float(vals[-1]) if vals else 0.0

    @property
    def drop(self) -> float:
        return self._value("drop")

    @property
    def duplicate(self) -> float:
        return self._value("duplicate")

    @property
    def corrupt(self) -> float:
        return self._value("corrupt")

    @property
    def delay_s(self) -> float:
        return self._value("delay") / 1000.0

    @property
    def dropout(self) -> float:
        return self._value("dropout")

    @property
    def link_faults(self) -> bool:
        return bool(self.drop or self.duplicate or self.corrupt or self.delay_s)

    def at_steps(self, kinds: tuple[str, ...] = NODE_KINDS) -> list[Fault]:
        """The node faults of ``kinds``, in the order they should fire."""
        return sorted(
            (f for f in self.faults if f.kind in kinds),
            key=lambda f: (f.step, f.kind == "heal", f.node),
        )

    def nan_steps(self, node: int) -> frozenset[int]:
        return frozenset(f.step for f in self.faults if f.kind == "nan" and f.node == node)

    def __bool__(self) -> bool:
        return bool(self.faults)


def plan_of(specs, where: str = "faults.inject") -> FaultPlan:
    return FaultPlan(tuple(parse(s, f"{where}[{i}]") for i, s in enumerate(specs)))


def check(
    fp: FaultPlan, n: int, where: str, *, dropout_ok: bool, protocol: str, peers: bool = True
) -> None:
    """Node ids within the run; dropout only where the protocol's schedule knows it; no
    faults at all for a protocol without peers."""
    if fp.faults and not peers:
        raise ConfigError(
            f"{where}: protocol {protocol!r} runs in one process (the trusted curator): there is "
            "no peer, link or message to inject a fault into"
        )
    for f in fp.faults:
        if f.node is not None and not 0 <= f.node < n:
            raise ConfigError(f"{where}: {f.spec!r}: node {f.node} is not in 0..{n - 1}")
    if fp.dropout and not dropout_ok:
        raise ConfigError(
            f"{where}: dropout:{fp.dropout:g}: protocol {protocol!r} has no per-step dropout "
            "schedule (the Muffliato paper's user dropout belongs to synchronous gossip "
            "averaging: protocol muffliato); inject kill, stop, cut or drop faults instead"
        )


def nan_message(message, steps):
    """The message a ``nan`` fault sends instead of ``message`` (its values, or the token,
    replaced by NaN) when it is a value or token of one of ``steps``; None otherwise."""
    from coordinator_free.net.wire import Message

    m = message
    if m.step not in steps or m.kind not in ("value", "token") or m.payload is None:
        return None
    return Message(m.kind, m.round, m.step, np.full_like(m.payload, np.nan), m.meta)


@dataclass
class StepTriggers:
    """Which node faults fire on a progress report: ``fire(node, event)`` returns them, each
    once. ``global_steps``: the step is the run's (a token walk's hop count), reported by
    whichever node makes it, so any node's report counts."""

    pending: list[Fault]
    global_steps: bool = False
    fired: list[tuple[Fault, int, int]] = field(default_factory=list)  # (fault, by, step)

    @classmethod
    def of(cls, fp: FaultPlan, kinds: tuple[str, ...], global_steps: bool) -> StepTriggers:
        return cls(fp.at_steps(kinds), global_steps)

    def fire(self, node: int, event: dict) -> list[Fault]:
        kind = event.get("event")
        if kind == "connected":
            step = 0
        elif kind == "step":
            try:
                step = int(event.get("step", 0))
            except (TypeError, ValueError):
                return []
        else:
            return []
        due = [f for f in self.pending if step >= f.step and (self.global_steps or f.node == node)]
        for f in due:
            self.pending.remove(f)
            self.fired.append((f, node, step))
        return due

    def never_fired(self) -> list[Fault]:
        return list(self.pending)


def last_steps(results: dict, *, global_steps: bool) -> dict[int, int | None]:
    """The last step each node reached, from its result (None: no result). ``global_steps``
    (token walks): the step is the walks' hop count, so every node gets the last step any walk
    reached, as far as the results that exist say."""
    own: dict[int, int | None] = {}
    walk_end: int | None = None
    for v, res in results.items():
        if not isinstance(res, dict):
            own[v] = None
            continue
        s = res.get("steps")
        own[v] = int(s) if isinstance(s, int) and not isinstance(s, bool) else None
        ended = (res.get("walks") or {}).get("ended") or {}
        for e in ended.values() if isinstance(ended, dict) else ():
            step = e.get("step") if isinstance(e, dict) else None
            if isinstance(step, int) and not isinstance(step, bool):
                walk_end = step if walk_end is None else max(walk_end, step)
    if global_steps:
        return {v: walk_end for v in own}
    return own


def not_applied(
    fp: FaultPlan,
    *,
    launcher_pending: list[Fault],
    nan_sent: dict[int, set[int]],
    reached: dict[int, int | None],
    global_steps: bool,
) -> list[dict]:
    """The declared node faults that never took effect, each ``{"spec", "fault", "node",
    "step", "reason"}``: a kill/stop/cut/heal whose step no report reached (``launcher_pending``,
    from :class:`StepTriggers`), a ``nan:N@S`` that node N never applied (``nan_sent``: the steps
    each node did send as NaN), with why, from the last step each node reached (``reached``,
    :func:`last_steps`)."""
    out = []
    pending = {f.spec for f in launcher_pending}
    for f in fp.at_steps():
        if f.kind == "nan":
            if f.step in nan_sent.get(f.node, set()):
                continue
        elif f.spec not in pending:
            continue
        out.append(
            {"spec": f.spec, "fault": f.kind, "node": f.node, "step": f.step,
             "reason": _why_not(f, reached.get(f.node), global_steps)}
        )  # fmt: skip
    return out


def _why_not(f: Fault, last: int | None, global_steps: bool) -> str:
    who = "the walks" if global_steps else f"node {f.node}"
    if last is None:
        if global_steps:
            return f"no result says the walks reached step {f.step}"
        return f"node {f.node} wrote no result: nothing says it reached step {f.step}"
    if last < f.step:
        return f"the run ended first: {who} ended at step {last}, before step {f.step}"
    if f.kind == "nan":
        tail = " (the token was not at that node then)" if global_steps else ""
        return f"node {f.node} sent no value or token at step {f.step}{tail}"
    return f"no progress report of step {f.step} reached the launcher before {who} ended"
