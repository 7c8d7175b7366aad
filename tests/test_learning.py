"""Tests of the pure-numpy learning layer: models, clipping, partitions, datasets, shards."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator_free.ml import (
    DataError,
    clip_rows,
    clipped_mean_grad,
    load_dataset,
    load_shard,
    make_model,
    save_shard,
)
from coordinator_free.ml.partition import partition

# ---------------------------------------------------------------------------------------------
# models


def _problem(kind: str, seed: int = 0, b: int = 7, d: int = 5):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((b, d))
    if kind == "logistic":
        model, y = make_model(kind, d, 2, l2=0.3), rng.integers(0, 2, b)
    elif kind == "multinomial":
        model, y = make_model(kind, d, 4, l2=0.3), rng.integers(0, 4, b)
    else:
        model, y = make_model(kind, d, 0, l2=0.3), rng.standard_normal(b)
    theta = rng.standard_normal(model.dim)
    return model, theta, X, y


def _num_grad(f, theta: np.ndarray, h: float = 1e-6) -> np.ndarray:
    g = np.zeros_like(theta)
    for j in range(theta.size):
        e = np.zeros_like(theta)
        e[j] = h
        g[j] = (f(theta + e) - f(theta - e)) / (2 * h)
    return g


@pytest.mark.parametrize("kind", ["logistic", "multinomial", "least-squares", "ridge"])
def test_per_example_grads_match_finite_differences(kind):
    model, theta, X, y = _problem(kind)
    G = model.per_example_grads(theta, X, y)
    assert G.shape == (X.shape[0], model.dim) and G.dtype == np.float64

    def data_loss(t):
        return model.loss(t, X, y) - 0.5 * model.l2 * float(t @ t)

    np.testing.assert_allclose(G.mean(axis=0), _num_grad(data_loss, theta), rtol=1e-6, atol=1e-8)
    # every row is the gradient of its own example's loss
    for i in range(X.shape[0]):
        gi = _num_grad(lambda t, i=i: model.example_losses(t, X[i : i + 1], y[i : i + 1])[0], theta)
        np.testing.assert_allclose(G[i], gi, rtol=1e-6, atol=1e-8)
    # the regulariser: total gradient = data gradient + l2 theta
    total = _num_grad(lambda t: model.loss(t, X, y), theta)
    np.testing.assert_allclose(
        G.mean(axis=0) + model.regulariser_grad(theta), total, rtol=1e-6, atol=1e-8
    )
    np.testing.assert_array_equal(model.regulariser_grad(theta), 0.3 * theta)


@pytest.mark.parametrize("kind", ["logistic", "multinomial", "least-squares", "ridge"])
def test_models_are_deterministic_and_start_at_zero(kind):
    model, theta, X, y = _problem(kind, seed=3, b=50, d=9)
    a = model.per_example_grads(theta, X, y)
    b = model.per_example_grads(theta.copy(), X.copy(), y.copy())
    assert a.tobytes() == b.tobytes()
    assert model.loss(theta, X, y) == model.loss(theta, X, y)
    init = model.init()
    assert init.shape == (model.dim,) and init.dtype == np.float64 and not init.any()


def test_model_dims_predictions_and_accuracy():
    model, theta, X, y = _problem("multinomial")
    assert model.dim == 4 * 5 and model.n_features == 5 and model.n_classes == 4
    logits = X @ theta.reshape(4, 5).T  # row-major (n_classes, d) layout
    np.testing.assert_array_equal(model.predict(theta, X), logits.argmax(axis=1))
    assert model.accuracy(theta, X, y) == np.mean(logits.argmax(axis=1) == y)
    reg, theta_r, Xr, yr = _problem("least-squares")
    assert reg.accuracy(theta_r, Xr, yr) is None
    np.testing.assert_allclose(reg.predict(theta_r, Xr), Xr @ theta_r)
    logi, theta_l, Xl, yl = _problem("logistic")
    np.testing.assert_array_equal(logi.predict(theta_l, Xl), (Xl @ theta_l > 0).astype(np.int64))


def test_losses_are_stable_for_huge_margins():
    X = np.array([[1e4, 0.0], [-1e4, 0.0]])
    theta = np.array([1e3, 0.0])
    logi = make_model("logistic", 2, 2)
    losses = logi.example_losses(theta, X, np.array([0, 0]))
    assert np.isfinite(losses).all()
    np.testing.assert_allclose(losses, [1e7, 0.0])
    assert np.isfinite(logi.per_example_grads(theta, X, np.array([0, 1]))).all()
    multi = make_model("multinomial", 2, 3)
    big = np.array([1e5, 0, -1e5, 0, 0, 0], dtype=float)
    assert np.isfinite(multi.loss(big, X, np.array([1, 2])))
    assert np.isfinite(multi.per_example_grads(big, X, np.array([1, 2]))).all()


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("svm", 3, 2), "unknown model kind"),
        (("logistic", 3, 3), "binary"),
        (("logistic", 3, 0), "binary"),
        (("multinomial", 3, 0), "n_classes >= 2"),
        (("least-squares", 3, 2), "regression"),
        (("ridge", 3, 0), "l2 > 0"),
        (("logistic", 0, 2), "n_features"),
    ],
)
def test_make_model_rejects_bad_arguments(args, fragment):
    with pytest.raises(ValueError, match=fragment):
        make_model(*args)


def test_models_reject_mismatched_inputs():
    model = make_model("logistic", 3, 2)
    theta = model.init()
    with pytest.raises(ValueError, match="labels"):
        model.per_example_grads(theta, np.ones((2, 3)), np.array([0, 2]))
    with pytest.raises(ValueError, match="X must have shape"):
        model.loss(theta, np.ones((2, 4)), np.array([0, 1]))
    with pytest.raises(ValueError, match="theta"):
        model.loss(np.zeros(4), np.ones((2, 3)), np.array([0, 1]))
    with pytest.raises(ValueError, match="empty"):
        clipped_mean_grad(model, theta, np.ones((0, 3)), np.zeros(0, dtype=np.int64), 1.0)


# ---------------------------------------------------------------------------------------------
# clipping


def test_clip_rows_bounds_norms_and_keeps_short_rows_bit_identical():
    rng = np.random.default_rng(1)
    G = rng.standard_normal((40, 6)) * rng.choice([1e-3, 1.0, 1e3], size=(40, 1))
    G[3] = 0.0
    G[7] = [1e200, -1e200, 1e200, 0, 0, 0]  # norm overflows if computed naively
    G[8] = [1e-300, 0, 0, 0, 0, 0]
    before = G.copy()
    C = clip_rows(G, 1.5)
    assert G.tobytes() == before.tobytes()  # input untouched
    norms = np.linalg.norm(C, axis=1)
    assert np.all(norms <= 1.5 * (1 + 1e-12))
    short = np.linalg.norm(before / 1e100, axis=1) <= 1.5e-100  # no overflow on row 7
    assert not short[7] and short[3] and short[8]
    assert C[short].tobytes() == before[short].tobytes()
    np.testing.assert_allclose(norms[~short], 1.5, rtol=1e-12)
    # clipping scales, never rotates
    np.testing.assert_allclose(C[7], 1.5 * np.array([1, -1, 1, 0, 0, 0]) / np.sqrt(3))
    assert clip_rows(G, np.inf).tobytes() == G.tobytes()
    with pytest.raises(ValueError, match="clip"):
        clip_rows(G, 0.0)
    with pytest.raises(ValueError, match="non-finite"):
        clip_rows(np.array([[np.nan, 1.0]]), 1.0)


@pytest.mark.parametrize("kind", ["logistic", "multinomial", "least-squares"])
def test_clipped_mean_grad_is_bounded_for_huge_inputs(kind):
    model, theta, X, y = _problem(kind, seed=5, b=30, d=4)
    X = X * 1e6
    if model.n_classes == 0:
        y = y * 1e9
    theta = theta * 1e3
    for clip in (0.01, 1.0, 7.0):
        g = clipped_mean_grad(model, theta, X, y, clip)
        assert g.shape == (model.dim,)
        assert np.linalg.norm(g) <= clip * (1 + 1e-12)
        # clipping is per example and comes first: the mean of the clipped rows, nothing else
        expected = clip_rows(model.per_example_grads(theta, X, y), clip).mean(axis=0)
        assert g.tobytes() == expected.tobytes()


def test_clipped_mean_grad_sensitivity_to_one_example():
    model, theta, X, y = _problem("least-squares", seed=2, b=20, d=3)
    clip = 0.5
    g = clipped_mean_grad(model, theta, X, y, clip)
    X2, y2 = X.copy(), y.copy()
    X2[4], y2[4] = [1e8, -1e8, 3e7], -1e12  # replace one example by an outlier
    g2 = clipped_mean_grad(model, theta, X2, y2, clip)
    assert np.linalg.norm(g - g2) <= 2 * clip / X.shape[0] * (1 + 1e-12)


# ---------------------------------------------------------------------------------------------
# partitions


def _labels(m: int = 300, k: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, k, m)


def _check_parts(parts, m):
    for p in parts:
        assert p.dtype == np.int64 and p.ndim == 1
        assert np.all(np.diff(p) > 0)  # sorted and no repeats
        assert p.size == 0 or (p.min() >= 0 and p.max() < m)
    allidx = np.concatenate(parts)
    assert np.unique(allidx).size == allidx.size  # disjoint
    return allidx


@pytest.mark.parametrize(
    "scheme, kw",
    [("iid", {}), ("dirichlet", {"beta": 0.5, "n_classes": 3}), ("fixed", {"per_node": 20})],
)
def test_partition_is_deterministic_and_disjoint(scheme, kw):
    y = _labels()
    a = partition(y, 7, scheme, seed=11, **kw)
    b = partition(y, 7, scheme, seed=11, **kw)
    c = partition(y, 7, scheme, seed=12, **kw)
    assert len(a) == 7
    assert all(p.tobytes() == q.tobytes() for p, q in zip(a, b, strict=True))
    assert any(p.tobytes() != q.tobytes() for p, q in zip(a, c, strict=True))
    _check_parts(a, y.size)
    assert all(p.size > 0 for p in a)


def test_iid_covers_every_point_once_with_near_equal_sizes():
    y = _labels(m=103)
    parts = partition(y, 10, "iid", seed=0)
    allidx = _check_parts(parts, 103)
    np.testing.assert_array_equal(np.sort(allidx), np.arange(103))
    assert sorted(p.size for p in parts) == [10] * 7 + [11] * 3
    assert [p.size for p in partition(y, 103, "iid", seed=0)] == [1] * 103


def test_dirichlet_small_beta_skews_labels():
    y = _labels(m=2000, k=4)

    def mean_top_class_fraction(beta):
        parts = partition(y, 10, "dirichlet", seed=3, beta=beta, n_classes=4)
        allidx = _check_parts(parts, y.size)
        np.testing.assert_array_equal(np.sort(allidx), np.arange(y.size))
        return np.mean([np.bincount(y[p], minlength=4).max() / p.size for p in parts])

    skewed, mild = mean_top_class_fraction(0.05), mean_top_class_fraction(1000.0)
    assert skewed > 0.8
    assert mild < 0.4
    # tiny beta with as many nodes as points: every node still gets exactly one point
    parts = partition(y[:60], 60, "dirichlet", seed=0, beta=0.01, n_classes=4)
    assert [p.size for p in parts] == [1] * 60
    parts = partition(y[:200], 50, "dirichlet", seed=1, beta=0.01, n_classes=4)
    assert min(p.size for p in parts) >= 1 and sum(p.size for p in parts) == 200


def test_fixed_gives_exact_sizes():
    y = _labels(m=100)
    parts = partition(y, 4, "fixed", seed=0, per_node=25)
    assert [p.size for p in parts] == [25] * 4
    np.testing.assert_array_equal(np.sort(_check_parts(parts, 100)), np.arange(100))
    assert [p.size for p in partition(y, 3, "fixed", seed=0, per_node=5)] == [5, 5, 5]


@pytest.mark.parametrize(
    "args, kw, fragment",
    [
        ((0,), {}, "n_nodes"),
        ((11,), {}, "only 10"),
        ((2, "rings"), {}, "unknown partition scheme"),
        ((2, "dirichlet"), {"beta": 0.0, "n_classes": 3}, "beta > 0"),
        ((2, "dirichlet"), {"beta": -1.0, "n_classes": 3}, "beta > 0"),
        ((2, "dirichlet"), {}, "n_classes"),
        ((2, "dirichlet"), {"n_classes": 2}, "labels must be integers in 0..1"),
        ((2, "fixed"), {}, "per_node"),
        ((3, "fixed"), {"per_node": 4}, "exceeds the 10"),
    ],
)
def test_partition_rejects_bad_arguments(args, kw, fragment):
    y = np.array([0, 1, 2] * 3 + [0])
    with pytest.raises(ValueError, match=fragment):
        partition(y, *args, seed=0, **kw)


# ---------------------------------------------------------------------------------------------
# datasets


@pytest.mark.parametrize(
    "kind, n_classes, m, d",
    [("breast_cancer", 2, 569, 30), ("digits", 10, 1797, 64), ("wine", 3, 178, 13)],
)
def test_sklearn_datasets_shapes_classes_and_stratification(kind, n_classes, m, d):
    ds = load_dataset(kind, seed=0)
    assert ds.n_classes == n_classes and ds.n_features == d + 1
    assert ds.X_train.shape[0] + ds.X_test.shape[0] == m
    assert abs(ds.X_test.shape[0] - 0.2 * m) <= n_classes
    for X in (ds.X_train, ds.X_test):
        assert X.dtype == np.float64 and X.flags.c_contiguous
    for y in (ds.y_train, ds.y_test):
        assert y.dtype == np.int64 and set(np.unique(y)) == set(range(n_classes))
    # stratified: class frequencies of train and test agree closely
    ftr = np.bincount(ds.y_train) / ds.y_train.size
    fte = np.bincount(ds.y_test) / ds.y_test.size
    assert np.max(np.abs(ftr - fte)) < 0.03
    np.testing.assert_allclose(np.linalg.norm(ds.X_train, axis=1), np.sqrt(2))
    np.testing.assert_allclose(np.linalg.norm(ds.X_test, axis=1), np.sqrt(2))
    assert np.all(ds.X_train[:, -1] == 1.0) and np.all(ds.X_test[:, -1] == 1.0)


def test_loading_is_deterministic_and_seed_dependent():
    a = load_dataset("wine", seed=4)
    b = load_dataset("wine", seed=4)
    c = load_dataset("wine", seed=5)
    assert a.X_train.tobytes() == b.X_train.tobytes() and a.y_test.tobytes() == b.y_test.tobytes()
    assert a.X_train.tobytes() != c.X_train.tobytes()


def test_standardisation_is_fit_on_train_only_and_row_norms():
    ds = load_dataset("digits", seed=1, normalize=False, intercept=False)
    mu, sd = ds.X_train.mean(axis=0), ds.X_train.std(axis=0)
    const = sd == 0  # digits has pixels that are always 0
    assert const.any()
    np.testing.assert_allclose(mu, 0.0, atol=1e-12)
    np.testing.assert_allclose(sd[~const], 1.0, rtol=1e-12)
    assert not ds.X_train[:, const].any() and not ds.X_test[:, const].any()
    # the test set was shifted/scaled with the train statistics, so its own are not 0 / 1
    assert np.abs(ds.X_test.mean(axis=0)[~const]).max() > 0.05
    norm1 = load_dataset("digits", seed=1, intercept=False)
    np.testing.assert_allclose(np.linalg.norm(norm1.X_train, axis=1), 1.0)
    assert norm1.n_features == 64


def test_synthetic_datasets():
    lg = load_dataset("synthetic-logistic", seed=2, samples=500, features=6, label_noise=0.0)
    assert lg.n_classes == 2 and lg.n_features == 7
    assert lg.X_train.shape == (400, 7) and lg.X_test.shape == (100, 7)
    ls = load_dataset("synthetic-lstsq", seed=2, samples=300, features=4, label_noise=0.01)
    assert ls.n_classes == 0 and ls.y_train.dtype == np.float64 and ls.n_features == 5
    assert ls.X_train.shape[0] + ls.X_test.shape[0] == 300
    with pytest.raises(ValueError, match="classification dataset"):
        load_dataset("wine", seed=0, task="regression")
    with pytest.raises(ValueError, match="unknown dataset kind"):
        load_dataset("mnist", seed=0)


def _write(tmp_path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_csv_with_header_label_mapping_and_regression(tmp_path):
    rows = [f"{i},{i % 3 * 2.5},{[5, -1, 3][i % 3]}" for i in range(30)]
    path = _write(tmp_path, "d.csv", "a,b,label\n" + "\n".join(rows) + "\n\n")
    ds = load_dataset("csv", seed=0, path=path, normalize=False, standardize=False, intercept=False)
    assert ds.n_classes == 3 and ds.n_features == 2 and ds.name == "csv:d.csv"
    # labels -1 < 3 < 5 map to 0, 1, 2; column 1 is 0, 2.5, 5 for labels 5, -1, 3
    for X, y in ((ds.X_train, ds.y_train), (ds.X_test, ds.y_test)):
        np.testing.assert_array_equal(X[:, 1], np.array([2.5, 5.0, 0.0])[y])
    reg = load_dataset(
        "csv", seed=0, path=path, task="regression", label_column=0, standardize=False,
        normalize=False, intercept=False,
    )  # fmt: skip
    assert reg.n_classes == 0 and reg.y_train.dtype == np.float64
    assert sorted(np.concatenate([reg.y_train, reg.y_test]).tolist()) == list(range(30))
    # without a header every line is data
    nohdr = _write(tmp_path, "n.csv", "\n".join(rows))
    assert load_dataset("csv", seed=0, path=nohdr).X_train.shape[0] == 24


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("a,b,y\n1,2,0\n3,x,1\n", ":3: column 2: 'x' is not a finite number"),
        ("1,2,0\n3,4,1\n5,6\n", ":3: ragged row: expected 3 cells, found 2"),
        ("1,2,0\n3,nan,1\n", ":2: column 2: 'nan'"),
        ("", "no data rows"),
        ("a,b,y\n", "no data rows"),
        ("1,2,0\n3,4,0\n5,6,0\n", "at least 2 classes"),
        ("1,2,0\n3,4,1\n", "label_column 5 is out of range"),
    ],
)
def test_csv_errors_name_file_and_line(tmp_path, text, fragment):
    path = _write(tmp_path, "bad.csv", text)
    lc = 5 if "out of range" in fragment else -1
    with pytest.raises(DataError) as ei:
        load_dataset("csv", seed=0, path=path, label_column=lc)
    assert str(ei.value).startswith(path)
    assert fragment in str(ei.value)


def test_missing_files(tmp_path):
    for kind in ("csv", "libsvm"):
        with pytest.raises(DataError, match="no such file"):
            load_dataset(kind, seed=0, path=str(tmp_path / "nope"))
        with pytest.raises(DataError, match="needs a path"):
            load_dataset(kind, seed=0)


def test_libsvm_parsing(tmp_path):
    lines = ["# a comment", ""]
    for i in range(20):
        label = "+1" if i % 2 else "-1"
        lines.append(
            f"{label} 1:{i} 4:{-i} 9:0.5  # trailing comment" if i % 4 else f"{label} 2:{i}"
        )
    path = _write(tmp_path, "a9a.txt", "\n".join(lines) + "\n")
    ds = load_dataset(
        "libsvm", seed=0, path=path, standardize=False, normalize=False, intercept=False
    )
    assert ds.n_features == 9 and ds.n_classes == 2
    X = np.vstack([ds.X_train, ds.X_test])
    y = np.concatenate([ds.y_train, ds.y_test])
    assert X.shape == (20, 9) and set(y.tolist()) == {0, 1}
    assert not X[:, [2, 4, 5, 6, 7]].any()  # columns never mentioned are zero
    dense = X[X[:, 8] == 0.5]
    np.testing.assert_array_equal(dense[:, 3], -dense[:, 0])
    # odd i were +1 -> class 1
    np.testing.assert_array_equal(y[X[:, 8] == 0.5] % 2, (X[X[:, 8] == 0.5, 0] % 2))


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("1 1:2\n0 1:3 2:x\n", ":2: value 'x' in '2:x' is not a finite number"),
        ("1 1:2\n0 0:3\n", ":2: feature index 0 in '0:3' must be >= 1"),
        ("1 1:2\n0 a:3\n", ":2: feature index 'a'"),
        ("1 1:2\n\n0 1:3 5\n", ":3: '5' is not an 'index:value' pair"),
        ("1 1:2 1:3\n0 1:1\n", ":1: feature index 1 is repeated"),
        ("1 1:2\nfoo 1:2\n", ":2: the label 'foo'"),
        ("1 qid:3 1:2\n0 1:1\n", "qid is not supported"),
        ("# only a comment\n", "no data lines"),
        ("1 1:2\n1 2:3\n", "at least 2 classes"),
    ],
)
def test_libsvm_errors_name_file_and_line(tmp_path, text, fragment):
    path = _write(tmp_path, "bad.svm", text)
    with pytest.raises(DataError) as ei:
        load_dataset("libsvm", seed=0, path=path)
    assert str(ei.value).startswith(path)
    assert fragment in str(ei.value)


# ---------------------------------------------------------------------------------------------
# shards


def test_shard_round_trip(tmp_path):
    ds = load_dataset("wine", seed=0)
    idx = partition(ds.y_train, 3, "iid", seed=0)[1]
    path = tmp_path / "node-1.npz"
    save_shard(path, ds.X_train[idx], ds.y_train[idx])
    X, y = load_shard(path)
    assert X.tobytes() == ds.X_train[idx].tobytes() and X.dtype == np.float64
    assert y.tobytes() == ds.y_train[idx].tobytes() and y.dtype == np.int64
    save_shard(tmp_path / "r.npz", np.ones((3, 2)), np.array([0.5, 1.5, 2.5]))
    assert load_shard(str(tmp_path / "r.npz"))[1].dtype == np.float64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node-1.npz", "r.npz"]


def test_corrupted_or_foreign_shards_are_refused(tmp_path):
    path = tmp_path / "s.npz"
    save_shard(path, np.ones((4, 3)), np.arange(4))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="corrupted") as ei:
        load_shard(path)
    assert str(path) in str(ei.value)
    path.write_bytes(b"not a zip file at all")
    with pytest.raises(DataError, match=f"{path}: corrupted"):
        load_shard(path)
    other = tmp_path / "o.npz"
    np.savez(other, X=np.ones((2, 2)), labels=np.zeros(2))
    with pytest.raises(DataError, match="not a shard file"):
        load_shard(other)
    with open(tmp_path / "a.npz", "wb") as fh:
        np.save(fh, np.ones(3))
    with pytest.raises(DataError, match="bare .npy"):
        load_shard(tmp_path / "a.npz")
    with pytest.raises(DataError, match="no such shard file"):
        load_shard(tmp_path / "missing.npz")
    with pytest.raises(DataError, match="rows"):
        save_shard(tmp_path / "x.npz", np.ones((3, 2)), np.arange(4))


# ---------------------------------------------------------------------------------------------
# end to end


def test_plain_gradient_descent_learns_breast_cancer():
    ds = load_dataset("breast_cancer", seed=0)
    model = make_model("logistic", ds.n_features, ds.n_classes, l2=1e-4)
    theta = model.init()
    for _ in range(200):
        g = model.per_example_grads(theta, ds.X_train, ds.y_train).mean(axis=0)
        theta = theta - 1.0 * (g + model.regulariser_grad(theta))
    assert model.accuracy(theta, ds.X_test, ds.y_test) > 0.9
    assert model.loss(theta, ds.X_train, ds.y_train) < model.loss(
        model.init(), ds.X_train, ds.y_train
    )
