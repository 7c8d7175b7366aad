"""Closed-form theorems are evaluated only where their hypotheses hold: Theorem 4/9 of the
Muffliato paper (secret Erdős–Rényi graphs) at the Rényi orders its condition
sigma^2 >= Delta^2 alpha (alpha - 1) / 2 allows, as a per-pair worst case, with its expectation
over the graphs reported apart under an ``expected`` key."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

import coordinator_free
from coordinator_free import cli, config
from coordinator_free.accounting.audit import plan_report
from coordinator_free.families import family_of
from coordinator_free.privacy import private_graph, rdp, walk

REPO = Path(coordinator_free.__file__).resolve().parents[1]
DSGD = REPO / "examples" / "dsgd-breast-cancer.toml"
GD = REPO / "examples" / "muffliato-gd-breast-cancer.toml"


def _grid_eps(rho: float, delta: float, a_max: float) -> float:
    """Brute force: the improved conversion on a fine grid of orders in (1, a_max]."""
    a = np.concatenate([1.0 + np.geomspace(1e-6, a_max - 1.0, 200_000), [a_max]])
    f = rho * a + np.log1p(-1.0 / a) - (math.log(delta) + np.log(a)) / (a - 1.0)
    return max(0.0, float(f.min()))


@pytest.mark.parametrize(
    "rho, delta, a_max",
    [
        (0.25, 1e-5, 3.3722813232690143),  # optimum far above: clamped
        (0.25, 1e-5, 100.0),  # optimum inside
        (0.003, 1e-5, 14.6),
        (2.0, 1e-6, 1.5),
        (1e-4, 1e-3, 1.05),
        (0.05, 1e-5, math.inf),
    ],
)
def test_restricted_conversion_matches_a_brute_force_grid(rho, delta, a_max):
    eps, a = rdp.eps_from_rho_restricted(rho, delta, a_max)
    assert 1.0 <= a <= a_max
    grid = _grid_eps(rho, delta, min(a_max, 1e7))
    # the continuous optimum is never above a grid point, and the fine grid comes within 1e-6
    assert eps <= grid + 1e-12
    assert eps >= grid - 1e-6 * max(1.0, grid)
    # the value reported is the conversion at the order reported
    if a > 1.0:
        assert eps == pytest.approx(max(0.0, rdp._improved(rho * a, a, math.log(delta))), rel=1e-12)
    unrestricted, a_star = rdp.eps_from_rho(rho, delta)
    assert eps >= unrestricted - 1e-12
    assert (eps == pytest.approx(unrestricted)) == (a_star <= a_max)


def test_restricted_conversion_edge_cases():
    assert rdp.eps_from_rho_restricted(0.0, 1e-5, 2.0) == (0.0, 1.0)
    assert rdp.eps_from_rho_restricted(1e-12, 1e-5, 2.0)[0] == 0.0  # KL shortcut, order -> 1
    with pytest.raises(ValueError):
        rdp.eps_from_rho_restricted(0.1, 1e-5, 1.0)
    # no order > 1 allowed (sigma = 0): the theorem gives nothing
    assert private_graph.alpha_max(0.0, 2.0) == 1.0
    assert private_graph.theorem_eps(0.5, 0.1, 1e-5, 1.0) == {"eps": None, "alpha": None}


# ------------------------------------------------------------------ Theorem 4/9 recomputed


def _alpha_max(sigma: float, delta_s: float) -> float:
    # the largest alpha with alpha (alpha - 1) <= 2 sigma^2 / Delta^2, by bisection
    lo, hi = 1.0, 1.0 + 2.0 * sigma / delta_s + 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if sigma**2 >= delta_s**2 * mid * (mid - 1.0) / 2.0:
            lo = mid
        else:
            hi = mid
    return lo


def _thm49_expected_factor(n: int, p: float, K: int, R: int) -> float:
    """Per round: 1 when the pair is an edge (prob. p), else 2 K d/(n - d) capped at 1 with
    d ~ Bin(n - 2, p) the observer's degree; summed over R rounds."""
    far = 0.0
    for d in range(n - 1):
        far += stats.binom.pmf(d, n - 2, p) * min(1.0, 2.0 * K * d / (n - d))
    return R * (p + (1.0 - p) * far)


POINTS = [
    # n, p, R, sigma
    (64, 0.1, 3, 4.0),  # the docs' example: the theorem is above local DP at its orders
    (40, 0.2, 5, 1.0),  # alpha_max = 1.366: a narrow interval
    (200, 0.04, 20, 20.0),  # sparse, sigma >> Delta: the theorem's expectation beats local DP
]


def _hidden(n, p, R, sigma, *extra):
    return config.load(
        DSGD,
        [
            "graph.kind=erdos_renyi",
            f"graph.nodes={n}",
            f"graph.p={p}",
            "graph.resample=true",
            "graph.hidden=true",
            "protocol.weights=lazy",
            f"protocol.rounds={R}",
            f"privacy.sigma={sigma}",
            *extra,
        ],
    )


