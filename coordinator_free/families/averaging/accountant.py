"""What an observer of Muffliato averaging sees, for the gossip accountant
(:mod:`coordinator_free.accounting.gossip`): one noisy value per node, then T gossip steps, so an
observer's view is linear in the noisy values with Gaussian noise. ``exact`` is the divergence
of that whole view (the projection onto the span of the noise coefficients it observed),
``paper`` Eq. (6) of the Muffliato paper over the messages it received.

With public dropout (``--fault dropout:P``) the planned schedule is known to all, and the plan
computes each observer's loss for it as the audit does for a realised one.
"""

from __future__ import annotations

import numpy as np

from coordinator_free import graphs
from coordinator_free.accounting import gossip
from coordinator_free.accounting.core import METHODS
from coordinator_free.privacy import muffliato as acct


class AveragingViews(gossip.Views):
    def plan_factors(self, plan, method: str, *, sources=None, observers=None) -> np.ndarray:
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
        if getattr(plan, "dropped", ()):
            return _dropout_plan_factors(plan, method, sources, observers)
        return acct.plan_factors(
            plan.W,
            plan.steps,
            plan.accelerated,
            method=method,
            observers=observers,
            sources=sources,
            gamma=plan.gamma if plan.accelerated else None,  # the plan's, not recomputed
        )

    def realised_factors(self, plan, rp: gossip.Replay, v: int, method: str, notes: list):
        return schedule_factors(plan, rp.steps, v, sorted(rp.received[v]), method, notes)


VIEWS = AveragingViews()
plan_factors = VIEWS.plan_factors


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
                row = graphs.realised_row(plan.row(v), v, set(plan.partners_at(v, t)))
                for w, wt in row.items():
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
        rows.append(schedule_factors(plan, steps, v, received, method, [])[src])
    return np.stack(rows)


def schedule_factors(plan, steps, v: int, received, method: str, notes: list) -> np.ndarray:
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
