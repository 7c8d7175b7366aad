"""Renyi accounting of private ADMM (thesis Chapter 8 and Appendix E; note 004 part (b.2)).

Pure functions; every one returns the Renyi divergence (RDP) at order ``alpha`` in nats, or
``None`` where the hypotheses of the result it implements fail (never a number outside them),
and raises ``ValueError`` on bad input (``alpha <= 1``, ``sigma <= 0``, ``n < 2``...).

The mechanism (docs/privacy.md, "Private ADMM"): user i at (z, u_i)
computes ``x = v - gamma clip(g, L)`` with ``v = 2 z - u_i`` and ``u_i <- u_i + 2 lam (x - z) +
lam eta``, ``eta ~ N(0, sigma^2 I_p)``. Replacing i's data moves x by at most ``2 gamma L`` and
``u_i`` by at most ``4 lam gamma L``, against noise of std ``lam sigma``: one contribution is a
Gaussian mechanism with ratio ``4 gamma L / sigma``, i.e.

    eps_loc(alpha) = alpha (4 gamma L)^2 / (2 sigma^2) = 8 alpha L^2 gamma^2 / sigma^2   (E.18)

so every curve here is linear in ``alpha`` with a coefficient ``rho`` (``rdp = rho alpha``)
except the numerical Theorem 8.12 (:func:`network_rdp`). For the typed loss path take
``Units(sensitivity=4 gamma L, sigma=sigma)``: a factor 1 is then one local release and the
``*_rho`` functions divided by ``8 L^2 gamma^2 / sigma^2`` are the factors.

What the thesis prints and what is used here (docs/privacy.md, "Private ADMM"):

* Thm 8.7 (centralized, record level): ``8 alpha K L^2 gamma^2 / (sigma^2 n^2)``. Its proof
  (E.16) bounds the sensitivity of the u-update by ``4 lam L gamma / n``: it holds when the
  record's x-update is the prox of the (1/n)-weighted record loss, i.e. its displacement is at
  most ``gamma L / n`` (``central_rdp(..., L, ..., n) == local_rdp(..., L / n, ...)``).
* Thm 8.9 local: ``8 alpha K_i L^2 gamma^2 / sigma^2``, as printed.
* Thm 8.9 central (E.9): printed ``16 alpha K L^2 gamma^2 / (sigma^2 n^2)`` from "eps_loc/m^2 by
  aggregation" times "2 m^2/n^2 by subsampling". Both steps are too small. The m sampled users
  each add noise of std ``lam sigma``: the released sum has noise ``lam sigma sqrt(m)`` for a
  sensitivity ``4 lam gamma L`` (divided by n on both sides), so aggregation divides the RDP by
  m, not m^2. And Lemma E.5 gives ``2 alpha q^2 Delta^2 / sigma^2 = 4 q^2 (alpha Delta^2 /
  (2 sigma^2))``: four times ``q^2`` the unsampled RDP, not two. Used here:
  ``32 alpha K m L^2 gamma^2 / (sigma^2 n^2)`` (2m times the printed value), under Lemma E.5's
  conditions evaluated in its own units: its "sigma" is the noise multiplier (noise std over
  sensitivity) of the per-round sum, ``z = sigma sqrt(m) / (4 gamma L)``, not the ADMM sigma;
  ``z >= 4``, ``q = m/n < 1/5`` and both order conditions of the source lemma (Mironov, Talwar
  and Zhang 2019, Thm 11: ``alpha <= z^2 M / 2 - 2 log z`` and the printed one).
* Remark 8.10 (secure aggregation): printed "amplified by 1/m^2"; the same noise count gives
  1/m: ``8 alpha K_i L^2 gamma^2 / (m sigma^2)``.
* Thm 8.12 (decentralized, network RDP, complete graph): printed ``8 alpha K_i L^2 gamma^2
  log n / (sigma^2 n)`` for ``sigma > 2 L gamma sqrt(alpha (alpha - 1))``. The proof's first bound
  after m steps (PABI with shifts ``a_i = Delta / m``) is ``eps_loc / m = 8 alpha L^2 gamma^2 /
  (sigma^2 m)``; its sum over the geometric gap then uses ``8 alpha L^2 gamma^2 / (2 sigma^2 k)``
  (half of it) and drops the weak-convexity factor ``1 + c``: the printed theorem equals
  ``(1 + c) x (1/2) x`` the first bound, and its sigma condition is the ``c <= 1`` condition of the
  halved bound. The conservative reading (the first bound) is used by :func:`network_rdp`, with
  the mixture over the gap computed exactly by joint convexity (below), and by
  :func:`network_rho_conservative` in closed form. :func:`network_rdp_closed` is the printed
  theorem, kept for comparison only.

The numerical Theorem 8.12 (:func:`network_rdp`): fix a contribution of the source at step k of
a walk of ``horizon`` steps and an observer j (not the source). On the complete graph the token
goes to a uniform node, so the first step after k at which j holds the token is k + m with
``P(m) = p (1 - p)^(m - 1)``, ``p = 1/n`` (``hop_probability``); j then sees z after m noisy
steps (the source's own and m - 1 others): PABI gives ``eps_loc / m``. If j holds no token before
the end (probability ``(1 - p)^r``, ``r = horizon - k``) it sees the released final z, which
carries ``r + 1`` noisy steps: ``eps_loc / (r + 1)`` (``final_release=True``, the default:
the model is the run's output; ``False`` counts that branch as 0, as the thesis' sum over
``k <= K - k(i)`` does). The mixture over m is bounded by the joint convexity of
``exp((alpha - 1) D_alpha)`` (for alpha > 1):

    D_alpha(mix) <= log( sum_m P(m) exp((alpha - 1) eps_m) ) / (alpha - 1)

which holds at every order and is at most ``(1 + c) sum_m P(m) eps_m`` whenever ``(alpha - 1)
max_m eps_m <= c <= 1`` (the weak convexity lemma of Feldman et al. 2018 the thesis cites).
Contributions compose by summing. The proof's hypothesis (``sigma > 2 L gamma sqrt(alpha (alpha
- 1))``) is kept as the domain: ``None`` outside it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import special

__all__ = [
    "PRIVACY_UNITS",
    "effective_lipschitz",
    "sensitivity",
    "factor_of",
    "network_rho",
    "alpha_max",
    "in_condition",
    "local_rho",
    "local_rdp",
    "central_rho",
    "central_rdp",
    "federated_noise_multiplier",
    "subsampled_gaussian_ok",
    "federated_central_rho",
    "federated_central_rdp",
    "secure_aggregation_rho",
    "secure_aggregation_rdp",
    "network_rho_closed",
    "network_rdp_closed",
    "alpha_max_conservative",
    "network_rho_conservative",
    "network_rdp_conservative",
    "gap_law",
    "network_rdp",
    "network_rdp_per_contribution",
]


# ----------------------------------------------------------------------------- input checks


def _pos(name: str, x) -> float:
    if isinstance(x, bool) or not isinstance(x, int | float | np.floating | np.integer):
        raise ValueError(f"{name} must be a number, got {x!r}")
    x = float(x)
    if not (x > 0.0) or math.isinf(x):
        raise ValueError(f"{name} must be a finite number > 0, got {x!r}")
    return x


def _order(alpha) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, int | float | np.floating | np.integer):
        raise ValueError(f"Renyi order alpha must be a number, got {alpha!r}")
    a = float(alpha)
    if not (a > 1.0) or math.isinf(a):
        raise ValueError(f"Renyi order alpha must be finite and > 1, got {alpha!r}")
    return a


def _count(name: str, k, *, low: int = 0) -> int:
    if isinstance(k, bool) or not isinstance(k, int | np.integer):
        raise ValueError(f"{name} must be an integer, got {k!r}")
    if int(k) < low:
        raise ValueError(f"{name} must be >= {low}, got {k!r}")
    return int(k)


def _users(n) -> int:
    return _count("n (number of users)", n, low=2)


def _base(L, gamma, sigma) -> float:
    """``8 L^2 gamma^2 / sigma^2``: the local RDP of one contribution per unit order."""
    L, gamma, sigma = _pos("L (clip)", L), _pos("gamma", gamma), _pos("sigma", sigma)
    return 8.0 * L * L * gamma * gamma / (sigma * sigma)


# ----------------------------------------------------------------------------- conditions


def alpha_max(sigma, L, gamma) -> float:
    """Sup of the orders allowed by Thm 8.12's condition ``sigma > 2 L gamma sqrt(alpha (alpha -
    1))``: ``(1 + sqrt(1 + 4 s^2)) / 2`` with ``s = sigma / (2 L gamma)``. The condition is strict,
    so allowed orders are ``1 < alpha < alpha_max`` (the sup itself is excluded)."""
    s = _pos("sigma", sigma) / (2.0 * _pos("L (clip)", L) * _pos("gamma", gamma))
    return 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * s * s))


def in_condition(alpha, sigma, L, gamma) -> bool:
    """Thm 8.12's hypothesis at this order: ``sigma > 2 L gamma sqrt(alpha (alpha - 1))``."""
    a = _order(alpha)
    sigma, L, gamma = _pos("sigma", sigma), _pos("L (clip)", L), _pos("gamma", gamma)
    return sigma > 2.0 * L * gamma * math.sqrt(a * (a - 1.0))


