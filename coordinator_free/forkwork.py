"""Numeric work spread over every core in forked children that write into shared memory.

The exact planner's observers are independent: each one's row of the loss matrix is a few
milliseconds of numpy and scipy. Threads share them poorly: scipy's sparse products and its
BLAS and LAPACK wrappers hold the interpreter lock, so two threads ran the 2 048-node
Erdős–Rényi plan only 1.5 times as fast as one. Forked children share nothing but the output
array and run 1.96 times as fast on two cores (docs/benchmarks.md).

How it works (:func:`fill`): the caller's output lives in an anonymous shared mapping
(:func:`shared_array`); the children inherit everything else (the gossip matrix, the
configuration, the module's settings) at the fork, copy on write. A pipe holds the task numbers
and each child reads the next one when it is free (a read of four bytes from a pipe is atomic, so
no task runs twice), runs ``task(i)`` (which writes its part of the output) and reports ``i`` on a
second pipe. Nothing is pickled. A child that fails (an exception, a signal, the kernel's
out-of-memory killer) simply exits; whatever tasks were not reported done then run again in the
calling process, one after the other, where a real error raises with its own type and traceback.
"""

from __future__ import annotations

import mmap
import os
import selectors
import signal
import struct
import warnings
from collections.abc import Callable

import numpy as np

__all__ = ["chunks", "cores", "fill", "fill_numeric", "shared_array", "ticks"]

_RECORD = struct.Struct("<I")
#: A pipe holds 64 KiB on Linux: all the task numbers are written before the fork.
MAX_TASKS = 65536 // _RECORD.size


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def chunks(count: int, size: int, *, taper: int = 0) -> list[range]:
    """``range(count)`` cut into consecutive tasks of ``size`` items (the last one shorter).

    ``taper``: the last ``taper`` items (at most) in tasks of an eighth of ``size`` instead, so
    that the cores run out of work at nearly the same time: with tasks of equal cost, a core
    that takes the last full task leaves the others idle for up to one task's time."""
    tail = min(max(taper, 0), count)
    head = count - tail
    small = max(1, size // 8)
    out = [range(k, min(k + size, head)) for k in range(0, head, size)]
    return out + [range(k, min(k + small, count)) for k in range(head, count, small)]


def fill_numeric(task: Callable[[int], None], count: int, *, done=None) -> None:
    """:func:`fill` for numpy, scipy and LAPACK work: BLAS and LAPACK held to one thread in each
    child (the children take the cores), with scipy.linalg loaded first so that the limit
    reaches its own OpenBLAS too (:func:`coordinator_free.blas.one_thread_scipy_included`)."""
    from coordinator_free.blas import one_thread_scipy_included

    with one_thread_scipy_included():
        fill(task, count, done=done)


def ticks(sizes: list[int], what: str) -> Callable[[int], None]:
    """A ``done`` for :func:`fill` (or for a loop over the same tasks): when task ``i`` is done,
    one progress tick (:mod:`coordinator_free.progress`) for each of its ``sizes[i]`` items,
    counted against all of them, under the label ``what``."""
    from coordinator_free import progress

    total = sum(sizes)
    count = 0

    def done(i: int) -> None:
        nonlocal count
        for _ in range(sizes[i]):
            count += 1
            progress.tick(count, total, what)

    return done


def shared_array(shape: tuple[int, ...], dtype=np.float64) -> np.ndarray:
    """A zeroed array in an anonymous shared mapping: what a forked child writes into it, the
    parent reads."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if nbytes == 0:
        return np.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


def fill(
    task: Callable[[int], None],
    count: int,
    *,
    workers: int | None = None,
    done: Callable[[int], None] | None = None,
) -> None:
    """Run ``task(i)`` for every ``i`` in ``range(count)``, on ``workers`` forked children (default:
    one per core), then any task they did not finish in this process. ``task`` must put its
    results in memory from :func:`shared_array`; ``done(i)`` is called here, in the parent, as
    each task finishes (progress). With one worker, one task or no ``os.fork`` (not on a POSIX
    system), everything runs here."""
    workers = min(cores() if workers is None else workers, count)
    finished: set[int] = set()
    if workers >= 2 and count <= MAX_TASKS and hasattr(os, "fork"):
        finished = _in_children(task, count, workers, done)
    for i in range(count):
        if i not in finished:
            task(i)
            if done is not None:
                done(i)


def _in_children(task, count: int, workers: int, done) -> set[int]:
    queue_r, queue_w = os.pipe()
    os.write(queue_w, b"".join(_RECORD.pack(i) for i in range(count)))
    os.close(queue_w)
    reports: dict[int, int] = {}  # read end -> child pid
    children: list[int] = []
    finished: set[int] | None = None
    try:
        for _ in range(workers):
            report_r, report_w = os.pipe()
            try:
                with warnings.catch_warnings():
                    # Python 3.12 warns of a fork with other threads alive: here, BLAS's idle
                    # workers (a child's BLAS runs on its calling thread), nothing it uses.
                    warnings.simplefilter("ignore", DeprecationWarning)
                    pid = os.fork()
            except OSError:  # no memory or process left for one more: the others go on
                os.close(report_r)
                os.close(report_w)
                break
            if pid == 0:  # the child: never returns into the caller's code
                try:
                    os.close(report_r)
                    for fd in reports:
                        os.close(fd)
                    _child(task, queue_r, report_w)
                finally:
                    os._exit(1)
            os.close(report_w)
            reports[report_r] = pid
            children.append(pid)
        os.close(queue_r)
        queue_r = -1
        finished = _collect(reports, done)  # no child at all: nothing reported, all run here
    finally:
        if queue_r >= 0:
            os.close(queue_r)
        for fd in reports:
            try:
                os.close(fd)
            except OSError:
                pass
        for pid in children:
            _reap(pid, kill=finished is None)
    return finished or set()


def _child(task, queue_r: int, report_w: int) -> None:
    code = 1
    try:
        # The parent's handlers are not the child's: an event loop's wakeup descriptor (shared
        # with the parent after the fork) must not hear of a signal meant for the child.
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        while True:
            rec = os.read(queue_r, _RECORD.size)
            if not rec:
                break
            (i,) = _RECORD.unpack(rec)
            task(i)
            os.write(report_w, rec)
        code = 0
    except BaseException:  # noqa: BLE001 - the parent runs this task again and sees the error
        pass
    finally:
        os._exit(code)


def _collect(reports: dict[int, int], done) -> set[int]:
    finished: set[int] = set()
    pending = {fd: b"" for fd in reports}
    with selectors.DefaultSelector() as sel:
        for fd in reports:
            sel.register(fd, selectors.EVENT_READ)
        while pending:
            for key, _ in sel.select():
                fd = key.fd
                data = os.read(fd, 4096)
                if not data:
                    sel.unregister(fd)
                    del pending[fd]
                    continue
                data = pending[fd] + data
                whole = len(data) - len(data) % _RECORD.size
                for (i,) in _RECORD.iter_unpack(data[:whole]):
                    finished.add(i)
                    if done is not None:
                        done(i)
                pending[fd] = data[whole:]
    return finished


def _reap(pid: int, *, kill: bool) -> None:
    """Wait for a child (each has closed its report pipe: it is exiting), or, when the parent was
    interrupted, kill it first."""
    try:
        if kill:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ChildProcessError, ProcessLookupError):
        pass
