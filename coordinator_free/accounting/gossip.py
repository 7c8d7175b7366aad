"""The accountant of every linear-Gaussian gossip view: Muffliato averaging, randomized gossip
and the learning protocols (Muffliato-GD/SGD, D-SGD, the central-DP curator).

A family describes what an observer sees through a :class:`Views` object (its
``accountant.py``): the fault-free factors of every pair under the plan, the factors of the
schedule the logs show, its local-DP factor, and what its numbers mean. A factor is the linear
Renyi curve of the observer's whole view in units of one local-DP release: the view is a
Gaussian mechanism, so ``exact`` is its exact privacy profile (:mod:`accounting.loss`), and
``paper`` a formula's Renyi bound. Everything else is here, the same for every family:

* ``plan_report`` assumes the fault-free schedule;
* ``audit_run`` rebuilds the schedule that really happened from the logs (:func:`replay`: which
  values every node used at every step, missed deadlines included, and which messages every
  observer saw, late ones included), then computes the same quantities for it;
* ``planned_losses`` / ``worst_case_losses``: what the audit's floor needs;
* ``calibrate``: the noise that meets a target.

Nothing here imports a family: the family hands its views in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from coordinator_free import graphs, progress
from coordinator_free.accounting import loss, summary
from coordinator_free.accounting.core import (
    METHODS,
    AuditError,
    audit_head,
    budget_factor,
    read_logs,
    scan_exchanges,
    smallest_sigma,
    units_of,
)
from coordinator_free.viewlog import value_digest

# Up to this many nodes the audit always replays the realised schedule with the general
# (schedule-agnostic) computation; above it, a fault-free schedule uses the fast plan path.
GENERAL_AUDIT_MAX_N = 64


class Views:
    """What a gossip family says about what its observers see. Subclasses override
    :meth:`plan_factors` and :meth:`realised_factors`, and the rest where it differs."""

    def ldp_factor(self, plan) -> float:
        """The local-DP loss of the whole run in units of one Gaussian mechanism: 1 for one
        averaging run, R for R rounds of fresh noise."""
        return 1.0

    def note(self, plan) -> str | None:
        """What the per-pair numbers of the protocol mean, where they need saying."""
        return None

    def report_fields(self, plan) -> dict:
        """Keys a plan report of this family adds (rounds, clock rates...)."""
        return {}

    def central(self, plan) -> bool:
        """True for a protocol without peers or view logs (the curator): every node sees the
        released model, so every pair gets the run's local-DP loss."""
        return False

    def plan_factors(
        self, plan, method: str, *, sources=None, observers=None, bounds=None
    ) -> np.ndarray:
        """Fault-free factors ``F[i, j]`` of source ``sources[j]`` towards ``observers[i]``.
        ``bounds``: a list the family appends to the observers whose row is an upper bound on
        its exact factors, not the exact ones (:func:`bounds_note` says why); a family whose
        rows are always what its method says leaves it empty."""
        raise NotImplementedError

    def realised_factors(self, plan, rp: Replay, v: int, method: str, notes: list) -> np.ndarray:
        """Observer v's factors for the schedule the logs show (``rp``)."""
        raise NotImplementedError

    def prepare(self, plan, rp: Replay, observers: list[int]) -> None:
        """Work the audit will ask :meth:`realised_factors` for, for these observers, done ahead
        (spread over the cores, or shared between observers); nothing by default."""

    def bind(self, plan, logs: dict) -> tuple[object, list[dict]]:
        """The plan the logs' schedule is read with (hidden graphs: as the logs show them)."""
        return plan, []


def ldp_entry(views: Views, plan, method: str = "exact") -> dict:
    """Local DP, the loss of an observer that sees each of a node's noisy releases: a Gaussian
    mechanism (R of them for R rounds), in the method's conversion (``paper`` reports convert
    their formulas and local DP alike with the RDP conversion)."""
    return units_of(plan).method(method)(views.ldp_factor(plan)).entry()


# ----------------------------------------------------------------------------------------- plan


