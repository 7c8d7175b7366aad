"""Linear models with per-example gradients, and per-example clipping for DP gradient steps.

Every model keeps its parameters in one flat float64 vector ``theta`` of length ``dim`` and
exposes the per-example gradients of its DATA loss, which is what differentially private
gradient descent needs: each example's gradient is clipped to norm ``<= clip`` BEFORE averaging
and before any noise is added, so replacing one example moves the clipped mean of a batch of
``b`` examples by at most ``2 clip / b`` (L2) whatever the data.

With ``x_i in R^d`` (a row of ``X``, ``d = n_features``) and labels ``y_i``:

* ``logistic`` (binary, ``y in {0, 1}``, ``s = 2y - 1 in {-1, +1}``, ``theta in R^d``):
  ``l_i = log(1 + exp(-s_i x_i . theta))``, computed as ``logaddexp(0, -s_i x_i . theta)`` (no
  overflow for any margin), gradient ``-s_i sigmoid(-s_i x_i . theta) x_i`` whose norm is below
  ``||x_i||`` (the loss is ``||x_i||``-Lipschitz).
* ``multinomial`` (``k = n_classes >= 2``, ``theta`` = the row-major flattening of
  ``W in R^{k x d}``): logits ``z = W x_i``, ``l_i = logsumexp(z) - z_{y_i}`` with the max
  subtracted before exponentiating, gradient ``(softmax(z) - e_{y_i}) x_i^T`` (flattened the
  same way); its norm is at most ``sqrt(2) ||x_i||``.
* ``least-squares`` (``n_classes == 0``): ``l_i = (x_i . theta - y_i)^2 / 2``, gradient
  ``(x_i . theta - y_i) x_i`` (unbounded: clipping is what bounds the sensitivity).
* ``ridge``: least squares with ``l2 > 0``.

The objective is ``F(theta) = mean_i l_i(theta) + (l2 / 2) ||theta||^2`` (:meth:`Model.loss`).
The regulariser covers the whole vector (intercept weights included) and depends on no data,
so its gradient ``l2 theta`` (:meth:`Model.regulariser_grad`) is added after clipping and
needs no noise.

Determinism: plain numpy, no randomness and no state; the same inputs give bit-identical
outputs.
"""

from __future__ import annotations

import math

import numpy as np

MODEL_KINDS = ("logistic", "multinomial", "least-squares", "ridge")


