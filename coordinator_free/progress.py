"""Progress of long computations (the planner's per-observer loops), shown on a terminal.

A command opens :func:`reporting` around its work; deep loops call :func:`tick` and know nothing
of where (or whether) it is shown. Nothing is written unless the stream is a terminal (or
``enabled=True``, or ``CFREE_PROGRESS=1`` in the environment), so piped output and JSON stay clean, and lines are rewritten in place at most
every ``every_s`` seconds.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import time
from collections.abc import Iterator
from typing import TextIO

__all__ = ["PROGRESS_ENV", "reporting", "tick"]

#: The environment variable that shows progress on a stream that is not a terminal (``1``).
PROGRESS_ENV = "CFREE_PROGRESS"


class _Reporter:
    def __init__(self, label: str, stream: TextIO, every_s: float):
        self.label, self.stream, self.every_s = label, stream, every_s
        self.t0 = time.monotonic()
        self.last = -float("inf")
        self.shown = False

    def __call__(self, done: int, total: int, what: str) -> None:
        now = time.monotonic()
        if now - self.last < self.every_s and done < total:
            return
        self.last = now
        self.stream.write(f"\r{self.label}: {what} {done}/{total}  ({now - self.t0:.0f} s)\033[K")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()


_current: contextvars.ContextVar[_Reporter | None] = contextvars.ContextVar(
    "cfree_progress", default=None
)


@contextlib.contextmanager
def reporting(
    label: str,
    stream: TextIO | None = None,
    *,
    every_s: float = 0.5,
    enabled: bool | None = None,
) -> Iterator[None]:
    """Show the :func:`tick` calls made inside the block on ``stream`` (default stderr), when
    it is a terminal, ``enabled`` is True or the environment sets ``CFREE_PROGRESS=1``; the line
    is cleared at the end."""
    stream = sys.stderr if stream is None else stream
    if enabled is None:
        enabled = os.environ.get(PROGRESS_ENV) == "1" or bool(
            getattr(stream, "isatty", lambda: False)()
        )
    if not enabled:
        yield
        return
    rep = _Reporter(label, stream, every_s)
    token = _current.set(rep)
    try:
        yield
    finally:
        _current.reset(token)
        rep.close()


def tick(done: int, total: int, what: str) -> None:
    """``done`` of ``total`` units of ``what`` are finished (no-op outside :func:`reporting`)."""
    rep = _current.get()
    if rep is not None:
        rep(done, total, what)
