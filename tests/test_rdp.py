"""RDP -> (eps, delta) conversions against published test vectors and Google's dp-accounting."""

from __future__ import annotations

import math

import numpy as np
import pytest

from coordinator_free.privacy.rdp import (
    delta_gaussian,
    eps_from_rdp_curve,
    eps_from_rho,
    eps_gaussian,
    eps_mironov,
    rdp_from_rho,
    rho_from_factor,
)

dp_accounting = pytest.importorskip("dp_accounting")
from dp_accounting.rdp import rdp_privacy_accountant as rdp_acc  # noqa: E402

RHOS = [1e-4, 3e-3, 1 / 32, 0.2, 1.0, 7.5, 60.0]
DELTAS = [1e-10, 1e-6, 1e-3, 1e-2]


def test_test_vector_rho_1_32_delta_1e_3():
    # Gaussian mechanism with scale 4 and sensitivity 1: rho = 1/(2*16) = 1/32.
    eps, alpha = eps_from_rho(1 / 32, 1e-3)
    assert eps == pytest.approx(0.6880024554878, rel=1e-12)
    assert alpha == pytest.approx(12.8087, rel=1e-4)
    assert eps_mironov(1 / 32, 1e-3) == pytest.approx(0.9604805472, rel=1e-10)
    # exact (analytic) Gaussian curve at the same rho
    assert eps_gaussian(1 / 32, 1e-3) == pytest.approx(0.5920067183621294, rel=1e-10)


def test_optimum_is_stationary_and_global():
    for rho in RHOS:
        for delta in DELTAS:
            eps, a = eps_from_rho(rho, delta)
            if eps == 0.0:
                continue
            # f'(alpha*) = rho + log(delta alpha*)/(alpha*-1)^2 = 0
            assert rho + math.log(delta * a) / (a - 1) ** 2 == pytest.approx(0.0, abs=1e-9 * rho)
            grid = np.concatenate([1 + np.logspace(-3, 4, 4000)])
            vals = rho * grid + np.log1p(-1 / grid) - (math.log(delta) + np.log(grid)) / (grid - 1)
            assert eps <= vals.min() + 1e-12 * max(1.0, eps)


@pytest.mark.parametrize("rho", RHOS)
@pytest.mark.parametrize("delta", DELTAS)
def test_grid_conversion_matches_dp_accounting_on_its_grid(rho, delta):
    acc = rdp_acc.RdpAccountant()
    acc.compose(dp_accounting.ZCDpEvent(rho))
    ref_eps, ref_order = acc.get_epsilon_and_optimal_order(delta)
    orders = np.asarray(rdp_acc.DEFAULT_RDP_ORDERS, dtype=float)
    eps, order = eps_from_rdp_curve(orders, rho * orders, delta)
    assert eps == pytest.approx(float(ref_eps), rel=1e-9, abs=1e-12)
    if eps > 0:
        assert order == pytest.approx(float(ref_order))
    # the continuous optimum is never worse than any grid
    assert eps_from_rho(rho, delta)[0] <= eps + 1e-12


@pytest.mark.parametrize("rho", RHOS)
@pytest.mark.parametrize("delta", DELTAS)
def test_continuous_conversion_matches_dp_accounting_on_a_fine_grid(rho, delta):
    eps, a = eps_from_rho(rho, delta)
    if eps == 0.0 or a <= 1.02:
        # dp-accounting does not evaluate orders below 1.01, so no fine grid around alpha*
        # exists there; its default grid still bounds the continuous optimum from above.
        acc = rdp_acc.RdpAccountant()
        acc.compose(dp_accounting.ZCDpEvent(rho))
        assert eps <= float(acc.get_epsilon(delta)) + 1e-12
        return
    # Tolerance: dp-accounting minimises the same formula over a finite grid of orders. With
    # orders alpha*(1 + k*1e-5), |k| <= 50, the grid point nearest alpha* is within
    # h = 5e-6 alpha* of it, and f(alpha) - f(alpha*) <= f''(xi) h^2 / 2. Near alpha*,
    # f'' = d/da[log(delta a)/(a-1)^2] is O(rho / (alpha*-1)) for these ranges, so the gap is far
    # below 1e-6 relative; the assertion uses 1e-6 relative.
    orders = [a * (1 + k * 1e-5) for k in range(-50, 51)]
    acc = rdp_acc.RdpAccountant(orders=orders)
    acc.compose(dp_accounting.ZCDpEvent(rho))
    ref = float(acc.get_epsilon(delta))
    assert ref >= eps - 1e-12 * eps  # grid minimum can only be larger
    assert eps == pytest.approx(ref, rel=1e-6)


