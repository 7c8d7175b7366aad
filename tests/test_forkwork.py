"""Work spread over forked children writing into shared memory (coordinator_free.forkwork)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from freshpy import run_with_free_blas

from coordinator_free import forkwork


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_every_task_runs_once_in_a_child_and_is_reported_once():
    count = 50
    out = forkwork.shared_array((count, 2))
    seen: list[int] = []

    def task(i: int) -> None:
        out[i] = (i * i, os.getpid())

    forkwork.fill(task, count, workers=2, done=seen.append)
    assert sorted(seen) == list(range(count))
    np.testing.assert_array_equal(out[:, 0], np.arange(count) ** 2)
    pids = set(out[:, 1].astype(int).tolist())
    assert os.getpid() not in pids  # all ran in children ...
    assert 1 <= len(pids) <= 2  # ... at most two of them
    assert all(_gone(p) for p in pids)  # and every child was waited for


def test_a_child_that_dies_leaves_its_task_to_the_parent():
    parent = os.getpid()
    out = forkwork.shared_array((8,))

    def task(i: int) -> None:
        if i == 3 and os.getpid() != parent:
            os._exit(9)  # killed mid-task, nothing reported
        out[i] = 1.0 if os.getpid() == parent else 2.0

    forkwork.fill(task, 8, workers=2)
    assert out[3] == 1.0  # run again here
    assert np.count_nonzero(out == 0.0) == 0


def test_an_error_raises_in_the_parent_with_its_own_type():
    class Odd(Exception):
        pass

    def task(i: int) -> None:
        if i == 5:
            raise Odd(f"task {i}")

    with pytest.raises(Odd, match="task 5"):
        forkwork.fill(task, 10, workers=2)


def test_one_worker_runs_everything_here():
    pids = []
    forkwork.fill(lambda i: pids.append(os.getpid()), 4, workers=1)
    assert pids == [os.getpid()] * 4


def test_the_planner_raises_a_rank_error_from_its_children(monkeypatch):
    # A widened ambiguous band: every observer goes to the reference, which refuses to guess.
    # At n >= _PARALLEL_MIN_N with more than one batch, that happens in a forked child first.
    from coordinator_free import graphs
    from coordinator_free.privacy import muffliato as mf

    g = graphs.build_graph("erdos_renyi", nodes=256, p=0.04, seed=3)
    w = graphs.gossip_matrix(g)
    assert w.shape[0] >= mf._PARALLEL_MIN_N
    monkeypatch.setattr(mf, "KEEP_TOL", 2.0)
    with pytest.raises(mf.NumericalRankError, match="cannot tell"):
        mf.plan_factors(w, 6, True, method="exact", observers=list(range(2 * mf._LOCAL_BATCH)))


def test_a_signal_to_a_child_does_not_reach_the_parents_event_loop():
    # A child inherits the event loop's signal wakeup descriptor: a SIGTERM that kills the child
    # must not run the parent's SIGTERM handler. SIGUSR1, sent to the parent afterwards, goes
    # through the same descriptor: once its handler has run, any earlier byte has been read.
    import asyncio
    import signal

    import uvloop

    parent = os.getpid()
    out = forkwork.shared_array((4,))
    heard: list[str] = []

    def task(i: int) -> None:
        if i == 2 and os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
        out[i] = 1.0

    async def main() -> None:
        loop = asyncio.get_running_loop()
        flushed = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, heard.append, "TERM")
        loop.add_signal_handler(signal.SIGUSR1, flushed.set)
        try:
            forkwork.fill(task, 4, workers=2)
            os.kill(parent, signal.SIGUSR1)
            await asyncio.wait_for(flushed.wait(), 30)
        finally:
            loop.remove_signal_handler(signal.SIGTERM)
            loop.remove_signal_handler(signal.SIGUSR1)

    uvloop.run(main())
    assert heard == []
    np.testing.assert_array_equal(out, np.ones(4))


def test_ticks_count_every_item_of_each_finished_task(monkeypatch):
    from coordinator_free import progress

    seen = []
    monkeypatch.setattr(
        progress, "tick", lambda done, total, what: seen.append((done, total, what))
    )
    done = forkwork.ticks([2, 0, 3], "observer")
    done(2)
    done(1)
    done(0)
    assert seen == [(k, 5, "observer") for k in range(1, 6)]


def test_fill_numeric_holds_every_blas_to_one_thread_scipys_own_included():
    """In a fresh interpreter whose BLAS may use every core (no OPENBLAS_NUM_THREADS, which the
    parallel suite's workers set): each forked task runs numpy's and scipy's OpenBLAS on one
    thread, scipy's included when the task is the first to import it."""
    code = """if True:
        from threadpoolctl import threadpool_info
        from coordinator_free import forkwork

        seen = forkwork.shared_array((4,))

        def task(i):
            import scipy.linalg  # its OpenBLAS must be under the limit as well

            blas = [p for p in threadpool_info() if p["user_api"] == "blas"]
            seen[i] = max(p["num_threads"] for p in blas)

        forkwork.fill_numeric(task, 4)
        print(seen.tolist())
    """
    assert run_with_free_blas(code) == str([1.0] * 4)


@pytest.mark.parametrize("count,size,taper", [(0, 4, 0), (10, 4, 0), (2048, 32, 128),
                                              (100, 32, 1000), (33, 32, 5), (7, 1, 3)])  # fmt: skip
def test_chunks_cover_every_item_once_in_order_and_taper_the_last(count, size, taper):
    tasks = forkwork.chunks(count, size, taper=taper)
    assert [i for t in tasks for i in t] == list(range(count))
    assert all(len(t) > 0 for t in tasks)
    tail = min(taper, count)
    small = max(1, size // 8)
    for t in tasks:
        if t.start >= count - tail:
            assert len(t) <= small  # the tapered tail
        else:
            assert len(t) <= size and t.stop <= count - tail
    if count - tail >= size:
        assert len(tasks[0]) == size
