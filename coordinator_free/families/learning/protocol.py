"""Private learning over gossip: the pure math of Muffliato-GD/SGD, D-SGD and central DP.

Every node v holds a shard of a dataset and a model ``theta_v`` (all start at 0). Round r:

    g_v      = mean over v's batch of per-example gradients, each clipped to L2 norm C
    thetahat = theta_v - nu (g_v + eta_v^r + l2 theta_v),      eta_v^r ~ N(0, sigma^2 I)
    K gossip steps on thetahat (Muffliato, Algorithm 1; Chebyshev re-scaled if accelerated,
    x^{r,1} = W x^{r,0} at the first step of every round)
    theta_v^{r+1} = x_v^{r,K}

* ``muffliato-gd``: the batch is v's whole shard (Algorithm 3 with GD), K from the config.
* ``muffliato-sgd``: a minibatch of ``batch_size`` points drawn from v's own secret stream.
* ``dsgd``: D-SGD with local DP, the baseline: one plain gossip step per round (K = 1).
* ``decor``: D-SGD whose noise is ``eta_v^r`` plus pairwise-cancelling correlated noise from
  secrets shared by neighbours (:mod:`.decor`), one gossip step per round.
* ``central-dp``: the trusted curator: one model, ``theta -= nu ((sum_v g_v + N(0, sigma^2 I))/n
  + l2 theta)``. The curator's noise on the *sum* has the same std as one node's noise in the
  decentralized protocols, so at equal sigma every user has the same per-round loss (one Gaussian
  mechanism of sensitivity 2C) as under local DP, with n times less noise on the mean.

Clipping happens on the clean per-example gradients, before any noise; the clipped mean has norm
at most C, so replacing one node's whole shard moves it by at most 2C (the sensitivity the
accountant uses unless ``privacy.sensitivity`` says otherwise).

Exchange steps are numbered globally, ``t = r K + k``: the peer's step engine, the view logs and
the auditor all use that index, so round r's messages are steps ``rK .. rK + K - 1``.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import networkx as nx
import numpy as np

from coordinator_free import graphs, rundir, seeds
from coordinator_free.errors import ConfigError
from coordinator_free.families.averaging import protocol as mf
from coordinator_free.ml import datasets, models

if TYPE_CHECKING:
    from coordinator_free.config import Config, DataSection, ModelSection


@dataclass(frozen=True)
class LearningTask:
    """The dataset, every node's shard (indices into the training set) and the model."""

    dataset: datasets.Dataset
    shards: tuple[np.ndarray, ...]
    model: models.Model

    def shard(self, v: int) -> tuple[np.ndarray, np.ndarray]:
        idx = self.shards[v]
        return self.dataset.X_train[idx], self.dataset.y_train[idx]


