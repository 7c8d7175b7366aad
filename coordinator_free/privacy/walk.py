"""Privacy accountants for token (walk) protocols: ring, complete graph and random walks.

Two families live here.

1. **Realised accountants** (the project's exact audit): conditional on the realised walk, i.e.
   on who held the token at every step, which steps carried data and how much noise each step
   added. The walk itself is data-independent, so a bound conditional on it is a valid guarantee.
   * :func:`sum_factors`: the exact Gaussian loss of a running sum (linear Gaussian view).
   * :func:`sgd_factors`: privacy amplification by iteration (PABI) for contractive noisy SGD.
   * :func:`hist_windows`, :func:`hist_eps`: randomized-response histograms, one shuffle bound
     (:func:`shuffle_eps_fmt`) per window; :func:`rr_exact_shuffle_delta` is the exact
     privacy-blanket delta used to check it.
2. **Theorems as stated** (public parameters only, the "paper" method, errata of the research
   notes applied): Cyffers & Bellet 2022 (ring, complete graph; note 003) and Cyffers, Bellet &
   Upadhyay 2024 (random walk on a graph; note 002).

Units and conventions
---------------------
A Gaussian contribution has L2 sensitivity Delta and noise std sigma (absolute);
``rho = Delta^2 / (2 sigma^2)``. A *factor* F is unitless: ``RDP(alpha) = alpha * rho * F``
(F = 1 is seeing one noisy contribution directly, i.e. local DP). Adjacency is user-level: all
contributions of user u may change, each by at most Delta.

A realised walk over steps ``s = 0..T-1`` is given by numpy arrays ``holders[s]`` (int, who made
step s), ``data[s]`` (bool, step s added the holder's data; False = noise only or pure forward)
and, for sums, ``noise_var[s]`` (variance of the Gaussian noise added at step s, in units of
sigma^2). ``tau_s`` is the token value *before* step s (``tau_0`` is the public initial value).
Observer v sees ``tau_r`` for every r in ``obs`` (sorted; it must contain every r with
``holders[r] == v``; ``r = T`` is the final value). v knows its own data and noise.

The steps are cut into *windows* by v's observations: the window of observation ``obs[j]`` is
``[obs[j-1], obs[j])`` (``[0, obs[0])`` for the first); steps at or after the last observation are
never seen. A step made by v is always the first step of its window.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import optimize, special

from coordinator_free.privacy import rdp

__all__ = [
    # realised
    "sum_factors",
    "sgd_factors",
    "pabi_min_energy",
    "hist_windows",
    "shuffle_eps_fmt",
    "hist_eps",
    "rr_exact_shuffle_delta",
    # composition and conversion helpers
    "gaussian_eps0",
    "advanced_composition",
    "advanced_composition_het",
    "eps_from_rdp_fn",
    "eps_from_linear_rdp_capped",
    # Cyffers & Bellet 2022
    "contribution_bound",
    "ring_sum_theorem1",
    "ring_hist_theorem2",
    "complete_sum_theorem3",
    "complete_hist_theorem6",
    "complete_sgd_theorem4",
    "spotted_lemma2",
    "complete_sum_sender_known",
    "complete_sgd_sender_known",
    "complete_hist_sender_known",
    # random walk on a graph
    "walk_h",
    "walk_sum_matrix",
    "walk_closed_form16",
    "star_theorem4",
    "ring_theorem5_corrected",
    "walk_sgd_factors",
    "walk_sgd_theorem3",
    "first_passage",
]


# =============================================================================================
# Input checks and windows
# =============================================================================================


def _check_delta(delta: float, name: str = "delta") -> None:
    if not (0.0 < delta < 1.0) or math.isnan(delta):
        raise ValueError(f"{name} must be in (0, 1), got {delta!r}")


def _check_walk(
    holders: np.ndarray, data: np.ndarray, obs: np.ndarray, v, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(holders, data, obs, known)``: checked arrays, ``known`` the observer (an int) or a
    coalition (several node ids) as a sorted id array."""
    h = np.asarray(holders)
    if h.ndim != 1:
        raise ValueError("holders must be a 1-d array")
    if h.size and not np.issubdtype(h.dtype, np.integer):
        raise ValueError("holders must be integers")
    h = h.astype(np.int64, copy=False)
    d = np.asarray(data, dtype=bool)
    if d.shape != h.shape:
        raise ValueError("data must have the same shape as holders")
    known = np.array(sorted({int(v)} if np.isscalar(v) else {int(a) for a in v}), dtype=np.int64)
    if n < 1 or not known.size or known[0] < 0 or known[-1] >= n:
        raise ValueError(f"need 0 <= v < n, got v={v}, n={n}")
    if h.size and (h.min() < 0 or h.max() >= n):
        raise ValueError("holders must lie in 0..n-1")
    o = np.unique(np.asarray(obs, dtype=np.int64))
    T = h.size
    if o.size and (o[0] < 0 or o[-1] > T):
        raise ValueError("observation steps must lie in 0..T")
    own = np.flatnonzero(np.isin(h, known))
    if own.size and not np.all(np.isin(own, o)):
        raise ValueError("obs must contain every step made by v")
    return h, d, o, known


def _window_keys(obs: np.ndarray, T: int) -> tuple[np.ndarray, np.ndarray]:
    """Window index of every step (``key[s] = #{r in obs : r <= s}``) and whether it is seen
    (``key[s] < len(obs)``: it is seen at observation ``obs[key[s]]``)."""
    key = np.searchsorted(obs, np.arange(T, dtype=np.int64), side="right")
    return key, key < obs.size


