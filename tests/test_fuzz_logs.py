"""The view-log fuzzer over the gossip families (slow suite): 10,000 mutated logs (bytes,
frames and records: tests/logfuzz.py), each audited; no traceback, and never a changed loss
without an integrity finding, nor a finding with a loss below the fault-free plan's."""

from __future__ import annotations

import time

import pytest
from logfuzz import fuzz_many
from test_audit_robust import RUNS, make_run

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
