"""Text rendering of plan and audit reports for people: number formatting, tables, the per-pair
loss matrices of an audit and DECOR's SecLDP block. Used by the CLI and by the compose
auditor role (which prints an audit inside its container)."""

from __future__ import annotations

import textwrap

import numpy as np

from coordinator_free.accounting import baseline


def fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    if abs(x) >= 1e4 or abs(x) < 1e-3:
        return f"{x:.2e}"
    return f"{x:.4f}"


def capped(entry: dict, key: str) -> str:
    """``entry[key]`` as printed: the usable value beside it (``<key>_usable``, the minimum with
    local DP, see ``accounting.baseline``) when there is one, marked ``^`` where the formula's
    own value is above local DP."""
    raw, use = entry.get(key), entry.get(f"{key}_usable")
    if use is None or raw is None:
        return fmt(raw)
    return fmt(use) + (baseline.MARK if baseline.above(raw, use) else "")


def print_baseline(rep: dict, *, width: int = 100) -> None:
    """The sentences that say what a report's losses mean against local DP (its ``baseline``
    block): how many pairs are amplified, which are fully exposed and why, where a paper
    formula was capped."""
    lines = baseline.explain(rep.get("baseline"))
    if lines:
        print()
    for line in lines:
        print(textwrap.fill(line, width=width, subsequent_indent="  "))


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    for r in rows:
        out.append("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    return "\n".join(out)


#: How a loss entry that is not the realised loss is marked, by its ``basis``.
#: (``!`` is taken: it marks a paper figure below the exact loss, ``baseline.BELOW_MARK``.)
MARKS = {"plan": "*", "worst-case": "#"}
LEGEND = {
    "plan": "* raised to the plan's loss (a log of the run is damaged or incomplete)",
    "worst-case": "# worst case: the observer's own log is missing or unusable",
}


def below_mark(entry: dict) -> str:
    """``!`` after a paper figure the accountant flagged below the exact loss of its pair
    (``below_exact``), else ''."""
    return baseline.BELOW_MARK if entry.get("below_exact") else ""


def print_below_exact(rep: dict) -> None:
    """The legend of the ``!`` mark with the report's count of marked pairs (nothing when no
    pair is marked)."""
    count = baseline.below_exact_count(rep)
    if count:
        print(baseline.below_exact_legend(count))


def _audit_cells(rep: dict, method: str, used: set[str]) -> tuple[dict, dict, dict, dict]:
    """The ``method`` entries of an audit as :func:`print_audit` shows them, by observer, then
    by source: ``(cells, marks, raised, below)``: the eps shown (the usable value where there
    is one, ``<key>_usable``), its marks, the marks of the entries not realised alone
    (:data:`MARKS`, by their ``basis``), and the sources whose paper figure is below the exact
    loss. Adds the marks it uses to ``used``. One pass over the entries (an audit of 1 024
    nodes has two million of them), where maps keyed by (observer, source) pairs took four
    passes and built a pair for every lookup of the per-observer table."""
    cells: dict = {}
    usable: dict = {}
    raised: dict = {}
    below: dict = {}
    for o in rep["observers"]:
        v = o["observer"]
        shown, use = cells.setdefault(v, {}), usable.setdefault(v, {})
        flags, low = raised.setdefault(v, {}), below.setdefault(v, set())
        for x in o["losses"]:
            if x["method"] != method:
                continue
            u = x["source"]
            if "eps" in x:
                shown[u] = x["eps"]
            if "eps_usable" in x:
                use[u] = x["eps_usable"]
            flags[u] = MARKS.get(x.get("basis", "realised"), "")
            # A paper entry below the exact one of its pair is not an upper bound there: !.
            if below_mark(x):
                low.add(u)
    marks: dict = {}
    for v, shown in cells.items():
        used.update(m for m in raised[v].values() if m)
        mv = marks[v] = dict(raised[v])
        # A paper entry above local DP is shown as local DP, the usable bound, marked ^.
        for u, bound in usable[v].items():
            if baseline.above(shown[u], bound):
                mv[u] = mv.get(u, "") + baseline.MARK
                used.add(baseline.MARK)
        shown.update(usable[v])
        for u in below[v]:
            mv[u] = mv.get(u, "") + baseline.BELOW_MARK
    return cells, marks, raised, below


def central_eps(rep: dict) -> float:
    """The one loss of a central-DP report: its worst pair (plan) or its largest audited loss."""
    if "worst_pair" in rep:
        return float(rep["worst_pair"]["eps"])
    return max(float(x["eps"]) for o in rep["observers"] for x in o["losses"])


def print_central(rep: dict, *, width: int = 100) -> None:
    """What a central-DP (trusted curator) report means: one loss, the same for every pair."""
    lines = [
        f"central DP (a trusted curator, no peers, no graph): every user loses eps = "
        f"{fmt(central_eps(rep))} at delta={rep['delta']:g} to anyone who sees the released "
        "models, whoever they are; pairs and graph distances do not apply.",
        "At equal sigma this is the local-DP loss (one Gaussian mechanism per round), but the "
        "curator's noise is on the sum of the n clipped gradients, so the model carries n times "
        "less noise than under local DP; the price is trusting the curator with every raw "
        "gradient.",
    ]
    for line in lines:
        print(textwrap.fill(line, width=width, subsequent_indent="  "))


def print_audit(rep: dict) -> None:
    n = rep["n"]
    print(
        f"audit of {rep['run_dir']}: n={n} steps={rep['steps']} fault-free={rep['fault_free']} "
        f"alpha={rep['alpha']} delta={rep['delta']:g}  (LDP eps={fmt(rep['ldp']['eps'])})"
    )
    if rep.get("central"):
        print_central(rep)
        print_faults(rep)
        print_integrity(rep, logs=False)
        return
    if "secldp" in rep:
        print_secldp(rep)
        rp = rep["secldp"]["realised_pairs"]
        print(
            f"pairs whose noise cancelled: {rp['matched_pairs_min']}..{rp['matched_pairs_max']} "
            "per round; pairwise below: observer = a curious user"
        )
    used: set[str] = set()
    obs = [o["observer"] for o in rep["observers"]]
    for method in ("exact", "paper"):
        cells, marks, raised, below = _audit_cells(rep, method, used)
        if n <= 16:
            print(f"\n{method}: eps_(u->v), rows = observer v, columns = source u")
            rows = [
                [str(v)]
                + ["." if u == v else fmt(cells[v].get(u)) + marks[v].get(u, "") for u in range(n)]
                for v in obs
            ]
            print(table(["v\\u"] + [str(u) for u in range(n)], rows))
        else:
            print(f"\n{method}: per observer (max and mean eps over sources)")
            rows = []
            for v in obs:
                shown, flags, low = cells[v], raised[v], below[v]
                vals = [shown[u] for u in range(n) if u in shown]
                flagged = sum(1 for u in range(n) if flags.get(u))
                n_below = sum(1 for u in range(n) if u in low)
                mark = baseline.BELOW_MARK if n_below else ""
                rows.append(
                    [str(v), fmt(max(vals)) + mark, fmt(float(np.mean(vals))) + mark,
                     str(flagged)] + ([str(n_below)] if method == "paper" else [])
                )  # fmt: skip
            head = ["observer", "eps max", "eps mean", "raised"]
            print(table(head + (["below exact"] if method == "paper" else []), rows))
    for basis, mark in MARKS.items():
        if mark in used:
            print(LEGEND[basis])
    if baseline.MARK in used:
        print(baseline.LEGEND)
    print_below_exact(rep)
    print_baseline(rep)
    notes = rep.get("notes", [])
    for x in notes:
        if x.get("kind") == "no-floor":
            print(f"note: {x['message']}")
    print_faults(rep)
    print_integrity(rep, logs=True)


def print_integrity(rep: dict, *, logs: bool) -> None:
    """The integrity findings of an audit or, when there are none and the run has view logs,
    that they all check out."""
    observers = [o["observer"] for o in rep["observers"]]
    if rep["integrity"]:
        print(
            f"\nintegrity findings ({len(rep['integrity'])}): the schedule of the nodes named "
            "below is partly assumed, so losses that depend on it are not certified"
        )
        for f in rep["integrity"][:50]:
            print(f"  node {f.get('node')}: {f['kind']}: {f['message']}")
        if len(rep["integrity"]) > 50:
            print(f"  ... and {len(rep['integrity']) - 50} more (cfree audit --json has them all)")
        if rep.get("conservative"):
            print(
                "every loss above is at least the fault-free plan's: entries the logs cannot "
                "certify are raised to it (or to the worst case)"
            )
    elif logs:
        print(
            f"\nintegrity: {len(observers)} log(s) intact, every received value matches its sender's log"
        )


def print_faults(rep: dict) -> None:
    """The faults injected into the run (faults.json) beside those the logs show."""
    faults = rep.get("faults")
    realised = rep.get("realised")
    kinds: dict[str, list] = {}
    for f in rep["integrity"]:
        kinds.setdefault(f["kind"], []).append(f.get("node"))
    if faults is None and not realised and not kinds:
        return
    print()
    if faults is not None:
        declared = faults.get("declared", [])
        injected = faults.get("injected", [])
        print(f"faults declared: {', '.join(declared) if declared else 'none'}")
        print(f"faults injected ({len(injected)}):")
        for f in injected:
            where = [f"{k} {f[k]}" for k in ("node", "step") if f.get(k) is not None] + (
                [f"t={f['t_s']:g}s"] if isinstance(f.get("t_s"), int | float) else []
            )
            detail = f": {f['detail']}" if f.get("detail") else ""
            print(f"  {f['fault']} ({', '.join(where)}){detail}")
        never = faults.get("not_applied") or []
        if isinstance(never, list) and never:
            print(f"faults never applied ({len(never)}):")
            for f in never:
                if isinstance(f, dict):
                    print(f"  {f.get('spec')}: {f.get('reason')}")
                else:  # a run directory written before the reasons were recorded
                    print(f"  {f}")
    seen = []
    if realised:
        seen.append(f"{realised.get('missed', 0)} value(s) missed")
        seen.append(f"{realised.get('late', 0)} late")
    for kind, nodes in kinds.items():
        named = sorted({n for n in nodes if isinstance(n, int)})
        at = f" (node{'s' if len(named) > 1 else ''} {', '.join(map(str, named))})" if named else ""
        seen.append(f"{kind} x{len(nodes)}{at}")
    print(f"faults the logs show: {'; '.join(seen) if seen else 'none'}")


def print_secldp(rep: dict) -> None:
    s = rep["secldp"]
    e, p = s["exact"], s["paper"]
    print(
        f"SecLDP against {s['adversary']} (a_{s['collusion']} = {fmt(s['algebraic_connectivity'])}):"
        f"  exact eps = {fmt(e['eps'])} (worst node {e['worst_node']}; the Gaussian profile of "
        f"its view; RDP conversion {fmt(e['eps_rdp'])}, paper's conversion "
        f"{fmt(e['eps_paper'])})  closed form eps = {fmt(p['eps'])} (RDP conversion; paper's "
        f"conversion {fmt(p['eps_paper'])})"
    )
    raised = [k for k in ("exact", "paper") if s[k].get("basis") == "plan"]
    if raised:
        print(
            f"  ({' and '.join(raised)} raised to the fault-free plan's: {s[raised[0]]['why']}; "
            "what the logs gave is in --json under from_logs)"
        )
