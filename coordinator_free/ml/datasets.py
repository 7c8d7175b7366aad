"""Datasets for decentralized private learning: synthetic, scikit-learn's bundled sets, files.

:func:`load_dataset` returns a :class:`Dataset` (a deterministic train/test split, preprocessed
the way the decentralized-DP papers do it). The pipeline, in order:

1. **Raw data.** ``synthetic-logistic`` plants ``theta* ~ N(0, I_d)``, draws ``x ~ N(0, I_d)`` and
   sets ``y = 1[x . theta* > 0]``, each label flipped independently with probability
   ``label_noise``. ``synthetic-lstsq`` plants ``theta*`` the same way and sets
   ``y = x . theta* + e`` with ``e ~ N(0, label_noise^2)``. ``breast_cancer`` (2 classes),
   ``digits`` (10) and ``wine`` (3) come from ``sklearn.datasets.load_*``, which read files
   shipped inside scikit-learn: nothing is ever downloaded. ``csv`` and ``libsvm`` read a file
   (formats below). ``quadratic`` is the heterogeneous least-squares task of the DECOR paper
   (§5.2): node ``i`` (0-based) holds ``f_i(x) = ||A_i x - b_i||^2 / 2`` with
   ``A_i = (i + 1)/sqrt(n) I_d`` and ``b_i ~ N(0, zeta/(i + 1)^2 I_d)`` (``d = features``,
   ``zeta = label_noise``), written as ``d`` rows per node, row ``k`` being
   ``(sqrt(d) (i + 1)/sqrt(n) e_k, sqrt(d) b_ik)`` so that the mean squared-error loss over a
   node's rows is exactly ``f_i``. It needs the number of nodes, is used as generated (no
   split: the test set is the training set, since the task's metric is the objective itself;
   no standardising, normalising or intercept) and goes with ``partition = "ordered"``.
   ``synthetic-sparse`` is the sparse regression of the private-ADMM paper (CBB23, Figure 1;
   there ``samples = 1000``, ``features = 64``, ``label_noise = 0.1``): ``x ~ N(0, I_d)``, each
   column then standardised to mean 0 and (population) std 1 over all ``samples`` rows (before
   the split, as that experiment does), ``theta*`` with ``min(8, d)`` non-zero coordinates at
   uniformly chosen positions, their values ``U(0, 1)``, and ``y = x . theta* + e``,
   ``e ~ N(0, label_noise^2)``. It is used as generated apart from the train/test split (no
   further standardising, normalising or intercept: they would change the planted linear
   model), so ``standardize``/``normalize``/``intercept`` are ignored for it.
2. **Split.** A deterministic train/test split with ``test_fraction`` of the points in the test
   set; for classification it is stratified: each class ``c`` with ``n_c`` points sends
   ``floor(test_fraction * n_c + 1/2)`` of them (at most ``n_c - 1``) to the test set. Both index
   sets are kept in their original order (sorted).
3. **Standardise** (``standardize=True``): ``x_j <- (x_j - mu_j) / sd_j`` with ``mu``, ``sd`` the
   per-column mean and (population) standard deviation of the TRAINING rows only, applied to
   both sets. A column that is constant on the training set carries no information; it is set
   to 0 in both sets.
4. **Normalise** (``normalize=True``): every row is divided by its L2 norm, so ``||x|| = 1`` (an
   all-zero row stays zero). Then the logistic loss ``log(1 + exp(-s x . theta))`` is
   1-Lipschitz in ``theta`` for every example, which is what the sensitivity analysis uses.
5. **Intercept** (``intercept=True``): a constant column of ``1.0`` is appended AFTER
   normalising, so a normalised row has norm ``sqrt(2)`` (``sqrt(||x||^2 + 1)``). The per-example
   logistic gradient is then bounded by ``sqrt(2)``; callers that need a bound of 1 clip (see
   :func:`coordinator_free.ml.models.clip_rows`) or pass ``intercept=False``.

Randomness: every draw comes from ``Generator(PCG64(SeedSequence(seed, spawn_key=(k,))))`` with
one fixed ``k`` per purpose (synthetic data, split), so e.g. the split of a file does not depend
on whether synthetic data was drawn first, and the same ``seed`` always gives the same bytes.

File formats (errors are :class:`DataError` naming the file, and the line where there is one):

* ``csv``: comma-separated numbers, one example per line, the label in column ``label_column``
  (Python indexing, so -1 is the last column). The first non-blank line is taken as a header
  and skipped when any of its cells is not a number. Blank lines are skipped. Every value must
  be a finite number and every row must have the same number of cells.
* ``libsvm``: ``label idx:val idx:val ...`` per line (LIBSVM / SVMlight, e.g. a9a), indices
  1-based, in any order but not repeated within a line; missing entries are 0. ``#`` starts a
  comment. The number of features is the largest index seen.

For classification (``task="classification"``) file labels are mapped to ``0..k-1`` in the
sorted order of their distinct values (so -1/+1 and 0/1 both become 0/1); at least 2 classes are
required. For ``task="regression"`` the labels are float64 targets and ``n_classes == 0``.

Shard files (:func:`save_shard`, :func:`load_shard`) hold one node's ``(X, y)`` as an ``.npz``
without pickles, so a peer on another host can be given only its own data.
"""

