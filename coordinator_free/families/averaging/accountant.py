"""The gossip accountant: privacy planning (public parameters only) and auditing (replaying a
finished run's view logs) of the protocols built on gossip steps — Muffliato averaging,
randomized gossip and the learning protocols (Muffliato-GD/SGD, D-SGD, the central-DP curator);
the units are those of ``accounting.core``.

``plan`` assumes the fault-free schedule. ``audit`` rebuilds the schedule that really happened
from the logs: which values every node used at every step (missed deadlines included) and which
messages every observer saw (late ones included), then computes the same quantities for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import numpy as np

from coordinator_free import graphs
from coordinator_free.accounting import baseline
from coordinator_free.accounting.core import (
    METHODS,
    AuditError,
    Units,
    argmax_tied,
    budget_factor,
    read_logs,
    scan_exchanges,
    smallest_sigma,
    units_of,
)
from coordinator_free.families.averaging import protocol as mf
from coordinator_free.families.learning import protocol as lp
from coordinator_free.families.learning import secret
from coordinator_free.families.randomized import protocol as rg
from coordinator_free.privacy import muffliato as acct
from coordinator_free.privacy import multiround, private_graph
from coordinator_free.privacy import pairwise as pw
from coordinator_free.viewlog import value_digest

# Up to this many nodes the audit always replays the realised schedule with the general
# (schedule-agnostic) computation; above it, a fault-free schedule uses the fast plan path.
GENERAL_AUDIT_MAX_N = 64


def ldp_factor(plan) -> float:
    """The local-DP loss of the whole run in units of one Gaussian mechanism: 1 for one averaging
    run, R for R rounds of fresh noise."""
    return float(plan.rounds) if isinstance(plan, lp.LearningPlan) else 1.0


def ldp_baseline(plan) -> dict:
    f = ldp_factor(plan)
    return {"factor": f, **units_of(plan).loss(f)}


def accounting_note(plan) -> str | None:
    """What the per-pair numbers of a protocol mean, where they need saying (plan and audit)."""
    if isinstance(plan, rg.RandomizedPlan):
        note = (
            "randomized-gossip: the exchange sequence is public; 'paper' is Corollary 2 (Eq. (6) "
            "over the exchanges the observer took part in, W_t = I - (e_a - e_b)(e_a - e_b)^T/2, "
            "not capped), 'exact' the divergence of the observer's whole view"
        )
        if plan.n > acct.RATIONAL_MAX_NODES:
            note += (
                f"; above {acct.RATIONAL_MAX_NODES} nodes 'exact' is the structural upper bound "
                "(1 for every source whose input reached the observer, 0 for the others)"
            )
        return note
    if not isinstance(plan, lp.LearningPlan):
        return None
    if plan.protocol == "central-dp":
        return (
            "central-dp: every node sees the released model, a Gaussian mechanism per round "
            "(sensitivity Delta on the sum of clipped gradients): R-fold composition for every pair"
        )
    exact = (
        "'exact' is the joint view of all R rounds (gradients as the inputs, as in the paper; "
        "a certified upper bound over the worst per-round change of the source's gradient), "
        "which counts a gradient travelling on through the models in later rounds"
    )
    if plan.secret:
        return (
            "secret graphs: a fresh Erdős–Rényi graph every round from pair secrets, each node "
            "knowing only its own neighbours. Before the run nobody knows the graphs: 'exact' is "
            "then R-fold local DP (what holds for any graphs) and so is 'paper', Theorem 4/9 of "
            "the Muffliato paper as a per-pair worst case (any pair may be an edge in every "
            "round); the theorem's expectation over the graphs, at the orders its condition on "
            "sigma allows, is reported apart as 'expected'. The audit reads the graphs from the logs and gives, for both methods, the "
            "loss conditional on them, as if the observer knew them: an upper bound for an "
            "observer that does not. " + exact
        )
    if plan.time_varying:
        exact += (
            "; a fresh graph every round from a public seed, so the rounds' graphs are known to "
            "every observer and both methods use each round's own W_r (distances are in the "
            "union of the rounds' graphs)"
        )
    if plan.protocol == "dsgd":
        return "dsgd: 'paper' is the baseline's own guarantee, R-fold local DP; " + exact
    return (
        "'paper' is Eq. (13) of the Muffliato paper (per round, capped at local DP, summed "
        "over rounds); " + exact
    )


# ----------------------------------------------------------------------------------------- plan


def plan_factors(plan, method: str, *, sources=None, observers=None) -> np.ndarray:
    """Fault-free factors ``F[i, j]`` of source ``sources[j]`` towards ``observers[i]``, in
    units of one Gaussian mechanism's loss (summed over rounds for learning protocols)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    if isinstance(plan, rg.RandomizedPlan):
        return _randomized_plan_factors(plan, method, sources, observers)
    if getattr(plan, "dropped", ()):
        return _dropout_plan_factors(plan, method, sources, observers)
    if isinstance(plan, lp.LearningPlan) and plan.secret and not plan.round_graphs:
        return _secret_plan_factors(plan, method, sources, observers)
    if not isinstance(plan, lp.LearningPlan):
        return acct.plan_factors(
            plan.W,
            plan.steps,
            plan.accelerated,
            method=method,
            observers=observers,
            sources=sources,
            gamma=plan.gamma if plan.accelerated else None,  # the plan's, not recomputed
        )
    n_obs = plan.n if observers is None else len(observers)
    n_src = plan.n if sources is None else len(sources)
    R = float(plan.rounds)
    if _ldp_for_every_pair(plan, method):
        return np.full((n_obs, n_src), R)
    if method == "exact":
        obs = range(plan.n) if observers is None else observers
        src = slice(None) if sources is None else list(sources)
        return np.stack([_plan_joint(plan, v)[src] for v in obs])

    def one_round(w: np.ndarray) -> np.ndarray:
        return acct.ldp_capped(  # Eq. (13): each round capped at local DP
            acct.plan_factors(
                w,
                plan.gossip_steps,
                plan.accelerated,
                method=method,
                observers=observers,
                sources=sources,
                gamma=plan.gamma if plan.accelerated else None,
            )
        )

    if plan.time_varying:  # Eq. (13) with round r's own W_r
        return sum(one_round(plan.round_matrix(r)) for r in range(plan.rounds))
    return R * one_round(plan.W)