# ----------------------------------------------------------------------------- linear curves


def local_rho(K_i, L, gamma, sigma) -> float:
    """Thm 8.9 local / Thm E.8: ``8 K_i L^2 gamma^2 / sigma^2`` (rdp = rho alpha, every order):
    K_i contributions each seen by the server (or an eavesdropper, or the next holder)."""
    return _count("K_i", K_i) * _base(L, gamma, sigma)


def local_rdp(alpha, K_i, L, gamma, sigma) -> float:
    """Thm 8.9 local: ``8 alpha K_i L^2 gamma^2 / sigma^2``."""
    return _order(alpha) * local_rho(K_i, L, gamma, sigma)


def central_rho(K, L, gamma, sigma, n) -> float:
    """Thm 8.7 (Thm E.7), record level: ``8 K L^2 gamma^2 / (sigma^2 n^2)``. L is the Lipschitz
    constant of one record's loss and the x-update of a record is the prox of its
    (1/n)-weighted loss (displacement at most ``gamma L / n``, the proof's (E.16))."""
    n = _users(n)
    return _count("K", K) * _base(L, gamma, sigma) / (n * n)


def central_rdp(alpha, K, L, gamma, sigma, n) -> float:
    """Thm 8.7: ``8 alpha K L^2 gamma^2 / (sigma^2 n^2)`` (see :func:`central_rho`)."""
    return _order(alpha) * central_rho(K, L, gamma, sigma, n)


