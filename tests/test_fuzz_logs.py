"""The view-log fuzzer over the gossip families (slow suite): 10,000 mutated logs (bytes,
frames and records: tests/logfuzz.py), each audited; no traceback, and never a changed loss
without an integrity finding, nor a finding with a loss below the fault-free plan's."""

from __future__ import annotations

import time

import pytest
from auditruns import EX, RUNS, make_run
from logfuzz import fuzz_many
from memrun import write_run_dir

from coordinator_free import config
from coordinator_free.inmemory import run_config

CASES = 10_000


@pytest.mark.slow
def test_ten_thousand_mutated_logs_keep_the_rule(tmp_path):
    runs = [make_run(name, tmp_path / "runs" / name) for name in RUNS]
    t0 = time.monotonic()
    out = fuzz_many(runs, tmp_path / "work", CASES, seed=2024, workers=2)
    took = time.monotonic() - t0
    print(
        f"\n{out.cases} mutated logs over {len(runs)} runs in {took:.0f} s: "
        f"{out.unchanged} unchanged, {out.flagged} flagged ({out.raised} with raised entries), "
        f"{len(out.failures)} failures"
    )
    assert out.cases >= CASES
    assert not out.failures, f"{len(out.failures)} failures:\n" + "\n".join(out.failures[:20])
    # The fuzzer reaches both outcomes, and the floor is exercised.
    assert out.unchanged > CASES // 20 and out.flagged > CASES // 2 and out.raised > CASES // 10


#: Token walks and DECOR, the families whose audits replay hand-offs and pair records.
OTHER_RUNS = {
    "ring-sum": (EX / "ring-sum.toml", ["graph.nodes=4", "protocol.cycles=2"]),
    "complete-sum": (EX / "complete-sum.toml", ["graph.nodes=4", "protocol.hops=16"]),
    "decor": (EX / "decor-ring.toml", ["graph.nodes=4", "protocol.rounds=3"]),
}
OTHER_CASES = 3_000


@pytest.mark.slow
def test_mutated_walk_and_decor_logs_keep_the_rule(tmp_path):
    runs = []
    for name, (path, sets) in OTHER_RUNS.items():
        cfg = config.load(path, [*sets, "network.deadline_s=1"])
        runs.append(write_run_dir(cfg, run_config(cfg, seed=1), tmp_path / "runs" / name))
    t0 = time.monotonic()
    out = fuzz_many(runs, tmp_path / "work", OTHER_CASES, seed=7, workers=2)
    print(
        f"\n{out.cases} mutated walk/decor logs in {time.monotonic() - t0:.0f} s: "
        f"{out.unchanged} unchanged, {out.flagged} flagged ({out.raised} raised), "
        f"{len(out.failures)} failures"
    )
    assert out.cases >= OTHER_CASES
    assert not out.failures, f"{len(out.failures)} failures:\n" + "\n".join(out.failures[:20])
    assert out.flagged > OTHER_CASES // 2
