"""How many threads BLAS and LAPACK may use.

Two reasons to hold them to one thread:

- A peer is one process among hundreds on a machine of a few cores: OpenBLAS worker threads
  that spin waiting for work would take the CPU every other peer needs (a 256-peer run spent
  most of its start-up in them).
- Numbers the peers and the simulator must agree on bit for bit (the gossip matrix's spectral
  gap, a learning step's gradient) come out of LAPACK with different last bits for different
  thread counts (eigvalsh of the 256-node hypercube's gossip matrix differs in 234 of 256
  eigenvalues between one and two threads). Computed with one thread everywhere, they are the
  same on every machine.

The accountant's own linear algebra is left free to use every core, except where its products
are many and small (an exact plan's observers, in forked children or in the calling process;
the multi-round plan's steps): there BLAS threads only spin beside the work, and one thread is
faster (the 200-node Erdős–Rényi exact plan: 4.1 s with them, 2.1 s without).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from threadpoolctl import threadpool_info, threadpool_limits


def one_thread():
    """A context in which BLAS and LAPACK calls run on one thread: those of the libraries loaded
    when it is entered. scipy.linalg brings its own OpenBLAS: import it first, or its calls keep
    every core (and one of its threads spins between them)."""
    return threadpool_limits(limits=1, user_api="blas")


def one_thread_scipy_included():
    """:func:`one_thread` for work that calls scipy's BLAS or LAPACK: scipy.linalg is loaded
    first, so that the limit reaches its own OpenBLAS too."""
    import scipy.linalg  # noqa: F401 - loaded before the limit, so that it applies to it

    return one_thread()


_held = False


def one_thread_for_process() -> None:
    """Hold BLAS and LAPACK to one thread for the rest of this process (a peer). Once: a
    process forked from one that did this (a peer of the fork server, which does it after its
    imports) inherits the limit with the libraries' state and does not look for them again."""
    global _held
    if not _held:
        threadpool_limits(limits=1, user_api="blas")
        _held = True


def kernels_in_use() -> str:
    """The BLAS libraries this process has loaded and the kernels each runs, for a benchmark's
    header (:func:`describe_kernels`): the same code runs a fifth slower on OpenBLAS's AVX2
    kernels than on its AVX-512 ones on a CPU that has both (docs/benchmarks.md)."""
    return describe_kernels(threadpool_info(), os.environ.get("OPENBLAS_CORETYPE"))


def describe_kernels(libraries: Iterable[Mapping], coretype: str | None) -> str:
    """``libraries`` (threadpoolctl's ``threadpool_info()``): each BLAS as "name version
    kernels", once each, and ``coretype`` (the ``OPENBLAS_CORETYPE`` environment variable, by
    which a user or a machine's environment chooses OpenBLAS's kernels instead of its own
    detection) when it is set."""
    named = {
        f"{lib.get('internal_api') or 'blas'} {lib.get('version') or 'of unknown version'} "
        f"{lib.get('architecture') or 'kernels unknown'}"
        for lib in libraries
        if lib.get("user_api") == "blas"
    }
    out = ", ".join(sorted(named)) if named else "no BLAS loaded"
    if coretype:
        out += f" (kernels chosen by OPENBLAS_CORETYPE={coretype})"
    return out