def _secret_plan_factors(plan, method: str, sources, observers) -> np.ndarray:
    """Secret per-round graphs, before the run: nobody knows the graphs. Both methods give
    R-fold local DP for every pair: ``exact`` because that is what holds whatever the graphs
    turn out to be (the audit gives the loss conditional on the graphs the logs show), ``paper``
    because it is Theorem 4/9 of the Muffliato paper as a per-pair worst case (any pair may be
    an edge in every round, and an edge costs local DP). The theorem's expectation over the
    graphs is not a per-pair figure: :func:`private_graph_report` gives it, labelled."""
    n_obs = plan.n if observers is None else len(observers)
    n_src = plan.n if sources is None else len(sources)
    if method == "exact":
        return np.full((n_obs, n_src), float(plan.rounds))
    return np.full((n_obs, n_src), secret.worst_case_factor(plan))


def planned_schedule(plan) -> list[tuple[np.ndarray, float]]:
    """Every step's gossip matrix under the plan's public dropout: a node that sits out keeps
    its value, and its neighbours keep its weight (the realised row of a missed value)."""
    steps, shared = [], {}
    for t in range(plan.steps):
        out = plan.dropped[t]
        M = shared.get(out)
        if M is None:
            M = np.zeros((plan.n, plan.n))
            for v in range(plan.n):
                for w, wt in mf.realised_row(plan.row(v), v, set(plan.partners_at(v, t))).items():
                    M[v, w] = wt
            shared[out] = M
        steps.append((M, plan.gamma_at(t)))
    return steps


def _dropout_plan_factors(plan, method: str, sources, observers) -> np.ndarray:
    """Muffliato with public dropout: each observer's loss for the planned schedule (who sits
    out when is known to all), as the audit computes it for a realised one."""
    steps = planned_schedule(plan)
    obs = range(plan.n) if observers is None else observers
    src = slice(None) if sources is None else list(sources)
    rows = []
    for v in obs:
        received = [(t, w) for t in range(plan.steps) for w in plan.partners_at(v, t)]
        rows.append(_schedule_factors(plan, steps, v, received, method, [])[src])
    return np.stack(rows)


def _plan_joint(plan, v: int) -> np.ndarray:
    """The joint 'exact' factors of observer v for the fault-free schedule (time-varying
    graphs: every round's own W_r and neighbours; R-fold local DP, a valid bound, where the
    joint computation is out of reach)."""
    if not plan.time_varying:
        return _joint(plan, v).upper
    K = plan.gossip_steps
    schedule = [
        [(plan.round_matrix(r), plan.gamma_at(r * K + k)) for k in range(K)]
        for r in range(plan.rounds)
    ]
    rec = [
        (r, k, w) for r in range(plan.rounds) for k in range(K) for w in plan.partners_at(v, r * K)
    ]
    try:
        return _joint(plan, v, schedule, rec).upper
    except (multiround.MultiRoundTooLarge, acct.NumericalRankError):
        return np.full(plan.n, float(plan.rounds))


