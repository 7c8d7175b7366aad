"""Objectives with proximal operators, and the clipped proximal step of private ADMM.

An :class:`Objective` is ``F(w) = (1/m) sum_j loss(w; x_j, y_j) + r(w)`` over the ``m`` rows of
``(X, y)``:

* ``loss = "lstsq"``: ``(1/2) (y_j - x_j . w)^2``, so the mean loss is ``(1/(2m)) ||y - X w||^2``
  (scikit-learn's ``Lasso`` / ``ElasticNet`` convention).
* ``loss = "logistic"``: ``log(1 + exp(-s_j x_j . w))`` with ``s_j = +1`` when ``y_j > 0`` and
  ``-1`` otherwise (so 0/1 and -1/+1 labels both work).
* ``reg = "l1"``: ``r(w) = reg_strength ||w||_1``; ``"l2"``: ``r(w) = (reg_strength / 2) ||w||^2``;
  ``"none"``: ``r = 0``. So ``Objective("lstsq", "l1", a)`` is exactly scikit-learn's
  ``Lasso(alpha=a, fit_intercept=False)`` objective.

Proximal operators, ``prox_{t h}(v) = argmin_x h(x) + ||x - v||^2 / (2 t)``:

* ``prox_reg``: soft-thresholding ``sign(v) max(|v| - t a, 0)`` (l1), ``v / (1 + t a)`` (l2),
  the identity (none). Exact.
* ``prox_loss`` for ``lstsq``: the linear system ``(X^T X / m + I / t) x = X^T y / m + v / t``,
  solved in the ``m x m`` form ``x = v + t X^T c``, ``(m I + t X X^T) c = y - X v`` when
  ``m <= p`` (one record is a scalar division) and in the ``p x p`` form otherwise. Exact up to
  rounding.
* ``prox_loss`` for ``logistic``: damped Newton on the ``1/t``-strongly convex
  ``phi(x) = mean loss(x) + ||x - v||^2 / (2 t)``, started at ``v``, with backtracking (Armijo)
  damped (step halved) until ``||grad phi||`` decreases; it stops when
  ``||grad phi(x)|| <= NEWTON_TOL (1 + ||v|| / t)`` (``NEWTON_TOL = 1e-12``: a relative
  precision, since ``grad phi`` carries ``(x - v)/t``; the logistic Hessian is Lipschitz, so the
  last steps converge quadratically), when no step reduces it any more (rounding), or after
  ``NEWTON_MAX_ITER`` steps. By ``1/t``-strong convexity the distance to the exact prox is at
  most ``t ||grad phi(x)||``, i.e. about ``NEWTON_TOL (t + ||v||)``.

**The clipped step and its sensitivity** (:func:`clipped_prox`). Any proximal point satisfies
``x = v - t g`` with ``g = grad f(x)`` (the *implicit gradient*). We compute ``x~`` (exactly, or
by Newton), set ``g = (v - x~) / t`` and return ``x = v - t clip(g, L)``, ``clip(g, L) = g
min(1, L / ||g||)``. Hence ``||x - v|| <= t L`` holds *by construction*, whatever the data and
whatever the Newton error: the error only moves ``x`` (by at most ``t * NEWTON_TOL`` before
clipping), never the bound the privacy theorems use. When ``||g|| <= L`` nothing is clipped and
``x`` is the (numerically) exact prox; for an ``L``-Lipschitz loss this is always the case.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LOSSES = ("lstsq", "logistic")
REGULARISERS = ("l1", "l2", "none")

#: Newton stops when the gradient of the prox objective has at most this norm (logistic).
NEWTON_TOL = 1e-12
#: ... or after this many Newton steps.
NEWTON_MAX_ITER = 100


def _log1pexp(u: np.ndarray) -> np.ndarray:
    """``log(1 + exp(u))`` without overflow."""
    return np.logaddexp(0.0, u)


def _sigmoid(u: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-u))`` without overflow."""
    return np.exp(-np.logaddexp(0.0, -u))


