"""Per-step cost budget of one peer: where its CPU time goes, by part of the stack.

A measuring instrument for ``bench/bench_vs_zmq.py --budget``, off unless asked for: with the
environment variable ``CFREE_BUDGET`` set to ``NODE:PATH``, the peer of node ``NODE`` wraps the
functions below in counters before it starts, and writes ``PATH`` (JSON) when its engine
finishes. Every other peer, and every peer without the variable, runs untouched.

Each wrapped call adds its own thread CPU time (``time.thread_time_ns``), minus the time of the
wrapped calls nested in it, to its part (exclusive time, so the parts add up):

=================  ===========================================================================
part               what is wrapped
=================  ===========================================================================
engine             the node engine's ``start`` and ``handle`` (the step exchange and the node
                   program, e.g. the gossip update)
view log           ``ViewLogWriter`` record encoding and writing (the ``write`` system calls)
digest             ``value_digest`` (BLAKE3 of a value, for the send / recv records)
AEAD               the frame cipher's encrypt and decrypt
framing/codec      the message envelope (``encode_message`` / ``decode_message``), the
                   channel's frames (``SecureChannel.send`` / ``receive_data``), the
                   transport's send and dispatch
copies             the array copies made by name: ``codec.array_ext`` (an array into a
                   msgpack extension) and the engine's copy of a received value
socket writes      the transport handing frames to its sockets
event loop, rest   the rest of the process CPU time: the event loop and its socket reads, the
                   peer's driver loop, progress events
=================  ===========================================================================

With a ``PATH`` ending in ``.prof`` the node's steps run under ``cProfile`` instead (pstats
output timed in the thread's CPU time, for finding what to count next). The counters cost
about half a microsecond per wrapped call (two clock reads), charged to the part they wrap; the
totals are per step, over the steps between the engine's start and its finish.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import time
from collections import defaultdict
from pathlib import Path

ENV = "CFREE_BUDGET"
PARTS = (
    "engine",
    "view log",
    "digest",
    "AEAD",
    "framing/codec",
    "copies",
    "socket writes",
    "event loop, rest",
)

_clock = time.thread_time_ns


class _Budget:
    def __init__(self, node: int, path: Path) -> None:
        self.node = node
        self.path = path
        self.totals: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)
        self.stack: list[int] = []  # time of nested wrapped calls, per open call
        self.t0_cpu = 0
        self.t0_wall = 0.0
        self.t0_faults = 0
        self.steps = 0
        self.done = False

    def reset(self) -> None:
        self.totals.clear()
        self.calls.clear()
        self.t0_cpu = time.process_time_ns()
        self.t0_wall = time.monotonic()
        self.t0_faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def timed(self, part: str, fn):
        totals, calls, stack = self.totals, self.calls, self.stack

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            stack.append(0)
            t = _clock()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = _clock() - t
                totals[part] += dt - stack.pop()
                calls[part] += 1
                if stack:
                    stack[-1] += dt

        wrapper.__budget_wrapped__ = fn  # type: ignore[attr-defined]
        return wrapper

    def finish(self, steps: int) -> None:
        if self.done:
            return
        self.done = True
        cpu = time.process_time_ns() - self.t0_cpu
        wall = time.monotonic() - self.t0_wall
        parts = {p: self.totals.get(p, 0) for p in PARTS if p != "event loop, rest"}
        parts["event loop, rest"] = max(0, cpu - sum(parts.values()))
        out = {
            "node": self.node,
            "steps": steps,
            "cpu_s": cpu / 1e9,
            "page_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - self.t0_faults,
            "wall_s": wall,
            "parts_s": {p: v / 1e9 for p, v in parts.items()},
            "calls": dict(self.calls),
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(out, indent=1))
        os.replace(tmp, self.path)


_active: _Budget | None = None


def _patch(obj, name: str, part: str, budget: _Budget) -> None:
    fn = getattr(obj, name)
    if getattr(fn, "__budget_wrapped__", None) is not None:
        return
    setattr(obj, name, budget.timed(part, fn))


def maybe_install(node: int) -> bool:
    """Install the counters when ``CFREE_BUDGET`` names this node; True if installed."""
    global _active
    spec = os.environ.get(ENV)
    if not spec:
        return False
    who, _, path = spec.partition(":")
    if not who.isdigit() or int(who) != node or not path:
        return False
    if path.endswith(".prof"):  # a cProfile of the steps instead of the counters
        _install_profile(Path(path))
        return True
    budget = _active = _Budget(node, Path(path))

    from coordinator_free import codec, viewlog
    from coordinator_free.engine import step
    from coordinator_free.net import channel, transport, wire

    engine_cls = step.StepEngine
    start, handle = engine_cls.start, engine_cls.handle

    def timed_start(self, now):
        budget.reset()
        return start(self, now)

    def timed_handle(self, event, now):
        actions = handle(self, event, now)
        if self.finished:
            budget.finish(self.steps)
        return actions

    engine_cls.start = budget.timed("engine", timed_start)
    engine_cls.handle = budget.timed("engine", timed_handle)

    _patch(viewlog.ViewLogWriter, "_write_record", "view log", budget)
    for name in ("_flush_pending", "flush"):
        if hasattr(viewlog.ViewLogWriter, name):
            _patch(viewlog.ViewLogWriter, name, "view log", budget)
    timed_digest = budget.timed("digest", viewlog.value_digest)
    viewlog.value_digest = timed_digest
    step.digest = timed_digest

    for name in ("_seal", "_open", "_seal_pieces"):
        if hasattr(channel, name):
            _patch(channel, name, "AEAD", budget)
    derive = channel.SecureChannel._derive_transport_keys

    def derive_timed(self):
        k4 = derive(self)
        if not isinstance(self._send_aead, _TimedAEAD):
            self._send_aead = _TimedAEAD(self._send_aead, budget)
            self._recv_aead = _TimedAEAD(self._recv_aead, budget)
        return k4

    channel.SecureChannel._derive_transport_keys = derive_timed

    if hasattr(transport, "encode_message"):
        transport.encode_message = budget.timed("framing/codec", wire.encode_message)
    if hasattr(transport, "encode_parts"):
        transport.encode_parts = budget.timed("framing/codec", wire.encode_parts)
    transport.decode_message = budget.timed("framing/codec", wire.decode_message)
    for name in ("send", "receive_data"):
        _patch(channel.SecureChannel, name, "framing/codec", budget)
    for name in ("send_now", "_dispatch", "_feed", "_write"):
        _patch(transport.PeerNet, name, "framing/codec", budget)
    _patch(transport.PeerNet, "_flush", "socket writes", budget)

    for name in ("array_ext", "_default"):
        if hasattr(codec, name):
            _patch(codec, name, "copies", budget)
    codec._local.__dict__.pop("packer", None)  # a packer built before holds the old default
    if hasattr(step, "own_copy"):
        _patch(step, "own_copy", "copies", budget)
    return True


class _TimedAEAD:
    """An AEAD whose encrypt / decrypt count as the AEAD part."""

    def __init__(self, inner, budget: _Budget) -> None:
        self.encrypt = budget.timed("AEAD", inner.encrypt)
        self.decrypt = budget.timed("AEAD", inner.decrypt)
        for name in ("encrypt_into", "decrypt_into"):
            if hasattr(inner, name):
                setattr(self, name, budget.timed("AEAD", getattr(inner, name)))


def _install_profile(path: Path) -> None:
    """cProfile the node's steps (engine start to finish) into ``path`` (pstats format), timed
    in the thread's CPU time: with 16 peers on 2 cores, wall time would charge to whatever
    call was running when the scheduler switched the process out (a socket write that wakes
    the receiver, most often)."""
    import cProfile

    from coordinator_free.engine import step

    prof = cProfile.Profile(time.thread_time)
    start, handle = step.StepEngine.start, step.StepEngine.handle

    def profiled_start(self, now):
        prof.enable()
        return start(self, now)

    def profiled_handle(self, event, now):
        actions = handle(self, event, now)
        if self.finished:
            prof.disable()
            prof.dump_stats(path)
        return actions

    step.StepEngine.start, step.StepEngine.handle = profiled_start, profiled_handle
