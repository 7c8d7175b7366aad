"""Did a run complete as planned? If not: which node, at which step, and why.

Read from the peers' result files (``results/node-<i>.json``) and the launcher's record of the
processes. A run completed as planned when every node finished, no value missed its step, and
every token walk completed without a re-route. Anything else is a problem, named by node, step
and cause, most telling first: a node that all of its neighbours missed (cut off, stopped,
killed) is named before the neighbours that missed it, and a node they missed at every step
since its first miss before one they missed now and then (a neighbour of a cut node falls
behind while it waits for the deadline, so its own neighbours miss some of its values too);
where both were missed at every step, the node that itself missed all of its neighbours (cut
off) before one that missed only some (waiting for it).

Pure code over JSON files: the launchers (``cfree run``, ``cfree lab run``) print it and exit
non-zero when there is any problem.
"""

from __future__ import annotations

import json
from pathlib import Path

from coordinator_free import rundir


def read_result(out_dir: Path, v: int) -> dict | None:
    """Node v's result file, or None when it is missing or unreadable."""
    try:
        res = json.loads(rundir.result_path(out_dir, v).read_text())
    except (OSError, ValueError):
        return None
    return res if isinstance(res, dict) else None


def read_results(out_dir: Path, n: int) -> dict[int, dict | None]:
    """Every node's result file (None for a node without one)."""
    return {v: read_result(out_dir, v) for v in range(n)}


def problems(plan, results: dict, failed: list[dict], *, walks: bool) -> list[dict]:
    """``[{"node", "step", "cause"}, ...]``, empty when the run completed as planned.
    ``results``: :func:`read_results`; ``failed``: ``{"node", "returncode", "error", "step"}``
    of the peer processes that exited non-zero (the launcher knows them)."""
    out: list[dict] = []
    failed_nodes = set()
    for f in failed:
        failed_nodes.add(f["node"])
        out.append(
            {
                "node": f["node"],
                "step": f.get("step"),
                "cause": f"process failed (exit {f.get('returncode')}): {f['error']}",
            }
        )
    for v, res in results.items():
        if res is None and v not in failed_nodes:
            out.append({"node": v, "step": None, "cause": "finished without a result file"})
    if walks:
        out += _walk_problems(plan, results)
    else:
        out += _step_problems(plan, results)
    return out


def _step_problems(plan, results: dict) -> list[dict]:
    """Missed values, grouped by the node that was missed."""
    by_peer: dict[int, dict[int, list[dict]]] = {}
    for v, res in results.items():
        for m in (res or {}).get("missed", []) or []:
            if not isinstance(m, dict) or not isinstance(m.get("peer"), int):
                continue
            by_peer.setdefault(m["peer"], {}).setdefault(v, []).append(m)
    steps = [
        m["step"]
        for observers in by_peer.values()
        for ms in observers.values()
        for m in ms
        if isinstance(m.get("step"), int)
    ]
    last = max(steps, default=0)
    rows = []
    for p, observers in by_peer.items():
        first = min((m for ms in observers.values() for m in ms), key=lambda m: m.get("step", 0))
        count = sum(len(ms) for ms in observers.values())
        nbrs = plan.neighbours(p) if 0 <= p < plan.n else []
        share = len(observers) / max(1, len(nbrs))
        # How much of what its neighbours could have missed from its first miss to the last miss
        # of the run they did miss: 1 for a node cut off, stopped or killed (missed every step
        # since), less for a neighbour of it that only fell behind now and then while waiting.
        start = first.get("step") if isinstance(first.get("step"), int) else 0
        density = count / max(1, len(nbrs) * (last - start + 1))
        # The share of its neighbours it missed itself: a node cut off misses them all, a
        # neighbour that fell behind waiting for it misses only the node it waited for.
        own = {
            m.get("peer")
            for m in (results.get(p) or {}).get("missed", []) or []
            if isinstance(m, dict)
        }
        isolated = len(own.intersection(nbrs)) / max(1, len(nbrs))
        reasons = sorted({m.get("reason", "?") for ms in observers.values() for m in ms})
        who = ", ".join(str(w) for w in sorted(observers))
        whom = (
            f"all {len(nbrs)} of its neighbours ({who})"
            if len(observers) == len(nbrs) and len(nbrs) > 1
            else f"node(s) {who}"
        )
        rows.append(
            (
                -share,
                -round(density, 6),
                -isolated,
                -count,
                p,
                {
                    "node": p,
                    "step": first.get("step"),
                    "cause": f"its values were missed by {whom} from step {first.get('step')} "
                    f"({count} miss(es); {', '.join(reasons)})",
                },
            )
        )
    return [r[-1] for r in sorted(rows, key=lambda r: r[:5])]


def _walk_problems(plan, results: dict) -> list[dict]:
    """Walks that did not complete, and re-routes."""
    ends: dict[int, dict] = {}
    reroutes: list[dict] = []
    for v, res in results.items():
        if res is None:
            continue
        walks_ = res.get("walks") or {}
        for j, e in (walks_.get("ended") or {}).items():
            if isinstance(e, dict):
                ends.setdefault(int(j), e)
        for r in res.get("missed", []) or []:
            if isinstance(r, dict):
                reroutes.append({**r, "at": v})
    out = []
    for j in range(getattr(plan, "tokens", 0)):
        e = ends.get(j)
        if e is None:
            out.append({"node": None, "step": None, "cause": f"walk {j}: no node saw it end"})
            continue
        if e.get("how") == "completed":
            continue
        away = sorted({r["peer"] for r in reroutes if r.get("token") == j})
        tail = f"; re-routed away from node(s) {', '.join(map(str, away))}" if away else ""
        out.append(
            {
                "node": away[0] if len(away) == 1 else e.get("at"),
                "step": e.get("step"),
                "cause": f"walk {j} {e.get('how')} at node {e.get('at')}, step {e.get('step')}"
                + tail,
            }
        )
    for r in reroutes:
        j = r.get("token")
        if ends.get(j, {}).get("how") == "completed":
            out.append(
                {
                    "node": r.get("peer"),
                    "step": r.get("step"),
                    "cause": f"walk {j} re-routed at node {r['at']} away from node "
                    f"{r.get('peer')} at step {r.get('step')} ({r.get('reason')})",
                }
            )
    return out


def render(problems_: list[dict], limit: int = 8) -> list[str]:
    """Lines for the terminal: ``node N, step S: cause``."""
    lines = []
    for p in problems_[:limit]:
        where = "run" if p["node"] is None else f"node {p['node']}"
        if p.get("step") is not None:
            where += f", step {p['step']}"
        lines.append(f"{where}: {p['cause']}")
    if len(problems_) > limit:
        lines.append(f"... and {len(problems_) - limit} more (summary.json: 'problems')")
    return lines