def _randomized_plan_factors(plan, method: str, sources, observers) -> np.ndarray:
    """Randomized gossip, fault-free: the public exchange sequence, each observer's messages."""
    exchanges = [(e.a, e.b, True, True) for e in plan.edges]
    obs = range(plan.n) if observers is None else observers
    src = slice(None) if sources is None else list(sources)
    return np.stack(
        [
            _pairwise_factors(plan, exchanges, v, rg.fault_free_received(plan, v), method, [])[src]
            for v in obs
        ]
    )


def _pairwise_factors(plan, exchanges, v: int, received, method: str, notes: list) -> np.ndarray:
    """Randomized gossip: Corollary 2 ('paper') or the exact loss, exact arithmetic up to
    RATIONAL_MAX_NODES nodes; beyond, the structural bound (1 for every source that reached v)."""
    if method == "paper":
        return pw.paper_factors(plan.n, exchanges, v, received)
    try:
        return pw.exact_factors(plan.n, exchanges, v, received)
    except acct.ExactTooLargeError as exc:
        notes.append(
            {
                "observer": v,
                "kind": "exact-structural-bound",
                "message": f"{exc}: 'exact' for observer {v} is 1 for every source whose input "
                "reached it and 0 for the others, an upper bound",
            }
        )
        return pw.structural_factors(plan.n, exchanges, v, received)


def _ldp_for_every_pair(plan, method: str) -> bool:
    """Learning protocols whose loss is R-fold local DP for every pair: the curator's released
    model, and D-SGD's own guarantee (its 'paper' method)."""
    return plan.protocol == "central-dp" or (plan.protocol == "dsgd" and method == "paper")


def _joint(plan, v: int, schedule=None, received=None) -> multiround.MultiRoundLoss:
    return multiround.joint_factors(
        plan.W,
        plan.rounds,
        plan.gossip_steps,
        plan.accelerated,
        v,
        gamma=plan.gamma if plan.accelerated else None,
        schedule=schedule,
        received=received,
    )


def plan_report(cfg, plan, *, source: int | None, method: str) -> dict:
    u = units_of(plan)
    base = {
        "alpha": plan.alpha,
        "delta": plan.delta,
        "method": method,
        "protocol": cfg.protocol.name,
        "n": plan.n,
        "steps": plan.steps,
        "accelerated": plan.accelerated,
        "spectral_gap": plan.spectral_gap,
        "sigma": plan.sigma,
        "sensitivity": plan.sensitivity,
        "ldp": ldp_baseline(plan),
    }
    if isinstance(plan, lp.LearningPlan):
        base.update(rounds=plan.rounds, gossip_steps=plan.gossip_steps)
    if isinstance(plan, rg.RandomizedPlan):
        tv = plan.exchange_counts()
        base.update(
            clock_rate=plan.rate,
            exchanges_per_node={
                "min": int(tv.min()),
                "mean": float(tv.mean()),
                "max": int(tv.max()),
            },
            # Corollary 2's mean bound: (1/n) sum_u f(u, v) <= LDP * T_v / n, for the busiest v.
            cor2_mean_factor_max=float(tv.max()) / plan.n,
        )
    note = accounting_note(plan)
    if note:
        base["accounting"] = note
    if isinstance(plan, lp.LearningPlan) and plan.time_varying:
        base["private_graph_bound"] = private_graph_report(plan, u)
    if source is not None:
        if not 0 <= source < plan.n:
            raise AuditError(f"--source {source} is not a node id (0..{plan.n - 1})")
        F = plan_factors(plan, method, sources=[source])  # F[v, 0]
        dist = graphs.distances_from(plan.graph, source)
        losses = []
        for v in range(plan.n):
            if v == source:
                continue
            f = float(F[v, 0])
            losses.append({"observer": v, "distance": int(dist[v]), "factor": f, **u.loss(f)})
        return {**base, "source": source, "losses": losses}
    F = plan_factors(plan, method)  # F[v, u], all pairs
    return {**base, "source": None, **summarise(plan, F, u)}


