"""Privacy planning (public parameters only) and auditing (replaying a finished run's view logs),
for every protocol: the entry points the CLI, the launchers and the tests call. Each one finds the
protocol's family through the registry and hands it the work; the units, the log reading and the
calibration search they share are in ``accounting.core``.

``plan_report`` assumes the fault-free schedule. ``audit_run`` rebuilds the schedule that really
happened from the logs (which values every node used at every step, missed deadlines included,
and which messages every observer saw, late ones included), then computes the same quantities
for it.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import math
import numbers
import os
import socket
import sys
from pathlib import Path

from coordinator_free import config as config_mod
from coordinator_free import graphs, progress, rundir
from coordinator_free.accounting import baseline
from coordinator_free.accounting.core import (  # noqa: F401  (the accounting API in one place)
    BUDGETS,
    METHODS,
    AuditError,
    Units,
    audit_head,
    read_logs,
    smallest_sigma,
    units_of,
    write_json,
)
from coordinator_free.accounting.loss import LOSS_KEYS, at_least
from coordinator_free.families import family_of


def load_run(run_dir: Path):
    """The config and the public plan of a run directory."""
    cfg_path = rundir.config_path(run_dir)
    if not cfg_path.is_file():
        raise AuditError(f"{run_dir} is not a run directory: no config.toml")
    cfg = config_mod.load(cfg_path)
    return cfg, family_of(cfg.protocol.name).make_plan(cfg)


def plan_report(cfg: config_mod.Config, *, source: int | None, method: str) -> dict:
    """What each observer will learn about each source under the fault-free schedule."""
    fam = family_of(cfg.protocol.name)
    plan = fam.make_plan(cfg)
    rep = fam.plan_report(cfg, plan, source=source, method=method)
    if not fam.has_peers(cfg):
        rep["central"] = True  # one curator, no graph: the same loss towards everyone
        return rep
    rep = baseline.annotate_plan(rep, neighbours_see_values=not fam.walks(cfg))
    if method == "paper" and plan.n <= baseline.BELOW_EXACT_MAX_N:
        observers = list(range(plan.n))
        try:
            planned = fam.planned_losses(cfg, plan, observers)
        except NotImplementedError:
            return rep
        baseline.mark_paper_below_exact(rep, planned)
    return rep


def audit_run(run_dir: str | Path, *, observers: list[int] | None = None) -> dict:
    """The losses every observer experienced, from the view logs of ``run_dir``.

    The family's accountant replays the logs; then, whatever is missing or damaged, no loss is
    reported below what the fault-free plan gives (see :func:`floor`). Only a run directory
    without a readable config, or an observer that is not a node id, is an error."""
    run_dir = Path(run_dir)
    cfg, plan = load_run(run_dir)
    fam = family_of(cfg.protocol.name)
    if observers is not None:
        for v in observers:
            if not (
                isinstance(v, numbers.Integral) and not isinstance(v, bool) and 0 <= v < plan.n
            ):
                raise AuditError(f"observer {v!r} is not a node id (0..{plan.n - 1})")
        observers = list(dict.fromkeys(int(v) for v in observers))
    extra: list[dict] = []
    faults = read_faults(run_dir, extra)
    try:
        # Progress of a long audit on stderr, on a terminal (or with CFREE_PROGRESS=1).
        with progress.reporting("audit"):
            rep = fam.audit(run_dir, cfg, plan, observers)
        failed = None
    except Exception as exc:  # a damaged log must not stop the audit: the plan stands in
        failed = f"{type(exc).__name__}: {exc}"
        rep = _plan_skeleton(run_dir, cfg, plan, fam)
        extra[:0] = [
            {
                "node": None,
                "kind": "audit-failed",
                "message": f"the {fam.name} audit of the logs failed ({failed}); every loss "
                "below is the plan's, or the worst case for observers without a usable log",
            },
            *_log_findings(run_dir, plan),
        ]
    rep["integrity"] = list(rep.get("integrity", [])) + extra
    if faults is not None:
        rep["faults"] = faults
    wanted = list(range(plan.n)) if observers is None else observers
    rep = floor(rep, fam, cfg, plan, wanted, failed=failed is not None)
    if not fam.has_peers(cfg):
        rep["central"] = True  # one curator, no graph: the same loss towards everyone
        return rep
    return baseline.annotate_audit(rep, neighbours_see_values=not fam.walks(cfg))


def coalition_audit(run_dir: str | Path, cfg, plan, members: list[int]) -> dict:
    """``cfree audit --observers``: the family's coalition audit. Like the single audit it never
    fails on damaged logs: when the family's replay fails, the coalition's plan stands in, every
    row raised to at least local DP, with the failure and what reading the logs found."""
    fam = family_of(cfg.protocol.name)
    try:
        return fam.coalition_audit(Path(run_dir), cfg, plan, members)
    except (NotImplementedError, AuditError):
        raise
    except Exception as exc:  # a damaged log must not stop the audit: the plan stands in
        rep = fam.coalition_plan(cfg, plan, members)
        rep["losses"] = [at_least(row, rep["ldp"]) for row in rep["losses"]]
        rep.update(
            run_dir=str(run_dir),
            fault_free=False,
            complete=False,
            basis="plan, raised to local DP",
            integrity=[
                {
                    "node": None,
                    "kind": "audit-failed",
                    "message": f"the {fam.name} coalition audit of the logs failed "
                    f"({type(exc).__name__}: {exc}); every row is the plan's, raised to local DP",
                },
                *_log_findings(Path(run_dir), plan),
            ],
        )
        return rep


#: Findings that leave nothing trustworthy of a node's own view: its log is absent, unreadable,
#: not a view log of this node and run, or written under other public parameters.
NO_VIEW_KINDS = frozenset(
    {
        "missing-log",
        "unreadable-log",
        "wrong-log",
        "missing-header",
        "bad-magic",
        "bad-header",
        "param-mismatch",
    }
)
ELSEWHERE = "a log elsewhere in the run is damaged or incomplete"


#: The key of ``audit.json`` recording the view logs the audit was computed from.
LOGS_KEY = "logs"


def logs_fingerprint(run_dir: str | Path) -> dict:
    """The view logs of a run as they are now: how many, their total size and one SHA-256 over
    their names, sizes and bytes (in name order)."""
    h = hashlib.sha256()
    files = rundir.view_logs(run_dir)
    total = 0
    for f in files:
        size = f.stat().st_size
        total += size
        h.update(f"{f.name}\0{size}\0".encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return {"files": len(files), "bytes": total, "sha256": h.hexdigest()}


#: The key of ``audit.json`` recording who wrote it: host, user, run directory, role.
WRITER_KEY = "written_by"


def auditor_identity(run_dir: str | Path, role: str) -> dict:
    """Who is writing an audit: this host, this user, the run directory as this auditor sees
    it (a container's ``/cfree/run`` differs from the host's path) and what it is (``role``)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a container's uid without a passwd entry
        user = str(os.getuid())
    return {
        "host": socket.gethostname(),
        "user": user,
        "run_dir": str(Path(run_dir).resolve()),
        "role": role,
    }


