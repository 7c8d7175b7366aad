"""Muffliato averaging (Algorithm 1 of the Muffliato paper): the pure math.

Every node adds Gaussian noise to its private value once, then runs T synchronous gossip steps,
optionally with re-scaled Chebyshev acceleration:

    x_v^0     = x_v + eta_v,                       eta_v ~ N(0, sigma^2 I_D)
    x_v^{t+1} = gamma_t * sum_{w in N(v) + v} W_vw x~_w^t + (1 - gamma_t) x_v^{t-1}

with gamma_0 = 1 (so x^1 = W x^0, as Definition 3 requires; the paper leaves x^{-1} undefined)
and gamma_t = gamma for t >= 1 when accelerated (1 otherwise). x~_w^t is the value neighbour w
sent at step t, or the node's own x_v^t if w's message missed the step deadline (so a missing
neighbour's weight falls back to the node itself and rows stay stochastic).

The peer process and the reference simulator both call :func:`gossip_update` with the terms in
increasing node-id order, so their results agree bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import networkx as nx
import numpy as np

from coordinator_free import graphs, seeds

if TYPE_CHECKING:
    from coordinator_free.config import Config


class GraphRows:
    """Per-node views of a plan's public graph and gossip matrix (``graph``, ``W``)."""

    graph: nx.Graph
    W: np.ndarray

    def neighbours(self, v: int) -> list[int]:
        # Asked for at every message (whom a value may come from): sorted once per node.
        cache = self.__dict__.get("_neighbours_cache")
        if cache is None:
            cache = {}
            self.__dict__["_neighbours_cache"] = cache  # (frozen dataclasses included)
        got = cache.get(v)
        if got is None:
            got = cache[v] = tuple(sorted(self.graph.neighbors(v)))
        return list(got)

    def row(self, v: int) -> dict[int, float]:
        """Node v's gossip weights (itself included), keyed by node id."""
        return {w: float(self.W[v, w]) for w in sorted([*self.graph.neighbors(v), v])}

    def partners_at(self, v: int, t: int) -> list[int]:
        """Whom v exchanges values with at step t (every neighbour, every step)."""
        return self.neighbours(v)

    def row_at(self, v: int, t: int) -> dict[int, float]:
        """Node v's weights at step t (the same row every step)."""
        return self.row(v)


@dataclass(frozen=True)
class MuffliatoPlan(GraphRows):
    """Everything public about a Muffliato run, derived deterministically from the config."""

    n: int
    graph: nx.Graph
    W: np.ndarray  # a scipy CSR matrix past graphs.DENSE_MAX_N nodes
    steps: int
    accelerated: bool
    gamma: float
    spectral_gap: float
    dim: int
    sigma: float
    sensitivity: float
    alpha: float
    delta: float
    # Per-step node dropout (``--fault dropout:P``, public): the probability, and for every
    # step the nodes that sit it out. Empty: every node takes part in every step.
    dropout: float = 0.0
    dropped: tuple[frozenset[int], ...] = ()

    def gamma_at(self, t: int) -> float:
        return 1.0 if (t == 0 or not self.accelerated) else self.gamma

    def partners_at(self, v: int, t: int) -> list[int]:
        """Whom v exchanges with at step t: every neighbour, except under dropout, where a
        node that sits out exchanges with nobody and nobody exchanges with it (its weight
        stays with each node, as for a missed value)."""
        if not self.dropped:
            return self.neighbours(v)
        out = self.dropped[t]
        if v in out:
            return []
        return [w for w in self.neighbours(v) if w not in out]

    def public_params(self) -> dict:
        return {
            "protocol": "muffliato",
            "n": self.n,
            "steps": self.steps,
            "accelerated": self.accelerated,
            "gamma": self.gamma,
            "spectral_gap": self.spectral_gap,
            "dim": self.dim,
            "sigma": self.sigma,
            "sensitivity": self.sensitivity,
            "alpha": self.alpha,
            "delta": self.delta,
            # Only under dropout (a view log without it is a run without dropout).
            **({"dropout": self.dropout} if self.dropout else {}),
        }