def private_graph_factors(plan) -> np.ndarray:
    """Theorem 4/9 per pair, ``F[v, u]`` in units of local DP: for secret graphs the per-pair
    worst case (R-fold local DP), for public per-round graphs the theorem on the realised
    graphs (:func:`_public_graph_factors`). The factors alone are not the theorem's eps: it
    holds only at the orders its condition allows (:func:`private_graph_report`)."""
    if plan.secret:
        F = _secret_plan_factors(plan, "paper", None, None)
        np.fill_diagonal(F, float(plan.rounds))
        return F
    return _public_graph_factors(plan)


def _public_graph_factors(plan) -> np.ndarray:
    """Theorem 4/9 of the Muffliato paper per round, summed over rounds (its Proposition 1 for a
    single observer): ``F[v, u] = sum_r min(1, 1 if u ~_r v else 2 K d_v^r / (n - d_v^r))`` in
    units of the local-DP loss, d_v^r = v's degree in round r's graph. Valid only for a graph
    that is secret (each node knows only its own neighbours) and only at the orders
    ``sigma^2 >= Delta^2 alpha (alpha - 1) / 2`` allows; with graph.resample the rounds' graphs
    come from a public seed, so this is the paper's comparison point, not a guarantee of the
    run."""
    n, K = plan.n, plan.gossip_steps
    out = np.zeros((n, n))
    for g in plan.round_graphs:
        adj = nx.to_numpy_array(g, nodelist=range(n), dtype=bool)
        deg = adj.sum(axis=1)
        far = private_graph.non_adjacent_factor(n, deg, K)
        out += np.where(adj, 1.0, far[:, None])
    np.fill_diagonal(out, float(plan.rounds))
    return out


def _theorem_loss(plan, u: Units, factor: float, a_max: float, ldp_eps: float) -> dict:
    """A Theorem 4/9 figure: its rdp at the plan's order (None where the condition fails
    there), its eps from the improved conversion over the allowed orders (1, a_max] only, the
    order used, and the usable figure min(theorem, local DP) (local DP alone when no order is
    allowed)."""
    th = private_graph.theorem_eps(factor, u.ldp_rho, plan.delta, a_max)
    ok = private_graph.condition_holds(plan.alpha, plan.sigma, plan.sensitivity)
    eps = th["eps"]
    return {
        "factor": float(factor),
        "rdp": plan.alpha * u.ldp_rho * float(factor) if ok else None,
        "eps": eps,
        "alpha": th["alpha"],
        "eps_usable": ldp_eps if eps is None else min(float(eps), ldp_eps),
    }


def private_graph_report(plan, u: Units) -> dict:
    """Theorem 4/9 of the Muffliato paper for per-round Erdős–Rényi graphs, evaluated only at
    the Rényi orders its condition allows (alpha <= alpha_max). Secret graphs: the per-pair
    worst case (R-fold local DP, every pair) under ``worst_pair`` / ``mean_over_pairs``, the
    theorem's expectation over the graphs under ``expected``. Public graphs: the theorem on the
    realised graphs, per pair, for comparison only."""
    a_max = secret.theorem_alpha_max(plan)
    cond = secret.theorem_condition(plan)
    ldp = ldp_baseline(plan)
    ldp_eps = float(ldp["eps"])
    order = (
        f"its condition {private_graph.CONDITION} allows the orders alpha <= {a_max:.4g}, "
        "where its eps is computed"
        if a_max > 1.0
        else f"its condition {private_graph.CONDITION} allows no order > 1: it gives nothing"
    )
    common = {"condition": private_graph.CONDITION, "condition_holds": bool(cond)}
    common["alpha_max"] = a_max
    if plan.secret:
        R = float(plan.rounds)
        f_far = secret.theorem_factor(plan)
        worst = {"source": 1, "observer": 0, "factor": R, **u.loss(R)}
        expected = _theorem_loss(plan, u, secret.expected_factor(plan), a_max, ldp_eps)
        expected["per_round"] = {
            "p_edge": plan.secret_p,
            "factor_edge": 1.0,
            "factor_not_edge": f_far,
        }
        note = (
            "Theorem 4/9 (private Erdős–Rényi graph), a guarantee here, the graphs being secret: "
            "per round local DP when the pair is an edge, else min(1, 2 K d / (n - d)); any pair "
            f"may be an edge in every round, so per pair it gives R-fold local DP; {order}. "
            f"Expected over the graphs (edge probability {plan.secret_p:g}, observer degree "
            f"~ Bin(n - 2, p)): factor {expected['factor']:.4g}, an expectation, not a "
            "per-pair bound"
        )
        return {
            "note": note,
            "secret": True,
            **common,
            "worst_pair": worst,
            "mean_over_pairs": {"factor": R, **u.loss(R)},
            "expected": expected,
        }
    F = private_graph_factors(plan)
    n = plan.n
    off = np.where(np.eye(n, dtype=bool), -np.inf, F)
    v_w, u_w = argmax_tied(off)
    mean_all = float(np.where(np.eye(n, dtype=bool), 0.0, F).sum() / (n * (n - 1)))
    note = (
        "Theorem 4/9 (private Erdős–Rényi graph) per round on the realised graphs, summed: "
        f"valid only for secret graphs, and these are drawn from a public seed; {order}"
    )
    return {
        "note": note,
        "secret": False,
        **common,
        "worst_pair": {
            "source": int(u_w),
            "observer": int(v_w),
            **_theorem_loss(plan, u, float(F[v_w, u_w]), a_max, ldp_eps),
        },
        "mean_over_pairs": _theorem_loss(plan, u, mean_all, a_max, ldp_eps),
    }


