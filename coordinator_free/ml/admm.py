"""Private ADMM for consensus ERM (Douglas-Rachford form), one-process reference runs.

Problem: minimise ``F(x) = (1/n) sum_i f_i(x) + r(x)``, ``f_i`` user ``i``'s mean loss (one
record when users are records), ``r`` the regulariser of the :class:`~.prox.Objective`.

**Derivation of the scaling.** Multiply by ``n``: the same minimiser solves
``min sum_i f_i(x_i) + n r(z)`` s.t. ``x_i = z``. Douglas-Rachford on ``u = (u_1..u_n)`` with
``A(x) = sum_i f_i(x_i)`` and ``B(x) = n r(z)`` on the consensus set ``{x_i = z}`` (infinite
elsewhere) reads ``z = prox_{gamma B}(u)``, ``x = prox_{gamma A}(2 z - u)``,
``u <- u + 2 lam (x - z)``. The prox of ``B`` minimises ``n r(z) + sum_i ||z - u_i||^2 /
(2 gamma) = n [r(z) + ||z - z_hat||^2 / (2 gamma)] + const`` with ``z_hat = (1/n) sum_i u_i``,
so **z = prox_{gamma r}(z_hat)**: the step of ``r`` is ``gamma``, not ``gamma / n`` nor
``2 gamma / n``, because the losses enter unweighted (``A`` is separable: user ``i`` takes
``prox_{gamma f_i}``). For ``lam`` in ``(0, 1)`` the iteration is an averaged operator whose
fixed points give ``z* = argmin F``; random blocks (federated sampling, the decentralized walk)
converge as randomized block-coordinate Krasnosel'skii-Mann iterations. :func:`z_of` keeps ``n``
in its signature as the contract does; the scaling does not depend on it. (Equivalently, with
the (1/n)-weighted losses ``(1/n) f_i`` in the prox of each user, as in the proof of Theorem
8.7, the regulariser's step becomes ``gamma' / n`` for a step ``gamma'``: ``gamma' = n gamma``.
So ``privacy.admm.central_rdp`` applies to these runs with ``gamma = n * gamma_here`` and then
equals ``local_rdp`` at ``gamma_here``; the federated, local and network bounds use this
module's ``gamma`` as it is, since they bound ``||x - v|| <= gamma L`` of this very step.)

**Private steps.** A user's step at ``(z, u_i)`` (:func:`local_step`):
``x = prox_{gamma f_i,L}(v)`` with ``v = 2 z - u_i`` and ``f_i,L`` the mean of the records'
``L``-Lipschitz surrogates (:func:`~.prox.clipped_prox`), then
``u_i <- u_i + 2 lam (x - z + eta / 2)``, ``eta ~ N(0, sigma^2 I_p)``: the noise on ``u_i`` has
std ``lam sigma``. Replacing user ``i``'s data moves ``x`` by at most ``2 gamma L`` and ``u_i'``
by ``4 lam gamma L``: a Gaussian ratio ``4 gamma L / sigma`` per contribution, RDP
``8 alpha gamma^2 L^2 / sigma^2``.

The server / token keeps **z_hat = mean of the u_i** and updates it by ``(u_i' - u_i) / n``;
``z = prox_{gamma r}(z_hat)`` is derived from it (Algorithms 8.3/8.4 as printed add the
increment to the post-prox ``z``; (8.7)-(8.9) and Algorithm 8.2 define ``z_hat`` as the mean of
``u``, which is what converges). Initial ``u_i = 0`` unless ``u0`` is given.

**Private proximal SGD** (:func:`prox_sgd`, the baseline): ``w <- prox_{eta r}(w - eta (g_B +
xi))``, ``g_B = (1/b) sum_{j in B} clip(grad loss_j(w), C)`` over a batch ``B`` of ``b`` records
drawn uniformly without replacement, ``xi ~ N(0, sigma^2 C^2 / b^2 I_p)``. Replacing one record
moves ``g_B`` by at most ``2 C / b`` while the noise has std ``sigma C / b``: Gaussian ratio
``2 / sigma``, RDP ``2 alpha / sigma^2`` per step in which the record is used (``K`` steps:
``2 alpha K / sigma^2`` without amplification by subsampling).

Every run is deterministic given its ``rng`` (a ``numpy.random.Generator``); the histories hold
the released iterates only (``z``, never the ``x_i``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from coordinator_free.ml.prox import Objective, clipped_prox, clipped_prox_records


@dataclass
class Run:
    """A one-process run: ``z[k]`` is the released iterate after ``k`` recorded steps (``z[0]``
    the start). ``steps`` counts local (or per-record) prox steps, ``clipped`` those whose
    gradient was clipped; ``path`` is the sequence of users visited (decentralized run only)."""

    z: np.ndarray
    steps: int = 0
    clipped: int = 0
    path: np.ndarray | None = None
    info: dict = field(default_factory=dict)

    @property
    def final(self) -> np.ndarray:
        return self.z[-1]

    def objective(self, obj: Objective, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        """``obj.value`` of every recorded iterate on ``(X, y)``."""
        return np.array([obj.value(w, X, y) for w in self.z])


def _check_params(gamma: float, lam: float, clip: float, sigma: float) -> None:
    if not (isinstance(gamma, (int, float)) and math.isfinite(gamma) and gamma > 0):
        raise ValueError(f"gamma must be a finite positive number, got {gamma!r}")
    if not (isinstance(lam, (int, float)) and 0 < lam < 1):
        raise ValueError(f"lam (lambda) must be in (0, 1), got {lam!r}")
    if not (isinstance(clip, (int, float)) and clip > 0):
        raise ValueError(f"clip (L) must be positive (inf for no clipping), got {clip!r}")
    if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be a finite number >= 0, got {sigma!r}")


def local_step(
    obj: Objective,
    X: np.ndarray,
    y: np.ndarray,
    z: np.ndarray,
    u: np.ndarray,
    *,
    gamma: float,
    lam: float,
    clip: float,
    eta: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """One user's step: ``(u_new, x)`` with ``x = clipped prox_{gamma f}(2 z - u)`` and
    ``u_new = u + 2 lam (x - z + eta / 2)``; ``eta`` is the drawn noise (std ``sigma``)."""
    x, _ = clipped_prox(obj, 2.0 * z - u, X, y, gamma, clip)
    return u + 2.0 * lam * (x - z) + lam * eta, x


def z_of(obj: Objective, z_hat: np.ndarray, *, gamma: float, n: int) -> np.ndarray:
    """``z = prox_{gamma r}(z_hat)``, ``z_hat`` the mean of the ``u_i`` (module docstring: the
    scaling is ``gamma`` whatever ``n``; ``n`` is checked, not used)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    return obj.prox_reg(np.asarray(z_hat, dtype=np.float64), gamma)


