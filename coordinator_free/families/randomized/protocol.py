"""Randomized Muffliato (Algorithm 2 of the Muffliato paper): asynchronous pairwise gossip.

Every node adds Gaussian noise to its private value once (``x_v^0 = x_v + eta_v``), then the
network runs T *exchanges*. Exchange t activates one edge {a, b}: a and b swap their current
values and both set

    x_a^{t+1} = x_b^{t+1} = (x_a^t + x_b^t) / 2,      every other node keeps its value,

i.e. ``W_t = I - (e_a - e_b)(e_a - e_b)^T / 2``. (The paper prints superscript t+1 on the right;
it means t.)

Clocks. Node v carries a Poisson clock of rate ``1 - W_vv`` (time in clock units); when it rings,
v picks neighbour w with probability ``W_vw / (1 - W_vv)`` and exchanges with it. Edge {v, w}
then rings at rate ``2 W_vw`` and, over the merged clocks, exchange t is edge {v, w} with
probability ``p_vw = 2 W_vw / Lambda``, ``Lambda = sum_v (1 - W_vv)``: the paper's ``p = 2W/n``
up to the normalisation (Lambda = n when every clock has rate 1 and a self-pick is an idle tick).
The expected one-exchange map is ``I - (I - W)/Lambda``, spectral gap ``lambda_W / Lambda``, so
randomized gossip needs about Lambda times more exchanges than synchronous gossip has steps, while
each node takes part in only ``2 (1 - W_vv) T / Lambda`` of them on average.

Every clock is drawn from the public run seed: the exchange sequence is public (an observer of
the network sees who talks to whom anyway, and Corollary 2 conditions on it), so ``cfree plan``
knows it and the auditor replays it. The peers run it in real time: exchange t happens
``protocol.tick`` seconds per clock unit after the start (tick 0: as fast as the network allows),
and each node serves its own exchanges in clock order, waiting for a late partner rather than
reordering. Two exchanges on the same edge that ring almost together (both ends woke at once) are
two numbered exchanges served one after the other: there is no lock to deadlock on. A partner
that misses the exchange deadline (crash, partition) leaves the node's value unchanged; the logs
say who averaged with whom at which exchange, and the auditor uses that realised sequence.

Both ends compute the average with :func:`muffliato.gossip_update` on the terms in increasing
node-id order, so they hold the same bits, and the simulator reproduces them exactly.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import networkx as nx
import numpy as np

from coordinator_free import graphs, seeds
from coordinator_free.families.averaging import protocol as mf

if TYPE_CHECKING:
    from coordinator_free.config import Config

PROTOCOL = "randomized-gossip"


@dataclass(frozen=True)
class Exchange:
    """Exchange t of the schedule: edge {a, b} (a < b), rung by ``initiator``'s clock at
    ``time`` (clock units)."""

    t: int
    a: int
    b: int
    initiator: int
    time: float

    def partner(self, v: int) -> int:
        return self.b if v == self.a else self.a


def clock_rates(W: np.ndarray) -> np.ndarray:
    """Per-node clock rates ``1 - W_vv`` (the off-diagonal mass of each row, summed exactly)."""
    n = W.shape[0]
    return np.array([math.fsum(float(W[v, w]) for w in range(n) if w != v) for v in range(n)])


def poisson_schedule(W: np.ndarray, steps: int, seed: int) -> tuple[Exchange, ...]:
    """The first ``steps`` rings of the nodes' Poisson clocks, merged in time order.

    Node v's clock and partner choices come from the public stream ``(PURPOSE_CLOCK, v)`` of the
    run seed: anyone with the config derives the same sequence.
    """
    n = W.shape[0]
    rates = clock_rates(W)
    public = seeds.PublicSeedStreams(seed)
    gens: dict[int, tuple[np.random.Generator, np.ndarray, np.ndarray, float]] = {}
    heap: list[tuple[float, int]] = []
    for v in range(n):
        if rates[v] <= 0.0:
            continue  # an isolated node never rings
        nbrs = np.array([w for w in range(n) if w != v and W[v, w] > 0.0], dtype=np.int64)
        cum = np.cumsum(W[v, nbrs])
        rng = public.stream(seeds.PURPOSE_CLOCK, v)
        gens[v] = (rng, nbrs, cum, float(rates[v]))
        heapq.heappush(heap, (float(rng.exponential(1.0 / rates[v])), v))
    if not heap:
        raise ValueError("no node has a neighbour: nothing to exchange")
    out: list[Exchange] = []
    while len(out) < steps:
        time, v = heapq.heappop(heap)
        rng, nbrs, cum, rate = gens[v]
        i = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
        w = int(nbrs[min(i, nbrs.size - 1)])
        out.append(Exchange(t=len(out), a=min(v, w), b=max(v, w), initiator=v, time=time))
        heapq.heappush(heap, (time + float(rng.exponential(1.0 / rate)), v))
    return tuple(out)


def schedule_digest(edges: tuple[Exchange, ...]) -> str:
    """A short fingerprint of the exchange sequence (logged, checked by the auditor)."""
    h = hashlib.sha256()
    for e in edges:
        h.update(f"{e.t},{e.a},{e.b},{e.initiator};".encode())
    return h.hexdigest()[:32]


@dataclass(frozen=True)
class RandomizedPlan(mf.GraphRows):
    """Everything public about a randomized-gossip run, derived from the config."""

    n: int
    graph: nx.Graph
    W: np.ndarray
    steps: int
    edges: tuple[Exchange, ...]
    rate: float  # Lambda: the merged clock rate, exchanges per clock unit
    spectral_gap: float  # lambda_W of the gossip matrix the clocks follow
    tick: float
    dim: int
    sigma: float
    sensitivity: float
    alpha: float
    delta: float
    accelerated: bool = False
    gamma: float = 1.0

    def gamma_at(self, t: int) -> float:
        return 1.0

    def exchanges_of(self, v: int) -> list[Exchange]:
        return [e for e in self.edges if v in (e.a, e.b)]

    def partners_at(self, v: int, t: int) -> list[int]:
        e = self.edges[t]
        return [e.partner(v)] if v in (e.a, e.b) else []

    def row_at(self, v: int, t: int) -> dict[int, float]:
        e = self.edges[t]
        if v in (e.a, e.b):
            return {e.a: 0.5, e.b: 0.5}
        return {v: 1.0}

    def exchange_counts(self) -> np.ndarray:
        """T_v: how many exchanges each node takes part in."""
        out = np.zeros(self.n, dtype=np.int64)
        for e in self.edges:
            out[e.a] += 1
            out[e.b] += 1
        return out

    def public_params(self) -> dict:
        return {
            "protocol": PROTOCOL,
            "n": self.n,
            "steps": self.steps,
            "accelerated": False,
            "rate": self.rate,
            "spectral_gap": self.spectral_gap,
            "tick": self.tick,
            "schedule": schedule_digest(self.edges),
            "dim": self.dim,
            "sigma": self.sigma,
            "sensitivity": self.sensitivity,
            "alpha": self.alpha,
            "delta": self.delta,
        }


def auto_exchanges(lam: float, rate: float, n: int, sigma: float, spread: float, dim: int) -> int:
    """T^stop for randomized gossip: the plain synchronous T^stop (rate lambda_W) times Lambda,
    since one exchange contracts in expectation by the gap lambda_W / Lambda."""
    sync = graphs.auto_steps(lam, n, sigma, spread, dim, accelerated=False)
    return max(1, math.ceil(sync * rate))


def make_plan(cfg: Config, graph: nx.Graph | None = None) -> RandomizedPlan:
    g = graph if graph is not None else mf.build_graph_from_config(cfg)
    W = graphs.gossip_matrix(g, cfg.protocol.weights)
    lam = graphs.spectral_gap(W)
    rate = math.fsum(clock_rates(W))
    pr = cfg.protocol
    n = g.number_of_nodes()
    if pr.steps == "auto":
        steps = auto_exchanges(lam, rate, n, cfg.privacy.sigma, pr.spread, cfg.data.dim)
    else:
        steps = int(pr.steps)
    return RandomizedPlan(
        n=n,
        graph=g,
        W=W,
        steps=steps,
        edges=poisson_schedule(W, steps, cfg.run.seed),
        rate=rate,
        spectral_gap=lam,
        tick=pr.tick,
        dim=cfg.data.dim,
        sigma=cfg.privacy.sigma,
        sensitivity=cfg.sensitivity,
        alpha=cfg.privacy.alpha,
        delta=cfg.privacy.delta,
    )


def exchange_update(
    plan: RandomizedPlan, v: int, t: int, own: np.ndarray, got: dict[int, np.ndarray]
) -> np.ndarray:
    """Node v's value after exchange t: the pair's average if the partner's value arrived,
    else unchanged (the same terms, in the same order, for peers and simulator)."""
    terms = mf.step_terms(plan.row_at(v, t), v, own, got)
    return mf.gossip_update(terms, 1.0, None)


def fault_free_received(plan: RandomizedPlan, v: int) -> list[tuple[int, int]]:
    """The messages (t, partner) node v receives in a fault-free run."""
    return [(e.t, e.partner(v)) for e in plan.exchanges_of(v)]
