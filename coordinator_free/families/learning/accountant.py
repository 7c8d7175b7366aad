"""What an observer of the learning protocols sees, for the gossip accountant
(:mod:`coordinator_free.accounting.gossip`): R rounds of a local noisy gradient step followed by
K gossip steps (Muffliato-GD/SGD, D-SGD), with the gradients as the private inputs, as in the
paper; the central-DP curator releases its model every round to everyone.

* ``exact``: the joint view of all R rounds (:mod:`coordinator_free.privacy.multiround`), a
  certified upper bound over the worst per-round change of the source's gradient, which counts
  a gradient travelling on through the models in later rounds; R-fold local DP where the joint
  computation is out of reach.
* ``paper``: Eq. (13) of the Muffliato paper (per round, capped at local DP, summed over
  rounds); D-SGD's own guarantee, R-fold local DP; on secret graphs Theorem 4/9.
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from coordinator_free.accounting import gossip, loss
from coordinator_free.accounting.core import METHODS, Units, argmax_tied, units_of
from coordinator_free.families.learning import secret
from coordinator_free.privacy import muffliato as acct
from coordinator_free.privacy import multiround, private_graph


class LearningViews(gossip.Views):
    def ldp_factor(self, plan) -> float:
        return float(plan.rounds)

    def central(self, plan) -> bool:
        return not plan.decentralized

    def note(self, plan) -> str:
        return accounting_note(plan)

    def report_fields(self, plan) -> dict:
        out = {"rounds": plan.rounds, "gossip_steps": plan.gossip_steps}
        if plan.time_varying:
            out["private_graph_bound"] = private_graph_report(plan, units_of(plan))
        return out

    def bind(self, plan, logs: dict):
        if plan.secret and not plan.round_graphs:
            return secret.bind_logged(plan, logs)  # hidden graphs: as the logs show them
        return plan, []

    def plan_factors(
        self, plan, method: str, *, sources=None, observers=None, bounds=None
    ) -> np.ndarray:
        """Fault-free factors ``F[i, j]`` of source ``sources[j]`` towards ``observers[i]``,
        summed over rounds."""
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
        if plan.secret and not plan.round_graphs:
            return _secret_plan_factors(plan, method, sources, observers)
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

    def realised_factors(self, plan, rp: gossip.Replay, v: int, method: str, notes: list):
        """Observer v's factors for the schedule rebuilt from the logs: the joint view of every
        round ('exact') or Eq. (13) over the realised rounds ('paper')."""
        received = sorted(rp.received[v])
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
                        "message": f"the joint loss of observer {v}'s realised schedule is out "
                        f"of reach ({exc}); 'exact' reports R-fold local DP, a valid upper bound",
                    }
                )
                return np.full(plan.n, float(R))
        every = rp.shared.get("paper")
        if every is None:
            every = rp.shared["paper"] = _realised_paper(plan, rp)
        return every[v]


def _realised_paper(plan, rp: gossip.Replay) -> dict[int, np.ndarray]:
    """Eq. (13) over the realised rounds for every observer of the logs: each round's ``C_t``
    computed once for all of them (:func:`acct.paper_factors_many`), not once per observer."""
    R, K = plan.rounds, plan.gossip_steps
    # The received values by round, in one pass (scanning every value for every round was
    # quadratic in R: most of the time of auditing a long run).
    by_round: list[dict[int, list[tuple[int, int]]]] = [{} for _ in range(R)]
    for v, got in rp.received.items():
        for r in range(R):
            by_round[r][v] = []
        for t, w in sorted(got):
            if 0 <= t < R * K:
                by_round[t // K][v].append((t % K, w))
    total = {v: np.zeros(plan.n) for v in rp.received}
    for r in range(R):
        steps = rp.steps[r * K : (r + 1) * K]
        for v, f in acct.paper_factors_many(steps, by_round[r]).items():
            total[v] += acct.ldp_capped(f)
    return total


VIEWS = LearningViews()
plan_factors = VIEWS.plan_factors


def accounting_note(plan) -> str:
    """What the per-pair numbers of a learning protocol mean (plan and audit)."""
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
            "sigma allows, is reported apart as 'expected'. The audit reads the graphs from the "
            "logs and gives, for both methods, the "
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


# ---------------------------------------------------------------- private (secret) graph bound


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


def private_graph_report(plan, u: Units) -> dict:
    """Theorem 4/9 of the Muffliato paper for per-round Erdős–Rényi graphs, evaluated only at
    the Rényi orders its condition allows (alpha <= alpha_max). Secret graphs: the per-pair
    worst case (R-fold local DP, every pair) under ``worst_pair`` / ``mean_over_pairs``, the
    theorem's expectation over the graphs under ``expected``. Public graphs: the theorem on the
    realised graphs, per pair, for comparison only."""
    a_max = secret.theorem_alpha_max(plan)
    cond = secret.theorem_condition(plan)
    ldp_eps = u.rdp_bound(VIEWS.ldp_factor(plan)).eps  # the cap, in the theorem's conversion
    order = (
        f"its condition {private_graph.CONDITION} allows the orders alpha <= {a_max:.4g}, "
        "where its eps is computed"
        if a_max > 1.0
        else f"its condition {private_graph.CONDITION} allows no order > 1: it gives nothing"
    )
    common = {
        "condition": private_graph.CONDITION,
        "condition_holds": bool(cond),
        "alpha_max": a_max,
    }
    if plan.secret:
        R = float(plan.rounds)
        expected = loss.theorem(u, secret.expected_factor(plan), a_max, cap=ldp_eps).entry(
            per_round={
                "p_edge": plan.secret_p,
                "factor_edge": 1.0,
                "factor_not_edge": secret.theorem_factor(plan),
            }
        )
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
            "worst_pair": u.rdp_bound(R).entry(source=1, observer=0),
            "mean_over_pairs": u.rdp_bound(R).entry(),
            "expected": expected,
        }
    F = private_graph_factors(plan)
    n = plan.n
    v_w, u_w = argmax_tied(np.where(np.eye(n, dtype=bool), -np.inf, F))
    mean_all = float(np.where(np.eye(n, dtype=bool), 0.0, F).sum() / (n * (n - 1)))
    note = (
        "Theorem 4/9 (private Erdős–Rényi graph) per round on the realised graphs, summed: "
        f"valid only for secret graphs, and these are drawn from a public seed; {order}"
    )
    return {
        "note": note,
        "secret": False,
        **common,
        "worst_pair": loss.theorem(u, float(F[v_w, u_w]), a_max, cap=ldp_eps).entry(
            source=int(u_w), observer=int(v_w)
        ),
        "mean_over_pairs": loss.theorem(u, mean_all, a_max, cap=ldp_eps).entry(),
    }
