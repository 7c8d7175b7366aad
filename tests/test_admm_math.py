"""Private ADMM's mathematics (coordinator_free.ml.prox, coordinator_free.ml.admm): the proximal
operators, the clipped step's sensitivity bound, the synthetic-sparse dataset, and the scaling
of gamma, checked by convergence of the noise-free runs to scikit-learn's Lasso solution."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.linear_model import Lasso

from coordinator_free.ml import admm
from coordinator_free.ml.datasets import DATASET_KINDS, load_dataset
from coordinator_free.ml.prox import (
    NEWTON_TOL,
    Objective,
    clipped_prox,
    clipped_prox_records,
    soft_threshold,
)

ALPHA = 0.002  # about what LassoCV picks on synthetic-sparse (seed 0)


@pytest.fixture(scope="module")
def sparse():
    ds = load_dataset("synthetic-sparse", seed=0, samples=1000, features=64)
    obj = Objective("lstsq", "l1", ALPHA)
    sk = Lasso(alpha=ALPHA, fit_intercept=False, tol=1e-14, max_iter=200_000)
    sk.fit(ds.X_train, ds.y_train)
    fstar = obj.value(sk.coef_, ds.X_train, ds.y_train)
    return ds, obj, sk.coef_, fstar


def _gap(obj, w, X, y, fstar):
    return (obj.value(w, X, y) - fstar) / fstar


# ---------------------------------------------------------------------------------------------
# prox


def _prox_residual(obj, x, v, X, y, t):
    """Gradient of ``mean loss + ||x - v||^2/(2t)`` at x: zero at the prox."""
    return obj.loss_grad(x, X, y) + (x - v) / t


@pytest.mark.parametrize("loss", ["lstsq", "logistic"])
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_prox_loss_is_the_minimiser(loss, rows):
    rng = np.random.default_rng(rows)
    X = rng.standard_normal((rows, 6))
    y = rng.integers(0, 2, rows).astype(float) if loss == "logistic" else rng.standard_normal(rows)
    v = 3.0 * rng.standard_normal(6)
    obj = Objective(loss, "none")
    for t in (0.01, 1.0, 50.0):
        x = obj.prox_loss(v, X, y, t)
        assert np.linalg.norm(_prox_residual(obj, x, v, X, y, t)) < 1e-9 * (1 + 1 / t)
        if loss == "logistic":  # the documented tolerance: distance to the prox <= t * tol
            tol = NEWTON_TOL * (1 + np.linalg.norm(v) / t)
            assert np.linalg.norm(_prox_residual(obj, x, v, X, y, t)) <= 10 * tol


def test_prox_reg_formulas():
    v = np.array([-3.0, -0.5, 0.0, 0.2, 4.0])
    np.testing.assert_allclose(Objective("lstsq", "l1", 2.0).prox_reg(v, 0.5), [-2, 0, 0, 0, 3])
    np.testing.assert_allclose(Objective("lstsq", "l2", 2.0).prox_reg(v, 0.5), v / 2.0)
    np.testing.assert_array_equal(Objective("lstsq", "none").prox_reg(v, 0.5), v)
    np.testing.assert_allclose(soft_threshold(v, 1.0), [-2, 0, 0, 0, 3])


def test_value_is_sklearns_lasso_objective():
    rng = np.random.default_rng(3)
    X, y, w = rng.standard_normal((30, 4)), rng.standard_normal(30), rng.standard_normal(4)
    obj = Objective("lstsq", "l1", 0.3)
    expect = np.sum((y - X @ w) ** 2) / (2 * 30) + 0.3 * np.abs(w).sum()
    assert obj.value(w, X, y) == pytest.approx(expect, rel=1e-14)
    g = obj.loss_grad(w, X, y)
    eps = 1e-6
    num = [
        (obj.loss_value(w + eps * e, X, y) - obj.loss_value(w - eps * e, X, y)) / (2 * eps)
        for e in np.eye(4)
    ]
    np.testing.assert_allclose(g, num, rtol=1e-6)


@pytest.mark.parametrize("loss", ["lstsq", "logistic"])
def test_clipped_prox_moves_at_most_t_L(loss):
    """The step is the prox of the L-Lipschitz surrogate: within t L of v, the exact prox where no
    record is clamped, and a stationary point of the surrogate's prox objective where some are."""
    rng = np.random.default_rng(7)
    obj = Objective(loss, "none")
    n_clipped = 0
    for _ in range(50):
        X = 5.0 * rng.standard_normal((rng.integers(1, 5), 5))
        y = rng.integers(0, 2, X.shape[0]).astype(float) * 7.0
        v, t, L = 4.0 * rng.standard_normal(5), rng.uniform(0.1, 3.0), rng.uniform(0.05, 2.0)
        x, clipped = clipped_prox(obj, v, X, y, t, L)
        assert np.linalg.norm(x - v) <= t * L * (1 + 1e-12)
        d, _dd, _c = obj.surrogate_coefs(x, X, y, L)
        grad_phi = X.T @ d / X.shape[0] + (x - v) / t
        assert np.linalg.norm(grad_phi) <= 1e-8 * max(1.0, L)
        if not clipped:
            np.testing.assert_allclose(x, obj.prox_loss(v, X, y, t), atol=1e-8)
        else:
            n_clipped += 1
    assert n_clipped > 10  # the clamp was exercised


