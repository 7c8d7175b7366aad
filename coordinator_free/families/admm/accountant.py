"""Planning and auditing decentralized private ADMM (``admm``), and the central guarantees of the
one-process baselines.

Units: a contribution of user i moves its block by at most ``4 lam gamma L`` under noise of std
``lam sigma``, a Gaussian ratio ``4 gamma L / sigma``: the plan's sensitivity is ``4 gamma L``
and one local-DP release (factor 1) is the RDP curve ``8 alpha gamma^2 L^2 / sigma^2``
(Theorem 8.9's local guarantee, E.8). Every loss is a factor of that unit, made into an eps by
``accounting/loss.py``.

* **local DP** (the baseline and the cap of every entry): user u's K_u contributions, each seen
  on its own: factor ``K_u`` (``privacy.admm.local_rdp``), at every order.
* ``paper``: Theorem 8.12's closed form, ``8 alpha K_u L^2 gamma^2 log n / (sigma^2 n)``
  (``privacy.admm.network_rdp_closed``), at the orders its condition ``sigma > 2 L gamma
  sqrt(alpha (alpha - 1))`` allows (``loss.theorem``), on the complete graph only.
* ``exact``: Theorem 8.12 computed as its proof does over the run's finite horizon
  (``privacy.admm.network_rdp``), same condition, same graph.

Every entry is the smaller of the theorem's and local DP's; where the theorem gives nothing (no
order allowed, or another graph than the complete one) the entry is local DP and says why.
K_u: the plan takes the binomial tail bound of a user's visits over the walk at delta/3 (the
walk is independent of the data; the view gets the rest of delta, 2 delta/3); the audit counts
each user's real contributions from the logs (a step no log tells counts for every user) and
never reports less than the plan.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from coordinator_free import graphs
from coordinator_free.accounting import loss, summary
from coordinator_free.accounting.core import AuditError, audit_head, smallest_sigma
from coordinator_free.families.admm import protocol as ap
from coordinator_free.privacy import walk as walk_acct

if TYPE_CHECKING:
    from coordinator_free.config import Config

METHODS = ("exact", "paper")


def _acct():
    from coordinator_free.privacy import admm

    return admm


def units_of(plan: ap.AdmmPlan) -> loss.Units:
    """The view's units: sensitivity 4 gamma L, and 2 delta/3 (delta/3 is spent on the count
    of contributions)."""
    return loss.Units(
        alpha=plan.alpha,
        delta=plan.delta * 2.0 / 3.0,
        sensitivity=4.0 * plan.gamma * plan.lipschitz,
        sigma=plan.sigma,
    )


def per_token_bound(plan: ap.AdmmPlan) -> int:
    """A user's contributions to one token: the exact binomial tail quantile of its visits
    (``Bin(hops, 1/n)`` on the complete graph) at delta / (3 tokens), so that every token's
    count holds together except with probability delta/3. Off the complete graph the walk's
    visits are not binomial: every step counts (the worst case)."""
    if not plan.complete_graph:
        return int(plan.hops)
    q = walk_acct.contribution_bound(plan.n, plan.hops, plan.delta / (3.0 * plan.tokens))[0]
    return int(math.ceil(q))


def contributions_bound(plan: ap.AdmmPlan) -> int:
    """A user's contributions over all tokens (the plan's K_u)."""
    return per_token_bound(plan) * plan.tokens


def alpha_max(plan: ap.AdmmPlan) -> float:
    """The orders Theorem 8.12 allows (its sigma condition ``sigma > 2 L gamma sqrt(alpha
    (alpha - 1))``)."""
    return float(_acct().alpha_max(plan.sigma, plan.lipschitz, plan.gamma))


def ldp_entry(plan: ap.AdmmPlan, K: int | None = None) -> dict:
    """Local DP of K contributions (default: the plan's bound): Theorem 8.9's local guarantee
    ``privacy.admm.local_rho`` (linear in alpha, every order), in units of one release."""
    K = contributions_bound(plan) if K is None else int(K)
    rho = _acct().local_rho(K, plan.lipschitz, plan.gamma, plan.sigma)
    f = rho / units_of(plan).ldp_rho
    return units_of(plan).rdp_bound(f).entry(contributions=K, delta_view=plan.delta * 2.0 / 3.0)


def _network_exact(plan: ap.AdmmPlan, contributions, visits) -> Callable[[float], float | None]:
    """Order -> Theorem 8.12 as its proof computes it, summed over the tokens:
    ``contributions[j]`` the source's contributions to token j (a count, placed where they cost
    most, or the step indices 1..hops from the logs), ``visits[j]`` the observer's sightings of
    token j (None: the geometric law of the complete graph)."""
    acct = _acct()

    def at(alpha: float) -> float | None:
        total = 0.0
        for c, vis in zip(contributions, visits, strict=True):
            r = acct.network_rdp(
                alpha, plan.n, c, plan.hops, plan.lipschitz, plan.gamma, plan.sigma,
                observer_visits=vis,
            )  # fmt: skip
            if r is None:
                return None
            total += r
        return total

    return at


def theorem_entry(
    plan: ap.AdmmPlan,
    method: str,
    ldp: dict,
    contributions: list | None = None,
    visits: list | None = None,
) -> dict:
    """One pair's entry, capped by local DP ``ldp``: ``exact``, Theorem 8.12 as its proof
    computes it (``contributions`` per token: counts or step indices; ``visits``: the observer's
    sightings per token, or None); ``paper``, the closed form as printed, for the source's total
    count. Local DP where the theorem gives nothing or is not below it (and why)."""
    why = None
    t = None
    if contributions is None:
        contributions = [per_token_bound(plan)] * plan.tokens
    if visits is None:
        visits = [None] * plan.tokens
    if not plan.complete_graph:
        why = "Theorem 8.12 is proved on the complete graph; this graph gets local DP"
    elif alpha_max(plan) <= 1.0 + 1e-9:
        why = (
            f"Theorem 8.12 needs sigma > 2 L gamma sqrt(alpha (alpha - 1)) for some alpha > 1; "
            f"sigma = {plan.sigma:g}, L = {plan.lipschitz:g} (the unit's), gamma = {plan.gamma:g} "
            "allow none"
        )
    else:
        amax = alpha_max(plan)
        units = units_of(plan)
        if method == "paper":
            K = int(sum(c if isinstance(c, int) else len(c) for c in contributions))
            rho = _acct().network_rho_closed(K, plan.lipschitz, plan.gamma, plan.sigma, plan.n)
            t = loss.theorem(units, rho / units.ldp_rho, amax, cap=ldp["eps"]).entry()
        else:
            at = _network_exact(plan, contributions, visits)
            t = loss.curve(units, at, amax, cap=ldp["eps"]).entry()
        if t["eps"] is None:
            why = "Theorem 8.12's condition fails at every usable order"
        elif t["eps"] >= ldp["eps"]:
            why = "Theorem 8.12 is not below local DP here"
    if why is None:
        label = "8.12, closed form as printed" if method == "paper" else "8.12, the proof's sum"
        return {**t, "theorem": label}
    out = {k: ldp[k] for k in loss.LOSS_KEYS if k in ldp}
    out["theorem"] = f"local DP ({why})"
    return out


def accounting_note(plan: ap.AdmmPlan, *, planned: bool) -> str:
    count = (
        "the binomial bound of a user's visits at delta/3"
        if planned
        else "each user's contributions counted in the logs, never below the plan"
    )
    level = "user level" if plan.unit == "user" else "record level"
    graph = (
        f"complete graph: Theorem 8.12 (network RDP, {level}) at the orders its sigma "
        "condition allows, capped by local DP"
        if plan.complete_graph
        else "not the complete graph: local DP only (Theorem 8.12 is proved on the complete graph)"
    )
    if plan.unit == "user":
        unit = (
            "privacy unit: one user's whole shard; one contribution moves x by at most "
            "2 gamma L, Gaussian ratio 4 gamma L / sigma"
        )
    else:
        unit = (
            f"privacy unit: one record of one user; one contribution moves x by at most "
            f"2 gamma L / m_min (m_min = {plan.min_shard} records in the smallest step's loss), "
            "Gaussian ratio 4 gamma L / (m_min sigma)"
        )
    return (
        f"{graph}; 'paper' is the closed form, 'exact' the proof's sum over the horizon; "
        f"K_u: {count}; {unit}; every record's loss is its convex L-Lipschitz surrogate (its "
        "derivative clamped), so the theorems' hypotheses hold exactly; the certified tolerance "
        "of the prox solves is added to the sensitivity"
    )


def plan_report(cfg: Config, plan: ap.AdmmPlan, *, source: int | None, method: str) -> dict:
    ldp = ldp_entry(plan)
    one = _planned(_key(plan), plan)[method]
    cells = {(v, u): one for v in range(plan.n) for u in range(plan.n) if u != v}
    base = {
        "alpha": plan.alpha,
        "delta": plan.delta,
        "method": method,
        "protocol": plan.protocol,
        "n": plan.n,
        "steps": plan.hops,
        "hops": plan.hops,
        "tokens": plan.tokens,
        "cap": 0,
        "accelerated": False,
        "spectral_gap": plan.spectral_gap,
        "sigma": plan.sigma,
        "sensitivity": units_of(plan).sensitivity,
        "unit": plan.unit,
        "min_shard": plan.min_shard,
        "gamma": plan.gamma,
        "lam": plan.lam,
        "clip": plan.clip,
        "complete_graph": plan.complete_graph,
        "alpha_max": alpha_max(plan) if plan.complete_graph else None,
        "ldp": ldp,
        "accounting": accounting_note(plan, planned=True),
    }
    dist = graphs.all_distances(plan.graph)
    if source is not None:
        if not 0 <= source < plan.n:
            raise AuditError(f"--source {source} is not a node id (0..{plan.n - 1})")
        losses = [
            {"observer": v, "distance": int(dist[v, source]), **cells[(v, source)]}
            for v in range(plan.n)
            if v != source
        ]
        return {**base, "source": source, "losses": losses}
    return {
        **base,
        "source": None,
        **summary.of_entries(cells, plan.n, dist, ldp["eps"], units_of(plan).rdp_bound),
        "contributions_bound": contributions_bound(plan),
    }


_PLANNED: dict[tuple, dict] = {}


def _planned(plan_key: tuple, plan: ap.AdmmPlan) -> dict:
    """The plan's entry of every pair by method (the same for every pair), remembered per public
    plan (a numerical theorem costs a fraction of a second)."""
    if plan_key not in _PLANNED:
        if len(_PLANNED) > 64:
            _PLANNED.clear()
        ldp = ldp_entry(plan)
        _PLANNED[plan_key] = {m: theorem_entry(plan, m, ldp) for m in METHODS}
    return {m: dict(x) for m, x in _PLANNED[plan_key].items()}


def _key(plan: ap.AdmmPlan) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in plan.public_params().items()))


def planned_losses(cfg: Config, plan: ap.AdmmPlan, observers) -> dict[int, dict]:
    per = _planned(_key(plan), plan)
    return {
        int(v): {(u, m): dict(per[m]) for u in range(plan.n) if u != v for m in METHODS}
        for v in observers
    }


def worst_case_losses(cfg: Config, plan: ap.AdmmPlan, observers) -> dict[int, dict]:
    """An observer about which nothing is known: local DP of every contribution of the source
    (each seen on its own: what seeing every token value could give), never below the plan."""
    ldp = ldp_entry(plan)
    return {
        v: {key: loss.at_least(x, ldp) for key, x in cells.items()}
        for v, cells in planned_losses(cfg, plan, observers).items()
    }


# ------------------------------------------------------------------------------ audit


def realised_contributions(plan: ap.AdmmPlan, walks) -> tuple[list[list[list[int]]], int]:
    """Per source, per token: the steps (1..hops, the theorem's indexing) at which the logs show
    the source holding the token; a step no log tells (or a step past the logged end of a walk)
    is counted as a contribution of every source. Returns (steps[u][j], unknown steps)."""
    steps = [[[] for _ in range(plan.tokens)] for _ in range(plan.n)]
    unknown = 0
    for w in walks:
        holders = np.full(plan.hops, -1, dtype=np.int64)
        holders[: min(w.length, plan.hops)] = w.holders[: plan.hops]
        for s, h in enumerate(holders.tolist()):
            if h < 0:
                unknown += 1
                for u in range(plan.n):
                    steps[u][w.token].append(s + 1)
            else:
                steps[h][w.token].append(s + 1)
    return steps, unknown


def audit_run(run_dir: Path, cfg: Config, plan: ap.AdmmPlan, observers=None) -> dict:
    """The losses of every observer from the walks the logs show: each source's contributions
    (their number K_u and their steps) counted in the logs, Theorem 8.12 computed for them, every
    entry raised to at least the plan's (the plan's count holds except with probability delta/3
    over the walk; an audit never reports less than the plan)."""
    from coordinator_free.families.walk import accountant as wa

    integrity: list[dict] = []
    rp = wa.replay(run_dir, plan, integrity)
    wanted = sorted(rp.logged) if observers is None else [int(v) for v in observers]
    steps, unknown = realised_contributions(plan, rp.walks)
    K = np.array([sum(len(x) for x in steps[u]) for u in range(plan.n)], dtype=np.int64)
    planned = planned_losses(cfg, plan, wanted)
    worst = worst_case_losses(cfg, plan, [v for v in wanted if v not in rp.logged])
    dist = graphs.all_distances(plan.graph)
    by_source = {}
    bound = per_token_bound(plan)
    for u in range(plan.n):
        ldp_u = ldp_entry(plan, int(K[u]))
        by_source[u] = {"paper": theorem_entry(plan, "paper", ldp_u, contributions=steps[u])}
        if all(len(x) <= bound for x in steps[u]):
            # At most the plan's count in every token: the plan places that many contributions
            # where they cost most (the last steps, before the final release), so the logs'
            # placement costs no more (tests/test_admm.py checks it): the plan's entry stands.
            by_source[u]["exact"] = None
        else:
            by_source[u]["exact"] = theorem_entry(plan, "exact", ldp_u, contributions=steps[u])
    out_obs = []
    for v in wanted:
        ref = planned[v] if v in rp.logged else worst[v]
        losses = []
        for u in range(plan.n):
            if u == v:
                continue
            for m in METHODS:
                floor = ref[(u, m)]
                real = by_source[u][m]
                if real is None:
                    x = dict(floor)
                    x["contributions"] = int(K[u])
                    x["within_plan_count"] = True
                    losses.append({"source": u, "method": m, "distance": int(dist[v, u]), **x})
                    continue
                # The plan's entry whole where it is larger (its conversion, order and cap
                # with it), else the logs' figure.
                raised = not real["eps"] >= floor["eps"]
                x = dict(floor) if raised else dict(real)
                x["contributions"] = int(K[u])
                if raised:
                    x["from_logs"] = {k: real.get(k) for k in loss.LOSS_KEYS if k in real}
                losses.append({"source": u, "method": m, "distance": int(dist[v, u]), **x})
        basis = "realised walk" if v in rp.logged else "worst case"
        out_obs.append({"observer": v, "basis": basis, "losses": losses})
    walks_out = []
    for w, cut in zip(rp.walks, rp.certain, strict=True):
        known = w.holders >= 0
        walks_out.append(
            {
                "token": w.token,
                "length": w.length,
                "end": w.end,
                "contributions": np.bincount(w.holders[known], minlength=plan.n).tolist(),
                "unknown_steps": int((~known).sum()),
                "certain_steps": int(cut),
            }
        )
    plan_K = contributions_bound(plan)
    return {
        **audit_head(
            run_dir,
            plan.protocol,
            plan,
            steps=plan.hops,
            fault_free=rp.fault_free and not integrity,
        ),
        "ldp": ldp_entry(plan, max(plan_K, int(K.max()) if K.size else 0)),
        "accounting": accounting_note(plan, planned=False),
        "contributions": {
            "counted": K.tolist(),
            "unknown_steps": unknown,
            "plan_bound": plan_K,
            "above_plan": [int(u) for u in np.flatnonzero(plan_K < K)],
        },
        "walks": walks_out,
        "observers": out_obs,
        "complete": not integrity,
        "integrity": integrity,
        "worst_case": [],
        "notes": [],
    }


# ------------------------------------------------------------------------------ calibration


def calibrate(cfg: Config, target_eps: float, *, method: str, budget: str) -> dict:
    """The smallest ``privacy.sigma`` whose planned loss meets ``target_eps`` (every pair has
    the same planned loss: worst pair and mean over pairs agree). Bisection on log sigma."""
    plan = ap.make_plan(cfg)
    if not target_eps > 0 or not math.isfinite(target_eps):
        raise AuditError(f"--target-eps must be a positive number, got {target_eps}")

    def at(sigma: float):
        p = dataclasses.replace(plan, sigma=sigma)
        ldp = ldp_entry(p)
        e = theorem_entry(p, method, ldp)
        return e, ldp

    sens = units_of(plan).sensitivity
    hi = smallest_sigma(lambda s: at(s)[0]["eps"], target_eps, sens)
    e, ldp = at(hi)
    return {
        "protocol": plan.protocol,
        "method": method,
        "budget": budget,
        "target_eps": target_eps,
        "delta": plan.delta,
        "sigma": hi,
        "sensitivity": sens,
        "steps": plan.hops,
        "eps": e["eps"],
        "binding": {**e, "source": 0, "observer": 1 % plan.n},
        "worst_pair": {**e, "source": 0, "observer": 1 % plan.n},
        "mean_over_pairs": dict(e),
        "ldp": ldp,
        "accounting": accounting_note(plan, planned=True),
    }
