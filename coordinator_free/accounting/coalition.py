"""What every family's coalition accounting shares (``cfree plan --observers``, ``cfree audit
--observers``): the members, the report (one row per source outside the coalition with
``observers``, ``source``, ``distance``, ``factor``, ``rdp``, ``eps``) and its rendering. The
factors themselves come from the family's accountant."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np

from coordinator_free import progress
from coordinator_free.accounting.core import AuditError, units_of


def members_of(observers, n: int, *, flag: str = "--observers") -> list[int]:
    """The coalition's members, sorted, each a node id."""
    obs = sorted({int(a) for a in observers})
    bad = [a for a in obs if not 0 <= a < n]
    if bad or not obs:
        raise AuditError(f"{flag} {list(observers)}: node ids must be in 0..{n - 1}")
    return obs


def inconsistent(exc: Exception, worst: str) -> dict:
    """The note of a coalition audit whose logs contradict each other (what a member is said to
    have used it is not said to have received): every source is put at ``worst``."""
    return {
        "kind": "inconsistent-schedule",
        "message": f"the logs contradict each other ({exc}): every source is reported at {worst}",
    }


def audited(
    n: int,
    members: list[int],
    run_dir,
    rp,
    compute,
    planned,
    worst: float,
    worst_label: str,
    notes: list,
) -> tuple[np.ndarray, dict]:
    """``(factors, fields)`` of a coalition audit from a gossip replay ``rp`` (see
    ``families.averaging.accountant.replay``) that never reports less than it can vouch for:
    ``worst`` for every source when a member has no usable log or the logs contradict each
    other (``compute`` noted it); else ``compute(notes)``, floored at ``planned()`` when any log
    has an integrity finding. ``fields``: what the report adds about the run (``run_dir``,
    ``fault_free``, ``complete``, ``basis``, ``realised``, ``integrity``, ``notes``)."""
    unknown = [a for a in members if a not in rp.logged]
    if unknown:
        notes.append(
            {
                "kind": "member-without-log",
                "message": f"member(s) {unknown} have no usable view log, so what the coalition "
                f"saw is unknown: every source is reported at {worst_label}",
            }
        )
        f, basis = np.full(n, float(worst)), "worst-case"
    else:
        f = compute(notes)
        basis = "logs"
        if any(note.get("kind") == "inconsistent-schedule" for note in notes):
            basis = "worst-case"
        elif rp.integrity:
            floor = planned()
            if np.any(floor > f + 1e-12):
                basis = "logs, floored at the plan"
            f = np.maximum(f, floor)
    return f, {
        "run_dir": str(run_dir),
        "fault_free": rp.fault_free,
        "complete": not rp.integrity,
        "basis": basis,
        "realised": {"missed": rp.missed, "late": rp.late},
        "integrity": rp.integrity,
        "notes": notes,
    }


def _header(cfg, plan) -> dict:
    """The keys every coalition report (and growth table) starts with."""
    return {
        "protocol": cfg.protocol.name,
        "method": "exact",
        "n": plan.n,
        "steps": plan.steps,
        "sigma": plan.sigma,
        "alpha": plan.alpha,
        "delta": plan.delta,
    }


def report(
    cfg,
    plan,
    members: list[int],
    f: np.ndarray | None,
    *,
    ldp_factor: float = 1.0,
    entries: list[dict] | None = None,
    ldp: dict | None = None,
) -> dict:
    """``f``: every node's factor (the loss over one local-DP release); ``ldp_factor``: the
    factor of local DP over the whole run (the rounds of a learning protocol). A family whose
    losses are not all Gaussian passes ``entries`` (per node ``{"factor", "rdp", "eps"}``,
    factor and rdp None for an eps-only bound) and its ``ldp`` entry instead."""
    units = units_of(plan)
    if entries is None:  # a linear-Gaussian view: its exact profile
        entries = [units.gaussian(float(x)).entry() for x in f]
    if ldp is None:
        ldp = units.gaussian(ldp_factor).entry()
    hops = nx.multi_source_dijkstra_path_length(plan.graph, set(members))
    rows = [
        {"observers": members, "source": u, "distance": int(hops.get(u, -1)), **entries[u]}
        for u in range(plan.n)
        if u not in members
    ]
    return {
        **_header(cfg, plan),
        "observers": members,
        "ldp": ldp,
        "fully_exposed": sum(1 for r in rows if _at_ldp(r, ldp)),
        "losses": rows,
    }


def _at_ldp(row: dict, ldp: dict) -> bool:
    """At (or above) local DP: by the factor where there is one (at sigma = 0 every eps is
    inf or 0), else by eps."""
    if row.get("factor") is not None and ldp.get("factor") is not None:
        return row["factor"] >= ldp["factor"] * (1 - 1e-9)
    return row["eps"] >= ldp["eps"] * (1 - 1e-9)


