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

**The Lipschitz surrogate and its sensitivity** (:func:`clipped_prox`). Every loss here is
``ell(a . w; y)`` with ``ell`` convex in the scalar ``s = a . w``. The surrogate of bound ``L``
clamps its derivative per record: ``ell_L'(s) = clip(ell'(s), -L/||a||, L/||a||)``. A clamped
non-decreasing derivative is still non-decreasing, so ``ell_L`` is convex, and its gradient
``ell_L'(a . w) a`` has norm at most ``L``: every record's loss is convex and ``L``-Lipschitz
(least squares becomes a Huber loss of threshold ``L/||a||``; logistic a logistic continued
linearly where its slope exceeds ``L/||a||``), its gradient the record's gradient clipped to
``L``. Where no record is clamped it *is* the loss. The shard loss (the mean over its ``m``
records) is convex and ``L``-Lipschitz, so the private-ADMM theorems' hypotheses hold exactly:

* ``x = prox_{t f_L}(v)`` satisfies ``||x - v|| = t ||grad f_L(x)|| <= t L``;
* two shards differing in one record (record level) give ``||x - x'|| <= 2 t L / m``: ``phi(w)
  = f_L(w) + ||w - v||^2 / (2 t)`` is ``1/t``-strongly convex with ``grad phi(x) = 0`` and
  ``grad phi(x') = grad phi(x') - grad phi'(x') = (g_j(x') - g'_j(x')) / m`` (only record ``j``
  differs, each gradient of norm at most ``L``), so ``||x' - x||^2 / t <= <grad phi(x'), x' - x>
  <= (2 L / m) ||x' - x||``;
* the prox of a convex function is firmly non-expansive (Theorem 8.12's other users' steps).

The prox is computed by safeguarded Newton on ``phi`` (Armijo backtracking on ``phi``'s value; the
surrogate's second derivative is the loss's where it is not clamped, 0 where it is), started at
``v``, until ``t ||grad phi(x)|| <= PROX_TOL_REL * t * L``: by ``1/t``-strong convexity the
iterate is then within ``PROX_TOL_REL * t * L`` of the exact prox (a certificate, checked, not
assumed: a solve that cannot certify it raises). Its result is then projected on the ball
``||x - v|| <= t L`` (which holds the exact prox, so the projection only moves it closer): the
user-level bound ``||x - v|| <= t L`` holds *by construction*. The record-level bound holds up to
the certified error of both solves: ``||x - x'|| <= 2 t L (1/m + PROX_TOL_REL)``, and the
computed map of a user is non-expansive up to ``2 PROX_TOL_REL t L`` (the accountant adds both to
the sensitivity, ``privacy.admm.effective_lipschitz``). With ``L = inf`` the plain prox is used.
One-record shards (:func:`clipped_prox_records`) solve the scalar equation in closed form (lstsq)
or by safeguarded Newton, and clamp the root's coefficient: for one record this is exactly the
surrogate's prox, and ``|coef| ||a|| <= L`` holds by construction.
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
#: The surrogate prox is certified within this fraction of ``t L`` of the exact one.
PROX_TOL_REL = 1e-10
#: Newton steps allowed to certify it (each with Armijo backtracking).
PROX_MAX_ITER = 200


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

    def row_curvature(self, w: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        """``ell''(x_j . w)`` of every row (1 for lstsq, ``sigma (1 - sigma)`` for logistic)."""
        if self.loss == "lstsq":
            return np.ones(X.shape[0])
        sig = _sigmoid(-self._signs(y) * (X @ w))
        return sig * (1.0 - sig)

    # -- the L-Lipschitz surrogate (module docstring) ----------------------------------------

    def surrogate_coefs(
        self, w: np.ndarray, X: np.ndarray, y: np.ndarray, bound: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(ell_L'(s_j), ell_L''(s_j), clamped_j)`` per row: the derivative clamped to
        ``[-L/||x_j||, L/||x_j||]``, its derivative (0 where clamped)."""
        d = self.row_coefs(w, X, y)
        dd = self.row_curvature(w, X, y)
        if math.isinf(bound):
            return d, dd, np.zeros(d.shape, dtype=bool)
        norms = np.linalg.norm(X, axis=1)
        c = np.where(norms > 0, bound / np.where(norms > 0, norms, 1.0), np.inf)
        clamped = np.abs(d) > c
        return np.clip(d, -c, c), np.where(clamped, 0.0, dd), clamped

    def surrogate_loss_value(self, w: np.ndarray, X: np.ndarray, y: np.ndarray, bound: float):
        """The mean of the rows' surrogate losses ``ell_L(x_j . w)`` (``= loss_value`` where no
        row is clamped): the loss up to the clamp point ``s0``, then continued linearly with
        the clamped slope."""
        if math.isinf(bound):
            return self.loss_value(w, X, y)
        score = X @ w
        norms = np.linalg.norm(X, axis=1)
        c = np.where(norms > 0, bound / np.where(norms > 0, norms, 1.0), np.inf)
        if self.loss == "lstsq":
            r = np.abs(score - y)
            vals = np.where(r <= c, 0.5 * r * r, c * r - 0.5 * c * c)
            return float(np.mean(vals))
        s = self._signs(y)
        # ell(u) = log(1 + exp(-u)) in the margin u = s * score; |ell'(u)| = sigmoid(-u) > c
        # for u < u0 = log((1 - c) / c) (c < 1), where ell is continued with slope -c.
        marg = s * score
        with np.errstate(divide="ignore", invalid="ignore"):
            u0 = np.where(c < 1.0, np.log((1.0 - np.minimum(c, 1.0)) / c), -np.inf)
        u0s = np.where(np.isfinite(u0), u0, 0.0)  # the linear branch is used only where finite
        lin = _log1pexp(-u0s) + np.where(np.isfinite(c), c, 0.0) * (u0s - marg)
        vals = np.where(marg < u0, lin, _log1pexp(-marg))
        return float(np.mean(vals))

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


def _project(x: np.ndarray, v: np.ndarray, radius: float) -> np.ndarray:
    """``x`` projected on the ball ``||x - v|| <= radius``."""
    d = x - v
    norm = float(np.linalg.norm(d))
    if norm > radius:
        return v + d * (radius / norm)
    return x


def surrogate_prox(
    obj: Objective, v: np.ndarray, X: np.ndarray, y: np.ndarray, t: float, bound: float
) -> tuple[np.ndarray, bool, float]:
    """``prox_{t f_L}(v)``, ``f_L`` the mean surrogate loss of bound ``L`` (module docstring):
    ``(x, some row clamped at x, certified distance to the exact prox)``. Safeguarded Newton
    until ``t ||grad phi|| <= PROX_TOL_REL t L``, then projected on ``||x - v|| <= t L``;
    raises ``ArithmeticError`` when it cannot certify that tolerance."""
    m, p = X.shape
    tol = PROX_TOL_REL * bound  # on ||grad phi||: distance <= t * tol = PROX_TOL_REL t L

    def phi(w: np.ndarray) -> float:
        dw = w - v
        return obj.surrogate_loss_value(w, X, y, bound) + float(dw @ dw) / (2.0 * t)

    x = v.copy()
    d, dd, clamped = obj.surrogate_coefs(x, X, y, bound)
    grad = X.T @ d / m + (x - v) / t
    norm = float(np.linalg.norm(grad))
    val = phi(x)
    for _ in range(PROX_MAX_ITER):
        if norm <= tol:
            break
        hess = (X.T * (dd / m)) @ X + np.eye(p) / t
        step = np.linalg.solve(hess, grad)
        slope = float(grad @ step)  # > 0: the Newton step descends (hess is positive definite)
        a = 1.0
        while True:
            # Armijo on phi's value, or, where the value no longer resolves the decrease (near
            # the solution), a smaller gradient norm: the certificate below is what counts.
            x_new = x - a * step
            val_new = phi(x_new)
            d, dd, clamped_new = obj.surrogate_coefs(x_new, X, y, bound)
            grad_new = X.T @ d / m + (x_new - v) / t
            norm_new = float(np.linalg.norm(grad_new))
            armijo = val_new <= val - 1e-4 * a * slope
            flat = abs(val_new - val) <= 1e-12 * max(1.0, abs(val)) and norm_new < norm
            if armijo or flat or a < 1e-12:
                break
            a *= 0.5
        if not (armijo or flat):
            break  # no progress left at this precision
        x, grad, norm, val, clamped = x_new, grad_new, norm_new, val_new, clamped_new
    if not norm <= tol:
        raise ArithmeticError(
            f"the surrogate prox did not certify its tolerance: ||grad phi|| = {norm:.3g} > "
            f"{tol:.3g} (PROX_TOL_REL * L) after {PROX_MAX_ITER} Newton steps"
        )
    return _project(x, v, t * bound), bool(np.any(clamped)), t * norm


def clipped_prox(
    obj: Objective, v: np.ndarray, X: np.ndarray, y: np.ndarray, t: float, clip_bound: float
) -> tuple[np.ndarray, bool]:
    """``x = prox_{t f_L}(v)``, ``f_L`` the mean of the records' ``L``-Lipschitz surrogate losses
    (module docstring); returns ``(x, some record's gradient clamped)``. ``||x - v|| <= t L``
    exactly; ``L = inf`` gives the plain prox."""
    if not clip_bound > 0:
        raise ValueError(f"clip bound L must be positive, got {clip_bound!r}")
    if not t > 0:
        raise ValueError(f"prox step t must be positive, got {t!r}")
    v = np.asarray(v, dtype=np.float64)
    if math.isinf(clip_bound):
        return obj.prox_loss(v, X, y, t), False
    if X.shape[0] == 1:
        rows, clamped = clipped_prox_records(obj, v[None, :], X, y, t, clip_bound)
        return rows[0], bool(clamped[0])
    x, clamped, _err = surrogate_prox(obj, v, X, y, t, clip_bound)
    return x, clamped


def clipped_prox_records(
    obj: Objective, V: np.ndarray, X: np.ndarray, y: np.ndarray, t: float, clip_bound: float
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`clipped_prox` for many one-record users at once: row ``j`` of the result is the
    surrogate prox of record ``j`` at ``V[j]``; returns ``(rows, clamped mask)``.

    With one record the loss is ``ell(a . x)`` and the prox satisfies ``x = v - t ell'(s) a`` with
    ``s = a . x`` the root of the increasing scalar equation ``s + t ||a||^2 ell'(s) = a . v``:
    closed form for lstsq, safeguarded Newton (to ``NEWTON_TOL``) for logistic. The surrogate's
    root has ``ell_L'(s) = clip(ell'(s_0), -L/||a||, L/||a||)`` at the loss's root ``s_0`` (the
    clamped equation lies on the same side of the unclamped one as the clamp), so clamping the
    coefficient of the loss's prox is the surrogate's prox, exactly.
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
