"""Theorem 4/9 of the Muffliato paper (thesis Thm 6.6 / C.6): Muffliato on a private random
graph with independent edges (Erdős–Rényi), each node knowing only its own neighbours.

Statement (research note 000 section 3.5), for ``alpha > 1`` with
``sigma^2 >= Delta^2 alpha (alpha - 1) / 2`` (needed by the weak convexity of the Rényi
divergence, Lemma 2), after T gossip steps, the loss of source u towards observer v is

* ``alpha Delta^2 / (2 sigma^2)`` (local DP) when u and v are neighbours (probability p);
* ``(alpha Delta^2 / sigma^2) T d_v / (n - d_v)`` otherwise, d_v the observer's degree.

In units of the local-DP loss (a *factor*, RDP(alpha) = alpha * rho_ldp * factor) a round is
1 for an adjacent pair and ``min(1, 2 K d_v / (n - d_v))`` for a non-adjacent one (K gossip
steps per round; the cap is post-processing of the noisy inputs). Rounds with fresh noise and
fresh graphs add up.

Two readings, and only one is a per-pair guarantee:

* **worst case per pair**: any pair may be an edge in every round, so the theorem gives R-fold
  local DP for every pair (:func:`worst_case_factor`);
* **expected over the graphs** (the paper's reading): ``R (p + (1 - p) E[min(1, 2 K d/(n - d))])``
  with d ~ Binomial(n - 2, p), the observer's degree given that u is not its neighbour
  (:func:`expected_factor`). An expectation of RDP bounds, not a bound for a pair; it is
  reported only under that name.

Either figure holds only at the orders the condition allows, alpha in (1, alpha_max] with
``alpha_max = (1 + sqrt(1 + 8 sigma^2 / Delta^2)) / 2`` (:func:`alpha_max`): its eps comes from
:func:`coordinator_free.privacy.rdp.eps_from_rho_restricted`, never from an optimisation over
all orders (:func:`theorem_eps`).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from coordinator_free.privacy import rdp

__all__ = [
    "CONDITION",
    "alpha_max",
    "condition_holds",
    "non_adjacent_factor",
    "expected_non_adjacent_factor",
    "expected_factor",
    "worst_case_factor",
    "theorem_eps",
]

#: The theorem's condition on the noise, as printed in reports.
CONDITION = "sigma^2 >= Delta^2 alpha (alpha - 1) / 2"


def alpha_max(sigma: float, sensitivity: float) -> float:
    """The largest order the condition allows: the root of ``alpha (alpha - 1) = 2 sigma^2 /
    Delta^2``, ``(1 + sqrt(1 + 8 sigma^2 / Delta^2)) / 2``. 1 (no order) at sigma = 0, inf at
    Delta = 0."""
    if sigma < 0 or sensitivity < 0 or math.isnan(sigma) or math.isnan(sensitivity):
        raise ValueError("sigma and sensitivity must be non-negative")
    if sensitivity == 0:
        return math.inf
    if sigma == 0:
        return 1.0
    return 0.5 * (1.0 + math.sqrt(1.0 + 8.0 * (sigma / sensitivity) ** 2))


def condition_holds(alpha: float, sigma: float, sensitivity: float) -> bool:
    """Whether ``sigma^2 >= Delta^2 alpha (alpha - 1) / 2`` at order alpha (> 1)."""
    return alpha > 1.0 and sigma * sigma >= sensitivity * sensitivity * alpha * (alpha - 1) / 2


def non_adjacent_factor(n: int, d: float | np.ndarray, K: int) -> float | np.ndarray:
    """One round's factor for a pair that is not an edge: ``min(1, 2 K d / (n - d))``."""
    d = np.asarray(d, dtype=np.float64)
    with np.errstate(divide="ignore"):
        f = np.where(d < n, 2.0 * K * d / np.maximum(n - d, 1e-300), 1.0)
    out = np.minimum(1.0, f)
    return float(out) if out.ndim == 0 else out


def expected_non_adjacent_factor(n: int, p: float, K: int) -> float:
    """``E[min(1, 2 K d / (n - d))]`` over the observer's degree d ~ Binomial(n - 2, p) given
    that the source is not its neighbour (exact sum over the binomial law)."""
    if n < 2 or not 0.0 <= p <= 1.0:
        raise ValueError("need n >= 2 and p in [0, 1]")
    d = np.arange(n - 1)
    pmf = stats.binom.pmf(d, n - 2, p)
    return float(np.sum(pmf * non_adjacent_factor(n, d, K)))


def expected_factor(n: int, p: float, K: int, rounds: int) -> float:
    """The theorem's expectation over the graphs: ``R (p + (1 - p) E[min(1, 2Kd/(n - d))])``."""
    return float(rounds) * (p + (1.0 - p) * expected_non_adjacent_factor(n, p, K))


def worst_case_factor(rounds: int) -> float:
    """The theorem's worst case for a pair: an edge in every round, R-fold local DP."""
    return float(rounds)


def theorem_eps(factor: float, ldp_rho: float, delta: float, a_max: float) -> dict:
    """eps of RDP(alpha) = alpha * ldp_rho * factor at the orders (1, a_max] only.

    Returns ``{"eps", "alpha"}`` (the order used, <= a_max), or ``{"eps": None, "alpha":
    None}`` when no order > 1 is allowed (the theorem gives nothing)."""
    if not a_max > 1.0:
        return {"eps": None, "alpha": None}
    rho = max(0.0, float(factor)) * ldp_rho
    if math.isinf(rho):
        return {"eps": math.inf, "alpha": None}
    eps, a = rdp.eps_from_rho_restricted(rho, delta, a_max)
    return {"eps": eps, "alpha": a}