@pytest.mark.parametrize("loss", ["lstsq", "logistic"])
def test_surrogate_is_convex_L_lipschitz_and_its_gradient_is_the_clipped_one(loss):
    rng = np.random.default_rng(3)
    obj = Objective(loss, "none")
    X = 4.0 * rng.standard_normal((30, 6))
    y = rng.integers(0, 2, 30).astype(float) if loss == "logistic" else 3 * rng.standard_normal(30)
    L = 0.7
    n_clamped = 0
    for _ in range(30):
        w, w2 = 2.0 * rng.standard_normal(6), 2.0 * rng.standard_normal(6)
        d, _dd, clamped = obj.surrogate_coefs(w, X, y, L)
        G = d[:, None] * X
        # every record's gradient is its own gradient clipped to L
        raw = obj.per_record_grads(w, X, y)
        norms = np.linalg.norm(raw, axis=1)
        np.testing.assert_allclose(G, raw * np.minimum(1.0, L / norms)[:, None], atol=1e-12)
        assert np.all(np.linalg.norm(G, axis=1) <= L * (1 + 1e-12))
        # the value's gradient is that mean (central differences)
        f = lambda u: obj.surrogate_loss_value(u, X, y, L)  # noqa: E731
        num = np.array([(f(w + 1e-6 * e) - f(w - 1e-6 * e)) / 2e-6 for e in np.eye(6)])
        np.testing.assert_allclose(num, G.mean(axis=0), atol=1e-6)
        # convex: above its tangent, and L-Lipschitz
        assert f(w2) >= f(w) + G.mean(axis=0) @ (w2 - w) - 1e-10
        assert abs(f(w2) - f(w)) <= L * np.linalg.norm(w2 - w) + 1e-12
        n_clamped += int(clamped.sum())
        assert 0 < clamped.sum() or loss == "logistic"
    assert n_clamped > 30  # the clamp was exercised
    assert obj.surrogate_loss_value(w, X, y, math.inf) == obj.loss_value(w, X, y)


@pytest.mark.parametrize("loss", ["lstsq", "logistic"])
def test_one_record_moves_the_surrogate_prox_by_at_most_2_t_L_over_m(loss):
    """Record-level sensitivity, recomputed: two shards of m records differing in one record
    (replaced by an adversarial one) give steps at most 2 t L / m apart."""
    rng = np.random.default_rng(5)
    obj = Objective(loss, "l1", 0.05)
    worst = 0.0
    for _ in range(40):
        m = int(rng.integers(2, 40))
        X = 3.0 * rng.standard_normal((m, 8))
        y = rng.integers(0, 2, m).astype(float) if loss == "logistic" else rng.standard_normal(m)
        X2, y2 = X.copy(), y.copy()
        j = int(rng.integers(m))
        X2[j] = 50.0 * rng.standard_normal(8)
        y2[j] = (1.0 - y[j]) if loss == "logistic" else -100.0 * y[j]
        v, t, L = 3.0 * rng.standard_normal(8), rng.uniform(0.2, 3.0), rng.uniform(0.1, 5.0)
        x, _ = clipped_prox(obj, v, X, y, t, L)
        x2, _ = clipped_prox(obj, v, X2, y2, t, L)
        ratio = np.linalg.norm(x - x2) / (2.0 * t * L / m)
        assert ratio <= 1.0 + 1e-6
        worst = max(worst, ratio)
    assert worst > 0.3  # the bound is approached, not vacuous


