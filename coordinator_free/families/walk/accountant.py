"""Planning and auditing the token protocols (ring, complete graph, random walk).

Two methods, as for gossip (same JSON shape):

* ``exact`` — the loss conditional on the walk (the paper's "realised walk" accounting, Fig. 1b
  of "Privacy amplification by decentralization", made exact): observer v sees the token at
  every step it makes and at every hand-off it was offered; between two such sightings the token
  changed by the contributions and noise of the others.
  - sums: that view is linear Gaussian, windows are independent, and the divergence is exact;
  - SGD: privacy amplification by iteration per window (the optimal shift schedule, which counts
    contributions of the same node that bunch up in one window jointly);
  - histograms: each window is a shuffle of randomized responses (Feldman-McMillan-Talwar's
    amplification bound; a node seen more than once in a window gets no amplification there),
    composed over windows.
  The walk is public randomness for this purpose: it does not depend on anyone's data, so a
  bound that holds for every walk holds for the run; conditioning on the walk also covers what
  TCP shows (who handed the token over). ``cfree audit`` uses the realised walk from the logs;
  ``cfree plan`` uses the ring's fixed walk (a guarantee) or, on the complete graph and for
  walk-sgd, one walk sampled from the public run seed (what a run typically gets, labelled so).
* ``paper`` — the theorems as stated, with the research notes' errata applied, from public
  parameters only; sender-known variants by default (Lemma 2 spotted contributions on the
  complete graph, App. B.1 on arbitrary graphs), the hidden-sender numbers as a labelled
  comparison.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from coordinator_free import graphs, seeds
from coordinator_free.accounting.core import AuditError, Units, read_logs, smallest_sigma
from coordinator_free.families.walk import protocol as wk
from coordinator_free.privacy import walk as acct

if TYPE_CHECKING:
    from coordinator_free.config import Config

METHODS = ("exact", "paper")


class WalkUnits(Units):
    """The gossip units (factor -> rdp, eps) plus the records of eps-only bounds."""

    @property
    def rho(self) -> float:
        return self.ldp_rho

    def gaussian(self, factor: float) -> dict:
        """A linear RDP curve alpha * rho * factor: factor, rdp at alpha, eps at delta."""
        return {"factor": float(factor), **self.loss(factor)}

    @staticmethod
    def eps_only(eps: float) -> dict:
        return {"factor": None, "rdp": None, "eps": float(eps)}


def units_of(plan: wk.WalkPlan) -> WalkUnits:
    return WalkUnits(
        alpha=plan.alpha, delta=plan.delta, sensitivity=plan.sensitivity, sigma=plan.sigma
    )


# ------------------------------------------------------------------------------ realised walks


@dataclass
class RealisedWalk:
    """One token's walk: ``holders[s]`` made step s (-1: unknown), ``data[s]`` whether it added
    data, ``seen[v]`` the steps whose incoming value v saw (its own steps and offers)."""

    token: int
    holders: np.ndarray
    data: np.ndarray
    seen: dict[int, np.ndarray]
    end: dict = field(default_factory=dict)

    @property
    def length(self) -> int:
        return int(self.holders.size)


def observation_steps(walk: RealisedWalk, v: int) -> np.ndarray:
    own = np.flatnonzero(walk.holders == v)
    extra = walk.seen.get(v, np.zeros(0, dtype=np.int64))
    return np.unique(np.concatenate([own, extra]).astype(np.int64))


def walk_of_trace(trace: wk.TokenTrace, n: int) -> RealisedWalk:
    """A simulated walk: every hand-off seen by its receiver only."""
    holders = np.asarray(trace.holders, dtype=np.int64)
    return RealisedWalk(
        token=trace.token,
        holders=holders,
        data=np.asarray(trace.data, dtype=bool),
        seen={},
        end={"how": "completed", "at": int(holders[-1]), "step": int(holders.size)},
    )


def realised_factors(plan: wk.WalkPlan, walks: list[RealisedWalk], v: int) -> np.ndarray:
    """Observer v's ``exact`` factors over all tokens (sums and SGD), F[u]; tokens have
    independent noise, so their RDP curves add."""
    F = np.zeros(plan.n)
    for w in walks:
        obs = observation_steps(w, v)
        if plan.kind == "sum":
            var = plan.noise_vars(w.length)
            F += acct.sum_factors(w.holders, w.data, var, obs, v, plan.n)
        else:
            F += acct.sgd_factors(w.holders, w.data, obs, v, plan.n)
    return F


def realised_hist_eps(plan: wk.WalkPlan, walks: list[RealisedWalk], v: int) -> np.ndarray:
    """Observer v's ``exact`` eps for the histogram protocols, over all tokens' windows."""
    per_u: list[list[tuple[int, int]]] = [[] for _ in range(plan.n)]
    for w in walks:
        obs = observation_steps(w, v)
        win = acct.hist_windows(
            w.holders,
            w.data,
            obs,
            v,
            plan.n,
            init_items=plan.init_items,
            init_owner=plan.start(w.token),
        )
        for u in range(plan.n):
            per_u[u].extend(win[u])
    d_shuffle, d_prime = _hist_delta_split(plan.delta, max(1, max(len(x) for x in per_u)))
    out = np.zeros(plan.n)
    for u in range(plan.n):
        if u != v and per_u[u]:
            out[u] = acct.hist_eps(per_u[u], plan.eps0, d_shuffle, d_prime, levels=plan.levels)[0]
    return out


def _hist_delta_split(delta: float, windows: int) -> tuple[float, float]:
    """delta = windows * delta_shuffle + delta': half to the windows, half to composition."""
    return delta / (2 * windows), delta / 2


