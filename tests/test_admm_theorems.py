"""Private ADMM accounting (thesis Chapter 8, Appendix E): Theorems 8.7, 8.9 (local and central),
Remark 8.10 and Theorem 8.12 (printed closed form, conservative closed form, numerical), each
recomputed here from its formula written independently, at three parameter points; the sigma
conditions are respected (None outside, a number inside); the numerical 8.12 is compared with
local DP and the closed forms; monotonicity in sigma, n and K_i."""

from __future__ import annotations

import math

import numpy as np
import pytest

from coordinator_free.accounting import loss
from coordinator_free.privacy import admm

# (alpha, K, L, gamma, sigma, n)
POINTS = [
    (2.0, 100, 1.0, 0.1, 1.0, 50),
    (5.0, 10, 0.5, 0.02, 0.3, 16),
    (1.5, 1000, 2.0, 1.0, 20.0, 1000),
]


def _eloc(alpha, L, gamma, sigma):
    # one contribution: shift 4 lam gamma L of u_i against noise lam sigma: alpha shift^2 / (2 std^2)
    return alpha * (4.0 * gamma * L) ** 2 / (2.0 * sigma**2)


@pytest.mark.parametrize("alpha, K, L, gamma, sigma, n", POINTS)
def test_theorem_8_7_and_8_9_local(alpha, K, L, gamma, sigma, n):
    assert admm.local_rdp(alpha, K, L, gamma, sigma) == pytest.approx(
        K * _eloc(alpha, L, gamma, sigma), rel=1e-12
    )
    assert admm.local_rdp(alpha, K, L, gamma, sigma) == pytest.approx(
        8 * alpha * K * L**2 * gamma**2 / sigma**2, rel=1e-12
    )
    # Thm 8.7: the (1/n)-weighted record loss is L/n-Lipschitz
    assert admm.central_rdp(alpha, K, L, gamma, sigma, n) == pytest.approx(
        K * _eloc(alpha, L / n, gamma, sigma), rel=1e-12
    )
    assert admm.central_rdp(alpha, K, L, gamma, sigma, n) == pytest.approx(
        8 * alpha * K * L**2 * gamma**2 / (sigma**2 * n**2), rel=1e-12
    )


def _mtz_ok(alpha, q, z):
    # Lemma E.5 / Mironov-Talwar-Zhang Thm 11, written out again
    if q >= 0.2 or z < 4:
        return False
    M = math.log(1 + 1 / (q * (alpha - 1)))
    c1 = alpha <= 0.5 * z * z * M - 2 * math.log(z)
    den = M + math.log(q * alpha) + 1 / (2 * z * z)
    c2 = den > 0 and alpha <= (M * M * z * z / 2 - math.log(5 * z * z)) / den
    return c1 and c2


# (alpha, K, L, gamma, sigma, n, m): inside Lemma E.5's conditions
FED = [
    (2.0, 100, 1.0, 0.1, 2.0, 1000, 20),
    (4.0, 50, 1.0, 0.05, 1.0, 500, 40),
    (1.5, 1000, 0.5, 1.0, 10.0, 10000, 100),
]


@pytest.mark.parametrize("alpha, K, L, gamma, sigma, n, m", FED)
def test_theorem_8_9_central_corrected(alpha, K, L, gamma, sigma, n, m):
    z = sigma * math.sqrt(m) / (4 * gamma * L)  # noise std over sensitivity of the round's sum
    assert admm.federated_noise_multiplier(L, gamma, sigma, m) == pytest.approx(z)
    assert _mtz_ok(alpha, m / n, z)
    per_round = 2 * alpha * (m / n) ** 2 / z**2
    got = admm.federated_central_rdp(alpha, K, L, gamma, sigma, n, m)
    assert got == pytest.approx(K * per_round, rel=1e-12)
    assert got == pytest.approx(32 * alpha * K * m * L**2 * gamma**2 / (sigma**2 * n**2), rel=1e-12)
    # the printed Theorem 8.9 / E.9 is 2m times smaller: never returned
    printed = 16 * alpha * K * L**2 * gamma**2 / (sigma**2 * n**2)
    assert got == pytest.approx(2 * m * printed, rel=1e-12)
    # and the central figure is below the local one (subsampling and aggregation help)
    assert got < admm.local_rdp(alpha, K, L, gamma, sigma)