def test_surrogate_prox_certifies_its_tolerance():
    from coordinator_free.ml.prox import PROX_TOL_REL, surrogate_prox

    rng = np.random.default_rng(9)
    obj = Objective("lstsq", "none")
    X, y = 8.0 * rng.standard_normal((50, 64)), 3.0 * rng.standard_normal(50)
    v = rng.standard_normal(64)
    x, clamped, err = surrogate_prox(obj, v, X, y, 1.0, 2.0)
    assert clamped and err <= PROX_TOL_REL * 2.0
    # the exact surrogate prox by a long proximal-gradient run agrees to the certificate
    w = v.copy()
    for _ in range(20000):
        d, _dd, _c = obj.surrogate_coefs(w, X, y, 2.0)
        w = w - 0.01 * (X.T @ d / 50 + (w - v))
    assert np.linalg.norm(w - x) <= 1e-6


@pytest.mark.parametrize("loss", ["lstsq", "logistic"])
def test_vectorised_record_prox_matches_the_general_one(loss):
    rng = np.random.default_rng(11)
    obj = Objective(loss, "l1", 0.1)
    X = 3.0 * rng.standard_normal((40, 6))
    y = rng.integers(0, 2, 40).astype(float) if loss == "logistic" else rng.standard_normal(40)
    V = 2.0 * rng.standard_normal((40, 6))
    for L in (math.inf, 0.5):
        rows, mask = clipped_prox_records(obj, V, X, y, 0.7, L)
        for j in range(40):
            x, c = clipped_prox(obj, V[j], X[j : j + 1], y[j : j + 1], 0.7, L)
            np.testing.assert_allclose(rows[j], x, atol=1e-9)
            assert bool(mask[j]) == c


def test_bad_objective_and_prox_arguments_are_named():
    with pytest.raises(ValueError, match="Objective.loss"):
        Objective("hinge", "l1", 0.1)
    with pytest.raises(ValueError, match="Objective.reg "):
        Objective("lstsq", "l0", 0.1)
    with pytest.raises(ValueError, match="reg_strength"):
        Objective("lstsq", "l1", -1.0)
    obj = Objective()
    with pytest.raises(ValueError, match="clip bound"):
        clipped_prox(obj, np.zeros(2), np.ones((1, 2)), np.ones(1), 1.0, 0.0)
    with pytest.raises(ValueError, match="prox step"):
        obj.prox_loss(np.zeros(2), np.ones((1, 2)), np.ones(1), 0.0)


# ---------------------------------------------------------------------------------------------
# dataset


def test_synthetic_sparse_is_the_papers_setting():
    assert "synthetic-sparse" in DATASET_KINDS
    ds = load_dataset("synthetic-sparse", seed=5, samples=1000, features=64)
    assert ds.X_train.shape == (800, 64) and ds.X_test.shape == (200, 64)
    assert ds.n_classes == 0
    X = np.vstack([ds.X_train, ds.X_test])
    np.testing.assert_allclose(X.mean(axis=0), 0.0, atol=1e-12)  # standardised over all rows
    np.testing.assert_allclose(X.std(axis=0), 1.0, atol=1e-12)
    # the planted model has 8 non-zero coefficients in [0, 1] and label noise 0.1
    theta, *_ = np.linalg.lstsq(ds.X_train, ds.y_train, rcond=None)
    # (the null coefficients are estimated within ~0.1/sqrt(800); with seed 5 the smallest
    # planted value is about 0.04)
    big = np.abs(theta) > 0.02
    assert big.sum() == 8
    assert np.all((theta[big] > 0.0) & (theta[big] < 1.02))
    resid = ds.y_train - ds.X_train @ theta
    assert 0.08 < resid.std() < 0.12
    again = load_dataset("synthetic-sparse", seed=5, samples=1000, features=64)
    np.testing.assert_array_equal(again.X_train, ds.X_train)
    other = load_dataset("synthetic-sparse", seed=6, samples=1000, features=64)
    assert not np.array_equal(other.y_train, ds.y_train)


