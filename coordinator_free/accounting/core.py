"""Generic accounting machinery, the same for every protocol family: the units every loss is
reported in, reading and checking the view logs of a run directory, the sigma bisection of
calibration, and writing reports.

Both plans and audits produce per-pair losses u -> v in the same units:

* ``factor``: the multiplier of the local-DP loss, in [0, 1] for ``exact``;
* ``rdp``: the Rényi divergence at the config's order alpha, alpha * Delta^2 / (2 sigma^2) * factor;
* ``eps``: the (eps, delta)-DP value at the config's delta, made by ``accounting.loss`` (the
  exact Gaussian profile of a Gaussian view, else the named conversion of a bound).

Nothing here names a family: each family's accountant (``families/<family>/accountant.py``)
builds on it, and ``accounting.audit`` reaches the families through the registry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from coordinator_free import progress, rundir
from coordinator_free.accounting.loss import Units
from coordinator_free.errors import AuditError
from coordinator_free.viewlog import both_digests, read_viewlog, same_digest

__all__ = [
    "AuditError",
    "BUDGETS",
    "METHODS",
    "Units",
    "argmax_tied",
    "budget_factor",
    "read_logs",
    "smallest_sigma",
    "units_of",
    "write_json",
]

METHODS = ("exact", "paper")


BUDGETS = ("worst", "mean")


def units_of(plan) -> Units:
    """The units of a plan: its order alpha, delta, sensitivity and noise sigma."""
    return Units(alpha=plan.alpha, delta=plan.delta, sensitivity=plan.sensitivity, sigma=plan.sigma)


def read_logs(run_dir: Path, plan, integrity: list[dict]) -> dict:
    """Every node's view log that can be read and belongs to this run, checked against the
    plan's public parameters; every problem goes to ``integrity``."""
    run_id = _run_id(run_dir)
    expected_params = plan.public_params()
    logs = {}
    for v in range(plan.n):
        progress.tick(v, plan.n, "reading view log")
        path = rundir.log_path(run_dir, v)
        if not path.exists():
            integrity.append(
                {"node": v, "kind": "missing-log", "message": f"{path} does not exist"}
            )
            continue
        try:
            vl = read_viewlog(path)
        except OSError as exc:
            integrity.append(
                {"node": v, "kind": "unreadable-log", "message": f"{path}: {exc.strerror or exc}"}
            )
            continue
        for p in vl.problems:
            integrity.append({"node": v, "kind": p.kind, "offset": p.offset, "message": p.message})
        if vl.header is None:
            continue
        if vl.header.get("node") != v or (run_id is not None and vl.header.get("run_id") != run_id):
            integrity.append(
                {
                    "node": v,
                    "kind": "wrong-log",
                    "message": f"{path} is the log of node {vl.header.get('node')!r} of run "
                    f"{vl.header.get('run_id')!r}, not of node {v} of this run; ignored",
                }
            )
            continue
        params = vl.header.get("params")
        if not isinstance(params, dict):
            continue  # a "bad-header" problem already says so; the log is not used
        for key, want in expected_params.items():
            have = params.get(key)
            if isinstance(want, float) and isinstance(have, float):
                same = abs(want - have) <= 1e-12 * max(1.0, abs(want))
            else:
                try:  # a damaged header may hold anything (an array compares element-wise)
                    same = bool(have == want)
                except (TypeError, ValueError):
                    same = False
            if not same:
                integrity.append(
                    {
                        "node": v,
                        "kind": "param-mismatch",
                        "message": f"{key}: log has {have!r}, config gives {want!r}",
                    }
                )
        logs[v] = vl
    return logs


def _run_id(run_dir: Path) -> str | None:
    from coordinator_free.roster import RosterError, load_roster

    try:
        return load_roster(rundir.roster_path(run_dir)).run_id
    except (OSError, RosterError):
        return None


def audit_head(run_dir, protocol: str, plan, *, steps, fault_free: bool) -> dict:
    """The keys every audit report starts with (the contract of audit.json): the run, the
    protocol, the plan's order, delta and size, its steps and whether it ran fault-free."""
    return {
        "run_dir": str(run_dir),
        "protocol": protocol,
        "alpha": plan.alpha,
        "delta": plan.delta,
        "n": plan.n,
        "steps": steps,
        "fault_free": fault_free,
    }


def write_json(path: Path, obj: dict) -> None:
    """A report as JSON, written atomically (rundir.write_json)."""
    rundir.write_json(path, obj)


#: Values within this relative distance of the maximum are tied (see ``argmax_tied``).
TIE_RTOL = 1e-9


