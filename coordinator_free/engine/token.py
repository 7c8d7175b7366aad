"""The token engine of a node: tokens handed from holder to holder (sans-IO: the peer shell or
the in-memory network feeds it events and the time, and performs the sends and log records it
returns). While a token stays with the node it follows the hop loop of the protocol's
:class:`TokenRules` (the family hands them in, as a step engine takes its program; the walk's
are its protocol's ``hops``, the simulator's loop too).

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
* A commit that never comes (lost on a lossy link): b drops its copy after two deadlines and
  answers ``nack``; a, still holding custody of j at b, offers the token to b again (the same
  hop, so the walk's distribution is unchanged). A holds custody without news for two
  deadlines: it asks b (``query``); b answers ``nack`` if it never took the token, ``fwd``
  again if it has handed it on, nothing while it still holds it. So a lost message costs a
  few deadlines, never the walk.
* A walk's end travels with ``done`` too: a node that missed a ``walk_end`` (a lossy link)
  learns it from its neighbour's goodbye.
* Custody: if b's channel goes down while a still holds custody of j (no ``fwd`` yet, no end of
  the walk), the token died with b: a reports it lost at b.
* The end of a walk (completed, lost, stuck) is flooded to every node as ``walk-end``; a node
  stops when every token has ended. A node whose neighbours have all been down for
  DOWN_GRACE_DEADLINES deadlines can neither receive a token nor hear of its end: it ends its
  open walks as ``cut-off`` there. A run-level bound ends the loop in any case.

A token value holding NaN or an infinity is refused (``bad-message`` of kind ``non-finite``):
never used, never acknowledged, so its sender re-routes the token at its deadline.

Every value the node saw is logged (``token-seen``, with the sender, since TCP shows who sent
it), every step it made (``token-step``: step, whether its data went in), every send, re-route,
loss and end. Never its data, its noise or its hop draws.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from coordinator_free.engine.events import (
    Action,
    Finish,
    Inbound,
    NetEvent,
    Outbox,
    PeerDown,
    PeerUp,
)
from coordinator_free.engine.step import DOWN_GRACE_DEADLINES
from coordinator_free.net.wire import Message
from coordinator_free.viewlog import value_digest


@dataclass(frozen=True)
class TokenRules:
    """What a token protocol tells the engine: the token a walk starts with
    (``initial_token(plan, token, streams, cfg)``), the hop loop while the token stays with a
    holder (``hops(plan, cfg, token, node, step, tau, counts, streams)``, yielding hops with
    ``s``, ``tau``, ``used`` and ``nxt``), and the re-route draw
    (``next_hop(plan, node, token, step, streams, exclude, attempt)``)."""

    initial_token: Callable
    hops: Callable
    next_hop: Callable


@dataclass
class _Offer:
    to: int
    step: int
    value: np.ndarray
    attempt: int
    excluded: set[int]
    deadline: float


@dataclass
class _Custody:
    """A hand-off this node committed and the next holder has not yet passed on (no fwd)."""

    peer: int
    step: int
    value: np.ndarray  # kept to offer it again if the peer never took it (nack)
    attempt: int
    asked: float  # when custody began, or the peer was last asked about it


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


def run_bound(plan, deadline: float) -> float:
    """A bound on the whole walk, never reached in a live run: every hop of every token may use
    its deadline a few times over."""
    return (plan.hops * plan.tokens + 2) * deadline * 4 + 60.0


class TokenEngine:
    """One node of a token protocol (sans-IO: events and time in, actions out)."""

    def __init__(self, plan, cfg, node, streams, deadline, log_values, rules: TokenRules):
        self.rules = rules
        self.plan, self.cfg = plan, cfg
        self.node, self.streams, self.deadline = node, streams, deadline
        self.log_values = log_values
        self.out = Outbox(node)
        self.neighbours = plan.neighbours(node)
        self.counts: dict[int, dict[int, int]] = {}  # token -> {this node: contributions}
        self.ended: dict[int, dict] = {}
        self.finals: dict[int, list[float]] = {}
        self.offers: dict[int, _Offer] = {}
        self.custody: dict[int, _Custody] = {}  # token -> the hand-off not yet passed on
        self.accepted: dict[int, int] = {}  # token -> the last step this node took it at
        self.forwarded: dict[int, int] = {}  # token -> the step of its last hand-off onwards
        self.incoming: dict[tuple[int, int], _Incoming] = {}  # (token, step)
        self.seen: set[tuple[int, int]] = set()
        self.came_from: dict[int, int] = {}  # token -> who handed it to us last
        self.down: set[int] = set()
        self.down_at: dict[int, float] = {}  # peer -> when its channel went down
        self.finished_peers: set[int] = set()
        self.steps_made = 0
        self.reroutes: list[dict] = []
        self.top_step = 0
        self.bound_s = run_bound(plan, deadline)
        self.finished = False
        self._now = 0.0
        self._t0 = 0.0
        self._end_at = 0.0
        self._bye: tuple[set[int], float] | None = None  # (pending, until) once saying goodbye

    # ------------------------------------------------------------------------------ driver

    def start(self, now: float) -> list[Action]:
        self._now = self._t0 = now
        plan = self.plan
        for j in range(plan.tokens):
            if plan.start(j) == self.node:
                tau = self.rules.initial_token(plan, j, self.streams, self.cfg)
                self.out.log("token-start", token=j, digest=value_digest(tau))
                self.hold(j, 0, tau)
        self._end_at = now + self.bound_s
        self._check(now)
        return self.out.take()

    def handle(self, event: NetEvent | None, now: float) -> list[Action]:
        if self.finished:
            return []
        self._now = now
        if self._bye is not None:
            self._goodbye_event(event, now)
            return self.out.take()
        if now >= self._end_at:
            for j in range(self.plan.tokens):
                if j not in self.ended:
                    self.ended[j] = {"how": "timeout", "at": None, "step": None}
                    self.out.log("walk-timeout", token=j, bound_s=self.bound_s)
            self._begin_goodbye(now)
            return self.out.take()
        if isinstance(event, PeerDown):
            self._on_peer_down(event.peer, str(event.reason))
        elif isinstance(event, PeerUp):
            if event.peer in self.down:
                self.down.discard(event.peer)
                self.down_at.pop(event.peer, None)
                self.out.log("peer-up", peer=event.peer)
        elif isinstance(event, Inbound):
            self._inbound(event.peer, event.message)
        self._expire(now)
        self._cut_off(now)
        self._check(now)
        return self.out.take()

    def next_wakeup(self) -> float | None:
        if self.finished:
            return None
        if self._bye is not None:
            return self._bye[1]
        wake = [o.deadline for o in self.offers.values()]
        wake += [i.deadline for i in self.incoming.values()]
        wake += [c.asked + 2 * self.deadline for c in self.custody.values()]
        alone = self._alone_since()
        if alone is not None:
            wake.append(alone + DOWN_GRACE_DEADLINES * self.deadline)
        return min([self._end_at, *wake])

    def _alone_since(self) -> float | None:
        """Since when every neighbour's channel has been down (None: some neighbour is up)."""
        if not self.neighbours or any(w not in self.down for w in self.neighbours):
            return None
        return max(self.down_at.get(w, self._t0) for w in self.neighbours)

    def _cut_off(self, now: float) -> None:
        """Every neighbour down past the grace period: no token can reach this node and no
        walk's end can be heard here; its open walks end here as cut off."""
        alone = self._alone_since()
        if alone is None or now < alone + DOWN_GRACE_DEADLINES * self.deadline:
            return
        if self.offers or self.incoming:
            return  # a hand-off in progress resolves first (re-route, commit-assumed)
        for j in range(self.plan.tokens):
            if j not in self.ended:
                self.out.log("walk-cut-off", token=j, peers=list(self.neighbours))
                self._end(j, "cut-off", self.node, self.top_step)

    def _check(self, now: float) -> None:
        if self._bye is None and len(self.ended) >= self.plan.tokens:
            self._begin_goodbye(now)

    # ------------------------------------------------------------------------------ helpers

    def _log_value(self, kind: str, token: int, step: int, peer: int, value, **extra) -> None:
        fields = {"token": token, "step": step, "peer": peer, "digest": value_digest(value)}
        if self.log_values:
            fields["value"] = value
        self.out.log(kind, **fields, **extra)

    def _send(self, peer: int, msg: Message) -> bool:
        """Queue a send; False when the peer is known to be down (nothing is sent). A send that
        fails comes back as a PeerDown event."""
        if peer in self.down:
            return False
        self.out.send(peer, msg)
        return True

    def _progress(self, step: int) -> None:
        if step > self.top_step:
            self.top_step = step
            self.out.progress(None, event="step", node=self.node, step=step, of=self.plan.hops)

    # ------------------------------------------------------------------------------ holding

    def hold(self, token: int, step: int, tau: np.ndarray) -> None:
        """Make steps from ``step`` on while the token stays here, then offer it on."""
        counts = self.counts.setdefault(token, {})
        for h in self.rules.hops(
            self.plan, self.cfg, token, self.node, step, tau, counts, self.streams
        ):
            self.steps_made += 1
            self.out.log("token-step", token=token, step=h.s, data=h.used)
            self._progress(h.s + 1)
            if h.nxt is None:
                self.finals[token] = [float(x) for x in h.tau]
                self._end(token, "completed", self.node, self.plan.hops)
                return
            if h.nxt != self.node:
                self._offer(token, h.s + 1, h.tau, h.nxt, 0, set())
                return

    def _offer(self, token, step, value, to, attempt, excluded) -> None:
        offer = _Offer(to, step, value, attempt, excluded, self._now + self.deadline)
        self.offers[token] = offer
        msg = Message(kind="token", round=token, step=step, payload=value, meta={"a": attempt})
        if not self._send(to, msg):
            if self.offers.get(token) is offer:
                self._reroute(token, "peer-down")

    def _reroute(self, token: int, reason: str) -> None:
        o = self.offers.pop(token)
        self.out.log("token-reroute", token=token, step=o.step, peer=o.to, reason=reason)
        self.reroutes.append({"token": token, "step": o.step, "peer": o.to, "reason": reason})
        self._send(o.to, Message(kind="token_abort", round=token, step=o.step))
        excluded = o.excluded | {o.to}
        nxt = self.rules.next_hop(
            self.plan, self.node, token, o.step - 1, self.streams, excluded, o.attempt + 1
        )
        if nxt is None:
            self.finals[token] = [float(x) for x in o.value]
            self._end(token, "stuck", self.node, o.step)
        elif nxt == self.node:
            self.hold(token, o.step, o.value)
        else:
            self._offer(token, o.step, o.value, nxt, o.attempt + 1, excluded)

    def _end(self, token: int, how: str, at: int, step: int) -> None:
        if token in self.ended:
            return
        info = {"how": how, "at": at, "step": step}
        self.ended[token] = info
        self.custody.pop(token, None)
        self.out.log("walk-end", token=token, **info)
        self.out.progress(None, event="walk-end", node=self.node, token=token, **info)
        msg = Message(kind="walk_end", round=token, step=step, meta={"how": how, "at": at})
        for w in self.neighbours:
            self._send(w, msg)

    def _peer_down(self, peer: int, reason: str) -> None:
        if peer not in self.down:
            self.down.add(peer)
            self.down_at[peer] = self._now
            self.out.log("peer-down", peer=peer, reason=reason)

    # ------------------------------------------------------------------------------ events

    def _on_peer_down(self, peer: int, reason: str) -> None:
        self._peer_down(peer, reason)
        for token, c in list(self.custody.items()):
            if c.peer == peer and token not in self.ended:
                self.out.log("token-lost", token=token, step=c.step, peer=peer)
                self._end(token, "lost", peer, c.step)
        for token, o in list(self.offers.items()):
            if o.to == peer and self.offers.get(token) is o:
                self._reroute(token, "peer-down")
        for (token, step), inc in list(self.incoming.items()):
            if inc.frm == peer and (token, step) in self.incoming:
                # the sender died between our ack and its commit
                del self.incoming[(token, step)]
                self.out.log("commit-assumed", token=token, step=step, peer=peer)
                self._accept(token, step, inc)

    def _accept(self, token: int, step: int, inc: _Incoming) -> None:
        if token in self.ended:
            return
        self.accepted[token] = max(step, self.accepted.get(token, -1))
        self.came_from[token] = inc.frm
        self.hold(token, step, inc.value)

    def _inbound(self, peer: int, m: Message) -> None:
        token, step = m.round, m.step
        if m.kind == "done":
            self.finished_peers.add(peer)
            self._ends_from_goodbye(peer, m)
            return
        if not 0 <= token < self.plan.tokens or not 0 <= step <= self.plan.hops:
            self.out.log("bad-message", peer=peer, kind=m.kind, token=token, at=step)
            return
        if m.kind == "token":
            if (
                m.payload is None
                or m.payload.shape != (self.plan.dim,)
                or not 1 <= step < self.plan.hops
            ):
                self.out.log("bad-message", peer=peer, kind="token", token=token, at=step)
                return
            value = np.array(m.payload, dtype=np.float64)
            if not np.isfinite(value).all():
                # Never used and not acknowledged: the sender re-routes at its deadline.
                self.out.log("bad-message", peer=peer, kind="non-finite", token=token, at=step)
                return
            if (token, step) in self.seen:
                self.out.log("duplicate", token=token, step=step, peer=peer)
                if (token, step) in self.incoming:
                    self._send(peer, Message(kind="token_ack", round=token, step=step))
                return
            self.seen.add((token, step))
            self._log_value("token-seen", token, step, peer, value)
            if token in self.ended:
                self.out.log("token-after-end", token=token, step=step, peer=peer)
                return
            self.incoming[(token, step)] = _Incoming(peer, value, self._now + 2 * self.deadline)
            self._send(peer, Message(kind="token_ack", round=token, step=step))
        elif m.kind == "token_ack":
            o = self.offers.get(token)
            if o is None or o.to != peer or o.step != step:
                self.out.log("late-ack", token=token, step=step, peer=peer)
                self._send(peer, Message(kind="token_abort", round=token, step=step))
                return
            del self.offers[token]
            self.custody[token] = _Custody(peer, step, o.value, o.attempt, self._now)
            self._send(peer, Message(kind="token_commit", round=token, step=step))
            self.out.log(
                "token-send", token=token, step=step, peer=peer, digest=value_digest(o.value)
            )
            self.forwarded[token] = step
            frm = self.came_from.pop(token, None)
            if frm is not None:
                self._send(frm, Message(kind="token_fwd", round=token, step=step))
        elif m.kind == "token_commit":
            inc = self.incoming.pop((token, step), None)
            if inc is None or inc.frm != peer:
                self.out.log("bad-message", peer=peer, kind="token_commit", token=token, at=step)
                return
            self.out.log("token-accept", token=token, step=step, peer=peer)
            self._accept(token, step, inc)
        elif m.kind == "token_abort":
            inc = self.incoming.get((token, step))
            if inc is not None and inc.frm == peer:
                del self.incoming[(token, step)]
                self.out.log("token-aborted", token=token, step=step, peer=peer)
        elif m.kind == "token_query":
            if self.accepted.get(token, -1) < step and (token, step) not in self.incoming:
                self._send(peer, Message(kind="token_nack", round=token, step=step))
            elif self.forwarded.get(token, -1) > step:
                self._send(peer, Message(kind="token_fwd", round=token, step=step))
        elif m.kind == "token_nack":
            c = self.custody.get(token)
            if c is not None and (c.peer, c.step) == (peer, step) and token not in self.ended:
                del self.custody[token]
                self.out.log("token-nack", token=token, step=step, peer=peer)
                self._offer(token, step, c.value, peer, c.attempt + 1, set())
        elif m.kind == "token_fwd":
            c = self.custody.get(token)
            if c is not None and c.peer == peer:
                del self.custody[token]
        elif m.kind == "walk_end":
            how = m.meta.get("how") if isinstance(m.meta, dict) else None
            at = m.meta.get("at") if isinstance(m.meta, dict) else None
            if how not in ("completed", "lost", "stuck", "cut-off") or not isinstance(at, int):
                self.out.log("bad-message", peer=peer, kind="walk_end", token=token)
                return
            self._end(token, how, at, step)
        else:
            self.out.log("bad-message", peer=peer, kind=m.kind, token=token, at=step)

    def _ends_from_goodbye(self, peer: int, m: Message) -> None:
        ended = m.meta.get("ended") if isinstance(m.meta, dict) else None
        if not isinstance(ended, dict):
            return
        for j, e in ended.items():
            try:
                token = int(j)
                how, at, step = e
            except (TypeError, ValueError):
                self.out.log("bad-message", peer=peer, kind="done")
                return
            if (
                0 <= token < self.plan.tokens
                and token not in self.ended
                and how in ("completed", "lost", "stuck", "cut-off")
                and isinstance(step, int)
                and (at is None or isinstance(at, int))
            ):
                self._end(token, how, at, step)

    def _expire(self, now: float) -> None:
        for token, c in list(self.custody.items()):
            if now >= c.asked + 2 * self.deadline:
                c.asked = now
                self._send(c.peer, Message(kind="token_query", round=token, step=c.step))
        for token, o in list(self.offers.items()):
            if o.deadline <= now and self.offers.get(token) is o:
                self._reroute(token, "deadline")
        for key, inc in list(self.incoming.items()):
            if inc.deadline <= now and self.incoming.get(key) is inc:
                del self.incoming[key]
                if inc.frm in self.down:
                    self.out.log("commit-assumed", token=key[0], step=key[1], peer=inc.frm)
                    self._accept(key[0], key[1], inc)
                else:
                    self.out.log("commit-timeout", token=key[0], step=key[1], peer=inc.frm)
                    # Let the sender offer it again; a new offer is a new hand-off.
                    self.seen.discard(key)
                    self._send(inc.frm, Message(kind="token_nack", round=key[0], step=key[1]))

    # ------------------------------------------------------------------------------ goodbye

    def _begin_goodbye(self, now: float) -> None:
        """Say done (with how every walk ended) to every neighbour and wait (bounded) for
        theirs."""
        live = [w for w in self.neighbours if w not in self.down]
        ended = {str(j): [e["how"], e["at"], e["step"]] for j, e in self.ended.items()}
        for w in live:
            self.out.send(w, Message(kind="done", round=0, step=0, meta={"ended": ended}))
        self._bye = ({w for w in live if w not in self.finished_peers}, now + self.deadline)
        self._goodbye_event(None, now)

    def _goodbye_event(self, event: NetEvent | None, now: float) -> None:
        assert self._bye is not None
        pending, until = self._bye
        if isinstance(event, PeerDown):
            pending.discard(event.peer)
        elif isinstance(event, Inbound):
            if event.message.kind == "done":
                pending.discard(event.peer)
            elif event.message.kind == "token":
                # A walk that has ended everywhere cannot go on: log what we saw, refuse it.
                self.out.log("token-after-end", token=event.message.round, peer=event.peer)
        if pending and now < until:
            return
        self.finished = True
        self.out.log("finished", steps=self.steps_made, reroutes=len(self.reroutes))
        result = {
            "node": self.node,
            "estimate": [],
            "steps": self.steps_made,
            "elapsed_s": now - self._t0,
            "missed": self.reroutes,
            "walks": {
                "ended": {str(j): e for j, e in self.ended.items()},
                "finals": {str(j): v for j, v in self.finals.items()},
            },
        }
        self.out.actions.append(Finish(result))

    def outcome(self) -> WalkOutcome:
        return WalkOutcome(
            ended=dict(self.ended),
            finals=dict(self.finals),
            steps_made=self.steps_made,
            reroutes=list(self.reroutes),
        )