def federated_noise_multiplier(L, gamma, sigma, m) -> float:
    """Lemma E.5's "sigma" for one federated round: noise std over sensitivity of the released
    sum of the m sampled updates, ``lam sigma sqrt(m) / (4 lam gamma L)``."""
    m = _count("m (users per round)", m, low=1)
    return _pos("sigma", sigma) * math.sqrt(m) / (4.0 * _pos("L (clip)", L) * _pos("gamma", gamma))


def subsampled_gaussian_ok(alpha, q, z) -> bool:
    """The hypotheses of Lemma E.5 (Mironov, Talwar and Zhang 2019, Thm 11) at order alpha for
    sampling rate q and noise multiplier z: ``q < 1/5``, ``z >= 4``, ``alpha <= z^2 M / 2 - 2 log
    z`` (the source's first condition, not printed in the thesis: requiring it is conservative)
    and ``alpha <= (M^2 z^2 / 2 - log(5 z^2)) / (M + log(q alpha) + 1 / (2 z^2))`` with ``M =
    log(1 + 1 / (q (alpha - 1)))`` (the printed one; a denominator <= 0 fails it)."""
    a = _order(alpha)
    q = _pos("q (sampling rate)", q)
    z = _pos("z (noise multiplier)", z)
    if q > 1.0:
        raise ValueError(f"q (sampling rate) must be <= 1, got {q!r}")
    if not (q < 0.2 and z >= 4.0):
        return False
    M = math.log1p(1.0 / (q * (a - 1.0)))
    if a > z * z * M / 2.0 - 2.0 * math.log(z):
        return False
    den = M + math.log(q * a) + 1.0 / (2.0 * z * z)
    if not den > 0.0:
        return False
    return a <= (M * M * z * z / 2.0 - math.log(5.0 * z * z)) / den