def summarise(plan: mf.MuffliatoPlan, F: np.ndarray, u: Units) -> dict:
    """Mean/max by graph distance, the worst pair, and the mean loss per observer."""
    n = plan.n
    dist = graphs.all_distances(plan.graph)  # dist[v, u]
    rows = []
    lf = ldp_factor(plan)
    off_diag = ~np.eye(n, dtype=bool)
    for d, s in acct.distance_summary(F, dist).items():
        at = off_diag & (dist == d)
        rows.append(
            {
                "distance": d,
                "pairs": s["count"],
                "factor_mean": s["mean"],
                "factor_max": s["max"],
                "rdp_mean": u.loss(s["mean"])["rdp"],
                "rdp_max": u.loss(s["max"])["rdp"],
                "eps_max": u.loss(s["max"])["eps"],
                # pairs below the local-DP loss, and above it (a paper formula can be)
                "amplified": int(np.count_nonzero(baseline.below(F[at], lf))),
                "above_ldp": int(np.count_nonzero(baseline.above(F[at], lf))),
            }
        )
    off = np.where(np.eye(n, dtype=bool), -np.inf, F)
    v_w, u_w = argmax_tied(off)
    worst = float(F[v_w, u_w])
    per_observer_mean = np.where(np.eye(n, dtype=bool), 0.0, F).sum(axis=1) / (n - 1)
    mean_all = float(per_observer_mean.mean())
    return {
        "by_distance": rows,
        "worst_pair": {"source": int(u_w), "observer": int(v_w), "factor": worst, **u.loss(worst)},
        "mean_over_pairs": {"factor": mean_all, **u.loss(mean_all)},
        "max_observer_mean": {
            "observer": argmax_tied(per_observer_mean)[0],
            "factor": float(per_observer_mean.max()),
            **u.loss(float(per_observer_mean.max())),
        },
    }


# ------------------------------------------------------------------- the floor of every audit


_PLANNED_CACHE: dict[tuple, np.ndarray] = {}


def _all_plan_factors(cfg, plan, method: str) -> np.ndarray:
    """``plan_factors(plan, method)`` for every pair, remembered for the last few plans (an
    audit of damaged logs needs them; the fault-free schedule depends on the config alone, and
    the gossip matrix is part of the key so a changed graph file is never mistaken for the
    old one)."""
    W = getattr(plan, "W", None)
    fingerprint = None if W is None else value_digest(np.asarray(W, dtype=np.float64))
    try:
        key = (cfg, method, plan.steps, fingerprint)
        hash(key)
    except TypeError:
        return plan_factors(plan, method)
    F = _PLANNED_CACHE.get(key)
    if F is None:
        F = plan_factors(plan, method)
        if len(_PLANNED_CACHE) >= 8:
            _PLANNED_CACHE.pop(next(iter(_PLANNED_CACHE)))
        _PLANNED_CACHE[key] = F
    return F


def planned_losses(cfg, plan, observers: list[int]) -> dict[int, dict[tuple[int, str], dict]]:
    """Observer -> {(source, method): {"factor", "rdp", "eps", "distance"}} under the
    fault-free plan: the numbers ``cfree plan`` gives for each pair."""
    u = units_of(plan)
    out: dict[int, dict[tuple[int, str], dict]] = {v: {} for v in observers}
    for m in METHODS:
        F = _all_plan_factors(cfg, plan, m)  # F[v, u]
        for v in observers:
            dist = graphs.distances_from(plan.graph, v)
            for src in range(plan.n):
                if src != v:
                    f = float(F[v, src])
                    out[v][(src, m)] = {"factor": f, **u.loss(f), "distance": int(dist[src])}
    return out