def same_auditor(a, b: dict) -> bool:
    """Whether the audit written by ``a`` (its ``written_by`` record, or anything else when it
    has none) came from the auditor ``b``: the same host and the same run directory path."""
    return isinstance(a, dict) and all(a.get(k) == b[k] for k in ("host", "run_dir"))


def _kept_name(run_dir: Path) -> Path:
    n = 1
    while (path := Path(run_dir) / f"audit-{n}.json").exists():
        n += 1
    return path


def save_audit(
    run_dir: str | Path,
    rep: dict,
    *,
    role: str = "cfree",
    force: bool = False,
    say=lambda msg: print(msg, file=sys.stderr),
) -> Path:
    """Write a full audit to ``RUN_DIR/audit.json`` with the fingerprint of the logs it was
    computed from (key ``logs``), so that ``cfree report`` can tell whether it is current, and
    who wrote it (key ``written_by``: :func:`auditor_identity`).

    An audit.json another auditor wrote (another host or container, another path to the run
    directory, or no record of its writer) is never replaced silently: it is first renamed to
    ``audit-<n>.json`` (the first free n) and ``say`` is told so. ``force`` replaces it."""
    path = rundir.audit_path(run_dir)
    me = auditor_identity(run_dir, role)
    if path.exists() and not force:
        try:
            earlier = json.loads(path.read_bytes()).get(WRITER_KEY)
        except (OSError, ValueError, AttributeError):
            earlier = None  # unreadable: certainly not ours to throw away
        if not same_auditor(earlier, me):
            kept = _kept_name(Path(run_dir))
            os.replace(path, kept)
            who = (
                f"{earlier.get('role', '?')} on host {earlier.get('host', '?')} (run directory "
                f"{earlier.get('run_dir', '?')})"
                if isinstance(earlier, dict)
                else "an auditor that did not record itself"
            )
            say(
                f"{path} was written by {who}, not by this auditor: kept as {kept.name}, the "
                "new audit is audit.json (--force replaces without keeping)"
            )
    write_json(path, {**rep, LOGS_KEY: logs_fingerprint(run_dir), WRITER_KEY: me})
    return path


