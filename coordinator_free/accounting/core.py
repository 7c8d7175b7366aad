"""Generic accounting machinery, the same for every protocol family: the units every loss is
reported in, reading and checking the view logs of a run directory, the sigma bisection of
calibration, and writing reports.

Both plans and audits produce per-pair losses u -> v in the same units:

* ``factor``: the multiplier of the local-DP loss, in [0, 1] for ``exact``;
* ``rdp``: the Rényi divergence at the config's order alpha, alpha * Delta^2 / (2 sigma^2) * factor;
* ``eps``: the (eps, delta)-DP value at the config's delta, from the improved RDP conversion
  optimised over alpha (the RDP curve of a linear-Gaussian view is linear in alpha).

Nothing here names a family: each family's accountant (``families/<family>/accountant.py``)
builds on it, and ``accounting.audit`` reaches the families through the registry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from coordinator_free import rundir
from coordinator_free.errors import AuditError
from coordinator_free.privacy import rdp as rdp_mod
from coordinator_free.viewlog import read_viewlog

__all__ = [
    "AuditError",
    "BUDGETS",
    "METHODS",
    "Units",
    "budget_factor",
    "read_logs",
    "smallest_sigma",
    "units_of",
    "write_json",
]

METHODS = ("exact", "paper")


BUDGETS = ("worst", "mean")


@dataclass(frozen=True)
class Units:
    alpha: float
    delta: float
    sensitivity: float
    sigma: float

    @property
    def ldp_rho(self) -> float:
        return self.sensitivity**2 / (2.0 * self.sigma**2)

    def loss(self, factor: float) -> dict:
        rho = max(0.0, float(factor)) * self.ldp_rho
        eps = rdp_mod.eps_from_rho(rho, self.delta)[0] if rho > 0 else 0.0
        return {"rdp": self.alpha * rho, "eps": eps}


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
        params = vl.header.get("params", {})
        for key, want in expected_params.items():
            have = params.get(key)
            if isinstance(want, float) and isinstance(have, float):
                same = abs(want - have) <= 1e-12 * max(1.0, abs(want))
            else:
                same = have == want
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


def write_json(path: Path, obj: dict) -> None:
    """A report as JSON, written atomically (rundir.write_json)."""
    rundir.write_json(path, obj)


def budget_factor(F: np.ndarray, budget: str) -> tuple[float, int, int]:
    """The factor that sets the budget: the worst pair (and which), or the mean over pairs."""
    n = F.shape[0]
    off = ~np.eye(n, dtype=bool)
    if budget == "worst":
        masked = np.where(off, F, -np.inf)
        v, u = np.unravel_index(int(np.argmax(masked)), F.shape)
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


@dataclass
class ExchangeScan:
    """What the exchange records (``send``, ``recv``, ``late``, ``finished``) of every readable
    log say, after the integrity checks every family gets."""

    used: dict[int, dict[int, set[int]]]  # node -> step -> senders whose value it used on time
    seen: dict[int, set[tuple[int, int]]]  # node -> {(step, sender)} it received, late included
    finished: set[int]  # nodes whose log ends with the run finished


def scan_exchanges(logs: dict, plan, integrity: list[dict], digest) -> ExchangeScan:
    """The integrity checks of the exchange records, the same for every family that exchanges
    values at numbered steps (gossip averaging, randomized gossip, learning, DECOR):

    * ``impossible-record``: a send, recv or late record whose step is not in 0..steps-1 or whose
      peer is not the node's partner at that step (ignored);
    * ``unfinished``: a log that ends before the node finished (a crash, a kill, a truncation);
    * ``unmatched-recv``: a value received from a node whose log has no matching send;
    * ``digest-mismatch``: a value received that differs from what its sender logged sending.

    ``digest(value)`` computes the digest of a logged value (logs that keep values rather than
    digests). Every problem is appended to ``integrity``."""
    T = plan.steps
    used: dict[int, dict[int, set[int]]] = {}
    seen_all: dict[int, set[tuple[int, int]]] = {}
    finished_nodes: set[int] = set()
    sends: dict[tuple[int, int, int], str | None] = {}  # (step, sender, receiver) -> digest
    recvs: dict[tuple[int, int, int], str] = {}
    for v, vl in logs.items():
        per_step: dict[int, set[int]] = {}
        seen: set[tuple[int, int]] = set()
        for r in vl.records:
            k = r.get("k")
            if k in ("recv", "late", "send"):
                t, w = r.get("step"), r.get("peer")
                if not (
                    isinstance(t, int)
                    and isinstance(w, int)
                    and 0 <= t < T
                    and w in plan.partners_at(v, t)
                ):
                    integrity.append(
                        {
                            "node": v,
                            "kind": "impossible-record",
                            "message": f"{k} record seq {r.get('seq')} names step {t!r} and "
                            f"peer {w!r}, impossible for node {v}; ignored",
                        }
                    )
                    continue
                if k == "recv":
                    per_step.setdefault(t, set()).add(w)
                    seen.add((t, w))
                    recvs[(t, w, v)] = (
                        r["digest"] if "digest" in r else digest(np.asarray(r["value"]))
                    )
                elif k == "late":
                    seen.add((t, w))
                else:
                    sends[(t, v, w)] = r.get("digest")
            elif k == "finished":
                finished_nodes.add(v)
        if v not in finished_nodes:
            integrity.append(
                {
                    "node": v,
                    "kind": "unfinished",
                    "message": "the log ends before the run finished (crash or kill)",
                }
            )
        used[v] = per_step
        seen_all[v] = seen
    for (t, w, v), dg in recvs.items():
        if w in logs and sends.get((t, w, v)) is None:
            integrity.append(
                {
                    "node": v,
                    "kind": "unmatched-recv",
                    "message": f"step {t}: value from {w} has no send record in {w}'s log",
                }
            )
        elif w in logs and sends[(t, w, v)] != dg:
            integrity.append(
                {
                    "node": v,
                    "kind": "digest-mismatch",
                    "message": f"step {t}: value from {w} differs from what {w} logged sending",
                }
            )
    return ExchangeScan(used=used, seen=seen_all, finished=finished_nodes)