from __future__ import annotations

import csv
import math
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from coordinator_free import rundir
from coordinator_free.errors import CfreeError

DATASET_KINDS = (
    "synthetic-logistic",
    "synthetic-lstsq",
    "synthetic-sparse",
    "quadratic",
    "breast_cancer",
    "digits",
    "wine",
    "csv",
    "libsvm",
)

TASKS = ("classification", "regression")

_FILE_KINDS = ("csv", "libsvm")
_SKLEARN_KINDS = ("breast_cancer", "digits", "wine")
_REGRESSION_KINDS = ("synthetic-lstsq", "synthetic-sparse", "quadratic")
#: non-zero coefficients of synthetic-sparse (CBB23's experiment)
SPARSE_SUPPORT = 8

# spawn keys of the per-purpose random streams (see the module docstring)
STREAM_SYNTHETIC = 1
STREAM_SPLIT = 2

SHARD_FORMAT = "coordinator-free-shard/1"


class DataError(CfreeError, ValueError):
    """A dataset or shard cannot be loaded; the message names the file/line and the problem."""


@dataclass(frozen=True)
class Dataset:
    """A preprocessed train/test split.

    ``X_*`` are C-contiguous float64 ``(m, d)`` arrays (``d`` includes the intercept column when
    there is one). ``y_*`` are int64 labels in ``0..n_classes-1`` for classification and float64
    targets for regression (``n_classes == 0``).
    """

    name: str
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    n_classes: int

    @property
    def n_features(self) -> int:
        """Number of columns of ``X`` (the intercept column included)."""
        return int(self.X_train.shape[1])

    @property
    def is_classification(self) -> bool:
        return self.n_classes > 0


def rng_for(seed: int, stream: int) -> np.random.Generator:
    """The generator of one purpose: ``Generator(PCG64(SeedSequence(seed, spawn_key=(stream,))))``."""
    return np.random.Generator(
        np.random.PCG64(np.random.SeedSequence(entropy=seed, spawn_key=(stream,)))
    )


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


# ---------------------------------------------------------------------------------------------
# public entry point