def worst_case_losses(cfg, plan, observers: list[int]) -> dict[int, dict[tuple[int, str], dict]]:
    """The losses of observers about which nothing is known (no usable log): for each pair the
    larger of the planned loss and the local-DP loss of the source's releases. Every message a
    gossip observer can see is a function of the nodes' noisy releases, so it never learns more
    than local DP about a source: one Gaussian mechanism for averaging and randomized gossip, R
    of them for R learning rounds (the curator's plan already is R-fold local DP)."""
    ldp = ldp_baseline(plan)
    planned = planned_losses(cfg, plan, observers)
    for per in planned.values():
        for key, p in per.items():
            if ldp["eps"] > p["eps"]:
                per[key] = {**p, "factor": ldp["factor"], "rdp": ldp["rdp"], "eps": ldp["eps"]}
    return planned


# ---------------------------------------------------------------------------------------- audit


@dataclass
class Replay:
    """The realised schedule rebuilt from the logs."""

    steps: list[tuple[np.ndarray, float]]
    received: dict[int, set[tuple[int, int]]]  # observer -> {(step, sender)} it saw
    logged: set[int]  # nodes whose log could be read
    fault_free: bool
    integrity: list[dict]
    missed: int = 0  # values the logs say were missed at their step ("miss" records)
    late: int = 0  # values the logs say came only after their step
    # The plan the schedule was rebuilt with: hidden graphs bound to the graphs the logs show.
    plan: object = None


def replay(run_dir: Path, plan: mf.MuffliatoPlan) -> Replay:
    n, T = plan.n, plan.steps
    integrity: list[dict] = []
    logs = read_logs(run_dir, plan, integrity)
    if isinstance(plan, lp.LearningPlan) and plan.secret and not plan.round_graphs:
        plan, found = secret.bind_logged(plan, logs)  # hidden graphs: as the logs show them
        integrity.extend(found)
    scan = scan_exchanges(logs, plan, integrity, _digest)
    got, received, logged = scan.used, scan.seen, set(logs)
    steps: list[tuple[np.ndarray, float]] = []
    # Any missing, damaged or unfinished log means the schedule is not fully known: never
    # treat such a run as fault-free.
    fault_free = len(logged) == n and not integrity
    # Steps whose realised rows are the same share one matrix (a fault-free fixed-W run holds
    # one n x n matrix, not T of them).
    shared: dict[tuple, np.ndarray] = {}
    for t in range(T):
        rows = []
        for v in range(n):
            row = plan.row_at(v, t)
            if v in got:
                used = {w for w in got[v].get(t, set()) if w in row}
            else:
                used = set(plan.partners_at(v, t))  # no log: assume it used every partner
            if used != set(plan.partners_at(v, t)):
                fault_free = False
            rows.append(tuple(mf.realised_row(row, v, used).items()))
        key = tuple(rows)
        M = shared.get(key)
        if M is None:
            M = np.zeros((n, n))
            for v, r in enumerate(rows):
                for w, wt in r:
                    M[v, w] = wt
            shared[key] = M
        steps.append((M, plan.gamma_at(t)))
    missed = late = 0
    for v in logged:
        full = {(t, w) for t in range(T) for w in plan.partners_at(v, t)}
        if received[v] != full:
            fault_free = False
        on_time = {(t, w) for t, ws in got[v].items() for w in ws}
        missed += len(scan.missed.get(v, ()))
        late += len(received[v] - on_time)
    return Replay(
        steps=steps,
        received=received,
        logged=logged,
        fault_free=fault_free,
        integrity=integrity,
        missed=missed,
        late=late,
        plan=plan,
    )


def _digest(value: np.ndarray) -> str:
    return value_digest(np.asarray(value, dtype=np.float64))


