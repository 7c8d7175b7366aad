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
from coordinator_free.accounting import loss, summary
from coordinator_free.accounting.core import (
    AuditError,
    argmax_tied,
    audit_head,
    read_logs,
    smallest_sigma,
)
from coordinator_free.engine.token import WALK_ENDS
from coordinator_free.families.walk import protocol as wk
from coordinator_free.privacy import walk as acct
from coordinator_free.viewlog import both_digests, same_digest

if TYPE_CHECKING:
    from coordinator_free.config import Config

METHODS = ("exact", "paper")


def units_of(plan: wk.WalkPlan) -> loss.Units:
    return loss.Units(
        alpha=plan.alpha, delta=plan.delta, sensitivity=plan.sensitivity, sigma=plan.sigma
    )


def converter(plan: wk.WalkPlan):
    """factor -> Loss of the walk's ``exact`` view: a sum's view is a Gaussian mechanism (its
    exact profile); SGD's is privacy amplification by iteration, a Renyi bound (the RDP
    conversion)."""
    u = units_of(plan)
    return u.gaussian if plan.kind == "sum" else u.rdp_bound


def eps_only(eps: float) -> dict:
    """The entry of an eps-only bound (a theorem or a shuffle bound in eps)."""
    return loss.eps_only(eps).entry()


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


def count_is_certain(plan: wk.WalkPlan) -> bool:
    """Whether :func:`contributions_bound` holds for every walk (the ring's fixed walk, or a
    cap); otherwise it holds except with probability delta/3 over the walk."""
    return bool(plan.ring or plan.cap)


def _ldp_loss(plan: wk.WalkPlan, method: str = "exact") -> loss.Loss:
    """The loss of :func:`ldp_baseline`. Where the count of contributions is a high-probability
    bound (no cap off the ring: exceeded with probability at most delta/3 over the walk, whose
    randomness is independent of the data), the view is given the rest of delta (2 delta/3), so
    the figure is an (eps, delta) guarantee over the walk's randomness."""
    N = contributions_bound(plan)
    delta = plan.delta if count_is_certain(plan) else plan.delta * 2.0 / 3.0
    if plan.kind == "histogram":
        k = max(1, int(np.ceil(N)))
        return loss.eps_only(min(k * plan.eps0, acct.advanced_composition(plan.eps0, k, delta)))
    u = loss.Units(alpha=plan.alpha, delta=delta, sensitivity=plan.sensitivity, sigma=plan.sigma)
    if method == "exact" and plan.kind == "sum":
        return u.gaussian(N)
    return u.rdp_bound(N)


def ldp_baseline(plan: wk.WalkPlan, method: str = "exact") -> dict:
    """What every node's contributions would cost if every observer saw each of them: in the
    conversion of the method's Gaussian figures (a ``paper`` report states local DP, the cap of
    its theorems, in the RDP conversion). Off the ring this is also the plan's ``exact`` loss:
    every contribution carries its own noise, so no walk and no view of it (of one observer or
    of a coalition) can cost more than each contribution seen on its own."""
    extra = {} if count_is_certain(plan) else {"delta_view": plan.delta * 2.0 / 3.0}
    return _ldp_loss(plan, method).entry(contributions=contributions_bound(plan), **extra)


