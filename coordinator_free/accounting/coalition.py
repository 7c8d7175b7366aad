"""What every family's coalition accounting shares (``cfree plan --observers``, ``cfree audit
--observers``): the members, the report (one row per source outside the coalition with
``observers``, ``source``, ``distance``, ``factor``, ``rdp``, ``eps``) and its rendering. The
factors themselves come from the family's accountant."""

from __future__ import annotations

import networkx as nx
import numpy as np

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
    unknown: list[int],
    compute,
    planned,
    worst: float,
    worst_label: str,
    integrity: list,
    notes: list,
) -> tuple[np.ndarray, str]:
    """``(factors, basis)`` of a coalition audit that never reports less than it can vouch for:
    ``worst`` for every source when a member has no usable log (``unknown``) or the logs
    contradict each other (``compute`` noted it); else ``compute(notes)``, floored at
    ``planned()`` when any log has an integrity finding."""  # fmt: skip
    if unknown:
        notes.append(
            {
                "kind": "member-without-log",
                "message": f"member(s) {unknown} have no usable view log, so what the coalition "
                f"saw is unknown: every source is reported at {worst_label}",
            }
        )
        return np.full(n, float(worst)), "worst-case"
    f = compute(notes)
    if any(note.get("kind") == "inconsistent-schedule" for note in notes):
        return f, "worst-case"
    if not integrity:
        return f, "logs"
    floor = planned()
    basis = "logs, floored at the plan" if np.any(floor > f + 1e-12) else "logs"
    return np.maximum(f, floor), basis


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
    if entries is None:
        entries = [{"factor": float(x), **units.loss(float(x))} for x in f]
    if ldp is None:
        ldp = {"factor": ldp_factor, **units.loss(ldp_factor)}
    hops = nx.multi_source_dijkstra_path_length(plan.graph, set(members))
    rows = [
        {"observers": members, "source": u, "distance": int(hops.get(u, -1)), **entries[u]}
        for u in range(plan.n)
        if u not in members
    ]
    return {
        "protocol": cfg.protocol.name,
        "method": "exact",
        "n": plan.n,
        "steps": plan.steps,
        "sigma": plan.sigma,
        "alpha": plan.alpha,
        "delta": plan.delta,
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
            print(
                f"{above} source(s) lose more than local DP: the coalition isolates their "
                "contributions under less noise than local DP assumes (eps inf: under none)"
            )
    if "run_dir" in rep:
        state = "fault-free" if rep["fault_free"] else "with faults"
        print(
            f"schedule: {state}; basis: {rep['basis']}; {len(rep['integrity'])} integrity finding(s)"
        )
    for note in rep.get("notes", []):
        print(f"note: {note['message']}")