def audit_state(run_dir: str | Path) -> str:
    """Whether ``RUN_DIR/audit.json`` is the audit of the view logs there now:

    * ``missing``: no audit.json;
    * ``current``: it records exactly the logs present (a trusted-curator run has none);
    * ``stale``: logs are present but differ from those it was computed from, or it predates
      the record (re-auditing replaces it);
    * ``unverifiable``: its logs are gone, so nothing can confirm or recompute it.
    """
    path = rundir.audit_path(run_dir)
    if not path.exists():
        return "missing"
    try:
        recorded = json.loads(path.read_bytes()).get(LOGS_KEY)
    except (OSError, ValueError, AttributeError):
        recorded = None  # unreadable: the report's reader names the problem
    now = logs_fingerprint(run_dir)
    if isinstance(recorded, dict) and recorded == now:
        return "current"
    if now["files"] == 0:
        if isinstance(recorded, dict) and recorded.get("files") == 0:
            return "current"
        cfg, _plan = load_run(Path(run_dir))
        return "unverifiable" if family_of(cfg.protocol.name).has_peers(cfg) else "current"
    return "stale"


def floor(rep: dict, fam, cfg, plan, wanted: list[int], *, failed: bool = False) -> dict:
    """Raise every loss of an audit whose logs are not all intact to at least the plan's.

    With no integrity finding, every entry is the family's realised loss (``"basis":
    "realised"``). Otherwise every entry whose planned eps is larger takes the planned
    factor, rdp and eps (``"basis": "plan"``); the observers whose own log is missing or
    unusable (:data:`NO_VIEW_KINDS`), or whom the family could not audit, get for every entry
    the larger of the family's number and the worst case (``"basis": "worst-case"``). An entry
    not realised says why, and a raised entry keeps the family's own numbers under
    ``"from_logs"``. No number the family computed is ever lowered. The report gets
    ``"conservative"``: whether the floor applied."""
    findings = rep["integrity"]
    conservative = bool(findings) or failed
    by_obs = {o["observer"]: o for o in rep.get("observers", [])}
    if not conservative:
        for o in by_obs.values():
            for x in o["losses"]:
                x["basis"] = "realised"
        rep["conservative"] = False
        return rep
    kinds_of: dict[int, list[str]] = {}
    for f in findings:
        node = f.get("node")
        if isinstance(node, int) and not isinstance(node, bool):
            kinds = kinds_of.setdefault(node, [])
            if f.get("kind") not in kinds:
                kinds.append(str(f.get("kind")))
    no_view = {v for v, kinds in kinds_of.items() if NO_VIEW_KINDS.intersection(kinds)}
    # The family reports every observer it could audit; when it failed, the logs' own findings
    # say which observers have no usable view.
    worst_obs = [v for v in wanted if v in no_view or (v not in by_obs and not failed)]
    try:
        planned = fam.planned_losses(cfg, plan, [v for v in wanted if v not in worst_obs])
        worst = fam.worst_case_losses(cfg, plan, worst_obs) if worst_obs else {}
    except NotImplementedError as exc:
        if failed:
            raise AuditError(f"the audit of {rep.get('run_dir')} failed and {exc}") from None
        rep.setdefault("notes", []).append(
            {"kind": "no-floor", "message": f"losses are not floored at the plan: {exc}"}
        )
        for o in by_obs.values():
            for x in o["losses"]:
                x["basis"] = "realised"
        rep["conservative"] = False
        return rep
    general = "audit-failed" if failed else ELSEWHERE
    out = []
    from_bounds: list[int] = []  # observers given a figure from an upper-bound plan row
    for v in wanted:
        own = ", ".join(kinds_of.get(v, []))
        if v in worst_obs:
            basis, ref = "worst-case", worst[v]
            why = own or "no usable view log"
        else:
            basis, ref = "plan", planned[v]
            why = own or general
        o = by_obs.get(v) or {"observer": v, "losses": []}
        have = {(x.get("source"), x.get("method")): x for x in o["losses"]}
        dist = graphs.distances_from(plan.graph, v)
        for x in o["losses"]:
            x["basis"] = "realised"
        for (src, m), p in ref.items():
            x = have.get((src, m))
            if x is None:
                x = {"source": src, "method": m, "distance": int(dist[src]), **p}
                o["losses"].append(x)
            elif not _at_least(x.get("eps"), p["eps"]):
                raised = at_least(x, p)
                raised["from_logs"] = {k: x.get(k) for k in LOSS_KEYS if k in x}
                x.clear()  # the entry stays in its list, raised in place
                x.update(raised)
            elif basis != "worst-case":
                continue
            x["basis"] = basis
            x["why"] = why
            if x.get("upper_bound") and (not from_bounds or from_bounds[-1] != v):
                from_bounds.append(v)
        o["losses"].sort(key=lambda x: (x.get("source", -1), str(x.get("method"))))
        out.append(o)
    rep["observers"] = out
    for v in from_bounds:  # said where every reader of an audit looks, not on the entries only
        rep.setdefault("notes", []).append(
            {
                "observer": v,
                "kind": "exact-upper-bound",
                "message": f"observer {v}'s figures floored at the plan come from an upper bound "
                "on its exact plan row (a direction float64 cannot size, kept): at least the "
                "exact loss, not the exact value (entries marked upper_bound)",
            }
        )
    _floor_headlines(rep, fam, cfg, plan, general)
    rep["conservative"] = True
    rep["fault_free"] = False
    rep["complete"] = False
    return rep