def test_mironov_is_looser_and_matches_its_formula():
    for rho in RHOS:
        for delta in DELTAS:
            m = eps_mironov(rho, delta)
            assert m == pytest.approx(rho + 2 * math.sqrt(rho * math.log(1 / delta)))
            # Mironov's bound at alpha* = 1 + sqrt(log(1/delta)/rho) is one point of the
            # basic conversion; the improved conversion is smaller.
            assert eps_from_rho(rho, delta)[0] <= m


def test_edge_cases_and_validation():
    assert eps_from_rho(0.0, 1e-5) == (0.0, math.inf)
    # KL shortcut: delta^2 >= 1 - exp(-rho) gives eps = 0 (same rule as dp-accounting)
    assert eps_from_rho(1e-8, 0.1)[0] == 0.0
    assert eps_from_rdp_curve([2.0, 3.0], [0.0, 0.0], 1e-5)[0] == 0.0
    assert eps_from_rdp_curve([2.0, 3.0], [math.inf, 0.3], 1e-5)[1] == 3.0
    for bad in (0.0, 1.0, -1e-3, math.nan):
        with pytest.raises(ValueError):
            eps_from_rho(0.1, bad)
    with pytest.raises(ValueError):
        eps_from_rho(-0.1, 1e-5)
    with pytest.raises(ValueError):
        eps_from_rdp_curve([1.0, 2.0], [0.1, 0.2], 1e-5)
    with pytest.raises(ValueError):
        eps_from_rdp_curve([2.0], [0.1, 0.2], 1e-5)
    with pytest.raises(ValueError):
        rdp_from_rho(0.1, 1.0)
    assert rdp_from_rho(0.25, 4.0) == 1.0


def test_units_factor_to_rho():
    # factor 1 is the LDP loss: RDP(alpha) = alpha Delta^2 / (2 sigma^2)
    rho = float(rho_from_factor(1.0, sensitivity=2.0, sigma=4.0))
    assert rho == pytest.approx(4.0 / 32.0)
    assert rdp_from_rho(rho, 2.0) == pytest.approx(2 * 4.0 / 32.0)
    np.testing.assert_allclose(rho_from_factor(np.array([0.0, 0.5]), 1.0, 1.0), [0.0, 0.25])
    with pytest.raises(ValueError):
        rho_from_factor(1.0, 1.0, 0.0)


@pytest.mark.parametrize("rho", [1e-3, 1 / 32, 0.5, 4.0])
def test_gaussian_curve(rho):
    for delta in (1e-8, 1e-5, 1e-2):
        e = eps_gaussian(rho, delta)
        if e > 0:
            assert delta_gaussian(rho, e) == pytest.approx(delta, rel=1e-8)
        # the exact Gaussian curve is tighter than any RDP-based conversion
        assert e <= eps_from_rho(rho, delta)[0] + 1e-12


def test_gaussian_curve_matches_dp_accounting_pld():
    pld = pytest.importorskip("dp_accounting.pld")
    sigma = 2.0  # sensitivity 1 -> mu = 1/2 -> rho = mu^2 / 2 = 1/8
    acc = pld.PLDAccountant(value_discretization_interval=1e-5)
    acc.compose(dp_accounting.GaussianDpEvent(noise_multiplier=sigma))
    for delta in (1e-6, 1e-3):
        ref = acc.get_epsilon(delta)
        # PLD discretisation is pessimistic by at most a few discretisation intervals
        assert eps_gaussian(1 / 8, delta) == pytest.approx(ref, abs=1e-3)