@dataclass(frozen=True)
class LearningPlan(mf.GraphRows):
    """Everything public about a learning run, derived deterministically from the config."""

    protocol: str
    n: int
    graph: nx.Graph
    W: np.ndarray
    rounds: int
    gossip_steps: int  # K (1 for dsgd, 0 for central-dp: nothing is exchanged)
    accelerated: bool
    gamma: float
    spectral_gap: float
    step_size: float
    batch_size: int
    clip: float
    dim: int  # number of model parameters
    model: str
    sigma: float
    sensitivity: float
    alpha: float
    delta: float
    clipping: str = "example"
    sigma_cor: float = 0.0  # decor: std of the correlated noise (per pair, per round)
    collusion: int = 0  # decor: the collusion level the guarantee is stated for
    # Time-varying graphs (graph.resample): round r's graph and gossip matrix. ``graph`` is then
    # the union of the rounds' graphs (every pair that ever talks) and ``W`` round 0's matrix.
    round_graphs: tuple[nx.Graph, ...] = ()
    round_W: tuple[np.ndarray, ...] = ()
    # Secret graphs (graph.hidden): the edge probability; the rounds' graphs are then unknown to
    # the public plan (``graph`` is the complete graph of possible pairs) and filled in by
    # ``secret.bind_*``: for one node (``bound_node``: its own neighbours only) or for all.
    secret_p: float | None = None
    bound_node: int | None = None

    @property
    def secret(self) -> bool:
        return self.secret_p is not None

    @property
    def time_varying(self) -> bool:
        return bool(self.round_graphs) or self.secret

    def _own(self, v: int) -> None:
        if self.secret and not self.round_graphs:
            raise ValueError(
                "the rounds' graphs are secret: bind the plan to a node's, the simulator's or "
                "the logs' knowledge first (families.learning.secret)"
            )
        if self.bound_node is not None and v != self.bound_node:
            raise ValueError(
                f"node {self.bound_node} knows only its own neighbours, not node {v}'s"
            )

    def row(self, v: int) -> dict[int, float]:
        """Node v's gossip weights (round 0's with time-varying graphs)."""
        return self.row_at(v, 0) if self.time_varying else super().row(v)

    def partners_at(self, v: int, t: int) -> list[int]:
        if not self.time_varying:
            return self.neighbours(v)
        self._own(v)
        return sorted(self.round_graphs[t // self.gossip_steps].neighbors(v))

    def row_at(self, v: int, t: int) -> dict[int, float]:
        if not self.time_varying:
            return self.row(v)
        self._own(v)
        r = t // self.gossip_steps
        g, w = self.round_graphs[r], self.round_W[r]
        return {x: float(w[v, x]) for x in sorted([*g.neighbors(v), v])}

    def round_matrix(self, r: int) -> np.ndarray:
        if self.time_varying:
            self._own(-1 if self.bound_node is None else self.bound_node)
            if self.bound_node is not None:
                raise ValueError(f"node {self.bound_node} knows only its own row of round {r}")
            return self.round_W[r]
        return self.W

    @property
    def steps(self) -> int:
        """Exchange steps of the whole run (every round has ``gossip_steps`` of them)."""
        return self.rounds * self.gossip_steps

    @property
    def decentralized(self) -> bool:
        return self.protocol != "central-dp"

    def round_of(self, t: int) -> tuple[int, int]:
        return divmod(t, self.gossip_steps)

    def gamma_at(self, t: int) -> float:
        k = t % self.gossip_steps
        return 1.0 if (k == 0 or not self.accelerated) else self.gamma

    def public_params(self) -> dict:
        return {
            "protocol": self.protocol,
            "n": self.n,
            "steps": self.steps,
            "rounds": self.rounds,
            "gossip_steps": self.gossip_steps,
            "accelerated": self.accelerated,
            "gamma": self.gamma,
            "spectral_gap": self.spectral_gap,
            "step_size": self.step_size,
            "batch_size": self.batch_size,
            "clip": self.clip,
            "dim": self.dim,
            "model": self.model,
            "sigma": self.sigma,
            "sensitivity": self.sensitivity,
            "alpha": self.alpha,
            "delta": self.delta,
            "clipping": self.clipping,
            "sigma_cor": self.sigma_cor,
            "collusion": self.collusion,
            "resample": self.time_varying,
            "graphs": "secret"
            if self.secret
            else graphs_digest(self.round_graphs)
            if self.time_varying
            else None,
        }


def graphs_digest(gs) -> str:
    """A short fingerprint of the rounds' edge lists (logged, checked by the auditor)."""
    h = hashlib.sha256()
    for g in gs:
        h.update(repr(sorted(g.edges())).encode() + b";")
    return h.hexdigest()[:32]


def round_graph_seed(graph_seed: int, r: int) -> int:
    """The public seed of round r's graph."""
    ss = np.random.SeedSequence([graph_seed, 0x726F756E64, r])
    return int(ss.generate_state(1, np.uint64)[0] >> np.uint64(1))


def round_graphs(cfg: Config, rounds: int) -> list[nx.Graph]:
    """A fresh random graph per round from the public per-round seed (graph.resample)."""
    return [
        mf.build_graph_from_config(cfg, seed=round_graph_seed(cfg.graph.seed, r))
        for r in range(rounds)
    ]


def models_path(out_dir: str | Path, v: int) -> Path:
    """Where node v writes its model after every round (read by the launcher and the tests)."""
    return rundir.models_path(out_dir, v)


def auto_gossip_steps(lam: float, n: int, accelerated: bool) -> int:
    """K of Theorem 5 with the heterogeneity term unknown: ``ceil(rate^{-1} ln n)``, rate =
    sqrt(lambda_W) with Chebyshev acceleration, lambda_W without (at least 1)."""
    rate = math.sqrt(lam) if accelerated else lam
    return max(1, math.ceil(math.log(max(n, 2)) / rate))


@functools.lru_cache(maxsize=8)
def _task(d: DataSection, m: ModelSection, seed: int, n: int) -> LearningTask:
    ds, shards = datasets.load_sharded(d, seed, n)
    kind = m.kind
    if kind == "auto":
        kind = (
            "least-squares"
            if ds.n_classes == 0
            else "logistic"
            if ds.n_classes == 2
            else "multinomial"
        )
    model = models.make_model(kind, ds.n_features, ds.n_classes, l2=m.l2, start=m.init or 0.0)
    return LearningTask(dataset=ds, shards=tuple(shards), model=model)


def make_task(cfg: Config, n: int | None = None) -> LearningTask:
    """Load the dataset (derived from the run seed or read from data.path), split it into one
    shard per node and build the model. Deterministic: every peer derives the same task."""
    n = n if n is not None else cfg.graph_n()
    try:
        return _task(cfg.data, cfg.model, cfg.run.seed, n)
    except ValueError as exc:  # DataError (a bad file names its line), bad split or model
        raise ConfigError(f"{cfg.source}: [data]/[model]: {exc}") from None


def check_frame(cfg: Config, task: LearningTask) -> None:
    """A model travels in one frame: refuse a model larger than network.max_frame_bytes."""
    need = 8 * task.model.dim + 4096
    if need > cfg.network.max_frame_bytes:
        raise ConfigError(
            f"{cfg.source}: the {task.model.kind} model has {task.model.dim} parameters and needs "
            f"frames of about {need} bytes but network.max_frame_bytes is "
            f"{cfg.network.max_frame_bytes}; raise it"
        )


def make_plan(cfg: Config, graph: nx.Graph | None = None) -> LearningPlan:
    pr = cfg.protocol
    per_round: list[nx.Graph] = []
    per_round_w: list[np.ndarray] = []
    secret_p = None
    if cfg.graph.hidden:
        # The rounds' graphs are secret: the public plan knows only who may pair (everyone)
        # and, for the report, the gap of one public sample of the same law.
        g = nx.complete_graph(cfg.graph.nodes)
        W = graphs.gossip_matrix(g, "lazy")
        sample = mf.build_graph_from_config(cfg, seed=round_graph_seed(cfg.graph.seed, 0))
        lam = graphs.spectral_gap(graphs.gossip_matrix(sample, "lazy"))
        secret_p = float(cfg.graph.p)
    elif cfg.graph.resample:
        if graph is not None:
            raise ValueError("graph.resample draws the rounds' graphs itself: pass no graph")
        # A fresh graph every round; the gap used for K and gamma is the smallest one (the
        # lower bound lambda of the paper's time-varying analysis, App. F).
        per_round = round_graphs(cfg, pr.rounds)
        per_round_w = [graphs.gossip_matrix(x, pr.weights) for x in per_round]
        g = nx.compose_all(per_round)
        W = per_round_w[0]
        lam = min(graphs.spectral_gap(x) for x in per_round_w)
    else:
        g = graph if graph is not None else mf.build_graph_from_config(cfg)
        W = graphs.gossip_matrix(g, pr.weights)
        lam = graphs.spectral_gap(W)
    n = g.number_of_nodes()
    if pr.name in ("dsgd", "decor"):
        accelerated, K = False, 1
    elif pr.name == "central-dp":
        accelerated, K = False, 0
    else:
        accelerated = pr.accelerated
        K = (
            auto_gossip_steps(lam, n, accelerated)
            if pr.gossip_steps == "auto"
            else int(pr.gossip_steps)
        )
    gamma = graphs.chebyshev_gamma(lam) if accelerated else 1.0
    task = make_task(cfg, n)
    if pr.name != "central-dp":
        check_frame(cfg, task)
    return LearningPlan(
        protocol=pr.name,
        n=n,
        graph=g,
        W=W,
        rounds=pr.rounds,
        gossip_steps=K,
        accelerated=accelerated,
        gamma=gamma,
        spectral_gap=lam,
        step_size=pr.step_size,
        batch_size=pr.batch_size,
        clip=pr.clip,
        dim=task.model.dim,
        model=task.model.kind,
        sigma=cfg.privacy.sigma,
        sensitivity=cfg.sensitivity,
        alpha=cfg.privacy.alpha,
        delta=cfg.privacy.delta,
        clipping=pr.clipping,
        sigma_cor=cfg.privacy.sigma_cor,
        collusion=cfg.privacy.collusion,
        round_graphs=tuple(per_round),
        round_W=tuple(per_round_w),
        secret_p=secret_p,
    )


def batch(plan: LearningPlan, task: LearningTask, v: int, round_: int, streams: seeds.Streams):
    """Node v's (X, y) for round r: its whole shard, or a minibatch drawn without replacement
    from v's own secret batch stream (sorted, so the gradient sum order is fixed)."""
    X, y = task.shard(v)
    if plan.batch_size and plan.batch_size < len(y):
        rng = streams.stream(seeds.PURPOSE_BATCH, v, round_)
        idx = np.sort(rng.choice(len(y), size=plan.batch_size, replace=False))
        return X[idx], y[idx]
    return X, y


def gradient_noise(plan: LearningPlan, v: int, round_: int, streams: seeds.Streams) -> np.ndarray:
    """Node v's fresh Gaussian noise of round r, from v's secret noise stream."""
    return streams.stream(seeds.PURPOSE_NOISE, v, round_).normal(0.0, plan.sigma, size=plan.dim)


def clipped_grad(plan: LearningPlan, task: LearningTask, theta, X, y) -> np.ndarray:
    """The batch gradient with the plan's clipping: per example then averaged, or the batch
    mean clipped as one vector. Norm at most C either way."""
    if plan.clipping == "batch":
        return models.clipped_batch_grad(task.model, theta, X, y, plan.clip)
    return models.clipped_mean_grad(task.model, theta, X, y, plan.clip)


def local_step(
    plan: LearningPlan,
    task: LearningTask,
    v: int,
    round_: int,
    theta: np.ndarray,
    streams: seeds.Streams,
    correlated: np.ndarray | None = None,
) -> np.ndarray:
    """thetahat_v = theta_v - nu (clipped gradient + noise [+ correlated noise] + l2 theta_v):
    the only value a node sends that depends on its data, always noised."""
    X, y = batch(plan, task, v, round_, streams)
    g = clipped_grad(plan, task, theta, X, y)
    eta = gradient_noise(plan, v, round_, streams)
    if correlated is not None:
        eta = eta + correlated
    return theta - plan.step_size * (g + eta + task.model.regulariser_grad(theta))


def central_step(
    plan: LearningPlan,
    task: LearningTask,
    round_: int,
    theta: np.ndarray,
    streams: seeds.Streams,
) -> np.ndarray:
    """One step of the trusted curator (central DP): noise of std sigma on the sum of the n
    clipped gradients."""
    total = np.zeros(plan.dim)
    for v in range(plan.n):
        X, y = batch(plan, task, v, round_, streams)
        total = total + clipped_grad(plan, task, theta, X, y)
    noise = streams.stream(seeds.PURPOSE_NOISE, 0, round_).normal(0.0, plan.sigma, size=plan.dim)
    return theta - plan.step_size * ((total + noise) / plan.n + task.model.regulariser_grad(theta))


def round_metrics(task: LearningTask, round_: int, thetas: np.ndarray) -> dict:
    """Metrics of the node-average model and the spread across nodes after ``round_`` rounds.
    ``thetas``: (n, dim), one model per node (a single row for central DP)."""
    ds, model = task.dataset, task.model
    avg = thetas.mean(axis=0)
    out = {
        "round": round_,
        "avg_test_loss": float(model.loss(avg, ds.X_test, ds.y_test)),
        "avg_test_accuracy": model.accuracy(avg, ds.X_test, ds.y_test),
        "avg_train_loss": float(model.loss(avg, ds.X_train, ds.y_train)),
        "consensus_distance": float(np.mean(np.linalg.norm(thetas - avg, axis=1))),
    }
    if ds.n_classes:
        accs = [model.accuracy(t, ds.X_test, ds.y_test) for t in thetas]
        out.update(
            node_test_accuracy_min=float(min(accs)),
            node_test_accuracy_mean=float(np.mean(accs)),
            node_test_accuracy_max=float(max(accs)),
        )
    else:
        out.update(
            node_test_accuracy_min=None, node_test_accuracy_mean=None, node_test_accuracy_max=None
        )
    return out
