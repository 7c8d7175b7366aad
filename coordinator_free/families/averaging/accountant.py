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
        work = rp.shared.get("schedule")
        if work is None:
            received = {u: sorted(got) for u, got in rp.received.items()}
            work = rp.shared["schedule"] = Schedule(plan, rp.steps, received)
        return work.factors(v, method, notes)


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
    received = {v: [(t, w) for t in range(plan.steps) for w in plan.partners_at(v, t)] for v in obs}
    work = Schedule(plan, steps, received)
    return np.stack([work.factors(v, method, [])[src] for v in obs])


class Schedule:
    """One realised (or planned) schedule with what its observers saw (observer -> its
    messages), and the work they share, done once for all of them: every ``C_t`` (Eq. (6) of
    every observer in one sweep) and the span of the schedule's fault rows (the Krylov upper
    bound beyond exact arithmetic). At n = 256 with faults, repeating both for each observer
    took most of an audit's minute and a half (docs/benchmarks.md)."""

    def __init__(self, plan, steps, received: dict[int, list[tuple[int, int]]]):
        self.plan, self.steps, self.received = plan, steps, received
        self._paper: dict[int, np.ndarray] | None = None
        self._span: np.ndarray | None = None

    def factors(self, v: int, method: str, notes: list) -> np.ndarray:
        if method == "paper":
            if self._paper is None:
                self._paper = acct.paper_factors_many(self.steps, self.received)
            return self._paper[v]
        try:
            return acct.exact_factors(self.steps, v, self.received[v])
        except acct.ExactTooLargeError:
            # Faulty schedule beyond exact arithmetic: a provable upper bound instead.
            notes.append(
                {
                    "observer": v,
                    "kind": "exact-upper-bound",
                    "message": f"n={self.plan.n} with faults: 'exact' for observer {v} is a "
                    "Krylov upper bound on the exact loss, not the exact value",
                }
            )
            if self._span is None:
                self._span = acct.fault_span(self.plan.W, self.steps)
            return acct.exact_upper_factors(self.plan.W, self.steps, v, self.received[v],
                                            span=self._span)  # fmt: skip
