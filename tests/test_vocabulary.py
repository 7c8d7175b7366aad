"""One vocabulary: the outputs say what their words mean, and never contradict themselves."""

from __future__ import annotations

import math

from coordinator_free import config
from coordinator_free.accounting.coalition import print_report
from coordinator_free.cli import build_parser
from coordinator_free.families import family_of
from coordinator_free.families.averaging import attack, render


def _coalition(example: str, members: list[int], sets=()):
    cfg = config.load(f"examples/{example}.toml", list(sets), [])
    fam = family_of(cfg.protocol.name)
    return fam.coalition_plan(cfg, fam.make_plan(cfg), members)


def test_a_coalition_above_local_dp_names_its_worst_eps_and_says_inf_only_when_it_is(capsys):
    rep = _coalition("ring-sum", [0, 5], ["protocol.distributed_noise=true"])
    worst = max(r["eps"] for r in rep["losses"])
    assert math.isfinite(worst) and worst > rep["ldp"]["eps"]
    print_report(rep)
    out = capsys.readouterr().out
    assert "eps inf" not in out and f"(the worst: eps {worst:.4f})" in out
    rep = _coalition("ring-sum", [0, 2])
    bare = sum(1 for r in rep["losses"] if math.isinf(r["eps"]))
    assert bare
    print_report(rep)
    assert f"({bare} under no noise at all: eps inf)" in capsys.readouterr().out


def _attack_result(reconstructed: list[bool]) -> dict:
    nodes = [{"node": v + 1, "distance": 1, "reconstructed": r, "factor": 1.0 if r else 0.5,
              "error": 0.0 if r else None} for v, r in enumerate(reconstructed)]  # fmt: skip
    return {"n": len(nodes) + 1, "attackers": [0], "messages": 9, "steps": 3, "rank": 9,
            "own_inputs": True, "nodes": nodes, "sigma": 1.0}  # fmt: skip


def test_attack_says_others_are_undetermined_only_when_some_are(capsys):
    attack.print_result(_attack_result([True] * 10))
    out = capsys.readouterr().out
    assert "10 of 10 other nodes reconstructed" in out
    assert "does not determine" not in out and "Every other node is determined" in out
    attack.print_result(_attack_result([True] * 7 + [False] * 3))
    out = capsys.readouterr().out
    assert "7 of 10" in out and "does not determine the other 3" in out


def test_the_run_summary_says_what_its_columns_mean(capsys):
    audit = {"central": False, "ldp": {"eps": 1.0}, "delta": 1e-5, "observers": [],
             "integrity": [], "baseline": {}}  # fmt: skip
    render.print_audit_compact(audit)
    out = " ".join(capsys.readouterr().out.split())
    assert " ".join(render.TERMS.split()) in out
    for word in ("exact:", "paper:", "below LDP:", "docs/privacy.md"):
        assert word in render.TERMS


def test_help_words_serve_every_protocol():
    text = {
        name: sub.format_help()
        for a in build_parser()._actions
        if hasattr(a, "choices") and isinstance(a.choices, dict)
        for name, sub in a.choices.items()
    }
    assert (
        "Muffliato averaging)" not in text["plan"] and "Muffliato averaging)" not in text["audit"]
    )
    assert "every protocol with peers" in text["plan"]
    assert "Rényi divergence of the observer's whole view" not in text["plan"]
