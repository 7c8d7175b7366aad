"""Private ADMM for consensus ERM: the plan and the pure step math of the decentralized protocol.

Problem (8.5)/(8.6): minimise ``F(x) = (1/n) sum_i f_i(x) + r(x)``, user i's loss ``f_i`` the mean
loss of its shard (one peer = one user), ``r`` the regulariser of ``model.kind`` (lasso: l1,
ridge: l2, logistic: ``model.l1`` or ``model.l2`` or none). Every user keeps a dual block ``u_i``
(0 at the start); the token carries ``z_hat = (1/n) sum_i u_i`` and ``z = prox_{gamma r}(z_hat)``
is derived from it (``ml.admm.z_of``).

``admm`` (Algorithm 8.4, a random walk on the complete graph): step s of token j is made by its
holder v, which

    z      = z_of(z_hat)
    x      = prox_{gamma f_v,L}(2 z - u_v)    (f_v,L: the records' L-Lipschitz surrogates, ml.prox)
    u_v'   = u_v + 2 lam (x - z + eta/2),      eta ~ N(0, sigma^2 I_p)
    z_hat <- z_hat + (u_v' - u_v)/n

then hands the token to a holder drawn uniformly over all n users (itself included). Its noise,
its minibatch (``protocol.batch_size``) and its hop come from its secret streams keyed by
``(token, step)``, and ``u_v`` is kept per token (independent tokens are independent ADMM runs),
so a fault-free run of the peers equals the simulator bit for bit, whatever the interleaving.
Only ``z_hat`` is released; ``x`` never leaves the user.

On another connected graph the walk follows the Metropolis matrix (as walk-sgd): the iteration is
the same, the accounting is local DP only (Theorem 8.12 is proved for the complete graph).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import networkx as nx
import numpy as np

from coordinator_free import graphs, seeds
from coordinator_free.errors import ConfigError
from coordinator_free.families.averaging import protocol as mf
from coordinator_free.families.walk import protocol as wk
from coordinator_free.ml import datasets

if TYPE_CHECKING:
    from coordinator_free.config import Config, DataSection, ModelSection

#: The model kinds of the ADMM protocols: (loss, regulariser), the regulariser's strength from
#: ``model.l1`` / ``model.l2``.
ADMM_MODELS = ("lasso", "ridge", "logistic")
DEFAULT_GAMMA = 1.0
DEFAULT_LAM = 0.5


def gamma_of(cfg: Config) -> float:
    g = cfg.protocol.gamma
    return DEFAULT_GAMMA if g is None else float(g)


def lam_of(cfg: Config) -> float:
    lam = cfg.protocol.lam
    return DEFAULT_LAM if lam is None else float(lam)


def objective_spec(m: ModelSection) -> tuple[str, str, float]:
    """(loss, regulariser, strength) of ``model.kind`` (validated beforehand)."""
    l1 = float(m.l1 or 0.0)
    if m.kind == "lasso":
        return "lstsq", "l1", l1
    if m.kind == "ridge":
        return "lstsq", "l2", float(m.l2)
    if l1 > 0:
        return "logistic", "l1", l1
    if m.l2 > 0:
        return "logistic", "l2", float(m.l2)
    return "logistic", "none", 0.0


def objective(cfg: Config):
    """The :class:`coordinator_free.ml.prox.Objective` of the config."""
    from coordinator_free.ml.prox import Objective

    loss, reg, strength = objective_spec(cfg.model)
    return Objective(loss=loss, reg=reg, reg_strength=strength)


@dataclass(frozen=True)
class AdmmTask:
    """The dataset and every user's shard (indices into the training set)."""

    dataset: datasets.Dataset
    shards: tuple[np.ndarray, ...]

    def shard(self, v: int) -> tuple[np.ndarray, np.ndarray]:
        idx = self.shards[v]
        return self.dataset.X_train[idx], self.dataset.y_train[idx]

    @property
    def dim(self) -> int:
        return int(self.dataset.X_train.shape[1])