def load_dataset(
    kind: str,
    *,
    seed: int,
    path: str | None = None,
    samples: int = 1000,
    features: int = 10,
    label_noise: float = 0.1,
    test_fraction: float = 0.2,
    standardize: bool = True,
    normalize: bool = True,
    intercept: bool = True,
    label_column: int = -1,
    task: str = "classification",
    nodes: int | None = None,
) -> Dataset:
    """Load, split and preprocess a dataset (see the module docstring for every step).

    ``samples``, ``features`` and ``label_noise`` only apply to the synthetic kinds; ``path``,
    ``label_column`` and ``task`` only to ``csv`` / ``libsvm`` (for the other kinds the task is
    fixed by the kind, and ``task="regression"`` with a classification kind is an error).
    """
    seed = _check_seed(seed)
    if kind not in DATASET_KINDS:
        raise ValueError(
            f"unknown dataset kind {kind!r}; expected one of {', '.join(DATASET_KINDS)}"
        )
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {', '.join(TASKS)}")
    if not (isinstance(test_fraction, (int, float)) and math.isfinite(test_fraction)) or not (
        0.0 < test_fraction < 1.0
    ):
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")

    name = kind
    if kind == "quadratic":
        return _quadratic(seed, nodes, features, label_noise)
    if kind in _FILE_KINDS:
        if path is None:
            raise DataError(f"dataset kind {kind!r} needs a path to the data file")
        if kind == "csv":
            X, raw_y = _read_csv(Path(path), label_column)
        else:
            X, raw_y = _read_libsvm(Path(path))
        name = f"{kind}:{Path(path).name}"
        if task == "classification":
            y, n_classes = _encode_labels(raw_y, str(path))
        else:
            y, n_classes = raw_y.astype(np.float64), 0
    else:
        classification_kind = kind not in _REGRESSION_KINDS
        if task == "regression" and classification_kind:
            raise ValueError(
                f"dataset {kind!r} is a classification dataset; task='regression' only applies "
                "to csv/libsvm files (use synthetic-lstsq for a regression benchmark)"
            )
        if kind in _SKLEARN_KINDS:
            X, y = _load_sklearn(kind)
            n_classes = int(y.max()) + 1
        else:
            X, y, n_classes = _synthetic(kind, seed, samples, features, label_noise)

    if X.shape[0] < 2:
        raise DataError(f"{name}: needs at least 2 examples, found {X.shape[0]}")
    train, test = _split(y, n_classes, test_fraction, seed, name)
    X_train, X_test = X[train], X[test]
    if kind == "synthetic-sparse":
        standardize = normalize = intercept = False  # used as generated (module docstring)
    if standardize:
        X_train, X_test = _standardize(X_train, X_test)
    if normalize:
        X_train, X_test = _normalize_rows(X_train), _normalize_rows(X_test)
    if intercept:
        X_train, X_test = _add_intercept(X_train), _add_intercept(X_test)
    y_dtype = np.int64 if n_classes > 0 else np.float64
    return Dataset(
        name=name,
        X_train=np.ascontiguousarray(X_train, dtype=np.float64),
        y_train=np.ascontiguousarray(y[train], dtype=y_dtype),
        X_test=np.ascontiguousarray(X_test, dtype=np.float64),
        y_test=np.ascontiguousarray(y[test], dtype=y_dtype),
        n_classes=n_classes,
    )


# ---------------------------------------------------------------------------------------------
# sources


def load_sharded(d, seed: int, nodes: int) -> tuple[Dataset, list[np.ndarray]]:
    """The dataset a config's data section ``d`` describes, and its training rows split over
    ``nodes`` shards by ``d.partition`` (the learning and ADMM families' data)."""
    from coordinator_free.ml.partition import partition

    ds = load_dataset(
        d.kind,
        seed=seed,
        path=d.path,
        samples=d.samples,
        features=d.features,
        label_noise=d.label_noise,
        test_fraction=d.test_fraction,
        standardize=d.standardize,
        normalize=d.normalize,
        intercept=d.intercept,
        label_column=d.label_column,
        task=d.task,
        nodes=nodes,
    )
    shards = partition(
        ds.y_train,
        nodes,
        d.partition,
        seed=seed,
        beta=d.beta,
        per_node=d.per_node,
        n_classes=ds.n_classes,
    )
    return ds, shards


