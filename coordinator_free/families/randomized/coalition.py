"""Colluding observers in randomized gossip: the exact loss of every source outside a coalition
towards the members' pooled view (their own inputs and every value any of them received in an
exchange), for the public exchange sequence (plan) or the exchanges the logs show (audit).

Exact arithmetic up to 64 nodes (``privacy.pairwise.coalition_exact_factors``); beyond, the
structural bound: 1 for every source whose input reached a value a member saw."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from coordinator_free.accounting import gossip
from coordinator_free.accounting.coalition import audited, inconsistent, members_of, report
from coordinator_free.families.randomized import accountant as randomized_views
from coordinator_free.families.randomized import protocol as rg
from coordinator_free.privacy import muffliato as acct
from coordinator_free.privacy import pairwise as pw


def _factors(plan, exchanges, members, received, notes: list) -> np.ndarray:
    try:
        try:
            return pw.coalition_exact_factors(plan.n, exchanges, members, received)
        except acct.ExactTooLargeError as exc:
            notes.append(
                {
                    "kind": "exact-structural-bound",
                    "message": f"{exc}: 1 for every source whose input reached a value a member "
                    "saw, an upper bound",
                }
            )
            return pw.coalition_structural_factors(plan.n, exchanges, members, received)
    except ValueError as exc:  # logs that contradict each other: nothing to vouch for
        notes.append(inconsistent(exc, "local DP"))
        return np.ones(plan.n)


def plan_factors(plan, members: list[int], notes: list) -> np.ndarray:
    exchanges = [(e.a, e.b, True, True) for e in plan.edges]
    received = {a: rg.fault_free_received(plan, a) for a in members}
    return _factors(plan, exchanges, members, received, notes)


def plan_report(cfg, plan, observers) -> dict:
    members = members_of(observers, plan.n)
    notes: list = []
    rep = report(cfg, plan, members, plan_factors(plan, members, notes))
    rep["notes"] = notes
    return rep


def audit_report(run_dir: Path, cfg, plan, observers) -> dict:
    """The same for the exchanges the logs show; a member without a usable log puts every source
    at local DP, and a damaged log anywhere floors each loss at the plan."""
    members = members_of(observers, plan.n)
    rp = gossip.replay(run_dir, plan, randomized_views.VIEWS)
    notes: list = []
    exchanges = [
        (e.a, e.b, bool(rp.steps[e.t][0][e.a, e.b] != 0.0), bool(rp.steps[e.t][0][e.b, e.a] != 0.0))
        for e in plan.edges
    ]  # fmt: skip
    received = {a: sorted(rp.received[a]) for a in members if a in rp.logged}
    f, fields = audited(
        plan.n,
        members,
        run_dir,
        rp,
        lambda notes: _factors(plan, exchanges, members, received, notes),
        lambda: plan_factors(plan, members, notes),
        1.0,
        "local DP",
        notes,
    )
    rep = report(cfg, plan, members, f)
    rep.update(fields)
    return rep
