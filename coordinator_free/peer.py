"""The peer process: one node of a run, driving Muffliato over encrypted channels.

Data flow through a peer (see docs/architecture.md):

    config + roster + own key  ->  plan (graph, W, T, gamma)
    private value + own noise  ->  x^0
    for each step t:  send x^t to every neighbour  ->  collect step-t values until the deadline
                      (early values are buffered, late ones logged and dropped, a missing
                      neighbour is recorded and replaced by the node's own value)
                      ->  x^{t+1} = gossip_update(...)
    view log: every value received, every send (digest only), every miss, the public parameters
    result file: the final estimate and traffic counters

Every await has a deadline: a run always ends, with results or a clear error.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import roster as roster_mod
from .config import Config
from .net.transport import Inbound, PeerDown, PeerNet, PeerUp
from .net.wire import Message
from .protocols import muffliato as mf
from .viewlog import ViewLogWriter

log = logging.getLogger("coordinator_free.peer")

# A neighbour can be at most one step ahead of us in a synchronous run (it needs our step-t value
# to reach t+1, unless it gave up on us at a deadline). Anything further ahead than this is a
# protocol violation and is dropped, which bounds the buffer.
MAX_STEPS_AHEAD = 4
DONE_WAIT_S = 5.0


class PeerFailure(RuntimeError):
    pass


@dataclass
class PeerResult:
    node: int
    estimate: list[float]
    steps: int
    elapsed_s: float
    bytes_sent: int
    bytes_received: int
    messages_sent: int
    messages_received: int
    missed: list[dict] = field(default_factory=list)
    late: int = 0

    def to_json(self) -> dict:
        return self.__dict__.copy()


def digest(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()[:32]


class Progress:
    """JSON-lines progress events on a file descriptor (read by the local launcher)."""

    def __init__(self, fd: int | None):
        self._f = os.fdopen(fd, "w", buffering=1) if fd is not None else None
        # Set when the reader of the events (the launcher) has gone away: a peer started by a
        # launcher stops instead of running on as an orphan.
        self.reader_gone = False

    def emit(self, **event) -> None:
        if self._f is not None:
            try:
                self._f.write(json.dumps(event) + "\n")
            except (BrokenPipeError, ValueError):
                self._f = None
                self.reader_gone = True

    def close(self) -> None:
        if self._f is not None:
            try:
                self._f.close()
            except OSError:
                pass
            self._f = None


async def run_peer(
    cfg: Config,
    roster: roster_mod.Roster,
    node_id: int,
    key,
    out_dir: Path,
    *,
    listen_sock: socket.socket | None = None,
    progress: Progress | None = None,
) -> PeerResult:
    progress = progress or Progress(None)
    plan = mf.make_plan(cfg)
    if plan.n != len(roster.entries):
        raise PeerFailure(
            f"the config describes {plan.n} nodes but the roster lists {len(roster.entries)}"
        )
    if node_id not in roster.ids:
        raise PeerFailure(f"node id {node_id} is not in the roster (ids 0..{plan.n - 1})")
    roster_mod.check_key_matches(roster, node_id, key)
    neighbours = plan.neighbours(node_id)
    row = plan.row(node_id)
    deadline = cfg.network.deadline_s

    logs_dir = out_dir / "logs"
    results_dir = out_dir / "results"
    logs_dir.mkdir(parents=True, exist_ok=True)
    results_dir.mkdir(parents=True, exist_ok=True)
    params = {
        **plan.public_params(),
        "node": node_id,
        "neighbours": neighbours,
        "weights": {str(w): wt for w, wt in row.items()},
        "weights_scheme": cfg.protocol.weights,
        "deadline_s": deadline,
        "config": cfg.to_dict(),
    }
    vlog = ViewLogWriter(
        logs_dir / f"node-{node_id}.vlog", run_id=roster.run_id, node=node_id, params=params
    )
    net = PeerNet(
        node_id=node_id,
        static_key=key,
        roster_keys=roster.public_keys(),
        addresses=roster.addresses(),
        run_id=roster.run_id_bytes,
        neighbours=neighbours,
        max_frame=cfg.network.max_frame_bytes,
    )
    t_start = time.monotonic()
    missed: list[dict] = []
    late = 0
    try:
        addr = await net.start(listen_sock)
        vlog.write("listen", host=addr[0], port=addr[1])
        progress.emit(event="listening", node=node_id, port=addr[1])
        await net.connect(cfg.network.connect_timeout_s)
        vlog.write("connected", peers=neighbours)
        progress.emit(event="connected", node=node_id)

        x = mf.private_value(cfg, node_id)
        current = mf.initial_value(x, mf.local_noise(cfg, node_id))
        del x  # the raw input is never needed again
        previous: np.ndarray | None = None
        down: set[int] = set()
        buffered: dict[tuple[int, int], np.ndarray] = {}  # (step, peer) -> value

        t_run = time.monotonic()
        for t in range(plan.steps):
            msg = Message(kind="value", round=0, step=t, payload=current)
            for w in neighbours:
                if w in down:
                    continue
                try:
                    await asyncio.wait_for(net.send(w, msg), timeout=deadline)
                    vlog.write(
                        "send", step=t, peer=w, digest=digest(current), nbytes=current.nbytes
                    )
                except (TimeoutError, ConnectionError, OSError, RuntimeError) as exc:
                    down.add(w)
                    vlog.write("peer-down", step=t, peer=w, reason=f"send failed: {exc}")

            got: dict[int, np.ndarray] = {}
            for w in neighbours:
                if (t, w) in buffered:
                    got[w] = buffered.pop((t, w))
            waiting = {w for w in neighbours if w not in got and w not in down}
            step_deadline = time.monotonic() + deadline
            while waiting:
                remaining = step_deadline - time.monotonic()
                if remaining <= 0:
                    break
                ev = await net.next_event(remaining)
                if ev is None:
                    break
                if isinstance(ev, PeerDown):
                    if ev.peer in neighbours and ev.peer not in down:
                        down.add(ev.peer)
                        vlog.write("peer-down", step=t, peer=ev.peer, reason=str(ev.reason))
                    waiting.discard(ev.peer)
                    continue
                if isinstance(ev, PeerUp):
                    # The channel is back (the transport redialled): use the peer again from the
                    # next step on; this step's value may still arrive before the deadline.
                    if ev.peer in down:
                        down.discard(ev.peer)
                        vlog.write("peer-up", step=t, peer=ev.peer)
                    continue
                if not isinstance(ev, Inbound):
                    continue
                m = ev.message
                if m.kind == "done":
                    continue
                if m.kind != "value" or m.payload is None or m.payload.shape != current.shape:
                    vlog.write("bad-message", step=t, peer=ev.peer, kind=m.kind)
                    continue
                value = np.array(m.payload, dtype=np.float64)  # own copy, writable
                if m.step == t:
                    if ev.peer in got:
                        vlog.write("duplicate", step=t, peer=ev.peer)
                        continue
                    got[ev.peer] = value
                    waiting.discard(ev.peer)
                    vlog.write("recv", step=t, peer=ev.peer, value=value, nbytes=value.nbytes)
                elif t < m.step <= t + MAX_STEPS_AHEAD:
                    buffered[(m.step, ev.peer)] = value
                    vlog.write("recv", step=m.step, peer=ev.peer, value=value, nbytes=value.nbytes)
                elif m.step < t:
                    late += 1
                    vlog.write("late", step=m.step, peer=ev.peer, value=value, now=t)
                else:
                    vlog.write(
                        "bad-message", step=t, peer=ev.peer, kind="too-far-ahead", msg_step=m.step
                    )
            for w in neighbours:
                if w not in got:
                    reason = "peer-down" if w in down else "deadline"
                    missed.append({"step": t, "peer": w, "reason": reason})
                    vlog.write("miss", step=t, peer=w, reason=reason)
            terms = mf.step_terms(row, node_id, current, got)
            nxt = mf.gossip_update(terms, plan.gamma_at(t), previous)
            previous, current = current, nxt
            progress.emit(event="step", node=node_id, step=t + 1, of=plan.steps)
            if progress.reader_gone:
                vlog.write("aborted", step=t + 1, reason="the launcher went away")
                raise PeerFailure(f"the launcher went away (after step {t + 1}); stopping")
        run_s = time.monotonic() - t_run

        # Tell neighbours we are finished, then wait (bounded) for theirs, so a normal end is
        # never mistaken for a crash.
        live = [w for w in neighbours if w not in down]
        for w in live:
            try:
                await asyncio.wait_for(
                    net.send(w, Message(kind="done", round=0, step=plan.steps)), deadline
                )
            except (TimeoutError, ConnectionError, OSError, RuntimeError):
                pass
        pending = set(live)
        end = time.monotonic() + DONE_WAIT_S
        while pending and time.monotonic() < end:
            ev = await net.next_event(end - time.monotonic())
            if ev is None:
                break
            if isinstance(ev, PeerDown):
                pending.discard(ev.peer)
            elif isinstance(ev, Inbound) and ev.message.kind == "done":
                pending.discard(ev.peer)
            elif isinstance(ev, Inbound) and ev.message.kind == "value":
                late += 1
                vlog.write(
                    "late",
                    step=ev.message.step,
                    peer=ev.peer,
                    value=np.array(ev.message.payload),
                    now=plan.steps,
                )
        stats = net.stats
        result = PeerResult(
            node=node_id,
            estimate=[float(v) for v in current],
            steps=plan.steps,
            elapsed_s=run_s,
            bytes_sent=int(sum(s.bytes_sent for s in stats.values())),
            bytes_received=int(sum(s.bytes_received for s in stats.values())),
            messages_sent=int(sum(s.frames_sent for s in stats.values())),
            messages_received=int(sum(s.frames_received for s in stats.values())),
            missed=missed,
            late=late,
        )
        vlog.write("finished", steps=plan.steps, missed=len(missed), late=late)
        tmp = results_dir / f"node-{node_id}.json.tmp"
        tmp.write_text(json.dumps(result.to_json(), indent=1))
        tmp.replace(results_dir / f"node-{node_id}.json")
        progress.emit(event="finished", node=node_id, elapsed_s=time.monotonic() - t_start)
        return result
    finally:
        await net.close()
        vlog.close()


def peer_main(args) -> int:
    """Entry point of ``cfree peer``."""
    from . import config as config_mod

    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format=f"node-{args.id} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        cfg = config_mod.load(args.config, args.set or [])
        ros = roster_mod.load_roster(args.roster)
        key = roster_mod.load_private_key(args.key)
    except (config_mod.ConfigError, roster_mod.RosterError, OSError) as exc:
        print(f"cfree peer: {exc}", file=sys.stderr)
        return 2
    sock = None
    if args.listen_fd is not None:
        sock = socket.socket(fileno=args.listen_fd)
    progress = Progress(args.progress_fd)
    try:
        _run_loop(
            run_peer(cfg, ros, args.id, key, Path(args.out), listen_sock=sock, progress=progress)
        )
    except Exception as exc:  # report the cause, never a silent hang
        msg = f"node {args.id} failed: {type(exc).__name__}: {exc}"
        print(f"cfree peer: {msg}", file=sys.stderr)
        progress.emit(event="failed", node=args.id, error=msg)
        return 1
    finally:
        progress.close()
    return 0


def _run_loop(coro):
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        return asyncio.run(coro)
    return uvloop.run(coro)
