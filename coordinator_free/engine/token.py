"""The token engine of a node: tokens handed from holder to holder (sans-IO: the peer shell or
the in-memory network feeds it events and the time, and performs the sends and log records it
returns). While a token stays with the node it follows the hop loop of the protocol's
:class:`TokenRules` (the family hands them in, as a step engine takes its program; the walk's
are its protocol's ``hops``, the simulator's loop too).

Hand-off of step s of token j from holder a to b. Every message names (j, s) and the offer's
attempt number e: (s, e) is the hand-off's fencing token, and nothing acts on a message whose
(s, e) is not the one it is waiting for.

    a -> b  token   (j, s, e, value)   b logs what it saw, keeps it, answers  ack
    b -> a  ack     (j, s, e)          a answers commit, logs the send: b now owns step s
    a -> b  commit  (j, s, e)          b takes the token (once), makes step s, answers taken
    b -> a  taken   (j, s)             a stops repeating the commit, keeps custody
    b -> a  fwd     (j, s)             b's own hand-off onwards committed: a drops custody

* Retries, not re-routes, recover lost frames: a repeats its offer every deadline until b
  acknowledges, and its commit every deadline until b says taken (or fwd). b deduplicates by
  (j, s): a repeated offer is acknowledged again, a repeated commit answered taken again, and
  the token is taken once. b acts only on a commit: never on its own guess.
* Re-route only when b is gone: b's channel down for DOWN_GRACE_DEADLINES deadlines (a
  corrupted frame drops a channel for a moment; a redialled channel comes back well within
  that). Before b's ack nothing was committed, so a draws another next hop by the protocol's
  rule without b (ring: none, the walk ends ``stuck`` at a; complete graph: possibly a itself)
  and sends ``abort`` (b drops its copy). Once a has sent a commit for step s, step s belongs
  to b: a never offers it anywhere else.
* Custody: from its commit until b's fwd, a keeps a copy and asks b (``query``, every two
  deadlines); b answers ``fwd``, ``taken`` or ``nack`` (it never had it: a offers it to b again,
  a new attempt). If b's channel stays down past the grace period, the token died with b: a
  ends the walk ``lost`` at b.
* Fencing: a node that knows the walk ended never acts on it and answers every message about
  it with the end (``walk_end``); a node that comes back (a healed link, a resumed process) is
  sent the end of every walk that ended meanwhile. A node holding a hand-off of step s that
  hears of a newer step of the walk, or of its end, logs ``token-stale`` and drops it: it never
  makes a step of a walk that moved on.
* The end of a walk (one of :data:`WALK_ENDS`) is flooded to every node as ``walk_end`` and
  repeated in each node's goodbye; a node stops when every token has ended. A node whose
  neighbours have all been down for DOWN_GRACE_DEADLINES deadlines can neither receive a token
  nor hear of its end: it ends its open walks as ``cut-off`` there. A run-level bound ends the
  loop in any case (``timeout``).

A token value holding NaN or an infinity is refused (``bad-message`` of kind ``non-finite``):
never used, never acknowledged, answered ``nack`` (refused): its sender re-routes the token.

Every token value the node decodes is logged with its step and value (or digest), in every
phase, the goodbye included: ``token-seen`` the first time (with the sender, since TCP shows
who sent it), ``duplicate`` (with the digest) after; every step it made (``token-step``: step,
whether its data went in), every send, re-route, loss and end. Never its data, its noise or its
hop draws.
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
from coordinator_free.engine.step import DOWN_GRACE_DEADLINES, all_finite
from coordinator_free.net.wire import Message
from coordinator_free.viewlog import value_digest


@dataclass(frozen=True)
class TokenRules:
    """What a token protocol tells the engine: the token a walk starts with
    (``initial_token(plan, token, streams, cfg)``), the hop loop while the token stays with a
    holder (``hops(plan, cfg, token, node, step, tau, counts, streams)``, yielding hops with
    ``s``, ``tau``, ``used`` and ``nxt``), and the re-route draw
    (``next_hop(plan, node, token, step, streams, exclude, attempt)``).

    ``counts`` is the token's per-node state, kept by the engine across the token's visits
    and handed to every ``hops`` call: on a peer it holds this node's entry only, in the
    simulator every node's. What an entry is belongs to the protocol (the walks: the node's
    number of contributions; ADMM: that and the node's dual block).

    ``step_values``: every ``token-step`` record also carries the token after the step (its
    digest, and its value when values are logged), for protocols whose progress is read from
    the token at every step (the objective of ADMM)."""

    initial_token: Callable
    hops: Callable
    next_hop: Callable
    step_values: bool = False


#: Every way a walk can end, one vocabulary for the engine, its messages and the auditor:
#: ``completed`` (the last step was made), ``lost`` (its holder went down with it), ``stuck``
#: (no next hop left), ``cut-off`` (the node lost every neighbour before the end reached it),
#: ``timeout`` (the run-level bound).
WALK_ENDS = ("completed", "lost", "stuck", "cut-off", "timeout")


@dataclass
class _Offer:
    """A hand-off this node offered and the next holder has not acknowledged yet."""

    to: int
    step: int
    value: np.ndarray
    attempt: int
    excluded: set[int]
    retry: float  # when to repeat the offer
    committed: bool = False  # a commit for this step already went to ``to``: never re-route


@dataclass
class _Custody:
    """A hand-off this node committed and the next holder has not yet passed on (no fwd)."""

    peer: int
    step: int
    value: np.ndarray  # kept to offer it again if the peer never took it (nack)
    attempt: int
    retry: float  # when to repeat the commit (not taken) or ask (taken)
    taken: bool = False


@dataclass
class _Incoming:
    frm: int
    value: np.ndarray
    attempt: int


@dataclass
class WalkOutcome:
    ended: dict[int, dict]  # token -> {"how", "at", "step"}
    finals: dict[int, list[float]]  # tokens whose walk completed here: the final token value
    steps_made: int
    reroutes: list[dict] = field(default_factory=list)


#: The longest a node waits for its neighbours' goodbyes (saying its own every deadline).
GOODBYE_DEADLINES = 6
#: Hand-off messages whose sender waits for an answer (and repeats them until it comes): after
#: the walk has ended, the answer is how it ended.
AWAIT_ANSWER = frozenset({"token", "token_ack", "token_commit", "token_query"})


def run_bound(plan, deadline: float) -> float:
    """A bound on the whole walk, never reached in a live run: every hop of every token may use
    its deadline a few times over."""
    return (plan.hops * plan.tokens + 2) * deadline * 4 + 60.0


def _attempt(m: Message) -> int:
    a = m.meta.get("a", 0) if isinstance(m.meta, dict) else 0
    return a if isinstance(a, int) and not isinstance(a, bool) else -1


class TokenEngine:
    """One node of a token protocol (sans-IO: events and time in, actions out)."""

    def __init__(self, plan, cfg, node, streams, deadline, log_values, rules: TokenRules):
        self.rules = rules
        self.plan, self.cfg = plan, cfg
        self.node, self.streams, self.deadline = node, streams, deadline
        self.grace = DOWN_GRACE_DEADLINES * deadline
        self.log_values = log_values
        self.out = Outbox(node)
        self.neighbours = plan.neighbours(node)
        self.counts: dict[int, dict] = {}  # token -> {this node: its state (TokenRules)}
        self.ended: dict[int, dict] = {}
        self.finals: dict[int, list[float]] = {}
        self.offers: dict[int, _Offer] = {}
        self.custody: dict[int, _Custody] = {}  # token -> the hand-off not yet passed on
        self.accepted: dict[int, int] = {}  # token -> the last step this node took it at
        self.forwarded: dict[int, int] = {}  # token -> the step of its last hand-off onwards
        self.incoming: dict[tuple[int, int], _Incoming] = {}  # (token, step)
        self.seen: set[tuple[int, int]] = set()
        self.newest: dict[int, int] = {}  # token -> the newest step any message named
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
        self._bye_retry = 0.0  # when to say done again to the neighbours still pending
        self._bye_unanswered: set[int] = set()  # neighbours gone before saying done

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
            self._peer_down(event.peer, str(event.reason))
        elif isinstance(event, PeerUp):
            self._on_peer_up(event.peer)
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
            pending, until = self._bye
            if not pending:
                return until
            wake = [self._due(w, self._bye_retry) for w in pending]
            return min([until, *wake])
        wake = [self._due(o.to, o.retry) for o in self.offers.values()]
        wake += [self._due(c.peer, c.retry) for c in self.custody.values()]
        alone = self._alone_since()
        if alone is not None:
            wake.append(alone + self.grace)
        return min([self._end_at, *wake])

    def _due(self, peer: int, retry: float) -> float:
        """When a hand-off with ``peer`` needs this node next: its retry, or (peer down) the end
        of the peer's grace period."""
        if peer in self.down:
            return self.down_at[peer] + self.grace
        return retry

    def _gone(self, peer: int) -> bool:
        """The peer's channel has been down for the whole grace period."""
        return peer in self.down and self._now >= self.down_at[peer] + self.grace

    def _alone_since(self) -> float | None:
        """Since when every neighbour's channel has been down (None: some neighbour is up)."""
        if not self.neighbours or any(w not in self.down for w in self.neighbours):
            return None
        return max(self.down_at.get(w, self._t0) for w in self.neighbours)

    def _cut_off(self, now: float) -> None:
        """Every neighbour down past the grace period: no token can reach this node and no
        walk's end can be heard here; its open walks end here as cut off."""
        alone = self._alone_since()
        if alone is None or now < alone + self.grace:
            return
        if self.offers:
            return  # an offer in progress resolves first (re-route, stuck)
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

    def _msg(self, kind: str, token: int, step: int, attempt: int | None = None, **kw) -> Message:
        meta = {"a": attempt} if attempt is not None else {}
        return Message(kind=kind, round=token, step=step, meta=meta, **kw)

    def _end_msg(self, token: int) -> Message:
        e = self.ended[token]
        step = e["step"] if isinstance(e["step"], int) else 0
        return Message(
            kind="walk_end", round=token, step=step, meta={"how": e["how"], "at": e["at"]}
        )

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
            if self.rules.step_values:
                fields = {"digest": value_digest(h.tau)}
                if self.log_values:
                    fields["value"] = h.tau
                self.out.log("token-step", token=token, step=h.s, data=h.used, **fields)
            else:
                self.out.log("token-step", token=token, step=h.s, data=h.used)
            self._progress(h.s + 1)
            if h.nxt is None:
                self.finals[token] = [float(x) for x in h.tau]
                self._end(token, "completed", self.node, self.plan.hops)
                return
            if h.nxt != self.node:
                self._offer(token, h.s + 1, h.tau, h.nxt, 0, set())
                return

    def _offer(self, token, step, value, to, attempt, excluded, committed=False) -> None:
        self.offers[token] = _Offer(
            to, step, value, attempt, excluded, self._now + self.deadline, committed
        )
        self._send(to, self._msg("token", token, step, attempt, payload=value))

    def _reroute(self, token: int, reason: str) -> None:
        o = self.offers.pop(token)
        self.out.log("token-reroute", token=token, step=o.step, peer=o.to, reason=reason)
        self.reroutes.append({"token": token, "step": o.step, "peer": o.to, "reason": reason})
        self._send(o.to, self._msg("token_abort", token, o.step, o.attempt))
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
        self._drop_state(token, "walk-end")
        self.out.log("walk-end", token=token, **info)
        self.out.progress(None, event="walk-end", node=self.node, token=token, **info)
        msg = self._end_msg(token)
        for w in self.neighbours:
            self._send(w, msg)

    def _drop_state(self, token: int, why: str) -> None:
        """Forget every hand-off of ``token`` this node is part of (the walk ended or moved on);
        a hand-off it would still have acted on is logged ``token-stale``."""
        self.custody.pop(token, None)
        o = self.offers.pop(token, None)
        if o is not None:
            self.out.log("token-stale", token=token, step=o.step, peer=o.to, why=why)
        for key in [k for k in self.incoming if k[0] == token]:
            inc = self.incoming.pop(key)
            self.out.log("token-stale", token=token, step=key[1], peer=inc.frm, why=why)

    def _peer_down(self, peer: int, reason: str) -> None:
        if peer not in self.down:
            self.down.add(peer)
            self.down_at[peer] = self._now
            self.out.log("peer-down", peer=peer, reason=reason)

    def _on_peer_up(self, peer: int) -> None:
        if peer not in self.down:
            return
        self.down.discard(peer)
        self.down_at.pop(peer, None)
        self.out.log("peer-up", peer=peer)
        # It may have missed ends and hand-off messages while it was away: repeat them now.
        for j in sorted(self.ended):
            self._send(peer, self._end_msg(j))
        for o in self.offers.values():
            if o.to == peer:
                o.retry = self._now
        for c in self.custody.values():
            if c.peer == peer:
                c.retry = self._now

    # ------------------------------------------------------------------------------ events

    def _fence(self, token: int, step: int) -> None:
        """A message named step ``step`` of ``token``: hand-offs of older steps are stale."""
        if step <= self.newest.get(token, -1):
            return
        self.newest[token] = step
        o = self.offers.get(token)
        if o is not None and o.step < step:
            del self.offers[token]
            self.out.log("token-stale", token=token, step=o.step, peer=o.to, why=f"step {step}")
        for key in [k for k in self.incoming if k[0] == token and k[1] < step]:
            inc = self.incoming.pop(key)
            self.out.log("token-stale", token=token, step=key[1], peer=inc.frm, why=f"step {step}")

    def _token_value(self, peer: int, m: Message, refuse: bool = True) -> np.ndarray | None:
        """The value of a token offer, logged with its step (None: refused, and logged so)."""
        token, step = m.round, m.step
        if (
            m.payload is None
            or m.payload.shape != (self.plan.dim,)
            or not 1 <= step < self.plan.hops
        ):
            self.out.log("bad-message", peer=peer, kind="token", token=token, at=step)
            return None
        value = np.array(m.payload, dtype=np.float64)
        if not all_finite(value):
            # Never used, never acknowledged: refused, so the sender re-routes it.
            self.out.log(
                "bad-message",
                peer=peer,
                kind="non-finite",
                token=token,
                at=step,
                digest=value_digest(value),
            )
            if refuse:
                meta = {"a": _attempt(m), "refused": "non-finite"}
                self._send(peer, Message(kind="token_nack", round=token, step=step, meta=meta))
            return None
        if (token, step) in self.seen:
            self.out.log("duplicate", token=token, step=step, peer=peer, digest=value_digest(value))
        else:
            self.seen.add((token, step))
            self._log_value("token-seen", token, step, peer, value)
        return value

    def _inbound(self, peer: int, m: Message) -> None:
        token, step = m.round, m.step
        if m.kind == "done":
            self.finished_peers.add(peer)
            self._ends_from_goodbye(peer, m)
            return
        if not 0 <= token < self.plan.tokens or not 0 <= step <= self.plan.hops:
            self.out.log("bad-message", peer=peer, kind=m.kind, token=token, at=step)
            return
        if m.kind == "walk_end":
            how = m.meta.get("how") if isinstance(m.meta, dict) else None
            at = m.meta.get("at") if isinstance(m.meta, dict) else None
            if how not in WALK_ENDS or not (at is None or isinstance(at, int)):
                self.out.log("bad-message", peer=peer, kind="walk_end", token=token)
                return
            self._end(token, how, at, step)
            return
        if m.kind == "token":
            value = self._token_value(peer, m)
            if value is None:
                return
        if token in self.ended:
            if m.kind == "token":
                self.out.log("token-after-end", token=token, step=step, peer=peer)
            self._answer_after_end(peer, m)
            return
        attempt = _attempt(m)
        if m.kind in ("token", "token_commit", "token_ack"):
            self._fence(token, step)
        if m.kind == "token":
            if self.accepted.get(token, -1) >= step:
                self._send(peer, self._msg("token_taken", token, step))
                return
            if step < self.newest.get(token, -1):
                return  # a hand-off of a step the walk has passed: stale
            inc = self.incoming.get((token, step))
            if inc is None or (inc.frm == peer and attempt > inc.attempt):
                self.incoming[(token, step)] = _Incoming(peer, value, attempt)
            elif inc.frm != peer or attempt != inc.attempt:
                return  # not the hand-off this node is holding: no ack
            self._send(peer, self._msg("token_ack", token, step, attempt))
        elif m.kind == "token_ack":
            o = self.offers.get(token)
            if o is None or o.to != peer or o.step != step or o.attempt != attempt:
                c = self.custody.get(token)
                if c is None or (c.peer, c.step, c.attempt) != (peer, step, attempt):
                    self.out.log("late-ack", token=token, step=step, peer=peer)
                    self._send(peer, self._msg("token_abort", token, step, attempt))
                return
            del self.offers[token]
            self.custody[token] = _Custody(peer, step, o.value, attempt, self._now + self.deadline)
            self._send(peer, self._msg("token_commit", token, step, attempt))
            self.out.log(
                "token-send", token=token, step=step, peer=peer, digest=value_digest(o.value)
            )
            self.forwarded[token] = step
            frm = self.came_from.pop(token, None)
            if frm is not None:
                self._send(frm, self._msg("token_fwd", token, self.accepted.get(token, 0)))
        elif m.kind == "token_commit":
            if self.accepted.get(token, -1) >= step:
                self._send(peer, self._msg("token_taken", token, step))  # a repeated commit
                return
            inc = self.incoming.get((token, step))
            if inc is None or inc.frm != peer or inc.attempt != attempt:
                self.out.log("bad-message", peer=peer, kind="token_commit", token=token, at=step)
                self._send(peer, self._msg("token_nack", token, step, attempt))
                return
            del self.incoming[(token, step)]
            self.out.log("token-accept", token=token, step=step, peer=peer)
            self._send(peer, self._msg("token_taken", token, step))
            self.accepted[token] = step
            self.came_from[token] = peer
            self.hold(token, step, inc.value)
        elif m.kind == "token_taken":
            c = self.custody.get(token)
            if c is not None and (c.peer, c.step) == (peer, step) and not c.taken:
                c.taken = True
                c.retry = self._now + 2 * self.deadline
        elif m.kind == "token_abort":
            inc = self.incoming.get((token, step))
            if inc is not None and inc.frm == peer and inc.attempt == attempt:
                del self.incoming[(token, step)]
                self.out.log("token-aborted", token=token, step=step, peer=peer)
        elif m.kind == "token_query":
            if self.forwarded.get(token, -1) > step:
                self._send(peer, self._msg("token_fwd", token, step))
            elif self.accepted.get(token, -1) >= step:
                self._send(peer, self._msg("token_taken", token, step))
            elif (token, step) not in self.incoming:
                self._send(peer, self._msg("token_nack", token, step, attempt))
        elif m.kind == "token_nack":
            o = self.offers.get(token)
            refused = isinstance(m.meta, dict) and "refused" in m.meta
            if refused and o is not None and (o.to, o.step, o.attempt) == (peer, step, attempt):
                if not o.committed:
                    self._reroute(token, "refused")
                return
            c = self.custody.get(token)
            if c is not None and (c.peer, c.step, c.attempt) == (peer, step, attempt):
                if c.taken:
                    return  # it said taken before: a stray nack changes nothing
                del self.custody[token]
                self.out.log("token-nack", token=token, step=step, peer=peer)
                # The same hop again, a new attempt; committed: it never goes elsewhere.
                self._offer(token, step, c.value, peer, c.attempt + 1, set(), committed=True)
        elif m.kind == "token_fwd":
            c = self.custody.get(token)
            if c is not None and c.peer == peer and step >= c.step:
                del self.custody[token]
        else:
            self.out.log("bad-message", peer=peer, kind=m.kind, token=token, at=step)

    def _answer_after_end(self, peer: int, m: Message) -> None:
        """A hand-off message of a walk that has ended here: tell the sender how it ended if it
        waits for an answer (AWAIT_ANSWER). The others (``token_taken``, ``token_fwd``,
        ``token_nack``, ``token_abort``) are answers or releases themselves: their sender waits
        for nothing and learns the end from the broadcast ``walk_end`` and the ``done``
        messages; answering them would add messages whose presence depends only on whether
        the end or the hand-off message arrived first, in a fault-free run too."""
        if m.kind in AWAIT_ANSWER:
            self._send(peer, self._end_msg(m.round))

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
                and how in WALK_ENDS
                and (step is None or isinstance(step, int))
                and (at is None or isinstance(at, int))
            ):
                self._end(token, how, at, step)

    def _expire(self, now: float) -> None:
        for token, c in list(self.custody.items()):
            if self.custody.get(token) is not c:
                continue
            if self._gone(c.peer):
                # It took the token (or may have: a commit went out) and is gone with it.
                self.out.log("token-lost", token=token, step=c.step, peer=c.peer)
                self._end(token, "lost", c.peer, c.step)
            elif c.peer not in self.down and now >= c.retry:
                if c.taken:
                    c.retry = now + 2 * self.deadline
                    self._send(c.peer, self._msg("token_query", token, c.step, c.attempt))
                else:
                    c.retry = now + self.deadline
                    self.out.log(
                        "token-resend", token=token, step=c.step, peer=c.peer, what="commit"
                    )
                    self._send(c.peer, self._msg("token_commit", token, c.step, c.attempt))
        for token, o in list(self.offers.items()):
            if self.offers.get(token) is not o:
                continue
            if self._gone(o.to):
                if o.committed:
                    del self.offers[token]
                    self.out.log("token-lost", token=token, step=o.step, peer=o.to)
                    self._end(token, "lost", o.to, o.step)
                else:
                    self._reroute(token, "peer-down")
            elif o.to not in self.down and now >= o.retry:
                o.retry = now + self.deadline
                self.out.log("token-resend", token=token, step=o.step, peer=o.to, what="token")
                self._send(o.to, self._msg("token", token, o.step, o.attempt, payload=o.value))

    # ------------------------------------------------------------------------------ goodbye

    def _begin_goodbye(self, now: float) -> None:
        """Say done (with how every walk ended) to every neighbour and wait for theirs, saying
        it again every deadline: until every neighbour said done or is gone (down past the grace
        period), at most GOODBYE_DEADLINES deadlines. A neighbour that missed a walk's end (a
        lost ``walk_end``) learns it from the repeated done."""
        self._say_done([w for w in self.neighbours if w not in self.down])
        pending = {w for w in self.neighbours if w not in self.finished_peers}
        self._bye = (pending, now + GOODBYE_DEADLINES * self.deadline)
        self._bye_retry = now + self.deadline
        self._goodbye_event(None, now)

    def _say_done(self, peers) -> None:
        ended = {str(j): [e["how"], e["at"], e["step"]] for j, e in self.ended.items()}
        for w in peers:
            if w not in self.down:
                self.out.send(w, Message(kind="done", round=0, step=0, meta={"ended": ended}))

    def _goodbye_event(self, event: NetEvent | None, now: float) -> None:
        assert self._bye is not None
        pending, until = self._bye
        if isinstance(event, PeerDown):
            if event.peer in pending:  # one that said done may close its channel: no news
                self._peer_down(event.peer, str(event.reason))
        elif isinstance(event, PeerUp):
            if event.peer in self.down:
                self.down.discard(event.peer)
                self.down_at.pop(event.peer, None)
                self.out.log("peer-up", peer=event.peer)
                if event.peer in pending:
                    self._say_done([event.peer])
        elif isinstance(event, Inbound):
            m = event.message
            if m.kind == "done":
                pending.discard(event.peer)
            elif m.kind == "token" and 0 <= m.round < self.plan.tokens:
                # Every walk has ended here: log what we saw (step and value), refuse it, and
                # tell the sender how the walk ended.
                if self._token_value(event.peer, m, refuse=False) is not None:
                    self.out.log("token-after-end", token=m.round, step=m.step, peer=event.peer)
                if m.round in self.ended:
                    self._answer_after_end(event.peer, m)
            elif m.kind == "token":
                self.out.log("bad-message", peer=event.peer, kind="token", token=m.round)
            elif m.kind.startswith("token_") and m.round in self.ended:
                self._answer_after_end(event.peer, m)  # a stale hand-off: tell it
        gone = {w for w in pending if self._gone(w)}
        self._bye_unanswered |= gone
        pending -= gone
        if pending and now >= self._bye_retry:
            self.out.log("goodbye-resend", peers=sorted(pending))
            self._say_done(sorted(pending))
            self._bye_retry = now + self.deadline
        if pending and now < until:
            return
        self.finished = True
        if self._bye_unanswered or pending:
            # their done never came (lost, or they went down first)
            self.out.log("goodbye-unanswered", peers=sorted(self._bye_unanswered | pending))
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
