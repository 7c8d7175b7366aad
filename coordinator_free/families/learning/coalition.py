"""Colluding observers in the learning protocols over gossip (Muffliato-GD/SGD, D-SGD): the joint
loss over all rounds of every source outside a coalition towards the members' pooled view (their
own gradients and every model any of them received), planned or audited from the members' logs.

The same linear-Gaussian model as the single-observer joint accountant
(``privacy.multiround``), with the members' coordinates dropped, computed exactly
(``coalition_joint_factors``). Beyond exact arithmetic's reach (more than 64 nodes, or
coefficients too large) every source is reported at R-fold local DP, a valid upper bound, with
a note. The central-DP curator releases its model to everyone: every source loses R-fold
local DP to any coalition.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from coordinator_free.accounting import gossip
from coordinator_free.accounting.coalition import audited, inconsistent, members_of, report
from coordinator_free.families.learning import accountant as learning_views
from coordinator_free.privacy import multiround


def _bound(plan, members, schedule, received, notes: list) -> np.ndarray:
    R = float(plan.rounds)
    if not plan.decentralized:
        return np.full(plan.n, R)
    try:
        return multiround.coalition_joint_factors(
            plan.W,
            plan.rounds,
            plan.gossip_steps,
            plan.accelerated,
            members,
            gamma=plan.gamma if plan.accelerated else None,
            schedule=schedule,
            received=received,
        ).upper
    except multiround.MultiRoundTooLarge as exc:
        notes.append(
            {
                "kind": "exact-is-ldp",
                "message": f"the coalition's joint loss is out of exact reach ({exc}); every "
                "source is reported at R-fold local DP, a valid upper bound",
            }
        )
        return np.full(plan.n, R)
    except ValueError as exc:  # logs that contradict each other: nothing to vouch for
        notes.append(inconsistent(exc, "R-fold local DP"))
        return np.full(plan.n, R)


def plan_factors(plan, members: list[int], notes: list) -> np.ndarray:
    """The coalition's fault-free joint factors (time-varying graphs: each round's own; secret
    graphs before the run: R-fold local DP, what holds for any graphs)."""
    if plan.secret and not plan.round_graphs:
        return np.full(plan.n, float(plan.rounds))
    if not plan.time_varying:
        return _bound(plan, members, None, None, notes)
    K = plan.gossip_steps
    schedule = [
        [(plan.round_matrix(r), plan.gamma_at(r * K + k)) for k in range(K)]
        for r in range(plan.rounds)
    ]
    received = {
        a: [(r, k, w) for r in range(plan.rounds) for k in range(K) for w in plan.partners_at(a, r * K)]
        for a in members
    }  # fmt: skip
    return _bound(plan, members, schedule, received, notes)


def _report(cfg, plan, members, f, notes) -> dict:
    rep = report(cfg, plan, members, f, ldp_factor=float(plan.rounds))
    rep.update(rounds=plan.rounds, gossip_steps=plan.gossip_steps, notes=notes)
    if not plan.decentralized:
        rep["central"] = True
    return rep


def plan_report(cfg, plan, observers) -> dict:
    members = members_of(observers, plan.n)
    notes: list = []
    return _report(cfg, plan, members, plan_factors(plan, members, notes), notes)


def audit_report(run_dir: Path, cfg, plan, observers) -> dict:
    """The same for the schedule the logs show; a member without a usable log puts every
    source at R-fold local DP, and a damaged log anywhere floors each loss at the plan."""
    members = members_of(observers, plan.n)
    notes: list = []
    if not plan.decentralized:  # no peers, no logs: the released model is seen by everyone
        rep = _report(cfg, plan, members, plan_factors(plan, members, notes), notes)
        rep.update(run_dir=str(run_dir), fault_free=True, complete=True, basis="plan", integrity=[])
        return rep
    rp = gossip.replay(run_dir, plan, learning_views.VIEWS)
    seen = rp.plan  # hidden graphs: as the logs show them
    K = plan.gossip_steps
    schedule = [rp.steps[r * K : (r + 1) * K] for r in range(plan.rounds)]
    received = {
        a: [(t // K, t % K, w) for t, w in sorted(rp.received[a])]
        for a in members
        if a in rp.logged
    }
    f, fields = audited(
        plan.n,
        members,
        run_dir,
        rp,
        lambda notes: _bound(seen, members, schedule, received, notes),
        lambda: plan_factors(plan, members, notes),
        float(plan.rounds),
        "R-fold local DP",
        notes,
    )
    rep = _report(cfg, plan, members, f, notes)
    rep.update(fields)
    return rep