def _groups(key: np.ndarray, who: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct (window, node) pairs among the given steps: (window, node, count)."""
    if key.size == 0:
        e = np.zeros(0, dtype=np.int64)
        return e, e, e
    pair, counts = np.unique(key * n + who, return_counts=True)
    return pair // n, pair % n, counts


# =============================================================================================
# 1(a) Realised sums: exact Gaussian factor
# =============================================================================================


def sum_factors(
    holders: np.ndarray,
    data: np.ndarray,
    noise_var: np.ndarray,
    obs: np.ndarray,
    v: int,
    n: int,
) -> np.ndarray:
    """Exact loss factor of observer v about every source u for a running sum, given the walk.

    Mechanism: ``tau_{s+1} = tau_s + data_s x_{holder_s} + N(0, noise_var_s sigma^2)``. v's view
    ``(tau_r)_{r in obs}`` is, after subtracting what v knows (its own data and noise), the
    independent window sums ``sum_{s in window w, holder_s != v} (data_s x_s + z_s)``. Under
    user-level adjacency every contribution of u moves by at most Delta, so window w's mean moves
    by at most ``k_w(u) Delta`` (``k_w(u)`` = u's data steps in w; all in the same direction is the
    worst case) against noise variance ``V_w sigma^2``, ``V_w`` = sum of ``noise_var`` over w's
    steps not made by v. The view is Gaussian, hence (exactly)

        F(u) = sum_w k_w(u)^2 / V_w,        RDP(alpha) = alpha * rho * F(u),

    ``inf`` when a window has ``k_w(u) > 0`` and ``V_w = 0``; ``F[v] = 0``. Steps after v's last
    observation are unseen. Since the view is a Gaussian mean shift with ``mu^2 = 2 rho F``, the
    exact (eps, delta) is :func:`coordinator_free.privacy.rdp.eps_gaussian` of ``rho F``.
    (Note 003 section 4.2, "exact option"; derived here for arbitrary windows.) O(T log T).
    """
    h, d, o, known = _check_walk(holders, data, obs, v, n)
    others = ~np.isin(h, known)
    nv = np.asarray(noise_var, dtype=np.float64)
    if nv.shape != h.shape:
        raise ValueError("noise_var must have the same shape as holders")
    if np.any(~(nv >= 0.0)):
        raise ValueError("noise_var must be non-negative numbers")
    F = np.zeros(n, dtype=np.float64)
    if o.size == 0 or h.size == 0:
        return F
    key, seen = _window_keys(o, h.size)
    other = seen & others
    V = np.bincount(key[other], weights=nv[other], minlength=o.size)
    sel = other & d
    w, u, k = _groups(key[sel], h[sel], n)
    if w.size == 0:
        return F
    Vw = V[w]
    with np.errstate(divide="ignore"):
        contrib = np.where(Vw > 0.0, k.astype(np.float64) ** 2 / np.where(Vw > 0, Vw, 1.0), np.inf)
    F += np.bincount(u, weights=contrib, minlength=n)
    F[known] = 0.0
    return F


# =============================================================================================
# 1(b) Realised noisy SGD: privacy amplification by iteration
# =============================================================================================


def _lower_hull_energy(x: Sequence[float], y: Sequence[float]) -> float:
    """sum over the greatest convex minorant's pieces of rise^2 / run (points sorted by x)."""
    hx: list[float] = []
    hy: list[float] = []
    for xi, yi in zip(x, y, strict=True):
        while len(hx) >= 2:
            # cross product of (h[-2] -> h[-1]) and (h[-2] -> p); pop unless a strict left turn
            cr = (hx[-1] - hx[-2]) * (yi - hy[-2]) - (hy[-1] - hy[-2]) * (xi - hx[-2])
            if cr <= 0.0:
                hx.pop()
                hy.pop()
            else:
                break
        hx.append(xi)
        hy.append(yi)
    e = 0.0
    for i in range(1, len(hx)):
        e += (hy[i] - hy[i - 1]) ** 2 / (hx[i] - hx[i - 1])
    return e


def pabi_min_energy(shifts: Sequence[float] | np.ndarray) -> float:
    """PABI's optimal ``sum_i a_i^2`` for a shift sequence ``s_1..s_L`` (units of Delta).

    Feldman, Mironov, Talwar, Thakurta 2018 (note 002 section 1.5, Thm 1): for contractive noisy
    iterations with Gaussian noise of std sigma (per step) and per-step shifts ``s_i``,
    ``D_alpha <= sum_i alpha a_i^2 Delta^2 / (2 sigma^2)`` for every ``a`` with prefix sums
    ``A_i <= S_i`` (``S_i = s_1 + ... + s_i``) and ``A_L = S_L``. The minimum of ``sum a_i^2`` under
    these constraints is attained by the greatest convex minorant of the points ``(i, S_i)``,
    ``i = 0..L`` (KKT: the multipliers of the upper constraints make the increments
    non-decreasing, and the minorant touches the staircase wherever its slope changes), so

        min sum_i a_i^2 = sum over the minorant's linear pieces of rise^2 / length.

    For ``s >= 0`` all slopes are >= 0 (as PABI requires). A single unit shift followed by
    ``h - 1`` zero shifts gives ``1/h``.
    """
    s = np.asarray(shifts, dtype=np.float64)
    if s.ndim != 1 or s.size == 0:
        raise ValueError("shifts must be a non-empty 1-d sequence")
    if np.any(~(s >= 0.0)) or np.any(~np.isfinite(s)):
        raise ValueError("shifts must be finite and non-negative")
    S = np.concatenate([[0.0], np.cumsum(s)])
    if S[-1] == 0.0:
        return 0.0
    return _lower_hull_energy(np.arange(S.size, dtype=np.float64).tolist(), S.tolist())


def sgd_factors(
    holders: np.ndarray,
    data: np.ndarray,
    obs: np.ndarray,
    v: int,
    n: int,
) -> np.ndarray:
    """Realised PABI factor of observer v about every source u for contractive noisy SGD.

    Mechanism: every step applies a contraction (projected gradient step with ``eta <= 2/beta``)
    and adds fresh Gaussian noise of std sigma (absolute, after scaling by the step size); a data
    step of u moves the step's output by at most Delta. Per window (between consecutive
    observations of v, see the module doc) with observation at step r: let ``p_1 < ... < p_k`` be
    u's data steps in it, ``L = r - p_1`` the noisy steps from ``p_1`` to ``r - 1`` (all made by
    nodes other than v: v's steps start windows), and ``s_i = 1`` if step ``p_1 + i - 1`` is u's,
    else 0. Steps before ``p_1`` are the same map on both sides and do not help. PABI
    (:func:`pabi_min_energy`) gives ``F_w = min sum a_i^2`` = greatest convex minorant energy of
    the staircase ``(i, S_i)``. Conditionally on the previous observation the next window is a
    fresh such iteration, so windows compose adaptively: ``F(u) = sum_w F_w``; ``F[v] = 0``.

    Examples: one contribution h steps before the observation gives ``1/h``; contributions at
    ``r-2`` and ``r-1`` give 2. Note that the papers' per-contribution composition
    (``1/2 + 1 = 1.5`` here, note 002 section 3.2 and note 003 section 4.3) *undercounts* when
    contributions bunch up inside one window: PABI must carry the whole accumulated shift.

    Only the candidate hull vertices ``(0, 0), (d_2, 1), ..., (d_k, k-1), (L, k)`` (``d_j =
    p_j - p_1``: the last point of each level of the staircase) are examined: O(k) per window.
    """
    h, d, o, known = _check_walk(holders, data, obs, v, n)
    others = ~np.isin(h, known)
    F = np.zeros(n, dtype=np.float64)
    if o.size == 0 or h.size == 0:
        return F
    key, seen = _window_keys(o, h.size)
    sel = np.flatnonzero(seen & others & d)
    if sel.size == 0:
        return F
    gk = key[sel] * n + h[sel]
    order = np.argsort(gk, kind="stable")  # steps stay increasing inside a group
    gk, steps = gk[order], sel[order]
    starts = np.flatnonzero(np.concatenate([[True], gk[1:] != gk[:-1]]))
    ends = np.concatenate([starts[1:], [gk.size]])
    counts = ends - starts
    u_of = gk[starts] % n
    r_of = o[gk[starts] // n]
    L = (r_of - steps[starts]).astype(np.float64)
    single = counts == 1
    np.add.at(F, u_of[single], 1.0 / L[single])
    for g in np.flatnonzero(~single).tolist():
        p = steps[starts[g] : ends[g]]
        off = (p - p[0]).astype(np.float64)
        k = int(counts[g])
        xs = [0.0, *off[1:].tolist(), float(L[g])]
        ys = [float(j) for j in range(k + 1)]
        F[u_of[g]] += _lower_hull_energy(xs, ys)
    F[known] = 0.0
    return F


# =============================================================================================
# 1(c) Realised histograms (randomized response + shuffle per window)
# =============================================================================================


def hist_windows(
    holders: np.ndarray,
    data: np.ndarray,
    obs: np.ndarray,
    v: int,
    n: int,
    init_items: int = 0,
    init_owner: int = 0,
) -> list[list[tuple[int, int]]]:
    """Per source u, the windows (in time order) in which u has RR outputs: ``(k_w, m_w)``.

    ``k_w``: u's randomized-response outputs in window w (``data`` steps of u). ``m_w``: all RR
    outputs in w not made by v (u's included), plus ``init_items`` uniformly random items for the
    first window ``[0, obs[0])`` when it is non-empty (``obs[0] > 0``) and ``init_owner != v``
    (the items are part of ``tau_0``; whoever created them knows them, and if v observed
    ``tau_0`` itself, i.e. ``obs[0] == 0``, it knows them too). Windows where u has no output are
    omitted (they cost nothing); ``result[v] == []``.
    """
    h, d, o, known = _check_walk(holders, data, obs, v, n)
    others = ~np.isin(h, known)
    if init_items < 0:
        raise ValueError("init_items must be >= 0")
    out: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    if o.size == 0 or h.size == 0:
        return out
    key, seen = _window_keys(o, h.size)
    sel = seen & others & d
    M = np.bincount(key[sel], minlength=o.size).astype(np.int64)
    if init_items and init_owner not in known and o[0] > 0:
        M[0] += init_items
    w, u, k = _groups(key[sel], h[sel], n)
    for wi, ui, ki in zip(w.tolist(), u.tolist(), k.tolist(), strict=True):
        out[ui].append((int(ki), int(M[wi])))
    return out


def shuffle_eps_fmt(eps0: float, m: int | float, delta: float) -> float:
    """Feldman, McMillan & Talwar (2021), Thm 3.1 (note 003 section 3.1, the paper's Thm 7).

    Shuffling m outputs of eps0-DP local randomizers is (eps, delta)-DP with

        eps = ln(1 + (e^eps0 - 1)/(e^eps0 + 1) * (8 sqrt(e^eps0 ln(4/delta))/sqrt(m)
                                                    + 8 e^eps0 / m))

    when ``eps0 <= ln(m / (16 ln(2/delta)))``; otherwise no amplification is claimed (eps0, with
    delta 0). The result is min'ed with eps0.
    """
    _check_delta(delta)
    if eps0 < 0 or math.isnan(eps0):
        raise ValueError(f"eps0 must be >= 0, got {eps0!r}")
    if eps0 == 0.0:
        return 0.0
    if m < 1 or m <= 16.0 * math.log(2.0 / delta):
        return float(eps0)
    if eps0 > math.log(m / (16.0 * math.log(2.0 / delta))):
        return float(eps0)
    e = math.exp(eps0)
    val = math.log1p(
        math.tanh(eps0 / 2.0) * (8.0 * math.sqrt(e * math.log(4.0 / delta) / m) + 8.0 * e / m)
    )
    return float(min(val, eps0))


def hist_eps(
    windows_of_u: Sequence[tuple[int, int]],
    eps0: float,
    delta_shuffle: float,
    delta_prime: float,
    levels: int | None = None,
) -> tuple[float, float]:
    """(eps, delta) of v about u from u's windows ``(k_w, m_w)`` (see :func:`hist_windows`).

    Per window: ``eps_w = k_w eps0`` if ``k_w > 1`` (group privacy of k pure eps0-LDP outputs, no
    amplification claimed), else ``shuffle_eps_fmt(eps0, m_w, delta_shuffle)`` or, given
    ``levels``, the smaller of that and the exact privacy-blanket value
    (:func:`shuffle_eps_exact`). Composition over
    windows (adaptive): heterogeneous advanced composition (Dwork, Rothblum & Vadhan 2010 /
    Kairouz et al. 2015 in the form ``sqrt(2 ln(1/delta') sum eps_w^2) + sum eps_w (e^eps_w - 1)``)
    or basic composition ``sum eps_w``, whichever is smaller. ``delta`` = (number of windows whose
    shuffle bound is strictly below eps0) * delta_shuffle, plus delta' only if advanced
    composition was the smaller one.
    """
    _check_delta(delta_shuffle, "delta_shuffle")
    _check_delta(delta_prime, "delta_prime")
    eps_list: list[float] = []
    n_shuffle = 0
    for k, m in windows_of_u:
        if k <= 0:
            continue
        if k > 1:
            eps_list.append(k * eps0)
        else:
            e = shuffle_eps_fmt(eps0, m, delta_shuffle)
            if levels is not None and e >= eps0 and m <= SHUFFLE_EXACT_MAX_ITEMS:
                e = min(e, shuffle_eps_exact(eps0, levels, int(m), delta_shuffle))
            if e < eps0:
                n_shuffle += 1
            eps_list.append(e)
    if not eps_list:
        return 0.0, 0.0
    basic = float(sum(eps_list))
    adv = advanced_composition_het(eps_list, delta_prime)
    ds = n_shuffle * delta_shuffle
    if adv < basic:
        return adv, ds + delta_prime
    return basic, ds


#: Above this many unknown items per window the exact blanket computation (O(m^3)) is skipped and
#: the closed form alone is used (it amplifies there anyway).
SHUFFLE_EXACT_MAX_ITEMS = 200


@functools.lru_cache(maxsize=4096)
def shuffle_eps_exact(eps0: float, L: int, m_others: int, delta: float) -> float:
    """The smallest eps (to 1e-6 relative, rounded up) with
    ``rr_exact_shuffle_delta(eps0, L, m_others, eps) <= delta``, capped at eps0 (randomized
    response alone is eps0-DP with delta 0). Valid for the worst case over the others' data."""
    _check_delta(delta)
    if m_others <= 0 or rr_exact_shuffle_delta(eps0, L, m_others, eps0) > delta:
        return float(eps0)
    if rr_exact_shuffle_delta(eps0, L, m_others, 0.0) <= delta:
        return 0.0
    lo, hi = 0.0, float(eps0)
    while hi - lo > 1e-6 * hi:
        mid = 0.5 * (lo + hi)
        if rr_exact_shuffle_delta(eps0, L, m_others, mid) <= delta:
            hi = mid
        else:
            lo = mid
    return hi


def rr_exact_shuffle_delta(eps0: float, L: int, m_others: int, eps: float) -> float:
    """Exact delta(eps) of the privacy-blanket view of a count histogram of L-ary RR outputs.

    u's value is x (vs x'); u's output is ``RR_gamma`` with ``gamma = L/(e^eps0 + L - 1)`` (with
    probability gamma uniform over [L], else the true value). Each of the m others' outputs is,
    independently with probability gamma, a uniform *blanket* item; the blanket size is
    ``B ~ Bin(m, gamma)``. The adversary is given more than the histogram: which others are not
    blanket and their outputs (Balle, Bell, Gascon & Nissim 2019). The real histogram is a
    post-processing of this view for every value of the others' data, so the delta computed here
    upper-bounds the real one for the worst case over the others' data (and is tight when their
    values lie outside {x, x'}). Blanket sizes with probability below 1e-40 are counted with their
    whole mass (an upper bound on their share, so the result is exact to 1e-38). Given B, with ``N = B + 1`` items (blanket plus u's output) of
    histogram h, ``P_x(h | B) = Mult_N(h) [gamma + (1 - gamma) L h_x / N]`` (``Mult_N``: N uniform
    items), so only ``(a, b) = (h_x, h_x')`` matter, distributed as the trinomial
    ``Tri_N(a, b)`` with cell probabilities (1/L, 1/L, 1 - 2/L). Hence, exactly,

        delta(eps) = sum_B Bin(B; m, gamma) sum_{a,b} Tri_{B+1}(a, b)
                     [gamma + (1-gamma) L a/(B+1) - e^eps (gamma + (1-gamma) L b/(B+1))]_+ .
    """
    if L < 2:
        raise ValueError("L must be >= 2")
    if m_others < 0:
        raise ValueError("m_others must be >= 0")
    if eps0 < 0 or eps < 0:
        raise ValueError("eps0 and eps must be >= 0")
    gamma = L / (math.exp(eps0) + L - 1.0)
    ee = math.exp(eps)
    from scipy.stats import binom  # here: importing scipy.stats takes half a second

    pB = binom.pmf(np.arange(m_others + 1), m_others, gamma)
    total = 0.0
    log_l = -math.log(L)
    log_rest = math.log1p(-2.0 / L) if L > 2 else -math.inf
    for B in range(m_others + 1):
        if pB[B] < 1e-40:
            total += pB[B]  # a blanket size this unlikely adds at most its own mass
            continue
        N = B + 1
        a = np.arange(N + 1, dtype=np.float64)[:, None]
        b = np.arange(N + 1, dtype=np.float64)[None, :]
        c = N - a - b
        ok = c >= 0
        cc = np.where(ok, c, 0.0)
        with np.errstate(invalid="ignore"):
            rest_term = np.where(cc > 0, cc * log_rest, 0.0)
        logp = (
            special.gammaln(N + 1.0)
            - special.gammaln(a + 1.0)
            - special.gammaln(b + 1.0)
            - special.gammaln(cc + 1.0)
            + (a + b) * log_l
            + rest_term
        )
        tri = np.where(ok, np.exp(logp), 0.0)
        px = gamma + (1.0 - gamma) * L * a / N
        pxp = gamma + (1.0 - gamma) * L * b / N
        total += pB[B] * float(np.sum(tri * np.maximum(px - ee * pxp, 0.0)))
    return max(0.0, total)


# =============================================================================================
# Composition and conversion helpers
# =============================================================================================


def gaussian_eps0(rho: float, delta0: float) -> float:
    """eps of one Gaussian contribution at delta0: the exact Gaussian curve,
    :func:`coordinator_free.privacy.rdp.eps_gaussian` (Balle & Wang 2018) with ``mu^2 = 2 rho``."""
    return rdp.eps_gaussian(rho, delta0)


def advanced_composition(eps: float, k: float, delta_prime: float) -> float:
    """Homogeneous advanced composition (Dwork, Rothblum & Vadhan 2010; note 003 section 3.1):
    k-fold composition of (eps, delta)-DP is ``(sqrt(2k ln(1/delta')) eps + k eps (e^eps - 1),
    k delta + delta')``. Returns the eps part; k may be real (a bound on the count)."""
    _check_delta(delta_prime, "delta_prime")
    if k < 0 or eps < 0:
        raise ValueError("k and eps must be >= 0")
    if eps > 700:  # e^eps overflows; the bound is astronomically above basic composition anyway
        return math.inf
    return float(math.sqrt(2.0 * k * math.log(1.0 / delta_prime)) * eps + k * eps * math.expm1(eps))


def advanced_composition_het(eps_list: Sequence[float], delta_prime: float) -> float:
    """Heterogeneous advanced composition: ``sqrt(2 ln(1/delta') sum eps_i^2) + sum eps_i
    (e^eps_i - 1)`` (Kairouz, Oh & Viswanath 2015, in the Dwork-Rothblum-Vadhan form)."""
    _check_delta(delta_prime, "delta_prime")
    e = np.asarray(eps_list, dtype=np.float64)
    if e.size == 0:
        return 0.0
    if np.any(~(e >= 0)):
        raise ValueError("eps values must be >= 0")
    return float(
        math.sqrt(2.0 * math.log(1.0 / delta_prime) * float(np.sum(e * e)))
        + float(np.sum(e * np.expm1(np.minimum(e, 700.0))) if np.all(e <= 700) else np.inf)
    )


def eps_from_rdp_fn(
    rdp_of_alpha: Callable[[float], float], alpha_max: float, delta: float
) -> tuple[float, float]:
    """(eps, alpha) minimising the improved RDP -> DP conversion over alpha in (1, alpha_max].

    ``eps(alpha) = rdp(alpha) + log((alpha-1)/alpha) - (log delta + log alpha)/(alpha-1)``
    (Balle et al. 2020 Thm 21; :func:`coordinator_free.privacy.rdp._improved`). A log-spaced grid
    of ``alpha - 1`` in ``[1e-6, min(alpha_max - 1, 1e6)]`` followed by a bounded scalar
    refinement between the best grid point's neighbours. ``alpha_max = inf`` caps at ``1 + 1e6``.
    """
    _check_delta(delta)
    if not alpha_max > 1.0:
        raise ValueError(f"alpha_max must be > 1, got {alpha_max!r}")
    log_delta = math.log(delta)
    hi = min(alpha_max - 1.0, 1e6)
    lo = min(1e-6, hi)

    def f_of_x(x: float) -> float:
        a = 1.0 + x
        r = float(rdp_of_alpha(a))
        if math.isnan(r) or r < 0:
            raise ValueError(f"rdp_of_alpha({a}) returned {r!r}")
        if math.isinf(r):
            return math.inf
        return rdp._improved(r, a, log_delta)

    xs = np.geomspace(lo, hi, 400) if hi > lo else np.array([hi])
    vals = np.array([f_of_x(float(x)) for x in xs])
    i = int(np.argmin(vals))
    best_x, best = float(xs[i]), float(vals[i])
    if xs.size > 1 and math.isfinite(best):
        a_lo = math.log(float(xs[max(i - 1, 0)]))
        a_hi = math.log(float(xs[min(i + 1, xs.size - 1)]))
        if a_hi > a_lo:
            res = optimize.minimize_scalar(
                lambda t: f_of_x(math.exp(t)),
                bounds=(a_lo, a_hi),
                method="bounded",
                options={"xatol": 1e-12},
            )
            if res.fun < best:
                best, best_x = float(res.fun), math.exp(float(res.x))
    return max(0.0, best), 1.0 + best_x


def eps_from_linear_rdp_capped(
    rho_eff: np.ndarray | float, alpha_max: float, delta: float
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised improved conversion of ``RDP(alpha) = alpha * rho_eff`` over (1, alpha_max].

    As in :func:`coordinator_free.privacy.rdp.eps_from_rho`: ``f(a) = rho a + log(1 - 1/a) -
    (log delta + log a)/(a - 1)`` is decreasing before the root of ``g(a) = rho (a-1)^2 + log a +
    log delta`` and increasing after it, so the constrained optimum is ``min(a*, alpha_max)``.
    ``a*`` is found by safeguarded Newton on ``g`` in ``x = a - 1``. The KL shortcut ``delta^2 >=
    1 - e^{-rho}`` (alpha -> 1, always admissible) gives eps = 0. Returns (eps, alpha) arrays.
    """
    _check_delta(delta)
    r = np.asarray(rho_eff, dtype=np.float64)
    if np.any(~(r >= 0)):
        raise ValueError("rho_eff must be non-negative")
    if not alpha_max > 1.0:
        raise ValueError("alpha_max must be > 1")
    flat = r.ravel()
    eps = np.zeros_like(flat)
    alpha = np.full_like(flat, math.inf)
    ld = math.log(delta)
    inf = np.isinf(flat)
    eps[inf] = math.inf
    alpha[inf] = 1.0
    with np.errstate(over="ignore"):
        kl0 = (delta * delta + np.expm1(-flat)) > 0.0
    alpha[kl0 & ~inf & (flat > 0)] = 1.0
    act = np.flatnonzero((flat > 0) & ~inf & ~kl0)
    if act.size:
        rho = flat[act]
        xmax = alpha_max - 1.0
        hi = np.minimum(np.sqrt(-ld / rho) * (1.0 + 1e-12) + 1e-12, xmax)
        lo = np.zeros_like(hi)

        def g(x: np.ndarray, rr: np.ndarray) -> np.ndarray:
            return rr * x * x + np.log1p(x) + ld

        x = hi.copy()
        gx = g(x, rho)
        capped = gx <= 0.0  # root beyond alpha_max (or exactly at it): take alpha_max
        todo = np.flatnonzero(~capped)
        for _ in range(200):
            if todo.size == 0:
                break
            xt, rt, lt, ht = x[todo], rho[todo], lo[todo], hi[todo]
            gt = g(xt, rt)
            neg = gt < 0
            lt = np.where(neg, xt, lt)
            ht = np.where(neg, ht, xt)
            dg = 2.0 * rt * xt + 1.0 / (1.0 + xt)
            xn = xt - gt / dg
            bad = ~((xn > lt) & (xn < ht))
            xn = np.where(bad, 0.5 * (lt + ht), xn)
            conv = np.abs(xn - xt) <= 1e-14 * np.maximum(xn, 1e-300) + 1e-300
            x[todo], lo[todo], hi[todo] = xn, lt, ht
            todo = todo[~conv]
        a = 1.0 + x
        val = rho * a + np.log1p(-1.0 / a) - (ld + np.log(a)) / x
        eps[act] = np.maximum(val, 0.0)
        alpha[act] = a
    return eps.reshape(r.shape), alpha.reshape(r.shape)


# =============================================================================================
# 2. Cyffers & Bellet 2022: theorems with public parameters only
# =============================================================================================


def _binomial_quantile(trials: float, p: float, delta: float) -> float:
    """The smallest integer N with ``P(Bin(trials, p) > N) <= delta`` (exact tail)."""
    from scipy.stats import binom

    k = int(trials)
    return float(min(binom.isf(delta, k, p), k))


def contribution_bound(
    n: int, T: int, delta_hat: float, cap: int | None = None
) -> tuple[float, float]:
    """High-probability bound N_u on a user's contributions on the complete graph, and the failure
    probability actually spent (note 003 section 3.1, App. D).

    ``T_u ~ Bin(T, 1/n)``. The paper bounds it by Chernoff,
    ``N_u = T/n + sqrt(3 (T/n) ln(1/delta_hat))``, valid only when ``T >= 3 n ln(1/delta_hat)``;
    here N_u is the exact binomial tail quantile, ``P(T_u > N_u) <= delta_hat``, which is valid
    for every T and never larger than the Chernoff value where that applies. With a cap:
    ``N_u = min(cap, T)`` and nothing is spent.
    """
    if n < 1 or T < 0:
        raise ValueError("need n >= 1 and T >= 0")
    if cap is not None:
        if cap < 0:
            raise ValueError("cap must be >= 0")
        return float(min(cap, T)), 0.0
    _check_delta(delta_hat, "delta_hat")
    if T == 0:
        return 0.0, 0.0
    return _binomial_quantile(T, 1.0 / n, delta_hat), float(delta_hat)


def _compose(eps_c: float, N: float, delta_prime: float) -> tuple[float, str]:
    """min(advanced, basic) composition of N contributions of eps_c each."""
    if N <= 0 or eps_c == 0.0:
        return 0.0, "basic"
    adv = advanced_composition(eps_c, N, delta_prime)
    basic = N * eps_c
    return (adv, "advanced") if adv < basic else (basic, "basic")


def ring_sum_theorem1(n: int, K: int, rho: float, delta: float) -> dict:
    """Thm 1 (Cyffers & Bellet 2022; note 003 section 3.2): ring summation (Algorithm 1).

    Every window between two visits of v holds one contribution of u and at least one Gaussian
    noise of another node, so each window is (eps0, delta0)-DP with ``eps0 =``
    :func:`gaussian_eps0` ``(rho, delta0)``; K windows. Budget: ``delta' = delta/2``,
    ``delta0 = delta/(2K)``; ``eps = sqrt(2K ln(1/delta')) eps0 + K eps0 (e^eps0 - 1)``, or basic
    composition ``K eps0`` when smaller (reported in ``composition``). n does not enter.
    """
    if n < 2 or K < 1:
        raise ValueError("need n >= 2 and K >= 1")
    _check_delta(delta)
    dp = delta / 2.0
    d0 = delta / (2.0 * K)
    e0 = gaussian_eps0(rho, d0)
    eps, how = _compose(e0, K, dp)
    return {
        "eps": eps,
        "delta": delta,
        "eps0": e0,
        "delta0": d0,
        "delta_prime": dp,
        "composition": how,
    }


def ring_hist_theorem2(n: int, K: int, eps0: float, delta: float) -> dict:
    """Thm 2 (note 003 section 3.3) with the note's errata: each window is a shuffle of the
    ``n - 1`` RR outputs v does not know (not n), bounded by FMT (:func:`shuffle_eps_fmt`) at
    ``delta_s = delta/(2K)`` instead of the paper's Erlingsson et al. calibration; composition
    over K windows with ``delta' = delta/2`` (advanced, or basic when smaller)."""
    if n < 2 or K < 1:
        raise ValueError("need n >= 2 and K >= 1")
    _check_delta(delta)
    ds = delta / (2.0 * K)
    dp = delta / 2.0
    ew = shuffle_eps_fmt(eps0, n - 1, ds)
    eps, how = _compose(ew, K, dp)
    return {
        "eps": eps,
        "delta": delta,
        "eps_w": ew,
        "delta_s": ds,
        "delta_prime": dp,
        "amplified": ew < eps0,
        "composition": how,
    }


def _c_grid(n: int) -> np.ndarray:
    """Cycle-threshold constants c for Thms 3/6: a fixed log grid restricted to
    ``[n^{-1/3}, n^{1/6}]`` (below, eps0/(c n^{1/3}) >= eps0: no amplification; above, the
    threshold c^2 n^{2/3} exceeds n and the subsampling delta (m/n) delta0 would exceed delta0)."""
    lo, hi = n ** (-1.0 / 3.0), n ** (1.0 / 6.0)
    g = np.geomspace(1e-3, 1e3, 1201)
    g = g[(g >= lo) & (g <= hi)]
    return np.unique(np.concatenate([[lo, hi], g]))


def _gamma_n(n: int, c: float) -> float:
    # 1 - (1 - 1/n)^{c^2 n^{2/3}}
    return -math.expm1(c * c * n ** (2.0 / 3.0) * math.log1p(-1.0 / n))


def _small_cycle_eps(gamma_n: float, eps0: float) -> float:
    """Small cycles: subsampling with replacement (Balle, Barthe & Gaboardi 2018, Thm 10):
    ``ln(1 + gamma_n (e^eps0 - 1)) <= 2 gamma_n eps0`` for eps0 <= 1 (the paper's form). For
    eps0 > 1 (outside the theorems' hypothesis) the subsampling value itself is used."""
    if eps0 <= 1.0:
        return 2.0 * gamma_n * eps0
    if eps0 > 700:  # log1p(g (e^x - 1)) = x + log(g) + log(1 - e^-x + e^-x / g), the last ~ 0
        return eps0 + math.log(gamma_n)
    return math.log1p(gamma_n * math.expm1(eps0))


def _split(n: int, T: int, delta: float, cap: int | None) -> tuple[float, float, float, float]:
    """(N_u, delta_hat, delta', N_u * delta0): thirds when the Chernoff bound is used, else the
    remainder ``delta - delta_hat`` split equally between delta' and N_u delta0."""
    nu, dh = contribution_bound(n, T, delta / 3.0, cap)
    rest = delta - dh
    if dh > 0:
        return nu, dh, delta / 3.0, delta / 3.0
    return nu, dh, rest / 2.0, rest / 2.0


def complete_sum_theorem3(n: int, T: int, rho: float, delta: float, cap: int | None = None) -> dict:
    """Thm 3, non-asymptotic App. D version (note 003 section 3.4), errata applied.

    ``gamma_n = 1 - (1 - 1/n)^{c^2 n^{2/3}}``; per contribution
    ``eps_c = min(eps0, max(2 gamma_n eps0, eps0/(c n^{1/3})))`` (clipped at eps0);
    ``eps = sqrt(2 N_u ln(1/delta')) eps_c + N_u eps_c (e^eps_c - 1)`` (eps_c, not eps0, in the
    second term), or ``N_u eps_c`` if smaller. ``eps0 =`` :func:`gaussian_eps0` ``(rho, delta0)``.
    Budget: ``delta_hat = delta' = N_u delta0 = delta/3`` (see :func:`contribution_bound` for the
    cap / no-Chernoff cases, where ``delta_hat = 0``). Minimised over c on :func:`_c_grid`.
    ``hypothesis_ok``: the theorem assumes eps0 < 1.
    """
    if n < 2:
        raise ValueError("need n >= 2")
    _check_delta(delta)
    nu, dh, dp, nd0 = _split(n, T, delta, cap)
    if nu <= 0:
        return {"eps": 0.0, "delta": 0.0, "N_u": nu, "c": math.nan, "eps0": 0.0, "eps_c": 0.0}
    d0 = nd0 / nu
    e0 = gaussian_eps0(rho, d0)
    best = (math.inf, math.nan, math.nan, "")
    for c in _c_grid(n).tolist():
        ec = min(e0, max(_small_cycle_eps(_gamma_n(n, c), e0), e0 / (c * n ** (1.0 / 3.0))))
        eps, how = _compose(ec, nu, dp)
        if eps < best[0]:
            best = (eps, c, ec, how)
    return {
        "eps": best[0],
        "delta": dh + dp + nd0,
        "c": best[1],
        "eps_c": best[2],
        "composition": best[3],
        "N_u": nu,
        "eps0": e0,
        "delta0": d0,
        "delta_prime": dp,
        "delta_hat": dh,
        "hypothesis_ok": e0 < 1.0,
    }


def complete_hist_theorem6(
    n: int, T: int, eps0: float, delta: float, cap: int | None = None
) -> dict:
    """Thm 6 (note 003 section 3.5), errata applied (exponent in gamma_n, N_u delta0).

    Per contribution ``eps_c = min(eps0, max(2 gamma_n eps0, 14 sqrt(ln(4/delta0)) eps0 /
    (c n^{1/3})))``: small cycles by subsampling (pure, delta 0), large cycles (>= c^2 n^{2/3}
    items) by FMT's simplified bound, valid when ``eps0 <= min(1, ln(c^2 n^{2/3} /
    (16 ln(2/delta0))))``. Composition as in :func:`complete_sum_theorem3`, same budget split,
    minimised over the c satisfying the condition. If none does, the result is basic LDP
    composition ``N_u eps0`` with ``amplified = False`` (and delta spent only on delta_hat).
    """
    if n < 2:
        raise ValueError("need n >= 2")
    _check_delta(delta)
    nu, dh, dp, nd0 = _split(n, T, delta, cap)
    if nu <= 0:
        return {"eps": 0.0, "delta": 0.0, "N_u": nu, "c": math.nan, "amplified": False}
    d0 = nd0 / nu
    best = (math.inf, math.nan, math.nan, "")
    if eps0 <= 1.0:
        for c in _c_grid(n).tolist():
            m = c * c * n ** (2.0 / 3.0)
            if m <= 16.0 * math.log(2.0 / d0) or eps0 > math.log(m / (16.0 * math.log(2.0 / d0))):
                continue
            large = 14.0 * math.sqrt(math.log(4.0 / d0)) * eps0 / (c * n ** (1.0 / 3.0))
            ec = min(eps0, max(2.0 * _gamma_n(n, c) * eps0, large))
            eps, how = _compose(ec, nu, dp)
            if eps < best[0]:
                best = (eps, c, ec, how)
    if not math.isfinite(best[0]):
        return {
            "eps": nu * eps0,
            "delta": dh,
            "c": math.nan,
            "eps_c": eps0,
            "composition": "basic",
            "N_u": nu,
            "delta0": 0.0,
            "delta_prime": 0.0,
            "delta_hat": dh,
            "amplified": False,
        }
    return {
        "eps": best[0],
        "delta": dh + dp + nd0,
        "c": best[1],
        "eps_c": best[2],
        "composition": best[3],
        "N_u": nu,
        "delta0": d0,
        "delta_prime": dp,
        "delta_hat": dh,
        "amplified": True,
    }


def complete_sgd_theorem4(n: int, T: int, rho: float, delta: float, cap: int | None = None) -> dict:
    """Lemma 1 / Thm 4 (note 003 section 3.7) with the improved conversion (Remark 5).

    Per contribution ``RDP(alpha) = 4 alpha L^2 ln n / (sigma^2 n) = alpha rho 2 ln(n)/n``
    (``rho = Delta^2/(2 sigma^2)`` with ``Delta = 2L``), valid for
    ``sigma >= L sqrt(2 alpha (alpha - 1))``, i.e. ``alpha (alpha - 1) rho <= 1``, so
    ``alpha_max = (1 + sqrt(1 + 4/rho))/2``. Composed over N_u (:func:`contribution_bound` with
    ``delta_hat = delta/2``), converted at ``delta_c = delta - delta_hat`` minimising over
    ``alpha in (1, alpha_max]``. (The geometric first-hit pmf gives ln(n)/(n-1) rather than
    ln(n)/n, note 003 section 3.7; the theorem's n is kept here.)
    """
    if n < 2:
        raise ValueError("need n >= 2")
    _check_delta(delta)
    if rho <= 0:
        raise ValueError("rho must be > 0")
    nu, dh = contribution_bound(n, T, delta / 2.0, cap)
    dc = delta - dh
    fac = 2.0 * math.log(n) / n
    a_max = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 / rho))
    e, a = eps_from_linear_rdp_capped(rho * fac * nu, a_max, dc)
    return {
        "eps": float(e),
        "delta": dc + dh,
        "alpha": float(a),
        "alpha_max": a_max,
        "N_u": nu,
        "delta_c": dc,
        "delta_hat": dh,
        "factor_per_contribution": fac,
    }


def _spotted_count(n: int, N_u: float, delta_tilde: float) -> tuple[float, float]:
    """(S, delta_tilde spent): the spotted count ~ Bin(N_u, min(1, 2/n)) bounded by its exact
    tail quantile (never larger than the paper's Chernoff value, valid for every N_u)."""
    _check_delta(delta_tilde, "delta_tilde")
    if N_u <= 0:
        return 0.0, 0.0
    return _binomial_quantile(math.ceil(N_u), min(1.0, 2.0 / n), delta_tilde), delta_tilde


def spotted_lemma2(n: int, N_u: float, eps0: float, delta_tilde: float, delta_pp: float) -> dict:
    """Lemma 2 (note 003 section 3.6), errata applied (factor 2, separate delta'').

    With visible senders/receivers a contribution of u is spotted by v (directly before or after
    one of v's) with probability 2/n; the paper bounds their number by Chernoff,
    ``S = 2 N_u/n + sqrt(6 (N_u/n) ln(1/delta_tilde))``; here S is the exact binomial tail
    quantile at delta_tilde (:func:`_spotted_count`), never larger. ``S <= N_u`` always. Spotted contributions get no amplification:
    ``eps_s = min(S eps0, sqrt(2 S ln(1/delta'')) eps0 + S eps0 (e^eps0 - 1))``. The caller adds
    ``delta_tilde_used + delta''_used + S delta0``.
    """
    _check_delta(delta_pp, "delta_pp")
    S, dt = _spotted_count(n, N_u, delta_tilde)
    eps, how = _compose(eps0, S, delta_pp)
    return {
        "eps": eps,
        "S": S,
        "composition": how,
        "delta_tilde": dt,
        "delta_pp": delta_pp if how == "advanced" else 0.0,
    }


def _sender_known(hidden: dict, n: int, delta: float, rho: float | None, eps0: float) -> dict:
    """Add Lemma 2's spotted contributions to a hidden-sender result computed at delta/2.

    Gaussian contributions (``rho`` given): ``delta_tilde = delta'' = S delta0 = delta/6`` and the
    spotted eps0 is ``gaussian_eps0(rho, delta0)``. Pure ones (``rho is None``: randomized
    response, eps0-LDP with delta 0): ``delta_tilde = delta'' = delta/4``.
    """
    share = delta / 6.0 if rho is not None else delta / 4.0
    S, _ = _spotted_count(n, hidden["N_u"], share)
    if rho is not None:
        d0 = share / S if S > 0 else 0.0
        e0 = gaussian_eps0(rho, d0) if S > 0 else 0.0
    else:
        d0, e0 = 0.0, eps0
    sp = spotted_lemma2(n, hidden["N_u"], e0, share, share)
    sp["eps0"], sp["delta0"] = e0, d0
    d_sp = sp["delta_tilde"] + sp["delta_pp"] + S * d0
    return {
        "eps": hidden["eps"] + sp["eps"],
        "delta": hidden["delta"] + d_sp,
        "eps_hidden": hidden["eps"],
        "eps_spotted": sp["eps"],
        "N_u": hidden["N_u"],
        "S": S,
        "hidden": hidden,
        "spotted": sp,
    }


def complete_sum_sender_known(
    n: int, T: int, rho: float, delta: float, cap: int | None = None
) -> dict:
    """Complete-graph sum when senders/receivers are visible (App. G): the hidden-sender
    :func:`complete_sum_theorem3` at delta/2 plus :func:`spotted_lemma2` with
    ``delta_tilde = delta'' = S delta0 = delta/6`` and ``eps0 = gaussian_eps0(rho, delta0)``.
    Returns the total ``eps``/``delta``, ``eps_hidden``, ``eps_spotted``, ``S`` and both parts
    (``hidden``, ``spotted``)."""
    _check_delta(delta)
    return _sender_known(complete_sum_theorem3(n, T, rho, delta / 2.0, cap), n, delta, rho, 0.0)


def complete_sgd_sender_known(
    n: int, T: int, rho: float, delta: float, cap: int | None = None
) -> dict:
    """Complete-graph SGD with visible senders/receivers: :func:`complete_sgd_theorem4` at
    delta/2 plus :func:`spotted_lemma2` (a spotted step is one noisy gradient: its LDP eps is
    ``gaussian_eps0(rho, delta0)``), budget as in :func:`complete_sum_sender_known`."""
    _check_delta(delta)
    return _sender_known(complete_sgd_theorem4(n, T, rho, delta / 2.0, cap), n, delta, rho, 0.0)


def complete_hist_sender_known(
    n: int, T: int, eps0: float, delta: float, cap: int | None = None
) -> dict:
    """Complete-graph histogram with visible senders/receivers: :func:`complete_hist_theorem6`
    at delta/2 plus :func:`spotted_lemma2` with the pure eps0 of randomized response
    (``delta_tilde = delta'' = delta/4``, no per-contribution delta)."""
    _check_delta(delta)
    return _sender_known(complete_hist_theorem6(n, T, eps0, delta / 2.0, cap), n, delta, None, eps0)


# =============================================================================================
# Random walk on a graph (Cyffers, Bellet & Upadhyay 2024; note 002 section 3)
# =============================================================================================

_DIRECT_T = 4096
_EM_COEF = (1.0 / 12.0, -1.0 / 720.0, 1.0 / 30240.0)  # B_2/2!, B_4/4!, B_6/6!


def _ein(z: np.ndarray) -> np.ndarray:
    """Ein(z) = int_0^z (1 - e^{-u})/u du (entire): series for z <= 1, E1 + ln z + gamma else."""
    z = np.asarray(z, dtype=np.float64)
    out = np.empty_like(z)
    small = z <= 1.0
    zs = z[small]
    acc = np.zeros_like(zs)
    term = np.ones_like(zs)
    for k in range(1, 30):
        term = term * zs / k  # z^k / k!
        acc += (1.0 if k % 2 else -1.0) * term / k
    out[small] = acc
    zl = z[~small]
    out[~small] = special.exp1(zl) + np.log(zl) + np.euler_gamma
    return out


def _h_direct(lam: np.ndarray, T: int) -> np.ndarray:
    t = np.arange(1, T + 1, dtype=np.float64)
    out = np.zeros_like(lam)
    rows = max(1, (1 << 21) // max(T, 1))
    for i in range(0, lam.size, rows):
        blk = lam[i : i + rows]
        out[i : i + rows] = np.sum(np.power.outer(blk, t) / t, axis=1)
    return out


def _h_of_s(s: np.ndarray, T: int) -> np.ndarray:
    """h_T(e^{-s}) for s in [0, inf] (inf: lambda = 0). Taking s rather than lambda keeps the
    relative precision of 1 - lambda when lambda is a square (negative eigenvalues)."""
    out = np.zeros_like(s)
    if T == 0:
        return out
    fin = np.isfinite(s)
    if T <= _DIRECT_T:
        t = np.arange(1, T + 1, dtype=np.float64)
        idx = np.flatnonzero(fin)
        rows = max(1, (1 << 21) // T)
        for i in range(0, idx.size, rows):
            blk = idx[i : i + rows]
            out[blk] = np.sum(np.exp(-np.outer(s[blk], t)) / t, axis=1)
        return out
    far = fin & (s * T > 50.0)  # lambda^T < e^-50: tail sum_{t>T} lambda^t/t < 1e-23
    out[far] = -np.log(-np.expm1(-s[far]))
    near = fin & ~far
    if np.any(near):
        # h_T = H_T + sum_{t=1}^T g(t), g(t) = (e^{-st} - 1)/t, by Euler-Maclaurin with three
        # correction terms: |g^{(j)}| <= s^{j+1}/(j+1) and s <= 50/T < 0.013, remainder < 1e-16.
        sn = s[near]
        HT = special.digamma(T + 1.0) + np.euler_gamma
        integral = -(_ein(sn * T) - _ein(sn))
        ends = 0.5 * (np.expm1(-sn) + np.expm1(-sn * T) / T)
        corr = np.zeros_like(sn)
        for k, coef in enumerate(_EM_COEF, start=1):
            j = 2 * k - 1  # odd derivative: g^{(j)}(t) = j! P(j+1, s t) / t^{j+1}
            jf = math.factorial(j)
            dT = jf * special.gammainc(j + 1, sn * T) / float(T) ** (j + 1)
            d1 = jf * special.gammainc(j + 1, sn)
            corr += coef * (dT - d1)
        out[near] = HT + integral + ends + corr
    return out


def walk_h(lam: np.ndarray | float, T: int | float) -> np.ndarray:
    """``h_T(lambda) = sum_{t=1}^T lambda^t / t`` for lambda in [-1, 1] (``h_T(1) = H_T``).

    ``T = inf`` gives ``-ln(1 - lambda)``. For ``T <= 4096`` the sum is direct. Otherwise, with
    ``|lambda| = e^{-s}``: ``s T > 50`` gives ``-ln(1 - lambda)`` (the tail is below 1e-23); near
    1, ``h_T = H_T + sum_t (e^{-st} - 1)/t`` with the sum by Euler-Maclaurin (integral
    ``Ein(s) - Ein(sT)``, derivatives via regularised incomplete gammas), accurate to ~1e-15 for
    T up to 1e6 and beyond. Negative lambda = -e^{-s}: ``h_T = h_{floor(T/2)}(e^{-2s}) -
    h_T(e^{-s})`` (twice the even terms minus all terms), evaluated from s so that 1 - lambda^2
    keeps its relative precision.
    """
    lam_a = np.asarray(lam, dtype=np.float64)
    flat = np.clip(lam_a.ravel(), -1.0, 1.0)
    if math.isinf(T):
        with np.errstate(divide="ignore"):
            return (-np.log1p(-flat)).reshape(lam_a.shape)
    T = int(T)
    if T < 0:
        raise ValueError("T must be >= 0")
    if T == 0:
        return np.zeros_like(lam_a)
    if T <= _DIRECT_T:
        return _h_direct(flat, T).reshape(lam_a.shape)
    mag = np.abs(flat)
    with np.errstate(divide="ignore"):
        s = -np.log(mag)
    out = _h_of_s(s, T)
    neg = flat < 0
    if np.any(neg):
        out[neg] = _h_of_s(2.0 * s[neg], T // 2) - out[neg]
    return out.reshape(lam_a.shape)


def _sym_eig(W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    W = np.asarray(W, dtype=np.float64)
    if W.ndim != 2 or W.shape[0] != W.shape[1]:
        raise ValueError("W must be square")
    if not np.allclose(W, W.T, atol=1e-12, rtol=0):
        raise ValueError("W must be symmetric (Assumption 2)")
    lam, phi = np.linalg.eigh(0.5 * (W + W.T))
    if np.any(np.abs(lam) > 1.0 + 1e-9):
        raise ValueError("W must have spectral radius <= 1")
    lam = np.clip(lam, -1.0, 1.0)
    lam[lam > 1.0 - 1e-12] = 1.0
    lam[lam < -1.0 + 1e-12] = -1.0
    return lam, phi


def walk_sum_matrix(W: np.ndarray, T: int | float) -> np.ndarray:
    """``S_T = sum_{t=1}^T W^t / t = Phi diag(h_T(lambda)) Phi^T`` for a symmetric W (note 002
    section 3.2, the exact finite-T version of the per-contribution bound (13)).

    Eigenvalues within 1e-12 of +-1 are snapped to +-1 (for a stochastic W the top eigenvalue is
    exactly 1; this removes a T * 1e-15 error). ``T = inf`` requires all eigenvalues < 1 (e.g. the
    star's ``A/(n-1)``). Entries are >= 0 for a non-negative W.
    """
    lam, phi = _sym_eig(W)
    if math.isinf(T) and np.any(lam >= 1.0):
        raise ValueError("T = inf needs all eigenvalues < 1")
    hv = walk_h(lam, T)
    S = (phi * hv) @ phi.T
    return 0.5 * (S + S.T)


def walk_closed_form16(W: np.ndarray, T: int) -> np.ndarray:
    """The paper's eq. (16) bracket: ``ln(T)/n - [ln(I - W + 11^T/n)]_{uv}`` (note 002 section
    3.1). Uses ln T instead of H_T and drops O(lambda_2^T): it can be negative for distant pairs.
    The per-contribution RDP of the paper is ``alpha/sigma_m^2`` times this."""
    W = np.asarray(W, dtype=np.float64)
    n = W.shape[0]
    _sym_eig(W)
    M = np.eye(n) - W + np.full((n, n), 1.0 / n)
    mu, phi = np.linalg.eigh(0.5 * (M + M.T))
    if np.any(mu <= 0):
        raise ValueError("I - W + 11^T/n must be positive definite (connected W, lambda_n > -1)")
    logm = (phi * np.log(mu)) @ phi.T
    return math.log(T) / n - 0.5 * (logm + logm.T)


def star_theorem4(n: int, kappa: float = 0.0) -> tuple[float, float]:
    """Thm 4 of the random-walk paper (note 002 section 3.5), per single contribution, in units of
    ``alpha/sigma_m^2``: (centre-leaf, leaf-leaf) =

        (1-kappa)/(2 sqrt(n-1)) ln((sqrt(n-1)+1)/(sqrt(n-1)-1)),
        -(1-kappa)/(2(n-1)) ln(1 - 1/(n-1))      (the 1/2 restored, as the note checks).

    For kappa = 0 these are exactly ``[S_inf]`` of the paper's (non-stochastic) ``W = A/(n-1)``,
    A the star's adjacency matrix (Prop 1 series); the ``(1-kappa)`` is the paper's first-order
    treatment of the self-loops ``(1-kappa)A + kappa I``. Needs n >= 3.
    """
    if n < 3:
        raise ValueError("need n >= 3")
    r = math.sqrt(n - 1.0)
    cl = (1.0 - kappa) / (2.0 * r) * math.log((r + 1.0) / (r - 1.0))
    ll = -(1.0 - kappa) / (2.0 * (n - 1.0)) * math.log1p(-1.0 / (n - 1.0))
    return cl, ll


def ring_theorem5_corrected(n: int, d: int, kappa: float) -> float:
    """Corrected ring closed form (note 002 section 3.6): for ``W = kappa I + (1-kappa)(J+J^T)/2``
    (J the cyclic shift), ``mu_k = kappa + (1-kappa) cos(2 pi k/n)`` and cyclic distance d,

        [-ln(I - W + 11^T/n)]_{uv} = (1/n) sum_{k=1}^{n-1} -ln(1 - mu_k) cos(2 pi k d / n),

    the graph term of the per-contribution bound (``S_T - H_T 11^T/n`` as T -> inf), in units of
    ``alpha/sigma_m^2``. The paper's (u+v-2) and k = 1..n are the errors corrected here.
    """
    if n < 3 or not (0.0 <= kappa < 1.0):
        raise ValueError("need n >= 3 and 0 <= kappa < 1")
    k = np.arange(1, n)
    mu = kappa + (1.0 - kappa) * np.cos(2.0 * math.pi * k / n)
    return float(np.sum(-np.log1p(-mu) * np.cos(2.0 * math.pi * k * (d % n) / n)) / n)


def _neighbour_max(Fm: np.ndarray, A: np.ndarray) -> np.ndarray:
    """``G[v, u] = max_{w : A[v, w]} Fm[w, u]`` (0 if v has no neighbour); A has zero diagonal."""
    n = Fm.shape[0]
    nnz = int(A.sum())
    G = np.zeros((n, n), dtype=np.float64)
    mean_deg = max(nnz / n, 1.0)
    # cost model (measured): a contiguous row gather per v costs n * deg(v); the rank scan costs
    # ~ n^2 * (n / deg) random accesses, about 20 times dearer per element
    if n * nnz <= 20.0 * n**3 / mean_deg:
        for v in range(n):
            nb = np.flatnonzero(A[v])
            if nb.size:
                G[v] = Fm[nb].max(axis=0)
        return G
    # dense graphs: per source u, scan w by decreasing Fm[w, u] until a neighbour of v appears
    order = np.argsort(-Fm, axis=0, kind="stable")
    vv, uu = np.divmod(np.arange(n * n, dtype=np.int64), n)
    for r in range(n):
        if vv.size == 0:
            break
        w = order[r, uu]
        hit = A[vv, w]
        G[vv[hit], uu[hit]] = Fm[w[hit], uu[hit]]
        vv, uu = vv[~hit], uu[~hit]
    return G


def walk_sgd_factors(
    W: np.ndarray,
    T: int,
    sender_known: bool = False,
    adjacency: np.ndarray | None = None,
) -> np.ndarray:
    """Per-contribution factor matrix ``F[v, u]`` (observer v, source u) of random-walk DP-SGD.

    Hidden sender (Thm 3, note 002 section 3.2): ``F = 2 [S_T]_{uv}`` (the bound
    ``sum_t alpha W^t_{uv}/(sigma_m^2 t)`` with noise std ``sigma_m Delta`` is
    ``2 alpha rho [S_T]_{uv}``, ``rho = 1/(2 sigma_m^2)``).

    Sender known (App. B.1, note 002 section 3.7): ``F[v, u] = max_{w in N(v), w != v} F(u -> w)``
    where, for ``w = u``, ``max(2 [S_T]_{uu}, 1)`` is used. Deviation from the paper's code
    (which uses the diagonal of its closed form there): when u hands the token directly to v, v
    sees u's update after u's own noise only, which is factor 1 (local DP), whatever the
    diagonal of S_T says. ``N(v)`` is ``adjacency`` (bool, symmetric) or ``W > 0`` off-diagonal.
    The diagonal of the result is 0.
    """
    S = walk_sum_matrix(W, T)
    n = S.shape[0]
    F = 2.0 * S
    if sender_known:
        if adjacency is None:
            A = np.asarray(W) > 0
        else:
            A = np.asarray(adjacency, dtype=bool)
            if A.shape != (n, n):
                raise ValueError("adjacency must be n x n")
        A = A.copy()
        np.fill_diagonal(A, False)
        Fm = F.copy()
        np.fill_diagonal(Fm, np.maximum(np.diag(F), 1.0))
        F = _neighbour_max(Fm, A)
    np.fill_diagonal(F, 0.0)
    return F


def walk_sgd_theorem3(
    W: np.ndarray,
    T: int,
    rho: float,
    delta: float,
    N_u: float | np.ndarray,
    sender_known: bool = False,
    adjacency: np.ndarray | None = None,
) -> np.ndarray:
    """(eps) matrix ``E[v, u]`` (observer v, source u) of random-walk DP-SGD, Thm 3 / eq. (16)
    with the exact finite-T sum (note 002 section 3.9 recipe).

    ``RDP(alpha) = alpha rho N_u[u] F[v, u]`` with F from :func:`walk_sgd_factors`; the weak
    convexity step needs ``sigma_m^2 >= 2 alpha (alpha - 1)``, i.e. ``4 alpha (alpha-1) rho <= 1``,
    so ``alpha_max = (1 + sqrt(1 + 1/rho))/2``; converted with the improved conversion over
    ``alpha in (1, alpha_max]`` at ``delta`` (the caller accounts for any tail of N_u).
    ``N_u``: scalar or per-source array (n,). Diagonal 0.
    """
    _check_delta(delta)
    if rho <= 0:
        raise ValueError("rho must be > 0")
    F = walk_sgd_factors(W, T, sender_known, adjacency)
    n = F.shape[0]
    nu = np.broadcast_to(np.asarray(N_u, dtype=np.float64), (n,))
    a_max = 0.5 * (1.0 + math.sqrt(1.0 + 1.0 / rho))
    eps, _ = eps_from_linear_rdp_capped(rho * F * nu[None, :], a_max, delta)
    np.fill_diagonal(eps, 0.0)
    return eps


def first_passage(W: np.ndarray, u: int, v: int, T: int) -> np.ndarray:
    """``f_t = P_u(first visit to v at step t)``, t = 1..T (index t-1), via the taboo matrix
    (note 002 section 3.2): ``f_t = [Q^{t-1} W_{:, v}]_u`` with Q = W with column v zeroed.
    For u = v this is the first-return distribution. ``f_t <= (W^t)_{uv}``."""
    W = np.asarray(W, dtype=np.float64)
    n = W.shape[0]
    if not (0 <= u < n and 0 <= v < n) or T < 0:
        raise ValueError("bad u, v or T")
    Q = W.copy()
    Q[:, v] = 0.0
    b = W[:, v].copy()
    f = np.zeros(T, dtype=np.float64)
    for t in range(T):
        f[t] = b[u]
        b = Q @ b
    return f
