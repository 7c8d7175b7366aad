"""Every example config (examples/*.toml, enumerated: a new file is covered without a change here)
runs as real peer processes and shows what it is for, read from what the run prints and writes:

* it completes (exit 0, no failed node);
* amplification is shown: some ordered pair's exact loss is below local DP, and the output says
  how many ("N of M ordered pairs ... are amplified"), except the baselines in ``NO_PAIRS``,
  whose output must print why pairs do not apply there;
* local DP is at most ``baseline.PRACTICAL_LDP_EPS`` (10), or the run prints why not (the
  ``ldp_above`` reason of audit.json's ``baseline`` block, in the output);
* the result is within its yardstick: ``yardstick.far`` is false (ratio at most the yardstick's
  own threshold). A run's noise is fresh, so a single run past the threshold is run once more,
  and two runs past it fail.

Both run in the slow suite (the quick default's 6-minute budget has no room for 17 real-process
runs): every example shrunk where a full run takes long (``QUICK``), and every example at its own
size.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator_free.accounting.baseline import PRACTICAL_LDP_EPS

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples").glob("*.toml"))

# Examples whose guarantee is not pairwise, and the sentence their output prints instead.
NO_PAIRS = {
    "central-dp-breast-cancer": "pairs and graph distances do not apply",
    "muffliato-ring": "no pair is amplified here",
    "prox-sgd-lasso": "pairs and graph distances do not apply",
}

# The quick suite's smaller sizes (the slow suite runs the files as they are).
QUICK = {
    "decor-ring": ["protocol.rounds=300"],
    "muffliato-gd-breast-cancer": ["graph.dim=4"],
    "muffliato-hypercube": ["graph.dim=5"],
    "ring-histogram": ["graph.nodes=16"],
    "ring-sum": ["graph.nodes=16"],
    "complete-sgd": ["protocol.hops=160", "protocol.cap=12"],
    "walk-sgd": ["protocol.hops=160", "protocol.cap=12"],
}


def _run(path: Path, sets: list[str], cwd: Path) -> tuple[str, Path]:
    args = [sys.executable, "-m", "coordinator_free", "run", str(path)]
    for s in sets:
        args += ["--set", s]
    p = subprocess.run(
        args,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert p.returncode == 0, (
        f"{path.name}: exit {p.returncode}\n{p.stdout[-2000:]}{p.stderr[-3000:]}"
    )
    m = re.search(r"^run directory: (\S+)", p.stdout, re.M)
    assert m, f"{path.name}: no run directory in the output\n{p.stdout[-2000:]}"
    return p.stdout, Path(m.group(1))


def _completed_run(path: Path, sets: list[str], cwd: Path) -> tuple[str, dict, dict]:
    """One run of the example: its output, summary.json and audit.json, checked complete."""
    name = path.stem
    out, run_dir = _run(path, sets, cwd)
    summary = json.loads((run_dir / "summary.json").read_text())
    audit = json.loads((run_dir / "audit.json").read_text())
    assert not summary.get("failed"), f"{name}: nodes failed: {summary['failed']}"
    assert summary.get("completed_as_planned") is not False, f"{name}: not completed as planned"
    y = summary.get("yardstick")
    assert isinstance(y, dict) and y.get("measured") is not None, f"{name}: no yardstick"
    assert "yardstick:" in out
    return out, summary, audit


def check_example(path: Path, sets: list[str], cwd: Path) -> dict:
    name = path.stem
    out, summary, audit = _completed_run(path, sets, cwd)
    y = summary["yardstick"]
    if y["far"]:
        # Each run draws fresh secret noise, so one run of a noisy example lands past the
        # threshold now and then: dsgd-breast-cancer did in 1 of 2,000 noise draws of the
        # simulator (ratio 3.07 > 3). A second, independent run tells that draw from a defect,
        # which pushes every run out (both far by chance: about 1 in 4 million).
        first = y
        second_dir = cwd / "second-run"
        second_dir.mkdir()
        out, summary, audit = _completed_run(path, sets, second_dir)
        y = summary["yardstick"]
        assert y["far"] is False, (
            f"{name}: two runs far from the yardstick: error {first['measured']} then "
            f"{y['measured']} against {y['expected']} (ratios {first['ratio']}, {y['ratio']} > "
            f"{y['threshold']})"
        )
    text = " ".join(out.split())  # the output's wrapped sentences, one line

    block = audit.get("baseline") or {}
    ldp = block.get("ldp_eps", (audit.get("ldp") or {}).get("eps"))
    assert isinstance(ldp, float), f"{name}: no local-DP eps in audit.json"
    if name in NO_PAIRS:
        assert NO_PAIRS[name] in text, f"{name}: the output does not say why pairs do not apply"
    else:
        amp, pairs = block.get("amplified"), block.get("pairs")
        assert pairs and amp and amp > 0, f"{name}: no amplified pair ({amp} of {pairs})"
        assert f"{amp} of {pairs} ordered pairs (source -> observer) are amplified" in text, (
            f"{name}: the output does not print the amplified fraction"
        )
    if ldp > PRACTICAL_LDP_EPS:
        why = (block.get("ldp_above") or {}).get("why")
        assert why, f"{name}: local DP eps {ldp:.3g} > {PRACTICAL_LDP_EPS:g} and no reason"
        assert " ".join(why.split()) in text, (
            f"{name}: the reason for local DP {ldp:.3g} is not printed"
        )
    return {"ldp": ldp, "amplified": block.get("amplified"), "ratio": y["ratio"]}


def test_examples_are_enumerated():
    """The tables name only existing examples, and the enumeration finds the files."""
    names = {p.stem for p in EXAMPLES}
    assert len(names) >= 10
    assert set(NO_PAIRS) <= names and set(QUICK) <= names


@pytest.mark.slow  # 17 real-process runs, about 50 s: over the quick suite's 6-minute budget
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_shows_what_it_is_for(path, tmp_path):
    check_example(path, QUICK.get(path.stem, []), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_full_size(path, tmp_path):
    check_example(path, [], tmp_path)