def argmax_tied(a) -> tuple[int, ...]:
    """The index of the maximum of ``a``, the first in row-major order among values within a
    relative ``TIE_RTOL`` of it. Symmetric graphs give many equal losses that differ only in
    their last bits, and those bits differ between CPUs and BLAS builds: the plain argmax
    would name a different "worst pair" on each machine."""
    a = np.asarray(a, dtype=float)
    m = float(np.max(a))
    i = int(np.flatnonzero(a >= m - TIE_RTOL * abs(m))[0]) if np.isfinite(m) else int(np.argmax(a))
    return tuple(int(x) for x in np.unravel_index(i, a.shape))


def budget_factor(F: np.ndarray, budget: str) -> tuple[float, int, int]:
    """The factor that sets the budget: the worst pair (and which), or the mean over pairs."""
    n = F.shape[0]
    off = ~np.eye(n, dtype=bool)
    if budget == "worst":
        masked = np.where(off, F, -np.inf)
        v, u = argmax_tied(masked)
        return float(F[v, u]), int(u), int(v)
    return float(F[off].mean()), -1, -1


def smallest_sigma(eps_at, target_eps: float, sensitivity: float) -> float:
    """The smallest sigma in [1e-6, 1e6] x sensitivity with ``eps_at(sigma) <= target_eps``
    (eps decreasing in sigma), by bisection on log sigma to a relative 1e-9."""

    lo, hi = 1e-6 * sensitivity, 1e6 * sensitivity
    if eps_at(hi) > target_eps:
        raise AuditError(f"no sigma up to {hi:g} reaches eps = {target_eps:g}")
    if eps_at(lo) <= target_eps:
        return lo
    while hi / lo > 1 + 1e-9:
        mid = math.sqrt(lo * hi)
        if eps_at(mid) > target_eps:
            lo = mid
        else:
            hi = mid
    return hi


def is_int(x) -> bool:
    """An integer field of a log record (a bool is not one)."""
    return isinstance(x, int) and not isinstance(x, bool)


def bad_record(node: int, record: dict, name: str, why: str) -> dict:
    """The integrity finding of a record whose field ``name`` is missing or of the wrong type:
    it names the node, the record's seq and the field, and the record is ignored."""
    seq = record.get("seq")
    seq = seq if is_int(seq) else None
    return {
        "node": node,
        "kind": "bad-record",
        "seq": seq,
        "field": name,
        "message": f"{record.get('k')!r} record seq {seq}: field {name!r} {why}; record ignored",
    }


def _int_field(node: int, r: dict, name: str, integrity: list[dict]) -> bool:
    x = r.get(name)
    if is_int(x):
        return True
    what = "is missing" if name not in r else f"is {type(x).__name__} {x!r:.40}, not an integer"
    integrity.append(bad_record(node, r, name, what))
    return False


def _value_digest(node: int, r: dict, integrity: list[dict]) -> str | tuple | None:
    """The digest of the value a recv or late record names: its ``digest`` field, else the
    digests of its ``value`` in both forms (logs that keep values; ``viewlog.both_digests``).
    None (with a finding) for a record that names no usable value."""
    if "digest" in r:
        dg = r["digest"]
        if isinstance(dg, str):
            return dg
        integrity.append(bad_record(node, r, "digest", f"is {type(dg).__name__}, not a string"))
        return None
    if "value" not in r:
        integrity.append(bad_record(node, r, "digest", "is missing (and so is 'value')"))
        return None
    value = r["value"]
    if not (isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "fiu"):
        integrity.append(bad_record(node, r, "value", "is not a one-dimensional numeric array"))
        return None
    return both_digests(np.asarray(value, dtype=np.float64))


@dataclass
class ExchangeScan:
    """What the exchange records (``send``, ``recv``, ``late``, ``miss``, ``finished``) of every
    readable log say, after the integrity checks every family gets."""

    used: dict[int, dict[int, set[int]]]  # node -> step -> senders whose value it used on time
    seen: dict[int, set[tuple[int, int]]]  # node -> {(step, sender)} it received, late included
    finished: set[int]  # nodes whose log ends with the run finished
    # node -> {(step, sender)} whose value its log says it missed at the step
    missed: dict[int, set[tuple[int, int]]] = field(default_factory=dict)


@dataclass
class _NodeExchanges:
    """What one node's exchange records say, while its log is read (see :func:`scan_exchanges`)."""

    per_step: dict[int, set[int]] = field(default_factory=dict)  # step -> senders used on time
    seen: set[tuple[int, int]] = field(default_factory=set)  # (step, sender), late included
    on_time: set[tuple[int, int]] = field(default_factory=set)
    miss: set[tuple[int, int]] = field(default_factory=set)
    dups: list[tuple[dict, int, int]] = field(default_factory=list)  # (record, step, peer)
    finished: bool = False