# ------------------------------------------------------------------------------ theorems


def contributions_bound(plan: wk.WalkPlan) -> float:
    """Contributions of one node over the whole run, for the LDP baseline: exact on the ring,
    the cap if any (per token, times the tokens), else a high-probability bound."""
    if plan.ring:
        return float(plan.cycles * plan.tokens)
    if plan.cap:
        return float(min(plan.cap, plan.hops) * plan.tokens)
    # No cap: the exact binomial tail of the count at delta/3 (as the theorems use).
    return acct.contribution_bound(plan.n, plan.hops * plan.tokens, plan.delta / 3)[0]


def ldp_baseline(plan: wk.WalkPlan) -> dict:
    """What every node's contributions would cost if every observer saw each of them."""
    N = contributions_bound(plan)
    u = units_of(plan)
    if plan.kind == "histogram":
        k = max(1, int(np.ceil(N)))
        eps = min(k * plan.eps0, acct.advanced_composition(plan.eps0, k, plan.delta))
        return {"contributions": N, **u.eps_only(eps)}
    return {"contributions": N, **u.gaussian(N)}


def paper_eps(plan: wk.WalkPlan, *, sender_known: bool = True) -> tuple[np.ndarray, dict]:
    """The theorem of the protocol's paper, eps[v, u] (observer, source), and its details."""
    n, d, tok = plan.n, plan.delta, plan.tokens
    rho = units_of(plan).rho
    cap = plan.cap * tok if plan.cap else None
    if plan.protocol == "ring-sum":
        res = acct.ring_sum_theorem1(n, plan.cycles * tok, rho, d)
    elif plan.protocol == "ring-histogram":
        res = acct.ring_hist_theorem2(n, plan.cycles * tok, plan.eps0, d)
    elif plan.protocol == "complete-sum":
        res = (acct.complete_sum_sender_known if sender_known else acct.complete_sum_theorem3)(
            n, plan.hops * tok, rho, d, cap=cap
        )
    elif plan.protocol == "complete-histogram":
        res = (acct.complete_hist_sender_known if sender_known else acct.complete_hist_theorem6)(
            n, plan.hops * tok, plan.eps0, d, cap=cap
        )
    elif plan.protocol == "complete-sgd":
        res = (acct.complete_sgd_sender_known if sender_known else acct.complete_sgd_theorem4)(
            n, plan.hops * tok, rho, d, cap=cap
        )
    else:
        adj = graphs_adjacency(plan)
        E = acct.walk_sgd_theorem3(
            plan.W, plan.hops, rho, d, plan.cap * tok, sender_known=sender_known, adjacency=adj
        )
        return E, {"theorem": "random-walk Theorem 3" + (" + App. B.1" if sender_known else "")}
    E = np.full((n, n), float(res["eps"]))
    np.fill_diagonal(E, 0.0)
    return E, {k: v for k, v in res.items() if isinstance(v, int | float | str | bool)}


