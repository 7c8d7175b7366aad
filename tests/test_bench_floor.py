"""bench/bench_vs_zmq.py --floor and --skeleton, bench/bench_plan.py --floor and --in-place: each
floor is made of the primitives it names, the skeleton ring runs, and the fast path's statements
timed in place compute what the fast path does."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_vs_zmq.py"
PLAN_BENCH = BENCH.with_name("bench_plan.py")


def _script(path: Path, name: str):
    """A benchmark script loaded as a module (yielded, then forgotten)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def bench():
    yield from _script(BENCH, "bench_vs_zmq_floor")


@pytest.fixture(scope="module")
def plan_bench():
    yield from _script(PLAN_BENCH, "bench_plan_floor")


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


def test_plan_floor_counts_the_products_of_the_lanczos_steps_it_has(plan_bench):
    import networkx as nx

    from coordinator_free.graphs import gossip_matrix

    ws = gossip_matrix(nx.cycle_graph(64), sparse=True)
    one = plan_bench.observer_floor(ws, 2, 1, seconds=0.001)
    assert set(one) == {"sparse", "blocks", "gram", "gram_single", "refine"}
    # One step: the basis is the first block, no Lanczos step and so no product of one.
    assert one["sparse"] == 0.0 and one["blocks"] == 0.0 and one["gram"] > 0.0
    assert one["gram_single"] > 0.0 and one["refine"] > 0.0
    several = plan_bench.observer_floor(ws, 2, 5, seconds=0.001)
    assert all(isinstance(s, float) and s > 0.0 for s in several.values()), several


def test_plan_floor_needs_a_graph():
    import subprocess

    out = subprocess.run(
        [sys.executable, str(PLAN_BENCH), "--floor"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2
    assert "--floor needs --graph" in out.stderr


def test_plan_in_place_needs_a_graph_and_is_its_own_run():
    import subprocess

    for flags, message in (
        (["--in-place"], "--in-place needs --graph"),
        (["--graph", "grid", "--floor", "--in-place"], "choose one"),
    ):
        out = subprocess.run(
            [sys.executable, str(PLAN_BENCH), *flags], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 2, flags
        assert message in out.stderr, (flags, out.stderr)


def test_statements_timed_in_place_compute_the_same_bits_and_count_each_run(plan_bench):
    import networkx as nx
    import numpy as np

    from coordinator_free.graphs import gossip_matrix
    from coordinator_free.privacy import muffliato as mf

    g = nx.random_regular_graph(3, 96, seed=5)
    ws = gossip_matrix(g, sparse=True)
    steps, src = 6, np.array([0, 7])
    starts = [[v, *sorted(g.neighbors(v))] for v in (0, 11, 50)]
    ticks = iter(range(10**9))
    # A clock that moves by one at each reading: each run of a statement then adds exactly 1.
    timed, spent = plan_bench.timed_statements(mf._local_leverage, clock=lambda: next(ticks))
    for start in starts:
        q = np.empty((96, len(start) + (len(start) - 1) * (steps - 1)))
        want = mf._local_leverage(ws, start, 96, steps, src, q.copy())
        got = timed(ws, start, 96, steps, src, q.copy())
        assert want is not None and np.array_equal(want, got)
    counts = dict(spent)
    # Degree 3: the first block and steps - 1 Lanczos steps, each one sparse product.
    assert counts["product(last, z)"] == len(starts) * (steps - 1)
    assert counts["z -= first @ (first.T @ z)"] == len(starts)
    assert counts["hi += k"] == len(starts) * (steps - 1)
    assert all(c == int(c) and c > 0 for c in counts.values()), counts
    # Cleared, the counts start again: one observer's runs only.
    spent.clear()
    q = np.empty((96, len(starts[0]) + (len(starts[0]) - 1) * (steps - 1)))
    timed(ws, starts[0], 96, steps, src, q)
    assert spent["product(last, z)"] == steps - 1
    assert spent == {text: c / len(starts) for text, c in counts.items()}


def test_plan_floor_stops_where_the_basis_spans_the_space(plan_bench, monkeypatch):
    import networkx as nx

    from coordinator_free.graphs import gossip_matrix

    # Every product counted as one unit: the parts then count the products.
    monkeypatch.setattr(plan_bench, "_per_call", lambda fn, seconds: 1.0)
    ws = gossip_matrix(nx.cycle_graph(16), sparse=True)
    # Degree 2 on 16 nodes: the basis spans R^16 after ceil(15 / 2) = 8 blocks, so 7 Lanczos
    # steps however long the schedule; each step has 4 dense products; one Gram product in
    # double precision, one in single (its chunks timed as one call), and the leverage's two.
    for steps, used in ((5, 5), (8, 8), (50, 8)):
        got = plan_bench.observer_floor(ws, 2, steps)
        want = {"sparse": used - 1, "blocks": 4 * (used - 1), "gram": 1.0, "gram_single": 1.0,
                "refine": 2.0}  # fmt: skip
        assert got == want, (steps, got)


def test_the_skeleton_ring_completes_and_leaves_no_log_behind(bench, tmp_path):
    # Real processes on loopback: three nodes, a few steps, values logged and not.
    for log_values in (True, False):
        work = tmp_path / f"skeleton-{log_values}"
        rate = bench.skeleton_gossip(3, 4, 25, work, log_values)
        assert rate > 0.0
        assert not work.exists()


def test_the_ring_on_cfrees_transport_alone_completes(bench):
    # Three real processes, each a PeerNet with its own key, over loopback.
    assert bench.transport_gossip(3, 4, 25) > 0.0


@pytest.fixture(scope="module")
def step_bench():
    yield from _script(BENCH.with_name("bench_step.py"), "bench_step_alone")


@pytest.mark.parametrize("log_values", [True, False])
def test_step_bench_runs_the_real_engine_view_log_and_driver(step_bench, tmp_path, log_values):
    """bench_step.py: node 0's real engine, view log and driver take every neighbour value of
    every step (none missed; it raises otherwise), send two values a step, and leave no log."""
    per_step = step_bench.step_cpu(8, 20, log_values, tmp_path)
    assert isinstance(per_step, float) and per_step > 0
    assert list(tmp_path.iterdir()) == []
    net = step_bench._Neighbours(8, 3)
    first = net._ready[2][0].message
    assert first.step == 2 and not first.payload.flags.writeable
    assert type(first.payload.base) is bytes  # kept as the transport delivers it, no copy


def test_the_ring_in_one_process_runs_real_peers_to_their_end(step_bench, tmp_path):
    """bench_step.py --ring: four real peers (keys, loopback TCP, engines, view logs) on one
    event loop take every value of every step (it raises on a miss), leave nothing behind,
    and spend more CPU on a longer run."""
    short = step_bench.ring_cpu(8, 2, True, tmp_path)
    long = step_bench.ring_cpu(8, 400, False, tmp_path)
    assert 0 < short < long
    assert list(tmp_path.iterdir()) == []
