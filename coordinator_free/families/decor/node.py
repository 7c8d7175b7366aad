"""The peer side of ``decor``: the one-round seed exchange and the per-round pair bookkeeping.

Seed exchange (after the channels are up, before round 0): the node sends the public half of
its run exchange key to every neighbour (message ``decor_pub``) and waits, up to
``network.connect_timeout_s``, for theirs. A neighbour whose key arrives gives a pair secret;
one whose key does not arrive in time, or is unusable, has no pair for the whole run (logged
``decor-no-pair``). Gossip values that arrive meanwhile are kept for their step.

Every round the node adds the term of each *active* pair: a pair with a secret that has not been
dropped. A pair is dropped, from the next round on, when

* the neighbour's channel went down or it said it was done, so its value of a round was
  missed, or its value of a round was refused (NaN or an infinity: the step engine counts it
  as not received, reason ``refused``), or it missed the deadline ``DROP_AFTER_DEADLINES`` rounds in a row with none of those
  values arriving even late (a neighbour that is merely late — e.g. waiting out a crashed
  neighbour of its own — is still computing its rounds and adding its side, so its pair is
  kept): the
  node stops adding the term and tells the neighbour (``decor_drop``, best effort), or
* the neighbour says it dropped the pair (``decor_drop`` received): the node stops from the next
  round it computes.

A dropped pair stays dropped (both ends agree on that eventually, whatever the timing). Rounds
in which only one end added the term (a neighbour that crashed mid-round, a drop message still
in flight) leave that term uncancelled: it costs accuracy, and the auditor counts it as noise of
that node only. The log records, per round, the pairs used and one commitment per pair
(``decor-noise``), and every drop with its reason (``decor-drop``), so the auditor rebuilds the
realised pairs of every round. Secrets and noise never reach the log.
"""

from __future__ import annotations

import numpy as np

from coordinator_free import seeds
from coordinator_free.engine.step import Gather, Outcome, StepEngine
from coordinator_free.families.decor import keys as decor
from coordinator_free.families.learning import node as learning_node
from coordinator_free.families.learning import protocol as lp
from coordinator_free.net.wire import Message

#: A neighbour that is alive but late keeps its pair until it has missed this many rounds in a
#: row without any of their values arriving, even late (its channel going down, or its "done",
#: drops the pair at once).
DROP_AFTER_DEADLINES = 3