def federated_central_rho(K, L, gamma, sigma, n, m) -> float:
    """Thm 8.9 central, corrected (module doc): ``32 K m L^2 gamma^2 / (sigma^2 n^2)`` = K rounds
    of ``2 q^2 / z^2`` (Lemma E.5 with q = m/n and z of :func:`federated_noise_multiplier`).
    Valid only where :func:`federated_central_rdp` returns a number."""
    n = _users(n)
    m = _count("m (users per round)", m, low=1)
    if m > n:
        raise ValueError(f"m (users per round) must be <= n = {n}, got {m}")
    return 4.0 * _count("K", K) * m * _base(L, gamma, sigma) / (n * n)


def federated_central_rdp(alpha, K, L, gamma, sigma, n, m) -> float | None:
    """Thm 8.9's central guarantee (the final model only), corrected: ``32 alpha K m L^2 gamma^2
    / (sigma^2 n^2)`` where Lemma E.5 holds (m < n/5, z >= 4, the order conditions; see
    :func:`subsampled_gaussian_ok`), else None. The thesis prints 16 alpha K L^2 gamma^2 /
    (sigma^2 n^2) (module doc: 2m times too small). The lemma is for Poisson sampling; the
    protocol's fixed-size sample of m is taken as the thesis takes it."""
    a = _order(alpha)
    rho = federated_central_rho(K, L, gamma, sigma, n, m)
    z = federated_noise_multiplier(L, gamma, sigma, m)
    if not subsampled_gaussian_ok(a, m / n, z):
        return None
    return a * rho


def secure_aggregation_rho(K_i, L, gamma, sigma, m) -> float:
    """Remark 8.10 corrected: the server sees only the sum of the m updates of a round; user i's
    K_i participations each cost ``8 L^2 gamma^2 / (m sigma^2)`` per unit order (the sum carries
    m users' noise; the thesis' "1/m^2" ignores that). ``m = 1`` is the local guarantee."""
    m = _count("m (users per round)", m, low=1)
    return local_rho(K_i, L, gamma, sigma) / m


def secure_aggregation_rdp(alpha, K_i, L, gamma, sigma, m) -> float:
    """Remark 8.10: ``8 alpha K_i L^2 gamma^2 / (m sigma^2)`` (see :func:`secure_aggregation_rho`)."""
    return _order(alpha) * secure_aggregation_rho(K_i, L, gamma, sigma, m)


def network_rho_closed(K_i, L, gamma, sigma, n) -> float:
    """Thm 8.12 as printed: ``8 K_i L^2 gamma^2 log n / (sigma^2 n)``; valid (as printed) only
    for ``alpha < alpha_max(sigma, L, gamma)``. Smaller than the proof gives (module doc): for
    comparison; :func:`network_rho_conservative` or :func:`network_rdp` for figures."""
    n = _users(n)
    return _count("K_i", K_i) * _base(L, gamma, sigma) * math.log(n) / n


def network_rdp_closed(alpha, K_i, L, gamma, sigma, n) -> float | None:
    """Thm 8.12 as printed, None where ``sigma <= 2 L gamma sqrt(alpha (alpha - 1))``."""
    a = _order(alpha)
    rho = network_rho_closed(K_i, L, gamma, sigma, n)
    return a * rho if in_condition(a, sigma, L, gamma) else None