def test_theorem_8_9_central_conditions():
    # m >= n/5: no closed form
    assert admm.federated_central_rdp(2.0, 10, 1.0, 0.1, 2.0, 100, 20) is None
    # the lemma's sigma is the noise multiplier: sigma = 2 with 4 gamma L = 0.4 and m = 1 gives
    # z = 5 (ok), but 4 gamma L = 1 gives z = 2 < 4 although the ADMM sigma is the same
    assert admm.federated_central_rdp(2.0, 10, 1.0, 0.1, 2.0, 1000, 1) is not None
    assert admm.federated_central_rdp(2.0, 10, 1.0, 0.25, 2.0, 1000, 1) is None
    # large orders fail the order conditions
    z = admm.federated_noise_multiplier(1.0, 0.1, 2.0, 20)
    orders = np.linspace(1.01, 200, 2000)
    ok = [admm.subsampled_gaussian_ok(a, 0.02, z) for a in orders]
    assert ok[0] and not ok[-1]
    for a, good in zip(orders, ok, strict=True):
        got = admm.federated_central_rdp(float(a), 10, 1.0, 0.1, 2.0, 1000, 20)
        assert (got is not None) == good == _mtz_ok(float(a), 0.02, z)


@pytest.mark.parametrize("alpha, K, L, gamma, sigma, n", POINTS)
def test_remark_8_10_secure_aggregation(alpha, K, L, gamma, sigma, n):
    m = max(1, n // 10)
    # the server sees the sum of m updates: shift 4 lam gamma L, noise lam sigma sqrt(m)
    want = K * alpha * (4 * gamma * L) ** 2 / (2 * sigma**2 * m)
    assert admm.secure_aggregation_rdp(alpha, K, L, gamma, sigma, m) == pytest.approx(want)
    assert admm.secure_aggregation_rdp(alpha, K, L, gamma, sigma, 1) == pytest.approx(
        admm.local_rdp(alpha, K, L, gamma, sigma)
    )


# (alpha, K_i, L, gamma, sigma, n): inside sigma > 2 L gamma sqrt(alpha (alpha - 1))
NET = [
    (2.0, 10, 1.0, 0.1, 1.0, 16),
    (5.0, 40, 1.0, 0.1, 2.0, 64),
    (1.2, 3, 0.5, 1.0, 1.0, 1000),
]


@pytest.mark.parametrize("alpha, K, L, gamma, sigma, n", NET)
def test_theorem_8_12_closed_forms(alpha, K, L, gamma, sigma, n):
    assert sigma > 2 * L * gamma * math.sqrt(alpha * (alpha - 1))
    printed = 8 * alpha * K * L**2 * gamma**2 * math.log(n) / (sigma**2 * n)
    assert admm.network_rdp_closed(alpha, K, L, gamma, sigma, n) == pytest.approx(printed)
    # conservative: first bound eps_loc/m, factor 1 + c = 2, exact geometric pmf
    eloc = _eloc(alpha, L, gamma, sigma)
    series = sum((1 / n) * (1 - 1 / n) ** (m - 1) * eloc / m for m in range(1, 200 * n))
    cons = admm.network_rdp_conservative(alpha, K, L, gamma, sigma, n)
    if alpha <= admm.alpha_max_conservative(sigma, L, gamma):
        assert cons == pytest.approx(2 * K * series, rel=1e-9)
        assert cons == pytest.approx(2 * printed * n / (n - 1), rel=1e-12)
    else:
        assert cons is None


@pytest.mark.parametrize("alpha, K, L, gamma, sigma, n", NET)
def test_theorem_8_12_numeric(alpha, K, L, gamma, sigma, n):
    eloc = _eloc(alpha, L, gamma, sigma)
    T = 40 * n
    steps = [1 + (T // (K + 1)) * j for j in range(1, K + 1)]

    def per(k, release):
        r = T - k
        w = [(1 / n) * (1 - 1 / n) ** (m - 1) for m in range(1, r + 1)]
        e = [eloc / m for m in range(1, r + 1)]
        tail = (1 - 1 / n) ** r
        s = sum(wi * math.exp((alpha - 1) * ei) for wi, ei in zip(w, e, strict=True))
        s += tail * (math.exp((alpha - 1) * eloc / (r + 1)) if release else 1.0)
        return math.log(s) / (alpha - 1)

    for release in (True, False):
        want = sum(per(k, release) for k in steps)
        got = admm.network_rdp(alpha, n, steps, T, L, gamma, sigma, final_release=release)
        assert got == pytest.approx(want, rel=1e-9)
        # never above local DP; the exact mixture is >= the mean (Jensen)
        assert got <= admm.local_rdp(alpha, K, L, gamma, sigma) + 1e-15
    # without a final release and for a long walk, the numeric figure lies between the
    # printed theorem (below it: the proof's factor 2 and n - 1) and the conservative closed form
    inf_walk = admm.network_rdp(alpha, n, K, 10**6, L, gamma, sigma, final_release=False)
    printed = admm.network_rdp_closed(alpha, K, L, gamma, sigma, n)
    assert printed < inf_walk
    cons = admm.network_rdp_conservative(alpha, K, L, gamma, sigma, n)
    if cons is not None:
        assert inf_walk <= cons


def test_theorem_8_12_relations_with_numbers():
    # alpha 5, K_i 10, L 1, gamma 0.1, sigma 2, n 16 (eps_loc = 0.1): documented in docs/privacy.md
    a, K, L, g, s, n = 5.0, 10, 1.0, 0.1, 2.0, 16
    printed = admm.network_rdp_closed(a, K, L, g, s, n)
    cons = admm.network_rdp_conservative(a, K, L, g, s, n)
    infinite = admm.network_rdp(a, n, K, 10**5, L, g, s, final_release=False)
    last = admm.network_rdp(a, n, K, 10**5, L, g, s)  # the last 10 steps, final z released
    local = admm.local_rdp(a, K, L, g, s)
    assert printed == pytest.approx(0.17329, abs=1e-5)
    assert infinite == pytest.approx(0.19767, abs=1e-5)
    assert cons == pytest.approx(0.36968, abs=1e-5)
    assert last == pytest.approx(0.37329, abs=1e-5)
    assert local == pytest.approx(1.0)
    assert printed < infinite < cons < last < local


def test_network_rdp_respects_the_sigma_condition():
    L, g, s, n = 1.0, 0.1, 1.0, 16
    amax = admm.alpha_max(s, L, g)
    assert s == pytest.approx(2 * L * g * math.sqrt(amax * (amax - 1)))
    below, above = amax * (1 - 1e-9), amax * (1 + 1e-9)
    for fn in (
        lambda a: admm.network_rdp(a, n, 5, 200, L, g, s),
        lambda a: admm.network_rdp(a, n, [3, 50], 200, L, g, s, observer_visits=[10, 60]),
        lambda a: admm.network_rdp_closed(a, 5, L, g, s, n),
        lambda a: admm.network_rdp_per_contribution(a, n, 100, L, g, s),
    ):
        assert fn(below) is not None and fn(below) > 0
        assert fn(above) is None
        assert fn(amax) is None  # strict inequality
        for a in np.linspace(1.001, 3 * amax, 300):
            v = fn(float(a))
            assert (v is not None) == admm.in_condition(float(a), s, L, g)
    ac = admm.alpha_max_conservative(s, L, g)
    assert ac < amax
    assert admm.network_rdp_conservative(ac * (1 - 1e-9), 5, L, g, s, n) is not None
    assert admm.network_rdp_conservative(ac * (1 + 1e-9), 5, L, g, s, n) is None


def test_realised_visits():
    L, g, s, n, T = 1.0, 0.1, 2.0, 8, 100
    a = 3.0
    eloc = _eloc(a, L, g, s)
    got = admm.network_rdp(a, n, [10, 40, 95], T, L, g, s, observer_visits=[12, 41, 60])
    # gaps 2, 1 and the final z (T - 95 + 1 = 6 noisy steps)
    assert got == pytest.approx(eloc / 2 + eloc / 1 + eloc / 6)
    no_rel = admm.network_rdp(
        a, n, [10, 40, 95], T, L, g, s, observer_visits=[12, 41, 60], final_release=False
    )
    assert no_rel == pytest.approx(eloc / 2 + eloc / 1)
    with pytest.raises(ValueError, match="step indices"):
        admm.network_rdp(a, n, 3, T, L, g, s, observer_visits=[1])


@pytest.mark.parametrize("release", [True, False])
def test_monotone_in_sigma_n_and_contributions(release):
    L, g, T = 1.0, 0.1, 500
    a = 2.0
    sig = [admm.network_rdp(a, 16, 5, T, L, g, s, final_release=release) for s in (1, 2, 4, 8)]
    assert all(x > y for x, y in zip(sig, sig[1:], strict=False))
    ns = [admm.network_rdp(a, n, 5, T, L, g, 1.0, final_release=release) for n in (4, 16, 64, 256)]
    assert all(x > y for x, y in zip(ns, ns[1:], strict=False))
    ks = [admm.network_rdp(a, 16, k, T, L, g, 1.0, final_release=release) for k in (1, 2, 5, 20)]
    assert all(x < y for x, y in zip(ks, ks[1:], strict=False))
    for fn in (admm.local_rdp, admm.network_rdp_closed):
        assert fn(a, 5, L, g, 1.0, *(() if fn is admm.local_rdp else (16,))) > fn(
            a, 5, L, g, 2.0, *(() if fn is admm.local_rdp else (16,))
        )
    assert admm.central_rdp(a, 5, L, g, 1.0, 16) > admm.central_rdp(a, 5, L, g, 1.0, 32)
    assert admm.central_rdp(a, 5, L, g, 1.0, 16) < admm.central_rdp(a, 6, L, g, 1.0, 16)


@pytest.mark.parametrize(
    "call, what",
    [
        (lambda: admm.local_rdp(1.0, 1, 1.0, 0.1, 1.0), "alpha"),
        (lambda: admm.local_rdp(2.0, 1, 1.0, 0.1, 0.0), "sigma"),
        (lambda: admm.local_rdp(2.0, -1, 1.0, 0.1, 1.0), "K_i"),
        (lambda: admm.local_rdp(2.0, 1, 0.0, 0.1, 1.0), "L"),
        (lambda: admm.local_rdp(2.0, 1, 1.0, -0.1, 1.0), "gamma"),
        (lambda: admm.central_rdp(2.0, 1, 1.0, 0.1, 1.0, 1), "n"),
        (lambda: admm.federated_central_rdp(2.0, 1, 1.0, 0.1, 1.0, 10, 11), "m"),
        (lambda: admm.federated_central_rdp(2.0, 1, 1.0, 0.1, 1.0, 10, 0), "m"),
        (lambda: admm.network_rdp_closed(0.5, 1, 1.0, 0.1, 1.0, 10), "alpha"),
        (lambda: admm.network_rdp(2.0, 10, 5, 3, 1.0, 0.1, 1.0), "horizon"),
        (lambda: admm.network_rdp(2.0, 10, [0, 2], 3, 1.0, 0.1, 1.0), "step"),
        (lambda: admm.network_rdp(2.0, 10, [2, 2], 3, 1.0, 0.1, 1.0), "distinct"),
        (lambda: admm.network_rdp(2.0, 1, 1, 3, 1.0, 0.1, 1.0), "n"),
        (lambda: admm.network_rdp(2.0, 10, 1, 3, 1.0, 0.1, 1.0, hop_probability=1.0), "hop"),
        (lambda: admm.alpha_max(-1.0, 1.0, 0.1), "sigma"),
        (lambda: admm.local_rdp(float("nan"), 1, 1.0, 0.1, 1.0), "alpha"),
        (lambda: admm.local_rdp(2.0, 1.5, 1.0, 0.1, 1.0), "K_i"),
    ],
)
def test_bad_input_is_an_error(call, what):
    with pytest.raises(ValueError, match=what):
        call()


# ----------------------------------------------------------------------------- typed loss path


def _brute(curve, delta, a_max):
    a = 1.0 + np.geomspace(1e-4, a_max - 1.0, 1500)
    a = np.append(a, a_max - 1e-9 * (a_max - 1.0))  # a strict condition's limit, from below
    best = math.inf
    for x in a.tolist():
        r = curve(x)
        if r is None:
            continue
        best = min(best, r + math.log1p(-1 / x) - (math.log(delta) + math.log(x)) / (x - 1))
    return max(0.0, best)


def test_loss_curve_matches_theorem_on_a_linear_curve():
    L, g, s = 1.0, 0.1, 2.0
    u = loss.Units(alpha=4.0, delta=1e-5, sensitivity=4 * g * L, sigma=s)
    am = admm.alpha_max(s, L, g)
    lin = loss.theorem(u, 20.0, am)
    cur = loss.curve(
        u, lambda a: admm.network_rdp_closed(a, 20, L, g, s, 2) and 20 * a * u.ldp_rho, am
    )
    assert cur.eps == pytest.approx(lin.eps, rel=1e-6)
    assert cur.factor == pytest.approx(lin.factor, rel=1e-9)
    assert cur.rdp == pytest.approx(lin.rdp)
    assert cur.conversion == "rdp-orders" and cur.extra["alpha"] < am


@pytest.mark.parametrize("K, T, release", [(5, 300, True), (20, 2000, False), (1, 50, True)])
def test_loss_curve_of_the_numeric_theorem(K, T, release):
    L, g, s, n = 1.0, 0.1, 2.0, 16
    u = loss.Units(alpha=4.0, delta=1e-5, sensitivity=4 * g * L, sigma=s)
    am = admm.alpha_max(s, L, g)
    calls: list[float] = []

    def f(a):
        calls.append(a)
        return admm.network_rdp(a, n, K, T, L, g, s, final_release=release)

    local = u.rdp_bound(K)
    got = loss.curve(u, f, am, cap=local.eps)
    # no order outside the condition was used for a figure; the limit itself is excluded
    assert got.extra["alpha"] < am
    assert all(a <= am for a in calls)
    # the conversion is at least as good as a brute-force grid of allowed orders, and not
    # better than it by more than the grid's coarseness
    brute = _brute(f, 1e-5, am)
    assert got.eps <= brute + 1e-9
    assert got.eps >= brute - 1e-3 * brute
    # below the local-DP curve converted at the same orders (it is below it at every order);
    # the usable figure is also below local DP over every order; the envelope factor is <= K
    assert got.eps <= loss.theorem(u, float(K), am).eps + 1e-9
    assert got.extra["eps_usable"] <= local.eps
    assert 0 < got.factor <= K * (1 + 1e-12)
    assert got.rdp == pytest.approx(f(4.0))
    assert got.extra["eps_usable"] == pytest.approx(min(got.eps, local.eps))


def test_loss_curve_without_allowed_orders():
    u = loss.Units(alpha=4.0, delta=1e-5, sensitivity=0.4, sigma=0.01)
    assert loss.curve(u, lambda a: None, 3.0).eps is None
    got = loss.curve(u, lambda a: 1.0, 1.0, cap=2.5)
    assert got.eps is None and got.extra["eps_usable"] == 2.5
    with pytest.raises(ValueError, match="order"):
        loss.curve(u, lambda a: -1.0, 3.0)


@pytest.mark.parametrize("alpha, K, L, gamma, sigma, n, m", FED)
def test_lemma_e5_bound_is_above_the_exact_sampled_gaussian(alpha, K, L, gamma, sigma, n, m):
    # At integer orders where the lemma's conditions hold, the exact RDP of the Poisson-sampled
    # Gaussian (add/remove, Mironov-Talwar-Zhang Sec. 3.3) is below 2 q^2 alpha / z^2, and above
    # the per-round figure the thesis prints.
    q = m / n
    z = admm.federated_noise_multiplier(L, gamma, sigma, m)
    checked = 0
    for a in range(2, 60):
        if not admm.subsampled_gaussian_ok(float(a), q, z):
            continue
        terms = [
            math.comb(a, k) * (1 - q) ** (a - k) * q**k * math.exp((k * k - k) / (2 * z * z))
            for k in range(a + 1)
        ]
        exact = math.log(sum(terms)) / (a - 1)
        assert exact <= 2 * q * q * a / z**2
        # the printed Theorem 8.9 per round is below the mechanism's exact RDP: not a bound
        printed = 16 * a * L**2 * gamma**2 / (sigma**2 * n**2)
        assert printed < exact
        per_round = admm.federated_central_rdp(float(a), 1, L, gamma, sigma, n, m)
        assert per_round == pytest.approx(2 * q * q * a / z**2)
        checked += 1
    assert checked >= 1


def test_linear_coefficients_feed_theorem():
    L, g, s, n, K = 1.0, 0.1, 2.0, 16, 10
    u = loss.Units(alpha=4.0, delta=1e-5, sensitivity=admm.sensitivity(L, g), sigma=s)
    assert u.ldp_rho == pytest.approx(admm.local_rho(1, L, g, s))
    f = admm.factor_of(admm.network_rho(K, L, g, s, n), L, g, s)
    assert f == pytest.approx(2 * K * math.log(n) / (n - 1))
    am = admm.alpha_max_conservative(s, L, g)
    got = loss.theorem(u, f, am, cap=u.rdp_bound(K).eps)
    assert got.extra["alpha"] <= am
    assert got.rdp == pytest.approx(admm.network_rdp_conservative(4.0, K, L, g, s, n))
    # the same figure through loss.curve (linear curve, same orders)
    cur = loss.curve(u, lambda a: admm.network_rdp_conservative(a, K, L, g, s, n), am)
    assert cur.eps == pytest.approx(got.eps, rel=1e-6)
    with pytest.raises(ValueError, match="rho"):
        admm.factor_of(-1.0, L, g, s)


def _numerical_by_definition(alpha, n, steps, T, L, g, s, final_release):
    """Thm 8.12 numerically, one contribution at a time, from its definition: a contribution
    with r steps left reaches the observer after j <= r steps (probability p (1-p)^(j-1), loss
    eps_loc / j) or never (probability (1-p)^r: loss eps_loc / (r + 1) at the final release,
    else none); the Renyi moment's log over (alpha - 1), within [0, eps_loc], summed."""
    p = 1.0 / n
    eps_loc = _eloc(alpha, L, g, s)
    total = 0.0
    for k in steps:
        r = T - k
        terms = [
            p * (1 - p) ** (j - 1) * math.exp((alpha - 1) * eps_loc / j) for j in range(1, r + 1)
        ]
        terms.append(
            (1 - p) ** r * (math.exp((alpha - 1) * eps_loc / (r + 1)) if final_release else 1.0)
        )
        total += min(max(math.log(math.fsum(terms)) / (alpha - 1), 0.0), eps_loc)
    return total


@pytest.mark.parametrize("final_release", [True, False])
def test_theorem_8_12_numerical_equals_its_definition_contribution_by_contribution(final_release):
    """The numerical 8.12 (all contributions at once, from prefix sums) against the same law
    summed one contribution at a time, on 300 seeded points inside the sigma condition, with
    the contributions as a count and as step indices."""
    rng = np.random.default_rng(812)
    checked = 0
    for _ in range(300):
        T, n = int(rng.integers(1, 50)), int(rng.integers(2, 12))
        alpha = float(rng.choice([1.5, 2.0, 3.0, 8.0]))
        L, g = 1.0, 0.05
        s = float(rng.uniform(2.2, 4.0)) * L * g * math.sqrt(alpha * (alpha - 1))
        if rng.random() < 0.5:
            K = int(rng.integers(0, T + 1))
            got = admm.network_rdp(alpha, n, K, T, L, g, s, final_release=final_release)
            steps = range(T - K + 1, T + 1) if final_release else range(1, K + 1)
        else:
            steps = sorted(
                rng.choice(np.arange(1, T + 1), int(rng.integers(0, T + 1)), replace=False)
            )
            got = admm.network_rdp(alpha, n, steps, T, L, g, s, final_release=final_release)
        want = _numerical_by_definition(
            alpha, n, [int(k) for k in steps], T, L, g, s, final_release
        )
        assert got == pytest.approx(want, rel=1e-9, abs=1e-15), (T, n, alpha, list(steps))
        checked += 1
    assert checked == 300