def graphs_adjacency(plan: wk.WalkPlan) -> np.ndarray:
    import networkx as nx

    return nx.to_numpy_array(plan.graph, nodelist=range(plan.n), dtype=bool)


def accounting_note(plan: wk.WalkPlan, *, planned: bool) -> str:
    exact = {
        "sum": "'exact' is the divergence of the observer's view conditional on the walk "
        "(linear Gaussian, exact)",
        "sgd": "'exact' is privacy amplification by iteration conditional on the walk (per "
        "window between the observer's sightings, the source's contributions in it counted "
        "jointly; assumes contractive steps: a convex smooth loss of a linear model, step size <= "
        "2/beta; per-example clipping keeps that for linear models)",
        "histogram": "'exact' is a shuffle bound per window conditional on the walk "
        "(Feldman-McMillan-Talwar, composed over windows)",
    }[plan.kind]
    if planned and not plan.ring:
        exact += (
            "; cfree plan shows it for ONE walk sampled from the public run seed (what a run "
            "typically gets, not a guarantee: a run's own walk is secret, its audit is the "
            "guarantee)"
        )
    paper = {
        "ring-sum": "Theorem 1 (advanced composition over the K windows)",
        "ring-histogram": "Theorem 2 with the corrected calibration (shuffle bound on n-1 "
        "unknown items per window)",
        "complete-sum": "Theorem 3 (non-asymptotic, App. D) + Lemma 2 (spotted contributions: "
        "TCP shows the sender)",
        "complete-histogram": "Theorem 6 + Lemma 2 (sender known)",
        "complete-sgd": "Theorem 4 via Lemma 1 (Remark 5, numeric) + Lemma 2 (sender known)",
        "walk-sgd": "random-walk Theorem 3, exact finite sum, App. B.1 (sender known: max over "
        "the observer's neighbours)",
    }[plan.protocol]
    return f"{exact}; 'paper' is {paper}"


# ------------------------------------------------------------------------------ plan


def sampled_walks(cfg: Config, plan: wk.WalkPlan) -> list[RealisedWalk]:
    """The fault-free walks of the public run seed (the ring's walk is the same for any seed)."""
    streams = seeds.PublicSeedStreams(cfg.run.seed)
    out = []
    for j in range(plan.tokens):
        if plan.kind == "sgd":
            trace = _hops_only(plan, j, streams)
        else:
            trace = wk.walk_token(plan, cfg, j, streams)
        out.append(walk_of_trace(trace, plan.n))
    return out


def _hops_only(plan: wk.WalkPlan, token: int, streams) -> wk.TokenTrace:
    """The walk of an SGD token without the gradients (the hops do not depend on the model)."""
    v = plan.start(token)
    counts: dict[int, int] = {}
    holders, data = [], []
    for s in range(plan.hops):
        k = counts.get(v, 0)
        used = plan.contributes(k)
        if used:
            counts[v] = k + 1
        holders.append(v)
        data.append(used)
        if s + 1 < plan.hops:
            v = wk.next_hop(plan, v, token, s, streams)
    return wk.TokenTrace(token, holders, data, np.zeros(0), np.zeros(0))


def exact_losses(plan: wk.WalkPlan, walks: list[RealisedWalk], observers) -> dict[int, list]:
    """Per observer, per source: the loss record of method ``exact``."""
    u = units_of(plan)
    out = {}
    for v in observers:
        if plan.kind == "histogram":
            E = realised_hist_eps(plan, walks, v)
            out[v] = [u.eps_only(E[src]) for src in range(plan.n)]
        else:
            F = realised_factors(plan, walks, v)
            out[v] = [_gaussian_cached(u, float(F[src])) for src in range(plan.n)]
    return out


