"""What an observer of randomized gossip sees, for the gossip accountant
(:mod:`coordinator_free.accounting.gossip`): the public exchange sequence, each exchange
``W_t = I - (e_a - e_b)(e_a - e_b)^T / 2`` (or the identity row for an end that missed its
partner), and the messages of the exchanges the observer took part in. ``paper`` is Corollary 2
of the Muffliato paper (Eq. (6) over those exchanges), ``exact`` the divergence of the whole
view (exact arithmetic up to ``RATIONAL_MAX_NODES`` nodes, the structural bound beyond)."""

from __future__ import annotations

import numpy as np

from coordinator_free.accounting import gossip
from coordinator_free.accounting.core import METHODS
from coordinator_free.families.randomized import protocol as rg
from coordinator_free.privacy import muffliato as acct
from coordinator_free.privacy import pairwise as pw


class RandomizedViews(gossip.Views):
    def note(self, plan) -> str:
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

    def report_fields(self, plan) -> dict:
        tv = plan.exchange_counts()
        return {
            "clock_rate": plan.rate,
            "exchanges_per_node": {
                "min": int(tv.min()),
                "mean": float(tv.mean()),
                "max": int(tv.max()),
            },
            # Corollary 2's mean bound: (1/n) sum_u f(u, v) <= LDP * T_v / n, for the busiest v.
            "cor2_mean_factor_max": float(tv.max()) / plan.n,
        }

    def plan_factors(
        self, plan, method: str, *, sources=None, observers=None, bounds=None
    ) -> np.ndarray:
        """Fault-free: the public exchange sequence, each observer's messages."""
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
        exchanges = [(e.a, e.b, True, True) for e in plan.edges]
        obs = range(plan.n) if observers is None else observers
        src = slice(None) if sources is None else list(sources)
        return np.stack(
            [
                pairwise_factors(plan, exchanges, v, rg.fault_free_received(plan, v), method, [])[
                    src
                ]
                for v in obs
            ]
        )

    def realised_factors(self, plan, rp: gossip.Replay, v: int, method: str, notes: list):
        exchanges = [
            (
                e.a,
                e.b,
                bool(rp.steps[e.t][0][e.a, e.b] != 0.0),
                bool(rp.steps[e.t][0][e.b, e.a] != 0.0),
            )
            for e in plan.edges
        ]
        return pairwise_factors(plan, exchanges, v, sorted(rp.received[v]), method, notes)


VIEWS = RandomizedViews()
plan_factors = VIEWS.plan_factors


def pairwise_factors(plan, exchanges, v: int, received, method: str, notes: list) -> np.ndarray:
    """Corollary 2 ('paper') or the exact loss, exact arithmetic up to RATIONAL_MAX_NODES
    nodes; beyond, the structural bound (1 for every source that reached v)."""
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
