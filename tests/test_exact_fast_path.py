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
from freshpy import run_with_free_blas

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
    # saturates (r = 1 + deg T > n) everywhere but at the two leaves (r = 36). At T = 40 the
    # leaves' bases drift to the edge of the fast path's gate: one is taken with OpenBLAS's
    # AVX2 kernels, none with its AVX-512 ones (the reference's numbers either way).
    ("erdos_renyi", {"nodes": 60, "p": 0.1, "seed": 2}, 35, "some"),
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


def test_blocks_orthonormalised_by_the_svd_carry_the_recurrence_on(monkeypatch):
    """A block whose Gram matrix cannot size it goes through its SVD (z = U S V^T, the new
    block U); the next step's three-term recurrence then subtracts the block before it with
    the coefficient z^T U = V S. On these graphs that path never ends in an accepted row at the
    default floor, so the floor is raised to 0.1: most observers then take it at some step and
    are still accepted, with the reference's rows. (A wrong coefficient, S V^T, leaves the
    blocks off orthogonal: every such observer is then refused.)"""
    real_svd = np.linalg.svd
    calls: list[int] = []
    monkeypatch.setattr(np.linalg, "svd", lambda *a, **k: calls.append(1) or real_svd(*a, **k))
    monkeypatch.setattr(mf, "_LOCAL_KEEP", 0.1)
    w = metropolis("erdos_renyi", nodes=80, p=0.1, seed=1)
    n = w.shape[0]
    ref = reference(w, 5)
    through_svd = 0
    for v in range(n):
        calls.clear()
        row = fast_rows(w, 5, [v])[0]
        if row is None or not calls:
            continue
        through_svd += 1
        row = np.clip(row, 0.0, 1.0)
        row[v] = 1.0
        np.testing.assert_allclose(row, ref[v], rtol=1e-12, atol=1e-14)
    assert through_svd >= n // 2, through_svd


def test_forked_children_give_the_reference_numbers():
    # n >= _PARALLEL_MIN_N: batches run in one forked child per core.
    w = metropolis("erdos_renyi", nodes=256, p=0.04, seed=3)
    assert w.shape[0] >= mf._PARALLEL_MIN_N
    obs = list(range(0, 256, 5))
    got = mf.plan_factors(w, 8, True, method="exact", observers=obs)
    ref = reference(w, 8, True, observers=obs)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-9)
    assert sum(r is not None for r in fast_rows(w, 8, obs)) > len(obs) // 2


def _near_orthonormal(rng, n: int, r: int, drift: float, positive: bool = False) -> np.ndarray:
    """An n x r basis whose Gram matrix is I + (a rank-one bump of size ``drift``); with
    ``positive`` its entries share one sign (roundoff then adds up instead of cancelling)."""
    if positive:
        q = np.abs(rng.standard_normal((n, r))) + 1.0
        q, _ = np.linalg.qr(q)
        q *= np.sign(q[0])  # the first column positive; the rest mixed, as Lanczos blocks are
    else:
        q, _ = np.linalg.qr(rng.standard_normal((n, r)))
    v = rng.standard_normal(r)
    v /= np.linalg.norm(v)
    # Q (I + d v v^T)^{1/2}: Gram matrix I + d v v^T exactly (up to double roundoff)
    return q + (np.sqrt(1.0 + drift) - 1.0) * np.outer(q @ v, v)


@pytest.mark.parametrize("n,r", [(300, 40), (2048, 120), (1500, 200)])
def test_the_single_precision_drift_bound_is_never_below_the_drift(n, r):
    """``_drift_bound`` forms Q^T Q from single-precision products; its rounding term must keep
    it above ||Q^T Q - I||_2 whatever the drift, including drifts at the single-precision
    roundoff level, where the computed Gram matrix alone can read less than the truth."""
    rng = np.random.default_rng(n + r)
    for drift in (0.0, 1e-9, 3e-8, 1e-7, 1e-6, 1e-4, 1e-2):
        for positive in (False, True):
            q = _near_orthonormal(rng, n, r, drift, positive)
            e = q.T @ q - np.eye(r)
            true = float(np.max(np.abs(np.linalg.eigvalsh(e))))
            read, bound = mf._drift_bound(q)
            assert bound >= true, (drift, positive, bound, true)
            assert read <= bound
            # and not vacuous: rows in chunks keep it near gamma_512 r, far below 1
            assert bound <= true + 1.1 * 512 * 2.0**-24 * r + 1e-9, (bound, true)