def soft_threshold(v: np.ndarray, tau: float) -> np.ndarray:
    """``sign(v) max(|v| - tau, 0)`` coordinate-wise: the prox of ``tau ||.||_1``."""
    return np.sign(v) * np.maximum(np.abs(v) - tau, 0.0)


def clip(g: np.ndarray, bound: float) -> tuple[np.ndarray, bool]:
    """``(g min(1, bound/||g||), clipped?)``; ``bound = inf`` never clips."""
    norm = float(np.linalg.norm(g))
    if norm > bound:
        return g * (bound / norm), True
    return g, False


@dataclass(frozen=True)
class Objective:
    """``mean loss over rows + r(w)``; see the module docstring for the exact formulas."""

    loss: str = "lstsq"
    reg: str = "l1"
    reg_strength: float = 0.0

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(
                f"Objective.loss must be one of {', '.join(LOSSES)}, got {self.loss!r}"
            )
        if self.reg not in REGULARISERS:
            raise ValueError(
                f"Objective.reg must be one of {', '.join(REGULARISERS)}, got {self.reg!r}"
            )
        s = self.reg_strength
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s < 0:
            raise ValueError(f"Objective.reg_strength must be a finite number >= 0, got {s!r}")

    # -- losses ------------------------------------------------------------------------------

    def _signs(self, y: np.ndarray) -> np.ndarray:
        return np.where(np.asarray(y) > 0, 1.0, -1.0)

    def loss_value(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
        """The mean loss over the rows of ``(X, y)`` (no regulariser)."""
        score = X @ w
        if self.loss == "lstsq":
            res = y - score
            return float(res @ res) / (2.0 * X.shape[0])
        return float(np.mean(_log1pexp(-self._signs(y) * score)))

    def reg_value(self, w: np.ndarray) -> float:
        """``r(w)``."""
        if self.reg == "l1":
            return self.reg_strength * float(np.abs(w).sum())
        if self.reg == "l2":
            return 0.5 * self.reg_strength * float(w @ w)
        return 0.0

    def value(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
        """Mean loss over rows plus ``r(w)``."""
        return self.loss_value(w, X, y) + self.reg_value(w)

    def row_coefs(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        """``c_j`` with ``grad loss(w; x_j, y_j) = c_j x_j`` (the loss is a function of x_j . w)."""
        score = X @ w
        if self.loss == "lstsq":
            return score - y
        s = self._signs(y)
        return -s * _sigmoid(-s * score)

    def per_record_grads(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        """``(m, p)`` gradients of each row's loss."""
        return self.row_coefs(w, X, y)[:, None] * X

    def loss_grad(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Gradient of the mean loss."""
        return X.T @ self.row_coefs(w, X, y) / X.shape[0]

    # -- proximal operators --------------------------------------------------------------------

    def prox_reg(self, v: np.ndarray, t: float) -> np.ndarray:
        """``prox_{t r}(v)`` (exact)."""
        if self.reg == "l1":
            return soft_threshold(v, t * self.reg_strength)
        if self.reg == "l2":
            return v / (1.0 + t * self.reg_strength)
        return np.array(v, dtype=np.float64, copy=True)

    def prox_loss(self, v: np.ndarray, X: np.ndarray, y: np.ndarray, t: float) -> np.ndarray:
        """``prox_{t f}(v)``, ``f`` the mean loss of ``(X, y)`` (logistic: Newton, see module)."""
        if not t > 0:
            raise ValueError(f"prox step t must be positive, got {t!r}")
        v = np.asarray(v, dtype=np.float64)
        m, p = X.shape
        if self.loss == "lstsq":
            if m <= p:
                c = np.linalg.solve(m * np.eye(m) + t * (X @ X.T), y - X @ v)
                return v + t * (X.T @ c)
            return np.linalg.solve(X.T @ X + (m / t) * np.eye(p), X.T @ y + (m / t) * v)
        return self._prox_logistic(v, X, y, t)

    def _prox_logistic(self, v: np.ndarray, X: np.ndarray, y: np.ndarray, t: float) -> np.ndarray:
        m, p = X.shape
        s = self._signs(y)
        tol = NEWTON_TOL * (1.0 + float(np.linalg.norm(v)) / t)

        def grad_phi(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            sig = _sigmoid(-s * (X @ w))  # P(wrong sign)
            return X.T @ (-s * sig) / m + (w - v) / t, sig

        x = v.copy()
        grad, sig = grad_phi(x)
        norm = float(np.linalg.norm(grad))
        for _ in range(NEWTON_MAX_ITER):
            if norm <= tol:
                break
            hess = (X.T * (sig * (1.0 - sig) / m)) @ X + np.eye(p) / t
            step = np.linalg.solve(hess, grad)
            a = 1.0
            while True:  # damp until the gradient norm decreases (it does for small a)
                x_new = x - a * step
                grad_new, sig_new = grad_phi(x_new)
                norm_new = float(np.linalg.norm(grad_new))
                if norm_new < norm or a < 1e-10:
                    break
                a *= 0.5
            if not norm_new < norm:  # no progress left at this precision
                break
            x, grad, sig, norm = x_new, grad_new, sig_new, norm_new
        return x


def clipped_prox(
    obj: Objective, v: np.ndarray, X: np.ndarray, y: np.ndarray, t: float, clip_bound: float
) -> tuple[np.ndarray, bool]:
    """``x = v - t clip(g, L)`` with ``g = (v - prox_{t f}(v)) / t``; returns ``(x, clipped)``.

    ``||x - v|| <= t L`` exactly (see the module docstring); ``L = inf`` gives the plain prox.
    """
    if not clip_bound > 0:
        raise ValueError(f"clip bound L must be positive, got {clip_bound!r}")
    v = np.asarray(v, dtype=np.float64)
    g = (v - obj.prox_loss(v, X, y, t)) / t
    g, clipped = clip(g, clip_bound)
    return v - t * g, clipped


def clipped_prox_records(
    obj: Objective, V: np.ndarray, X: np.ndarray, y: np.ndarray, t: float, clip_bound: float
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`clipped_prox` for many one-record users at once: row ``j`` of the result is
    ``clipped_prox(obj, V[j], X[j:j+1], y[j:j+1], t, L)``; returns ``(rows, clipped mask)``.

    With one record the loss is ``ell(a . x)`` and the prox satisfies ``x = v - t ell'(s) a`` with
    ``s = a . x`` the root of the increasing scalar equation ``s + t ||a||^2 ell'(s) = a . v``:
    closed form for lstsq, safeguarded Newton (to ``NEWTON_TOL``) for logistic.
    """
    if not t > 0:
        raise ValueError(f"prox step t must be positive, got {t!r}")
    if not clip_bound > 0:
        raise ValueError(f"clip bound L must be positive, got {clip_bound!r}")
    a2 = np.einsum("ij,ij->i", X, X)
    av = np.einsum("ij,ij->i", X, V)
    if obj.loss == "lstsq":
        coef = (av - y) / (1.0 + t * a2)  # ell'(s) = s - y at the root
    else:
        # |ell'| <= 1, so the root lies in [a.v - t||a||^2, a.v + t||a||^2]: Newton safeguarded
        # by bisection on that bracket (h is increasing, h' in [1, 1 + t||a||^2/4])
        sg = obj._signs(y)
        lo, hi = av - t * a2, av + t * a2
        s = av.copy()
        for _ in range(NEWTON_MAX_ITER):
            sig = _sigmoid(-sg * s)
            h = s + t * a2 * (-sg * sig) - av
            if float(np.max(np.abs(h), initial=0.0)) <= NEWTON_TOL:
                break
            lo = np.where(h < 0, s, lo)
            hi = np.where(h > 0, s, hi)
            newton = s - h / (1.0 + t * a2 * sig * (1.0 - sig))
            inside = (newton > lo) & (newton < hi)
            s = np.where(inside, newton, 0.5 * (lo + hi))
        coef = -sg * _sigmoid(-sg * s)
    G = coef[:, None] * X
    norms = np.abs(coef) * np.sqrt(a2)
    clipped = norms > clip_bound
    scale = np.where(clipped, clip_bound / np.where(clipped, norms, 1.0), 1.0)
    return V - t * (G * scale[:, None]), clipped