@pytest.mark.parametrize("n, p, R, sigma", POINTS)
def test_theorem_4_9_is_recomputed_from_its_formula(n, p, R, sigma):
    cfg = _hidden(n, p, R, sigma)
    plan = family_of("dsgd").make_plan(cfg)
    rep = plan_report(cfg, source=None, method="paper")
    pg = rep["private_graph_bound"]
    Delta, delta = plan.sensitivity, plan.delta
    ldp_rho = Delta**2 / (2 * sigma**2)
    ldp_eps = rdp.eps_from_rho(R * ldp_rho, delta)[0]
    assert rep["ldp"]["eps"] == pytest.approx(ldp_eps, rel=1e-12)

    a_max = _alpha_max(sigma, Delta)
    assert pg["alpha_max"] == pytest.approx(a_max, rel=1e-9)
    assert pg["condition"] == "sigma^2 >= Delta^2 alpha (alpha - 1) / 2"
    # Per pair, the worst case: an edge in every round, R-fold local DP; the plan's paper
    # column and its worst pair are that, never the expectation.
    assert pg["worst_pair"]["eps"] == pytest.approx(ldp_eps, rel=1e-12)
    assert rep["worst_pair"]["eps"] == pytest.approx(ldp_eps, rel=1e-12)
    assert rep["mean_over_pairs"]["eps"] == pytest.approx(ldp_eps, rel=1e-12)

    # The expectation over the graphs, at the allowed orders only.
    ex = pg["expected"]
    f = _thm49_expected_factor(n, p, plan.gossip_steps, R)
    assert ex["factor"] == pytest.approx(f, rel=1e-9)
    want = _grid_eps(f * ldp_rho, delta, a_max)
    assert ex["eps"] == pytest.approx(want, rel=1e-5)
    assert ex["eps"] <= want + 1e-12
    assert 1.0 < ex["alpha"] <= pg["alpha_max"]
    assert sigma**2 >= Delta**2 * ex["alpha"] * (ex["alpha"] - 1) / 2 * (1 - 1e-12)
    assert ex["eps_usable"] == pytest.approx(min(want, ldp_eps), rel=1e-5)
    # Without the restriction the expectation would look better: that is the defect fixed.
    free, a_free = rdp.eps_from_rho(f * ldp_rho, delta)
    if a_free > a_max:
        assert free < ex["eps"] - 1e-6


def test_the_three_points_cover_both_sides_of_local_dp():
    got = []
    for n, p, R, sigma in POINTS:
        pg = plan_report(_hidden(n, p, R, sigma), source=None, method="paper")
        got.append(pg["private_graph_bound"]["expected"]["eps"] < pg["ldp"]["eps"])
    assert got[0] is False and got[-1] is True


def _eps_keys(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _eps_keys(v, (*path, str(k)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _eps_keys(v, (*path, str(i)))
    elif path and path[-1].startswith("eps") and isinstance(obj, int | float):
        if not isinstance(obj, bool):
            yield path, float(obj)


HIDDEN_CMD = [
    "graph.kind=erdos_renyi",
    "graph.nodes=64",
    "graph.p=0.1",
    "graph.resample=true",
    "graph.hidden=true",
    "protocol.weights=lazy",
    "protocol.rounds=3",
    "privacy.sigma=4",
]


def test_hidden_graph_plan_prints_no_eps_below_local_dp_outside_expected(capsys):
    args = ["plan", str(DSGD), *[a for o in HIDDEN_CMD for a in ("--set", o)]]
    assert cli.main([*args, "--method", "paper", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    ldp = rep["ldp"]["eps"]
    assert ldp == pytest.approx(4.0113100566579485, rel=1e-9)
    seen = list(_eps_keys(rep))
    assert len(seen) > 10
    low = [(p, e) for p, e in seen if e < ldp * (1 - 1e-12) and not any("expected" in k for k in p)]
    assert not low, low
    ex = rep["private_graph_bound"]["expected"]
    assert ex["eps"] == pytest.approx(4.3638727982, rel=1e-8)  # the theorem at alpha <= 3.372
    assert ex["alpha"] == pytest.approx(rep["private_graph_bound"]["alpha_max"])
    # the human output names the order interval, the condition and the expectation
    assert cli.main([*args, "--method", "paper"]) == 0
    out = capsys.readouterr().out
    assert "alpha <= 3.372" in out and "sigma^2 >= Delta^2 alpha (alpha - 1) / 2" in out
    assert "expected over the graphs (not a per-pair bound)" in out


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0, 4.0, 30.0])
def test_no_order_above_the_condition_is_used(sigma):
    rep = plan_report(_hidden(64, 0.1, 3, sigma), source=None, method="paper")
    pg = rep["private_graph_bound"]
    a = pg["expected"]["alpha"]
    assert 1.0 <= a <= pg["alpha_max"]
    assert pg["condition_holds"] == (sigma**2 >= 4.0 * 2.0 * 1.0 / 2)  # Delta = 2, alpha = 2
    if not pg["condition_holds"]:
        assert pg["expected"]["rdp"] is None  # no figure at an order the theorem excludes


def test_public_graph_comparison_uses_only_allowed_orders():
    cfg = config.load(
        GD,
        [
            "graph.nodes=12",
            "graph.kind=erdos_renyi",
            "graph.p=0.3",
            "graph.resample=true",
            "protocol.rounds=4",
            "protocol.gossip_steps=1",
            "privacy.sigma=3",
        ],
    )
    pg = plan_report(cfg, source=None, method="paper")["private_graph_bound"]
    assert not pg["secret"]
    for key in ("worst_pair", "mean_over_pairs"):
        x = pg[key]
        assert 1.0 <= x["alpha"] <= pg["alpha_max"]
        assert x["eps"] == pytest.approx(
            rdp.eps_from_rho_restricted(x["factor"] * 4 / (2 * 9.0), 1e-5, pg["alpha_max"])[0]
        )


def test_walk_theorems_respect_their_noise_condition():
    # Lemma 1 / Thm 4 (complete-graph SGD) and Thm 3 (random-walk SGD): alpha (alpha - 1) rho <= 1
    # and 4 alpha (alpha - 1) rho <= 1 respectively.
    res = walk.complete_sgd_theorem4(64, 2000, 0.02, 1e-5)
    assert res["alpha"] <= res["alpha_max"]
    assert res["alpha"] * (res["alpha"] - 1) * 0.02 <= 1 + 1e-9
