"""An in-memory network: N node engines in one process, a fake clock, faults from a seed.

The engines are the ones a peer runs (``family.node_engine``); only the network is fake. Every
message goes through the real wire encoding (``encode_message`` / ``decode_message``), so what
crosses this network is what crosses a channel. Time is a number: a run of hundreds of steps
with deadlines of seconds takes milliseconds, and the same seed gives the same run, event for
event.

Faults (:class:`Faults`), all deterministic from the seed:

* ``drop``: each message is lost with this probability; ``duplicate``: delivered twice;
* ``delay``: latency, fixed or ``(lo, hi)`` uniform; ``reorder``: whether a link may deliver
  out of order (False: in order, like TCP);
* ``crash``: node -> time it dies; ``crash_at_step``: node -> the step whose progress event
  kills it. A dead node's neighbours see its channel go down (``detect`` seconds later);
* ``partitions``: links ``(a, b, start, end)`` cut from ``start`` (healed at ``end``, or never
  if None): messages on the link are lost; with ``detect`` not None both ends see the channel go
  down ``detect`` seconds after the cut (and come back up at the heal);
* ``never_start``: nodes that never run (their neighbours see no channel from the start);
* ``freeze``: node -> ``(start, end)``: the node stalls (a stopped process): what reaches it
  meanwhile waits, in order, until ``end``; its channels stay up.
* ``declared``: the run's declared faults (:mod:`coordinator_free.faults`, ``--fault``), fired
  on progress reports as the launcher fires them: ``kill`` crashes the node; ``stop`` freezes
  it, and past ``silence`` seconds its neighbours declare it down (the transport's silence
  verdict) until it resumes; ``cut``/``heal`` cut and restore every link of the node, seen
  down ``silence`` seconds after the cut; ``nan`` makes the node send NaN at that step;
  ``corrupt``: a frame fails authentication at its receiver, both ends see the channel drop
  and it comes back ``redial`` seconds later; ``drop``, ``duplicate``, ``delay`` as above.

A node fault that never takes effect (its step was not reached, or a ``nan`` node sent nothing
at its step) is listed in :attr:`MemRun.not_applied` with the reason, as a launcher lists it in
``faults.json``.

A node that finishes closes its channels, as a peer does: its neighbours see them go down after
every message it sent has arrived.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from coordinator_free import seeds
from coordinator_free.engine.events import (
    SILENCE_DEADLINES,
    Engine,
    Finish,
    Inbound,
    Log,
    NetEvent,
    PeerDown,
    PeerUp,
    Progress,
    Send,
)
from coordinator_free.faults import (
    NODE_KINDS,
    Fault,
    FaultPlan,
    StepTriggers,
    last_steps,
    nan_message,
    not_applied,
)
from coordinator_free.net.wire import decode_message, encode_message


@dataclass
class Faults:
    drop: float = 0.0
    duplicate: float = 0.0
    delay: float | tuple[float, float] = 0.001
    reorder: bool = False
    crash: dict[int, float] = field(default_factory=dict)
    crash_at_step: dict[int, int] = field(default_factory=dict)
    partitions: list[tuple[int, int, float, float | None]] = field(default_factory=list)
    never_start: set[int] = field(default_factory=set)
    freeze: dict[int, tuple[float, float]] = field(default_factory=dict)
    detect: float | None = 0.01
    corrupt: float = 0.0
    nan: dict[int, frozenset[int]] = field(default_factory=dict)  # node -> steps sent as NaN
    declared: Any = None  # faults.FaultPlan: node faults fired at progress reports
    global_steps: bool = False  # token walks: any node's report of the hop count counts
    silence: float | None = None  # seconds until a silent link is declared down (None: detect)
    redial: float = 0.1

    @classmethod
    def of_config(cls, cfg, **overrides) -> Faults:
        """The faults ``cfg`` declares (``[faults]``, ``--fault``), with the delays of a real
        run: a silent neighbour declared down after SILENCE_DEADLINES deadlines."""
        fp = cfg.fault_plan
        deadline = cfg.network.deadline_s
        kw: dict[str, Any] = {
            "drop": fp.drop,
            "duplicate": fp.duplicate,
            "corrupt": fp.corrupt,
            "nan": {v: fp.nan_steps(v) for v in {f.node for f in fp.faults if f.kind == "nan"}},
            "declared": fp,
            "global_steps": cfg.family.walks(cfg),
            "silence": SILENCE_DEADLINES * deadline,
        }
        if any(f.kind == "delay" for f in fp.faults):
            kw["delay"] = fp.delay_s + 0.001
        kw.update(overrides)
        return cls(**kw)


@dataclass
class MemRun:
    """What an in-memory run gives: per node its result (None if it did not finish), its view
    log records ``(kind, fields)`` in order, its progress events, its models (learning) and how
    it ended (``finished``, ``crashed``, ``never-started``, ``unfinished``); the fake time the
    run ended at; the streams the nodes used (give them to the simulator)."""

    results: dict[int, dict | None]
    logs: dict[int, list[tuple[str, dict]]]
    progress: dict[int, list[dict]]
    models: dict[int, np.ndarray]
    outcome: dict[int, str]
    end_time: float
    streams: Any = None
    injected: list[dict] = field(default_factory=list)  # declared faults as they fired
    # declared node faults that never took effect, with why (faults.not_applied)
    not_applied: list[dict] = field(default_factory=list)

    def records(self, node: int, kind: str) -> list[dict]:
        return [f for k, f in self.logs[node] if k == kind]


class MemNet:
    def __init__(
        self,
        engines: dict[int, Engine],
        neighbours: dict[int, list[int]],
        faults: Faults | None = None,
        *,
        seed: int = 0,
        max_time: float = 1e7,
    ):
        self.engines = engines
        self.neighbours = {v: list(ws) for v, ws in neighbours.items()}
        self.f = faults or Faults()
        self.rng = random.Random(seed)
        self.max_time = max_time
        self._heap: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self._timer: dict[int, float | None] = {}
        self._link_last: dict[tuple[int, int], float] = {}  # FIFO: last delivery time per link
        self._cut: set[tuple[int, int]] = set()  # links cut now
        self._noticed: set[tuple[int, int]] = set()  # (node, peer): node saw the channel down
        self.dead: set[int] = set()
        self.done: set[int] = set()
        n = list(engines)
        self.logs: dict[int, list[tuple[str, dict]]] = {v: [] for v in n}
        self.progress: dict[int, list[dict]] = {v: [] for v in n}
        self.results: dict[int, dict | None] = {v: None for v in n}
        self.models: dict[int, np.ndarray] = {}
        self.outcome: dict[int, str] = {v: "unfinished" for v in n}
        self.traffic = {
            v: {"bytes_sent": 0, "bytes_received": 0, "messages_sent": 0, "messages_received": 0}
            for v in n
        }
        self.now = 0.0
        self.last_activity = 0.0  # the last time an engine was handed something
        self.freeze = dict(self.f.freeze)
        self.injected: list[dict] = []
        self._declared_cut: set[tuple[int, int]] = set()
        # Node faults fired by progress reports: the declared ones, and crash_at_step (a kill).
        kills = [Fault("kill", v, k) for v, k in sorted(self.f.crash_at_step.items())]
        declared = self.f.declared.faults if self.f.declared is not None else ()
        nans = [Fault("nan", v, k) for v, ks in sorted(self.f.nan.items()) for k in sorted(ks)]
        self.node_faults = FaultPlan(
            tuple({f.spec: f for f in (*declared, *kills, *nans) if f.kind in NODE_KINDS}.values())
        )
        self.triggers = StepTriggers.of(
            self.node_faults, ("kill", "stop", "cut", "heal"), self.f.global_steps
        )

    # ------------------------------------------------------------------ scheduling

    def _push(self, at: float, kind: str, data: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, kind, data))

    def _latency(self) -> float:
        d = self.f.delay
        return self.rng.uniform(*d) if isinstance(d, tuple) else float(d)

    def _link_time(self, src: int, dst: int, at: float) -> float:
        """When a message sent now on src -> dst arrives (in order unless reordering)."""
        t = at + self._latency()
        if not self.f.reorder:
            t = max(t, self._link_last.get((src, dst), 0.0))
            self._link_last[(src, dst)] = t
        return t

    def _schedule_timer(self, v: int) -> None:
        if v in self.dead or v in self.done:
            return
        w = self.engines[v].next_wakeup()
        if w is None or self._timer.get(v) == w:
            return
        self._timer[v] = w
        self._push(max(w, self.now), "timer", v)

    @staticmethod
    def _edge(a: int, b: int) -> tuple[int, int]:
        return (a, b) if a < b else (b, a)

    def _notice_down(self, v: int, peer: int, reason: str, at: float) -> None:
        if (v, peer) not in self._noticed:
            self._noticed.add((v, peer))
            self._push(at, "event", (v, PeerDown(peer, reason)))

    # ------------------------------------------------------------------ the run

    def run(self) -> MemRun:
        for v in sorted(self.engines):
            if v in self.f.never_start:
                self.dead.add(v)
                self.outcome[v] = "never-started"
                for w in self.neighbours[v]:
                    self._notice_down(w, v, "no channel: the node never started", 0.0)
            else:
                self._push(0.0, "start", v)
        for v, t in sorted(self.f.crash.items()):
            self._push(t, "crash", v)
        for a, b, t1, t2 in self.f.partitions:
            self._push(t1, "cut", (a, b))
            if t2 is not None:
                self._push(t2, "heal", (a, b))
        guard = 0
        while self._heap:
            at, _, kind, data = heapq.heappop(self._heap)
            if at > self.max_time:
                break
            if at > self.now:
                guard = 0
            self.now = max(self.now, at)
            guard += 1
            if guard > 1_000_000:  # pragma: no cover - an engine that never waits
                raise RuntimeError(f"no progress of the fake time at {self.now}")
            v = data if kind in ("start", "timer") else data[1] if kind == "deliver" else None
            if kind == "event":
                v = data[0]
            fz = self.freeze.get(v) if v is not None else None
            if fz is not None and fz[0] <= self.now < fz[1]:
                self._push(fz[1], kind, data)  # a stopped process handles it when it resumes
                continue
            getattr(self, f"_on_{kind}")(data)
        return MemRun(
            results=self.results,
            logs=self.logs,
            progress=self.progress,
            models=self.models,
            outcome=self.outcome,
            end_time=self.last_activity,
            injected=self.injected,
            not_applied=self._not_applied(),
        )

    def _not_applied(self) -> list[dict]:
        """The node faults that never took effect, with why, as a launcher reports them."""
        nan_sent: dict[int, set[int]] = {}
        for i in self.injected:
            if i["fault"] == "nan":
                nan_sent.setdefault(i["node"], set()).add(i["step"])
        return not_applied(
            self.node_faults,
            launcher_pending=self.triggers.never_fired(),
            nan_sent=nan_sent,
            reached=last_steps(self.results, global_steps=self.f.global_steps),
            global_steps=self.f.global_steps,
        )

    def _feed(self, v: int, event: NetEvent | None) -> None:
        if v in self.dead or v in self.done:
            return
        self.last_activity = self.now
        if event is None:
            actions = self.engines[v].handle(None, self.now)
        else:
            actions = self.engines[v].handle(event, self.now)
        self._perform(v, actions)
        self._schedule_timer(v)

    def _on_start(self, v: int) -> None:
        self.last_activity = self.now
        self.logs[v].append(("connected", {"peers": list(self.neighbours[v])}))
        self._perform(v, self.engines[v].start(self.now))
        self._schedule_timer(v)

    def _on_timer(self, v: int) -> None:
        if self._timer.get(v) is None:
            return
        w = self.engines[v].next_wakeup()
        if w is None or w > self.now:
            self._timer[v] = None
            self._schedule_timer(v)
            return
        self._timer[v] = None
        self._feed(v, None)

    def _on_event(self, data: tuple[int, NetEvent]) -> None:
        v, ev = data
        self._feed(v, ev)

    def _on_deliver(self, data: tuple[int, int, bytes]) -> None:
        src, dst, frame = data
        if dst in self.dead or dst in self.done or self._edge(src, dst) in self._cut:
            return
        self.traffic[dst]["bytes_received"] += len(frame)
        self.traffic[dst]["messages_received"] += 1
        self._feed(dst, Inbound(src, decode_message(frame)))

    def _on_crash(self, v: int) -> None:
        if v in self.dead or v in self.done:
            return
        self.dead.add(v)
        self.outcome[v] = "crashed"
        for w in self.neighbours[v]:
            self._notice_down(
                w, v, "connection lost: the node died", self.now + (self.f.detect or 0.0)
            )

    def _silence(self) -> float | None:
        return self.f.detect if self.f.silence is None else self.f.silence

    def _on_cut(self, link: tuple[int, int], detect: float | None = -1.0) -> None:
        a, b = link
        self._cut.add(self._edge(a, b))
        detect = self._silence() if detect == -1.0 else detect
        if detect is not None:
            at = self.now + detect
            reason = f"silent for {detect:.1f} s: no message or heartbeat"
            self._notice_down(a, b, reason, at)
            self._notice_down(b, a, reason, at)

    def _on_corrupt(self, link: tuple[int, int]) -> None:
        """A frame failed authentication: the receiver drops the channel, both ends see it
        down at once, and the link is redialled a moment later."""
        a, b = link
        if self._edge(a, b) in self._cut:
            return
        self._cut.add(self._edge(a, b))
        reason = "authentication failed: frame tampered with or corrupt"
        self._notice_down(a, b, reason, self.now)
        self._notice_down(b, a, reason, self.now)
        self._push(self.now + self.f.redial, "heal", (a, b))

    def _on_heal(self, link: tuple[int, int]) -> None:
        a, b = link
        if self._edge(a, b) in self._declared_cut:
            return  # a declared cut stays until its own heal
        self._cut.discard(self._edge(a, b))
        for v, w in ((a, b), (b, a)):
            if (v, w) in self._noticed and w not in self.dead and w not in self.done:
                self._noticed.discard((v, w))
                self._push(self.now, "event", (v, PeerUp(w)))

    # ------------------------------------------------------------------ actions

    def _perform(self, v: int, actions: list) -> None:
        for a in actions:
            if isinstance(a, Send):
                self._send(v, a)
            elif isinstance(a, Log):
                self.logs[v].append((a.kind, a.fields))
            elif isinstance(a, Progress):
                self.progress[v].append(a.fields)
                for fault in self.triggers.fire(v, a.fields):
                    self._declared(fault, v, a.fields)
            elif isinstance(a, Finish):
                self._finish(v, a)

    def _declared(self, fault, by: int, fields: dict) -> None:
        """Apply a declared node fault now (it fired on ``by``'s progress report)."""
        v = fault.node
        self.injected.append(
            {"fault": fault.kind, "spec": fault.spec, "node": v, "step": fields.get("step", 0),
             "reported_by": by, "t_s": self.now}
        )  # fmt: skip
        links = [(v, w) for w in self.neighbours[v]]
        if fault.kind == "kill":
            self._push(self.now, "crash", v)
        elif fault.kind == "cut":
            for a, b in links:
                self._declared_cut.add(self._edge(a, b))
                self._on_cut((a, b))
        elif fault.kind == "heal":
            for a, b in links:
                self._declared_cut.discard(self._edge(a, b))
                self._push(self.now, "heal", (a, b))
        elif fault.kind == "stop":
            end = self.now + fault.seconds
            self.freeze[v] = (self.now, end)
            silence = self._silence()
            if silence is not None and fault.seconds > silence:
                # Its neighbours hear nothing for ``silence`` seconds and drop the channels;
                # they come back once the node runs again and the leader redials.
                for a, b in links:
                    self._push(self.now + silence, "cut_now", (a, b))
                    self._push(end + self.f.redial, "heal", (a, b))

    def _on_cut_now(self, link: tuple[int, int]) -> None:
        self._on_cut(link, 0.0)

    def _send(self, v: int, a: Send) -> None:
        dst = a.peer
        if (v, dst) in self._noticed:
            # The channel is known down: the transport refuses at once.
            self._push(
                self.now,
                "event",
                (v, PeerDown(dst, f"send failed: PeerGone: no channel to node {dst}")),
            )
            return
        m = a.message
        bad = nan_message(m, self.f.nan.get(v, ()))
        if bad is not None:
            m = bad
            self.injected.append({"fault": "nan", "node": v, "step": m.step, "peer": dst,
                                  "t_s": self.now})  # fmt: skip
        frame = encode_message(m)
        self.traffic[v]["bytes_sent"] += len(frame)
        self.traffic[v]["messages_sent"] += 1
        if a.on_sent is not None:
            self.logs[v].append((a.on_sent.kind, a.on_sent.fields))
        if dst in self.dead or self._edge(v, dst) in self._cut:
            return  # lost with the dead node or on the cut link
        if self.rng.random() < self.f.drop:
            return
        copies = 2 if self.rng.random() < self.f.duplicate else 1
        if self.f.corrupt and self.rng.random() < self.f.corrupt:
            self._push(self._link_time(v, dst, self.now), "corrupt", (v, dst))
            return
        for _ in range(copies):
            self._push(self._link_time(v, dst, self.now), "deliver", (v, dst, frame))

    def _finish(self, v: int, a: Finish) -> None:
        self.done.add(v)
        self.outcome[v] = "finished"
        self.results[v] = {**a.result, **self.traffic[v]}
        if a.models is not None:
            self.models[v] = a.models
        # The peer closes its channels: each neighbour sees it after the last message on the link.
        for w in self.neighbours[v]:
            if w not in self.dead and w not in self.done and (w, v) not in self._noticed:
                self._noticed.add((w, v))
                at = self._link_time(v, w, self.now)
                self._push(at, "event", (w, PeerDown(v, "connection closed by the peer")))


# ---------------------------------------------------------------------------------- helpers


def node_streams(seed: int, n: int, cfg=None) -> seeds.PerNodeStreams:
    """Per-node secret streams of an in-memory run, deterministic from ``seed``: keys and
    nonces derived from it, the config digest of ``cfg`` (a fixed one without it). The streams
    a run's peers would use; hand them to the simulator to compare bit for bit."""
    run_id = hashlib.sha256(b"memnet run %d" % seed).digest()[:16]
    digest = seeds.config_digest(cfg) if cfg is not None else hashlib.sha256(b"memnet").digest()
    keys = {
        v: X25519PrivateKey.from_private_bytes(
            hashlib.sha256(b"memnet key %d %d" % (seed, v)).digest()
        )
        for v in range(n)
    }
    public = {
        v: k.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        for v, k in keys.items()
    }
    by_node = {}
    for v in range(n):
        by_node[v] = seeds.NodeSecretStreams(
            keys[v],
            run_id,
            v,
            config_digest=digest,
            nonce=hashlib.sha256(b"memnet nonce %d %d" % (seed, v)).digest()[:16],
        )
        by_node[v].peer_keys = public
    return seeds.PerNodeStreams(by_node)