def _synthetic(
    kind: str, seed: int, samples: int, features: int, label_noise: float
) -> tuple[np.ndarray, np.ndarray, int]:
    if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or samples < 2:
        raise ValueError(f"samples must be an integer >= 2, got {samples!r}")
    if isinstance(features, bool) or not isinstance(features, (int, np.integer)) or features < 1:
        raise ValueError(f"features must be an integer >= 1, got {features!r}")
    if not isinstance(label_noise, (int, float)) or not math.isfinite(label_noise):
        raise ValueError(f"label_noise must be a finite number, got {label_noise!r}")
    rng = rng_for(seed, STREAM_SYNTHETIC)
    if kind == "synthetic-sparse":
        if label_noise < 0:
            raise ValueError(f"label_noise is a noise std for synthetic-sparse, got {label_noise}")
        X = rng.standard_normal((samples, features))
        sd = X.std(axis=0)
        X = (X - X.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
        theta = np.zeros(features)
        support = rng.choice(features, size=min(SPARSE_SUPPORT, features), replace=False)
        theta[support] = rng.random(support.size)
        y = X @ theta + label_noise * rng.standard_normal(samples)
        return X, y, 0
    theta = rng.standard_normal(features)
    X = rng.standard_normal((samples, features))
    score = X @ theta
    if kind == "synthetic-logistic":
        if not 0.0 <= label_noise <= 1.0:
            raise ValueError(
                f"label_noise is a flip probability for synthetic-logistic, got {label_noise}"
            )
        y = (score > 0).astype(np.int64)
        flip = rng.random(samples) < label_noise
        y = np.where(flip, 1 - y, y)
        if np.unique(y).size < 2:
            raise DataError(f"synthetic-logistic: all {samples} labels are equal; use more samples")
        return X, y, 2
    if label_noise < 0:
        raise ValueError(f"label_noise is a noise std for synthetic-lstsq, got {label_noise}")
    y = score + label_noise * rng.standard_normal(samples)
    return X, y, 0


def _quadratic(seed: int, nodes: int | None, features: int, zeta: float) -> Dataset:
    if not isinstance(nodes, (int, np.integer)) or isinstance(nodes, bool) or nodes < 1:
        raise ValueError(f"quadratic needs the number of nodes (an integer >= 1), got {nodes!r}")
    if isinstance(features, bool) or not isinstance(features, (int, np.integer)) or features < 1:
        raise ValueError(f"features must be an integer >= 1, got {features!r}")
    if not isinstance(zeta, (int, float)) or not math.isfinite(zeta) or zeta < 0:
        raise ValueError(f"label_noise is the variance zeta >= 0 for quadratic, got {zeta!r}")
    rng = rng_for(seed, STREAM_SYNTHETIC)
    d, n = int(features), int(nodes)
    root_d = math.sqrt(d)
    X = np.zeros((n * d, d))
    y = np.zeros(n * d)
    for i in range(n):
        b = rng.standard_normal(d) * (math.sqrt(zeta) / (i + 1))
        X[i * d : (i + 1) * d] = np.eye(d) * (root_d * (i + 1) / math.sqrt(n))
        y[i * d : (i + 1) * d] = root_d * b
    return Dataset(
        name=f"quadratic(n={n},d={d})",
        X_train=np.ascontiguousarray(X),
        y_train=y,
        X_test=X.copy(),
        y_test=y.copy(),
        n_classes=0,
    )


def _load_sklearn(kind: str) -> tuple[np.ndarray, np.ndarray]:
    # load_* read files bundled with scikit-learn; fetch_* (which downloads) is never used
    from sklearn import datasets as skd

    loader = {
        "breast_cancer": skd.load_breast_cancer,
        "digits": skd.load_digits,
        "wine": skd.load_wine,
    }[kind]
    X, y = loader(return_X_y=True)
    return np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.int64)


def _open_text(path: Path):
    try:
        return open(path, encoding="utf-8-sig", newline="")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, not a data file") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot open: {exc.strerror or exc}") from None


def _number(cell: str) -> float | None:
    """``float(cell)`` if it is a finite number, else None."""
    try:
        v = float(cell)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _read_csv(path: Path, label_column: int) -> tuple[np.ndarray, np.ndarray]:
    rows: list[list[float]] = []
    width = -1
    label_at = -1
    header_checked = False
    with _open_text(path) as fh:
        reader = csv.reader(fh)
        try:
            for cells in reader:
                line = reader.line_num
                if not cells or (len(cells) == 1 and not cells[0].strip()):
                    continue
                if not header_checked:
                    header_checked = True
                    if any(_number(c) is None for c in cells):
                        width = len(cells)  # a header: it fixes the width, holds no data
                        label_at = _label_index(label_column, width, path, line)
                        continue
                if width < 0:
                    width = len(cells)
                    label_at = _label_index(label_column, width, path, line)
                if len(cells) != width:
                    raise DataError(
                        f"{path}:{line}: ragged row: expected {width} cells, found {len(cells)}"
                    )
                values = [_number(c) for c in cells]
                for j, v in enumerate(values):
                    if v is None:
                        raise DataError(
                            f"{path}:{line}: column {j + 1}: {cells[j].strip()!r} is not a "
                            "finite number"
                        )
                rows.append(values)  # type: ignore[arg-type]  # no None left
        except csv.Error as exc:
            raise DataError(f"{path}:{reader.line_num}: malformed CSV: {exc}") from None
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}: not UTF-8 text ({exc.reason})") from None
    if not rows:
        raise DataError(f"{path}: no data rows (the file is empty or holds only a header)")
    if width < 2:
        raise DataError(f"{path}: needs a label column and at least one feature column")
    data = np.asarray(rows, dtype=np.float64)
    y = data[:, label_at].copy()
    X = np.ascontiguousarray(np.delete(data, label_at, axis=1))
    return X, y


