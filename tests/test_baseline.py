"""Every loss read against local DP: the counts of amplified and fully exposed pairs, the usable
paper bound min(paper, local DP), calibration that never asks for more noise than local DP, and
the sentences the CLI prints. Checked against independent per-source plans and a direct
local-DP computation, not against the code's own summary."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from memrun import write_run_dir

from coordinator_free import cli, config
from coordinator_free.accounting import audit, baseline
from coordinator_free.accounting.core import Units
from coordinator_free.inmemory import run_config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
HYPERCUBE5 = ["graph.kind=hypercube", "graph.dim=5"]


def cfg_of(overrides, path=None):
    return config.load(path, overrides)


def per_pair(cfg, method):
    """(observer, source) -> entry, from one ``--source`` plan per source."""
    out = {}
    n = audit.plan_report(cfg, source=0, method=method)["n"]
    for u in range(n):
        for x in audit.plan_report(cfg, source=u, method=method)["losses"]:
            out[(x["observer"], u)] = x
    return out


@pytest.mark.parametrize("method", ["exact", "paper"])
def test_plan_counts_match_the_pairs(method):
    cfg = cfg_of(HYPERCUBE5)
    rep = audit.plan_report(cfg, source=None, method=method)
    ldp = rep["ldp"]["eps"]
    pairs = per_pair(cfg, method)
    raw_below = sum(1 for x in pairs.values() if x["eps"] < ldp * (1 - 1e-9))
    above = sum(1 for x in pairs.values() if x["eps"] > ldp * (1 + 1e-9))
    b = rep["baseline"]
    assert b["pairs"] == len(pairs) == 32 * 31
    assert b["amplified"] == raw_below
    assert b["exposed"] == len(pairs) - raw_below
    assert b["ldp_eps"] == ldp
    if method == "exact":
        # On the 5-cube the exact loss is amplified at distance 2 and 3 only.
        assert raw_below == 640
        neighbours = [x for x in pairs.values() if x["distance"] == 1]
        assert b["exposed_neighbours"] == len(neighbours) == 160
        assert all(x["eps"] == pytest.approx(ldp) for x in neighbours)
    else:
        assert above > 0 and b["paper_above_ldp"] == above
        for r in rep["by_distance"]:
            assert r["eps_max_usable"] == min(r["eps_max"], ldp)
        for x in audit.plan_report(cfg, source=0, method="paper")["losses"]:
            assert x["eps_usable"] == min(x["eps"], ldp)
            assert x["rdp_usable"] == min(x["rdp"], rep["ldp"]["rdp"])


def test_single_source_plan_counts():
    cfg = cfg_of(HYPERCUBE5)
    rep = audit.plan_report(cfg, source=3, method="exact")
    ldp = rep["ldp"]["eps"]
    below = [x for x in rep["losses"] if x["eps"] < ldp * (1 - 1e-9)]
    assert rep["baseline"]["pairs"] == 31
    assert rep["baseline"]["amplified"] == len(below) == 20  # C(5,2) + C(5,3)
    assert rep["baseline"]["exposed_neighbours"] == 5


def test_walk_paper_is_capped_at_ldp():
    cfg = cfg_of([], EXAMPLES / "ring-sum.toml")
    rep = audit.plan_report(cfg, source=None, method="paper")
    ldp = rep["ldp"]["eps"]
    assert rep["worst_pair"]["eps"] > ldp  # Theorem 1 here is above local DP...
    assert rep["worst_pair"]["eps_usable"] == ldp  # ...so local DP is the bound
    assert rep["baseline"]["paper_above_ldp"] == rep["baseline"]["pairs"] == 64 * 63
    assert rep["baseline"]["neighbours_see_values"] is False


def ldp_eps_at(rep, sigma):
    u = Units(alpha=2.0, delta=rep["delta"], sensitivity=rep["sensitivity"], sigma=sigma)
    exact = rep["ldp"].get("conversion") == "gaussian"
    return u.method("exact" if exact else "paper")(rep["ldp"]["factor"]).eps


@pytest.mark.parametrize(
    "example,target,budget,method",
    [
        ("walk-sgd", 10.0, "mean", "paper"),
        ("muffliato-ring", 5.0, "mean", "paper"),
        ("muffliato-ring", 5.0, "worst", "exact"),
        ("ring-sum", 3.0, "worst", "paper"),
    ],
)
def test_calibration_never_needs_more_noise_than_ldp(example, target, budget, method):
    cfg = cfg_of([], EXAMPLES / f"{example}.toml")
    rep = audit.calibrate(cfg, target, method=method, budget=budget)
    # local DP at ldp_sigma meets the target, and just below it does not
    assert ldp_eps_at(rep, rep["ldp_sigma"]) <= target
    assert ldp_eps_at(rep, rep["ldp_sigma"] * (1 - 1e-6)) > target
    assert rep["sigma"] <= rep["ldp_sigma"] * (1 + 1e-9)
    gain = rep["gain"]
    assert gain["sigma_ratio"] == pytest.approx(rep["sigma"] / rep["ldp_sigma"])
    assert gain["gains_over_ldp"] == (rep["sigma"] < rep["ldp_sigma"] * (1 - 1e-6))
    assert ("why" in gain) == (not gain["gains_over_ldp"])


def test_calibration_says_when_the_protocol_gains_nothing(capsys):
    # The worst pair of any gossip protocol is a neighbour, who sees the noisy value itself.
    code = cli.main(["plan", str(EXAMPLES / "muffliato-ring.toml"), "--target-eps", "5"])
    out = capsys.readouterr().out
    assert code == 0
    assert "gains nothing over local DP" in out and "binding pair is fully exposed" in out
    # Walk-SGD's Theorem 3 is above local DP at the sigma it would pick alone: the usable
    # bound needs less noise than the theorem by itself, never more than local DP.
    cfg = cfg_of([], EXAMPLES / "walk-sgd.toml")
    rep = audit.calibrate(cfg, 10.0, method="paper", budget="mean")
    assert rep["sigma"] <= rep["ldp_sigma"]
    assert ldp_eps_at(rep, rep["sigma"]) >= 10.0 - 1e-6


def test_default_plan_shows_amplification(capsys):
    code = cli.main(["plan"])
    out = capsys.readouterr().out
    assert code == 0
    rep = audit.plan_report(
        config.load(None, default=config.RUN_DEFAULT_CONFIG), source=None, method="exact"
    )
    assert rep["n"] == 64
    b = rep["baseline"]
    assert b["amplified"] >= rep["baseline"]["pairs"] // 2  # most pairs below local DP
    assert f"{b['amplified']} of {b['pairs']} ordered pairs" in out
    assert f"{b['exposed_neighbours']} are neighbours" in out


def test_paper_plan_marks_capped_values(capsys):
    code = cli.main(["plan", *sum((["--set", s] for s in HYPERCUBE5), []), "--method", "paper"])
    out = capsys.readouterr().out
    assert code == 0
    rep = audit.plan_report(cfg_of(HYPERCUBE5), source=None, method="paper")
    d1 = rep["by_distance"][0]
    assert d1["distance"] == 1 and d1["eps_max"] > rep["ldp"]["eps"]
    assert f"{rep['ldp']['eps']:.4f}^" in out and baseline.LEGEND in out
    assert f"{d1['eps_max']:.4f}" not in out  # the raw formula is not printed as a bound


def test_audit_counts_and_caps(tmp_path, capsys):
    cfg = cfg_of(HYPERCUBE5 + ["protocol.steps=7"], EXAMPLES / "muffliato-ring.toml")
    run = write_run_dir(cfg, run_config(cfg, seed=3), tmp_path / "run")
    rep = audit.audit_run(run)
    ldp = rep["ldp"]["eps"]
    exact = [x for o in rep["observers"] for x in o["losses"] if x["method"] == "exact"]
    paper = [x for o in rep["observers"] for x in o["losses"] if x["method"] == "paper"]
    assert rep["baseline"]["amplified"] == sum(1 for x in exact if x["eps"] < ldp * (1 - 1e-9))
    assert rep["baseline"]["amplified"] == 640
    # a paper formula is a Renyi bound: capped by local DP in the same (RDP) conversion
    ldp_rdp = rep["ldp"]["eps_rdp"]
    assert rep["baseline"]["paper_above_ldp"] == sum(1 for x in paper if x["eps"] > ldp_rdp)
    assert all(x["eps_usable"] == min(x["eps"], ldp_rdp) for x in paper)
    code = cli.main(["audit", str(run), "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["baseline"] == rep["baseline"]


#: The capped keys and the local-DP key each is capped by (the rule of docs/privacy.md).
CAPPED = {"eps": "eps", "eps_max": "eps", "eps_mean": "eps", "rdp": "rdp", "rdp_max": "rdp",
          "rdp_mean": "rdp"}  # fmt: skip


def _capped_by_rule(entry: dict, ldp: dict) -> tuple[dict, bool]:
    """The entry as the cap leaves it, and whether a figure was above its bound, read directly
    off the rule: each numeric capped figure gets ``<key>_usable = min(figure, bound)``, the
    bound being local DP's figure of the same kind, in the RDP conversion (``eps_rdp``) for an
    eps that was not converted as a Gaussian."""
    out, above = dict(entry), False

    def number(x):
        return isinstance(x, int | float) and not isinstance(x, bool)

    for key, ldp_key in CAPPED.items():
        bound = ldp.get(ldp_key)
        if ldp_key == "eps" and entry.get("conversion") != "gaussian" and "eps_rdp" in ldp:
            bound = ldp["eps_rdp"]
        if number(entry.get(key)) and number(bound):
            out[key + "_usable"] = min(float(entry[key]), float(bound))
            above = above or float(entry[key]) > float(bound) * (1 + baseline.REL_TOL)
    return out, above


def test_cap_follows_the_rule_on_every_kind_of_entry():
    rng = random.Random(7)
    values = [None, True, False, 0, 3, 0.5, 4.377, 9.9, float("inf"), "4.0", [1.0]]
    ldps = [
        {"eps": 4.377, "rdp": 1.0, "eps_rdp": 4.728},
        {"eps": 4.377, "rdp": 1.0},
        {"eps": 2, "rdp": "1.0", "eps_rdp": True},
        {"eps": None, "rdp": 0.25, "eps_rdp": 3.0},
        {},
    ]
    checked = capped = 0
    for ldp in ldps:
        cap = baseline.capper(ldp)
        for _ in range(400):
            entry = {k: rng.choice(values) for k in CAPPED if rng.random() < 0.6}
            if rng.random() < 0.7:
                entry["conversion"] = rng.choice(["gaussian", "rdp", None])
            want, above = _capped_by_rule(entry, ldp)
            one, many = dict(entry), dict(entry)
            assert baseline.cap_entry(one, ldp) == above and one == want, (entry, ldp)
            assert cap(many) == above and many == want, (entry, ldp)
            checked += 1
            capped += len(want) > len(entry)
    assert checked == 2000 and capped > 500


def test_explain_sentences():
    block = {
        "ldp_eps": 4.7284,
        "method": "exact",
        "neighbours_see_values": True,
        "pairs": 10,
        "amplified": 0,
        "exposed": 10,
        "exposed_neighbours": 4,
        "paper_above_ldp": 3,
    }
    text = " ".join(baseline.explain(block))
    assert "no pair is amplified" in text
    assert "4 are neighbours" in text and "6 are farther away" in text
    assert "exceeds local DP for 3 pair(s)" in text
    walk = dict(block, neighbours_see_values=False, amplified=7, exposed=3)
    text = " ".join(baseline.explain(walk))
    assert "7 of 10 ordered pairs" in text and "neighbours" not in text
    assert baseline.explain(None) == [] and baseline.explain({"pairs": 0}) == []
