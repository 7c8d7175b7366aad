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

from coordinator_free import roster as roster_mod
from coordinator_free import seeds
from coordinator_free.config import Config
from coordinator_free.families import make_plan
from coordinator_free.families.averaging import protocol as mf
from coordinator_free.families.randomized import protocol as rg
from coordinator_free.net.transport import Inbound, PeerDown, PeerNet, PeerUp
from coordinator_free.net.wire import Message
from coordinator_free.viewlog import ViewLogWriter

log = logging.getLogger("coordinator_free.peer")

# How long after a neighbour's channel went down we keep waiting for it at step deadlines (the
# transport redials meanwhile), in units of the step deadline. Past that a down neighbour is
# skipped at once, so a crashed neighbour costs a bounded amount of time, not T deadlines.
DOWN_GRACE_DEADLINES = 2.0


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
    # Token protocols: how every walk ended ({"how", "at", "step"} by token id), the final value
    # of the walks that completed at this node, and this node's re-routes.
    walks: dict | None = None
    # The socket addresses of each neighbour's channel once connected ({"local", "remote"} as
    # "host:port"): where the node really talked to whom (containers, namespaces, LAN hosts).
    channels: dict | None = None

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
    plan = make_plan(cfg)
    if cfg.learning and not plan.decentralized:
        raise PeerFailure(
            f"{cfg.protocol.name} is the trusted-curator baseline: it runs in one process "
            "(cfree run or cfree simulate), not as peers"
        )
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
        logs_dir / f"node-{node_id}.vlog",
        run_id=roster.run_id,
        node=node_id,
        params=params,
        mode=0o600,  # what a node saw is its own business
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
    try:
        addr = await net.start(listen_sock)
        vlog.write("listen", host=addr[0], port=addr[1])
        progress.emit(event="listening", node=node_id, port=addr[1])
        await net.connect(cfg.network.connect_timeout_s)
        channels = channel_addresses(net, neighbours)
        vlog.write("connected", peers=neighbours)
        progress.emit(event="connected", node=node_id)

        # The node's value, noise and minibatches come from streams seeded by its own private
        # key: nobody else can recompute them, whatever they know of the config.
        own = seeds.NodeSecretStreams(key, roster.run_id_bytes, node_id)
        engine = _StepEngine(
            net,
            vlog,
            neighbours,
            plan.steps,
            deadline,
            cfg.log.values,
            partners_at=lambda t: plan.partners_at(node_id, t),
        )

        async def gossip(t0: int, count: int, current: np.ndarray) -> np.ndarray:
            """``count`` synchronous gossip steps from global step ``t0``."""
            previous: np.ndarray | None = None
            for t in range(t0, t0 + count):
                got = await engine.exchange(t, current)
                terms = mf.step_terms(plan.row_at(node_id, t), node_id, current, got)
                nxt = mf.gossip_update(terms, plan.gamma_at(t), previous)
                previous, current = current, nxt
                progress.emit(event="step", node=node_id, step=t + 1, of=plan.steps)
                if progress.reader_gone:
                    vlog.write("aborted", step=t + 1, reason="the launcher went away")
                    raise PeerFailure(f"the launcher went away (after step {t + 1}); stopping")
            return current

        async def pairwise(current: np.ndarray, t0: float) -> np.ndarray:
            """Randomized gossip: this node's exchanges in clock order, each at its clock time
            (``tick`` seconds per clock unit after ``t0``); a late partner is waited for (up to
            the deadline), never overtaken."""
            mine = plan.exchanges_of(node_id)
            for e in mine:
                wait = t0 + e.time * plan.tick - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                got = await engine.exchange(e.t, current)
                current = rg.exchange_update(plan, node_id, e.t, current, got)
                partner = e.partner(node_id)
                vlog.write(
                    "exchange",
                    step=e.t,
                    peer=partner,
                    initiator=e.initiator,
                    clock=e.time,
                    averaged=partner in got,
                )
                # Progress in global exchange numbers: this node is done up to exchange t.
                progress.emit(event="step", node=node_id, step=e.t + 1, of=plan.steps)
                if progress.reader_gone:
                    vlog.write("aborted", step=e.t + 1, reason="the launcher went away")
                    raise PeerFailure(f"the launcher went away (at exchange {e.t}); stopping")
            progress.emit(event="step", node=node_id, step=plan.steps, of=plan.steps)
            return current

        t_run = time.monotonic()
        if cfg.walk:
            return await _run_walk(
                cfg, plan, net, vlog, node_id, own, progress, out_dir, t_start, t_run, channels
            )
        models: list[np.ndarray] = []
        if cfg.learning:
            from coordinator_free.families.learning import protocol as lp

            task = lp.make_task(cfg, plan.n)
            theta = task.model.init()
            models.append(theta)
            K = plan.gossip_steps
            dec = None
            if plan.protocol == "decor":
                from coordinator_free.families.decor.node import DecorNode

                dec = DecorNode(plan, node_id, own, vlog)
                engine.handlers.update(decor_drop=dec.on_drop, decor_pub=dec.on_late_key)
                await dec.exchange(net, neighbours, cfg.network.connect_timeout_s, engine)
            for r in range(plan.rounds):
                corr = dec.term(r) if dec is not None else None
                thetahat = lp.local_step(plan, task, node_id, r, theta, own, corr)
                theta = await gossip(r * K, K, thetahat)
                if dec is not None:
                    await dec.after_round(r, engine, net, deadline)
                models.append(theta)
            current = theta
        else:
            x = mf.private_value(cfg, node_id, own)
            start = mf.initial_value(x, mf.local_noise(cfg, node_id, own))
            del x  # the raw input is never needed again
            if isinstance(plan, rg.RandomizedPlan):
                current = await pairwise(start, t_run)
            else:
                current = await gossip(0, plan.steps, start)
        run_s = time.monotonic() - t_run
        await engine.finish()
        missed, late = engine.missed, engine.late
        result = PeerResult(
            node=node_id,
            estimate=[float(v) for v in current],
            steps=plan.steps,
            elapsed_s=run_s,
            **traffic(net),
            missed=missed,
            late=late,
            channels=channels,
        )
        vlog.write("finished", steps=plan.steps, missed=len(missed), late=late)
        if models:
            # The node's own model after every round: its output, never sent or logged.
            final_models = lp.models_path(out_dir, node_id)
            tmp_models = final_models.with_suffix(".tmp.npy")
            np.save(tmp_models, np.stack(models), allow_pickle=False)
            tmp_models.replace(final_models)
        write_result(out_dir, result)
        progress.emit(event="finished", node=node_id, elapsed_s=time.monotonic() - t_start)
        return result
    finally:
        await net.close()
        vlog.close()