#: Report keys that are not headline figures (the per-pair entries are floored above).
_NOT_HEADLINES = frozenset({"observers", "integrity", "notes", "faults", "walks", "realised"})


def _floor_headlines(rep: dict, fam, cfg, plan, why: str) -> None:
    """Raise every headline figure of an audit (DECOR's SecLDP guarantee, the local-DP line,
    any block the plan report has too) to at least the plan's: the same rule as the pairwise
    entries, for the figures a report prints on their own."""
    try:
        ref = fam.plan_report(cfg, plan, source=None, method="exact")
    except Exception as exc:  # noqa: BLE001 - then the headlines cannot be vouched for
        rep.setdefault("notes", []).append(
            {
                "kind": "headlines-not-floored",
                "message": f"the plan's headline figures could not be computed ({exc}); the "
                "headline figures of this audit come from damaged logs",
            }
        )
        return
    for key, block in rep.items():
        if key not in _NOT_HEADLINES and isinstance(block, dict) and isinstance(ref.get(key), dict):
            _floor_block(block, ref[key], why)


def _floor_block(block: dict, ref: dict, why: str) -> None:
    """``block`` raised to ``ref`` where ``ref`` gives a larger eps: a loss below the plan's
    takes the plan's whole loss (its eps, rdp, rho, conversions: one consistent figure), keeps
    its own under ``from_logs`` and says why; lists of eps (one per node) are raised element by
    element; nested blocks likewise."""
    for key, value in list(block.items()):
        r = ref.get(key)
        if isinstance(value, dict) and isinstance(r, dict):
            _floor_block(value, r, why)
        elif key.endswith("eps") and isinstance(value, list) and isinstance(r, list):
            raised = [a if _at_least(a, b) else b for a, b in zip(value, r, strict=False)]
            if len(r) == len(value) and raised != value:
                block.setdefault("lists_from_logs", {})[key] = value
                block[key] = raised
    if _num(ref.get("eps")) and not _at_least(block.get("eps"), ref["eps"]):
        block["from_logs"] = {k: v for k, v in block.items() if not isinstance(v, dict | list)}
        block.update({k: v for k, v in ref.items() if not isinstance(v, dict | list)})
        block["basis"] = "plan"
        block["why"] = why
    for key, value in list(block.items()):
        r = ref.get(key)
        if key.startswith("eps") and key != "eps" and _num(r) and not _at_least(value, r):
            block[key] = r  # a conversion beside the eps (eps_rdp, eps_paper...)