#: The public stream the dropout schedule is drawn from (purpose id, see seeds).
PURPOSE_DROPOUT = 6


def dropout_schedule(seed: int, n: int, steps: int, p: float) -> tuple[frozenset[int], ...]:
    """For every step, the nodes that sit it out: each node independently with probability p,
    from the public run seed (so every peer, the planner and the auditor draw the same)."""
    if not p:
        return ()
    rng = seeds.PublicSeedStreams(seed).stream(PURPOSE_DROPOUT, 0, 0)
    out = rng.random((steps, n)) < p
    return tuple(frozenset(np.flatnonzero(row).tolist()) for row in out)


def build_graph_from_config(cfg: Config, seed: int | None = None) -> nx.Graph:
    """The config's graph; ``seed`` overrides ``graph.seed`` (a round's graph, graph.resample)."""
    g = cfg.graph
    return graphs.build_graph(
        g.kind,
        nodes=g.nodes,
        dim=g.dim,
        rows=g.rows,
        cols=g.cols,
        p=g.p,
        radius=g.radius,
        path=g.path,
        seed=g.seed if seed is None else seed,
    )


def make_plan(cfg: Config, graph: nx.Graph | None = None) -> MuffliatoPlan:
    g = graph if graph is not None else build_graph_from_config(cfg)
    # Past DENSE_MAX_N nodes, on a graph with translation symmetry (hypercube, ring), the
    # matrix stays sparse: the spectral gap, the simulator, the audit and the planner's
    # symmetric and few-observer paths take it as it is.
    sparse = g.number_of_nodes() > graphs.DENSE_MAX_N
    W = graphs.gossip_matrix(g, cfg.protocol.weights, sparse=sparse)
    if sparse and graphs.translation_group(W) is None:
        W = W.toarray()
    lam = graphs.spectral_gap(W)
    pr = cfg.protocol
    gamma = graphs.chebyshev_gamma(lam) if pr.accelerated else 1.0
    if pr.steps == "auto":
        steps = graphs.auto_steps(
            lam, g.number_of_nodes(), cfg.privacy.sigma, pr.spread, cfg.data.dim, pr.accelerated
        )
    else:
        steps = int(pr.steps)
    return MuffliatoPlan(
        n=g.number_of_nodes(),
        graph=g,
        W=W,
        steps=steps,
        accelerated=pr.accelerated,
        gamma=gamma,
        spectral_gap=lam,
        dim=cfg.data.dim,
        sigma=cfg.privacy.sigma,
        sensitivity=cfg.sensitivity,
        alpha=cfg.privacy.alpha,
        delta=cfg.privacy.delta,
        dropout=cfg.fault_plan.dropout,
        dropped=dropout_schedule(cfg.run.seed, g.number_of_nodes(), steps, cfg.fault_plan.dropout),
    )


def private_value(cfg: Config, v: int, streams: seeds.Streams, round_: int = 0) -> np.ndarray:
    """Node v's private input for the averaging demo, drawn from v's data stream (``round_``:
    the token protocols' k-th contribution of v)."""
    rng = streams.stream(seeds.PURPOSE_DATA, v, round_)
    d = cfg.data
    if d.kind == "uniform":
        return rng.uniform(d.low, d.high, size=d.dim)
    if d.kind == "gaussian":
        return rng.normal(d.mean, d.scale, size=d.dim)
    if d.kind == "bernoulli":
        return (rng.random(size=d.dim) < d.p).astype(np.float64)
    raise ValueError(f"unknown data kind {d.kind!r}")


def local_noise(cfg: Config, v: int, streams: seeds.Streams, round_: int = 0) -> np.ndarray:
    """Node v's Gaussian noise for one averaging run, from v's (secret) noise stream."""
    rng = streams.stream(seeds.PURPOSE_NOISE, v, round_)
    return rng.normal(0.0, cfg.privacy.sigma, size=cfg.data.dim)