def plan_report(views: Views, cfg, plan, *, source: int | None, method: str) -> dict:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    convert = units_of(plan).method(method)
    base = {
        "alpha": plan.alpha,
        "delta": plan.delta,
        "method": method,
        "protocol": cfg.protocol.name,
        "n": plan.n,
        "steps": plan.steps,
        "accelerated": plan.accelerated,
        "spectral_gap": plan.spectral_gap,
        "sigma": plan.sigma,
        "sensitivity": plan.sensitivity,
        "ldp": ldp_entry(views, plan, method),
        **views.report_fields(plan),
    }
    if source is not None and not 0 <= source < plan.n:
        raise AuditError(f"--source {source} is not a node id (0..{plan.n - 1})")
    bounds: list[int] = []
    if source is not None:
        F = views.plan_factors(plan, method, sources=[source], bounds=bounds)  # F[v, 0]
    else:
        F = views.plan_factors(plan, method, bounds=bounds)  # F[v, u], all pairs
    upper = set(bounds)
    note = views.note(plan)
    if upper:
        note = "; ".join(x for x in (note, bounds_note(upper, plan.n)) if x)
        base["upper_bounds"] = sorted(upper)
    if note:
        base["accounting"] = note
    if source is not None:
        dist = graphs.distances_from(plan.graph, source)
        losses = [
            _marked(convert(float(F[v, 0])).entry(observer=v, distance=int(dist[v])), v in upper)
            for v in range(plan.n)
            if v != source
        ]
        return {**base, "source": source, "losses": losses}
    return {**base, "source": None, **mark_summary(summarise(views, plan, F, convert), upper)}


def mark_summary(rep: dict, upper: set[int]) -> dict:
    """An all-pairs summary with the observers of ``upper`` (upper-bound rows) said: its worst
    pair and its largest observer mean marked where their observer is one."""
    for key in ("worst_pair", "max_observer_mean"):
        entry = rep.get(key)
        if isinstance(entry, dict) and entry.get("observer") in upper:
            entry["upper_bound"] = True
    return rep


def bounds_note(upper: set[int], n: int) -> str:
    """Why the rows of ``upper`` are upper bounds (:meth:`Views.plan_factors`)."""
    some = ", ".join(map(str, sorted(upper)[:12])) + (", ..." if len(upper) > 12 else "")
    return (
        f"'exact' for {len(upper)} of {n} observers ({some}) is an upper bound on their exact "
        "loss, not the exact value: a new direction of their views fell in the band where "
        "float64 cannot tell a real direction from roundoff and was kept, or their schedule is "
        "past exact arithmetic and was bounded through its Krylov space; either can only raise "
        "their loss, and their entries say upper_bound (a one-source table marks them +)"
    )


def ambiguous_note(v: int) -> dict:
    """The audit's note for an observer whose exact row is an upper bound because a direction
    float64 cannot size was kept."""
    return {
        "observer": v,
        "kind": "exact-upper-bound",
        "message": f"'exact' for observer {v} is an upper bound on the exact loss, not the exact "
        "value: a new direction of its view fell in the band where float64 cannot tell a real "
        "direction from roundoff, and was kept (it can only raise the loss)",
    }


def _marked(entry: dict, upper: bool) -> dict:
    if upper:
        entry["upper_bound"] = True
    return entry


def summarise(views: Views, plan, F: np.ndarray, convert) -> dict:
    """Mean/max by graph distance, the worst pair, and the mean loss per observer."""
    return summary.of_factors(F, graphs.all_distances(plan.graph), convert, views.ldp_factor(plan))


# ------------------------------------------------------------------- the floor of every audit


#: The last few plans' factors, each with the observers whose rows are upper bounds.
_PLANNED_CACHE: dict[tuple, tuple[np.ndarray, frozenset[int]]] = {}


def all_plan_factors(views: Views, cfg, plan, method: str) -> np.ndarray:
    """``views.plan_factors(plan, method)`` for every pair, remembered for the last few plans
    (an audit of damaged logs needs them; the fault-free schedule depends on the config alone,
    and the gossip matrix is part of the key so a changed graph file is never mistaken for the
    old one)."""
    return all_plan_factors_bounded(views, cfg, plan, method)[0]


def all_plan_factors_bounded(views: Views, cfg, plan, method: str) -> tuple[np.ndarray, frozenset]:
    """:func:`all_plan_factors` and the observers whose rows are upper bounds
    (:meth:`Views.plan_factors`), remembered together."""
    W = getattr(plan, "W", None)
    fingerprint = None if W is None else value_digest(np.asarray(W, dtype=np.float64))
    try:
        key = (type(views).__name__, cfg, method, plan.steps, fingerprint)
        hash(key)
    except TypeError:
        key = None
    found = None if key is None else _PLANNED_CACHE.get(key)
    if found is None:
        bounds: list[int] = []
        found = (views.plan_factors(plan, method, bounds=bounds), frozenset(bounds))
        if key is not None:
            if len(_PLANNED_CACHE) >= 8:
                _PLANNED_CACHE.pop(next(iter(_PLANNED_CACHE)))
            _PLANNED_CACHE[key] = found
    return found


