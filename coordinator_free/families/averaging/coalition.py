"""Colluding observers in Muffliato averaging: the exact loss of every source outside a coalition
towards the coalition's joint view (its members pool their own inputs and everything they
received), planned from the public parameters (``cfree plan --observers``) or audited from the
members' view logs (``cfree audit --observers``).

The joint view is the span of the members' coordinates and of every row ``C_t[x, :]`` a member
received; fault-free on a fixed graph that is the block Krylov space ``K_T(W, [e_A, e_N(A)])``
(``privacy.muffliato.coalition_factors``); for a realised schedule with faults, or the public
dropout schedule, the same rows reduced exactly (``coalition_exact_factors``), with a Krylov upper
bound beyond the exact arithmetic's reach. One member gives the single-observer loss.

Never under-reports: a member without a usable log leaves the coalition's view unknown, and every
source is then reported at local DP (the most any view reveals); with damaged logs the audit is
floored at the plan.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from coordinator_free.accounting import gossip
from coordinator_free.accounting.coalition import audited, inconsistent, members_of, report
from coordinator_free.accounting.core import AuditError
from coordinator_free.families.averaging import accountant as averaging_views
from coordinator_free.families.averaging import protocol as mf
from coordinator_free.privacy import muffliato as acct


def _check_plan(plan) -> None:
    if not isinstance(plan, mf.MuffliatoPlan):
        raise AuditError(
            "coalitions are accounted for Muffliato averaging (protocol muffliato) so far"
        )


def _ambiguous(plan, members, notes: list) -> np.ndarray:
    """The fault-free joint view's factors with a direction float64 cannot size kept (past
    exact arithmetic): the span only grows, so an upper bound, and a note that says so."""
    notes.append(
        {
            "kind": "exact-upper-bound",
            "message": "a new direction of the coalition's view fell in the band where float64 "
            "cannot tell a real direction from roundoff, and was kept: its 'exact' loss is an "
            "upper bound on the exact value",
        }
    )
    return acct.coalition_factors(plan.W, plan.steps, members, strict=False)


def _schedule_factors(plan, steps, members, received, notes: list) -> np.ndarray:
    try:
        try:
            return acct.coalition_exact_factors(steps, members, received)
        except acct.NumericalRankError:  # fault-free, past exact arithmetic
            return _ambiguous(plan, members, notes)
        except acct.ExactTooLargeError:
            notes.append(
                {
                    "kind": "exact-upper-bound",
                    "message": f"n={plan.n} with faults: the coalition's 'exact' loss is a "
                    "Krylov upper bound on the exact value",
                }
            )
            return acct.coalition_upper_factors(plan.W, steps, members, received, strict=False)
    except ValueError as exc:  # logs that contradict each other: nothing to vouch for
        notes.append(inconsistent(exc, "local DP"))
        return np.ones(plan.n)


def fault_free_factors(plan, members: list[int], notes: list) -> np.ndarray:
    """The coalition's exact factors on the fault-free schedule of ``plan.W``. A rank decision
    float64 cannot make goes to exact arithmetic up to ``RATIONAL_MAX_NODES`` nodes; beyond,
    or past that arithmetic's budget, the direction is kept (an upper bound, noted)."""
    try:
        return acct.coalition_factors(plan.W, plan.steps, members)
    except acct.NumericalRankError:
        if plan.n > acct.RATIONAL_MAX_NODES:
            return _ambiguous(plan, members, notes)
    # Exact arithmetic decides (the fault-free schedule, as every member hears it).
    w = np.asarray(plan.W, dtype=np.float64)
    heard = {a: acct.fault_free_received(w, a, plan.steps) for a in members}
    try:
        return acct.coalition_exact_factors(
            acct.fault_free_steps(w, plan.steps, False), members, heard, float_first=False
        )
    except acct.ExactTooLargeError:  # coefficients past exact arithmetic's budget
        return _ambiguous(plan, members, notes)


def plan_factors(plan, members: list[int], notes: list | None = None) -> np.ndarray:
    """The coalition's exact factors under the fault-free plan (with public dropout: the
    planned schedule)."""
    _check_plan(plan)
    if not getattr(plan, "dropped", ()):
        return fault_free_factors(plan, members, notes if notes is not None else [])
    received = {
        a: [(t, w) for t in range(plan.steps) for w in plan.partners_at(a, t)] for a in members
    }
    return _schedule_factors(
        plan,
        averaging_views.planned_schedule(plan),
        members,
        received,
        notes if notes is not None else [],
    )


def plan_report(cfg, plan, observers) -> dict:
    """``cfree plan --observers``: one row per source outside the coalition, ``{"observers",
    "source", "distance", "factor", "rdp", "eps"}`` with factor the loss over local DP."""
    _check_plan(plan)
    members = members_of(observers, plan.n)
    notes: list = []
    rep = report(cfg, plan, members, plan_factors(plan, members, notes))
    rep["notes"] = notes
    return rep


def audit_report(run_dir: Path, cfg, plan, observers) -> dict:
    """``cfree audit --observers``: the coalition's loss for the schedule its members' logs
    show (the plan's when the run was fault-free)."""
    _check_plan(plan)
    members = members_of(observers, plan.n)
    rp = gossip.replay(run_dir, plan, averaging_views.VIEWS)
    notes: list = []
    received = {a: sorted(rp.received[a]) for a in members if a in rp.logged}
    f, fields = audited(
        plan.n,
        members,
        run_dir,
        rp,
        lambda notes: _schedule_factors(plan, rp.steps, members, received, notes),
        lambda: plan_factors(plan, members, notes),
        1.0,
        "local DP, the most any view reveals",
        notes,
    )
    rep = report(cfg, plan, members, f)
    rep.update(fields)
    return rep
