"""In-process reference simulator: the same update math and the same seeds as the peers.

A fault-free networked run of a config and ``simulate`` of the same config produce the same final
values bit for bit: both call :func:`protocols.muffliato.gossip_update` with the same terms in the
same order, on values drawn from the same seed streams.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coordinator_free import seeds
from coordinator_free.config import Config
from coordinator_free.families import make_plan
from coordinator_free.families.averaging import protocol as mf
from coordinator_free.families.randomized import protocol as rg


@dataclass
class SimResult:
    plan: mf.MuffliatoPlan | rg.RandomizedPlan
    inputs: np.ndarray  # (n, D) private values
    finals: np.ndarray  # (n, D) x^T
    history_mse: list[float]  # mean squared error to the true mean after each step (0..T)

    @property
    def true_mean(self) -> np.ndarray:
        return self.inputs.mean(axis=0)


def _gossip_step(rows, current, previous, gamma_t: float) -> list[np.ndarray]:
    """One synchronous step of every node, each with its terms in increasing node-id order
    (exactly what each peer computes)."""
    out = []
    for v, row in enumerate(rows):
        received = {w: current[w] for w in row if w != v}
        terms = mf.step_terms(row, v, current[v], received)
        out.append(mf.gossip_update(terms, gamma_t, previous[v]))
    return out


def simulate(
    cfg: Config,
    plan: mf.MuffliatoPlan | rg.RandomizedPlan | None = None,
    streams: seeds.Streams | None = None,
    *,
    used=None,
) -> SimResult:
    """Simulate a fault-free run. ``streams``: where values and noise come from; by default the
    public run seed (pure simulation), or a run's node streams to reproduce that run exactly
    (:func:`seeds.streams_of_run`).

    ``used(t, v) -> bool`` (randomized gossip only): whether node v averaged with its partner's
    value at exchange t; replaying a realised schedule from the logs with it reproduces a faulty
    run's values (default: every exchange completed)."""
    plan = plan if plan is not None else make_plan(cfg)
    streams = streams if streams is not None else seeds.PublicSeedStreams(cfg.run.seed)
    n = plan.n
    inputs = np.stack([mf.private_value(cfg, v, streams) for v in range(n)])
    current = [mf.initial_value(inputs[v], mf.local_noise(cfg, v, streams)) for v in range(n)]
    true_mean = inputs.mean(axis=0)
    sq = [float(np.sum((x - true_mean) ** 2)) for x in current]
    history = [float(np.mean(sq))]
    if isinstance(plan, rg.RandomizedPlan):
        # One exchange at a time, in clock order: only the pair's values change.
        for e in plan.edges:
            xa, xb = current[e.a], current[e.b]
            if used is None or used(e.t, e.a):
                current[e.a] = rg.exchange_update(plan, e.a, e.t, xa, {e.b: xb})
            if used is None or used(e.t, e.b):
                current[e.b] = rg.exchange_update(plan, e.b, e.t, xb, {e.a: xa})
            for v in (e.a, e.b):
                sq[v] = float(np.sum((current[v] - true_mean) ** 2))
            history.append(float(np.mean(sq)))
        return SimResult(plan=plan, inputs=inputs, finals=np.stack(current), history_mse=history)
    if used is not None:
        raise ValueError("used= replays a randomized-gossip schedule; this plan is synchronous")
    previous: list[np.ndarray | None] = [None] * n
    rows = [plan.row(v) for v in range(n)]
    for t in range(plan.steps):
        previous, current = current, _gossip_step(rows, current, previous, plan.gamma_at(t))
        history.append(float(np.mean([np.sum((x - true_mean) ** 2) for x in current])))
    return SimResult(plan=plan, inputs=inputs, finals=np.stack(current), history_mse=history)


@dataclass
class LearningSimResult:
    plan: object  # protocols.learning.LearningPlan
    models: np.ndarray  # (rounds + 1, n, dim): every node's model after each round (central: n=1)
    metrics: list[dict]  # protocols.learning.round_metrics per round (0..R)
    # decor with keep_correlated: every node's correlated-noise term per round,
    # (rounds, n, dim); None otherwise.
    correlated: np.ndarray | None = None

    @property
    def finals(self) -> np.ndarray:
        return self.models[-1]