@functools.lru_cache(maxsize=8)
def _task(d: DataSection, seed: int, n: int) -> AdmmTask:
    ds, shards = datasets.load_sharded(d, seed, n)
    return AdmmTask(dataset=ds, shards=tuple(shards))


def make_task(cfg: Config, n: int) -> AdmmTask:
    """The dataset and the users' shards, derived from the public run seed (every peer derives
    the same, and keeps its own shard)."""
    try:
        task = _task(cfg.data, cfg.run.seed, n)
    except ValueError as exc:
        raise ConfigError(f"{cfg.source}: [data]: {exc}") from None
    empty = [v for v, s in enumerate(task.shards) if len(s) == 0]
    if empty:
        raise ConfigError(
            f"{cfg.source}: [data]: user(s) {empty[:5]} get no training example (data.samples "
            f"= {cfg.data.samples} for {n} users); every user needs a shard"
        )
    return task


@dataclass(frozen=True)
class AdmmPlan(wk.WalkPlan):
    """The public plan of the decentralized protocol: a token walk (the walk family's plan, so
    the hand-off, the replay of the logs and the audit's walk reconstruction apply as they
    are) with the ADMM parameters."""

    gamma: float = DEFAULT_GAMMA  # (the walk plan's randomized-response gamma is not used)
    lam: float = DEFAULT_LAM
    loss: str = "lstsq"
    reg: str = "l1"
    reg_strength: float = 0.0
    complete_graph: bool = True
    unit: str = "user"
    min_shard: int = 1  # the fewest records a step's loss averages (record level's m_min)

    @property
    def kind(self) -> str:
        return "admm"

    @property
    def lipschitz(self) -> float:
        """The ``L`` the accountant evaluates every formula at: ``protocol.clip`` for the unit
        and the certified solves (``privacy.admm.effective_lipschitz``; 4 gamma times it is the
        sensitivity of one contribution)."""
        from coordinator_free.privacy.admm import effective_lipschitz

        return effective_lipschitz(self.clip, unit=self.unit, m_min=self.min_shard, steps=self.hops)

    def public_params(self) -> dict:
        out = super().public_params()
        out.update(
            gamma=self.gamma,
            lam=self.lam,
            clip=self.clip,
            batch_size=self.batch_size,
            loss=self.loss,
            reg=self.reg,
            reg_strength=self.reg_strength,
            complete_graph=self.complete_graph,
            unit=self.unit,
            min_shard=self.min_shard,
        )
        return out


def auto_hops(n: int) -> int:
    """Default walk length: 10 expected contributions per user (K/n = 10)."""
    return 10 * n