# ---------------------------------------------------------------------------------------------
# ADMM steps


def test_local_step_and_its_sensitivity():
    """u' = u + 2 lam (x - z + eta/2); two datasets at the same state give u' at most
    4 lam gamma L apart (the theorems' sensitivity)."""
    rng = np.random.default_rng(2)
    obj = Objective("lstsq", "l1", 0.1)
    gamma, lam, L = 0.8, 0.6, 0.3
    z, u, eta = rng.standard_normal(4), rng.standard_normal(4), rng.standard_normal(4)
    worst = 0.0
    for _ in range(30):
        X1, X2 = 10 * rng.standard_normal((2, 1, 4))
        y1, y2 = 10 * rng.standard_normal((2, 1))
        u1, x1 = admm.local_step(obj, X1, y1, z, u, gamma=gamma, lam=lam, clip=L, eta=eta)
        u2, _ = admm.local_step(obj, X2, y2, z, u, gamma=gamma, lam=lam, clip=L, eta=eta)
        xc, _ = clipped_prox(obj, 2 * z - u, X1, y1, gamma, L)
        np.testing.assert_allclose(u1, u + 2 * lam * (xc - z + eta / 2))
        np.testing.assert_allclose(x1, xc)
        worst = max(worst, np.linalg.norm(u1 - u2))
    assert 2 * lam * gamma * L < worst <= 4 * lam * gamma * L * (1 + 1e-12)


def test_z_of_is_the_prox_of_gamma_r():
    obj = Objective("lstsq", "l1", 0.5)
    z_hat = np.array([1.0, -0.2, 0.1])
    np.testing.assert_allclose(admm.z_of(obj, z_hat, gamma=0.4, n=10), [0.8, 0.0, 0.0])
    with pytest.raises(ValueError, match="n must be"):
        admm.z_of(obj, z_hat, gamma=0.4, n=0)


# ---------------------------------------------------------------------------------------------
# noise-free convergence to scikit-learn's Lasso (proves the scaling of gamma)

GAMMA, LAM = 0.1, 0.9


def test_central_admm_converges_to_sklearns_lasso(sparse):
    ds, obj, _, fstar = sparse
    run = admm.central_admm(
        obj, ds.X_train, ds.y_train, gamma=GAMMA, lam=LAM, clip=math.inf, sigma=0.0,
        iterations=150, rng=np.random.default_rng(0),
    )  # fmt: skip
    assert abs(_gap(obj, run.final, ds.X_train, ds.y_train, fstar)) < 1e-6
    assert run.clipped == 0


def test_central_admm_with_user_groups_converges(sparse):
    ds, obj, _, fstar = sparse
    groups = np.array_split(np.arange(ds.X_train.shape[0]), 16)
    run = admm.central_admm(
        obj, ds.X_train, ds.y_train, gamma=2.0, lam=LAM, clip=math.inf, sigma=0.0,
        iterations=300, rng=np.random.default_rng(0), groups=groups,
    )  # fmt: skip
    assert abs(_gap(obj, run.final, ds.X_train, ds.y_train, fstar)) < 1e-6


@pytest.mark.parametrize("secure", [False, True])
def test_federated_admm_converges_to_sklearns_lasso(sparse, secure):
    ds, obj, _, fstar = sparse
    run = admm.federated_admm(
        obj, ds.X_train, ds.y_train, gamma=GAMMA, lam=LAM, clip=math.inf, sigma=0.0,
        rounds=1500, m=80, rng=np.random.default_rng(1), secure_aggregation=secure,
    )  # fmt: skip
    assert abs(_gap(obj, run.final, ds.X_train, ds.y_train, fstar)) < 1e-6
    assert run.info["secure_aggregation"] is secure


def test_secure_aggregation_changes_no_arithmetic(sparse):
    ds, obj, _, _ = sparse
    kw = dict(gamma=GAMMA, lam=LAM, clip=1.0, sigma=0.3, rounds=20, m=50)
    a = admm.federated_admm(obj, ds.X_train, ds.y_train, rng=np.random.default_rng(4), **kw)
    b = admm.federated_admm(
        obj, ds.X_train, ds.y_train, rng=np.random.default_rng(4), secure_aggregation=True, **kw
    )
    np.testing.assert_array_equal(a.z, b.z)