def simulate_learning(
    cfg: Config, streams: seeds.Streams | None = None, *, keep_correlated: bool = False
) -> LearningSimResult:
    """Run a learning protocol in one process with the peers' exact update order: each node's
    local step, then K gossip steps with the terms in increasing node-id order, so a fault-free
    networked run gives bit-identical models (given the same streams)."""
    from coordinator_free.families.learning import protocol as lp

    plan = lp.make_plan(cfg)
    task = lp.make_task(cfg, plan.n)
    streams = streams if streams is not None else seeds.PublicSeedStreams(cfg.run.seed)
    kept: list[np.ndarray] = []
    if not plan.decentralized:
        theta = task.model.init()
        history = [theta[None, :]]
        for r in range(plan.rounds):
            theta = lp.central_step(plan, task, r, theta, streams)
            history.append(theta[None, :])
    else:
        n = plan.n
        thetas = [task.model.init() for _ in range(n)]
        history = [np.stack(thetas)]
        corr = _decor_terms(plan, streams) if plan.protocol == "decor" else None
        for r in range(plan.rounds):
            rows = [plan.row_at(v, r * plan.gossip_steps) for v in range(n)]
            terms = [None if corr is None else corr(r, v) for v in range(n)]
            if keep_correlated and corr is not None:
                kept.append(np.stack(terms))
            current = [
                lp.local_step(plan, task, v, r, thetas[v], streams, terms[v]) for v in range(n)
            ]
            previous: list[np.ndarray | None] = [None] * n
            for k in range(plan.gossip_steps):
                g = plan.gamma_at(r * plan.gossip_steps + k)
                previous, current = current, _gossip_step(rows, current, previous, g)
            thetas = current
            history.append(np.stack(thetas))
    models = np.stack(history)
    metrics = [lp.round_metrics(task, r, models[r]) for r in range(models.shape[0])]
    correlated = np.stack(kept) if kept else None
    return LearningSimResult(plan=plan, models=models, metrics=metrics, correlated=correlated)


def _decor_terms(plan, streams):
    """decor's correlated term of node v in round r, every pair active (the fault-free run)."""
    from coordinator_free.families.decor import keys as decor

    pairs = decor.PairSecrets.of_streams(streams, plan.graph.edges())
    memo: dict[tuple[int, int, int], np.ndarray] = {}  # (round, lo, hi) -> z, used by both ends

    def z_of(r: int, a: int, b: int) -> np.ndarray:
        key = (r, min(a, b), max(a, b))
        z = memo.pop(key, None)  # the second end takes it and frees it
        if z is None:
            z = decor.edge_noise(
                pairs.secret(a, b), pairs.run_id, a, b, r, plan.dim, plan.sigma_cor
            )
            memo[key] = z
        return z

    def term(r: int, v: int) -> np.ndarray:
        return decor.correlated_noise(v, plan.neighbours(v), lambda j: z_of(r, v, j), plan.dim)

    return term


@dataclass
class WalkSimResult:
    plan: object  # protocols.walk.WalkPlan
    traces: list  # one protocols.walk.TokenTrace per token

    @property
    def finals(self) -> np.ndarray:
        """(tokens, dim): every token's final value."""
        return np.stack([t.final for t in self.traces])


def simulate_walk(cfg: Config, streams: seeds.Streams | None = None) -> WalkSimResult:
    """Run every token of a token protocol to its end in one process, fault-free, with the peers'
    exact step math and hop draws (bit-identical to a fault-free networked run given the same
    streams)."""
    from coordinator_free.families.walk import protocol as wk

    plan = wk.make_plan(cfg)
    streams = streams if streams is not None else seeds.PublicSeedStreams(cfg.run.seed)
    return WalkSimResult(
        plan=plan, traces=[wk.walk_token(plan, cfg, j, streams) for j in range(plan.tokens)]
    )
