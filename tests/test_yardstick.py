"""The yardstick (coordinator_free/yardstick.py): the error the noise alone gives, per family.

The averaging mix is checked against the simulator exactly (its final values are M times the
noisy inputs); the token formulas against the errors of many simulated walks (the root mean
square over 60 seeds); learning against the noise-free reference it is made of."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator_free import config, seeds, yardstick
from coordinator_free.families import family_of
from coordinator_free.families.averaging import protocol as mf
from coordinator_free.families.walk.render import walk_outcomes


def _load(example: str, sets=(), faults=()):
    cfg = config.load(f"examples/{example}.toml", list(sets), list(faults))
    fam = family_of(cfg.protocol.name)
    return cfg, fam, fam.make_plan(cfg)


@pytest.mark.parametrize(
    "example,sets,faults",
    [
        ("muffliato-ring", (), ()),
        ("muffliato-ring", ("protocol.accelerated=true",), ()),
        ("muffliato-ring", ("protocol.steps=12",), ("dropout:0.3",)),
        ("muffliato-hypercube", (), ()),
        ("randomized-gossip-ring", (), ()),
    ],
)
def test_gossip_mix_is_what_the_simulator_computes(example, sets, faults) -> None:
    cfg, fam, plan = _load(example, sets, faults)
    if faults:
        assert plan.dropped and any(plan.dropped), "the dropout schedule drops nobody"
    st = seeds.PublicSeedStreams(cfg.run.seed)
    sim = fam.simulate(cfg, plan, st)
    x0 = np.stack(
        [mf.private_value(cfg, v, st) + mf.local_noise(cfg, v, st) for v in range(plan.n)]
    )
    M = yardstick.gossip_mix(plan)
    np.testing.assert_allclose(M @ x0, sim.finals, rtol=0, atol=1e-9)
    # The expected error is sigma * sqrt(dim) * ||M[v]|| per node: below the local noise
    # (gossip averages it down) and above that of a perfect average.
    rms = plan.sigma * np.sqrt(plan.dim) * np.linalg.norm(M, axis=1)
    assert np.all(rms < plan.sigma * np.sqrt(plan.dim))
    assert np.all(rms >= plan.sigma * np.sqrt(plan.dim / plan.n) * (1 - 1e-12))
    nodes = [{"node": v, "finished": True, "error": float(rms[v])} for v in range(plan.n)]
    y = fam.yardstick(cfg, plan, {"results": {"nodes": nodes}})
    assert y["expected"] == pytest.approx(float(np.mean(rms)))
    assert y["ratio"] == pytest.approx(1.0)
    assert not y["far"]


@pytest.mark.parametrize(
    "example,sets",
    [
        ("complete-sum", ("protocol.hops=40", "graph.nodes=6")),
        ("ring-sum", ("graph.nodes=6",)),
        ("ring-histogram", ("graph.nodes=12",)),
        ("complete-histogram", ("graph.nodes=8", "protocol.hops=40")),
    ],
)
def test_token_yardstick_is_the_rms_error_of_many_walks(example, sets) -> None:
    errors = []
    for s in range(60):
        cfg, fam, plan = _load(example, (*sets, f"run.seed={s}"))
        sim = fam.simulate(cfg, plan, seeds.PublicSeedStreams(s))
        errors += [r["error"] for r in walk_outcomes(cfg, plan, sim.traces)]
    y = fam.yardstick(cfg, plan, {"results": {"tokens": [{"error": e} for e in errors]}})
    rms = float(np.sqrt(np.mean(np.square(errors))))
    assert y["expected"] == pytest.approx(rms, rel=0.2)
    assert y["measured"] == pytest.approx(float(np.mean(errors)))
    assert y["ratio"] == pytest.approx(y["measured"] / y["expected"])


def test_learning_yardstick_is_the_noise_free_reference() -> None:
    cfg, fam, plan = _load("dsgd-breast-cancer")
    ref = {
        "noise_free": {"test_accuracy": 0.95, "test_loss": 0.12},
        "trivial": {"start": 0.0, "test_loss": 0.69, "test_accuracy": 0.62},
    }
    metrics = [{"avg_test_loss": 0.48, "avg_test_accuracy": 0.9}]
    y = fam.yardstick(cfg, plan, {"results": {"metrics": metrics}, "reference": ref})
    assert (y["measured"], y["expected"], y["trivial"]) == (0.48, 0.12, 0.69)
    assert y["ratio"] == pytest.approx(4.0) and y["far"]
    assert y["accuracy"] == {"measured": 0.9, "noise_free": 0.95, "trivial": 0.62}
    assert any("FAR OUTSIDE" in line for line in yardstick.lines(y))
    central = {"central": {"test_loss": 0.2, "test_accuracy": 0.93}}
    y = fam.yardstick(cfg, plan, {"results": central, "reference": ref})
    assert y["ratio"] == pytest.approx(0.2 / 0.12) and not y["far"]
    assert not any("FAR" in line for line in yardstick.lines(y))


def test_no_noise_has_no_ratio_and_keys_name_no_epsilon() -> None:
    y = yardstick.judge(0.5, 0.0, quantity="q", basis="b")
    assert y["ratio"] is None and not y["far"]
    assert " ".join(" ".join(yardstick.lines(y)).split()).endswith("no noise, so no ratio")
    y = yardstick.judge(7.0, 2.0, quantity="q", basis="b")
    assert y["ratio"] == 3.5 and y["far"]
    assert not [k for k in y if "eps" in k]


def test_png_and_html_show_the_references_and_the_yardstick(tmp_path) -> None:
    from coordinator_free import htmlreport, report

    ref = {
        "noise_free": {"test_accuracy": 0.95, "test_loss": 0.12},
        "trivial": {"start": 0.0, "test_loss": 0.69, "test_accuracy": 0.62},
    }
    y = yardstick.learning(0.5, 0.9, ref)
    summary = {"reference": ref, "yardstick": y}
    page = "".join(htmlreport._yardstick(summary))
    assert "reference without noise (same run, sigma = 0): test acc 0.9500" in page
    assert "FAR OUTSIDE" in page and 'class="bad"' in page
    assert htmlreport._yardstick({}) == []
    rows = [
        {"round": r, "avg_test_accuracy": 0.6 + 0.1 * r, "avg_test_loss": 0.7 - 0.1 * r,
         "avg_train_loss": 0.7 - 0.1 * r, "consensus_distance": 0.0,
         "node_test_accuracy_min": 0.5, "node_test_accuracy_mean": 0.6,
         "node_test_accuracy_max": 0.9}
        for r in range(3)
    ]  # fmt: skip
    mpath = tmp_path / "metrics.jsonl"
    mpath.write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    metrics = report.load_metrics(mpath, [])
    svg = "".join(htmlreport._accuracy(metrics, summary))
    assert "reference without noise (sigma = 0): 0.95" in svg and "reference trivial" in svg
    fig_path = tmp_path / "accuracy.png"
    report.plot_accuracy(metrics, fig_path, "run", [], summary)
    assert fig_path.stat().st_size > 0
    import matplotlib.pyplot as plt

    fig = plt.figure()
    ax = fig.add_subplot()
    report._reference_lines(ax, summary, "test_accuracy")
    assert sorted(line.get_ydata()[0] for line in ax.get_lines()) == [0.62, 0.95]
    assert "ratio 4.17" in report._yardstick_caption(summary)
    plt.close(fig)