def test_decentralized_admm_converges_to_sklearns_lasso(sparse):
    ds, obj, _, fstar = sparse
    X, y = ds.X_train[:200], ds.y_train[:200]
    sk = Lasso(alpha=ALPHA, fit_intercept=False, tol=1e-14, max_iter=200_000).fit(X, y)
    fstar = obj.value(sk.coef_, X, y)
    run = admm.decentralized_admm_reference(
        obj, X, y, gamma=GAMMA, lam=LAM, clip=math.inf, sigma=0.0, steps=200 * 150,
        rng=np.random.default_rng(2),
    )  # fmt: skip
    assert abs(_gap(obj, run.final, X, y, fstar)) < 1e-6
    assert run.path is not None and run.path.shape == (200 * 150,)
    assert set(np.unique(run.path)) == set(range(200))


def test_prox_sgd_full_batch_is_proximal_gradient(sparse):
    ds, obj, _, fstar = sparse
    run = admm.prox_sgd(
        obj, ds.X_train, ds.y_train, eta=0.5, clip=math.inf, sigma=0.0, iterations=300,
        batch=ds.X_train.shape[0], rng=np.random.default_rng(0),
    )  # fmt: skip
    assert abs(_gap(obj, run.final, ds.X_train, ds.y_train, fstar)) < 1e-6


def test_noise_gap_shrinks_with_sigma(sparse):
    """With noise the runs stop short of the optimum, and less noise gets closer: the gap goes
    like sigma^2 (L = 3 is above every record's gradient norm at the optimum, 2.9, so clipping
    adds no bias there)."""
    ds, obj, _, fstar = sparse
    X, y = ds.X_train, ds.y_train
    gaps = {}
    for sigma in (1.0, 0.1, 0.01):
        g_c, g_f = [], []
        for seed in range(3):
            c = admm.central_admm(
                obj, X, y, gamma=GAMMA, lam=LAM, clip=3.0, sigma=sigma, iterations=60,
                rng=np.random.default_rng(seed),
            )  # fmt: skip
            f = admm.federated_admm(
                obj, X, y, gamma=GAMMA, lam=LAM, clip=3.0, sigma=sigma, rounds=600, m=80,
                rng=np.random.default_rng(seed),
            )  # fmt: skip
            g_c.append(_gap(obj, c.final, X, y, fstar))
            g_f.append(_gap(obj, f.final, X, y, fstar))
        gaps[sigma] = (np.mean(g_c), np.mean(g_f))
    for k in range(2):
        assert gaps[1.0][k] > gaps[0.1][k] > gaps[0.01][k] > 0
        assert gaps[1.0][k] > 30 * gaps[0.1][k] > 900 * gaps[0.01][k]


def test_runs_are_deterministic_given_the_rng(sparse):
    ds, obj, _, _ = sparse
    kw = dict(gamma=GAMMA, lam=LAM, clip=1.0, sigma=0.5, steps=300)
    a = admm.decentralized_admm_reference(
        obj, ds.X_train, ds.y_train, rng=np.random.default_rng(9), **kw
    )
    b = admm.decentralized_admm_reference(
        obj, ds.X_train, ds.y_train, rng=np.random.default_rng(9), **kw
    )
    np.testing.assert_array_equal(a.z, b.z)
    np.testing.assert_array_equal(a.path, b.path)


def test_bad_run_parameters_are_named(sparse):
    ds, obj, _, _ = sparse
    X, y, rng = ds.X_train, ds.y_train, np.random.default_rng(0)
    base = dict(gamma=1.0, lam=0.5, clip=1.0, sigma=0.0, iterations=1, rng=rng)
    with pytest.raises(ValueError, match="lam"):
        admm.central_admm(obj, X, y, **{**base, "lam": 1.0})
    with pytest.raises(ValueError, match="gamma"):
        admm.central_admm(obj, X, y, **{**base, "gamma": 0.0})
    with pytest.raises(ValueError, match="m \\(users per round\\)"):
        admm.federated_admm(
            obj, X, y, gamma=1.0, lam=0.5, clip=1.0, sigma=0.0, rounds=1, m=10_000, rng=rng
        )
    with pytest.raises(ValueError, match="finite clip"):
        admm.prox_sgd(obj, X, y, eta=0.1, clip=math.inf, sigma=1.0, iterations=1, batch=10, rng=rng)


