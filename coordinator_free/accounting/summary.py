"""The all-pairs summaries of a plan: by graph distance, the worst pair, the mean over pairs and
the worst observer's mean, made from the losses of every pair (a factor matrix with its
conversion, or loss entries), so that no family builds an epsilon of its own."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from coordinator_free.accounting import baseline
from coordinator_free.accounting.core import argmax_tied
from coordinator_free.accounting.loss import Loss, gaussian_of_rho, rdp_of_rho
from coordinator_free.privacy import muffliato as acct
from coordinator_free.privacy import rdp as rdp_mod


def of_factors(
    F: np.ndarray, dist: np.ndarray, convert: Callable[[float], Loss], lf: float
) -> dict:
    """``F[v, u]``: the factor of source u towards observer v (a linear Renyi curve in units of
    one local-DP release); ``convert``: factor -> :class:`Loss` (the method's conversion);
    ``lf``: the local-DP factor of the run (pairs below it are amplified)."""
    n = F.shape[0]
    rows = []
    off_diag = ~np.eye(n, dtype=bool)
    for d, s in acct.distance_summary(F, dist).items():
        at = off_diag & (dist == d)
        worst = convert(s["max"])
        rows.append(
            {
                "distance": d,
                "pairs": s["count"],
                "factor_mean": s["mean"],
                "factor_max": s["max"],
                "rdp_mean": convert(s["mean"]).rdp,
                "rdp_max": worst.rdp,
                "eps_max": worst.eps,
                # pairs below the local-DP loss, and above it (a paper formula can be)
                "amplified": int(np.count_nonzero(baseline.below(F[at], lf))),
                "above_ldp": int(np.count_nonzero(baseline.above(F[at], lf))),
            }
        )
    off = np.where(np.eye(n, dtype=bool), -np.inf, F)
    v_w, u_w = argmax_tied(off)
    worst = float(F[v_w, u_w])
    per_observer_mean = np.where(np.eye(n, dtype=bool), 0.0, F).sum(axis=1) / (n - 1)
    mean_all = float(per_observer_mean.mean())
    return {
        "by_distance": rows,
        "worst_pair": convert(worst).entry(source=int(u_w), observer=int(v_w)),
        "mean_over_pairs": convert(mean_all).entry(),
        "max_observer_mean": convert(float(per_observer_mean.max())).entry(
            observer=argmax_tied(per_observer_mean)[0]
        ),
    }


def of_entries(
    cells: dict, n: int, dist: np.ndarray, ldp_eps: float, convert: Callable[[float], Loss]
) -> dict:
    """The same summary from loss entries ``cells[(v, u)]`` (observer, source) that may be
    eps-only (factor None): by distance the mean and max of what every entry has, the worst
    pair, and the mean over pairs (as a loss of the mean factor, ``convert``, with the mean eps
    beside it as ``eps_mean``, when every entry has a factor)."""
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
                # pairs below the local-DP loss, and above it (a paper theorem can be)
                "amplified": sum(1 for x in xs if baseline.below(x["eps"], ldp_eps)),
                "above_ldp": sum(1 for x in xs if baseline.above(x["eps"], ldp_eps)),
            }
        )
    pairs = [(v, u) for v in range(n) for u in range(n) if u != v]
    E = np.full((n, n), -np.inf)
    for v, u in pairs:
        E[v, u] = cells[(v, u)]["eps"]
    v_w, u_w = argmax_tied(E)
    mean_eps = float(np.mean([cells[p]["eps"] for p in pairs]))
    facs = [cells[p]["factor"] for p in pairs]
    mean = {"eps": mean_eps}
    if all(f is not None for f in facs):
        mean = {**convert(float(np.mean(facs))).entry(), "eps_mean": mean_eps}
    return {
        "by_distance": rows,
        "worst_pair": {"source": int(u_w), "observer": int(v_w), **cells[(v_w, u_w)]},
        "mean_over_pairs": mean,
    }


def eps_stats(E: np.ndarray) -> dict:
    """The worst pair and the mean over pairs of an eps matrix ``E[v, u]`` (a comparison
    figure: a formula in eps)."""
    n = E.shape[0]
    off = ~np.eye(n, dtype=bool)
    v, u = argmax_tied(np.where(off, E, -np.inf))
    return {
        "worst_pair": {"source": int(u), "observer": int(v), "eps": float(E[v, u])},
        "mean_over_pairs": {"eps": float(E[off].mean())},
    }


def guarantee(rho_exact, rho_paper: float, delta: float, alpha: float) -> dict:
    """A guarantee against one adversary for every node (DECOR's SecLDP): ``exact``, the worst
    node's view, a Gaussian mechanism (its exact profile); ``paper``, a closed form's Renyi
    bound (the RDP conversion); each with the other conversions beside it (``eps_rdp``, the
    improved RDP conversion, and ``alpha``, its order; ``eps_paper``, Mironov's conversion of
    the papers' code; ``eps_gdp``, the Gaussian profile), and every node's exact eps."""
    rho = np.asarray(rho_exact, dtype=float)
    (worst,) = argmax_tied(rho)
    return {
        "exact": {"worst_node": worst, **_conversions(float(rho[worst]), delta, alpha, True)},
        "paper": _conversions(float(rho_paper), delta, alpha, False),
        "per_node_eps": [gaussian_of_rho(float(r), delta, alpha).eps for r in rho],
    }


def _conversions(rho: float, delta: float, alpha: float, gaussian: bool) -> dict:
    exact = gaussian_of_rho(rho, delta, alpha)
    bound = rdp_of_rho(rho, delta, alpha)
    main = exact if gaussian else bound
    out = {"rho": rho, **main.entry()}
    del out["factor"]
    out.update(
        eps_rdp=bound.eps,
        alpha=rdp_mod.eps_from_rho(rho, delta)[1] if 0 < rho < np.inf else None,
        eps_paper=rdp_mod.eps_mironov(rho, delta),
        eps_gdp=exact.eps,
    )
    return out


def worst_exact_eps(audit: dict | None) -> float | None:
    """The largest ``exact`` eps of an audit's pairs (what ``cfree ls`` lists), None without
    one."""
    eps = [
        float(x["eps"])
        for o in (audit or {}).get("observers", [])
        for x in o.get("losses", [])
        if x.get("method") == "exact"
        and isinstance(x.get("eps"), int | float)
        and not isinstance(x.get("eps"), bool)
    ]
    return max(eps) if eps else None