def channel_addresses(net, neighbours) -> dict:
    """``{neighbour: {"local": "host:port", "remote": "host:port"}}`` of the open channels."""
    out = {}
    for j in neighbours:
        ends = net.channel_endpoints(j)
        if ends is not None:
            (lh, lp), (rh, rp) = ends
            out[str(j)] = {"local": f"{lh}:{lp}", "remote": f"{rh}:{rp}"}
    return out


async def _run_walk(
    cfg, plan, net, vlog, node_id, own, progress, out_dir, t_start, t_run, channels=None
):
    """Token protocols: serve the tokens (walkpeer.TokenEngine), then write the result."""
    from coordinator_free.engine.token import TokenEngine

    deadline = cfg.network.deadline_s
    engine = TokenEngine(plan, cfg, net, vlog, node_id, own, deadline, cfg.log.values, progress)
    # A bound on the whole walk, never reached in a live run: every hop of every token may use
    # its deadline a few times over.
    bound = (plan.hops * plan.tokens + 2) * deadline * 4 + 60.0
    outcome = await engine.run(bound)
    run_s = time.monotonic() - t_run
    result = PeerResult(
        node=node_id,
        estimate=[],
        steps=outcome.steps_made,
        elapsed_s=run_s,
        **traffic(net),
        missed=outcome.reroutes,
        walks={
            "ended": {str(j): e for j, e in outcome.ended.items()},
            "finals": {str(j): v for j, v in outcome.finals.items()},
        },
        channels=channels,
    )
    vlog.write("finished", steps=outcome.steps_made, reroutes=len(outcome.reroutes))
    write_result(out_dir, result)
    progress.emit(event="finished", node=node_id, elapsed_s=time.monotonic() - t_start)
    return result


