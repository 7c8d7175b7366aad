"""Link fault injection for a :class:`~coordinator_free.net.transport.PeerNet`.

A :class:`LinkFaults` object handed to ``PeerNet(..., faults=...)`` makes the node's own links
misbehave the way a bad network would, on real sockets, so that the protocols' fault handling
can be exercised end to end:

* ``drop``: each data message is, with this probability, not sent at all. The decision is made
  before encryption, so the channel's nonce sequence stays valid; ``send()`` returns normally.
* ``duplicate``: each data message is, with this probability, sent twice (two encrypted frames).
* ``corrupt``: each data message is, with this probability, sent with one bit of its encrypted
  frame (ciphertext or tag, never the header) flipped on the wire. The receiver's authentication
  fails and it drops the channel; both ends report a ``PeerDown`` naming the failed
  authentication, and the edge's leader redials.
* ``delay_s``: every data frame waits this long before it is written; frames keep their order on
  each channel (control frames queue behind delayed data), and ``send()`` does not wait.
* :meth:`LinkFaults.block`: no frame passes to or from the blocked neighbours in either
  direction: data, heartbeats, and the handshake messages of new connections (which then time
  out), as if the cable were pulled. Connections closed while a neighbour is blocked are kept
  open without traffic (the close would not cross a pulled cable either) until it is unblocked.
  With liveness on, the silence detector declares the neighbour down; :meth:`LinkFaults.unblock`
  lets the usual redial bring the channel back.

Heartbeats and other control frames are never dropped, duplicated, corrupted or delayed (only
blocked, and queued behind delayed data). Every decision comes from a random stream per
neighbour seeded by ``(seed, neighbour)``, so a run is reproducible given the seed and the
order of the sends to each neighbour. :attr:`LinkFaults.counts` records what was injected (in
frames), for the node's result file.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["FAULT_COUNTS", "LinkFaults", "SendPlan"]

#: The keys of :attr:`LinkFaults.counts`, each a number of frames.
FAULT_COUNTS = ("dropped", "duplicated", "corrupted", "delayed", "blocked")


@dataclass(frozen=True)
class SendPlan:
    """What happens to one data message: ``copies`` frames are sent (0: dropped), the first of
    them corrupted if ``corrupt``."""

    copies: int
    corrupt: bool


def _probability(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"LinkFaults: {name} must be a number in [0, 1], got {value!r}")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"LinkFaults: {name} must be in [0, 1], got {value!r}")
    return float(value)


def _peer_ids(peers: int | Iterable[int], what: str) -> list[int]:
    items = [peers] if isinstance(peers, int) else list(peers)
    for p in items:
        if isinstance(p, bool) or not isinstance(p, int) or p < 0:
            raise ValueError(
                f"LinkFaults.{what}: node ids must be non-negative integers, got {p!r}"
            )
    return items


class LinkFaults:
    """Faults injected on one node's links (see the module docstring for the semantics)."""

    def __init__(
        self,
        *,
        drop: float = 0.0,
        duplicate: float = 0.0,
        corrupt: float = 0.0,
        delay_s: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.drop = _probability("drop", drop)
        self.duplicate = _probability("duplicate", duplicate)
        self.corrupt = _probability("corrupt", corrupt)
        if (
            isinstance(delay_s, bool)
            or not isinstance(delay_s, int | float)
            or not math.isfinite(delay_s)
            or delay_s < 0
        ):
            raise ValueError(f"LinkFaults: delay_s must be a finite number >= 0, got {delay_s!r}")
        self.delay_s = float(delay_s)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"LinkFaults: seed must be an integer, got {seed!r}")
        self.seed = seed
        #: Neighbours cut off right now (may also be changed directly; prefer block/unblock,
        #: which also let a PeerNet act at once on the change).
        self.blocked: set[int] = set()
        #: What was injected, in frames.
        self.counts: dict[str, int] = dict.fromkeys(FAULT_COUNTS, 0)
        self._streams: dict[int, random.Random] = {}
        self._listeners: list[Callable[[frozenset[int], bool], None]] = []

    def __repr__(self) -> str:
        return (
            f"LinkFaults(drop={self.drop}, duplicate={self.duplicate}, corrupt={self.corrupt}, "
            f"delay_s={self.delay_s}, seed={self.seed}, blocked={sorted(self.blocked)})"
        )

    @property
    def declared_any(self) -> bool:
        """Whether any per-message fault (drop, duplicate, corrupt, delay) is declared; without
        one, only :meth:`block` (a cut) changes what the transport does."""
        return bool(self.drop or self.duplicate or self.corrupt or self.delay_s > 0)

    @property
    def declared(self) -> dict:
        """The declared fault parameters (for a result file, next to :attr:`counts`)."""
        return {
            "drop": self.drop,
            "duplicate": self.duplicate,
            "corrupt": self.corrupt,
            "delay_s": self.delay_s,
            "seed": self.seed,
        }

    # ----------------------------------------------------------------- blocking

    def block(self, peers: int | Iterable[int]) -> None:
        """Cut the links to ``peers`` (node ids) in both directions."""
        items = frozenset(_peer_ids(peers, "block"))
        self.blocked |= items
        self._notify(items, True)

    def unblock(self, peers: int | Iterable[int]) -> None:
        """Restore the links to ``peers``; the usual redial brings their channels back."""
        items = frozenset(_peer_ids(peers, "unblock"))
        self.blocked -= items
        self._notify(items, False)

    def is_blocked(self, peer: int | None) -> bool:
        return peer is not None and peer in self.blocked

    def subscribe(self, listener: Callable[[frozenset[int], bool], None]) -> None:
        """Call ``listener(peers, blocked)`` after every :meth:`block` / :meth:`unblock`."""
        self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[frozenset[int], bool], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _notify(self, peers: frozenset[int], blocked: bool) -> None:
        for listener in list(self._listeners):
            listener(peers, blocked)

    # ----------------------------------------------------------------- decisions

    def _stream(self, peer: int) -> random.Random:
        rng = self._streams.get(peer)
        if rng is None:
            # A str seed is hashed with SHA-512: stable across processes and Python runs.
            rng = self._streams[peer] = random.Random(f"cfree link faults {self.seed} {peer}")
        return rng

    def plan_send(self, peer: int) -> SendPlan:
        """Decide the fate of the next data message to ``peer`` and count it.

        Three draws per message whatever the outcome, so message k's fate depends only on the
        seed, the neighbour and k.
        """
        rng = self._stream(peer)
        u_drop, u_dup, u_corrupt = rng.random(), rng.random(), rng.random()
        if u_drop < self.drop:
            self.counts["dropped"] += 1
            return SendPlan(0, False)
        copies = 2 if u_dup < self.duplicate else 1
        if copies == 2:
            self.counts["duplicated"] += 1
        corrupt = u_corrupt < self.corrupt
        if corrupt:
            self.counts["corrupted"] += 1
        if self.delay_s > 0:
            self.counts["delayed"] += copies
        return SendPlan(copies, corrupt)

    def corrupt_bit(self, peer: int, nbits: int) -> int:
        """Which of ``nbits`` bits to flip in a corrupted frame to ``peer``."""
        return self._stream(peer).randrange(nbits)

    def count_blocked(self, frames: int = 1) -> None:
        self.counts["blocked"] += frames