def test_the_single_precision_gram_matrix_alone_can_read_below_the_drift():
    """What the rounding term is for. Columns of +-1/32 over 1024 rows (Walsh functions) are
    orthonormal, and so is everything single precision computes from them, exactly, in any
    order of summation; moved by 2^-40 (less than half a single-precision step at 1/32), they
    round back to the same columns. So the drift read in single precision is 0 while the true
    one is about 1e-10: the bound must come from the rounding term, and does."""
    n, r = 1024, 8
    walsh = np.array([[(-1) ** bin(i & j).count("1") for j in range(r)] for i in range(n)])
    q = walsh / 32.0 + 2.0**-40 * (np.arange(n * r).reshape(n, r) % 3 == 0)
    assert np.array_equal(q.astype(np.float32), walsh / 32.0)
    true = float(np.max(np.abs(np.linalg.eigvalsh(q.T @ q - np.eye(r)))))
    read, bound = mf._drift_bound(q)
    assert read == 0.0 < true <= bound


def test_refined_leverages_are_the_leverages_to_roundoff_and_bound_them_from_above():
    rng = np.random.default_rng(3)
    n, r = 400, 60
    for drift in (0.0, 1e-6, 1e-3, 1e-2):
        q = _near_orthonormal(rng, n, r, drift)
        src = np.array([0, 17, 399])
        g = q.T @ q
        b = q[src].T
        exact = np.einsum("ij,ij->j", b, np.linalg.solve(g, b))
        bound = mf._drift_bound(q)[1]
        got = mf._refined_leverages(q, src, bound)
        assert got is not None
        np.testing.assert_allclose(got, exact, rtol=1e-13, atol=0)
        # Stopped early (a loose tolerance: the first residual is taken), the certified gap is
        # far above roundoff, and the value is above the leverage by at most that gap.
        if drift >= 1e-3:
            loose = mf._refined_leverages(q, src, bound, tol=1.0)
            gap = np.einsum("ij,ij->j", g @ b - b, g @ b - b) / (1.0 - bound)
            assert np.all(gap > 1e-9 * exact)
            assert np.all(loose >= exact) and np.all(loose - exact <= gap * (1 + 1e-9)), (
                loose - exact,
                gap,
            )
    # A drift the allowed steps cannot resolve: no answer (the Gram matrix then decides).
    q = _near_orthonormal(rng, n, r, 0.5)
    assert mf._refined_leverages(q, np.array([1]), 0.5) is None