# ---------------------------------------------------------------------------------------------
# users: one record each (vectorised), or groups of rows


class _Users:
    """Steps of a set of users on ``(X, y)``: ``groups[i]`` the rows of user ``i``, or every
    record its own user (``groups=None``, vectorised)."""

    def __init__(
        self, obj: Objective, X: np.ndarray, y: np.ndarray, groups: Sequence[np.ndarray] | None
    ):
        self.obj, self.X, self.y = obj, np.asarray(X, dtype=np.float64), np.asarray(y)
        if self.X.ndim != 2 or self.X.shape[0] != self.y.shape[0]:
            raise ValueError(f"X must be (m, p) and y (m,), got {self.X.shape} and {self.y.shape}")
        self.groups = None if groups is None else [np.asarray(g, dtype=np.int64) for g in groups]
        if self.groups is not None and any(g.size == 0 for g in self.groups):
            raise ValueError("every user needs at least one record (an empty group was given)")
        self.n = self.X.shape[0] if self.groups is None else len(self.groups)
        self.p = self.X.shape[1]

    def steps(
        self,
        ids: np.ndarray,
        z: np.ndarray,
        U: np.ndarray,
        *,
        gamma: float,
        lam: float,
        clip: float,
        eta: np.ndarray,
    ) -> tuple[np.ndarray, int]:
        """New ``u`` rows of users ``ids`` (all at the same ``z``) and how many were clipped."""
        V = 2.0 * z - U[ids]
        if self.groups is None:
            Xs, clipped = clipped_prox_records(self.obj, V, self.X[ids], self.y[ids], gamma, clip)
            n_clipped = int(clipped.sum())
        else:
            Xs = np.empty_like(V)
            n_clipped = 0
            for k, i in enumerate(ids):
                rows = self.groups[i]
                Xs[k], c = clipped_prox(self.obj, V[k], self.X[rows], self.y[rows], gamma, clip)
                n_clipped += int(c)
        return U[ids] + 2.0 * lam * (Xs - z) + lam * eta, n_clipped


