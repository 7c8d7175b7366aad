"""The references a trained model is judged against: the same config without noise, and the
trivial model (families/learning/reference.py), and the ``model.init`` starting point."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from coordinator_free import config
from coordinator_free.cli import main
from coordinator_free.errors import ConfigError
from coordinator_free.families import family_of
from coordinator_free.families.learning import reference
from coordinator_free.families.learning.protocol import make_task

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples"
SHORT = ["protocol.rounds=6"]


def test_trivial_is_the_starting_model_and_the_majority_label():
    cfg = config.load(EX / "dsgd-breast-cancer.toml", SHORT)
    task = make_task(cfg)
    tr = reference.trivial(task)
    # A binary logistic model at 0 predicts 1/2 for every point: loss log 2.
    assert tr["start"] == 0.0
    assert tr["test_loss"] == pytest.approx(math.log(2), rel=1e-12)
    y_train, y_test = np.asarray(task.dataset.y_train), np.asarray(task.dataset.y_test)
    majority = int(np.argmax(np.bincount(y_train)))
    assert tr["majority_label"] == majority
    assert tr["test_accuracy"] == pytest.approx(float(np.mean(y_test == majority)))
    assert 0.5 < tr["test_accuracy"] < 0.8  # breast cancer: about 63% benign


def test_noise_free_reference_ignores_sigma_and_beats_the_private_model():
    fam = family_of("dsgd")
    noisy = config.load(EX / "dsgd-breast-cancer.toml")
    louder = config.load(EX / "dsgd-breast-cancer.toml", ["privacy.sigma=50"])
    a, b = fam.reference(noisy), fam.reference(louder)
    assert a["noise_free"] == b["noise_free"]  # sigma is switched off, nothing else changes
    quiet = reference.noise_free_config(noisy)
    assert quiet.privacy.sigma == 0.0 and quiet.protocol == noisy.protocol
    private_acc, private_loss = reference.final_average(fam.simulate(noisy))
    nf = a["noise_free"]
    assert nf["test_accuracy"] > a["trivial"]["test_accuracy"] + 0.2
    assert nf["test_loss"] < private_loss and nf["test_accuracy"] >= private_acc


def test_decor_reference_switches_the_correlated_noise_off_too():
    cfg = config.load(EX / "decor-ring.toml", ["graph.nodes=6", "protocol.rounds=40"])
    quiet = reference.noise_free_config(cfg)
    assert quiet.privacy.sigma == 0.0 and quiet.privacy.sigma_cor == 0.0
    fam = family_of("decor")
    ref = fam.reference(cfg)
    # Without any noise DECOR is plain D-SGD: the noise-free reference is D-SGD's result.
    as_dsgd = config.load(
        EX / "decor-ring.toml",
        ["graph.nodes=6", "protocol.rounds=40", "protocol.name=dsgd", "privacy.sigma_cor=0"],
    )
    dsgd = reference.final_average(family_of("dsgd").simulate(reference.noise_free_config(as_dsgd)))
    assert ref["noise_free"]["test_loss"] == pytest.approx(dsgd[1], rel=1e-12)
    assert ref["trivial"]["start"] == 1.0 and ref["trivial"]["test_accuracy"] is None


def test_averaging_and_sums_have_no_model_reference():
    for name in ("muffliato-ring", "ring-sum", "randomized-gossip-ring"):
        cfg = config.load(EX / f"{name}.toml")
        assert family_of(cfg.protocol.name).reference(cfg) is None


def test_walk_sgd_reference_is_the_noise_free_walk(capsys):
    assert main(["simulate", str(EX / "walk-sgd.toml"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ref = out["reference"]
    tok = out["tokens"][0]
    assert ref["noise_free"]["test_accuracy"] > ref["trivial"]["test_accuracy"]
    assert tok["test_accuracy"] > ref["trivial"]["test_accuracy"]  # the example learns something
    assert tok["test_loss"] < ref["trivial"]["test_loss"]


@pytest.mark.parametrize(
    "name",
    ["muffliato-gd-breast-cancer", "dsgd-breast-cancer", "decor-breast-cancer",
     "central-dp-breast-cancer", "complete-sgd", "walk-sgd",
     pytest.param("decor-ring", marks=pytest.mark.slow)],  # 8 s of simulation
)  # fmt: skip
def test_every_learning_example_prints_its_references(name, capsys):
    assert main(["simulate", str(EX / f"{name}.toml")]) == 0
    text = capsys.readouterr().out
    assert "reference without noise (same run, sigma = 0): " in text
    assert "trivial reference (the starting model, every parameter " in text


@pytest.mark.slow  # simulates five examples (10 s)
def test_learning_examples_beat_their_trivial_model():
    """The shipped examples are tuned so that their private result means something: better than
    the starting model, as the same run without noise is. (Private may edge out noise-free on
    the test set: central-dp's small noise does here.)"""
    for name in ("muffliato-gd-breast-cancer", "dsgd-breast-cancer", "decor-ring",
                 "decor-breast-cancer", "central-dp-breast-cancer"):  # fmt: skip
        cfg = config.load(EX / f"{name}.toml")
        fam = family_of(cfg.protocol.name)
        _, loss = reference.final_average(fam.simulate(cfg))
        ref = fam.reference(cfg)
        assert loss < ref["trivial"]["test_loss"], name
        # The examples run 10 rounds (user-level local DP <= 10): the noise-free model is short
        # of the optimum but clearly trained: a quarter below the starting model's test loss,
        # and, for the classifiers, 20 points of accuracy above the majority label.
        assert ref["noise_free"]["test_loss"] < 0.75 * ref["trivial"]["test_loss"], name
        if ref["trivial"].get("test_accuracy") is not None:
            assert ref["noise_free"]["test_accuracy"] > ref["trivial"]["test_accuracy"] + 0.2, name


def test_model_init_sets_the_starting_point_and_is_validated():
    cfg = config.load(EX / "decor-ring.toml")
    assert cfg.model.init == 1.0
    assert np.array_equal(make_task(cfg).model.init(), np.ones(10))
    unset = config.load(EX / "dsgd-breast-cancer.toml")
    assert unset.model.init is None
    # Left out of written configs when unset: the config digests of older runs do not move.
    assert "init" not in unset.to_dict()["model"]
    assert "init = 1.0" in cfg.to_toml()
    with pytest.raises(ConfigError, match=r"model\.init must be a number in \[-1e6, 1e6\]"):
        config.load(EX / "decor-ring.toml", ["model.init=1e9"])


def test_run_summary_carries_the_reference(tmp_path, capsys):
    """central-dp runs in one process: its summary.json and output carry the references."""
    out = tmp_path / "run"
    rc = main(["run", str(EX / "central-dp-breast-cancer.toml"), "--out", str(out), "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "reference without noise" in text and "trivial reference" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reference"]["trivial"]["test_loss"] == pytest.approx(math.log(2))


def test_central_dp_is_presented_as_central_dp(tmp_path, capsys):
    """No peers, no graph: one loss for every user, said in words, not a table by hop distance
    (plan, run, audit and report)."""
    ex = str(EX / "central-dp-breast-cancer.toml")
    assert main(["plan", ex]) == 0
    text = capsys.readouterr().out
    assert "central DP (a trusted curator, no peers, no graph): every user loses eps = 8.8287" in (
        text.replace("\n  ", " ")
    )
    assert "dist  pairs" not in text and "spectral gap" not in text
    out = tmp_path / "run"
    assert main(["run", ex, "--out", str(out), "--quiet", "--set", "protocol.rounds=3"]) == 0
    text = capsys.readouterr().out
    assert "central DP" in text and "pairwise network DP" not in text
    assert main(["audit", str(out)]) == 0
    text = capsys.readouterr().out
    assert "central DP" in text and "eps_(u->v)" not in text and "log(s) intact" not in text
    from coordinator_free import report

    res = report.render_report(out)
    assert [Path(f).name for f in res["files"]] == ["accuracy.png", "report.html"]
    page = Path(res["files"][1]).read_text()
    assert "central DP (a trusted curator, no graph)" in page and 'class="cell"' not in page
    assert any("central DP" in n and "skipped" in n for n in res["notes"])