def _label_index(label_column: int, width: int, path: Path, line: int) -> int:
    if isinstance(label_column, bool) or not isinstance(label_column, (int, np.integer)):
        raise ValueError(f"label_column must be an integer, got {label_column!r}")
    if not -width <= label_column < width:
        raise DataError(
            f"{path}:{line}: label_column {label_column} is out of range for {width} columns"
        )
    return int(label_column) % width


def _read_libsvm(path: Path) -> tuple[np.ndarray, np.ndarray]:
    labels: list[float] = []
    row_of: list[int] = []
    col_of: list[int] = []
    vals: list[float] = []
    n_features = 0
    with _open_text(path) as fh:
        try:
            for line_no, raw in enumerate(fh, start=1):
                text = raw.split("#", 1)[0].strip()
                if not text:
                    continue
                tokens = text.split()
                label = _number(tokens[0])
                if label is None or ":" in tokens[0]:
                    raise DataError(
                        f"{path}:{line_no}: the label {tokens[0]!r} is not a finite number "
                        "(expected 'label idx:val idx:val ...')"
                    )
                row = len(labels)
                seen: set[int] = set()
                for tok in tokens[1:]:
                    idx_text, sep, val_text = tok.partition(":")
                    if not sep:
                        raise DataError(f"{path}:{line_no}: {tok!r} is not an 'index:value' pair")
                    try:
                        idx = int(idx_text)
                    except ValueError:
                        what = "qid is not supported" if idx_text == "qid" else "not an integer"
                        raise DataError(
                            f"{path}:{line_no}: feature index {idx_text!r} in {tok!r}: {what}"
                        ) from None
                    if idx < 1:
                        raise DataError(
                            f"{path}:{line_no}: feature index {idx} in {tok!r} must be >= 1 "
                            "(indices are 1-based)"
                        )
                    if idx in seen:
                        raise DataError(f"{path}:{line_no}: feature index {idx} is repeated")
                    seen.add(idx)
                    val = _number(val_text)
                    if val is None:
                        raise DataError(
                            f"{path}:{line_no}: value {val_text!r} in {tok!r} is not a finite "
                            "number"
                        )
                    row_of.append(row)
                    col_of.append(idx - 1)
                    vals.append(val)
                    n_features = max(n_features, idx)
                labels.append(label)
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}: not UTF-8 text ({exc.reason})") from None
    if not labels:
        raise DataError(f"{path}: no data lines (the file is empty)")
    if n_features == 0:
        raise DataError(f"{path}: no feature appears on any line")
    X = np.zeros((len(labels), n_features), dtype=np.float64)
    X[np.asarray(row_of, dtype=np.int64), np.asarray(col_of, dtype=np.int64)] = vals
    return X, np.asarray(labels, dtype=np.float64)


def _encode_labels(raw: np.ndarray, source: str) -> tuple[np.ndarray, int]:
    """Map the distinct label values, in sorted order, to ``0..k-1``."""
    values, codes = np.unique(raw, return_inverse=True)
    if values.size < 2:
        raise DataError(
            f"{source}: classification needs at least 2 classes, all labels are {values[0]:g}"
        )
    return codes.astype(np.int64).reshape(-1), int(values.size)


# ---------------------------------------------------------------------------------------------
# preprocessing


