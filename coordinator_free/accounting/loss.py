"""The one typed loss: how every epsilon of the project is made.

A family describes what an observer sees (a view); the accountant turns the view into a
:class:`Loss`: who observes, which source, which method, the Renyi curve (a linear one,
``rdp(alpha) = alpha * rho``, stored as ``factor`` in units of one local-DP release) or an
eps-only bound, the eps at delta and *how* that eps was obtained (``conversion``), where the
number comes from (``basis``) and why. Reports are JSON, so a loss leaves as a dict
(:meth:`Loss.entry`); nothing outside ``accounting/`` writes an ``eps`` key of its own
(``tests/test_architecture.py`` scans for it), so every figure the CLI, the JSON, the PNGs and
the HTML show was made here and passed through :func:`coordinator_free.accounting.audit.floor`.

The conversions (``conversion`` in the JSON):

* ``gaussian``: the view is a Gaussian mechanism (linear in the private inputs, Gaussian noise):
  its exact privacy profile (Balle & Wang 2018, Thm 8) at delta, with ``mu^2 = 2 rho``. This is
  what ``exact`` means for Muffliato, randomized gossip, GD/SGD/D-SGD over known graphs, DECOR
  and the walks' sums. The Renyi curve stays in the entry (``factor``, ``rdp``) for composition,
  and the RDP-converted figure stays as ``eps_rdp``: never smaller than ``eps``.
* ``rdp``: an upper bound on the Renyi curve (a paper's formula, privacy amplification by
  iteration) converted with the improved RDP conversion, optimised over every order.
* ``rdp-orders``: a theorem's Renyi bound, converted at the orders its condition allows only
  (``alpha_max``; :func:`theorem`).
* ``bound``: an eps-only bound (shuffling, advanced composition, a theorem stated in eps).

The bases (``basis`` in audits): ``realised`` (the logs), ``plan`` (the fault-free plan, where
the logs cannot be trusted), ``worst-case`` (local DP capped: nothing is known of the
observer), and, in plans, the method itself says whether a figure is a theorem's (``paper``).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from coordinator_free.privacy import rdp as rdp_mod
from coordinator_free.privacy import walk as walk_mod

#: How an eps was obtained from a view (module doc).
CONVERSIONS = ("gaussian", "rdp", "rdp-orders", "bound")


@dataclass(frozen=True)
class Loss:
    """One privacy loss. ``factor``: the linear Renyi curve in units of one local-DP release
    (None for an eps-only bound); ``rdp``: the curve at the config's order; ``eps``: at the
    config's delta, by ``conversion``; ``eps_rdp``: the improved RDP conversion of the same
    curve where ``eps`` is the exact Gaussian profile."""

    eps: float
    conversion: str
    factor: float | None = None
    rdp: float | None = None
    eps_rdp: float | None = None
    alpha_max: float | None = None
    extra: dict = field(default_factory=dict)

    def entry(self, **keys) -> dict:
        """The loss as a report entry (``keys`` first: observer, source, method, distance...)."""
        out = {**keys, "factor": self.factor, "rdp": self.rdp, "eps": self.eps}
        if self.eps_rdp is not None:
            out["eps_rdp"] = self.eps_rdp
        if self.alpha_max is not None:
            out["alpha_max"] = self.alpha_max
        out["conversion"] = self.conversion
        out.update(self.extra)
        return out


@dataclass(frozen=True)
class Units:
    """The units of a plan: its order alpha, delta, sensitivity and noise sigma; a factor f is
    the linear Renyi curve ``alpha * f * Delta^2 / (2 sigma^2)``."""

    alpha: float
    delta: float
    sensitivity: float
    sigma: float

    @property
    def no_privacy(self) -> bool:
        """sigma = 0 (plain gossip): any view that depends on a source at all pins it down."""
        return self.sigma == 0

    @property
    def ldp_rho(self) -> float:
        if self.no_privacy:
            return math.inf
        return self.sensitivity**2 / (2.0 * self.sigma**2)

    def rho(self, factor: float) -> float:
        factor = max(0.0, float(factor))
        return 0.0 if factor == 0 else factor * self.ldp_rho

    def gaussian(self, factor: float) -> Loss:
        """A Gaussian mechanism whose squared Mahalanobis shift is ``2 rho(factor)``: its exact
        (eps, delta), with the RDP-converted figure beside it."""
        return gaussian_of_rho(self.rho(factor), self.delta, self.alpha, factor=factor)

    def rdp_bound(self, factor: float) -> Loss:
        """An upper bound ``alpha * rho(factor)`` on a Renyi curve, converted over every order."""
        return rdp_of_rho(self.rho(factor), self.delta, self.alpha, factor=factor)

    def method(self, method: str):
        """The conversion of a linear-Gaussian family's method: ``exact`` is the view's own
        Gaussian profile, ``paper`` a formula's Renyi bound."""
        return self.gaussian if self.is_gaussian(method) else self.rdp_bound

    @staticmethod
    def is_gaussian(method: str) -> bool:
        """Whether :meth:`method` converts ``method``'s factors as a Gaussian view."""
        return method == "exact"