class Model:
    """Base class of the linear models (see the module docstring for the math).

    Attributes: ``kind`` (one of :data:`MODEL_KINDS`), ``n_features`` (``d``, the columns of
    ``X``), ``n_classes`` (0 for regression), ``dim`` (length of ``theta``), ``l2`` (the
    regularisation strength).
    """

    kind: str = ""
    n_features: int
    n_classes: int
    dim: int
    l2: float

    def __init__(self, n_features: int, n_classes: int, l2: float, dim: int):
        self.n_features = n_features
        self.n_classes = n_classes
        self.l2 = l2
        self.dim = dim

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(kind={self.kind!r}, n_features={self.n_features}, "
            f"n_classes={self.n_classes}, dim={self.dim}, l2={self.l2})"
        )

    # -- interface ------------------------------------------------------------------------------

    #: Every parameter's starting value (``model.init``; set by :func:`make_model`).
    start: float = 0.0

    def init(self) -> np.ndarray:
        """The starting point: every parameter ``start`` (0 unless ``model.init`` says
        otherwise), float64, length ``dim``."""
        return np.full(self.dim, self.start, dtype=np.float64)

    def per_example_grads(self, theta: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        """``(b, dim)``: row ``i`` is the gradient of ``l_i`` at ``theta`` (no regulariser)."""
        theta, X, y = self._check(theta, X, y)
        return self._grads(theta, X, y)

    def example_losses(self, theta: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        """``(b,)``: the data loss ``l_i(theta)`` of every example."""
        theta, X, y = self._check(theta, X, y)
        if X.shape[0] == 0:
            return np.zeros(0, dtype=np.float64)
        return self._losses(theta, X, y)

    def loss(self, theta: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
        """``mean_i l_i(theta) + (l2 / 2) ||theta||^2`` (needs a non-empty batch)."""
        theta, X, y = self._check(theta, X, y, nonempty=True)
        return float(np.mean(self._losses(theta, X, y)) + 0.5 * self.l2 * np.dot(theta, theta))

    def regulariser_grad(self, theta: np.ndarray) -> np.ndarray:
        """``l2 * theta``: the gradient of ``(l2 / 2) ||theta||^2`` (data-independent)."""
        return self.l2 * self._check_theta(theta)

    def predict(self, theta: np.ndarray, X: np.ndarray) -> np.ndarray:
        """Predicted int64 class labels (classification) or float64 values (regression)."""
        theta = self._check_theta(theta)
        X = self._check_X(X)
        return self._predict(theta, X)

    def accuracy(self, theta: np.ndarray, X: np.ndarray, y: np.ndarray) -> float | None:
        """Fraction of correctly predicted labels; None for regression models."""
        if self.n_classes == 0:
            return None
        theta, X, y = self._check(theta, X, y, nonempty=True)
        return float(np.mean(self._predict(theta, X) == y))

    # -- per-model math -------------------------------------------------------------------------

    def _grads(self, theta: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _losses(self, theta: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _predict(self, theta: np.ndarray, X: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    # -- input checks ---------------------------------------------------------------------------

    def _check_theta(self, theta: np.ndarray) -> np.ndarray:
        theta = np.asarray(theta, dtype=np.float64)
        if theta.shape != (self.dim,):
            raise ValueError(f"{self.kind}: theta must have shape ({self.dim},), got {theta.shape}")
        return theta

    def _check_X(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(
                f"{self.kind}: X must have shape (b, {self.n_features}), got {X.shape}"
            )
        return X

    def _check(
        self, theta: np.ndarray, X: np.ndarray, y: np.ndarray, nonempty: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        theta = self._check_theta(theta)
        X = self._check_X(X)
        y = np.asarray(y)
        if y.shape != (X.shape[0],):
            raise ValueError(f"{self.kind}: y must have shape ({X.shape[0]},), got {y.shape}")
        if nonempty and X.shape[0] == 0:
            raise ValueError(f"{self.kind}: empty batch")
        if self.n_classes == 0:
            return theta, X, y.astype(np.float64, copy=False)
        return theta, X, self._check_labels(y)

    def _check_labels(self, y: np.ndarray) -> np.ndarray:
        k = self.n_classes
        if y.dtype.kind == "f":
            if not np.all(y == np.round(y)):  # NaN fails this too
                raise ValueError(f"{self.kind}: class labels must be integers in 0..{k - 1}")
        elif y.dtype.kind not in "iub":
            raise ValueError(f"{self.kind}: class labels must be integers, got dtype {y.dtype}")
        if y.size and (y.min() < 0 or y.max() >= k):
            raise ValueError(
                f"{self.kind}: class labels must be in 0..{k - 1}, found {y.min():g}..{y.max():g}"
            )
        return y.astype(np.int64, copy=False)


def _neg_sigmoid(u: np.ndarray) -> np.ndarray:
    """``sigmoid(-u) = 1 / (1 + exp(u)) = exp(-logaddexp(0, u))``, without overflow."""
    return np.exp(-np.logaddexp(0.0, u))


class LogisticModel(Model):
    """Binary logistic regression, ``theta in R^d``."""

    kind = "logistic"

    def __init__(self, n_features: int, l2: float):
        super().__init__(n_features, 2, l2, n_features)

    def _losses(self, theta, X, y):
        s = 2.0 * y - 1.0
        return np.logaddexp(0.0, -s * (X @ theta))

    def _grads(self, theta, X, y):
        s = 2.0 * y - 1.0
        coef = -s * _neg_sigmoid(s * (X @ theta))
        return coef[:, None] * X

    def _predict(self, theta, X):
        return (X @ theta > 0).astype(np.int64)


class MultinomialModel(Model):
    """Softmax regression, ``theta`` = row-major flattening of ``W in R^{k x d}``."""

    kind = "multinomial"

    def __init__(self, n_features: int, n_classes: int, l2: float):
        super().__init__(n_features, n_classes, l2, n_classes * n_features)

    def _logits(self, theta, X):
        return X @ theta.reshape(self.n_classes, self.n_features).T

    @staticmethod
    def _logsumexp(z: np.ndarray) -> np.ndarray:
        zmax = z.max(axis=1)
        return zmax + np.log(np.sum(np.exp(z - zmax[:, None]), axis=1))

    def _losses(self, theta, X, y):
        z = self._logits(theta, X)
        return self._logsumexp(z) - z[np.arange(z.shape[0]), y]

    def _grads(self, theta, X, y):
        b = X.shape[0]
        if b == 0:
            return np.zeros((0, self.dim), dtype=np.float64)
        z = self._logits(theta, X)
        P = np.exp(z - self._logsumexp(z)[:, None])  # softmax, rows sum to 1
        P[np.arange(b), y] -= 1.0
        return (P[:, :, None] * X[:, None, :]).reshape(b, self.dim)

    def _predict(self, theta, X):
        return np.argmax(self._logits(theta, X), axis=1).astype(np.int64)


class LeastSquaresModel(Model):
    """Linear regression with the squared loss (``ridge``: the same with ``l2 > 0``)."""

    def __init__(self, kind: str, n_features: int, l2: float):
        super().__init__(n_features, 0, l2, n_features)
        self.kind = kind

    def _losses(self, theta, X, y):
        r = X @ theta - y
        return 0.5 * r * r

    def _grads(self, theta, X, y):
        return (X @ theta - y)[:, None] * X

    def _predict(self, theta, X):
        return X @ theta


def make_model(
    kind: str, n_features: int, n_classes: int, l2: float = 0.0, start: float = 0.0
) -> Model:
    """Build a model starting at ``theta = start`` everywhere; ValueError for an unknown kind or
    a kind/label mismatch.

    ``logistic`` needs ``n_classes == 2``, ``multinomial`` ``n_classes >= 2``, ``least-squares``
    and ``ridge`` ``n_classes == 0`` (regression data); ``ridge`` needs ``l2 > 0``.
    """
    if kind not in MODEL_KINDS:
        raise ValueError(f"unknown model kind {kind!r}; expected one of {', '.join(MODEL_KINDS)}")
    if isinstance(n_features, bool) or not isinstance(n_features, (int, np.integer)):
        raise ValueError(f"n_features must be an integer, got {n_features!r}")
    if n_features < 1:
        raise ValueError(f"n_features must be >= 1, got {n_features}")
    if isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer)):
        raise ValueError(f"n_classes must be an integer, got {n_classes!r}")
    if not isinstance(l2, (int, float, np.floating)) or not math.isfinite(l2) or l2 < 0:
        raise ValueError(f"l2 must be a finite number >= 0, got {l2!r}")
    n_features, n_classes, l2 = int(n_features), int(n_classes), float(l2)
    if kind == "logistic":
        if n_classes != 2:
            raise ValueError(
                f"model 'logistic' is binary and needs n_classes == 2, got {n_classes} "
                "(use 'multinomial' for more classes, 'least-squares' for regression)"
            )
        return _starting(LogisticModel(n_features, l2), start)
    if kind == "multinomial":
        if n_classes < 2:
            raise ValueError(
                f"model 'multinomial' needs classification data with n_classes >= 2, got "
                f"{n_classes}"
            )
        return _starting(MultinomialModel(n_features, n_classes, l2), start)
    if n_classes != 0:
        raise ValueError(
            f"model {kind!r} is a regression model and needs regression data (n_classes == 0), "
            f"got n_classes={n_classes} (use 'logistic' or 'multinomial')"
        )
    if kind == "ridge" and l2 <= 0:
        raise ValueError("model 'ridge' needs l2 > 0 (with l2 == 0 use 'least-squares')")
    return _starting(LeastSquaresModel(kind, n_features, l2), start)


def _starting(model: Model, start: float) -> Model:
    if not isinstance(start, (int, float, np.floating)) or not math.isfinite(start):
        raise ValueError(f"the starting value must be a finite number, got {start!r}")
    model.start = float(start)
    return model


def clip_rows(G: np.ndarray, clip: float) -> np.ndarray:
    """Scale each row of ``G`` to L2 norm ``<= clip``: ``g <- g * min(1, clip / ||g||)``.

    Rows already within the bound (zero rows included) are returned bit-for-bit unchanged;
    longer rows get norm ``clip`` up to floating-point rounding (a relative error of a few
    ``1e-16``). Norms are computed on the row divided by its largest magnitude, so huge or tiny
    entries neither overflow nor underflow. ``clip = inf`` disables clipping. Returns a new
    array; ``G`` is not modified. ValueError for non-finite entries or ``clip <= 0``.
    """
    G = np.asarray(G, dtype=np.float64)
    if G.ndim != 2:
        raise ValueError(f"clip_rows expects a 2-D array (one row per example), got {G.shape}")
    if not isinstance(clip, (int, float, np.floating)) or math.isnan(clip) or clip <= 0:
        raise ValueError(f"clip must be a number > 0, got {clip!r}")
    if not np.all(np.isfinite(G)):
        raise ValueError("clip_rows: non-finite gradient entries")
    out = G.copy()
    if G.size == 0:
        return out
    amax = np.max(np.abs(G), axis=1)
    scaled = G / np.where(amax > 0, amax, 1.0)[:, None]  # entries in [-1, 1]
    s = np.sqrt(np.sum(scaled * scaled, axis=1))  # ||g|| / amax, in [1, sqrt(dim)] or 0
    over = amax * s > clip  # may be inf for enormous rows, still compares correctly
    if np.any(over):
        out[over] = scaled[over] * (clip / s[over])[:, None]
    return out


def clipped_mean_grad(
    model: Model, theta: np.ndarray, X: np.ndarray, y: np.ndarray, clip: float
) -> np.ndarray:
    """``(1/b) sum_i clip(grad l_i(theta))``: per-example gradients clipped, then averaged.

    Clipping happens first, on every example separately and before any noise, so the result
    has norm ``<= clip`` (triangle inequality, up to rounding) and changes by at most
    ``2 clip / b`` when one example is replaced. The regulariser is not included (add
    :meth:`Model.regulariser_grad`).
    """
    G = model.per_example_grads(theta, X, y)
    if G.shape[0] == 0:
        raise ValueError("clipped_mean_grad: empty batch")
    return clip_rows(G, clip).mean(axis=0)


def clipped_batch_grad(
    model: Model, theta: np.ndarray, X: np.ndarray, y: np.ndarray, clip: float
) -> np.ndarray:
    """``clip((1/b) sum_i grad l_i(theta))``: the batch's mean gradient clipped to norm ``clip``
    as one vector (user-level clipping). The result has norm ``<= clip``, so one node's whole
    batch replaced moves it by at most ``2 clip``, as with per-example clipping, but a node's
    examples can pull against each other before the clip."""
    G = model.per_example_grads(theta, X, y)
    if G.shape[0] == 0:
        raise ValueError("clipped_batch_grad: empty batch")
    return clip_rows(G.mean(axis=0)[None, :], clip)[0]