def _split(
    y: np.ndarray, n_classes: int, test_fraction: float, seed: int, name: str
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted train and test index arrays (stratified by class for classification)."""
    rng = rng_for(seed, STREAM_SPLIT)
    m = y.shape[0]
    groups = [np.flatnonzero(y == c) for c in range(n_classes)] if n_classes > 0 else [np.arange(m)]
    test_parts = []
    for idx in groups:
        n = idx.size
        if n == 0:
            continue
        n_test = min(int(math.floor(test_fraction * n + 0.5)), n - 1)
        if n_classes == 0:
            n_test = max(n_test, 1)
        test_parts.append(rng.permutation(idx)[:n_test])
    test = np.sort(np.concatenate(test_parts)).astype(np.int64)
    if test.size == 0:
        raise DataError(
            f"{name}: too few examples ({m}) for a test split with test_fraction={test_fraction}"
        )
    mask = np.ones(m, dtype=bool)
    mask[test] = False
    train = np.flatnonzero(mask).astype(np.int64)
    if n_classes > 0 and np.unique(y[train]).size < 2:
        raise DataError(f"{name}: the training split holds a single class")
    return train, test


def _standardize(X_train: np.ndarray, X_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(x - mu) / sd`` with train-only statistics; train-constant columns become 0."""
    mu = X_train.mean(axis=0)
    sd = X_train.std(axis=0)
    const = sd == 0
    scale = np.where(const, 1.0, sd)
    Xtr = (X_train - mu) / scale
    Xte = (X_test - mu) / scale
    Xtr[:, const] = 0.0
    Xte[:, const] = 0.0
    return Xtr, Xte


def _normalize_rows(X: np.ndarray) -> np.ndarray:
    """Divide every row by its L2 norm; zero rows stay zero."""
    norms = np.linalg.norm(X, axis=1)
    return X / np.where(norms > 0, norms, 1.0)[:, None]


def _add_intercept(X: np.ndarray) -> np.ndarray:
    return np.hstack([X, np.ones((X.shape[0], 1), dtype=np.float64)])


# ---------------------------------------------------------------------------------------------
# shard files


def save_shard(path: str | os.PathLike[str], X: np.ndarray, y: np.ndarray) -> None:
    """Write one node's ``(X, y)`` to ``path`` as an ``.npz`` (no pickles), atomically.

    ``X`` is stored as C-contiguous float64 ``(m, d)``; ``y`` as int64 (integer labels) or float64
    (regression targets). The file is written to a temporary name and renamed into place, so a
    reader never sees a half-written shard.
    """
    X = np.ascontiguousarray(X, dtype=np.float64)
    y = np.asarray(y)
    y = np.ascontiguousarray(
        y, dtype=np.int64 if np.issubdtype(y.dtype, np.integer) else np.float64
    )
    _check_shard(X, y, str(path))
    target = Path(path)
    rundir.atomic_write(target, lambda fh: np.savez(fh, X=X, y=y, format=np.array(SHARD_FORMAT)))


def load_shard(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """Read a shard written by :func:`save_shard`: ``(X, y)``; :class:`DataError` if it is bad."""
    p = Path(path)
    try:
        # open the file ourselves: np.load leaks its handle when a truncated zip fails to open
        with open(p, "rb") as fh:
            loaded = np.load(fh, allow_pickle=False)
            if not isinstance(loaded, np.lib.npyio.NpzFile):
                raise DataError(f"{p}: not a shard file: a bare .npy array, expected an .npz")
            with loaded as npz:
                keys = set(npz.files)
                if keys != {"X", "y", "format"}:
                    raise DataError(
                        f"{p}: not a shard file: expected arrays X, y, format, found "
                        f"{', '.join(sorted(keys)) or 'none'}"
                    )
                fmt = npz["format"]
                if fmt.shape != () or fmt.dtype.kind != "U" or str(fmt) != SHARD_FORMAT:
                    raise DataError(f"{p}: unknown shard format {fmt!r}, expected {SHARD_FORMAT}")
                X = npz["X"]
                y = npz["y"]
    except FileNotFoundError:
        raise DataError(f"{p}: no such shard file") from None
    except DataError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as exc:
        raise DataError(f"{p}: corrupted or unreadable shard file ({exc})") from None
    _check_shard(X, y, str(p))
    return np.ascontiguousarray(X), np.ascontiguousarray(y)


def _check_shard(X: np.ndarray, y: np.ndarray, source: str) -> None:
    if X.ndim != 2 or X.dtype != np.float64:
        raise DataError(f"{source}: X must be a 2-D float64 array, got {X.dtype} {X.shape}")
    if y.ndim != 1 or y.dtype not in (np.int64, np.float64):
        raise DataError(
            f"{source}: y must be a 1-D int64 or float64 array, got {y.dtype} {y.shape}"
        )
    if X.shape[0] != y.shape[0]:
        raise DataError(f"{source}: X has {X.shape[0]} rows but y has {y.shape[0]} entries")
    if not np.all(np.isfinite(X)) or (y.dtype == np.float64 and not np.all(np.isfinite(y))):
        raise DataError(f"{source}: non-finite values in the shard")