def alpha_max_conservative(sigma, L, gamma) -> float:
    """Sup of the orders where weak convexity with ``c <= 1`` applies to the unhalved per-gap
    bound: ``(alpha - 1) eps_loc(alpha) <= 1``, i.e. ``sigma >= 2 sqrt(2) L gamma sqrt(alpha
    (alpha - 1))``: ``(1 + sqrt(1 + 4 t^2)) / 2``, ``t = sigma / (2 sqrt 2 L gamma)``."""
    t = _pos("sigma", sigma) / (2.0 * math.sqrt(2.0) * _pos("L (clip)", L) * _pos("gamma", gamma))
    return 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t * t))


def network_rho_conservative(K_i, L, gamma, sigma, n, *, hop_probability=None) -> float:
    """Thm 8.12 with the proof's first bound (``eps_loc / m``), the weak-convexity factor 2
    (``c = 1``) and the exact geometric law: per contribution ``2 eps_loc sum_m p (1-p)^(m-1) /
    m = 2 eps_loc p log(1/p) / (1 - p)``; with ``p = 1/n``: ``16 K_i L^2 gamma^2 log n / (sigma^2
    (n - 1))``. An infinite walk, no final release; orders ``alpha <= alpha_max_conservative``."""
    n = _users(n)
    p = _hop(n, hop_probability)
    per = 2.0 * _base(L, gamma, sigma) * p * math.log(1.0 / p) / (1.0 - p)
    return _count("K_i", K_i) * per


def network_rdp_conservative(alpha, K_i, L, gamma, sigma, n, *, hop_probability=None):
    """``alpha * network_rho_conservative`` where ``alpha <= alpha_max_conservative``, else None."""
    a = _order(alpha)
    rho = network_rho_conservative(K_i, L, gamma, sigma, n, hop_probability=hop_probability)
    return a * rho if a <= alpha_max_conservative(sigma, L, gamma) else None


def network_rho(K_i, L, gamma, sigma, n, *, hop_probability=None) -> float:
    """The linear coefficient to use for Thm 8.12 with ``accounting.loss.theorem``: the
    conservative closed form (:func:`network_rho_conservative`), valid for orders ``alpha <=
    alpha_max_conservative(sigma, L, gamma)``, an infinite walk and no final release. Where the
    final z is released or the walk is short, use :func:`network_rdp` (``loss.curve``)."""
    return network_rho_conservative(K_i, L, gamma, sigma, n, hop_probability=hop_probability)


#: The privacy units of the decentralized protocol: a neighbouring dataset replaces one user's
#: whole shard (``"user"``, the theorems' setting) or one record of one user (``"record"``).
PRIVACY_UNITS = ("user", "record")


def effective_lipschitz(L, *, unit: str = "user", m_min: int = 1, steps: int = 0) -> float:
    """The ``L`` every formula of this module is to be evaluated at so that ``4 gamma L_eff`` is
    the Gaussian shift of one contribution (in units of ``lam``; docs/privacy.md, Private ADMM):

    * ``unit = "user"``: the surrogate prox is projected on ``||x - v|| <= gamma L`` (so the source
      moves x by at most ``2 gamma L``, by construction);
    * ``unit = "record"``: one record of a shard of ``m >= m_min`` records moves the exact prox by
      at most ``2 gamma L / m``, and each of the two certified solves adds ``PROX_TOL_REL gamma
      L`` (``ml.prox``);
    * and, for Theorem 8.12's proof, the computed steps of the other users are non-expansive up to
      ``2 PROX_TOL_REL gamma L`` each (their solves are certified, not exact): ``steps`` of them
      add that to the shift.

    ``L_eff = L (1 + steps tol)`` (user) or ``L (1 / m_min + (1 + steps) tol)`` (record),
    ``tol = PROX_TOL_REL``."""
    from coordinator_free.ml.prox import PROX_TOL_REL

    L = _pos("L (clip)", L)
    steps = _count("steps", steps)
    if unit == "user":
        return L * (1.0 + steps * PROX_TOL_REL)
    if unit == "record":
        m = _count("m_min (smallest shard)", m_min, low=1)
        return L * (1.0 / m + (1 + steps) * PROX_TOL_REL)
    raise ValueError(f"unit must be one of {', '.join(PRIVACY_UNITS)}, got {unit!r}")


