"""Token forwarding: the pure math of the ring, complete-graph and random-walk protocols.

A token (a running sum, a count histogram or a model) makes ``hops`` steps. Step ``s`` of token
``j`` is made by its holder ``v``, which updates the token with its own data (or with noise only,
past its contribution cap) and then picks the next holder:

* ``ring-sum`` (Algorithm 1 of "Privacy amplification by decentralization"): the directed ring
  0 -> 1 -> ... -> n-1 -> 0, K cycles; Gaussian noise at every (n-1)-th step (steps 0, n-1,
  2(n-1), ...), so every window between two visits of a node holds at least one noise term of
  another node. ``distributed_noise``: Remark 1, every step adds std sigma/sqrt(n-1) (the first
  sigma); the note's erratum, not the printed sqrt(n).
* ``ring-histogram`` (Algorithm 2): every step adds one randomized response RR_gamma of the
  holder's value to the count vector; the start node first adds round(gamma n) uniform items.
  The debiasing is done once, at the end (the note's corrected estimator).
* ``complete-sum`` / ``complete-histogram`` / ``complete-sgd`` (Algorithms 3, 5, 4): the next
  holder is uniform over all n nodes, the holder itself included; every sum contribution carries
  Gaussian noise of std sigma.
* ``walk-sgd`` (random-walk DP-SGD, Cyffers, Bellet, Upadhyay 2024): the next holder is drawn from
  the holder's row of the Metropolis matrix (self-loop included).

SGD steps: ``theta <- theta - nu (g + eta + l2 theta)`` with ``g`` the holder's mean gradient,
each example's gradient clipped to norm C before any noise (``g = 0`` past the cap), and
``eta ~ N(0, sigma^2 I)``.

All randomness of a step comes from the holder's secret streams keyed by ``(token, step)``: its
noise, its randomized response, its minibatch and its draw of the next hop. A node's k-th data
value comes from its data stream at round k. So the peers and the simulator (given the same
streams) compute bit-identical tokens whatever order the tokens interleave in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import networkx as nx
import numpy as np

from coordinator_free import graphs, seeds
from coordinator_free.errors import ConfigError
from coordinator_free.families.averaging import protocol as mf

if TYPE_CHECKING:
    from coordinator_free.config import Config

KIND = {
    "ring-sum": "sum",
    "complete-sum": "sum",
    "ring-histogram": "histogram",
    "complete-histogram": "histogram",
    "complete-sgd": "sgd",
    "walk-sgd": "sgd",
}

# A step's streams are keyed by (token << 32) | step; the init items of a ring histogram use the
# step number below, which no real step reaches (hops <= 10^6 < 2^32 - 1).
_INIT_STEP = (1 << 32) - 1


def step_key(token: int, step: int) -> int:
    return (int(token) << 32) | int(step)


def rr_gamma(eps0: float, levels: int) -> float:
    """The randomization probability of L-ary randomized response that is eps0-LDP: with
    probability gamma the output is uniform over the L levels (possibly the true one), so
    P(true) / P(other) = (1 - gamma + gamma/L) / (gamma/L) = e^eps0."""
    return levels / (math.exp(eps0) + levels - 1)


@dataclass(frozen=True)
class WalkPlan(mf.GraphRows):
    """Everything public about a token run, derived deterministically from the config."""

    protocol: str
    n: int
    graph: nx.Graph
    W: np.ndarray  # the transition matrix of the walk (row v: where v sends the token)
    hops: int  # steps per token (ring: cycles * n)
    tokens: int
    cap: int  # contributions per node and token, 0 = no cap
    cycles: int
    distributed_noise: bool
    dim: int  # length of the token vector
    levels: int
    eps0: float
    init_items: int  # ring-histogram: uniform items the start node adds first
    sigma: float
    sensitivity: float
    alpha: float
    delta: float
    spectral_gap: float
    step_size: float = 0.0
    clip: float = 0.0
    batch_size: int = 0
    model: str | None = None
    accelerated: bool = False  # (the gossip plans' field; a token is never accelerated)
    _starts: tuple[int, ...] = field(default=(), repr=False)

    @property
    def kind(self) -> str:
        return KIND[self.protocol]

    @property
    def steps(self) -> int:
        return self.hops

    @property
    def ring(self) -> bool:
        return self.protocol.startswith("ring-")

    @property
    def complete(self) -> bool:
        return self.protocol.startswith("complete-")

    @property
    def gamma(self) -> float:
        return rr_gamma(self.eps0, self.levels) if self.kind == "histogram" else 0.0

    def neighbours(self, v: int) -> list[int]:
        if self.ring:
            return sorted({(v - 1) % self.n, (v + 1) % self.n})
        return sorted(self.graph.neighbors(v))

    def start(self, token: int) -> int:
        """Where token j starts: spread evenly over the node ids (token 0 at node 0)."""
        return self._starts[token]

    def noise_var(self, s: int) -> float:
        """Variance of step s's Gaussian noise in units of sigma^2 (sum protocols)."""
        if self.protocol == "ring-sum":
            if self.distributed_noise:
                return 1.0 if s == 0 else 1.0 / (self.n - 1)
            return 1.0 if s % (self.n - 1) == 0 else 0.0
        return 1.0

    def noise_vars(self, length: int) -> np.ndarray:
        """:meth:`noise_var` of steps 0..length-1, as an array."""
        s = np.arange(length)
        if self.protocol == "ring-sum":
            if self.distributed_noise:
                return np.where(s == 0, 1.0, 1.0 / (self.n - 1))
            return np.where(s % (self.n - 1) == 0, 1.0, 0.0)
        return np.ones(length)

    def contributes(self, k: int) -> bool:
        """Whether a holder that has contributed k times to this token adds its data again."""
        return self.cap == 0 or k < self.cap

    def transition_row(self, v: int) -> tuple[np.ndarray, np.ndarray]:
        """(candidates, probabilities) of v's next hop, candidates in increasing id order."""
        if self.ring:
            return np.array([(v + 1) % self.n]), np.array([1.0])
        row = self.W[v]
        idx = np.flatnonzero(row > 0)
        return idx, row[idx]

    def public_params(self) -> dict:
        out = {
            "protocol": self.protocol,
            "n": self.n,
            "hops": self.hops,
            "steps": self.hops,
            "tokens": self.tokens,
            "starts": list(self._starts),
            "cap": self.cap,
            "cycles": self.cycles,
            "distributed_noise": self.distributed_noise,
            "dim": self.dim,
            "sigma": self.sigma,
            "sensitivity": self.sensitivity,
            "alpha": self.alpha,
            "delta": self.delta,
            "spectral_gap": self.spectral_gap,
        }
        if self.kind == "histogram":
            out.update(levels=self.levels, eps0=self.eps0, gamma=self.gamma, init=self.init_items)
        if self.kind == "sgd":
            out.update(
                step_size=self.step_size,
                clip=self.clip,
                batch_size=self.batch_size,
                model=self.model,
            )
        return out