@functools.lru_cache(maxsize=65536)
def _gaussian_cached(u: WalkUnits, factor: float) -> dict:
    return u.gaussian(factor)


def plan_report(cfg: Config, plan: wk.WalkPlan, *, source: int | None, method: str) -> dict:
    base = {
        "alpha": plan.alpha,
        "delta": plan.delta,
        "method": method,
        "protocol": plan.protocol,
        "n": plan.n,
        "steps": plan.hops,
        "hops": plan.hops,
        "tokens": plan.tokens,
        "cap": plan.cap,
        "accelerated": False,
        "spectral_gap": plan.spectral_gap,
        "sigma": plan.sigma,
        "sensitivity": plan.sensitivity,
        "ldp": ldp_baseline(plan),
        "accounting": accounting_note(plan, planned=True),
    }
    if plan.kind == "histogram":
        base.update(eps0=plan.eps0, gamma=plan.gamma, levels=plan.levels)
    hidden, _ = paper_eps(plan, sender_known=False)
    if method == "paper":
        E, details = paper_eps(plan)
        base["theorem"] = details
        cells = {(v, src): WalkUnits.eps_only(E[v, src]) for v in range(plan.n)
                 for src in range(plan.n)}  # fmt: skip
    else:
        walks = sampled_walks(cfg, plan)
        obs = range(plan.n)
        per = exact_losses(plan, walks, obs)
        cells = {(v, src): per[v][src] for v in obs for src in range(plan.n)}
    if not plan.ring or plan.protocol == "ring-histogram":
        base["hidden_sender"] = {
            "note": "the paper's bound if the receiver did not learn who sent it the token "
            "(it does over TCP): for comparison only",
            **_eps_stats(plan, hidden),
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
    return {**base, "source": None, **summarise(plan, cells, dist)}


def _eps_stats(plan: wk.WalkPlan, E: np.ndarray) -> dict:
    off = ~np.eye(plan.n, dtype=bool)
    v, u = np.unravel_index(int(np.argmax(np.where(off, E, -np.inf))), E.shape)
    return {
        "worst_pair": {"source": int(u), "observer": int(v), "eps": float(E[v, u])},
        "mean_over_pairs": {"eps": float(E[off].mean())},
    }


def summarise(plan: wk.WalkPlan, cells: dict, dist: np.ndarray) -> dict:
    """By distance (mean/max of factor, rdp, eps where defined), the worst pair, the mean."""
    n = plan.n
    rows = []
    for d in sorted({int(dist[v, u]) for v in range(n) for u in range(n) if u != v}):
        xs = [cells[(v, u)] for v in range(n) for u in range(n) if u != v and dist[v, u] == d]

        def stat(key: str, f, xs=xs):
            vals = [x[key] for x in xs]
            return None if any(x is None for x in vals) else float(f(vals))

        rows.append(
            {
                "distance": d,
                "pairs": len(xs),
                "factor_mean": stat("factor", np.mean),
                "factor_max": stat("factor", np.max),
                "rdp_mean": stat("rdp", np.mean),
                "rdp_max": stat("rdp", np.max),
                "eps_mean": stat("eps", np.mean),
                "eps_max": stat("eps", np.max),
            }
        )
    pairs = [(v, u) for v in range(n) for u in range(n) if u != v]
    v_w, u_w = max(pairs, key=lambda p: cells[p]["eps"])
    mean_eps = float(np.mean([cells[p]["eps"] for p in pairs]))
    facs = [cells[p]["factor"] for p in pairs]
    mean = {"eps": mean_eps}
    if all(f is not None for f in facs):
        mean = {**units_of(plan).gaussian(float(np.mean(facs))), "eps_mean": mean_eps}
    return {
        "by_distance": rows,
        "worst_pair": {"source": int(u_w), "observer": int(v_w), **cells[(v_w, u_w)]},
        "mean_over_pairs": mean,
    }


# ------------------------------------------------------------------------------ audit


def replay_walks(run_dir: Path, plan: wk.WalkPlan, integrity: list[dict]):
    """The realised walks from the view logs (the union of every node's log), integrity
    findings on the way. Returns (walks, logged nodes, fault_free)."""

    logs = read_logs(run_dir, plan, integrity)
    T = plan.hops
    holders = np.full((plan.tokens, T), -1, dtype=np.int64)
    data = np.zeros((plan.tokens, T), dtype=bool)
    seen: list[dict[int, list[int]]] = [{} for _ in range(plan.tokens)]
    ends: dict[int, dict] = {}
    sends: dict[tuple[int, int], tuple[int, str]] = {}  # (token, step) -> (sender, digest)
    seen_digest: dict[tuple[int, int, int], tuple[int, str]] = {}
    fault_free = len(logs) == plan.n
    for v, vl in logs.items():
        finished = False
        for r in vl.records:
            k = r.get("k")
            j, s = r.get("token"), r.get("step")
            if k in ("token-step", "token-seen", "token-send"):
                if not (isinstance(j, int) and 0 <= j < plan.tokens and isinstance(s, int)
                        and 0 <= s < T):  # fmt: skip
                    integrity.append(
                        {"node": v, "kind": "impossible-record",
                         "message": f"{k} record seq {r.get('seq')} names token {j!r} step "
                         f"{s!r}; ignored"}
                    )  # fmt: skip
                    continue
            if k == "token-step":
                if holders[j, s] not in (-1, v):
                    integrity.append(
                        {"node": v, "kind": "double-step",
                         "message": f"token {j} step {s} is claimed by {holders[j, s]} and {v}"}
                    )  # fmt: skip
                holders[j, s] = v
                data[j, s] = bool(r.get("data"))
            elif k == "token-seen":
                seen[j].setdefault(v, []).append(s)
                dg = r["digest"] if "digest" in r else wk.digest(np.asarray(r["value"]))
                seen_digest[(j, s, v)] = (r.get("peer"), dg)
            elif k == "token-send":
                sends[(j, s)] = (v, r.get("digest"))
            elif k in ("token-reroute", "token-lost", "commit-assumed", "walk-timeout"):
                fault_free = False
            elif k == "walk-end" and isinstance(j, int):
                ends.setdefault(j, {"how": r.get("how"), "at": r.get("at"), "step": s})
            elif k == "finished":
                finished = True
        if not finished:
            fault_free = False
            integrity.append(
                {"node": v, "kind": "unfinished",
                 "message": "the log ends before the run finished (crash or kill)"}
            )  # fmt: skip
    for (j, s, v), (peer, dg) in seen_digest.items():
        snd = sends.get((j, s))
        if snd is not None and snd[0] == peer and snd[1] != dg:
            integrity.append(
                {"node": v, "kind": "digest-mismatch",
                 "message": f"token {j} step {s}: the value from {peer} differs from what "
                 f"{peer} logged sending"}
            )  # fmt: skip
    walks = []
    for j in range(plan.tokens):
        made = np.flatnonzero(holders[j] >= 0)
        length = int(made.max()) + 1 if made.size else 0
        gaps = np.flatnonzero(holders[j, :length] < 0)
        if gaps.size:
            fault_free = False
            integrity.append(
                {"node": None, "kind": "walk-gap",
                 "message": f"token {j}: no log records steps {gaps[:10].tolist()}"
                 f"{' ...' if gaps.size > 10 else ''} (a damaged or missing log); the losses "
                 "that depend on them are not certified"}
            )  # fmt: skip
        end = ends.get(j, {"how": "unknown", "at": None, "step": length})
        if end.get("how") != "completed" or length != T:
            fault_free = False
        walks.append(
            RealisedWalk(
                token=j,
                holders=holders[j, :length].copy(),
                data=data[j, :length].copy(),
                seen={v: np.asarray(sorted(set(x)), dtype=np.int64) for v, x in seen[j].items()},
                end=end,
            )
        )
    return walks, set(logs), fault_free and not integrity


def audit_run(run_dir: Path, cfg: Config, plan: wk.WalkPlan, observers=None) -> dict:

    integrity: list[dict] = []
    walks, logged, fault_free = replay_walks(run_dir, plan, integrity)
    wanted = sorted(logged) if observers is None else observers
    for v in wanted:
        if not 0 <= v < plan.n:
            raise AuditError(f"observer {v} is not a node id (0..{plan.n - 1})")
        if v not in logged:
            raise AuditError(f"no readable view log for observer {v} in {run_dir / 'logs'}")
    E_paper, _ = paper_eps(plan)
    exact = exact_losses(plan, walks, wanted)
    dist = graphs.all_distances(plan.graph)
    out_obs = []
    for v in wanted:
        losses = []
        for src in range(plan.n):
            if src == v:
                continue
            for m, rec in (
                ("exact", exact[v][src]),
                ("paper", WalkUnits.eps_only(E_paper[v, src])),
            ):
                losses.append({"source": src, "method": m, "distance": int(dist[v, src]), **rec})
        out_obs.append({"observer": v, "losses": losses})
    return {
        "run_dir": str(run_dir),
        "protocol": plan.protocol,
        "alpha": plan.alpha,
        "delta": plan.delta,
        "n": plan.n,
        "steps": plan.hops,
        "fault_free": fault_free,
        "ldp": ldp_baseline(plan),
        "accounting": accounting_note(plan, planned=False),
        "walks": [
            {
                "token": w.token,
                "length": w.length,
                "end": w.end,
                "contributions": np.bincount(w.holders[w.data], minlength=plan.n).tolist(),
            }
            for w in walks
        ],  # fmt: skip
        "observers": out_obs,
        "complete": not integrity,
        "integrity": integrity,
        "notes": [],
    }


# ------------------------------------------------------------------------------ calibration


def calibrate(cfg: Config, target_eps: float, *, method: str, budget: str) -> dict:
    """The smallest ``privacy.sigma`` whose loss meets ``target_eps`` (worst pair, or the mean
    over pairs), for the Gaussian token protocols. ``exact``: the factors of the walk do not
    depend on sigma (one sampled walk off the ring), so eps is a decreasing function of sigma;
    ``paper``: the theorem recomputed at every sigma. Bisection on log sigma to 1e-9."""
    import dataclasses
    import math

    plan = wk.make_plan(cfg)
    if plan.kind == "histogram":
        raise AuditError(
            f"{plan.protocol} adds no Gaussian noise: its privacy knob is privacy.eps0 (the local "
            "eps of one randomized response); cfree plan --method exact|paper shows the loss"
        )
    if not target_eps > 0 or not math.isfinite(target_eps):
        raise AuditError(f"--target-eps must be a positive number, got {target_eps}")
    off = ~np.eye(plan.n, dtype=bool)
    F = None
    if method == "exact":
        walks = sampled_walks(cfg, plan)
        F = np.stack([realised_factors(plan, walks, v) for v in range(plan.n)])

    def at(sigma: float) -> tuple[float, dict, dict, dict]:
        p = dataclasses.replace(plan, sigma=sigma)
        u = units_of(p)
        # eps grows with the factor, so the worst pair is the largest factor.
        M = F if F is not None else paper_eps(p)[0]
        v, s = np.unravel_index(int(np.argmax(np.where(off, M, -np.inf))), M.shape)
        if F is not None:
            worst, mean = u.gaussian(F[v, s]), u.gaussian(float(F[off].mean()))
        else:
            worst, mean = u.eps_only(M[v, s]), u.eps_only(float(M[off].mean()))
        worst = {"source": int(s), "observer": int(v), **worst}
        eps = worst["eps"] if budget == "worst" else mean["eps"]
        return eps, worst, mean, ldp_baseline(p)

    hi = smallest_sigma(lambda sigma: at(sigma)[0], target_eps, plan.sensitivity)
    eps, worst, mean, ldp = at(hi)
    return {
        "protocol": plan.protocol,
        "method": method,
        "budget": budget,
        "target_eps": target_eps,
        "delta": plan.delta,
        "sigma": hi,
        "sensitivity": plan.sensitivity,
        "steps": plan.hops,
        "eps": eps,
        "binding": worst if budget == "worst" else {"mean_over_pairs": True, **mean},
        "worst_pair": worst,
        "mean_over_pairs": mean,
        "ldp": ldp,
        "accounting": accounting_note(plan, planned=True),
    }
