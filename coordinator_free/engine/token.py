"""The token driver of a peer: tokens handed from holder to holder over the encrypted channels.

Hand-off of token j at step s from holder a to b (each message names (j, s)):

    a -> b  token  (the value)          b logs what it saw, answers  ack
    b -> a  ack                         a answers commit, logs the send, keeps custody
    a -> b  commit                      b owns the token, makes step s, hands it on
    b -> a  fwd     (after b's own hand-off commits)   a drops custody

* a keeps the token until b acknowledges. No ack by the deadline (or b's channel down): a sends
  ``abort`` to b, logs the re-route and draws another next hop by the protocol's rule without b
  (ring: none, the token is stuck there; complete graph: possibly a itself).
* b acts on the token only after ``commit``; an ``abort`` makes it drop its copy. If a's channel
  goes down between ack and commit, b takes the token (a sends abort before any re-route, and TCP
  delivers what a wrote before it died), logged as ``commit-assumed``.
* Custody: if b's channel goes down while a still holds custody of j (no ``fwd`` yet, no end of
  the walk), the token died with b: a reports it lost at b.
* The end of a walk (completed, lost, stuck) is flooded to every node as ``walk-end``; a node
  stops when every token has ended. A run-level bound ends the loop in any case.

Every value the node saw is logged (``token-seen``, with the sender, since TCP shows who sent
it), every step it made (``token-step``: step, whether its data went in), every send, re-route,
loss and end. Never its data, its noise or its hop draws.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np

from coordinator_free.families.walk import protocol as wk
from coordinator_free.net.transport import Inbound, PeerDown, PeerUp
from coordinator_free.net.wire import Message


@dataclass
class _Offer:
    to: int
    step: int
    value: np.ndarray
    attempt: int
    excluded: set[int]
    deadline: float


@dataclass
class _Incoming:
    frm: int
    value: np.ndarray
    deadline: float


@dataclass
class WalkOutcome:
    ended: dict[int, dict]  # token -> {"how", "at", "step"}
    finals: dict[int, list[float]]  # tokens whose walk completed here: the final token value
    steps_made: int
    reroutes: list[dict] = field(default_factory=list)


class TokenEngine:
    def __init__(self, plan, cfg, net, vlog, node, streams, deadline, log_values, progress):
        self.plan, self.cfg, self.net, self.vlog = plan, cfg, net, vlog
        self.node, self.streams, self.deadline = node, streams, deadline
        self.log_values, self.progress = log_values, progress
        self.neighbours = plan.neighbours(node)
        self.counts: dict[int, int] = {}  # token -> this node's contributions so far
        self.ended: dict[int, dict] = {}
        self.finals: dict[int, list[float]] = {}
        self.offers: dict[int, _Offer] = {}
        self.custody: dict[int, tuple[int, int]] = {}  # token -> (peer, step)
        self.incoming: dict[tuple[int, int], _Incoming] = {}  # (token, step)
        self.seen: set[tuple[int, int]] = set()
        self.came_from: dict[int, int] = {}  # token -> who handed it to us last
        self.down: set[int] = set()
        self.finished_peers: set[int] = set()
        self.steps_made = 0
        self.reroutes: list[dict] = []
        self.top_step = 0

    # ------------------------------------------------------------------------------ helpers

    def _log_value(self, kind: str, token: int, step: int, peer: int, value, **extra) -> None:
        fields = {"token": token, "step": step, "peer": peer, "digest": wk.digest(value)}
        if self.log_values:
            fields["value"] = value
        self.vlog.write(kind, **fields, **extra)

    async def _send(self, peer: int, msg: Message) -> bool:
        if peer in self.down:
            return False
        try:
            await self.net.send(peer, msg, timeout=self.deadline)
            return True
        except (ConnectionError, OSError) as exc:
            self._peer_down(peer, f"send failed: {type(exc).__name__}: {exc}")
            return False

    def _progress(self, step: int) -> None:
        if step > self.top_step:
            self.top_step = step
            self.progress.emit(event="step", node=self.node, step=step, of=self.plan.hops)

    # ------------------------------------------------------------------------------ holding

    async def hold(self, token: int, step: int, tau: np.ndarray) -> None:
        """Make steps from ``step`` on while the token stays here, then offer it on."""
        plan = self.plan
        s = step
        while True:
            k = self.counts.get(token, 0)
            tau, used = wk.apply_step(plan, self.cfg, self.node, token, s, k, tau, self.streams)
            if used:
                self.counts[token] = k + 1
            self.steps_made += 1
            self.vlog.write("token-step", token=token, step=s, data=used)
            self._progress(s + 1)
            if s + 1 >= plan.hops:
                self.finals[token] = [float(x) for x in tau]
                await self._end(token, "completed", self.node, plan.hops)
                return
            nxt = wk.next_hop(plan, self.node, token, s, self.streams)
            if nxt == self.node:
                s += 1
                continue
            await self._offer(token, s + 1, tau, nxt, 0, set())
            return

    async def _offer(self, token, step, value, to, attempt, excluded) -> None:
        offer = _Offer(to, step, value, attempt, excluded, time.monotonic() + self.deadline)
        self.offers[token] = offer
        msg = Message(kind="token", round=token, step=step, payload=value, meta={"a": attempt})
        if not await self._send(to, msg):
            if self.offers.get(token) is offer:
                await self._reroute(token, "peer-down")

    async def _reroute(self, token: int, reason: str) -> None:
        o = self.offers.pop(token)
        self.vlog.write("token-reroute", token=token, step=o.step, peer=o.to, reason=reason)
        self.reroutes.append({"token": token, "step": o.step, "peer": o.to, "reason": reason})
        await self._send(o.to, Message(kind="token_abort", round=token, step=o.step))
        excluded = o.excluded | {o.to}
        nxt = wk.next_hop(
            self.plan, self.node, token, o.step - 1, self.streams, excluded, o.attempt + 1
        )
        if nxt is None:
            self.finals[token] = [float(x) for x in o.value]
            await self._end(token, "stuck", self.node, o.step)
        elif nxt == self.node:
            await self.hold(token, o.step, o.value)
        else:
            await self._offer(token, o.step, o.value, nxt, o.attempt + 1, excluded)

    async def _end(self, token: int, how: str, at: int, step: int) -> None:
        if token in self.ended:
            return
        info = {"how": how, "at": at, "step": step}
        self.ended[token] = info
        self.custody.pop(token, None)
        self.vlog.write("walk-end", token=token, **info)
        self.progress.emit(event="walk-end", node=self.node, token=token, **info)
        msg = Message(kind="walk_end", round=token, step=step, meta={"how": how, "at": at})
        await asyncio.gather(*(self._send(w, msg) for w in self.neighbours))

    def _peer_down(self, peer: int, reason: str) -> None:
        if peer not in self.down:
            self.down.add(peer)
            self.vlog.write("peer-down", peer=peer, reason=reason)

    # ------------------------------------------------------------------------------ events

    async def _on_peer_down(self, peer: int, reason: str) -> None:
        self._peer_down(peer, reason)
        for token, (to, step) in list(self.custody.items()):
            if to == peer and token not in self.ended:
                self.vlog.write("token-lost", token=token, step=step, peer=peer)
                await self._end(token, "lost", peer, step)
        for token, o in list(self.offers.items()):
            if o.to == peer:
                await self._reroute(token, "peer-down")
        for (token, step), inc in list(self.incoming.items()):
            if inc.frm == peer:  # the sender died between our ack and its commit
                del self.incoming[(token, step)]
                self.vlog.write("commit-assumed", token=token, step=step, peer=peer)
                await self._accept(token, step, inc)

    async def _accept(self, token: int, step: int, inc: _Incoming) -> None:
        if token in self.ended:
            return
        self.came_from[token] = inc.frm
        await self.hold(token, step, inc.value)

    async def _inbound(self, peer: int, m: Message) -> None:
        token, step = m.round, m.step
        if m.kind == "done":
            self.finished_peers.add(peer)
            return
        if not 0 <= token < self.plan.tokens or not 0 <= step <= self.plan.hops:
            self.vlog.write("bad-message", peer=peer, kind=m.kind, token=token, at=step)
            return
        if m.kind == "token":
            if (
                m.payload is None
                or m.payload.shape != (self.plan.dim,)
                or not 1 <= step < self.plan.hops
            ):
                self.vlog.write("bad-message", peer=peer, kind="token", token=token, at=step)
                return
            value = np.array(m.payload, dtype=np.float64)
            if (token, step) in self.seen:
                self.vlog.write("duplicate", token=token, step=step, peer=peer)
                if (token, step) in self.incoming:
                    await self._send(peer, Message(kind="token_ack", round=token, step=step))
                return
            self.seen.add((token, step))
            self._log_value("token-seen", token, step, peer, value)
            if token in self.ended:
                self.vlog.write("token-after-end", token=token, step=step, peer=peer)
                return
            self.incoming[(token, step)] = _Incoming(
                peer, value, time.monotonic() + 2 * self.deadline
            )
            await self._send(peer, Message(kind="token_ack", round=token, step=step))
        elif m.kind == "token_ack":
            o = self.offers.get(token)
            if o is None or o.to != peer or o.step != step:
                self.vlog.write("late-ack", token=token, step=step, peer=peer)
                await self._send(peer, Message(kind="token_abort", round=token, step=step))
                return
            del self.offers[token]
            self.custody[token] = (peer, step)
            await self._send(peer, Message(kind="token_commit", round=token, step=step))
            self.vlog.write(
                "token-send", token=token, step=step, peer=peer, digest=wk.digest(o.value)
            )
            frm = self.came_from.pop(token, None)
            if frm is not None:
                await self._send(frm, Message(kind="token_fwd", round=token, step=step))
        elif m.kind == "token_commit":
            inc = self.incoming.pop((token, step), None)
            if inc is None or inc.frm != peer:
                self.vlog.write("bad-message", peer=peer, kind="token_commit", token=token, at=step)
                return
            self.vlog.write("token-accept", token=token, step=step, peer=peer)
            await self._accept(token, step, inc)
        elif m.kind == "token_abort":
            inc = self.incoming.get((token, step))
            if inc is not None and inc.frm == peer:
                del self.incoming[(token, step)]
                self.vlog.write("token-aborted", token=token, step=step, peer=peer)
        elif m.kind == "token_fwd":
            c = self.custody.get(token)
            if c is not None and c[0] == peer:
                del self.custody[token]
        elif m.kind == "walk_end":
            how = m.meta.get("how") if isinstance(m.meta, dict) else None
            at = m.meta.get("at") if isinstance(m.meta, dict) else None
            if how not in ("completed", "lost", "stuck") or not isinstance(at, int):
                self.vlog.write("bad-message", peer=peer, kind="walk_end", token=token)
                return
            await self._end(token, how, at, step)
        else:
            self.vlog.write("bad-message", peer=peer, kind=m.kind, token=token, at=step)

    async def _expire(self, now: float) -> None:
        for token, o in list(self.offers.items()):
            if o.deadline <= now:
                await self._reroute(token, "deadline")
        for key, inc in list(self.incoming.items()):
            if inc.deadline <= now:
                del self.incoming[key]
                if inc.frm in self.down:
                    self.vlog.write("commit-assumed", token=key[0], step=key[1], peer=inc.frm)
                    await self._accept(key[0], key[1], inc)
                else:
                    self.vlog.write("commit-timeout", token=key[0], step=key[1], peer=inc.frm)

    # ------------------------------------------------------------------------------ main loop

    async def run(self, bound_s: float) -> WalkOutcome:
        plan = self.plan
        for j in range(plan.tokens):
            if plan.start(j) == self.node:
                tau = wk.initial_token(plan, j, self.streams, self.cfg)
                self.vlog.write("token-start", token=j, digest=wk.digest(tau))
                await self.hold(j, 0, tau)
        end = time.monotonic() + bound_s
        while len(self.ended) < plan.tokens:
            now = time.monotonic()
            if now >= end:
                for j in range(plan.tokens):
                    if j not in self.ended:
                        self.ended[j] = {"how": "timeout", "at": None, "step": None}
                        self.vlog.write("walk-timeout", token=j, bound_s=bound_s)
                break
            wake = [o.deadline for o in self.offers.values()]
            wake += [i.deadline for i in self.incoming.values()]
            timeout = max(0.0, min([end, *wake]) - now)
            ev = await self.net.next_event(timeout)
            if isinstance(ev, PeerDown):
                await self._on_peer_down(ev.peer, str(ev.reason))
            elif isinstance(ev, PeerUp):
                if ev.peer in self.down:
                    self.down.discard(ev.peer)
                    self.vlog.write("peer-up", peer=ev.peer)
            elif isinstance(ev, Inbound):
                await self._inbound(ev.peer, ev.message)
            await self._expire(time.monotonic())
        await self._finish()
        return WalkOutcome(
            ended=dict(self.ended),
            finals=dict(self.finals),
            steps_made=self.steps_made,
            reroutes=list(self.reroutes),
        )

    async def _finish(self) -> None:
        """Say done to every neighbour and wait (bounded) for theirs."""
        from coordinator_free.peer.runner import say_goodbye

        def after_end(peer: int, m: Message) -> None:
            if m.kind == "token":
                # A walk that has ended everywhere cannot go on: log what we saw, refuse it.
                self.vlog.write("token-after-end", token=m.round, peer=peer)

        live = [w for w in self.neighbours if w not in self.down]
        await say_goodbye(self.net, live, self.finished_peers, self.deadline, 0, after_end)