def test_poisson_sampling_converges_and_draws_rate_m_over_n(sparse):
    ds, obj, _, fstar = sparse
    X, y = ds.X_train, ds.y_train
    run = admm.federated_admm(
        obj, X, y, gamma=GAMMA, lam=LAM, clip=math.inf, sigma=0.0, rounds=1500, m=80,
        rng=np.random.default_rng(3), sampling="poisson",
    )  # fmt: skip
    assert abs(_gap(obj, run.final, X, y, fstar)) < 1e-6
    assert run.info["sampling"] == "poisson"
    assert abs(run.steps / (1500 * 80) - 1) < 0.02  # Binomial(800, 0.1) per round on average
    sgd = admm.prox_sgd(
        obj, X, y, eta=0.1, clip=1.0, sigma=0.0, iterations=400, batch=80,
        rng=np.random.default_rng(3), sampling="poisson",
    )  # fmt: skip
    assert abs(sgd.steps / (400 * 80) - 1) < 0.03
    with pytest.raises(ValueError, match="sampling"):
        admm.prox_sgd(
            obj, X, y, eta=0.1, clip=1.0, sigma=0.0, iterations=1, batch=8, rng=np.random.default_rng(0),
            sampling="shuffle",
        )  # fmt: skip


@pytest.mark.slow
def test_figure_one_quick_gap_shrinks_with_eps(tmp_path):
    """bench/admm_figure.py --quick: for both methods the test gap falls as eps grows."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "admm_figure.py"
    spec = importlib.util.spec_from_file_location("admm_figure", path)
    fig = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fig)
    md = tmp_path / "t.md"
    assert fig.main(["--quick", "--md", str(md)]) == 0
    rows = [r for r in md.read_text().splitlines() if r.startswith("| ") and "target" not in r]
    assert len(rows) == 3
    gaps = [[float(c.split("±")[0]) for c in (r.split("|")[4], r.split("|")[7])] for r in rows]
    for k in range(2):
        assert gaps[0][k] > gaps[1][k] > gaps[2][k]
    eps = [float(r.split("|")[1]) for r in rows]
    got = [[float(r.split("|")[c].split("(")[0]) for c in (3, 6)] for r in rows]
    for target, pair in zip(eps, got, strict=True):  # the accountant's eps never exceeds the target
        assert all(e <= target * (1 + 1e-9) for e in pair)


def test_logistic_admm_converges_to_sklearns_logistic_regression():
    """The Newton prox inside ADMM: L2-regularised logistic regression, 8 users with 40 records
    each (central) and one record per user (federated), against scikit-learn (whose objective
    C sum loss + ||w||^2/2 is (C n) times ours with reg_strength = 1/(C n))."""
    from sklearn.linear_model import LogisticRegression

    ds = load_dataset("synthetic-logistic", seed=1, samples=400, features=5, intercept=False)
    X, y = ds.X_train, ds.y_train
    reg = 0.01
    sk = LogisticRegression(C=1 / (reg * len(y)), fit_intercept=False, tol=1e-12, max_iter=10_000)
    obj = Objective("logistic", "l2", reg)
    fstar = obj.value(sk.fit(X, y).coef_[0], X, y)
    groups = np.array_split(np.arange(len(y)), 8)
    central = admm.central_admm(
        obj, X, y, gamma=10.0, lam=LAM, clip=math.inf, sigma=0.0, iterations=50,
        rng=np.random.default_rng(0), groups=groups,
    )  # fmt: skip
    assert abs(_gap(obj, central.final, X, y, fstar)) < 1e-6
    fed = admm.federated_admm(
        obj, X, y, gamma=10.0, lam=LAM, clip=math.inf, sigma=0.0, rounds=200, m=40,
        rng=np.random.default_rng(0),
    )  # fmt: skip
    assert abs(_gap(obj, fed.final, X, y, fstar)) < 1e-6
