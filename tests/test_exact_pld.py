"""The ``exact`` column against an independent accountant: Google's dp-accounting PLD.

For Gaussian views taken from real plans (every linear-Gaussian family, several graphs, sigmas and
deltas), the Renyi curve an entry carries (``factor``: ``rho = factor * Delta^2 / (2 sigma^2)``)
is a Gaussian mechanism with sensitivity ``Delta * sqrt(factor)`` and noise ``sigma``. Its privacy
loss distribution, discretised finely, brackets the true eps at delta: the pessimistic estimate
from above, the optimistic one from below. The project's ``eps`` must lie in that bracket (never
under-reported) and within 1e-4 relative of the pessimistic estimate, and never above ``eps_rdp``
(the RDP conversion of the same curve). DECOR's SecLDP ``exact`` block
(:func:`coordinator_free.accounting.summary.guarantee`) is checked the same way.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from dp_accounting.pld import privacy_loss_distribution as pld

from coordinator_free import config as config_mod
from coordinator_free.accounting import audit, summary

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

#: (example, --set overrides, source): single-source exact plans of every Gaussian family.
CASES = [
    ("muffliato-hypercube.toml", ["privacy.sigma=2.0", "privacy.delta=1e-6"], 0),
    ("muffliato-ring.toml", ["protocol.steps=2"], 0),
    ("randomized-gossip-ring.toml", ["graph.kind='hypercube'", "graph.nodes=16"], 0),
    ("randomized-gossip-ring.toml", ["privacy.delta=1e-3"], 0),
    ("dsgd-breast-cancer.toml", ["protocol.rounds=4", "privacy.sigma=4.0", "graph.nodes=8"], 0),
    (
        "muffliato-gd-breast-cancer.toml",
        [
            "protocol.rounds=3",
            "privacy.sigma=4.0",
            "graph.kind='grid'",
            "graph.rows=4",
            "graph.cols=4",
        ],
        0,
    ),
    (
        "decor-breast-cancer.toml",
        ["privacy.sigma=20.0", "privacy.sigma_cor=20.0", "privacy.delta=1e-6"],
        3,
    ),
    ("decor-ring.toml", ["privacy.sigma=100.0", "privacy.collusion=1"], 0),
    ("ring-sum.toml", ["privacy.sigma=3.0", "privacy.delta=1e-7", "graph.nodes=16"], 0),
    ("complete-sum.toml", [], 0),
]

#: Distinct views checked against the PLD per plan (spread over the plan's range of losses).
PER_PLAN = 4
#: The PLD's discretisation: the pessimistic estimate (compared to 1e-4 relative) is this fine;
#: the optimistic one (a lower bound on the true eps) a coarser one, cheaper and still a bound.
INTERVAL = 1e-4
LOWER_INTERVAL = 1e-3


def _plan(example: str, overrides: list[str], source: int) -> dict:
    cfg = config_mod.load(EXAMPLES / example, overrides)
    return audit.plan_report(cfg, source=source, method="exact")


def _pld_eps(sensitivity: float, sigma: float, delta: float, *, pessimistic: bool) -> float:
    # The optimistic estimate needs the privacy-buckets construction (connect-the-dots is
    # pessimistic only; dp-accounting warns and switches otherwise).
    dist = pld.from_gaussian_mechanism(
        standard_deviation=sigma,
        sensitivity=sensitivity,
        pessimistic_estimate=pessimistic,
        value_discretization_interval=INTERVAL if pessimistic else LOWER_INTERVAL,
        use_connect_dots=pessimistic,
    )
    return dist.get_epsilon_for_delta(delta)


def _check_against_pld(eps: float, sensitivity: float, sigma: float, delta: float) -> None:
    upper = _pld_eps(sensitivity, sigma, delta, pessimistic=True)
    lower = _pld_eps(sensitivity, sigma, delta, pessimistic=False)
    assert lower <= upper
    # never under-reported: at least the PLD's lower bound on the true eps
    assert eps >= lower * (1 - 1e-12)
    assert eps == pytest.approx(upper, rel=1e-4)


def _spread(values: list[float], k: int) -> list[float]:
    """Up to k of the sorted distinct values, from the smallest to the largest."""
    if len(values) <= k:
        return values
    return [values[round(i * (len(values) - 1) / (k - 1))] for i in range(k)]


_checked: list[tuple[str, float, float]] = []


@pytest.mark.parametrize(
    "example,overrides,source", CASES, ids=[f"{c[0]}:{','.join(c[1])}" for c in CASES]
)
def test_exact_entries_are_the_gaussian_profile(example, overrides, source):
    rep = _plan(example, overrides, source)
    sigma, sens, delta, alpha = rep["sigma"], rep["sensitivity"], rep["delta"], rep["alpha"]
    entries = [rep["ldp"], *rep["losses"]]
    distinct: dict[float, dict] = {}
    for e in entries:
        assert e["conversion"] == "gaussian", e
        factor = e["factor"]
        rho = factor * sens**2 / (2 * sigma**2)
        # the curve in the entry is the factor's, at the config's order
        assert e["rdp"] == pytest.approx(alpha * rho, rel=1e-12, abs=1e-300)
        # the exact profile is never above the RDP conversion of the same curve
        assert e["eps"] <= e["eps_rdp"]
        if factor == 0:
            # a view that does not depend on the source at all
            assert e["eps"] == 0 and e["eps_rdp"] == 0
            continue
        distinct.setdefault(round(factor, 9), e)
    assert distinct, "no view depends on the source"
    for key in _spread(sorted(distinct), PER_PLAN):
        e = distinct[key]
        # a walk without a cap gives the view 2 delta/3 (delta_view): its profile is there
        d = e.get("delta_view", delta)
        _check_against_pld(e["eps"], sens * math.sqrt(e["factor"]), sigma, d)
        _checked.append((example, e["factor"], d))


@pytest.mark.parametrize(
    "example,overrides,source",
    [c for c in CASES if c[0].startswith("decor")],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_decor_secldp_exact_block_is_the_gaussian_profile(example, overrides, source):
    rep = _plan(example, overrides, source)
    block = rep["secldp"]["exact"]
    rho, delta = block["rho"], rep["delta"]
    assert block["conversion"] == "gaussian"
    assert block["eps"] <= block["eps_rdp"]
    # the worst node's eps (nodes whose rho differ in the last bits differ there too)
    assert block["eps"] == pytest.approx(max(rep["secldp"]["per_node_eps"]), rel=1e-12)
    # the same block straight from the summary, at the plan's worst node
    again = summary.guarantee([rho], rep["secldp"]["paper"]["rho"], delta, rep["alpha"])
    assert again["exact"]["eps"] == block["eps"]
    # mu^2 = 2 rho: unit noise, sensitivity sqrt(2 rho)
    _check_against_pld(block["eps"], math.sqrt(2 * rho), 1.0, delta)


def test_enough_views_were_checked():
    # runs after the parametrised test above in file order; alone, it checks them itself
    if not _checked:
        for case in CASES:
            test_exact_entries_are_the_gaussian_profile(*case)
    assert len(set(_checked)) >= 20, _checked
