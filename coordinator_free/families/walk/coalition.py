"""Colluding observers in the token protocols (ring and complete-graph sums and histograms, walk
SGD): the exact loss of every source outside a coalition conditional on the walk, when the
members pool everything they saw of the tokens and know every step any of them made.

The single-observer accountants of ``privacy.walk`` with the coalition in the observer's place:
the coalition's observations are the union of its members' (own steps and offers seen), which
cut each walk into windows; the steps made by members are known to it (their data and noise
subtracted). Plan: the ring's fixed walk; off the ring, the guarantee for every walk (the
local-DP loss of all of a source's contributions, each carrying its own noise). Audit: the walks
the logs show. A member whose
view the logs cannot tell puts every source at the worst case (the larger of the plan and the
local-DP loss of all its contributions); a damaged log anywhere floors each loss at the plan.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from coordinator_free.accounting.coalition import inconsistent, members_of, report
from coordinator_free.families.walk import accountant as wa
from coordinator_free.privacy import walk as acct


def _observations(walk: wa.RealisedWalk, members: list[int]) -> np.ndarray:
    return np.unique(np.concatenate([wa.observation_steps(walk, a) for a in members]))


def _every_step(walk: wa.RealisedWalk, members: list[int]) -> np.ndarray:
    return np.arange(walk.length + 1)


def losses(
    plan, walks: list[wa.RealisedWalk], members: list[int], observe=_observations
) -> list[dict]:
    """Per source, its ``exact`` loss entry (``factor``, ``rdp``, ``eps``) towards the coalition
    (``observe``: the steps it saw of a walk; :func:`_every_step` for a view of every value)."""
    if plan.kind == "histogram":
        per_u: list[list[tuple[int, int]]] = [[] for _ in range(plan.n)]
        for w in walks:
            win = acct.hist_windows(
                w.holders, w.data, observe(w, members), members, plan.n,
                init_items=plan.init_items, init_owner=plan.start(w.token),
            )  # fmt: skip
            for src in range(plan.n):
                per_u[src].extend(win[src])
        d_shuffle, d_prime = wa._hist_delta_split(plan.delta, max(1, max(len(x) for x in per_u)))
        out = []
        for src in range(plan.n):
            eps = 0.0
            if src not in members and per_u[src]:
                eps = acct.hist_eps(per_u[src], plan.eps0, d_shuffle, d_prime, levels=plan.levels)[
                    0
                ]
            out.append(wa.eps_only(eps))
        return out
    F = np.zeros(plan.n)
    for w in walks:
        obs = observe(w, members)
        if plan.kind == "sum":
            F += acct.sum_factors(
                w.holders, w.data, plan.noise_vars(w.length), obs, members, plan.n
            )
        else:
            F += acct.sgd_factors(w.holders, w.data, obs, members, plan.n)
    convert = wa.converter(plan)
    return [convert(float(x)).entry() for x in F]


def _report(cfg, plan, members, entries, notes) -> dict:
    rep = report(cfg, plan, members, None, entries=entries, ldp=wa.ldp_baseline(plan))
    rep["notes"] = notes
    return rep


def planned(cfg, plan, members) -> list[dict]:
    """The coalition's planned ``exact`` loss per source: on the ring, its view of the fixed
    walk; off the ring, the guarantee for every walk (:func:`wa.ldp_baseline`: every
    contribution carries its own noise, so no coalition sees more than each on its own)."""
    if plan.ring:
        return losses(plan, wa.sampled_walks(cfg, plan), members)
    g = wa._loss_entry(wa.ldp_baseline(plan, "exact"))
    return [dict(g) for _ in range(plan.n)]  # a member's own entry is never reported


def plan_report(cfg, plan, observers) -> dict:
    members = members_of(observers, plan.n)
    return _report(cfg, plan, members, planned(cfg, plan, members), [])


def _larger(a: dict, b: dict) -> dict:
    return a if a["eps"] >= b["eps"] else b


def audit_report(run_dir: Path, cfg, plan, observers) -> dict:
    members = members_of(observers, plan.n)
    integrity: list[dict] = []
    rp = wa.replay(run_dir, plan, integrity)
    notes: list[dict] = []
    unknown = [a for a in members if not wa._computable(rp, a)]
    entries = None
    if not unknown:
        prefixes = [wa._prefix(w, cut) for w, cut in zip(rp.walks, rp.certain, strict=True)]
        try:
            entries = losses(plan, prefixes, members)
        except ValueError as exc:  # logs that contradict each other: nothing to vouch for
            notes.append(inconsistent(exc, "the worst case"))
            unknown = members
    if unknown:
        # A single observer can learn at most the local-DP loss of all of a source's
        # contributions; a coalition can learn more (two ring neighbours isolate a contribution
        # added without noise), so the worst case also takes a view of every value of the
        # public walks, and the coalition's plan.
        worst = wa.worst_case_losses(cfg, plan, unknown)
        walks = wa.sampled_walks(cfg, plan)
        seen_all = losses(plan, walks, members, _every_step)
        plan_e = planned(cfg, plan, members)
        entries = []
        for src in range(plan.n):
            cands = [wa._loss_entry(worst[a][(src, "exact")]) for a in unknown if a != src]
            cands += [seen_all[src], plan_e[src]]
            entries.append(max(cands, key=lambda e: e["eps"]))
        basis = "worst-case"
        notes.append(
            {
                "kind": "member-view-unknown",
                "message": f"the logs cannot tell what member(s) {unknown} saw: every source is "
                "reported at the worst case (the largest of the plan, the local-DP loss of all "
                "its contributions and the loss to a view of every value of the walk)",
            }
        )
    else:
        basis = "logs"
        if integrity:
            plan_e = planned(cfg, plan, members)
            floored = [_larger(e, p) for e, p in zip(entries, plan_e, strict=True)]
            if any(f is not e for f, e in zip(floored, entries, strict=True)):
                basis = "logs, floored at the plan"
            entries = floored
    rep = _report(cfg, plan, members, entries, notes)
    rep.update(
        run_dir=str(run_dir),
        fault_free=rp.fault_free and not integrity,
        complete=not integrity,
        basis=basis,
        integrity=integrity,
    )
    return rep