def _shown(pairs: list[tuple[int, int]]) -> str:
    """The first five (step, sender) pairs of a finding's message, and how many more."""
    shown = ", ".join(f"step {t} from {w}" for t, w in pairs[:5])
    more = f" and {len(pairs) - 5} more" if len(pairs) > 5 else ""
    return f"{shown}{more}"


def _exchange_record(
    v: int,
    r: dict,
    plan,
    node: _NodeExchanges,
    sends: dict,
    recvs: dict,
    integrity: list[dict],
) -> None:
    """One ``send``, ``recv``, ``late`` or ``miss`` record of node v, checked and then noted in
    ``node``, ``sends`` or ``recvs`` (a record with a problem is reported and ignored)."""
    k = r["k"]
    if not (_int_field(v, r, "step", integrity) and _int_field(v, r, "peer", integrity)):
        return
    t, w = r["step"], r["peer"]
    if not (0 <= t < plan.steps and w in plan.partners_at(v, t)):
        integrity.append(
            {
                "node": v,
                "kind": "impossible-record",
                "seq": r.get("seq"),
                "message": f"{k} record seq {r.get('seq')} names step {t!r} and "
                f"peer {w!r}, impossible for node {v}; ignored",
            }
        )
        return
    if k == "send":
        if not isinstance(r.get("digest"), str):
            integrity.append(bad_record(v, r, "digest", "is missing or not a string"))
            return
        sends[(t, v, w)] = r["digest"]
        return
    if k == "miss":
        if not isinstance(r.get("reason"), str):
            integrity.append(bad_record(v, r, "reason", "is missing or not a string"))
            return
        node.miss.add((t, w))
        return
    if k == "late" and not _int_field(v, r, "now", integrity):
        return
    dg = _value_digest(v, r, integrity)
    if dg is None:
        return
    if k == "recv":
        if (t, w) in node.on_time:
            integrity.append(
                {
                    "node": v,
                    "kind": "duplicate-record",
                    "seq": r.get("seq"),
                    "message": f"recv record seq {r.get('seq')}: a second value "
                    f"from {w} at step {t}; ignored",
                }
            )
            return
        node.on_time.add((t, w))
        node.per_step.setdefault(t, set()).add(w)
        recvs[(t, w, v)] = dg
    node.seen.add((t, w))


def _read_exchanges(
    v: int, records, plan, sends: dict, recvs: dict, integrity: list[dict]
) -> _NodeExchanges:
    """Node v's exchange, ``duplicate`` and ``finished`` records, in log order."""
    node = _NodeExchanges()
    for r in records:
        k = r.get("k")
        if k in ("recv", "late", "send", "miss"):
            _exchange_record(v, r, plan, node, sends, recvs, integrity)
        elif k == "duplicate" and "kind" not in r:
            if is_int(r.get("step")) and is_int(r.get("peer")):
                node.dups.append((r, r["step"], r["peer"]))
        elif k == "finished":
            if r.get("steps") != plan.steps or not is_int(r.get("steps")):
                integrity.append(
                    bad_record(
                        v, r, "steps", f"is {r.get('steps')!r}, the plan has {plan.steps} steps"
                    )
                )
                continue
            node.finished = True
    return node


def _check_node_exchanges(v: int, node: _NodeExchanges, plan, integrity: list[dict]) -> None:
    """The findings of one node's log on its own: ``unfinished``, ``contradictory-records``
    and, for a finished log, ``missing-exchange-record``."""
    if not node.finished:
        integrity.append(
            {
                "node": v,
                "kind": "unfinished",
                "message": "the log ends before the run finished (crash or kill)",
            }
        )
    for t, w in sorted(node.on_time & node.miss):
        integrity.append(
            {
                "node": v,
                "kind": "contradictory-records",
                "message": f"step {t}: the value from {w} is logged both received and missed",
            }
        )
    for r, t, w in node.dups:
        if (t, w) not in node.on_time:
            integrity.append(
                {
                    "node": v,
                    "kind": "contradictory-records",
                    "seq": r.get("seq"),
                    "message": f"duplicate record seq {r.get('seq')}: a second copy of the "
                    f"value from {w} at step {t}, whose first copy is not in the log",
                }
            )
    if node.finished:
        silent = [
            (t, w)
            for t in range(plan.steps)
            for w in plan.partners_at(v, t)
            if (t, w) not in node.on_time and (t, w) not in node.miss
        ]
        if silent:
            integrity.append(
                {
                    "node": v,
                    "kind": "missing-exchange-record",
                    "message": f"the log is finished but says neither received nor missed "
                    f"for {len(silent)} value(s): {_shown(silent)}",
                }
            )