def planned_losses(views: Views, cfg, plan, observers: list[int]) -> dict[int, dict]:
    """Observer -> {(source, method): loss entry with its distance} under the fault-free plan:
    the numbers ``cfree plan`` gives for each pair."""
    u = units_of(plan)
    out: dict[int, dict[tuple[int, str], dict]] = {v: {} for v in observers}
    for m in METHODS:
        F, upper = all_plan_factors_bounded(views, cfg, plan, m)  # F[v, u]
        convert = u.method(m)
        for v in observers:
            dist = graphs.distances_from(plan.graph, v)
            for src in range(plan.n):
                if src != v:
                    entry = convert(float(F[v, src])).entry(distance=int(dist[src]))
                    out[v][(src, m)] = _marked(entry, v in upper)
    return out


def worst_case_losses(views: Views, cfg, plan, observers: list[int]) -> dict[int, dict]:
    """The losses of observers about which nothing is known (no usable log): for each pair the
    larger of the planned loss and the local-DP loss of the source's releases. Every message a
    gossip observer can see is a function of the nodes' noisy releases, so it never learns more
    than local DP about a source: one Gaussian mechanism for averaging and randomized gossip, R
    of them for R learning rounds (the curator's plan already is R-fold local DP)."""
    ldp = {m: ldp_entry(views, plan, m) for m in METHODS}
    planned = planned_losses(views, cfg, plan, observers)
    for per in planned.values():
        for key, p in per.items():
            per[key] = loss.at_least(p, ldp[key[1]])
    return planned


# ---------------------------------------------------------------------------------------- audit


@dataclass
class Replay:
    """The realised schedule rebuilt from the logs."""

    steps: list[tuple[np.ndarray, float]]
    received: dict[int, set[tuple[int, int]]]  # observer -> {(step, sender)} it saw
    logged: set[int]  # nodes whose log could be read
    fault_free: bool
    integrity: list[dict]
    missed: int = 0  # values the logs say were missed at their step ("miss" records)
    late: int = 0  # values the logs say came only after their step
    # The plan the schedule was rebuilt with: hidden graphs bound to the graphs the logs show.
    plan: object = None
    # What a family's accountant computes once for the schedule and shares between observers.
    shared: dict = field(default_factory=dict, repr=False, compare=False)


def replay(run_dir: Path, plan, views: Views) -> Replay:
    n, T = plan.n, plan.steps
    integrity: list[dict] = []
    logs = read_logs(run_dir, plan, integrity)
    plan, found = views.bind(plan, logs)
    integrity.extend(found)
    scan = scan_exchanges(logs, plan, integrity)
    got, received, logged = scan.used, scan.seen, set(logs)
    steps: list[tuple[np.ndarray, float]] = []
    # Any missing, damaged or unfinished log means the schedule is not fully known: never
    # treat such a run as fault-free.
    fault_free = len(logged) == n and not integrity
    # Steps whose realised rows are the same share one matrix (a fault-free fixed-W run holds
    # one n x n matrix, not T of them).
    shared: dict[tuple, np.ndarray] = {}
    for t in range(T):
        rows = []
        for v in range(n):
            row = plan.row_at(v, t)
            if v in got:
                used = {w for w in got[v].get(t, set()) if w in row}
            else:
                used = set(plan.partners_at(v, t))  # no log: assume it used every partner
            if used != set(plan.partners_at(v, t)):
                fault_free = False
            rows.append(tuple(graphs.realised_row(row, v, used).items()))
        key = tuple(rows)
        M = shared.get(key)
        if M is None:
            M = np.zeros((n, n))
            for v, r in enumerate(rows):
                for w, wt in r:
                    M[v, w] = wt
            shared[key] = M
        steps.append((M, plan.gamma_at(t)))
    missed = late = 0
    for v in logged:
        full = {(t, w) for t in range(T) for w in plan.partners_at(v, t)}
        if received[v] != full:
            fault_free = False
        on_time = {(t, w) for t, ws in got[v].items() for w in ws}
        missed += len(scan.missed.get(v, ()))
        late += len(received[v] - on_time)
    return Replay(
        steps=steps,
        received=received,
        logged=logged,
        fault_free=fault_free,
        integrity=integrity,
        missed=missed,
        late=late,
        plan=plan,
    )


