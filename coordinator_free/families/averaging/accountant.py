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
    def plan_factors(
        self, plan, method: str, *, sources=None, observers=None, bounds=None
    ) -> np.ndarray:
        """Given ``bounds`` (every caller of the accountant gives one), the exact rows resolve
        a rank decision float64 cannot make (exact rational arithmetic up to
        ``RATIONAL_MAX_NODES`` nodes, else the direction kept: an upper bound, its observer
        appended to ``bounds``); without it such a row raises ``NumericalRankError``, so that
        no caller can show a bound unmarked."""
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
        if getattr(plan, "dropped", ()):
            return _dropout_plan_factors(plan, method, sources, observers, bounds)
        return acct.plan_factors(
            plan.W,
            plan.steps,
            plan.accelerated,
            method=method,
            observers=observers,
            sources=sources,
            gamma=plan.gamma if plan.accelerated else None,  # the plan's, not recomputed
            bounds=bounds,
        )

    def realised_factors(self, plan, rp: gossip.Replay, v: int, method: str, notes: list):
        return _schedule_of(plan, rp).factors(v, method, notes)

    def prepare(self, plan, rp: gossip.Replay, observers: list[int]) -> None:
        _schedule_of(plan, rp).prepare(observers)


def _schedule_of(plan, rp: gossip.Replay) -> Schedule:
    work = rp.shared.get("schedule")
    if work is None:
        received = {u: sorted(got) for u, got in rp.received.items()}
        work = rp.shared["schedule"] = Schedule(plan, rp.steps, received)
    return work


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


def _dropout_plan_factors(plan, method: str, sources, observers, bounds=None) -> np.ndarray:
    """Muffliato with public dropout: each observer's loss for the planned schedule (who sits
    out when is known to all), as the audit computes it for a realised one; an observer whose
    row is an upper bound (its notes say so) is appended to ``bounds``."""
    steps = planned_schedule(plan)
    obs = range(plan.n) if observers is None else observers
    src = slice(None) if sources is None else list(sources)
    received = {v: [(t, w) for t in range(plan.steps) for w in plan.partners_at(v, t)] for v in obs}
    work = Schedule(plan, steps, received)
    if method == "exact":
        work.prepare(list(obs))
    rows = []
    for v in obs:
        notes: list = []
        rows.append(work.factors(v, method, notes)[src])
        if bounds is not None and any(n.get("kind") == "exact-upper-bound" for n in notes):
            bounds.append(v)
    return np.stack(rows)


class Schedule:
    """One realised (or planned) schedule with what its observers saw (observer -> its
    messages), and the work they share, done once for all of them: every ``C_t`` (Eq. (6) of
    every observer in one sweep) and the span of the schedule's fault rows (the Krylov upper
    bound beyond exact arithmetic). Repeating both for each observer took most of the 31 s of
    auditing a 256-node run with 1% of its messages dropped (docs/benchmarks.md)."""

    def __init__(self, plan, steps, received: dict[int, list[tuple[int, int]]]):
        self.plan, self.steps, self.received = plan, steps, received
        self._paper: dict[int, np.ndarray] | None = None
        self._span: np.ndarray | None = None
        # From prepare(): observer -> (its exact row, whether that row is the upper bound).
        self._exact: dict[int, tuple[np.ndarray, bool]] = {}

    def factors(self, v: int, method: str, notes: list) -> np.ndarray:
        if method == "paper":
            if self._paper is None:
                self._paper = acct.paper_factors_many(self.steps, self.received)
            return self._paper[v]
        if v in self._exact:
            row, upper = self._exact[v]
        else:
            row, upper = self._exact_row(v)
        if upper == _AMBIGUOUS:
            notes.append(gossip.ambiguous_note(v))
        elif upper:
            notes.append(
                {
                    "observer": v,
                    "kind": "exact-upper-bound",
                    "message": f"'exact' for observer {v} is an upper bound on the exact loss, "
                    f"not the exact value: n={self.plan.n}, a schedule beyond exact arithmetic "
                    "(faults, or a fault-free one whose coefficients outgrow it): a Krylov upper "
                    "bound",
                }
            )
        return row

    def _exact_row(self, v: int) -> tuple[np.ndarray, int]:
        """Observer v's exact row, and 0 (exact), ``_KRYLOV`` or ``_AMBIGUOUS`` (an upper
        bound, and why)."""
        try:
            return acct.exact_factors(self.steps, v, self.received[v]), 0
        except acct.NumericalRankError:
            # Past exact arithmetic: the ambiguous directions kept, never below the exact row.
            row = acct.exact_factors(self.steps, v, self.received[v], strict=False)
            return row, _AMBIGUOUS
        except acct.ExactTooLargeError:
            # Faulty schedule beyond exact arithmetic: a provable upper bound instead (a
            # direction float64 cannot size is kept there: the span, and the bound, only grow).
            if self._span is None:
                self._span = acct.fault_span(self.plan.W, self.steps, strict=False)
            upper = acct.exact_upper_factors(
                self.plan.W, self.steps, v, self.received[v], span=self._span, strict=False
            )
            return upper, _KRYLOV

    def prepare(self, observers: list[int]) -> None:
        """Every observer's exact row ahead of :meth:`factors`, past exact arithmetic (where each
        is a Lanczos basis of its own): in forked children, one per core
        (:mod:`coordinator_free.forkwork`), tasks of a few observers, the rows and whether each
        is the upper bound in shared memory. A task a child did not finish runs here."""
        todo = [v for v in observers if v not in self._exact]
        if self.plan.n <= acct.RATIONAL_MAX_NODES or len(todo) < 2:
            return
        from coordinator_free import forkwork

        if self._span is None:  # once, before the fork: every child needs it
            self._span = acct.fault_span(self.plan.W, self.steps, strict=False)
        rows = forkwork.shared_array((len(todo), self.plan.n))
        upper = forkwork.shared_array((len(todo),))
        tasks = forkwork.chunks(len(todo), _PREPARE_TASK)

        def task(i: int) -> None:
            for j in tasks[i]:
                row, up = self._exact_row(todo[j])
                rows[j], upper[j] = row, float(up)

        done = forkwork.ticks([len(t) for t in tasks], "exact loss, observer")
        forkwork.fill_numeric(task, len(tasks), done=done)
        for j, v in enumerate(todo):
            self._exact[v] = (np.array(rows[j]), int(upper[j]))


#: Observers per task of :meth:`Schedule.prepare`.
_PREPARE_TASK = 8
#: Why an exact row of :meth:`Schedule._exact_row` is an upper bound: a faulty schedule past
#: exact arithmetic (the Krylov bound), or a rank decision float64 cannot make (kept).
_KRYLOV, _AMBIGUOUS = 1, 2
