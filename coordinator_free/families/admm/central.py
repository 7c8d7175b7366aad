"""The one-process private-ADMM baselines: ``admm-central`` (Algorithm 8.2, every record a user),
``admm-federated`` (Algorithm 8.3: the graph's nodes are the users, each holding its shard, m of
them sampled per round, optionally with secure aggregation) and ``prox-sgd`` (private proximal
SGD on the records). The arithmetic is ``ml/admm.py``'s; the randomness comes from the run's
secret stream (``cfree run``) or the public seed (``cfree simulate``).

Their guarantees (a trusted server sees what it computes; everyone sees the released models):

* ``admm-central``: Theorem 8.7 at record level. Its ``8 alpha K L^2 gamma^2 / (sigma^2 N^2)``
  holds when a record's x-update is the prox of its (1/N)-weighted loss; here a record's own loss
  is clipped at L (displacement gamma L, N times more), so the figure is Theorem 8.7 with L N:
  ``8 alpha K L^2 gamma^2 / sigma^2``, the local guarantee of the record's K updates.
* ``admm-federated``: the server sees every sampled user's update: Theorem 8.9's local
  guarantee for its K_i <= K participations; with secure aggregation, Remark 8.10 (the sum of
  the m updates of a round: the local guarantee divided by m); the released models: Theorem
  8.9's central guarantee (Lemma E.5's conditions; where they fail, the server's figure).
* ``prox-sgd``: each record's clipped gradient is in at most K batches, each step a Gaussian
  mechanism of ratio 2 / sigma (noise multiplier sigma): ``2 alpha K / sigma^2``, no
  amplification by subsampling counted.

Pairs (observer, source) are the graph's nodes as for central-dp: every entry is the same
guarantee (a record's, for the record-level protocols: any record of the source's shard).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import networkx as nx
import numpy as np

from coordinator_free import graphs, rundir, seeds
from coordinator_free.accounting import loss
from coordinator_free.accounting.core import AuditError, audit_head, smallest_sigma
from coordinator_free.families.admm import protocol as ap
from coordinator_free.families.averaging import protocol as mf

if TYPE_CHECKING:
    from coordinator_free.config import Config

METHODS = ("exact", "paper")


@dataclass(frozen=True)
class CentralPlan:
    protocol: str
    n: int  # the graph's nodes: the shards (the users of admm-federated)
    graph: nx.Graph
    rounds: int
    records: int  # training records (the users of admm-central)
    users_per_round: int
    secure_aggregation: bool
    gamma: float
    lam: float
    clip: float
    step_size: float
    batch_size: int
    sigma: float
    sensitivity: float
    alpha: float
    delta: float
    dim: int
    loss: str
    reg: str
    reg_strength: float

    @property
    def steps(self) -> int:
        return self.rounds

    def neighbours(self, v: int) -> list[int]:
        return []

    def public_params(self) -> dict:
        return {
            "protocol": self.protocol,
            "n": self.n,
            "rounds": self.rounds,
            "steps": self.rounds,
            "records": self.records,
            "users_per_round": self.users_per_round,
            "secure_aggregation": self.secure_aggregation,
            "gamma": self.gamma,
            "lam": self.lam,
            "clip": self.clip,
            "step_size": self.step_size,
            "batch_size": self.batch_size,
            "sigma": self.sigma,
            "sensitivity": self.sensitivity,
            "alpha": self.alpha,
            "delta": self.delta,
            "dim": self.dim,
            "loss": self.loss,
            "reg": self.reg,
            "reg_strength": self.reg_strength,
        }


def make_plan(cfg: Config) -> CentralPlan:
    pr = cfg.protocol
    g = mf.build_graph_from_config(cfg)
    n = g.number_of_nodes()
    task = ap.make_task(cfg, n)
    lo, reg, strength = ap.objective_spec(cfg.model)
    records = int(task.dataset.X_train.shape[0])
    m = n if pr.users_per_round is None else int(pr.users_per_round)
    batch = pr.batch_size if pr.batch_size else records
    return CentralPlan(
        protocol=pr.name,
        n=n,
        graph=g,
        rounds=pr.rounds,
        records=records,
        users_per_round=m,
        secure_aggregation=bool(pr.secure_aggregation),
        gamma=ap.gamma_of(cfg),
        lam=ap.lam_of(cfg),
        clip=pr.clip,
        step_size=pr.step_size,
        batch_size=min(batch, records),
        sigma=cfg.privacy.sigma,
        sensitivity=cfg.sensitivity,
        alpha=cfg.privacy.alpha,
        delta=cfg.privacy.delta,
        dim=task.dim,
        loss=lo,
        reg=reg,
        reg_strength=strength,
    )


# ------------------------------------------------------------------------------ running


@dataclass
class CentralResult:
    plan: CentralPlan
    z: np.ndarray  # (rounds + 1, dim): the released models
    clipped: int


def simulate(cfg: Config, plan: CentralPlan | None = None, streams=None) -> CentralResult:
    """The run in this process; its randomness from ``streams`` (the public seed by default)."""
    from coordinator_free.ml import admm

    plan = plan if plan is not None else make_plan(cfg)
    streams = streams if streams is not None else seeds.PublicSeedStreams(cfg.run.seed)
    rng = streams.stream(seeds.PURPOSE_NOISE, 0, 0)
    task = ap.make_task(cfg, plan.n)
    X, y = task.dataset.X_train, task.dataset.y_train
    obj = ap.objective(cfg)
    kw = {"gamma": plan.gamma, "lam": plan.lam, "clip": plan.clip, "sigma": plan.sigma}
    if plan.protocol == "admm-central":
        run = admm.central_admm(obj, X, y, iterations=plan.rounds, rng=rng, **kw)
    elif plan.protocol == "admm-federated":
        run = admm.federated_admm(
            obj, X, y, rounds=plan.rounds, m=plan.users_per_round, rng=rng,
            groups=list(task.shards), secure_aggregation=plan.secure_aggregation, **kw,
        )  # fmt: skip
    else:
        run = admm.prox_sgd(
            obj, X, y, eta=plan.step_size, clip=plan.clip, sigma=plan.sigma,
            iterations=plan.rounds, batch=plan.batch_size, rng=rng,
        )  # fmt: skip
    return CentralResult(plan=plan, z=np.asarray(run.z), clipped=int(run.clipped))


def records_objective(cfg: Config, plan: CentralPlan, z: np.ndarray) -> float:
    """What the protocol minimises: the users' mean loss plus r (admm-federated: the shards'
    mean of means; the record-level protocols: the mean over the records)."""
    obj = ap.objective(cfg)
    task = ap.make_task(cfg, plan.n)
    if plan.protocol == "admm-federated":
        return float(np.mean([obj.value(z, *task.shard(v)) for v in range(plan.n)]))
    return float(obj.value(z, task.dataset.X_train, task.dataset.y_train))


def optimum(cfg: Config, plan: CentralPlan) -> float:
    """F* of :func:`records_objective`."""
    if plan.protocol == "admm-federated":
        return ap.optimum(cfg, plan.n)[0]
    return ap.optimum(cfg, 1)[0]


def metrics(cfg: Config, res: CentralResult) -> list[dict]:
    fstar = optimum(cfg, res.plan)
    rows = []
    for k, z in enumerate(res.z):
        f = records_objective(cfg, res.plan, z)
        rows.append({"round": k, "objective": f, "objective_gap": f - fstar})
    return rows


def run(cfg: Config, out: Path, streams) -> tuple[dict, CentralPlan]:
    """``cfree run``: the run with the secret ``streams``; its released models and per-round
    objective into the run directory."""
    from coordinator_free.families.admm.protocol import test_objective

    res = simulate(cfg, None, streams)
    rundir.write_npy(rundir.central_models_path(out), res.z)
    rows = metrics(cfg, res)
    rundir.write_jsonl(rundir.metrics_path(out), rows)
    results = {
        "protocol": cfg.protocol.name,
        "rounds": res.plan.rounds,
        "steps": 0,
        "nodes": [],
        "metrics": rows,
        "central": {
            "objective": rows[-1]["objective"],
            "objective_gap": rows[-1]["objective_gap"],
            "optimum": rows[-1]["objective"] - rows[-1]["objective_gap"],
            "test_objective": test_objective(cfg, res.plan.n, res.z[-1]),
            "clipped": res.clipped,
        },
        "guarantees": guarantees(res.plan),
    }
    return results, res.plan


# ------------------------------------------------------------------------------ accounting


def units_of(plan: CentralPlan) -> loss.Units:
    if plan.protocol == "prox-sgd":
        # noise multiplier sigma on a clipped gradient mean: ratio 2 / sigma per step
        return loss.Units(alpha=plan.alpha, delta=plan.delta, sensitivity=2.0, sigma=plan.sigma)
    return loss.Units(
        alpha=plan.alpha, delta=plan.delta, sensitivity=4.0 * plan.gamma * plan.clip,
        sigma=plan.sigma,
    )  # fmt: skip


def _acct():
    from coordinator_free.privacy import admm

    return admm


def guarantees(plan: CentralPlan) -> dict:
    """Every guarantee of the run, as loss entries, and which one is the headline
    (``released``: what anyone who sees the released models learns)."""
    u = units_of(plan)
    acct = _acct()
    K = plan.rounds
    out: dict = {}
    if plan.protocol == "prox-sgd":
        out["released"] = u.rdp_bound(float(K)).entry(
            theorem="K Gaussian steps of ratio 2/sigma (no amplification by subsampling counted)"
        )
        out["headline"] = "released"
        return out
    if plan.protocol == "admm-central":
        # Theorem 8.7's 1/N^2 needs a record's x-update to be the prox of its (1/N)-weighted
        # loss (displacement <= gamma L / N). Here every record's own loss is clipped at L
        # (displacement <= gamma L): Theorem 8.7 with L N in place of L, which is the local
        # guarantee of the record's K updates (docs/privacy.md, Private ADMM).
        rho = acct.central_rho(K, plan.clip * plan.records, plan.gamma, plan.sigma, plan.records)
        out["released"] = u.rdp_bound(rho / u.ldp_rho).entry(
            theorem="8.7 at record level with the record's unweighted loss clipped at L "
            "(displacement gamma L: 8.7 with L N, i.e. the local guarantee of K updates)"
        )
        out["headline"] = "released"
        return out
    m, n = plan.users_per_round, plan.n
    loc = u.rdp_bound(acct.local_rho(K, plan.clip, plan.gamma, plan.sigma) / u.ldp_rho)
    out["local"] = loc.entry(theorem="8.9, local (the server sees each sampled update)")
    server = loc
    if plan.secure_aggregation:
        sa = acct.secure_aggregation_rho(K, plan.clip, plan.gamma, plan.sigma, m)
        server = u.rdp_bound(sa / u.ldp_rho)
        out["secure_aggregation"] = server.entry(
            theorem="Remark 8.10 (the server sees the sum of the m updates of a round)"
        )
    cen = loss.curve(
        u,
        lambda a: acct.federated_central_rdp(a, K, plan.clip, plan.gamma, plan.sigma, n, m),
        1e4,
        cap=server.eps,
    )
    if cen.eps is not None and cen.eps < server.eps:
        out["released"] = cen.entry(theorem="8.9, central (Lemma E.5 at the orders it allows)")
    else:
        why = (
            "Lemma E.5's conditions fail at every order"
            if cen.eps is None
            else "Theorem 8.9's central figure is not below the server's"
        )
        out["released"] = {
            **server.entry(),
            "theorem": f"the server's figure ({why}: m < n/5 and a noise multiplier >= 4 needed)",
        }
    out["headline"] = "released"
    return out


def _headline(plan: CentralPlan) -> dict:
    g = guarantees(plan)
    return g[g["headline"]]


def note(plan: CentralPlan) -> str:
    return {
        "admm-central": "Theorem 8.7 (record level) with each record's own loss clipped at L: "
        "the local guarantee of a record's K updates, to anyone who sees the released models",
        "admm-federated": "Theorem 8.9: the server sees the sampled users' updates (local "
        "guarantee; with secure aggregation Remark 8.10); the released models: the central "
        "guarantee where Lemma E.5 applies",
        "prox-sgd": "K noisy steps per record (noise multiplier sigma), no amplification by "
        "subsampling counted; the curator is trusted",
    }[plan.protocol]


def _entries(plan: CentralPlan, observers) -> dict[int, dict]:
    h = {k: h for k, h in _headline(plan).items() if k in loss.LOSS_KEYS}
    return {
        int(v): {(u, m): dict(h) for u in range(plan.n) if u != v for m in METHODS}
        for v in observers
    }


def planned_losses(cfg: Config, plan: CentralPlan, observers) -> dict[int, dict]:
    return _entries(plan, observers)


def plan_report(cfg: Config, plan: CentralPlan, *, method: str) -> dict:
    g = guarantees(plan)
    h = g[g["headline"]]
    pair = {k: v for k, v in h.items() if k in loss.LOSS_KEYS}
    return {
        "alpha": plan.alpha,
        "delta": plan.delta,
        "method": method,
        "protocol": plan.protocol,
        "n": plan.n,
        "steps": plan.rounds,
        "rounds": plan.rounds,
        "records": plan.records,
        "sigma": plan.sigma,
        "sensitivity": units_of(plan).sensitivity,
        "ldp": g.get("local", g.get("server", h)),
        "guarantees": g,
        "accounting": note(plan),
        "source": None,
        "worst_pair": {"source": 1 % plan.n, "observer": 0, **pair},
        "mean_over_pairs": dict(pair),
        "by_distance": [],
    }


def audit_run(run_dir: Path, cfg: Config, plan: CentralPlan) -> dict:
    """No view logs: every pair gets the run's guarantee (the plan's; nothing can lower it)."""
    dist = graphs.all_distances(plan.graph)
    ent = _entries(plan, range(plan.n))
    g = guarantees(plan)
    return {
        **audit_head(run_dir, plan.protocol, plan, steps=plan.rounds, fault_free=True),
        "ldp": g.get("local", g.get("server", g[g["headline"]])),
        "guarantees": g,
        "accounting": note(plan),
        "observers": [
            {
                "observer": v,
                "losses": [
                    {"source": u, "method": m, "distance": int(dist[v, u]), **x}
                    for (u, m), x in sorted(ent[v].items())
                ],
            }
            for v in range(plan.n)
        ],
        "complete": True,
        "integrity": [],
        "notes": [],
    }


def calibrate(cfg: Config, target_eps: float, *, method: str, budget: str) -> dict:
    """The smallest sigma whose headline guarantee meets ``target_eps``."""
    plan = make_plan(cfg)
    if not target_eps > 0 or not math.isfinite(target_eps):
        raise AuditError(f"--target-eps must be a positive number, got {target_eps}")

    def at(sigma: float) -> dict:
        return _headline(dataclasses.replace(plan, sigma=sigma))

    sens = units_of(plan).sensitivity
    hi = smallest_sigma(lambda s: at(s)["eps"], target_eps, sens)
    h = at(hi)
    return {
        "protocol": plan.protocol,
        "method": method,
        "budget": budget,
        "target_eps": target_eps,
        "delta": plan.delta,
        "sigma": hi,
        "sensitivity": sens,
        "steps": plan.rounds,
        "eps": h["eps"],
        "binding": {"source": 1 % plan.n, "observer": 0, **h},
        "worst_pair": {"source": 1 % plan.n, "observer": 0, **h},
        "mean_over_pairs": dict(h),
        "ldp": _local(plan, hi),
        "accounting": note(plan),
    }


def _local(plan: CentralPlan, sigma: float) -> dict:
    """What a user's updates cost if every one of them were seen (the local guarantee, or the
    headline where the protocol has no other)."""
    g = guarantees(dataclasses.replace(plan, sigma=sigma))
    if "local" in g:
        return g["local"]
    # No other figure: the headline itself, without a factor (nothing to gain over it).
    return {**g[g["headline"]], "factor": None}