def auto_hops(protocol: str, n: int) -> int:
    """Default token length: 10 expected contributions per node (T/n = 10, the papers'
    logistic-regression runs)."""
    return 10 * n


def make_plan(cfg: Config, graph: nx.Graph | None = None) -> WalkPlan:
    pr = cfg.protocol
    g = graph if graph is not None else mf.build_graph_from_config(cfg)
    n = g.number_of_nodes()
    if not nx.is_connected(g):
        raise ConfigError(
            f"{cfg.source}: the graph is not connected; a token could not reach every node"
        )
    if pr.name.startswith("ring-"):
        W = np.roll(np.eye(n), 1, axis=1)  # v -> v+1
        hops = pr.cycles * n
        lam = 0.0
    elif pr.name.startswith("complete-"):
        W = np.full((n, n), 1.0 / n)
        hops = auto_hops(pr.name, n) if pr.hops == "auto" else int(pr.hops)
        lam = 1.0
    else:
        W = graphs.gossip_matrix(g, pr.weights)
        hops = auto_hops(pr.name, n) if pr.hops == "auto" else int(pr.hops)
        lam = graphs.spectral_gap(W)
    kind = KIND[pr.name]
    dim, model = cfg.data.dim, None
    if kind == "histogram":
        dim = cfg.data.levels
    if kind == "sgd":
        from coordinator_free.families.learning import protocol as lp

        task = lp.make_task(cfg, n)
        dim, model = task.model.dim, task.model.kind
        lp.check_frame(cfg, task)
    init = 0
    if pr.name == "ring-histogram":
        init = int(round(rr_gamma(cfg.privacy.eps0, cfg.data.levels) * n))
    starts = tuple((j * n) // pr.tokens for j in range(pr.tokens))
    return WalkPlan(
        protocol=pr.name,
        n=n,
        graph=g,
        W=W,
        hops=hops,
        tokens=pr.tokens,
        cap=pr.cap,
        cycles=pr.cycles,
        distributed_noise=pr.distributed_noise,
        dim=dim,
        levels=cfg.data.levels,
        eps0=cfg.privacy.eps0,
        init_items=init,
        sigma=cfg.privacy.sigma,
        sensitivity=cfg.sensitivity,
        alpha=cfg.privacy.alpha,
        delta=cfg.privacy.delta,
        spectral_gap=lam,
        step_size=pr.step_size if kind == "sgd" else 0.0,
        clip=pr.clip if kind == "sgd" else 0.0,
        batch_size=pr.batch_size if kind == "sgd" else 0,
        model=model,
        _starts=starts,
    )


# ------------------------------------------------------------------------------ the step math


def categorical_value(cfg: Config, v: int, k: int, streams: seeds.Streams) -> int:
    """Node v's k-th category, drawn from its data stream: P(l) proportional to 1/(l+1) (a Zipf
    law, so the histogram has a shape worth estimating)."""
    L = cfg.data.levels
    p = 1.0 / np.arange(1, L + 1)
    rng = streams.stream(seeds.PURPOSE_DATA, v, k)
    return int(np.searchsorted(np.cumsum(p / p.sum()), rng.random(), side="right").clip(0, L - 1))


def randomized_response(x: int, gamma: float, levels: int, rng: np.random.Generator) -> int:
    """RR_gamma: the true value with probability 1 - gamma, else uniform over the levels."""
    if rng.random() < gamma:
        return int(rng.integers(levels))
    return int(x)


def init_items(plan: WalkPlan, token: int, streams: seeds.Streams) -> np.ndarray:
    """The start node's round(gamma n) uniform items (ring-histogram), as a count vector."""
    tau = np.zeros(plan.levels)
    if plan.init_items:
        rng = streams.stream(seeds.PURPOSE_NOISE, plan.start(token), step_key(token, _INIT_STEP))
        np.add.at(tau, rng.integers(plan.levels, size=plan.init_items), 1.0)
    return tau


def initial_token(plan: WalkPlan, token: int, streams: seeds.Streams, cfg: Config) -> np.ndarray:
    """The token before step 0 (made by the start node)."""
    if plan.kind == "histogram":
        return init_items(plan, token, streams)
    if plan.kind == "sgd":
        return _task(cfg, plan).model.init()
    return np.zeros(plan.dim)


def _task(cfg: Config, plan: WalkPlan):
    from coordinator_free.families.learning import protocol as lp

    return lp.make_task(cfg, plan.n)


def apply_step(
    plan: WalkPlan,
    cfg: Config,
    v: int,
    token: int,
    s: int,
    k: int,
    tau: np.ndarray,
    streams: seeds.Streams,
) -> tuple[np.ndarray, bool]:
    """Step s of ``token`` by holder v, which has contributed k times to it so far: returns the
    new token and whether v's data went in (False past the cap: noise only)."""
    data = plan.contributes(k)
    key = step_key(token, s)
    if plan.kind == "sum":
        out = tau + mf.private_value(cfg, v, streams, k) if data else tau.copy()
        var = plan.noise_var(s)
        if var > 0:
            noise = streams.stream(seeds.PURPOSE_NOISE, v, key).normal(
                0.0, plan.sigma * math.sqrt(var), size=plan.dim
            )
            out = out + noise
        return out, data
    if plan.kind == "histogram":
        out = tau.copy()
        if data:
            x = categorical_value(cfg, v, k, streams)
            rng = streams.stream(seeds.PURPOSE_NOISE, v, key)
            out[randomized_response(x, plan.gamma, plan.levels, rng)] += 1.0
        return out, data
    from coordinator_free.ml import models

    task = _task(cfg, plan)
    X, y = task.shard(v)
    if plan.batch_size and plan.batch_size < len(y):
        rng = streams.stream(seeds.PURPOSE_BATCH, v, key)
        idx = np.sort(rng.choice(len(y), size=plan.batch_size, replace=False))
        X, y = X[idx], y[idx]
    g = models.clipped_mean_grad(task.model, tau, X, y, plan.clip) if data else 0.0
    eta = streams.stream(seeds.PURPOSE_NOISE, v, key).normal(0.0, plan.sigma, size=plan.dim)
    return tau - plan.step_size * (g + eta + task.model.regulariser_grad(tau)), data


def next_hop(
    plan: WalkPlan,
    v: int,
    token: int,
    s: int,
    streams: seeds.Streams,
    exclude: frozenset[int] | set[int] = frozenset(),
    attempt: int = 0,
) -> int | None:
    """Where v sends the token after step s: drawn from v's secret hop stream by the protocol's
    rule (ring: the successor; complete: uniform over all nodes, v included; walk: v's row of
    W). A re-route (``attempt`` > 0) draws again by the same rule without the ``exclude``d
    nodes. None when no candidate is left."""
    cand, prob = plan.transition_row(v)
    keep = np.array([c not in exclude for c in cand.tolist()], dtype=bool)
    cand, prob = cand[keep], prob[keep]
    if cand.size == 0:
        return None
    if cand.size == 1:
        return int(cand[0])
    u = streams.stream(seeds.PURPOSE_HOP, v, step_key(token, s)).random(attempt + 1)[attempt]
    cdf = np.cumsum(prob / prob.sum())
    return int(cand[min(int(np.searchsorted(cdf, u, side="right")), cand.size - 1)])


def estimate(plan: WalkPlan, tau: np.ndarray) -> np.ndarray:
    """What a finished token says: the sum, the debiased histogram, or the model.

    Histogram: E tau_l = init/L + sum over the N randomized responses of ((1 - gamma) 1[x = l] +
    gamma/L), so h_l = (tau_l - init/L - gamma N/L) / (1 - gamma), N = sum(tau) - init (the
    note's corrected estimator, applied once at the end)."""
    if plan.kind != "histogram":
        return tau
    L, g = plan.levels, plan.gamma
    N = float(tau.sum()) - plan.init_items
    return (tau - plan.init_items / L - g * N / L) / (1.0 - g)


@dataclass
class TokenTrace:
    """One walk: who made each step, whether it added data, and the token's final value."""

    token: int
    holders: list[int]
    data: list[bool]
    final: np.ndarray
    truth: np.ndarray  # what the token estimates, computed from the raw data (simulation only)


@dataclass
class Hop:
    """One step of a walk: holder ``v`` made step ``s`` (its ``k``-th contribution if ``used``),
    giving ``tau``; ``nxt`` is the next holder (None after the last step)."""

    v: int
    s: int
    k: int
    tau: np.ndarray
    used: bool
    nxt: int | None


def hops(
    plan: WalkPlan,
    cfg: Config,
    token: int,
    v: int,
    s: int,
    tau: np.ndarray,
    counts: dict[int, int],
    streams: seeds.Streams,
):
    """The hop loop of a token from holder v at step s: yields every :class:`Hop` until the
    last step. ``counts`` (holder -> contributions so far to this token) is updated in place.
    A peer follows it while the token stays with itself (then hands it on); the simulator
    follows it to the end."""
    while True:
        k = counts.get(v, 0)
        tau, used = apply_step(plan, cfg, v, token, s, k, tau, streams)
        if used:
            counts[v] = k + 1
        nxt = next_hop(plan, v, token, s, streams) if s + 1 < plan.hops else None
        yield Hop(v, s, k, tau, used, nxt)
        if nxt is None:
            return
        v, s = nxt, s + 1


def walk_token(
    plan: WalkPlan,
    cfg: Config,
    token: int,
    streams: seeds.Streams,
) -> TokenTrace:
    """Run one token to the end, fault-free, in one process (the reference simulator)."""
    tau = initial_token(plan, token, streams, cfg)
    holders: list[int] = []
    data: list[bool] = []
    truth = np.zeros(plan.dim)
    for h in hops(plan, cfg, token, plan.start(token), 0, tau, {}, streams):
        holders.append(h.v)
        data.append(h.used)
        tau = h.tau
        if h.used:
            if plan.kind == "sum":
                truth = truth + mf.private_value(cfg, h.v, streams, h.k)
            elif plan.kind == "histogram":
                truth[categorical_value(cfg, h.v, h.k, streams)] += 1.0
    return TokenTrace(token=token, holders=holders, data=data, final=tau, truth=truth)