class DecorNode:
    """A node's pairs: the seed exchange, the round's correlated term, the drops. Writes to the
    view log and sends through the engine's outbox (``ctx.out``); never awaits anything."""

    def __init__(self, plan, node_id: int, own: seeds.NodeSecretStreams, ctx):
        self.plan, self.node, self.ctx = plan, node_id, ctx
        self.run_id = own.run_id
        self._key = decor.exchange_key(own)
        self._secrets: dict[int, bytes] = {}
        self.dropped: dict[int, int] = {}  # peer -> first round without the pair's term
        self.round = 0  # the round being computed or exchanged
        self._missed_seen = 0
        self._notify: set[int] = set()  # neighbours to tell that we have no pair with them
        self._late: dict[int, int] = {}  # peer -> deadlines missed in a row
        ctx.handlers.update(decor_drop=self.on_drop, decor_pub=self.on_late_key)

    @property
    def pairs(self) -> list[int]:
        return sorted(self._secrets)

    def exchange(self, timeout: float):
        """The seed exchange (a generator for the node program): send our public key to every
        neighbour, collect theirs."""
        pub = decor.public_bytes(self._key).hex()
        msg = Message(kind="decor_pub", round=0, step=0, meta={"pub": pub})
        # While the gather runs it takes the keys; afterwards on_late_key answers them.
        pending = yield Gather(msg, "decor_pub", self._take_key, timeout)
        for w in sorted(pending):
            self.ctx.out.log("decor-no-pair", peer=w, reason="no exchange key before the timeout")
        self.ctx.out.log("decor-exchange", pairs=self.pairs, missing=sorted(pending))

    def _take_key(self, peer: int, m: Message) -> bool:
        if peer in self._secrets:
            self.ctx.out.log("duplicate", step=0, peer=peer, kind="decor_pub")
            return True
        try:
            raw = bytes.fromhex(str(m.meta.get("pub", "")))
            secret = decor.pair_secret(self._key, raw, self.run_id, self.node, peer)
        except (ValueError, decor.DecorKeyError) as exc:
            self.ctx.out.log("decor-no-pair", peer=peer, reason=f"bad exchange key: {exc}")
            return True  # answered, but unusable: no pair with this neighbour
        self._secrets[peer] = secret
        self.ctx.out.log(
            "decor-pair",
            peer=peer,
            commit=decor.pair_commitment(secret, self.run_id, self.node, peer),
        )
        return True

    def active(self, r: int) -> list[int]:
        return [j for j in self.pairs if self.dropped.get(j, r + 1) > r]

    def term(self, r: int) -> np.ndarray:
        """This round's correlated term (logged: the pairs used and their commitments)."""
        self.round = r
        peers = self.active(r)
        self.ctx.out.log(
            "decor-noise",
            round=r,
            peers=peers,
            commits=[
                decor.commitment(self._secrets[j], self.run_id, self.node, j, r) for j in peers
            ],
        )
        dim, sigma_cor = self.plan.dim, self.plan.sigma_cor
        return decor.correlated_noise(
            self.node,
            peers,
            lambda j: decor.edge_noise(
                self._secrets[j], self.run_id, self.node, j, r, dim, sigma_cor
            ),
            dim,
        )

    def after_round(self, r: int, ctx) -> None:
        """Drop the pairs whose neighbour's round-r value was missed, and tell them (and the
        neighbours whose exchange key came too late that we have no pair)."""
        new = ctx.missed[self._missed_seen :]
        self._missed_seen = len(ctx.missed)
        missed_now = {m["peer"]: m["reason"] for m in new if m["step"] == r}
        for j in self.pairs:
            if j in self.dropped:
                continue
            if j not in missed_now:
                self._late.pop(j, None)
                continue
            reason = missed_now[j]
            if reason == "deadline":
                # A late neighbour whose values still arrive (late) is alive and still adds its
                # side: keep the pair. Drop it only after DROP_AFTER_DEADLINES missed rounds in a
                # row with no value of any of them arriving meanwhile.
                self._late[j] = self._late.get(j, 0) + 1
                silent = ctx.heard.get(j, -1) <= r - DROP_AFTER_DEADLINES
                if self._late[j] < DROP_AFTER_DEADLINES or not silent:
                    continue
                reason = f"{self._late[j]} deadlines missed in a row, nothing received"
            self.dropped[j] = r + 1
            ctx.out.log("decor-drop", peer=j, first_round=r + 1, reason=reason)
            self._notify.add(j)
        notify, self._notify = sorted(self._notify), set()
        for j in notify:
            if j in ctx.down or j in ctx.finished_peers:
                continue
            ctx.out.send(j, Message(kind="decor_drop", round=0, step=r + 1))

    def on_drop(self, peer: int, m: Message) -> None:
        """A neighbour dropped our pair: stop adding its term from the next round we compute."""
        if peer in self._secrets and peer not in self.dropped:
            first = self.round + 1
            self.dropped[peer] = first
            self.ctx.out.log(
                "decor-drop", peer=peer, first_round=first, reason=f"dropped by {peer} at {m.step}"
            )

    def on_late_key(self, peer: int, m: Message) -> None:
        """A key after the exchange closed: no pair; tell the neighbour, which may have ours."""
        if peer not in self._secrets:
            self.ctx.out.log(
                "decor-no-pair", peer=peer, reason="exchange key arrived after the timeout"
            )
            self._notify.add(peer)


class SimulatedPairs:
    """The correlated terms of a fault-free run, every pair active (the simulator's ``corr``):
    each edge's noise is drawn once per round and used by both ends."""

    def __init__(self, plan, streams, keep: list | None = None):
        self.plan = plan
        self.pairs = decor.PairSecrets.of_streams(streams, plan.graph.edges())
        self._memo: dict[tuple[int, int, int], np.ndarray] = {}
        self.kept = keep  # (round, node, term) of every term, when asked for

    def _z(self, r: int, a: int, b: int) -> np.ndarray:
        key = (r, min(a, b), max(a, b))
        z = self._memo.pop(key, None)  # the second end takes it and frees it
        if z is None:
            z = decor.edge_noise(
                self.pairs.secret(a, b),
                self.pairs.run_id,
                a,
                b,
                r,
                self.plan.dim,
                self.plan.sigma_cor,
            )
            self._memo[key] = z
        return z

    def of(self, v: int):
        """Node v's view: ``term(r)`` and a no-op ``after_round``."""
        sim = self

        class _Node:
            def term(self, r: int) -> np.ndarray:
                t = decor.correlated_noise(
                    v, sim.plan.neighbours(v), lambda j: sim._z(r, v, j), sim.plan.dim
                )
                if sim.kept is not None:
                    sim.kept.append((r, v, t))
                return t

            def after_round(self, r: int, ctx) -> None:
                pass

        return _Node()


def program(cfg, plan, node: int, streams):
    """DECOR's node program: the seed exchange, then the learning round loop with the pairs'
    correlated noise."""

    def run(ctx):
        task = lp.make_task(cfg, plan.n)
        dec = DecorNode(plan, node, streams, ctx)
        yield from dec.exchange(cfg.network.connect_timeout_s)
        out: Outcome = yield from learning_node.rounds(ctx, plan, task, node, streams, dec)
        return out

    return run


def engine(cfg, plan, node: int, streams) -> StepEngine:
    return learning_node.step_engine(cfg, plan, node, program(cfg, plan, node, streams))
