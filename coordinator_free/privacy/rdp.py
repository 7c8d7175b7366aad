"""Rényi DP bookkeeping and conversion to (eps, delta)-DP.

Every Gaussian-view loss in this project has a *linear* RDP curve, RDP(alpha) = rho * alpha for
all alpha > 1 (zCDP with xi = 0). ``rho`` is the number to store per pair and per round; it adds
up under composition of rounds with fresh noise. The conversions here turn it (or a general RDP
curve) into (eps, delta)-DP:

* :func:`eps_from_rho` - the improved conversion (Balle et al. 2020, Thm 21; Canonne, Kamath and
  Steinke 2020, Prop. 12; Asoodeh et al. 2020, Eq. 20)
  ``eps = rdp(alpha) + log((alpha-1)/alpha) - (log(delta) + log(alpha))/(alpha-1)``, minimised over
  the continuous order alpha > 1. This is what the project reports.
* :func:`eps_from_rho_restricted` - the same, with the order restricted to ``(1, alpha_max]``:
  for a closed-form theorem that holds only at the orders its condition allows (Theorem 4/9 of
  the Muffliato paper: ``sigma^2 >= Delta^2 alpha (alpha - 1) / 2``).
* :func:`eps_from_rdp_curve` - the same conversion on a finite grid of orders.
* :func:`eps_mironov` - Mironov's ``rho + 2 sqrt(rho log(1/delta))``, the conversion used in the
  Muffliato, random-walk and DECOR papers' code; kept for comparison only (it is never smaller).
* :func:`eps_gaussian` - the exact (eps, delta) curve of a Gaussian mechanism with
  ``mu^2 = 2 rho``. It applies when the whole view *is* a Gaussian mean shift (the exact
  Muffliato quantity, and compositions of such views), not to an arbitrary RDP upper bound.

Units: ``rho`` is in nats per unit order, eps in nats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import optimize, special

__all__ = [
    "rho_from_factor",
    "rdp_from_rho",
    "eps_from_rho",
    "eps_from_rho_restricted",
    "eps_from_rdp_curve",
    "eps_mironov",
    "eps_gaussian",
    "delta_gaussian",
]


def _check_delta(delta: float) -> None:
    if not (0.0 < delta < 1.0) or math.isnan(delta):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


def _check_rho(rho: float) -> None:
    if math.isnan(rho) or rho < 0.0:
        raise ValueError(f"rho must be a non-negative number, got {rho!r}")


def rho_from_factor(factor: float | np.ndarray, sensitivity: float, sigma: float):
    """zCDP parameter of a Gaussian view: ``rho = factor * sensitivity^2 / (2 sigma^2)``.

    ``factor`` is the unitless multiplier of the LDP loss (1 means "as bad as seeing the node's
    noisy input directly"); ``sensitivity`` is the L2 sensitivity Delta of one node's input and
    ``sigma`` the std of the Gaussian noise each node adds once. RDP(alpha) = alpha * rho.
    """
    if sigma <= 0:
        raise ValueError(f"sigma must be positive, got {sigma!r}")
    if sensitivity < 0:
        raise ValueError(f"sensitivity must be non-negative, got {sensitivity!r}")
    return (
        np.asarray(factor, dtype=np.float64) * (sensitivity * sensitivity) / (2.0 * sigma * sigma)
    )


def rdp_from_rho(rho: float, alpha: float) -> float:
    """RDP of order alpha of a linear curve: ``alpha * rho``."""
    if alpha <= 1.0:
        raise ValueError(f"Rényi order must be > 1, got {alpha!r}")
    return alpha * rho


def _improved(rdp: float, alpha: float, log_delta: float) -> float:
    # rdp + log((alpha-1)/alpha) - (log delta + log alpha)/(alpha-1)
    return rdp + math.log1p(-1.0 / alpha) - (log_delta + math.log(alpha)) / (alpha - 1.0)


def eps_from_rho(rho: float, delta: float) -> tuple[float, float]:
    """(eps, alpha*) for RDP(alpha) = rho * alpha, improved conversion, continuous order.

    With f(alpha) = rho*alpha + log((alpha-1)/alpha) - (log delta + log alpha)/(alpha-1) one has
    f'(alpha) = rho + log(delta*alpha)/(alpha-1)^2, so the optimum solves
    g(alpha) = rho (alpha-1)^2 + log(delta*alpha) = 0. g is increasing on (1, inf), g(1) = log delta
    < 0 and g(1/delta) > 0, hence a unique root alpha* in (1, 1/delta), found by bracketing; f is
    decreasing before it and increasing after it, so f(alpha*) is the global minimum.

    When delta^2 >= 1 - exp(-rho) (rho is the KL divergence, the alpha -> 1 limit) eps = 0 already
    follows from Pinsker-type reasoning (dp-accounting applies the same shortcut); then alpha* = 1.
    rho = 0 gives (0, inf). The result is clamped at 0.
    """
    _check_rho(rho)
    _check_delta(delta)
    if rho == 0.0:
        return 0.0, math.inf
    if math.isinf(rho):
        return math.inf, 1.0
    if delta * delta + math.expm1(-rho) > 0.0:
        return 0.0, 1.0
    log_delta = math.log(delta)

    def g(a: float) -> float:
        return rho * (a - 1.0) ** 2 + math.log(a) + log_delta

    hi = 1.0 / delta
    # Tighter upper bracket when possible: alpha <= 1 + sqrt(log(1/delta)/rho) since log(a) >= 0.
    hi = min(hi, 1.0 + math.sqrt(-log_delta / rho) * (1.0 + 1e-12) + 1e-12)
    lo = 1.0
    if g(hi) < 0.0:  # cannot happen mathematically; guard against rounding at the bracket edge
        hi = 1.0 / delta
    a_star = optimize.brentq(g, lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500)
    a_star = max(a_star, 1.0 + 1e-300)
    eps = _improved(rho * a_star, a_star, log_delta)
    return max(0.0, eps), float(a_star)


def eps_from_rho_restricted(rho: float, delta: float, alpha_max: float) -> tuple[float, float]:
    """(eps, alpha) for RDP(alpha) = rho * alpha known only for alpha in (1, alpha_max]: the
    improved conversion of :func:`eps_from_rho` minimised over that interval only.

    f is decreasing before the unconstrained optimum alpha* and increasing after it (see
    :func:`eps_from_rho`), so the constrained optimum is ``min(alpha*, alpha_max)``. The KL
    shortcut (eps = 0, reported order 1: the limit alpha -> 1, inside every interval) and rho = 0
    (the views are equal: eps = 0, order 1) need no order above 1. The returned order is never
    above ``alpha_max``. ``alpha_max = inf`` is :func:`eps_from_rho`. ``alpha_max <= 1`` (no
    order allowed) is an error: the theorem then gives nothing and the caller must say so.
    """
    _check_rho(rho)
    _check_delta(delta)
    if math.isnan(alpha_max) or not alpha_max > 1.0:
        raise ValueError(f"alpha_max must be > 1, got {alpha_max!r}")
    if rho == 0.0:
        return 0.0, 1.0
    eps, a_star = eps_from_rho(rho, delta)
    if a_star <= alpha_max:
        return eps, a_star
    eps = _improved(rho * alpha_max, alpha_max, math.log(delta))
    return max(0.0, eps), float(alpha_max)


def eps_from_rdp_curve(
    orders: Sequence[float], rdps: Sequence[float], delta: float
) -> tuple[float, float]:
    """(eps, best order) for an RDP curve given on a grid of orders (all > 1).

    Same improved conversion as :func:`eps_from_rho`, minimised over the grid only (so the result
    is never smaller than the continuous optimum for a linear curve). Orders must be > 1; infinite
    RDP values are allowed (they never win). Negative values are rejected. When
    delta^2 + expm1(-rdp) > 0 at some order the divergence is small enough for eps = 0.
    """
    _check_delta(delta)
    a = np.asarray(orders, dtype=np.float64)
    r = np.asarray(rdps, dtype=np.float64)
    if a.shape != r.shape or a.ndim != 1 or a.size == 0:
        raise ValueError("orders and rdps must be non-empty 1-d sequences of equal length")
    if np.any(~(a > 1.0)):
        raise ValueError("all Rényi orders must be > 1")
    if np.any(np.isnan(r)) or np.any(r < 0):
        raise ValueError("RDP values must be non-negative numbers")
    log_delta = math.log(delta)
    best_eps, best_order = math.inf, float(a[0])
    for ai, ri in zip(a.tolist(), r.tolist(), strict=True):
        if math.isinf(ri):
            e = math.inf
        elif delta * delta + math.expm1(-ri) > 0.0:
            e = 0.0
        else:
            e = _improved(ri, ai, log_delta)
        if e < best_eps:
            best_eps, best_order = e, ai
    return max(0.0, best_eps), best_order


def eps_mironov(rho: float, delta: float) -> float:
    """Mironov (2017, Prop. 3) for a linear curve: ``rho + 2 sqrt(rho log(1/delta))``.

    This is the conversion of the papers' code; it is looser than :func:`eps_from_rho`.
    """
    _check_rho(rho)
    _check_delta(delta)
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def delta_gaussian(rho: float, eps: float) -> float:
    """delta(eps) of a Gaussian mean shift with mu^2 = 2 rho (Balle and Wang 2018, Thm 8):
    ``Phi(mu/2 - eps/mu) - exp(eps) Phi(-mu/2 - eps/mu)``."""
    _check_rho(rho)
    if rho == 0.0:
        return 0.0
    mu = math.sqrt(2.0 * rho)
    a = special.log_ndtr(mu / 2.0 - eps / mu)
    b = eps + special.log_ndtr(-mu / 2.0 - eps / mu)
    if b >= a:
        return 0.0
    return float(math.exp(a) * -math.expm1(b - a))


def eps_gaussian(rho: float, delta: float) -> float:
    """Smallest eps with delta_gaussian(rho, eps) <= delta (exact for a Gaussian view).

    Valid when the observer's whole view is a Gaussian mean shift whose squared Mahalanobis
    norm is 2 rho, e.g. the exact Muffliato loss of one run (and sums of rho over runs with fresh
    noise: Gaussian views compose to a Gaussian view). Not valid for arbitrary RDP bounds.
    """
    _check_rho(rho)
    _check_delta(delta)
    if rho == 0.0 or delta_gaussian(rho, 0.0) <= delta:
        return 0.0
    if math.isinf(rho):
        return math.inf
    hi = 1.0
    while delta_gaussian(rho, hi) > delta:
        hi *= 2.0
    return float(
        optimize.brentq(lambda e: delta_gaussian(rho, e) - delta, 0.0, hi, xtol=1e-14, rtol=1e-15)
    )
