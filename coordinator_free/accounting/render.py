"""Text rendering of plan and audit reports for people: number formatting, tables, the per-pair
loss matrices of an audit and DECOR's SecLDP block. Used by the CLI and by the compose
auditor role (which prints an audit inside its container)."""

from __future__ import annotations

import numpy as np


def fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    if abs(x) >= 1e4 or abs(x) < 1e-3:
        return f"{x:.2e}"
    return f"{x:.4f}"


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    for r in rows:
        out.append("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    return "\n".join(out)


def audit_matrix(
    rep: dict, method: str, key: str = "eps"
) -> tuple[list[int], dict[tuple[int, int], float]]:
    cells = {}
    for o in rep["observers"]:
        for x in o["losses"]:
            if x["method"] == method:
                cells[(o["observer"], x["source"])] = x[key]
    return [o["observer"] for o in rep["observers"]], cells


def print_audit(rep: dict) -> None:
    n = rep["n"]
    print(
        f"audit of {rep['run_dir']}: n={n} steps={rep['steps']} fault-free={rep['fault_free']} "
        f"alpha={rep['alpha']} delta={rep['delta']:g}  (LDP eps={fmt(rep['ldp']['eps'])})"
    )
    if "secldp" in rep:
        print_secldp(rep)
        rp = rep["secldp"]["realised_pairs"]
        print(
            f"pairs whose noise cancelled: {rp['matched_pairs_min']}..{rp['matched_pairs_max']} "
            "per round; pairwise below: observer = a curious user"
        )
    observers = [o["observer"] for o in rep["observers"]]
    for method in ("exact", "paper"):
        obs, cells = audit_matrix(rep, method)
        if n <= 16:
            print(f"\n{method}: eps_(u->v), rows = observer v, columns = source u")
            rows = [
                [str(v)] + [("." if u == v else fmt(cells[(v, u)])) for u in range(n)] for v in obs
            ]
            print(table(["v\\u"] + [str(u) for u in range(n)], rows))
        else:
            print(f"\n{method}: per observer (max and mean eps over sources)")
            rows = []
            for v in obs:
                vals = [cells[(v, u)] for u in range(n) if u != v]
                rows.append([str(v), fmt(max(vals)), fmt(float(np.mean(vals)))])
            print(table(["observer", "eps max", "eps mean"], rows))
    notes = rep.get("notes", [])
    if notes:
        print(
            f"\n{len(notes)} pair(s) where Eq. (6) is below the exact loss (the paper's bound is not an upper bound there)"
        )
    if rep["integrity"]:
        print(
            f"\nintegrity findings ({len(rep['integrity'])}): the schedule of the nodes named "
            "below is partly assumed, so losses that depend on it are not certified"
        )
        for f in rep["integrity"][:50]:
            print(f"  node {f.get('node')}: {f['kind']}: {f['message']}")
    else:
        print(
            f"\nintegrity: {len(observers)} log(s) intact, every received value matches its sender's log"
        )


def print_secldp(rep: dict) -> None:
    s = rep["secldp"]
    e, p = s["exact"], s["paper"]
    print(
        f"SecLDP against {s['adversary']} (a_{s['collusion']} = {fmt(s['algebraic_connectivity'])}):"
        f"  exact eps = {fmt(e['eps'])} (worst node {e['worst_node']}; paper's conversion "
        f"{fmt(e['eps_paper'])}, Gaussian {fmt(e['eps_gdp'])})  closed form eps = "
        f"{fmt(p['eps'])} (paper's conversion {fmt(p['eps_paper'])})"
    )