def _check_recvs_against_sends(logs: dict, sends: dict, recvs: dict, integrity: list[dict]):
    """``unmatched-recv`` and ``digest-mismatch``: every value received from a node whose log
    was read, against what that node logged sending."""
    for (t, w, v), dg in recvs.items():
        if w in logs and sends.get((t, w, v)) is None:
            integrity.append(
                {
                    "node": v,
                    "kind": "unmatched-recv",
                    "message": f"step {t}: value from {w} has no send record in {w}'s log",
                }
            )
        elif w in logs and not same_digest(sends[(t, w, v)], dg):
            integrity.append(
                {
                    "node": v,
                    "kind": "digest-mismatch",
                    "message": f"step {t}: value from {w} differs from what {w} logged sending",
                }
            )


def _check_unacknowledged(
    sends: dict, finished: set[int], seen: dict[int, set[tuple[int, int]]], integrity: list[dict]
) -> None:
    """``unacknowledged-send``: values a finished node logged sending to a finished partner
    that the partner's log never received, one finding per receiver in node order."""
    unacked: dict[int, list[tuple[int, int]]] = {}
    for t, w, v in sends:
        if v in finished and w in finished and (t, w) not in seen[v]:
            unacked.setdefault(v, []).append((t, w))
    for v, lost in sorted(unacked.items()):
        lost.sort()
        integrity.append(
            {
                "node": v,
                "kind": "unacknowledged-send",
                "message": f"{len(lost)} value(s) logged sent to {v} by finished partners never "
                f"arrived in {v}'s finished log: {_shown(lost)}",
            }
        )


def scan_exchanges(logs: dict, plan, integrity: list[dict]) -> ExchangeScan:
    """The integrity checks of the exchange records, the same for every family that exchanges
    values at numbered steps (gossip averaging, randomized gossip, learning, DECOR):

    * ``bad-record``: a record whose fields are missing or of the wrong type (ignored);
    * ``impossible-record``: a send, recv, late or miss record whose step is not in
      0..steps-1 or whose peer is not the node's partner at that step (ignored);
    * ``unfinished``: a log that ends before the node finished (a crash, a kill, a truncation);
    * ``unmatched-recv``: a value received from a node whose log has no matching send;
    * ``digest-mismatch``: a value received that differs from what its sender logged sending;
    * ``duplicate-record``: a value received twice at the same step from the same partner (the
      step engine logs a second copy as ``duplicate``);
    * ``contradictory-records``: a value both received on time and missed, or a duplicate of a
      value never received;
    * ``missing-exchange-record``: a finished log that says neither that it received nor that it
      missed a partner's value at some step (a finished node logs one or the other for every
      partner of every step);
    * ``unacknowledged-send``: a value a finished node logged sending to a finished partner that
      the partner's log never received, on time or late (a message lost or still in flight when
      the partner stopped: never on a fault-free run).

    A record that holds a value without its digest is checked by the value's digests in both
    forms (``viewlog.both_digests``). Every problem is appended to ``integrity``; a record with
    a problem is ignored.
    The findings come node by node (each log's records in order, then the log's own checks),
    then the received values against the sends, then the unacknowledged sends."""
    used: dict[int, dict[int, set[int]]] = {}
    seen_all: dict[int, set[tuple[int, int]]] = {}
    finished_nodes: set[int] = set()
    sends: dict[tuple[int, int, int], str | None] = {}  # (step, sender, receiver) -> digest
    recvs: dict[tuple[int, int, int], str | tuple] = {}
    missed: dict[int, set[tuple[int, int]]] = {}
    for i, (v, vl) in enumerate(logs.items()):
        progress.tick(i, len(logs), "checking the exchanges of log")
        node = _read_exchanges(v, vl.records, plan, sends, recvs, integrity)
        if node.finished:
            finished_nodes.add(v)
        _check_node_exchanges(v, node, plan, integrity)
        used[v] = node.per_step
        seen_all[v] = node.seen
        missed[v] = node.miss
    _check_recvs_against_sends(logs, sends, recvs, integrity)
    _check_unacknowledged(sends, finished_nodes, seen_all, integrity)
    return ExchangeScan(used=used, seen=seen_all, finished=finished_nodes, missed=missed)