def _observer_losses(plan, u, v: int, per_method: dict, made: dict, notes: list) -> dict:
    """Observer v's entry of an audit: every source's loss by method, converted once per
    (method, factor) (``made``), and a note where Eq. (6) is below the exact loss."""
    dist = graphs.distances_from(plan.graph, v)
    losses = []
    for src in range(plan.n):
        if src == v:
            continue
        for m in METHODS:
            f = float(per_method[m][src])
            made_f = made.get((m, f))
            if made_f is None:
                made_f = made[(m, f)] = u.method(m)(f)
            losses.append(made_f.entry(source=src, method=m, distance=int(dist[src])))
        fe, fp = float(per_method["exact"][src]), float(per_method["paper"][src])
        if fp < fe - 1e-9:
            notes.append(
                {
                    "observer": v,
                    "source": src,
                    "kind": "paper-below-exact",
                    "message": f"Eq. (6) gives factor {fp:.4g} for {src}->{v} but the exact "
                    f"loss is {fe:.4g}",
                }
            )
    return {"observer": v, "losses": losses}


def audit_run(views: Views, run_dir: Path, cfg, plan, observers: list[int] | None = None) -> dict:
    if views.central(plan):
        return central_audit(views, run_dir, plan, observers)
    for v in observers or ():
        if not 0 <= v < plan.n:
            raise AuditError(f"observer {v} is not a node id (0..{plan.n - 1})")
    rp = replay(run_dir, plan, views)
    plan = rp.plan
    u = units_of(plan)
    # An observer without a readable log has no realised view: it is left out here, and the
    # generic audit (accounting.audit.audit_run) reports its worst case.
    wanted = sorted(rp.logged) if observers is None else [v for v in observers if v in rp.logged]
    use_plan = rp.fault_free and plan.n > GENERAL_AUDIT_MAX_N
    factors: dict[str, np.ndarray] = {}
    bounded: dict[str, set[int]] = {}
    if use_plan:
        for m in METHODS:
            bounds: list[int] = []
            factors[m] = views.plan_factors(plan, m, observers=wanted, bounds=bounds)
            bounded[m] = set(bounds)
    else:
        views.prepare(plan, rp, wanted)
    out_obs = []
    notes: list[dict] = []
    # Every observer's factors first (with the notes each gives), then every pair's loss.
    found: list[tuple[dict[str, np.ndarray], list[dict]]] = []
    for i, v in enumerate(wanted):
        per_method, mine = {}, []
        for k, m in enumerate(METHODS):
            progress.tick(i * len(METHODS) + k, len(wanted) * len(METHODS), f"{m} loss, observer")
            if use_plan:
                per_method[m] = factors[m][i]
                if v in bounded[m]:
                    mine.append(ambiguous_note(v))
            else:
                per_method[m] = views.realised_factors(plan, rp, v, m, mine)
        found.append((per_method, mine))
    # A loss is a function of its method and factor, and an audit's pairs share few factors
    # (a symmetric graph: one per distance): each is converted once. A faulty run has a factor
    # of its own for nearly every pair: their conversions are computed ahead, on every core.
    made: dict[tuple[str, float], loss.Loss] = {}
    curves: dict[bool, set[float]] = {True: set(), False: set()}
    for m in METHODS if found else ():  # distinct factors first: a symmetric run has a few
        distinct = np.unique(np.concatenate([np.asarray(pm[m], dtype=float) for pm, _ in found]))
        curves[u.is_gaussian(m)].update(u.rho(f) for f in distinct.tolist())
    with loss.warmed(curves[True], curves[False], u.delta):
        for v, (per_method, mine) in zip(wanted, found, strict=True):
            notes.extend(mine)
            seen = _observer_losses(plan, u, v, per_method, made, notes)
            for x in seen["losses"]:  # an upper-bound row, said on each of its entries
                if v in bounded.get(x.get("method"), ()):
                    x["upper_bound"] = True
            out_obs.append(seen)
    progress.tick(len(wanted) * len(METHODS), len(wanted) * len(METHODS), "paper loss, observer")
    return {
        **audit_head(run_dir, cfg.protocol.name, plan, steps=plan.steps, fault_free=rp.fault_free),
        "ldp": ldp_entry(views, plan),
        "accounting": views.note(plan),
        "observers": out_obs,
        # The faults the logs show: values missed at their step, values that came late.
        "realised": {"missed": rp.missed, "late": rp.late},
        # False when a log is missing, damaged or unfinished: the schedule of the nodes
        # concerned was partly assumed (a missing log: every value used), see "integrity".
        "complete": not rp.integrity,
        "integrity": rp.integrity,
        "notes": notes,
    }