def audit_run(run_dir: Path, cfg, plan, observers: list[int] | None = None) -> dict:
    if isinstance(plan, lp.LearningPlan) and not plan.decentralized:
        return _central_audit(run_dir, plan, observers)
    for v in observers or ():
        if not 0 <= v < plan.n:
            raise AuditError(f"observer {v} is not a node id (0..{plan.n - 1})")
    rp = replay(run_dir, plan)
    plan = rp.plan
    u = units_of(plan)
    # An observer without a readable log has no realised view: it is left out here, and the
    # generic audit (accounting.audit.audit_run) reports its worst case.
    wanted = sorted(rp.logged) if observers is None else [v for v in observers if v in rp.logged]
    use_plan = rp.fault_free and plan.n > GENERAL_AUDIT_MAX_N
    factors: dict[str, np.ndarray] = {}
    if use_plan:
        for m in METHODS:
            factors[m] = plan_factors(plan, m, observers=wanted)
    out_obs = []
    notes: list[dict] = []
    for i, v in enumerate(wanted):
        per_method = {}
        for m in METHODS:
            if use_plan:
                per_method[m] = factors[m][i]
            else:
                per_method[m] = _realised_factors(plan, rp, v, m, notes)
        dist = graphs.distances_from(plan.graph, v)
        losses = []
        for src in range(plan.n):
            if src == v:
                continue
            for m in METHODS:
                f = float(per_method[m][src])
                losses.append(
                    {
                        "source": src,
                        "method": m,
                        "distance": int(dist[src]),
                        "factor": f,
                        **u.loss(f),
                    }
                )
            fe, fp = float(per_method["exact"][src]), float(per_method["paper"][src])
            if fp < fe - 1e-9:
                notes.append(
                    {
                        "observer": v,
                        "source": src,
                        "kind": "paper-below-exact",
                        "message": f"Eq. (6) gives factor {fp:.4g} for {src}->{v} but the exact loss is {fe:.4g}",
                    }
                )
        out_obs.append({"observer": v, "losses": losses})
    return {
        "run_dir": str(run_dir),
        "protocol": cfg.protocol.name,
        "alpha": plan.alpha,
        "delta": plan.delta,
        "n": plan.n,
        "steps": plan.steps,
        "fault_free": rp.fault_free,
        "ldp": ldp_baseline(plan),
        "accounting": accounting_note(plan),
        "observers": out_obs,
        # The faults the logs show: values missed at their step, values that came late.
        "realised": {"missed": rp.missed, "late": rp.late},
        # False when a log is missing, damaged or unfinished: the schedule of the nodes
        # concerned was partly assumed (a missing log: every value used), see "integrity".
        "complete": not rp.integrity,
        "integrity": rp.integrity,
        "notes": notes,
    }


def _central_audit(run_dir: Path, plan, observers: list[int] | None) -> dict:
    """The trusted-curator baseline has no peers and no view logs: every node sees the released
    model, so every pair gets the R-fold Gaussian mechanism."""
    u = units_of(plan)
    wanted = list(range(plan.n)) if observers is None else observers
    for v in wanted:
        if not 0 <= v < plan.n:
            raise AuditError(f"observer {v} is not a node id (0..{plan.n - 1})")
    dist = graphs.all_distances(plan.graph)
    loss = u.loss(float(plan.rounds))
    out_obs = [
        {
            "observer": v,
            "losses": [
                {
                    "source": src,
                    "method": m,
                    "distance": int(dist[v, src]),
                    "factor": float(plan.rounds),
                    **loss,
                }
                for src in range(plan.n)
                if src != v
                for m in METHODS
            ],
        }
        for v in wanted
    ]
    return {
        "run_dir": str(run_dir),
        "protocol": plan.protocol,
        "alpha": plan.alpha,
        "delta": plan.delta,
        "n": plan.n,
        "steps": 0,
        "fault_free": True,
        "ldp": ldp_baseline(plan),
        "accounting": accounting_note(plan),
        "observers": out_obs,
        "complete": True,
        "integrity": [],
        "notes": [],
    }


def _schedule_factors(plan, steps, v: int, received, method: str, notes: list) -> np.ndarray:
    """Factors of one averaging run with a realised schedule."""
    if method == "paper":
        return acct.paper_factors(steps, v, received)
    try:
        return acct.exact_factors(steps, v, received)
    except acct.ExactTooLargeError:
        # Faulty schedule beyond exact arithmetic: a provable upper bound instead.
        notes.append(
            {
                "observer": v,
                "kind": "exact-upper-bound",
                "message": f"n={plan.n} with faults: 'exact' for observer {v} is a "
                "Krylov upper bound on the exact loss, not the exact value",
            }
        )
        return acct.exact_upper_factors(plan.W, steps, v, received)