def _num(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _at_least(have, want: float) -> bool:
    """Whether a family's eps ``have`` is a number at least ``want`` (NaN or None is not)."""
    return isinstance(have, int | float) and not isinstance(have, bool) and have >= want


def _log_findings(run_dir: Path, plan) -> list[dict]:
    """What reading the logs finds (missing, unreadable, torn, of another run...), for a report
    whose family audit failed."""
    integrity: list[dict] = []
    try:
        read_logs(run_dir, plan, integrity)
    except Exception as exc:  # then nothing is known of any log: every observer is worst case
        return [
            {"node": v, "kind": "unreadable-log", "message": f"logs could not be read: {exc}"}
            for v in range(plan.n)
        ]
    return integrity


def _plan_skeleton(run_dir: Path, cfg, plan, fam) -> dict:
    """The report an audit that failed falls back on: the run's public parameters and no
    realised loss (``floor`` fills in the plan's)."""
    rep = {
        **audit_head(
            run_dir, cfg.protocol.name, plan, steps=getattr(plan, "steps", None), fault_free=False
        ),
        "observers": [],
        "complete": False,
        "integrity": [],
        "notes": [],
    }
    try:
        pr = fam.plan_report(cfg, plan, source=None, method="exact")
    except Exception:  # the plan's summary is a courtesy here; the losses come from floor
        pr = {}
    for key in ("ldp", "accounting"):
        if key in pr:
            rep[key] = pr[key]
    return rep


def read_faults(run_dir: Path, integrity: list[dict]) -> dict | None:
    """The declared and injected faults of a run (``faults.json``), or None when the run has
    none; a damaged file is an integrity finding."""
    path = rundir.faults_path(run_dir)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        integrity.append(
            {"node": None, "kind": "bad-faults-file", "message": f"{path}: cannot be read: {exc}"}
        )
        return None
    problem = _faults_problem(data)
    if problem:
        integrity.append(
            {"node": None, "kind": "bad-faults-file", "message": f"{path}: {problem}; ignored"}
        )
        return None
    return data


def _faults_problem(data) -> str | None:
    if not isinstance(data, dict):
        return f"expected an object with 'declared' and 'injected', got {type(data).__name__}"
    declared, injected = data.get("declared", []), data.get("injected", [])
    if not (isinstance(declared, list) and all(isinstance(d, str) for d in declared)):
        return "'declared' is not a list of strings"
    if not isinstance(injected, list):
        return "'injected' is not a list"
    for i, f in enumerate(injected):
        if not isinstance(f, dict) or not isinstance(f.get("fault"), str):
            return f"injected[{i}] is not an object with a string 'fault'"
        node = f.get("node")
        if node is not None and not (isinstance(node, int) and not isinstance(node, bool)):
            return f"injected[{i}]: 'node' is {node!r}, not a node id"
    return None


def calibrate(
    cfg: config_mod.Config, target_eps: float, *, method: str, budget: str, decor_pair: str = "mid"
) -> dict:
    """The noise that meets ``target_eps`` for the worst pair (``budget="worst"``) or the mean
    over pairs (``budget="mean"``), searched by the protocol's family."""
    if not target_eps > 0 or not math.isfinite(target_eps):
        raise AuditError(f"--target-eps must be a positive number, got {target_eps}")
    if budget not in BUDGETS:
        raise AuditError(f"unknown budget {budget!r}; expected one of {BUDGETS}")
    rep = family_of(cfg.protocol.name).calibrate(
        cfg, target_eps, method=method, budget=budget, decor_pair=decor_pair
    )
    return against_ldp(rep, target_eps)


def against_ldp(rep: dict, target_eps: float) -> dict:
    """A calibration with what local DP alone would need: ``ldp_sigma``, the smallest sigma at
    which every node publishing its noisy values directly meets the target, and ``gain``:
    whether the protocol needs less noise than that (``gains_over_ldp``), by how much
    (``sigma_ratio`` = sigma / ldp_sigma) and, when it gains nothing, why. The families'
    searches already cap a paper formula at local DP, so sigma never exceeds ldp_sigma."""
    ldp = rep.get("ldp")
    sigma = rep.get("sigma")
    if not (isinstance(ldp, dict) and isinstance(ldp.get("factor"), int | float)):
        return rep
    if not isinstance(sigma, int | float) or isinstance(ldp.get("factor"), bool):
        return rep
    factor = float(ldp["factor"])
    sens, alpha, delta = rep["sensitivity"], rep.get("alpha", 2.0), rep["delta"]
    # The share of delta the local-DP figure has (a walk without a cap keeps delta/3 for its
    # count of contributions).
    delta = float(ldp.get("delta_view", delta))

    def ldp_eps(s: float) -> float:
        # Local DP in the conversion the report's local DP uses.
        units = Units(alpha=alpha, delta=delta, sensitivity=sens, sigma=s)
        return units.method("exact" if ldp.get("conversion") == "gaussian" else "paper")(factor).eps

    ldp_sigma = smallest_sigma(ldp_eps, target_eps, sens)
    ratio = sigma / ldp_sigma
    gains = ratio < 1.0 - 1e-6
    gain: dict = {"gains_over_ldp": gains, "sigma_ratio": ratio}
    if not gains:
        what = (
            "the binding pair is fully exposed: its observer can solve for the source's noisy "
            "value (a neighbour receives it directly)"
            if rep.get("budget") == "worst"
            else "every pair is fully exposed: each observer can solve for every source's "
            "noisy values"
        )
        if rep.get("method") == "paper":
            what = "the paper's formula is above local DP at this noise, so local DP binds"
        gain["why"] = (
            f"the protocol gains nothing over local DP at eps = {target_eps:g}: {what}; "
            "amplification needs observers whose view cannot pin the source down (a larger "
            "or sparser graph, fewer steps)"
        )
    rep["ldp_sigma"] = ldp_sigma
    rep["gain"] = gain
    return rep