def test_few_sources_are_read_without_the_double_precision_gram_matrix(monkeypatch):
    """On an Erdős–Rényi graph the single-precision check vouches for every observer's basis
    (no double-precision Gram matrix), and the few sources' leverages equal those read through
    that Gram matrix (the check refused by a threshold of -1)."""
    w = metropolis("erdos_renyi", nodes=700, p=0.015, seed=4)
    n = w.shape[0]
    ws = sp.csr_matrix(w)
    src = np.array([0, 5, n - 1])
    starts = [[v, *mf._neighbours(w, v)] for v in range(0, n, 23)]
    calls = []
    real = mf._refined_leverages
    monkeypatch.setattr(mf, "_refined_leverages", lambda *a: calls.append(1) or real(*a))
    single = mf._local_leverages(ws, starts, n, 12, src)
    taken = sum(x is not None for x in single)
    assert taken == len(starts) and len(calls) == taken
    monkeypatch.setattr(mf, "_SINGLE_ORTH", -1.0)
    double = mf._local_leverages(ws, starts, n, 12, src)
    assert len(calls) == taken  # not called again
    for a, b in zip(single, double, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-17)
    # A block whose smallest direction is within the bound of the floor: the Gram matrix.
    # (A bound standing in for the real one: 0.45 is more than these bases' smallest new
    # direction minus the floor, 0 is less.)
    monkeypatch.setattr(mf, "_SINGLE_ORTH", 0.5)
    monkeypatch.setattr(mf, "_drift_bound", lambda q: (0.0, 0.45))
    for a, b in zip(mf._local_leverages(ws, starts, n, 12, src), double, strict=True):
        np.testing.assert_array_equal(a, b)
    assert len(calls) == taken
    monkeypatch.setattr(mf, "_drift_bound", lambda q: (0.0, 0.0))
    mf._local_leverages(ws, starts, n, 12, src)
    assert len(calls) == 2 * taken
    del calls[taken:]
    monkeypatch.undo()
    monkeypatch.setattr(mf, "_refined_leverages", lambda *a: calls.append(1) or real(*a))
    # A drift read above the Gram matrix's gate (here 0): refused on both paths.
    monkeypatch.setattr(mf, "_LOCAL_ORTH", 0.0)
    assert all(x is None for x in mf._local_leverages(ws, starts, n, 12, src))
    assert len(calls) == taken
    monkeypatch.setattr(mf, "_LOCAL_ORTH", 1e-4)
    # A solve that runs out of steps hands the observer to the Gram matrix too.
    monkeypatch.setattr(mf, "_SINGLE_ORTH", 0.02)
    monkeypatch.setattr(mf, "_REFINE_STEPS", -1)
    again = mf._local_leverages(ws, starts, n, 12, src)
    assert len(calls) == 2 * taken
    for a, b in zip(again, double, strict=True):
        np.testing.assert_array_equal(a, b)


def test_observers_in_the_calling_process_run_blas_on_one_thread():
    """A small graph's observers run in the calling process (no fork): there too BLAS and LAPACK
    run on one thread, scipy's own OpenBLAS included (its threads only spun beside an observer's
    small products). In a fresh interpreter whose BLAS may use every core."""
    code = """if True:
        import numpy as np
        from threadpoolctl import threadpool_info
        import coordinator_free.privacy.muffliato as mf

        seen = []

        def fn(batch):
            import scipy.linalg  # its OpenBLAS too

            blas = [p for p in threadpool_info() if p["user_api"] == "blas"]
            seen.append(max(p["num_threads"] for p in blas))
            return np.zeros((len(batch), 1)), np.zeros(len(batch))

        mf._fill_observers(fn, [[0], [1]], np.zeros((2, 1)), 16, np.zeros(2))
        print(seen)
    """
    assert run_with_free_blas(code) == "[1, 1]"


def test_block_product_is_scipys_product_bit_for_bit():
    """The fast path's sparse product (scipy's own routine, called without its checks) gives
    exactly ``ws @ x``, for blocks of any width and for non-contiguous input; a non-contiguous
    output is refused (its sums would land in a copy); a matrix of another type takes scipy's
    product itself."""
    rng = np.random.default_rng(5)
    ws = sp.random(300, 300, density=0.03, random_state=7, format="csr") + sp.eye(300)
    ws = sp.csr_matrix(ws)
    product = mf._block_product(ws)
    for k in (1, 3, 10, 17):
        x = rng.standard_normal((300, k))
        out = np.full((300, k), np.nan)
        product(x, out)
        assert np.array_equal(out, ws @ x)
        strided = rng.standard_normal((300, 2 * k))[:, ::2]
        product(strided, out)
        assert np.array_equal(out, ws @ strided)
    with pytest.raises(ValueError, match="C-contiguous"):
        product(x, np.empty((300, 2 * x.shape[1]))[:, ::2])
    single = sp.csr_matrix(ws, dtype=np.float32)
    out = np.empty((300, 4))
    x = rng.standard_normal((300, 4))
    mf._block_product(single)(x, out)
    assert np.array_equal(out, single @ x)