def sensitivity(L, gamma) -> float:
    """The unit of the typed loss path: ``Units(sensitivity=4 gamma L, sigma=sigma)`` makes
    factor 1 one local release (``lam`` cancels: shift ``4 lam gamma L``, noise ``lam sigma``);
    ``L`` the :func:`effective_lipschitz` of the unit."""
    return 4.0 * _pos("gamma", gamma) * _pos("L (clip)", L)


def factor_of(rho, L, gamma, sigma) -> float:
    """A coefficient ``rho`` (RDP = rho alpha) in units of one local release, for ``theorem``."""
    rho = float(rho)
    if math.isnan(rho) or rho < 0:
        raise ValueError(f"rho must be a number >= 0, got {rho!r}")
    return rho / _base(L, gamma, sigma)


# ----------------------------------------------------------------------------- numerical 8.12


def _hop(n: int, hop_probability) -> float:
    if hop_probability is None:
        return 1.0 / n
    p = _pos("hop_probability", hop_probability)
    if p >= 1.0:
        raise ValueError(f"hop_probability must be < 1, got {hop_probability!r}")
    return p


def gap_law(remaining, p, *, final_release=True) -> tuple[np.ndarray, np.ndarray]:
    """(gaps, probabilities) of the number of noisy steps in the first z the observer sees after a
    contribution followed by ``remaining`` steps: gap m in 1..remaining with ``p (1-p)^(m-1)``;
    with ``final_release`` the rest ``(1-p)^remaining`` sits at ``remaining + 1`` (the final z),
    else it is left out (that branch reveals nothing). Probabilities sum to 1 (or less)."""
    r = _count("remaining", remaining)
    p = float(p)
    if not (0.0 < p < 1.0):
        raise ValueError(f"hop probability must be in (0, 1), got {p!r}")
    m = np.arange(1, r + 1, dtype=np.float64)
    prob = p * np.exp((m - 1.0) * math.log1p(-p))
    if final_release:
        m = np.append(m, float(r + 1))
        prob = np.append(prob, math.exp(r * math.log1p(-p)))
    return m, prob


def _mix(alpha: float, eps_loc: float, m: np.ndarray, prob: np.ndarray, rest: float) -> float:
    """log(sum P(m) exp((alpha-1) eps_loc/m) + rest) / (alpha-1); ``rest``: mass revealing 0."""
    x = (alpha - 1.0) * eps_loc / m
    terms = np.append(x, 0.0)
    w = np.append(prob, max(rest, 0.0))
    keep = w > 0
    if not np.any(keep):
        return 0.0
    val = float(special.logsumexp(terms[keep], b=w[keep])) / (alpha - 1.0)
    return min(max(val, 0.0), eps_loc)


def network_rdp_per_contribution(
    alpha, n, remaining, L, gamma, sigma, *, hop_probability=None, final_release=True
) -> float | None:
    """Thm 8.12's loss of one contribution followed by ``remaining`` steps of the walk, to one
    observer (module doc); None outside the theorem's sigma condition."""
    a = _order(alpha)
    n = _users(n)
    p = _hop(n, hop_probability)
    if not in_condition(a, sigma, L, gamma):
        return None
    eps_loc = a * _base(L, gamma, sigma)
    m, prob = gap_law(remaining, p, final_release=final_release)
    rest = 1.0 - float(prob.sum())
    return _mix(a, eps_loc, m, prob, rest)