def central_audit(views: Views, run_dir: Path, plan, observers: list[int] | None) -> dict:
    """A protocol without peers or view logs (the trusted curator): every node sees the
    released model, so every pair gets the run's local-DP loss."""
    u = units_of(plan)
    wanted = list(range(plan.n)) if observers is None else observers
    for v in wanted:
        if not 0 <= v < plan.n:
            raise AuditError(f"observer {v} is not a node id (0..{plan.n - 1})")
    dist = graphs.all_distances(plan.graph)
    lf = views.ldp_factor(plan)
    loss = {m: u.method(m)(lf) for m in METHODS}
    out_obs = [
        {
            "observer": v,
            "losses": [
                loss[m].entry(source=src, method=m, distance=int(dist[v, src]))
                for src in range(plan.n)
                if src != v
                for m in METHODS
            ],
        }
        for v in wanted
    ]
    return {
        **audit_head(run_dir, plan.protocol, plan, steps=0, fault_free=True),
        "ldp": ldp_entry(views, plan),
        "accounting": views.note(plan),
        "observers": out_obs,
        "complete": True,
        "integrity": [],
        "notes": [],
    }


# ----------------------------------------------------------------------------------- calibrate


def calibrate(views: Views, cfg, target_eps: float, *, method: str, budget: str, make_plan) -> dict:
    """The smallest noise ``privacy.sigma`` whose (eps, delta) loss meets ``target_eps``, where
    the loss is that of the worst pair (``budget="worst"``: every pair is within the target) or
    of the mean over pairs (``budget="mean"``, the Muffliato paper's summary, not a guarantee).
    ``make_plan``: the family's plan maker (the plan depends on sigma through ``steps="auto"``).

    The loss factors depend on sigma only through the number of steps (``steps = "auto"``), so
    they are computed once per distinct schedule; eps is then decreasing in sigma and a
    bisection on log sigma finds the calibration to a relative 1e-9.
    """
    cache: dict[tuple, np.ndarray] = {}
    bounded: dict[tuple, set[int]] = {}

    def at(sigma: float):
        c = dataclasses.replace(cfg, privacy=dataclasses.replace(cfg.privacy, sigma=sigma))
        plan = make_plan(c)
        key = (plan.steps, getattr(plan, "gossip_steps", None))
        if key not in cache:
            bounds: list[int] = []
            F = views.plan_factors(plan, method, bounds=bounds)
            bounded[key] = set(bounds)
            # A paper formula above local DP is not a usable bound there: local DP is.
            cache[key] = np.minimum(F, views.ldp_factor(plan)) if method == "paper" else F
        f, u, v = budget_factor(cache[key], budget)
        return units_of(plan).method(method)(f).eps, plan, f, u, v

    hi = smallest_sigma(lambda sigma: at(sigma)[0], target_eps, cfg.sensitivity)
    eps, plan, f, u, v = at(hi)
    F = cache[(plan.steps, getattr(plan, "gossip_steps", None))]
    worst_f, wu, wv = budget_factor(F, "worst")
    mean_f = budget_factor(F, "mean")[0]
    convert = units_of(plan).method(method)
    upper = bounded[(plan.steps, getattr(plan, "gossip_steps", None))]
    note = views.note(plan)
    if upper:  # the calibration rests on upper bounds there: sigma errs high, never low
        note = "; ".join(x for x in (note, bounds_note(upper, plan.n)) if x)
    return {
        "protocol": cfg.protocol.name,
        "method": method,
        "budget": budget,
        "target_eps": target_eps,
        "delta": plan.delta,
        "sigma": hi,
        "sensitivity": plan.sensitivity,
        "steps": plan.steps,
        "eps": eps,
        "binding": (
            _marked(convert(f).entry(source=u, observer=v), v in upper)
            if budget == "worst"
            else _marked(convert(f).entry(mean_over_pairs=True), bool(upper))
        ),
        "worst_pair": _marked(convert(worst_f).entry(source=wu, observer=wv), wv in upper),
        "mean_over_pairs": _marked(convert(mean_f).entry(), bool(upper)),
        "ldp": ldp_entry(views, plan, method),
        "accounting": note,
        **({"upper_bounds": sorted(upper)} if upper else {}),
    }