def gaussian_of_rho(rho: float, delta: float, alpha: float, *, factor=None) -> Loss:
    """A Gaussian mechanism with ``mu^2 = 2 rho``: its exact (eps, delta) (``conversion``
    ``gaussian``), the RDP conversion beside it (``eps_rdp``)."""
    return Loss(
        eps=_eps_gaussian(rho, delta),
        conversion="gaussian",
        factor=None if factor is None else max(0.0, float(factor)),
        rdp=alpha * rho,
        eps_rdp=_eps_rdp(rho, delta),
    )


def rdp_of_rho(rho: float, delta: float, alpha: float, *, factor=None) -> Loss:
    """A Renyi bound ``alpha * rho`` (not known to be a Gaussian mechanism), converted with the
    improved RDP conversion over every order (``conversion`` ``rdp``)."""
    return Loss(
        eps=_eps_rdp(rho, delta),
        conversion="rdp",
        factor=None if factor is None else max(0.0, float(factor)),
        rdp=alpha * rho,
    )


#: The keys of a report entry that carry a loss: what a floor or a cap compares and copies.
LOSS_KEYS = ("factor", "rdp", "eps", "eps_rdp", "alpha_max", "conversion")
_NUMERIC = ("factor", "rdp", "eps", "eps_rdp")


def at_least(entry: dict, floor: dict) -> dict:
    """The entry raised to ``floor``: factor and rdp key by key (the larger; a key the entry
    leaves None stays None, so an eps-only bound stays eps-only), and where the floor's eps is
    larger, the floor's eps with how it was obtained (conversion, eps_rdp, alpha_max: one
    consistent figure). Other keys of ``entry`` are kept. A floor marked ``upper_bound`` (an
    exact row that is an upper bound, not the exact value) passes the mark on where it raised
    anything."""
    out = dict(entry)
    raised = False
    for key in ("factor", "rdp"):
        a, b = entry.get(key), floor.get(key)
        if a is not None and _num(b):
            out[key] = max(float(a), float(b))
            raised = raised or float(b) > float(a)
    if _num(floor.get("eps")) and not (_num(entry.get("eps")) and entry["eps"] >= floor["eps"]):
        raised = True
        for key in ("eps", "eps_rdp", "alpha_max", "conversion"):
            if key in floor:
                out[key] = floor[key]
            else:
                out.pop(key, None)
    if raised and floor.get("upper_bound"):
        out["upper_bound"] = True
    return out