class _StepEngine:
    """Synchronous exchange of one value per step with every neighbour, with deadlines.

    * Sends go to all live neighbours concurrently, each bounded by the step deadline (the
      transport drops a channel whose send does not drain in time, then redials).
    * Values for a later step (a neighbour that gave up waiting for us can be several steps
      ahead) are buffered until their step: at most steps x neighbours values.
    * Values for an earlier step are logged as late and not used.
    * A neighbour whose channel is down is waited for only during a grace period after it went
      down; a PeerUp brings it back and it gets our current value again at once.
    * Every value received is logged, used or not: the auditor counts what the node saw.
    """

    def __init__(self, net, vlog, neighbours, steps, deadline, log_values, partners_at=None):
        self.net, self.vlog = net, vlog
        self.neighbours = list(neighbours)
        # Whom the node exchanges with at step t: every neighbour (synchronous gossip) or the
        # partner of its exchange (randomized gossip).
        self.partners_at = partners_at or (lambda t: self.neighbours)
        self.steps, self.deadline, self.log_values = steps, deadline, log_values
        self.down: dict[int, float] = {}  # peer -> monotonic time its channel went down
        self.finished: set[int] = set()  # neighbours that said "done"
        self.buffered: dict[tuple[int, int], np.ndarray] = {}  # (step, peer) -> value
        self.missed: list[dict] = []
        self.late = 0
        # Protocol messages other than values (kind -> handler(peer, message)), e.g. decor's.
        self.handlers: dict = {}
        # peer -> the latest step of which a value arrived from it (on time, early or late):
        # a neighbour that is late but still sending is alive and progressing.
        self.heard: dict[int, int] = {}

    def _log_value(self, kind: str, step: int, peer: int, value: np.ndarray, **extra) -> None:
        fields = {"digest": digest(value), "nbytes": value.nbytes, **extra}
        if self.log_values:
            fields["value"] = value
        self.vlog.write(kind, step=step, peer=peer, **fields)

    def _mark_down(self, peer: int, step: int, reason: str) -> None:
        if peer not in self.down:
            self.down[peer] = time.monotonic()
            self.vlog.write("peer-down", step=step, peer=peer, reason=reason)

    async def _send(self, peer: int, step: int, value: np.ndarray) -> None:
        msg = Message(kind="value", round=0, step=step, payload=value)
        try:
            await self.net.send(peer, msg, timeout=self.deadline)
        except (ConnectionError, OSError) as exc:  # PeerGone, PeerUnreachable
            self._mark_down(peer, step, f"send failed: {type(exc).__name__}: {exc}")
            return
        self.vlog.write("send", step=step, peer=peer, digest=digest(value), nbytes=value.nbytes)

    def _waitable(self, peer: int, now: float) -> bool:
        if peer in self.finished:
            return False
        since = self.down.get(peer)
        return since is None or now - since < DOWN_GRACE_DEADLINES * self.deadline

    async def exchange(self, t: int, current: np.ndarray) -> dict[int, np.ndarray]:
        """Send ``current`` to step t's partners and collect their step-t values until the
        deadline."""
        partners = self.partners_at(t)
        live = [w for w in partners if w not in self.down and w not in self.finished]
        await asyncio.gather(*(self._send(w, t, current) for w in live))
        got = {w: self.buffered.pop((t, w)) for w in partners if (t, w) in self.buffered}
        step_deadline = time.monotonic() + self.deadline
        while True:
            now = time.monotonic()
            if not any(w not in got and self._waitable(w, now) for w in partners):
                break
            if now >= step_deadline:
                break
            ev = await self.net.next_event(step_deadline - now)
            if ev is None:
                break
            if isinstance(ev, PeerDown):
                self._mark_down(ev.peer, t, str(ev.reason))
            elif isinstance(ev, PeerUp):
                if self.down.pop(ev.peer, None) is not None:
                    self.vlog.write("peer-up", step=t, peer=ev.peer)
                    if ev.peer in partners:
                        await self._send(ev.peer, t, current)
            elif isinstance(ev, Inbound):
                self._inbound(t, ev.peer, ev.message, current.shape, got)
        for w in partners:
            if w not in got:
                if w in self.finished:
                    reason = "finished"
                elif w in self.down:
                    reason = "peer-down"
                else:
                    reason = "deadline"
                self.missed.append({"step": t, "peer": w, "reason": reason})
                self.vlog.write("miss", step=t, peer=w, reason=reason)
        return got

    def stash(self, peer: int, m: Message, shape) -> None:
        """A message that arrived before the first step (e.g. during a seed exchange): values
        are kept for their step, other kinds go to their handler."""
        self._inbound(-1, peer, m, shape, {})

    def _inbound(self, t: int, peer: int, m: Message, shape, got: dict) -> None:
        if m.kind in self.handlers:
            self.handlers[m.kind](peer, m)
            return
        if m.kind == "done":
            self.finished.add(peer)
            self.vlog.write("peer-done", step=t, peer=peer, at=m.step)
            return
        if m.kind != "value" or m.payload is None or m.payload.shape != shape:
            self.vlog.write("bad-message", step=t, peer=peer, kind=m.kind)
            return
        value = np.array(m.payload, dtype=np.float64)  # own copy, writable
        if not 0 <= m.step < self.steps:
            self.vlog.write("bad-message", step=t, peer=peer, kind="beyond-last-step", at=m.step)
            return
        if peer not in self.partners_at(m.step):
            self.vlog.write("bad-message", step=t, peer=peer, kind="not-a-partner", at=m.step)
            return
        self.heard[peer] = max(m.step, self.heard.get(peer, -1))
        if m.step < t:
            self.late += 1
            self._log_value("late", m.step, peer, value, now=t)
        elif (m.step == t and peer in got) or (m.step, peer) in self.buffered:
            self.vlog.write("duplicate", step=m.step, peer=peer)
        elif m.step == t:
            got[peer] = value
            self._log_value("recv", t, peer, value)
        else:
            self.buffered[(m.step, peer)] = value
            self._log_value("recv", m.step, peer, value)

    async def finish(self) -> None:
        """Tell neighbours we are done, then wait (bounded) for theirs, so a normal end is never
        mistaken for a crash. Values still arriving are logged as late."""

        def late(peer: int, m: Message) -> None:
            if (
                m.kind == "value"
                and m.payload is not None
                and 0 <= m.step < self.steps
                and peer in self.partners_at(m.step)
            ):
                self.late += 1
                self._log_value("late", m.step, peer, np.array(m.payload), now=self.steps)

        live = [w for w in self.neighbours if w not in self.down]
        await say_goodbye(self.net, live, self.finished, self.deadline, self.steps, late)