def _realised_factors(plan, rp: Replay, v: int, method: str, notes: list) -> np.ndarray:
    """Observer v's factors for the schedule rebuilt from the logs, as plan_factors computes
    them fault-free: one run for averaging; for learning the joint view of every round
    ('exact') or Eq. (13) over the realised rounds ('paper'). (central-dp has no logs: see
    _central_audit.)"""
    received = sorted(rp.received[v])
    if isinstance(plan, rg.RandomizedPlan):
        exchanges = [
            (
                e.a,
                e.b,
                bool(rp.steps[e.t][0][e.a, e.b] != 0.0),
                bool(rp.steps[e.t][0][e.b, e.a] != 0.0),
            )
            for e in plan.edges
        ]
        return _pairwise_factors(plan, exchanges, v, received, method, notes)
    if not isinstance(plan, lp.LearningPlan):
        return _schedule_factors(plan, rp.steps, v, received, method, notes)
    R = plan.rounds
    if _ldp_for_every_pair(plan, method):
        return np.full(plan.n, float(R))
    K = plan.gossip_steps
    if method == "exact":
        schedule = [rp.steps[r * K : (r + 1) * K] for r in range(R)]
        rec = [(t // K, t % K, w) for t, w in received]
        try:
            return _joint(plan, v, schedule, rec).upper
        except (multiround.MultiRoundTooLarge, acct.NumericalRankError) as exc:
            notes.append(
                {
                    "observer": v,
                    "kind": "exact-is-ldp",
                    "message": f"the joint loss of observer {v}'s realised schedule is out of "
                    f"reach ({exc}); 'exact' reports R-fold local DP, a valid upper bound",
                }
            )
            return np.full(plan.n, float(R))
    total = np.zeros(plan.n)
    for r in range(R):
        steps = rp.steps[r * K : (r + 1) * K]
        rec = [(t - r * K, w) for t, w in received if r * K <= t < (r + 1) * K]
        total += acct.ldp_capped(acct.paper_factors(steps, v, rec))
    return total


# ----------------------------------------------------------------------------------- calibrate


def calibrate(cfg, target_eps: float, *, method: str, budget: str, make_plan) -> dict:
    """The smallest noise ``privacy.sigma`` whose (eps, delta) loss meets ``target_eps``, where
    the loss is that of the worst pair (``budget="worst"``: every pair is within the target) or
    of the mean over pairs (``budget="mean"``, the Muffliato paper's summary, not a guarantee).
    ``make_plan``: the family's plan maker (the plan depends on sigma through ``steps="auto"``).

    The loss factors depend on sigma only through the number of steps (``steps = "auto"``), so
    they are computed once per distinct schedule; eps is then decreasing in sigma and a
    bisection on log sigma finds the calibration to a relative 1e-9.
    """
    import dataclasses

    cache: dict[tuple, np.ndarray] = {}

    def at(sigma: float):
        c = dataclasses.replace(cfg, privacy=dataclasses.replace(cfg.privacy, sigma=sigma))
        plan = make_plan(c)
        key = (plan.steps, getattr(plan, "gossip_steps", None))
        if key not in cache:
            F = plan_factors(plan, method)
            # A paper formula above local DP is not a usable bound there: local DP is.
            cache[key] = np.minimum(F, ldp_factor(plan)) if method == "paper" else F
        f, u, v = budget_factor(cache[key], budget)
        return units_of(plan).loss(f)["eps"], plan, f, u, v

    hi = smallest_sigma(lambda sigma: at(sigma)[0], target_eps, cfg.sensitivity)
    eps, plan, f, u, v = at(hi)
    F = cache[(plan.steps, getattr(plan, "gossip_steps", None))]
    worst_f, wu, wv = budget_factor(F, "worst")
    mean_f = budget_factor(F, "mean")[0]
    units = units_of(plan)
    return {
        "protocol": cfg.protocol.name,
        "method": method,
        "budget": budget,
        "target_eps": target_eps,
        "delta": plan.delta,
        "sigma": hi,
        "sensitivity": plan.sensitivity,
        "steps": plan.steps,
        "eps": eps,
        "binding": (
            {"source": u, "observer": v, "factor": f, **units.loss(f)}
            if budget == "worst"
            else {"mean_over_pairs": True, "factor": f, **units.loss(f)}
        ),
        "worst_pair": {"source": wu, "observer": wv, "factor": worst_f, **units.loss(worst_f)},
        "mean_over_pairs": {"factor": mean_f, **units.loss(mean_f)},
        "ldp": ldp_baseline(plan),
        "accounting": accounting_note(plan),
    }