def print_report(rep: dict) -> None:
    """The coalition table for people (plan and audit)."""
    from coordinator_free.accounting import baseline
    from coordinator_free.accounting.render import table

    rows = rep["losses"]
    where = f"the view logs of {rep['run_dir']}" if "run_dir" in rep else "the plan"
    print(
        f"coalition {rep['observers']}: exact loss of every other node towards the joint view, "
        f"from {where} (n={rep['n']}, steps={rep['steps']}, sigma={rep['sigma']:g}, "
        f"alpha={rep['alpha']:g}, delta={rep['delta']:g})"
    )
    if rep.get("sigma_cor") is not None:
        print(f"sigma_cor={rep['sigma_cor']:g}; factor in units of one round of local DP")
    if rep.get("model"):
        print(f"model: {rep['model']}")
    if rep["sigma"] == 0:
        print(baseline.NO_PRIVACY)
    rdp = rep["ldp"].get("rdp")
    print(f"LDP baseline: rdp={'-' if rdp is None else f'{rdp:.4f}'}  eps={rep['ldp']['eps']:.4f}")

    def num(x) -> str:
        return "-" if x is None else f"{x:.4f}"

    body = [
        [str(r["source"]), str(r["distance"]), num(r["factor"]), num(r["rdp"]), num(r["eps"])]
        for r in rows
    ]
    print(table(["source", "dist", "factor", "rdp", "eps"], body))
    if rows:
        worst = max(r["eps"] for r in rows)
        mean = sum(r["eps"] for r in rows) / len(rows)
        print(
            f"worst eps {worst:.4f}, mean {mean:.4f}; {rep['fully_exposed']} of {len(rows)} "
            "fully exposed (at local DP: nothing but their own noise hides what the "
            "coalition saw of them)"
        )
        above = sum(1 for r in rows if r["eps"] > rep["ldp"]["eps"] * (1 + 1e-9))
        if above:
            bare = sum(1 for r in rows if math.isinf(r["eps"]))
            print(
                f"{above} source(s) lose more than local DP: the coalition isolates their "
                "contributions under less noise than local DP assumes"
                + (
                    f" ({bare} under no noise at all: eps inf)"
                    if bare
                    else f" (the worst: eps {worst:.4f})"
                )
            )
    if "run_dir" in rep:
        state = "fault-free" if rep["fault_free"] else "with faults"
        print(
            f"schedule: {state}; basis: {rep['basis']}; {len(rep['integrity'])} integrity finding(s)"
        )
    for note in rep.get("notes", []):
        print(f"note: {note['message']}")


JOINS = ("greedy", "degree")


def _growth_row(size: int, rep: dict) -> dict:
    rows = rep["losses"]
    eps = [r["eps"] for r in rows]
    factors = [r["factor"] for r in rows]
    return {
        "size": size,
        "observers": rep["observers"],
        "eps_max": max(eps),
        "eps_mean": float(np.mean(eps)),
        "factor_mean": None if None in factors else float(np.mean(factors)),
        "fully_exposed": rep["fully_exposed"],
        "hidden": sum(1 for e in eps if e == 0),
        "sources": len(rows),
    }


def _score(row: dict) -> tuple:
    """The greedy join's objective: the mean factor (the mean eps where a family reports eps
    only), more fully exposed sources first where eps is infinite."""
    mean = row["factor_mean"] if row["factor_mean"] is not None else row["eps_mean"]
    return (row["fully_exposed"], mean) if not np.isfinite(mean) else (mean,)


def growth_report(cfg, plan, k: int, join: str, coalition_plan) -> dict:
    """How the loss of the nodes outside a coalition grows as 1..k colluders join (``cfree
    plan --coalition-growth K``), from the family's coalition plan (``coalition_plan(members)``
    gives its report). ``greedy`` (the worst case found step by step): each time the node
    whose joining raises the mean loss over the remaining sources most; ``degree``: the
    highest-degree nodes first (ties by id). One row per size: members, worst and mean eps,
    mean factor, how many sources are fully exposed and how many stay hidden (eps 0)."""
    if join not in JOINS:
        raise AuditError(f"--join {join!r}: expected one of {', '.join(JOINS)}")
    if not 1 <= k < plan.n:
        raise AuditError(f"--coalition-growth {k}: expected 1..{plan.n - 1} (n = {plan.n})")
    by_degree = sorted(range(plan.n), key=lambda v: (-plan.graph.degree(v), v))
    members: list[int] = []
    rows = []
    rep: dict = {}
    for size in range(1, k + 1):
        if join == "degree":
            members = sorted([*members, by_degree[size - 1]])
            rep = coalition_plan(members)
            row = _growth_row(size, rep)
        else:
            best = None
            todo = [c for c in range(plan.n) if c not in members]
            for i, c in enumerate(todo):
                trial = coalition_plan(sorted([*members, c]))
                cand = _growth_row(size, trial)
                if best is None or _score(cand) > _score(best[0]):
                    best = (cand, trial)
                progress.tick(i + 1, len(todo), f"coalition size {size}, candidate")
            row, rep = best
            members = row["observers"]
        rows.append(row)
    return {
        **_header(cfg, plan),
        "join": join,
        "ldp": rep["ldp"],
        "growth": rows,
    }


def print_growth(rep: dict) -> None:
    from coordinator_free.accounting.render import table

    how = (
        "the node that raises the mean loss most joins next (greedy worst case)"
        if rep["join"] == "greedy"
        else "the highest-degree nodes join first"
    )
    print(
        f"coalition growth: {how} (n={rep['n']}, steps={rep['steps']}, sigma={rep['sigma']:g}, "
        f"alpha={rep['alpha']:g}, delta={rep['delta']:g}); local DP eps={rep['ldp']['eps']:.4f}"
    )
    body = [
        [
            str(r["size"]),
            ",".join(map(str, r["observers"])),
            f"{r['eps_max']:.4f}",
            f"{r['eps_mean']:.4f}",
            "-" if r["factor_mean"] is None else f"{r['factor_mean']:.4f}",
            f"{r['fully_exposed']}/{r['sources']}",
            f"{r['hidden']}/{r['sources']}",
        ]
        for r in rep["growth"]
    ]
    print(
        table(
            ["size", "coalition", "eps max", "eps mean", "factor mean", "exposed", "hidden"], body
        )
    )
    print(
        "exposed: sources at (or above) local DP towards the coalition; hidden: sources none of "
        "whose input reached it (eps 0)"
    )