#: How a round's users (federated) or a step's records (prox-SGD) are drawn.
SAMPLINGS = ("fixed", "poisson")


def _sample(rng: np.random.Generator, n: int, m: int, sampling: str) -> np.ndarray:
    """Sorted indices: ``m`` of ``n`` without replacement, or each with probability ``m / n``."""
    if sampling == "fixed":
        return np.sort(rng.choice(n, size=m, replace=False))
    return np.flatnonzero(rng.random(n) < m / n)


def _start(users: _Users, u0: np.ndarray | None) -> np.ndarray:
    if u0 is None:
        return np.zeros((users.n, users.p))
    U = np.array(u0, dtype=np.float64)
    if U.shape != (users.n, users.p):
        raise ValueError(f"u0 must have shape ({users.n}, {users.p}), got {U.shape}")
    return U


def central_admm(
    obj: Objective,
    X: np.ndarray,
    y: np.ndarray,
    *,
    gamma: float,
    lam: float,
    clip: float,
    sigma: float,
    iterations: int,
    rng: np.random.Generator,
    groups: Sequence[np.ndarray] | None = None,
    u0: np.ndarray | None = None,
) -> Run:
    """Algorithm 8.2: every iteration ``z = prox_{gamma r}(mean u)`` then every user steps.
    ``z[k]`` is ``z_of(mean u after k iterations)``."""
    _check_params(gamma, lam, clip, sigma)
    users = _Users(obj, X, y, groups)
    U = _start(users, u0)
    everyone = np.arange(users.n)
    hist = [z_of(obj, U.mean(axis=0), gamma=gamma, n=users.n)]
    clipped = 0
    for _ in range(int(iterations)):
        z = hist[-1]
        eta = sigma * rng.standard_normal((users.n, users.p))
        U, c = users.steps(everyone, z, U, gamma=gamma, lam=lam, clip=clip, eta=eta)
        clipped += c
        hist.append(z_of(obj, U.mean(axis=0), gamma=gamma, n=users.n))
    return Run(z=np.array(hist), steps=int(iterations) * users.n, clipped=clipped)


def federated_admm(
    obj: Objective,
    X: np.ndarray,
    y: np.ndarray,
    *,
    gamma: float,
    lam: float,
    clip: float,
    sigma: float,
    rounds: int,
    m: int,
    rng: np.random.Generator,
    groups: Sequence[np.ndarray] | None = None,
    u0: np.ndarray | None = None,
    secure_aggregation: bool = False,
    sampling: str = "fixed",
) -> Run:
    """Algorithm 8.3: each round a sample of users steps at the current ``z``; the server adds
    the sum of their ``u_i' - u_i`` divided by ``n`` to ``z_hat``. ``sampling = "fixed"``: ``m``
    users drawn uniformly without replacement; ``"poisson"``: every user independently with
    probability ``m / n`` (the sampling of the subsampled-Gaussian lemma the central accounting
    uses).

    ``secure_aggregation`` changes what the server sees (the sum only), hence the accounting, not
    the arithmetic: the iterates are identical; it is recorded in ``info``."""
    _check_params(gamma, lam, clip, sigma)
    users = _Users(obj, X, y, groups)
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or not 1 <= m <= users.n:
        raise ValueError(f"m (users per round) must be an integer in 1..{users.n}, got {m!r}")
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling must be one of {', '.join(SAMPLINGS)}, got {sampling!r}")
    U = _start(users, u0)
    z_hat = U.mean(axis=0)
    hist = [z_of(obj, z_hat, gamma=gamma, n=users.n)]
    clipped = steps = 0
    for _ in range(int(rounds)):
        ids = _sample(rng, users.n, int(m), sampling)
        steps += ids.size
        eta = sigma * rng.standard_normal((ids.size, users.p))
        new, c = users.steps(ids, hist[-1], U, gamma=gamma, lam=lam, clip=clip, eta=eta)
        clipped += c
        z_hat = z_hat + (new - U[ids]).sum(axis=0) / users.n
        U[ids] = new
        hist.append(z_of(obj, z_hat, gamma=gamma, n=users.n))
    return Run(
        z=np.array(hist),
        steps=steps,
        clipped=clipped,
        info={
            "secure_aggregation": bool(secure_aggregation),
            "m": int(m),
            "n": users.n,
            "sampling": sampling,
        },
    )