def make_plan(cfg: Config, graph: nx.Graph | None = None) -> AdmmPlan:
    pr = cfg.protocol
    g = graph if graph is not None else mf.build_graph_from_config(cfg)
    n = g.number_of_nodes()
    if not nx.is_connected(g):
        raise ConfigError(
            f"{cfg.source}: the graph is not connected; a token could not reach every node"
        )
    complete = g.number_of_edges() == n * (n - 1) // 2
    if complete:
        W = np.full((n, n), 1.0 / n)  # uniform over all users, the holder included
        lam_gap = 1.0
    else:
        W = graphs.gossip_matrix(g, pr.weights)
        lam_gap = graphs.spectral_gap(W)
    hops = auto_hops(n) if pr.hops == "auto" else int(pr.hops)
    task = make_task(cfg, n)
    loss, reg, strength = objective_spec(cfg.model)
    starts = tuple((j * n) // pr.tokens for j in range(pr.tokens))
    from coordinator_free.privacy.admm import effective_lipschitz

    m_min = min(len(sh) for sh in task.shards)
    if pr.batch_size:
        m_min = min(m_min, int(pr.batch_size))
    return AdmmPlan(
        protocol=pr.name,
        n=n,
        graph=g,
        W=W,
        hops=hops,
        tokens=pr.tokens,
        cap=0,
        cycles=1,
        distributed_noise=False,
        dim=task.dim,
        levels=cfg.data.levels,
        eps0=cfg.privacy.eps0,
        init_items=0,
        sigma=cfg.privacy.sigma,
        sensitivity=4.0
        * gamma_of(cfg)
        * effective_lipschitz(
            pr.clip, unit=cfg.privacy.unit or "user", m_min=int(m_min), steps=hops
        ),
        alpha=cfg.privacy.alpha,
        delta=cfg.privacy.delta,
        spectral_gap=lam_gap,
        step_size=0.0,
        clip=pr.clip,
        batch_size=pr.batch_size,
        model=cfg.model.kind,
        _starts=starts,
        gamma=gamma_of(cfg),
        lam=lam_of(cfg),
        loss=loss,
        reg=reg,
        reg_strength=strength,
        complete_graph=complete,
        unit=cfg.privacy.unit or "user",
        min_shard=int(m_min),
    )


# ------------------------------------------------------------------------------ the step math


@dataclass
class Block:
    """A user's state for one token: its contributions so far and its dual block ``u_i``."""

    k: int
    u: np.ndarray


def _objective_of(plan: AdmmPlan):
    from coordinator_free.ml.prox import Objective

    return Objective(loss=plan.loss, reg=plan.reg, reg_strength=plan.reg_strength)


def initial_token(plan: AdmmPlan, token: int, streams: seeds.Streams, cfg: Config) -> np.ndarray:
    """z_hat before step 0: the mean of the users' initial blocks u_i = 0."""
    return np.zeros(plan.dim)


def z_of(plan: AdmmPlan, z_hat: np.ndarray) -> np.ndarray:
    """The released model ``z = prox_{gamma r}(z_hat)`` (the scaling of ``ml.admm.z_of``)."""
    from coordinator_free.ml import admm

    return admm.z_of(_objective_of(plan), z_hat, gamma=plan.gamma, n=plan.n)


def local_data(
    plan: AdmmPlan, cfg: Config, v: int, token: int, s: int, streams: seeds.Streams
) -> tuple[np.ndarray, np.ndarray]:
    """User v's data for step s: its shard, or a minibatch of it drawn from its secret batch
    stream keyed by (token, step)."""
    X, y = make_task(cfg, plan.n).shard(v)
    if plan.batch_size and plan.batch_size < len(y):
        rng = streams.stream(seeds.PURPOSE_BATCH, v, wk.step_key(token, s))
        idx = np.sort(rng.choice(len(y), size=plan.batch_size, replace=False))
        X, y = X[idx], y[idx]
    return X, y


def apply_step(
    plan: AdmmPlan,
    cfg: Config,
    v: int,
    token: int,
    s: int,
    z_hat: np.ndarray,
    u: np.ndarray,
    streams: seeds.Streams,
) -> tuple[np.ndarray, np.ndarray]:
    """Step s of ``token`` by user v holding ``u``: returns (z_hat', u')."""
    from coordinator_free.ml import admm

    obj = _objective_of(plan)
    X, y = local_data(plan, cfg, v, token, s, streams)
    z = admm.z_of(obj, z_hat, gamma=plan.gamma, n=plan.n)
    eta = streams.stream(seeds.PURPOSE_NOISE, v, wk.step_key(token, s)).normal(
        0.0, plan.sigma, size=plan.dim
    )
    u_new, _x = admm.local_step(
        obj, X, y, z, u, gamma=plan.gamma, lam=plan.lam, clip=plan.clip, eta=eta
    )
    return z_hat + (u_new - u) / plan.n, u_new


def hops(
    plan: AdmmPlan,
    cfg: Config,
    token: int,
    v: int,
    s: int,
    tau: np.ndarray,
    counts: dict,
    streams: seeds.Streams,
):
    """The hop loop of a token from holder v at step s (the token engine's ``TokenRules.hops``):
    yields every :class:`~coordinator_free.families.walk.protocol.Hop` until the last step.
    ``counts`` (user -> :class:`Block`) holds this token's per-user state and is updated in
    place: on a peer only its own entry, in the simulator every user's."""
    while True:
        b = counts.get(v)
        if b is None:
            b = counts[v] = Block(0, np.zeros(plan.dim))
        k = b.k
        tau, b.u = apply_step(plan, cfg, v, token, s, tau, b.u, streams)
        b.k = k + 1
        nxt = wk.next_hop(plan, v, token, s, streams) if s + 1 < plan.hops else None
        yield wk.Hop(v, s, k, tau, True, nxt)
        if nxt is None:
            return
        v, s = nxt, s + 1


@dataclass
class AdmmTrace(wk.TokenTrace):
    """One walk of the simulator, with z_hat after every step."""

    path: np.ndarray | None = None  # (hops, dim)


def walk_token(plan: AdmmPlan, cfg: Config, token: int, streams: seeds.Streams) -> AdmmTrace:
    """One token to the end, fault-free, in one process (the reference simulator)."""
    tau = initial_token(plan, token, streams, cfg)
    holders, path = [], []
    for h in hops(plan, cfg, token, plan.start(token), 0, tau, {}, streams):
        holders.append(h.v)
        path.append(h.tau)
        tau = h.tau
    return AdmmTrace(
        token=token,
        holders=holders,
        data=[True] * len(holders),
        final=tau,
        truth=np.zeros(0),
        path=np.stack(path) if path else np.zeros((0, plan.dim)),
    )


# ------------------------------------------------------------------------------ objective


def test_objective(cfg: Config, n: int, z: np.ndarray) -> float:
    """The objective (mean loss + regulariser) of the released model ``z`` on the test set."""
    ds = make_task(cfg, n).dataset
    return float(objective(cfg).value(np.asarray(z, dtype=np.float64), ds.X_test, ds.y_test))


def objective_value(cfg: Config, plan, z: np.ndarray, n: int | None = None) -> float:
    """``F(z) = (1/n) sum_i f_i(z) + r(z)`` over the users' shards."""
    n = plan.n if n is None else n
    obj = objective(cfg)
    task = make_task(cfg, n)
    return float(np.mean([obj.value(z, *task.shard(v)) for v in range(n)]))


@functools.lru_cache(maxsize=16)
def _optimum(cfg: Config, n: int) -> tuple[float, tuple[float, ...]]:
    obj = objective(cfg)
    task = make_task(cfg, n)
    shards = [task.shard(v) for v in range(n)]
    p = task.dim
    if obj.loss == "lstsq":
        H = sum(X.T @ X / len(y) for X, y in shards) / n
        smooth = float(np.linalg.eigvalsh(H)[-1])
    else:
        smooth = 0.25 * float(np.mean([np.linalg.norm(X, 2) ** 2 / len(y) for X, y in shards]))
    t = 1.0 / max(smooth, 1e-12)

    def grad(w):
        return sum(obj.loss_grad(w, X, y) for X, y in shards) / n

    w = np.zeros(p)
    yk, tk = w.copy(), 1.0
    for _ in range(20000):
        w_new = obj.prox_reg(yk - t * grad(yk), t)
        t_new = (1.0 + math.sqrt(1.0 + 4.0 * tk * tk)) / 2.0
        yk = w_new + ((tk - 1.0) / t_new) * (w_new - w)
        step = float(np.linalg.norm(w_new - w))
        w, tk = w_new, t_new
        if step <= 1e-13 * max(1.0, float(np.linalg.norm(w))):
            break
    best = float(np.mean([obj.value(w, X, y) for X, y in shards]))
    return best, tuple(float(x) for x in w)


def optimum(cfg: Config, n: int) -> tuple[float, np.ndarray]:
    """``(F*, x*)``: the minimum of ``F`` over the users' shards (accelerated proximal gradient
    to a relative step of 1e-13, public data only: the yardstick's reference)."""
    val, w = _optimum(cfg, n)
    return val, np.array(w)