def _num(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def eps_only(eps: float, **extra) -> Loss:
    """A bound stated in eps alone (no Renyi curve)."""
    return Loss(eps=float(eps), conversion="bound", extra=extra)


def theorem(units: Units, factor: float, alpha_max: float | None, *, cap: float | None = None):
    """A theorem's linear Renyi bound ``alpha * rho(factor)`` that holds only at orders
    ``alpha <= alpha_max`` (its condition on sigma): converted at those orders only
    (``conversion`` ``rdp-orders``; ``alpha``: the order used, ``alpha_max``: the condition's
    limit). ``rdp`` at the config's order is None where the condition excludes that order. With
    ``alpha_max <= 1`` no order is allowed: the theorem gives nothing (eps None). ``cap``: a
    bound that always holds (local DP), giving ``eps_usable = min(eps, cap)``."""
    factor = max(0.0, float(factor))
    rho = units.rho(factor)
    eps = order = None
    if alpha_max > 1.0:
        if math.isinf(rho):
            eps = math.inf
        else:
            eps, order = rdp_mod.eps_from_rho_restricted(rho, units.delta, alpha_max)
    extra: dict = {"alpha": order}
    if cap is not None:
        extra["eps_usable"] = float(cap) if eps is None else min(float(eps), float(cap))
    return Loss(
        eps=eps,
        conversion="rdp-orders",
        factor=factor,
        rdp=units.alpha * rho if 1.0 < units.alpha <= alpha_max else None,
        alpha_max=float(alpha_max),
        extra=extra,
    )


def curve(
    units: Units,
    rdp_of_alpha: Callable[[float], float | None],
    alpha_max: float,
    *,
    cap: float | None = None,
) -> Loss:
    """A theorem's Renyi bound that is not linear in alpha (a numerical curve such as private
    ADMM's Theorem 8.12, :func:`coordinator_free.privacy.admm.network_rdp`), known only at orders
    ``1 < alpha <= alpha_max``: ``rdp_of_alpha`` is evaluated at those orders only, and returns
    None at an order its condition excludes (that order is skipped: a strict condition's own
    limit). Converted with the improved conversion minimised over the allowed orders
    (``conversion`` ``rdp-orders``, the order used in ``alpha``, as :func:`theorem`).

    ``factor``: the largest ``rdp(alpha) / (alpha ldp_rho)`` over the orders evaluated, a linear
    envelope of the curve on the allowed orders (exact when ``rdp(alpha)/alpha`` is nondecreasing,
    as for the ADMM curve, whose largest order is evaluated). ``rdp``: the curve at the config's
    order, None where the condition excludes it. With ``alpha_max <= 1`` (or no order left) no
    order is allowed: eps None. ``cap``: a bound that always holds (local DP), ``eps_usable = min(eps, cap)``."""
    alpha_max = float(alpha_max)
    seen: list[float] = []

    def rdp_at(a: float) -> float:
        r = rdp_of_alpha(a)
        if r is None:
            return math.inf
        r = float(r)
        if math.isnan(r) or r < 0:
            raise ValueError(f"Renyi curve at order {a}: {r!r}")
        seen.append(r / a)
        return r

    eps = order = None
    if alpha_max > 1.0:
        eps, order = walk_mod.eps_from_rdp_fn(rdp_at, alpha_max, units.delta)
        if not seen:  # every order the grid tried is excluded
            eps = order = None
        if math.isfinite(alpha_max):
            # the largest order (the envelope's; a strict condition excludes its own limit, then
            # just below it), also a candidate for the conversion when the optimum is there
            top = alpha_max
            r_top = rdp_at(top)
            if math.isinf(r_top):
                top = alpha_max - 1e-9 * (alpha_max - 1.0)
                r_top = rdp_at(top)
            if math.isfinite(r_top) and top > 1.0:
                e_top = max(0.0, rdp_mod._improved(r_top, top, math.log(units.delta)))
                if eps is None or e_top < eps:
                    eps, order = e_top, top
    ldp = units.ldp_rho
    slope = max(seen) if seen else 0.0
    factor = None if not math.isfinite(ldp) or ldp == 0 else slope / ldp
    at_cfg = None
    if 1.0 < units.alpha <= alpha_max:
        r = rdp_of_alpha(units.alpha)
        at_cfg = None if r is None else float(r)
    extra: dict = {"alpha": order}
    if cap is not None:
        extra["eps_usable"] = float(cap) if eps is None else min(float(eps), float(cap))
    return Loss(
        eps=eps,
        conversion="rdp-orders",
        factor=factor,
        rdp=at_cfg,
        alpha_max=alpha_max,
        extra=extra,
    )


#: Conversions computed ahead by :func:`warmed`: (gaussian?, rho, delta) -> eps.
_WARM: dict[tuple[bool, float, float], float] = {}
#: Below this many distinct curves :func:`warmed` leaves the conversions to their calls.
WARM_MIN = 2000
#: Curves per task of :func:`warmed`.
_WARM_TASK = 1000


def _eps_rdp(rho: float, delta: float) -> float:
    hit = _WARM.get((False, rho, delta))
    return _eps_rdp_searched(rho, delta) if hit is None else hit


def _eps_gaussian(rho: float, delta: float) -> float:
    hit = _WARM.get((True, rho, delta))
    return _eps_gaussian_searched(rho, delta) if hit is None else hit


@functools.lru_cache(maxsize=8192)
def _eps_rdp_searched(rho: float, delta: float) -> float:
    # A root search per call; audits ask for the same few values over and over.
    if rho == 0:
        return 0.0
    if not math.isfinite(rho):
        return math.inf
    return rdp_mod.eps_from_rho(rho, delta)[0]


@functools.lru_cache(maxsize=8192)
def _eps_gaussian_searched(rho: float, delta: float) -> float:
    if rho == 0:
        return 0.0
    if not math.isfinite(rho):
        return math.inf
    # The exact profile is never above the RDP conversion of the same curve; min() guards the
    # last bits of the two root searches.
    return min(rdp_mod.eps_gaussian(rho, delta), _eps_rdp(rho, delta))


@contextlib.contextmanager
def warmed(gaussian: Iterable[float], rdp: Iterable[float], delta: float) -> Iterator[None]:
    """Inside the block, the conversions of these curves (``rho`` values: the Gaussian profile
    of ``gaussian``'s, the RDP conversion of ``rdp``'s) are already known: computed ahead by the
    same functions, in one forked child per core (:mod:`coordinator_free.forkwork`), so every
    figure has the same bits as when computed at its call. An audit of a faulty run has a
    distinct curve for nearly every pair and a root search for each (a 512-node audit: half a
    million). Fewer than ``WARM_MIN`` distinct curves are left to their calls."""
    from coordinator_free import forkwork

    # A Gaussian figure carries its RDP conversion beside it (``eps_rdp``): both are needed.
    exact = {float(x) for x in gaussian}
    jobs = sorted(exact | {float(x) for x in rdp})
    if len(jobs) + len(exact) < WARM_MIN or forkwork.cores() < 2:
        yield
        return
    out = forkwork.shared_array((len(jobs), 2))  # the RDP conversion, the Gaussian profile
    tasks = forkwork.chunks(len(jobs), _WARM_TASK)

    def task(i: int) -> None:
        for j in tasks[i]:
            rho = jobs[j]
            out[j, 0] = _eps_rdp(rho, delta)
            if rho in exact:
                out[j, 1] = _eps_gaussian(rho, delta)

    forkwork.fill(task, len(tasks))
    known = {}
    for rho, (eps_rdp, eps_gaussian) in zip(jobs, out.tolist(), strict=True):
        known[(False, rho, delta)] = eps_rdp
        if rho in exact:
            known[(True, rho, delta)] = eps_gaussian
    added = [key for key in known if key not in _WARM]  # an enclosing block's stay its own
    _WARM.update((key, known[key]) for key in added)
    try:
        yield
    finally:
        for key in added:
            del _WARM[key]


def eps_of_rho(rho: float, delta: float, *, gaussian: bool) -> float:
    """The eps of a linear curve ``alpha * rho`` for the accountant's own searches
    (calibration): the Gaussian profile of a Gaussian view, else the RDP conversion."""
    return _eps_gaussian(rho, delta) if gaussian else _eps_rdp(rho, delta)