def decentralized_admm_reference(
    obj: Objective,
    X: np.ndarray,
    y: np.ndarray,
    *,
    gamma: float,
    lam: float,
    clip: float,
    sigma: float,
    steps: int,
    rng: np.random.Generator,
    groups: Sequence[np.ndarray] | None = None,
    u0: np.ndarray | None = None,
    record_every: int | None = None,
) -> Run:
    """Algorithm 8.4 on the complete graph: a token holding ``z_hat`` visits a uniformly random
    user (the first one too, and each next one uniform over all ``n``, the holder included); the
    holder steps at ``z = prox_{gamma r}(z_hat)`` and adds ``(u_i' - u_i)/n`` to ``z_hat``.
    ``z`` is recorded every ``record_every`` steps (default ``n``); ``path`` lists the users."""
    _check_params(gamma, lam, clip, sigma)
    users = _Users(obj, X, y, groups)
    every = users.n if record_every is None else int(record_every)
    if every < 1:
        raise ValueError(f"record_every must be >= 1, got {record_every!r}")
    U = _start(users, u0)
    z_hat = U.mean(axis=0)
    z = z_of(obj, z_hat, gamma=gamma, n=users.n)
    hist = [z]
    steps = int(steps)
    path = rng.integers(users.n, size=steps)
    clipped = 0
    for k in range(steps):
        i = path[k : k + 1]
        eta = sigma * rng.standard_normal((1, users.p))
        new, c = users.steps(i, z, U, gamma=gamma, lam=lam, clip=clip, eta=eta)
        clipped += c
        z_hat = z_hat + (new[0] - U[i[0]]) / users.n
        U[i[0]] = new[0]
        z = z_of(obj, z_hat, gamma=gamma, n=users.n)
        if (k + 1) % every == 0:
            hist.append(z)
    return Run(z=np.array(hist), steps=steps, clipped=clipped, path=path)


def prox_sgd(
    obj: Objective,
    X: np.ndarray,
    y: np.ndarray,
    *,
    eta: float,
    clip: float,
    sigma: float,
    iterations: int,
    batch: int,
    rng: np.random.Generator,
    w0: np.ndarray | None = None,
    sampling: str = "fixed",
) -> Run:
    """Private proximal SGD (module docstring): ``w <- prox_{eta r}(w - eta (g_B + xi))``,
    ``xi ~ N(0, sigma^2 C^2 / b^2 I)``, ``C = clip``. ``sampling = "fixed"``: ``b = batch``
    records per step drawn uniformly without replacement; ``"poisson"``: each record
    independently with probability ``b / m``, the clipped gradients summed and divided by the
    expected size ``b`` (not the drawn one, so one record still moves ``g_B`` by at most
    ``2 C / b``)."""
    if not (isinstance(eta, (int, float)) and math.isfinite(eta) and eta > 0):
        raise ValueError(f"eta (step size) must be a finite positive number, got {eta!r}")
    if not (isinstance(clip, (int, float)) and clip > 0):
        raise ValueError(f"clip (C) must be positive (inf for no clipping), got {clip!r}")
    if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be a finite number >= 0, got {sigma!r}")
    X = np.asarray(X, dtype=np.float64)
    m, p = X.shape
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or not 1 <= batch <= m:
        raise ValueError(f"batch must be an integer in 1..{m}, got {batch!r}")
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling must be one of {', '.join(SAMPLINGS)}, got {sampling!r}")
    if sigma > 0 and math.isinf(clip):
        raise ValueError("noisy prox-SGD needs a finite clip bound C (the noise scales with it)")
    w = np.zeros(p) if w0 is None else np.array(w0, dtype=np.float64)
    hist = [w]
    clipped = steps = 0
    for _ in range(int(iterations)):
        ids = _sample(rng, m, int(batch), sampling)
        steps += ids.size
        G = obj.per_record_grads(w, X[ids], y[ids])
        norms = np.linalg.norm(G, axis=1)
        over = norms > clip
        clipped += int(over.sum())
        G = G * np.where(over, clip / np.where(over, norms, 1.0), 1.0)[:, None]
        noise = rng.standard_normal(p) * (sigma * clip / batch) if sigma > 0 else 0.0
        w = obj.prox_reg(w - eta * (G.sum(axis=0) / batch + noise), eta)
        hist.append(w)
    return Run(z=np.array(hist), steps=steps, clipped=clipped, info={"sampling": sampling})
