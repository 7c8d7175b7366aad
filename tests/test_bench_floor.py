"""bench/bench_vs_zmq.py --floor: the floor of a step is made of the primitives it names."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_vs_zmq.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_vs_zmq_floor", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop(spec.name, None)


def test_floor_parts_follow_whether_values_are_logged(bench):
    logged = bench.step_floor(8, True, seconds=0.01)
    digests = bench.step_floor(8, False, seconds=0.01)
    assert set(logged) - set(digests) == {"view log values (2)"}
    assert set(digests) == {
        "digests (3)",
        "AEAD (2 seal, 2 open)",
        "TCP loopback (2 messages)",
        "average",
    }
    for parts in (logged, digests):
        assert all(isinstance(s, float) and s > 0 for s in parts.values()), parts


def test_cpu_per_step_cancels_what_a_run_spends_once(bench, monkeypatch):
    # CPU readings from a script: a run of s steps costs 5 (start-up) + 2 s, so the
    # difference of a run and one of a quarter the steps is 2 per step, over 4 nodes.
    spent = [0.0]
    monkeypatch.setattr(bench, "_cpu_children", lambda: spent[0])

    def run(steps: int) -> float:
        spent[0] += 5.0 + 2.0 * steps
        return 123.0

    cpu, rate = bench.ring_cpu_per_step(run, 4, 40)
    assert rate == 123.0
    assert cpu == pytest.approx(2.0 / 4)