async def say_goodbye(net, live, finished, deadline: float, step: int, on_message) -> None:
    """The end of a node's run: send "done" to every live neighbour, then wait (one deadline at
    most) for the "done" of those that have not said it yet, so a normal end is never mistaken
    for a crash. Any other message arriving meanwhile goes to ``on_message(peer, message)``."""
    done = Message(kind="done", round=0, step=step)

    async def say_done(w: int) -> None:
        try:
            await net.send(w, done, timeout=deadline)
        except (ConnectionError, OSError):
            pass

    await asyncio.gather(*(say_done(w) for w in live))
    pending = {w for w in live if w not in finished}
    end = time.monotonic() + deadline
    while pending and time.monotonic() < end:
        ev = await net.next_event(end - time.monotonic())
        if ev is None:
            break
        if isinstance(ev, PeerDown):
            pending.discard(ev.peer)
        elif isinstance(ev, Inbound):
            if ev.message.kind == "done":
                pending.discard(ev.peer)
            else:
                on_message(ev.peer, ev.message)


def traffic(net) -> dict:
    """A node's traffic counters over all its channels (the PeerResult fields)."""
    stats = net.stats.values()
    return {
        "bytes_sent": int(sum(s.bytes_sent for s in stats)),
        "bytes_received": int(sum(s.bytes_received for s in stats)),
        "messages_sent": int(sum(s.frames_sent for s in stats)),
        "messages_received": int(sum(s.frames_received for s in stats)),
    }


def write_result(out_dir: Path, result: PeerResult) -> None:
    """results/node-<id>.json, written to a temporary file and renamed into place."""
    final = out_dir / "results" / f"node-{result.node}.json"
    tmp = final.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result.to_json(), indent=1))
    tmp.replace(final)


def listen_socket(spec: str) -> socket.socket:
    """A listening TCP socket on ``HOST:PORT`` (``[v6]:PORT`` for IPv6)."""
    host, sep, port = spec.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("expected HOST:PORT with a port in 1..65535")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, int(port)))
        s.listen(128)
    except OSError:
        s.close()
        raise
    return s


def peer_main(args) -> int:
    """Entry point of ``cfree peer``."""
    from coordinator_free import config as config_mod

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
    elif getattr(args, "listen", None):
        try:
            sock = listen_socket(args.listen)
        except (ValueError, OSError) as exc:
            print(f"cfree peer: --listen {args.listen}: {exc}", file=sys.stderr)
            return 2
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
