"""The batched fast path of the exact fault-free plan against the reference and exact arithmetic.

``plan_factors(method="exact")`` runs observers in batches through a block Lanczos that is
re-orthogonalised locally only, and reads the projector through the Gram matrix of the basis it
got (``muffliato._local_leverages``); an observer it cannot vouch for goes through the reference
(``_lanczos_basis``: full re-orthogonalisation, the tolerance policy). These tests hold the two
to the same numbers on graphs where the fast path is taken, where it declines (saturated or
rank-deficient Krylov spaces, ambiguous rank decisions) and with threads, and both to exact
rational arithmetic on small graphs.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import coordinator_free.privacy.muffliato as mf
from coordinator_free.graphs import build_graph, gossip_matrix


def metropolis(kind: str, **kw) -> np.ndarray:
    return gossip_matrix(build_graph(kind, **kw), "metropolis")


def reference(w, steps, accelerated=True, **kw) -> np.ndarray:
    old = mf._EXACT_FAST
    mf._EXACT_FAST = False
    try:
        return mf.plan_factors(w, steps, accelerated, method="exact", symmetry=False, **kw)
    finally:
        mf._EXACT_FAST = old


def fast_rows(w, steps, observers) -> list[np.ndarray | None]:
    """What the fast path alone says for each observer (None: it declines)."""
    ws = sp.csr_matrix(w)
    n = w.shape[0]
    out = []
    for v in observers:
        start = [v, *mf._neighbours(w, v)]
        out.append(mf._local_leverages(ws, [start], n, steps, np.arange(n))[0])
    return out


# (kind, graph keywords, T, how many observers the fast path must take: "all", "some", "none")
CASES = [
    ("erdos_renyi", {"nodes": 80, "p": 0.1, "seed": 1}, 5, "all"),
    ("erdos_renyi", {"nodes": 90, "p": 0.1, "seed": 5}, 9, "some"),
    # saturates (r = 1 + deg T > n) everywhere but at the one leaf (r = 41)
    ("erdos_renyi", {"nodes": 60, "p": 0.1, "seed": 2}, 40, "some"),
    ("geometric", {"nodes": 100, "radius": 0.2, "seed": 3}, 8, "some"),
    ("geometric", {"nodes": 80, "radius": 0.25, "seed": 7}, 5, "some"),
    ("grid", {"rows": 8, "cols": 12}, 10, "all"),
    ("grid", {"rows": 5, "cols": 5}, 6, "some"),  # reflections: invariant subspaces
    ("path", {"nodes": 30}, 20, "some"),  # reaching an end deflates: the reference's then
    ("star", {"nodes": 20}, 3, "none"),  # every leaf's neighbourhood is in the first block
]


@pytest.mark.parametrize("kind,kw,steps,taken", CASES, ids=[f"{c[0]}-T{c[2]}" for c in CASES])
def test_fast_path_agrees_with_the_reference(kind, kw, steps, taken):
    # The exact span is the same for plain and accelerated gossip (P_t has exact degree t).
    accelerated = True
    w = metropolis(kind, **kw)
    n = w.shape[0]
    rows = fast_rows(w, steps, range(n))
    used = sum(r is not None for r in rows)
    assert {"all": used == n, "some": 0 < used < n, "none": used == 0}[taken], (used, n)
    ref = reference(w, steps, accelerated)
    got = mf.plan_factors(w, steps, accelerated, method="exact", symmetry=False)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-9)
    for v, r in enumerate(rows):
        if r is not None:
            r = np.clip(r, 0.0, 1.0)
            r[v] = 1.0
            # the same projector read two ways: equal to a few units of roundoff (measured:
            # at most 3e-14 relative on these graphs)
            np.testing.assert_allclose(r, ref[v], rtol=1e-12, atol=1e-14)
    # one source and a subset of observers: the same numbers
    obs = list(range(0, n, 7))
    one = mf.plan_factors(w, steps, accelerated, method="exact", observers=obs, sources=[3])
    np.testing.assert_allclose(one[:, 0], ref[obs, 3], rtol=0, atol=1e-9)


# Where the fast path is taken, plus two longer schedules whose bases drift measurably from
# orthonormal (||Q^T Q - I||_F up to 6e-6 on the grid, 1.8e-6 on the graph), so that a wrong
# reading of G (ignoring it, a transposed factor, too few Neumann steps) shows at first order
# in every path, the middle one (16 < sources <= n / 4) included. Those two take 3 to 4 s
# each: they run with the slow suites.
DRIFTING = [
    ("grid", {"rows": 10, "cols": 15}, 30, "some"),
    ("erdos_renyi", {"nodes": 200, "p": 0.035, "seed": 2}, 25, "some"),
]
TAKEN = [pytest.param(*c, id=f"{c[0]}-T{c[2]}") for c in CASES if c[3] != "none"] + [
    pytest.param(*c, id=f"{c[0]}-T{c[2]}", marks=pytest.mark.slow) for c in DRIFTING
]


@pytest.mark.parametrize("kind,kw,steps,taken", TAKEN)
def test_the_three_readings_of_the_projector_agree(kind, kw, steps, taken):
    """A few sources (Neumann iteration on G = I + E), up to n / 4 (triangular solves with the
    Cholesky factor of G) and all of them (one in-place triangular product) read the same
    diagonal, and it is the reference's."""
    w = metropolis(kind, **kw)
    n = w.shape[0]
    ws = sp.csr_matrix(w)
    few = np.array([0, n // 3, n - 1])
    assert few.size <= mf._NEUMANN_SOURCES
    mid = np.arange(n)[1 : 1 + n // 4]
    # Lax: on the long grid schedule some observers the fast path declines have a direction in
    # the reference's ambiguous band; only observers the fast path takes are compared.
    ref = reference(w, steps, strict=False)
    compared = 0
    for v in range(n):
        start = [v, *mf._neighbours(w, v)]
        every = mf._local_leverages(ws, [start], n, steps, np.arange(n))[0]
        if every is None:
            continue
        got_few = mf._local_leverages(ws, [start], n, steps, few)[0]
        np.testing.assert_allclose(got_few, every[few], rtol=1e-13, atol=1e-16)
        if mid.size > mf._NEUMANN_SOURCES:
            got_mid = mf._local_leverages(ws, [start], n, steps, mid)[0]
            np.testing.assert_allclose(got_mid, every[mid], rtol=1e-13, atol=1e-16)
        keep = few != v
        np.testing.assert_allclose(got_few[keep], ref[v, few[keep]], rtol=1e-12, atol=1e-14)
        compared += 1
    assert compared > 0


SMALL = [
    ("erdos_renyi", {"nodes": 12, "p": 0.3, "seed": 4}, 4),
    ("geometric", {"nodes": 12, "radius": 0.45, "seed": 2}, 3),
    ("grid", {"rows": 3, "cols": 4}, 4),
    ("path", {"nodes": 9}, 5),
]


@pytest.mark.parametrize("kind,kw,steps", SMALL, ids=[c[0] for c in SMALL])
def test_fast_path_matches_exact_arithmetic(kind, kw, steps):
    w = metropolis(kind, **kw)
    n = w.shape[0]
    sched = mf.fault_free_steps(w, steps, True)
    got = mf.plan_factors(w, steps, True, method="exact", symmetry=False)
    rows = fast_rows(w, steps, range(n))
    assert any(r is not None for r in rows)
    for v in range(n):
        exact = mf.exact_factors_rational(sched, v, mf.fault_free_received(w, v, steps))
        np.testing.assert_allclose(got[v], exact, rtol=0, atol=1e-9)


def test_a_lost_basis_or_a_small_direction_is_left_to_the_reference(monkeypatch):
    # Saturation: once r would pass n the locally orthogonalised blocks repeat directions.
    w = metropolis("erdos_renyi", nodes=60, p=0.1, seed=2)
    assert fast_rows(w, 40, [0, 1]) == [None, None]
    # The Gram check: a basis off orthonormality by more than allowed is refused.
    w = metropolis("erdos_renyi", nodes=120, p=0.08, seed=1)
    assert fast_rows(w, 6, [0])[0] is not None
    monkeypatch.setattr(mf, "_LOCAL_ORTH", 0.0)
    assert fast_rows(w, 6, [0])[0] is None
    monkeypatch.undo()
    # A direction between roundoff and the fast path's floor: refused, the reference decides.
    monkeypatch.setattr(mf, "_LOCAL_KEEP", 10.0)
    assert fast_rows(w, 6, [0])[0] is None
    monkeypatch.undo()
    # A widened ambiguous band reaches the fast path too: the reference then raises.
    monkeypatch.setattr(mf, "KEEP_TOL", 2.0)
    assert fast_rows(w, 6, [0])[0] is None
    with pytest.raises(mf.NumericalRankError, match="cannot tell"):
        mf.plan_factors(w, 6, True, method="exact", observers=[0])


def test_forked_children_give_the_reference_numbers():
    # n >= _PARALLEL_MIN_N: batches run in one forked child per core.
    w = metropolis("erdos_renyi", nodes=256, p=0.04, seed=3)
    assert w.shape[0] >= mf._PARALLEL_MIN_N
    obs = list(range(0, 256, 5))
    got = mf.plan_factors(w, 8, True, method="exact", observers=obs)
    ref = reference(w, 8, True, observers=obs)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-9)
    assert sum(r is not None for r in fast_rows(w, 8, obs)) > len(obs) // 2