def initial_value(x: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """x_v^0 = x_v + eta_v: the only value ever sent that depends on the raw input."""
    return x + noise


def gossip_update(
    terms: Sequence[tuple[float, np.ndarray]],
    gamma_t: float,
    previous: np.ndarray | None,
) -> np.ndarray:
    """One Muffliato step for one node.

    ``terms`` are (weight, value) pairs in increasing node-id order (the node itself included,
    with missing neighbours already replaced by the node's own value). The accumulation order is
    fixed so every driver gets bit-identical results.
    """
    acc = terms[0][0] * terms[0][1]
    if (
        type(acc) is not np.ndarray
        or acc.size < _IN_PLACE_FROM
        or not _same_float64(acc, terms, previous)
    ):
        for weight, value in terms[1:]:
            acc = acc + weight * value
        if gamma_t == 1.0:
            return acc
        if previous is None:
            raise ValueError("an accelerated step needs the previous value")
        return gamma_t * acc + (1.0 - gamma_t) * previous
    if gamma_t != 1.0 and previous is None:
        raise ValueError("an accelerated step needs the previous value")
    # The same operations in the same order, element by element (bit for bit the expression
    # above), into the result and one scratch block instead of two new arrays per term, and a
    # block at a time, so a large value's pieces stay in the cache between the operations.
    flat = acc.reshape(-1)
    n = flat.size
    block = min(n, _BLOCK)
    tmp = np.empty(block)
    vals = [(w, v.reshape(-1)) for w, v in terms[1:]]
    prev = previous.reshape(-1) if previous is not None else None
    for start in range(0, n, block):
        end = min(start + block, n)
        a = flat[start:end]
        t = tmp[: end - start]
        for weight, value in vals:
            np.multiply(weight, value[start:end], out=t)
            np.add(a, t, out=a)
        if prev is not None and gamma_t != 1.0:
            np.multiply(gamma_t, a, out=a)
            np.multiply(1.0 - gamma_t, prev[start:end], out=t)
            np.add(a, t, out=a)
    return acc


#: Entries per block of :func:`gossip_update` (128 KiB of float64 per array).
_BLOCK = 16384
#: The least entries for which :func:`gossip_update` works in place: below, the new arrays of
#: the plain expression cost less than the in-place path's Python (8 floats: 4.5 against 9.5
#: us here; even at 4 096).
_IN_PLACE_FROM = 4096


def _same_float64(acc, terms, previous) -> bool:
    """Whether every array of a step is a float64 array of ``acc``'s shape (the in-place
    path of :func:`gossip_update`; anything else takes the general expression)."""
    if type(acc) is not np.ndarray or acc.dtype != np.float64:
        return False
    shape = acc.shape
    for _, value in terms:
        if type(value) is not np.ndarray or value.dtype != np.float64 or value.shape != shape:
            return False
    return previous is None or (
        type(previous) is np.ndarray and previous.dtype == np.float64 and previous.shape == shape
    )


def step_terms(
    row: dict[int, float], own: int, own_value: np.ndarray, received: dict[int, np.ndarray]
) -> list[tuple[float, np.ndarray]]:
    """Build the (weight, value) terms for :func:`gossip_update`: missing neighbours -> own value."""
    return ordered_terms(sorted(row.items()), own, own_value, received)


def ordered_terms(
    items: list[tuple[int, float]], own: int, own_value: np.ndarray, received: dict
) -> list[tuple[float, np.ndarray]]:
    """:func:`step_terms` of a row given as its ``(node, weight)`` items in increasing node
    order (``sorted(row.items())``, made once for the steps that share the row)."""
    get = received.get
    return [(wt, own_value if w == own else get(w, own_value)) for w, wt in items]


def steps_per_second(steps: int, seconds: float) -> float:
    return steps / seconds if seconds > 0 else math.inf