def network_rdp(
    alpha,
    n,
    contributions,
    horizon,
    L,
    gamma,
    sigma,
    observer_visits: Sequence[int] | None = None,
    *,
    hop_probability=None,
    final_release: bool = True,
) -> float | None:
    """Thm 8.12 computed as its proof does, conservatively (module doc): RDP at order alpha of a
    source's contributions towards one observer, None outside ``sigma > 2 L gamma sqrt(alpha
    (alpha - 1))``.

    ``contributions``: the source's step indices in ``1..horizon`` (from the logs: K_i counted,
    not K/n), or a count K_i, then placed where they cost most (the last K_i steps with a final
    release, the first K_i without). ``horizon``: the walk's number of steps. ``hop_probability``:
    the chance the observer holds the token at a given step (1/n on the complete graph where the
    token goes to a uniform node, the holder included; re-routes after faults change it).

    ``observer_visits``: the steps at which the observer held the token (it saw z after the
    step before). Given with step indices, the loss is computed conditionally on the realised
    walk: the gap of each contribution is then known, ``eps_loc / gap`` with no mixing (a valid
    bound: the walk does not depend on the data; it can be above or below the geometric figure,
    which is the law of the gap for a walk kept secret from the observer)."""
    a = _order(alpha)
    n = _users(n)
    T = _count("horizon", horizon, low=1)
    p = _hop(n, hop_probability)
    if isinstance(contributions, int | np.integer) and not isinstance(contributions, bool):
        K_i = _count("contributions", contributions)
        if K_i > T:
            raise ValueError(f"contributions ({K_i}) cannot exceed horizon ({T})")
        steps = None
    else:
        steps = np.asarray(list(contributions), dtype=np.int64)
        if steps.ndim != 1 or np.any(steps < 1) or np.any(steps > T):
            raise ValueError(f"contributions must be step indices in 1..{T}, got {contributions!r}")
        if np.unique(steps).size != steps.size:
            raise ValueError("contributions must be distinct steps")
        K_i = int(steps.size)
    if not in_condition(a, sigma, L, gamma):
        return None
    if K_i == 0:
        return 0.0
    eps_loc = a * _base(L, gamma, sigma)
    if observer_visits is not None:
        if steps is None:
            raise ValueError("observer_visits needs the contributions as step indices")
        visits = np.unique(np.asarray(list(observer_visits), dtype=np.int64))
        if visits.size and (visits[0] < 1 or visits[-1] > T + 1):
            raise ValueError(f"observer_visits must be step indices in 1..{T + 1}")
        total = 0.0
        for k in steps.tolist():
            nxt = visits[visits > k]
            if nxt.size:
                total += eps_loc / float(nxt[0] - k)
            elif final_release:
                total += eps_loc / float(T - k + 1)
        return total
    # Geometric law: per-contribution loss for r = T - k remaining steps, via prefix sums.
    r_needed = (T - steps) if steps is not None else None
    r_max = T - 1 if r_needed is None else int(r_needed.max())
    m = np.arange(1, r_max + 1, dtype=np.float64)
    x = (a - 1.0) * eps_loc / m
    logw = math.log(p) + (m - 1.0) * math.log1p(-p)
    # log of the prefix sums sum_{j<=r} P(j) exp(x_j) (stable: cumulative logaddexp).
    pref = np.logaddexp.accumulate(logw + x) if m.size else np.array([])

    if steps is not None:
        rs = r_needed
    elif final_release:
        rs = np.arange(0, K_i, dtype=np.int64)
    else:
        rs = np.arange(T - 1, T - 1 - K_i, -1, dtype=np.int64)
    # Each contribution's log-moment, for r remaining steps: the walk leaves the observer
    # unseen to the end (then the final release, at gap r + 1) or first reaches it after j <= r
    # steps (the prefix sum). All contributions at once; summed in order, as one by one.
    vals = rs * math.log1p(-p)
    if final_release:
        vals = vals + (a - 1.0) * eps_loc / (rs + 1.0)
    later = rs >= 1
    if later.any():
        vals[later] = np.logaddexp(vals[later], pref[rs[later] - 1])
    vals = np.clip(vals / (a - 1.0), 0.0, eps_loc)
    return float(sum(vals.tolist()))