def paper_eps(plan: wk.WalkPlan, *, sender_known: bool = True) -> tuple[np.ndarray, dict]:
    """The theorem of the protocol's paper, eps[v, u] (observer, source), and its details."""
    n, d, tok = plan.n, plan.delta, plan.tokens
    rho = units_of(plan).ldp_rho
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
        exact = (
            "'exact' is a guarantee for every walk the protocol can take: the local-DP loss of "
            "all of a source's contributions, each seen on its own (every contribution carries "
            "its own noise)"
            + (
                ""
                if count_is_certain(plan)
                else "; the count of contributions is the binomial bound exceeded with "
                "probability <= delta/3 over the walk, the view gets 2 delta/3"
            )
            + f"; typical_walk shows what ONE walk sampled from the public run seed gives ({exact})"
        )
    elif not plan.ring:
        exact += (
            "; the audit conditions on the walk the run really took (its hops drawn from "
            "randomness independent of the data, as the logs show it): what this run's walk "
            "cost, at most the plan's guarantee"
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
    convert = _cached(converter(plan))
    out = {}
    for v in observers:
        if plan.kind == "histogram":
            E = realised_hist_eps(plan, walks, v)
            out[v] = [eps_only(E[src]) for src in range(plan.n)]
        else:
            F = realised_factors(plan, walks, v)
            out[v] = [convert(float(F[src])).entry() for src in range(plan.n)]
    return out


def _cached(convert):
    """``convert`` remembered per factor (a walk's factors repeat across pairs)."""
    return functools.lru_cache(maxsize=65536)(convert)


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
        "ldp": ldp_baseline(plan, method),
        "accounting": accounting_note(plan, planned=True),
    }
    if plan.kind == "histogram":
        base.update(eps0=plan.eps0, gamma=plan.gamma, levels=plan.levels)
    hidden, _ = paper_eps(plan, sender_known=False)
    if method == "paper":
        E, details = paper_eps(plan)
        base["theorem"] = details
        cells = {(v, src): eps_only(E[v, src]) for v in range(plan.n) for src in range(plan.n)}
    else:
        walks = sampled_walks(cfg, plan)
        obs = range(plan.n)
        per = exact_losses(plan, walks, obs)
        cells = {(v, src): per[v][src] for v in obs for src in range(plan.n)}
        if not plan.ring:
            typical = np.array([[per[v][u]["eps"] for u in range(plan.n)] for v in obs])
            base["typical_walk"] = {
                "note": "the 'exact' loss of ONE walk sampled from the public run seed, "
                "conditional on that walk: what a run typically gets, not a guarantee (a run's "
                "walk is its own; 'exact' above holds for every walk)",
                **summary.eps_stats(typical),
            }
            if source is not None and 0 <= source < plan.n:
                base["typical_walk"]["losses"] = [
                    {"observer": v, **per[v][source]} for v in obs if v != source
                ]
            guarantee = ldp_baseline(plan, "exact")
            share = {k: guarantee[k] for k in ("delta_view",) if k in guarantee}
            cells = {key: {**_loss_entry(guarantee), **share} for key in cells}
    if not plan.ring or plan.protocol == "ring-histogram":
        base["hidden_sender"] = {
            "note": "the paper's bound if the receiver did not learn who sent it the token "
            "(it does over TCP): for comparison only",
            **summary.eps_stats(hidden),
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
    # Off the ring the entries are the guarantee: its mean is in the guarantee's conversion.
    convert = converter(plan) if plan.ring or method == "paper" else guarantee_converter(plan)
    return {
        **base,
        "source": None,
        **summary.of_entries(cells, plan.n, dist, base["ldp"]["eps"], convert),
    }


def guarantee_converter(plan: wk.WalkPlan):
    """factor -> Loss in the conversion of :func:`_ldp_loss` (its share of delta)."""
    delta = plan.delta if count_is_certain(plan) else plan.delta * 2.0 / 3.0
    u = loss.Units(alpha=plan.alpha, delta=delta, sensitivity=plan.sensitivity, sigma=plan.sigma)
    return u.gaussian if plan.kind == "sum" else u.rdp_bound


# ------------------------------------------------------------------------------ planned and worst


def planned_losses(cfg: Config, plan: wk.WalkPlan, observers) -> dict[int, dict]:
    """Observer -> {(source, method): loss} under the fault-free plan: exactly the entries of
    :func:`plan_report` (``exact`` on the ring's walk, off the ring the guarantee for every
    walk, :func:`ldp_baseline`; ``paper`` the theorem)."""
    wanted = [int(v) for v in observers]
    if plan.ring:
        exact = exact_losses(plan, sampled_walks(cfg, plan), wanted)
    else:
        guarantee = ldp_baseline(plan, "exact")
        exact = {v: [guarantee] * plan.n for v in wanted}
    E_paper, _ = paper_eps(plan)
    out: dict[int, dict] = {}
    for v in wanted:
        cells: dict = {}
        for src in range(plan.n):
            if src == v:
                continue
            cells[(src, "exact")] = _loss_entry(exact[v][src])
            cells[(src, "paper")] = eps_only(E_paper[v, src])
        out[v] = cells
    return out


def worst_case_losses(cfg: Config, plan: wk.WalkPlan, observers) -> dict[int, dict]:
    """Observer -> {(source, method): loss} for an observer about which nothing is known (its
    log missing or unreadable): every entry is the larger of the planned loss and the local-DP
    loss of everything the source puts into the tokens (:func:`ldp_baseline`: each of its
    contributions seen on its own, as an observer that saw every token value before and after
    every step of the source could; the number of contributions is exact on the ring, the cap
    per token times the tokens, else the binomial bound of the theorems). Seeing more of the
    walk can only narrow the windows between sightings, and a window holding one contribution
    of the source and the noise around it costs at most one local-DP release, so this caps what
    any view of the walk can give; the planned entry is kept where it is larger."""
    ldp = {m: ldp_baseline(plan, m) for m in METHODS}
    return {
        v: {key: loss.at_least(x, ldp[key[1]]) for key, x in cells.items()}
        for v, cells in planned_losses(cfg, plan, observers).items()
    }


def _loss_entry(x: dict) -> dict:
    """The loss keys of an entry (without observer, source or distance)."""
    return {k: x[k] for k in loss.LOSS_KEYS if k in x}


# ------------------------------------------------------------------------------ audit

_WALK_ENDS = WALK_ENDS
#: The records that say who made which step (the others only mark a faulty run).
_PATH_KINDS = (
    "token-start",
    "token-step",
    "token-seen",
    "token-send",
    "token-accept",
    "commit-assumed",
    "walk-end",
)
_FAULT_KINDS = ("token-reroute", "token-lost", "commit-assumed", "walk-timeout")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _record_digest(r: dict) -> str | tuple[str, str] | None:
    """The digest a token record carries (or those of the value it logged, in both forms:
    ``viewlog.both_digests``); None if it has neither."""
    dg = r.get("digest")
    if isinstance(dg, str):
        return dg
    if dg is None and "value" in r:
        try:
            value = np.asarray(r["value"], dtype=np.float64)
        except (TypeError, ValueError):
            return None
        return both_digests(value) if value.ndim == 1 else None
    return None


def _path_record_problem(plan: wk.WalkPlan, v: int, r: dict) -> str | None:
    """What makes a path record impossible for node v (None: nothing)."""
    k, n, T = r["k"], plan.n, plan.hops
    j = r.get("token")
    if not (_is_int(j) and 0 <= j < plan.tokens):
        return f"token {j!r} is not a token id (0..{plan.tokens - 1})"
    s = r.get("step")
    if k == "token-start":
        if plan.start(j) != v:
            return f"token {j} starts at node {plan.start(j)}, not at {v}"
        return None if _record_digest(r) is not None else "no digest of the start value"
    if k == "walk-end":
        how, at = r.get("how"), r.get("at")
        if how not in _WALK_ENDS:
            return f"end {how!r} is not one of {', '.join(_WALK_ENDS)}"
        if how == "timeout":
            return None
        if not (_is_int(at) and 0 <= at < n):
            return f"end at {at!r}, not a node id"
        if not (_is_int(s) and 0 <= s <= T):
            return f"end at step {s!r}, not in 0..{T}"
        if how == "completed" and s != T:
            return f"completed at step {s}, not after the last step {T}"
        return None
    lo = 0 if k == "token-step" else 1
    if not (_is_int(s) and lo <= s < T):
        return f"step {s!r} is not in {lo}..{T - 1}"
    if k == "token-step":
        d = r.get("data")
        return None if isinstance(d, bool) else f"data {d!r} is not true or false"
    peer = r.get("peer")
    if not (_is_int(peer) and 0 <= peer < n and peer != v):
        return f"peer {peer!r} is not another node"
    a, b = (v, peer) if k == "token-send" else (peer, v)
    if not plan.W[a, b] > 0:
        return f"node {a} cannot hand a token to node {b} on this graph"
    if k in ("token-seen", "token-send") and _record_digest(r) is None:
        return "no digest of the value"
    return None


@dataclass
class WalkReplay:
    """The walks rebuilt from the logs. ``walks[j].holders[s]`` is -1 where no log tells (or
    the logs disagree about) who made step s; ``certain[j]``: steps 0..certain[j]-1 are known.
    ``trusted``: the nodes whose log was read whole, ends with the run finished and raised no
    finding (a trusted log records every step its node made)."""

    walks: list[RealisedWalk]
    logged: set[int]
    trusted: set[int]
    certain: list[int]
    fault_free: bool
    made: list[dict[int, set[int]]]  # token -> node -> the steps its own log says it made


def replay(run_dir: Path, plan: wk.WalkPlan, integrity: list[dict]) -> WalkReplay:
    """Rebuild every token's walk from the union of the view logs; every problem goes to
    ``integrity``. Never raises on damaged logs.

    Who made step s of token j is claimed by the holder's ``token-step`` (and its
    ``token-start``/``token-accept``/``commit-assumed``), by the next holder's ``token-seen`` and
    ``token-accept`` (the sender made s-1), by the sender's ``token-send`` (the sender made s-1,
    the receiver took step s over) and by a ``completed`` end. Claims that disagree leave the
    step unknown. A step nobody claims is filled only where the protocol leaves one choice: on
    the ring the walk is public; elsewhere when exactly one node whose log is not trusted could
    have made it (a trusted log holds every step its node made). Everything else stays unknown,
    and the losses that depend on it are not computed from a guess."""
    logs = read_logs(run_dir, plan, integrity)
    pc = _PathClaims.empty(plan.tokens, fault_free=len(logs) == plan.n)
    for v, vl in logs.items():
        _read_path_records(plan, v, vl.records, pc, integrity)
    _claim_hand_offs(pc)
    _check_seen_digests(pc, integrity)
    flagged = {f.get("node") for f in integrity}
    trusted = {v for v in logs if v not in flagged}
    untrusted = [v for v in range(plan.n) if v not in trusted]
    walks, certain = [], []
    for j in range(plan.tokens):
        walk, cut = _walk_of(plan, j, pc, untrusted, integrity)
        walks.append(walk)
        certain.append(cut)
    return WalkReplay(walks, set(logs), trusted, certain, pc.fault_free and not integrity, pc.made)


@dataclass
class _PathClaims:
    """What the path records of every log say about the walks: who claims to have made each
    step of each token (and why), the data flags, the sightings, the steps each node made, the
    walks' ends, the hand-offs and their digests."""

    claims: list[dict[int, dict[int, list[str]]]]
    logged_data: list[dict[int, bool]]
    seen: list[dict[int, set[int]]]
    made: list[dict[int, set[int]]]
    fault_free: bool
    ends: dict[int, dict] = field(default_factory=dict)
    sends: list[tuple[int, int, int, int]] = field(default_factory=list)  # (token, step, a, b)
    send_digest: dict[tuple[int, int, int], str | tuple[str, str]] = field(default_factory=dict)
    # (token, step, receiver, sender, digest)
    seen_digest: list[tuple[int, int, int, int, str | tuple[str, str]]] = field(
        default_factory=list
    )

    @classmethod
    def empty(cls, tokens: int, *, fault_free: bool) -> _PathClaims:
        return cls(
            claims=[{} for _ in range(tokens)],
            logged_data=[{} for _ in range(tokens)],
            seen=[{} for _ in range(tokens)],
            made=[{} for _ in range(tokens)],
            fault_free=fault_free,
        )

    def claim(self, j: int, s: int, node: int, why: str, own: bool = False) -> None:
        self.claims[j].setdefault(s, {}).setdefault(node, []).append(why)
        if own:
            self.made[j].setdefault(node, set()).add(s)


def _read_path_records(plan: wk.WalkPlan, v: int, records, pc: _PathClaims, integrity: list):
    """Node v's path records into ``pc`` (a record that cannot be true is a finding, ignored);
    a log that does not end with the run finished is a finding."""
    T = plan.hops
    finished = False
    steps_made: set[tuple[int, int]] = set()
    for r in records:
        k = r.get("k")
        if k == "finished":
            finished = True
        if k in _FAULT_KINDS:
            pc.fault_free = False
        if k not in _PATH_KINDS:
            continue
        problem = _path_record_problem(plan, v, r)
        if problem is not None:
            integrity.append(
                {
                    "node": v,
                    "kind": "impossible-record",
                    "message": f"{k} record seq {r.get('seq')!r}: {problem}; ignored",
                }
            )
            continue
        j, s, peer = r["token"], r.get("step"), r.get("peer")
        if k == "token-start":
            pc.claim(j, 0, v, f"{v} started it", own=True)
        elif k == "token-step":
            if (j, s) in steps_made:
                integrity.append(
                    {
                        "node": v,
                        "kind": "double-step",
                        "message": f"token {j} step {s} is logged twice by node {v}",
                    }
                )
            steps_made.add((j, s))
            pc.claim(j, s, v, f"{v} logged making it", own=True)
            pc.logged_data[j][s] = pc.logged_data[j].get(s, False) or r["data"]
        elif k == "token-seen":
            pc.claim(j, s - 1, peer, f"{v} saw {peer}'s result")
            pc.seen[j].setdefault(v, set()).add(s)
            pc.seen_digest.append((j, s, v, peer, _record_digest(r)))
        elif k in ("token-accept", "commit-assumed"):
            pc.claim(j, s, v, f"{v} took the token over", own=True)
            pc.claim(j, s - 1, peer, f"{v} took {peer}'s result")
        elif k == "token-send":
            pc.claim(j, s - 1, v, f"{v} handed its result on")
            pc.sends.append((j, s, v, peer))
            pc.send_digest[(j, s, v)] = _record_digest(r)
        elif k == "walk-end":
            pc.ends.setdefault(j, {"how": r["how"], "at": r.get("at"), "step": s})
            if r["how"] == "completed":
                pc.claim(j, T - 1, r["at"], f"{v} heard the walk completed at {r['at']}")
    if not finished:
        pc.fault_free = False
        integrity.append(
            {
                "node": v,
                "kind": "unfinished",
                "message": "the log ends before the run finished (crash, kill or truncation)",
            }
        )


def _claim_hand_offs(pc: _PathClaims) -> None:
    """A hand-off a to b of step s says b made step s, unless the walk was lost at b there."""
    for j, s, a, b in pc.sends:
        end = pc.ends.get(j, {})
        if not (end.get("how") == "lost" and end.get("at") == b and end.get("step") == s):
            pc.claim(j, s, b, f"{a} handed it to {b}")


def _check_seen_digests(pc: _PathClaims, integrity: list) -> None:
    """Every token value a node saw against the digest its sender logged sending."""
    for j, s, v, peer, dg in pc.seen_digest:
        sent = pc.send_digest.get((j, s, peer))
        if sent is not None and not same_digest(sent, dg):
            integrity.append(
                {
                    "node": v,
                    "kind": "digest-mismatch",
                    "message": f"token {j} step {s}: the value from {peer} differs from what "
                    f"{peer} logged sending",
                }
            )


def _walk_of(plan: wk.WalkPlan, j: int, pc: _PathClaims, untrusted: list[int], integrity: list):
    """Token j's realised walk from the claims, and the number of its steps known for certain
    (a gap is a finding)."""
    holders, known_len = _resolve(plan, j, pc.claims[j], untrusted, integrity)
    length = holders.size
    data, cut = _data_flags(plan, j, holders, pc.logged_data[j], integrity)
    if cut < length:
        pc.fault_free = False
        gaps = np.flatnonzero(holders < 0)
        where = f"steps {gaps[:10].tolist()}{' ...' if gaps.size > 10 else ''}"
        if not gaps.size:
            where = f"the steps from {cut} on"
        integrity.append(
            {
                "node": None,
                "kind": "walk-gap",
                "message": f"token {j}: the logs do not tell who made {where} (a damaged or "
                "missing log); the losses of the observers who saw the token after them are "
                "not computed from the walk",
            }
        )
    end = pc.ends.get(j, {"how": "unknown", "at": None, "step": known_len})
    if end.get("how") != "completed" or length != plan.hops:
        pc.fault_free = False
    walk = RealisedWalk(
        token=j,
        holders=holders,
        data=data,
        seen={v: np.asarray(sorted(x), dtype=np.int64) for v, x in pc.seen[j].items()},
        end=end,
    )
    return walk, cut


def _resolve(plan: wk.WalkPlan, j: int, claims: dict, untrusted: list[int], integrity: list):
    """Token j's holders from the claims (-1: unknown), and the number of steps made."""
    length = max(claims) + 1 if claims else 0
    holders = np.full(length, -1, dtype=np.int64)
    for s, who in sorted(claims.items()):
        if len(who) == 1:
            holders[s] = next(iter(who))
        else:
            said = "; ".join(f"{', '.join(why)}" for why in who.values())
            integrity.append(
                {
                    "node": None,
                    "kind": "double-step",
                    "message": f"token {j} step {s} is claimed by nodes {sorted(who)} ({said})",
                }
            )
    if plan.ring:
        rule = (plan.start(j) + np.arange(length)) % plan.n
        wrong = np.flatnonzero((holders >= 0) & (holders != rule))
        if wrong.size:
            integrity.append(
                {
                    "node": None,
                    "kind": "impossible-walk",
                    "message": f"token {j}: the logs name holders off the ring at steps "
                    f"{wrong[:10].tolist()}; the ring's walk is used",
                }
            )
        return rule.astype(np.int64), length
    W = plan.W
    for s in range(length):
        if holders[s] >= 0:
            continue
        prev = holders[s - 1] if s > 0 else -1
        nxt = holders[s + 1] if s + 1 < length else -1
        cand = [
            c
            for c in untrusted
            if (s > 0 or c == plan.start(j))
            and (prev < 0 or W[prev, c] > 0)
            and (nxt < 0 or W[c, nxt] > 0)
        ]
        if len(cand) == 1:
            holders[s] = cand[0]
    if length and holders[0] >= 0 and holders[0] != plan.start(j):
        integrity.append(
            {
                "node": None,
                "kind": "impossible-walk",
                "message": f"token {j}: step 0 is claimed by {holders[0]}, but the token starts "
                f"at {plan.start(j)}",
            }
        )
        holders[0] = -1
    for s in range(1, length):
        a, b = holders[s - 1], holders[s]
        if a >= 0 and b >= 0 and not W[a, b] > 0:
            integrity.append(
                {
                    "node": None,
                    "kind": "impossible-walk",
                    "message": f"token {j}: step {s - 1} by {a} then step {s} by {b}, a hop this "
                    "graph does not have",
                }
            )
            holders[s] = -1
    return holders, length


def _data_flags(plan: wk.WalkPlan, j: int, holders: np.ndarray, logged: dict, integrity: list):
    """Whether each step added data: the protocol's rule (a holder adds data while under its
    cap) on the known prefix of the walk, checked against the logged flags; a step either says
    added data counts as data. Returns (data, certain prefix length)."""
    length = holders.size
    unknown = np.flatnonzero(holders < 0)
    cut = int(unknown[0]) if unknown.size else length
    data = np.ones(length, dtype=bool)  # past the known prefix: assume data (the larger loss)
    counts: dict[int, int] = {}
    bad = []
    for s in range(cut):
        v = int(holders[s])
        k = counts.get(v, 0)
        rule = plan.contributes(k)
        if rule:
            counts[v] = k + 1
        if s in logged and logged[s] != rule:
            bad.append(s)
        data[s] = rule or logged.get(s, False)
    for s, d in logged.items():
        if s >= cut and s < length:
            data[s] = data[s] or d
    if bad:
        integrity.append(
            {
                "node": None,
                "kind": "data-mismatch",
                "message": f"token {j}: steps {bad[:10].tolist()} log whether data went in "
                "differently from the protocol's cap rule; counted as data",
            }
        )
    return data, cut


def replay_walks(run_dir: Path, plan: wk.WalkPlan, integrity: list[dict]):
    """The realised walks from the view logs (the union of every node's log), integrity
    findings on the way. Returns (walks, logged nodes, fault_free); a walk's holder is -1 at a
    step no log tells (see :func:`replay`)."""
    rp = replay(run_dir, plan, integrity)
    return rp.walks, rp.logged, rp.fault_free


def _prefix(w: RealisedWalk, cut: int) -> RealisedWalk:
    return RealisedWalk(
        token=w.token,
        holders=w.holders[:cut].copy(),
        data=w.data[:cut].copy(),
        seen={v: x[x <= cut] for v, x in w.seen.items()},
        end=w.end,
    )


def _computable(rp: WalkReplay, v: int) -> bool:
    """Whether observer v's view is known and lies within the known part of every walk."""
    if v not in rp.trusted:
        return False
    for w, cut, made in zip(rp.walks, rp.certain, rp.made, strict=True):
        own = np.flatnonzero(w.holders == v)
        extra = w.seen.get(v, np.zeros(0, dtype=np.int64))
        last = max([-1, *own.tolist(), *extra.tolist(), *made.get(v, ())])
        if last > cut:
            return False
    return True


def audit_run(run_dir: Path, cfg: Config, plan: wk.WalkPlan, observers=None) -> dict:
    """The losses of every observer (those with a readable log, or ``observers``) from the
    realised walks. An observer whose own log is not trusted, or who saw a token after a step
    the logs cannot tell, gets the worst case (:func:`worst_case_losses`) for ``exact``; an
    observer with no log at all gets it for both methods."""
    integrity: list[dict] = []
    rp = replay(run_dir, plan, integrity)
    wanted = sorted(rp.logged) if observers is None else [int(v) for v in observers]
    for v in wanted:
        if not 0 <= v < plan.n:
            raise AuditError(f"observer {v} is not a node id (0..{plan.n - 1})")
    E_paper, _ = paper_eps(plan)
    prefixes = [_prefix(w, cut) for w, cut in zip(rp.walks, rp.certain, strict=True)]
    computable = [v for v in wanted if _computable(rp, v)]
    exact = exact_losses(plan, prefixes, computable)
    others = [v for v in wanted if v not in exact]
    worst = worst_case_losses(cfg, plan, others) if others else {}
    dist = graphs.all_distances(plan.graph)
    worst_notes = []
    out_obs = []
    for v in wanted:
        basis = "realised walk" if v in exact else "worst case"
        if v not in exact:
            why = (
                "has no readable log"
                if v not in rp.logged
                else "has a damaged or unfinished log"
                if v not in rp.trusted
                else "saw a token after steps the logs cannot tell"
            )
            worst_notes.append(
                {
                    "observer": v,
                    "message": f"observer {v} {why}: its 'exact' losses are the worst case (the "
                    "larger of the plan and the local-DP loss of every contribution)",
                }
            )
        losses = []
        for src in range(plan.n):
            if src == v:
                continue
            if v in exact:
                ex = exact[v][src]
            else:
                ex = worst[v][(src, "exact")]
            if v in rp.logged:
                pa = eps_only(E_paper[v, src])
            else:
                pa = worst[v][(src, "paper")]
            for m, rec in (("exact", ex), ("paper", pa)):
                losses.append(
                    {"source": src, "method": m, "distance": int(dist[v, src]), **_loss_entry(rec)}
                )
        out_obs.append({"observer": v, "basis": basis, "losses": losses})
    walks_out = []
    for w, cut in zip(rp.walks, rp.certain, strict=True):
        known = w.holders >= 0
        walks_out.append(
            {
                "token": w.token,
                "length": w.length,
                "end": w.end,
                "contributions": np.bincount(w.holders[known & w.data], minlength=plan.n).tolist(),
                "unknown_steps": int((~known).sum()),
                "certain_steps": int(cut),
            }
        )
    return {
        **audit_head(
            run_dir,
            plan.protocol,
            plan,
            steps=plan.hops,
            fault_free=rp.fault_free and not integrity,
        ),
        "ldp": ldp_baseline(plan),
        "accounting": accounting_note(plan, planned=False),
        "walks": walks_out,
        "observers": out_obs,
        "complete": not integrity,
        "integrity": integrity,
        "worst_case": worst_notes,
        "notes": [],
    }


# ------------------------------------------------------------------------------ calibration


def calibrate(cfg: Config, target_eps: float, *, method: str, budget: str) -> dict:
    """The smallest ``privacy.sigma`` whose loss meets ``target_eps`` (worst pair, or the mean
    over pairs), for the Gaussian token protocols. ``exact``: the factors of the ring's walk do
    not depend on sigma, so eps is a decreasing function of sigma (off the ring, the guarantee
    for every walk, the same for every pair);
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
    if method == "exact" and plan.ring:
        walks = sampled_walks(cfg, plan)
        F = np.stack([realised_factors(plan, walks, v) for v in range(plan.n)])

    def at(sigma: float):
        p = dataclasses.replace(plan, sigma=sigma)
        # eps grows with the factor, so the worst pair is the largest factor.
        # A paper theorem above local DP is not a usable bound there: local DP is.
        ldp = ldp_baseline(p, method)
        if method == "exact" and not plan.ring:
            # Off the ring the plan's guarantee is the same for every pair.
            g = _ldp_loss(p, method)
            return g.eps, g, g, ldp, (1, 0)
        M = F if F is not None else np.minimum(paper_eps(p)[0], ldp["eps"])
        v, s = argmax_tied(np.where(off, M, -np.inf))
        if F is not None:
            convert = converter(p)
            worst, mean = convert(F[v, s]), convert(float(F[off].mean()))
        else:
            worst, mean = loss.eps_only(M[v, s]), loss.eps_only(float(M[off].mean()))
        return (worst if budget == "worst" else mean).eps, worst, mean, ldp, (v, s)

    hi = smallest_sigma(lambda sigma: at(sigma)[0], target_eps, plan.sensitivity)
    _, worst, mean, ldp, (wobs, wsrc) = at(hi)
    binding = worst if budget == "worst" else mean
    return {
        "protocol": plan.protocol,
        "method": method,
        "budget": budget,
        "target_eps": target_eps,
        "delta": plan.delta,
        "sigma": hi,
        "sensitivity": plan.sensitivity,
        "steps": plan.hops,
        "eps": binding.eps,
        "binding": (
            worst.entry(source=int(wsrc), observer=int(wobs))
            if budget == "worst"
            else mean.entry(mean_over_pairs=True)
        ),
        "worst_pair": worst.entry(source=int(wsrc), observer=int(wobs)),
        "mean_over_pairs": mean.entry(),
        "ldp": ldp,
        "accounting": accounting_note(plan, planned=True),
    }
