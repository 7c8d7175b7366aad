"""``cfree report --html``: one self-contained HTML page of a run.

The page needs nothing but itself: the charts are inline SVG, the style and the script are
inline, and a Content-Security-Policy forbids the browser to fetch anything (no font, image,
script or style from any address). It holds:

- the run summary (protocol, graph, nodes, steps, fault-free, local-DP and worst eps);
- per-node status (finished or not, last step, misses, findings) and a timeline of the faults:
  injected faults and every value a node logged as missed, by step;
- the eps heat map (rows observer v, columns source u), its value on hover;
- the loss against the hop distance, with the local-DP line;
- the accuracy curves of learning runs (``metrics.jsonl``);
- the audit's integrity findings and notes;
- plan against audit: every pair's fault-free planned eps next to the audited one.

Works without the script too (every cell carries its value as an SVG ``<title>``); the script
adds the hover read-out and marks the page ready (``<html data-ready="1">``). Heat maps of more
than :data:`HEAT_MAX` nodes are drawn in blocks, each showing the largest eps of its pairs, so
a block never shows less than any pair in it.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

from coordinator_free import rundir
from coordinator_free.accounting.baseline import BELOW_LEGEND, BELOW_MARK

HEAT_MAX = 96
#: The viridis colour map at five points (0, 0.25, 0.5, 0.75, 1).
_VIRIDIS = [(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)]
FILE = "report.html"


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _num(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "∞"
    if isinstance(x, float) and math.isnan(x):
        return "NaN"
    return f"{x:.{digits}g}"


def _colour(t: float) -> str:
    """viridis at t in [0, 1], linearly between its five anchor colours."""
    t = min(1.0, max(0.0, t))
    k = min(3, int(t * 4))
    f = t * 4 - k
    a, b = _VIRIDIS[k], _VIRIDIS[k + 1]
    r, g, bl = (round(a[i] + (b[i] - a[i]) * f) for i in range(3))
    return f"#{r:02x}{g:02x}{bl:02x}"


# ------------------------------------------------------------------------------ the data


def _read_json(path: Path, notes: list[str]) -> Any:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        notes.append(f"{path.name}: unreadable ({exc}); left out of the report")
        return None


def node_status(run_dir: Path, n: int, audit: dict, notes: list[str]) -> list[dict]:
    """Per node: has a result, how its view log ends, its last step, the values it missed
    (step, peer, reason), and the audit's findings about it."""
    from coordinator_free.viewlog import read_viewlog

    findings: dict[int, list[str]] = {}
    for f in audit.get("integrity") or []:
        if isinstance(f, dict) and isinstance(f.get("node"), int):
            findings.setdefault(f["node"], []).append(f"{f.get('kind')}: {f.get('message')}")
    rows = []
    for i in range(n):
        row: dict[str, Any] = {
            "node": i,
            "result": rundir.result_path(run_dir, i).exists(),
            "end": "no log",
            "last_step": None,
            "misses": [],
            "intact": None,
            "findings": findings.get(i, []),
        }
        path = rundir.log_path(run_dir, i)
        if path.exists():
            try:
                vl = read_viewlog(path)
            except OSError as exc:
                row["end"] = f"unreadable: {exc.strerror or exc}"
            else:
                row["intact"] = vl.intact
                recs = vl.records
                row["end"] = recs[-1]["k"] if recs else "empty"
                steps = [r["step"] for r in recs if isinstance(r.get("step"), int)]
                row["last_step"] = max(steps) if steps else None
                row["misses"] = [
                    (r.get("step"), r.get("peer"), r.get("reason"))
                    for r in recs
                    if r.get("k") == "miss"
                ]
        rows.append(row)
    if not any(r["end"] != "no log" for r in rows):
        notes.append("no view logs in the run directory: per-node status from results only")
    return rows


def planned(run_dir: Path, audit: dict, notes: list[str]) -> dict[tuple[int, int, str], float]:
    """(observer, source, method) -> the fault-free plan's eps, for the observers audited."""
    from coordinator_free.accounting.audit import load_run
    from coordinator_free.families import family_of

    try:
        cfg, plan = load_run(run_dir)
        observers = sorted(
            {o["observer"] for o in audit.get("observers", []) if isinstance(o, dict)}
        )
        table = family_of(cfg.protocol.name).planned_losses(cfg, plan, observers)
    except NotImplementedError:
        notes.append("plan against audit: this protocol's family has no per-pair plan")
        return {}
    except Exception as exc:  # a config that no longer loads: the rest of the page still shows
        notes.append(f"plan against audit: the plan could not be made ({exc})")
        return {}
    out = {}
    for v, by in table.items():
        for (u, m), x in by.items():
            if isinstance(x, dict) and isinstance(x.get("eps"), int | float):
                out[(v, u, m)] = float(x["eps"])
    return out


# ------------------------------------------------------------------------------ the charts


def _axis_ticks(lo: float, hi: float, k: int = 5) -> list[float]:
    if not hi > lo:
        return [lo]
    return [lo + (hi - lo) * i / (k - 1) for i in range(k)]


def heatmap_svg(
    n: int, eps: dict[tuple[int, int], float], ldp: float, marks: Any = frozenset()
) -> str:
    """Rows observer v, columns source u; blocks of several nodes (showing their largest eps)
    beyond HEAT_MAX nodes. ``marks``: the (v, u) pairs whose figure is below the exact loss
    (a ``!`` on the cell, or on a block holding one)."""
    block = max(1, math.ceil(n / HEAT_MAX))
    m = math.ceil(n / block)
    cells: dict[tuple[int, int], float] = {}
    for (v, u), x in eps.items():
        key = (v // block, u // block)
        cells[key] = max(cells.get(key, -math.inf), x)
    marked = {(v // block, u // block) for v, u in marks}
    finite = [x for x in cells.values() if math.isfinite(x)]
    vmax = max([*finite, ldp if math.isfinite(ldp) else 0.0, 1e-12])
    size = max(4, min(36, 640 // m))
    pad = 40
    w = pad + m * size + 90
    h = pad + m * size + 30
    parts = [
        f'<svg class="heat" viewBox="0 0 {w} {h}" width="{w}" height="{h}" '
        f'role="img" aria-label="eps heat map">'
    ]
    for (bv, bu), x in sorted(cells.items()):
        colour = "#c62828" if math.isinf(x) else _colour(x / vmax)
        if block == 1:
            what = f"observer {bv} ← source {bu}: ε = {_num(x)}"
        else:
            v0, u0 = bv * block, bu * block
            vr = f"{v0}–{min(n, v0 + block) - 1}"
            ur = f"{u0}–{min(n, u0 + block) - 1}"
            what = f"observers {vr} ← sources {ur}: largest ε = {_num(x)}"
        if (bv, bu) in marked:
            what += f" {BELOW_MARK} (below the exact loss)"
        parts.append(
            f'<rect class="cell" x="{pad + bu * size}" y="{pad + bv * size}" width="{size}" '
            f'height="{size}" fill="{colour}" data-v="{bv}" data-u="{bu}" data-eps="{_num(x, 6)}">'
            f"<title>{_e(what)}</title></rect>"
        )
        if (bv, bu) in marked:
            parts.append(_cell_mark(pad + bu * size, pad + bv * size, size))
    step = max(1, m // 8)
    for k in range(0, m, step):
        label = k * block
        parts.append(
            f'<text x="{pad + k * size + size / 2}" y="{pad - 6}" class="tick" '
            f'text-anchor="middle">{label}</text>'
        )
        parts.append(
            f'<text x="{pad - 6}" y="{pad + k * size + size / 2 + 4}" class="tick" '
            f'text-anchor="end">{label}</text>'
        )
    # The colour bar, with the local-DP eps marked.
    bx = pad + m * size + 20
    for k in range(50):
        y = pad + (49 - k) * (m * size) / 50
        parts.append(
            f'<rect x="{bx}" y="{y:.1f}" width="14" height="{m * size / 50 + 0.5:.1f}" '
            f'fill="{_colour(k / 49)}"/>'
        )
    parts.append(f'<text x="{bx + 18}" y="{pad + 8}" class="tick">{_num(vmax, 3)}</text>')
    parts.append(f'<text x="{bx + 18}" y="{pad + m * size}" class="tick">0</text>')
    if math.isfinite(ldp) and 0 < ldp <= vmax:
        y = pad + m * size * (1 - ldp / vmax)
        parts.append(
            f'<line x1="{bx - 3}" x2="{bx + 17}" y1="{y:.1f}" y2="{y:.1f}" stroke="red" '
            f'stroke-width="2"><title>local DP: ε = {_num(ldp)}</title></line>'
        )
    parts.append(
        f'<text x="{pad}" y="{h - 8}" class="tick">columns: source u · rows: observer v'
        + (f" · blocks of {block} nodes, largest ε shown" if block > 1 else "")
        + "</text></svg>"
    )
    return "".join(parts)


def _cell_mark(x: float, y: float, size: int) -> str:
    """The ``!`` drawn on a heat-map cell whose figure is below the exact loss."""
    return (
        f'<text class="below" x="{x + size / 2}" y="{y + size / 2 + 4}" text-anchor="middle" '
        f'pointer-events="none">{BELOW_MARK}</text>'
    )


def below_exact(audit: dict, method: str) -> tuple[dict[tuple[int, int], float], int]:
    """(observer, source) -> the exact eps of each ``method`` entry the accountant flagged below
    it (``below_exact``; only paper entries are), and the count of such pairs (its
    ``baseline.paper_below_exact``)."""
    flagged = {
        (o["observer"], x["source"]): float(x["eps_exact"])
        for o in audit.get("observers", [])
        for x in o.get("losses", [])
        if x.get("method") == method and x.get("below_exact") is True and "eps_exact" in x
    }
    count = (audit.get("baseline") or {}).get("paper_below_exact") if flagged else 0
    return flagged, max(count if isinstance(count, int) else 0, len(flagged))


def below_exact_html(flagged: dict[tuple[int, int], float], count: int, method: str) -> str:
    """The legend of the ``!`` mark with the count and the marked pairs beside their exact loss
    ('' when none is marked)."""
    if not flagged:
        return ""
    rows = [[str(v), str(u), _e(BELOW_MARK), _num(e)] for (v, u), e in sorted(flagged.items())]
    return (
        f'<p id="below-exact"><strong>{_e(BELOW_MARK)} {count} pair(s)</strong>: '
        f"{_e(BELOW_LEGEND.removeprefix(BELOW_MARK).strip())} (the {_e(method)} figure of each "
        "is marked on the heat map and the points).</p>"
        + _table(["observer v", "source u", f"{method} ε", "exact ε"], rows, {0, 1, 3})
    )


def _scatter(
    points: list[tuple[float, float, str]],
    *,
    xlabel: str,
    ylabel: str,
    hline: tuple[float, str] | None = None,
    diagonal: bool = False,
    css: str = "pt",
    lines: list[tuple[list[tuple[float, float]], str, str]] | None = None,
) -> str:
    """An SVG scatter (and optional polylines) with linear axes; each point titled."""
    w, h, pad = 640, 340, 56
    xs = [p[0] for p in points] + [x for ln in lines or [] for x, _ in ln[0]]
    ys = [p[1] for p in points] + [y for ln in lines or [] for _, y in ln[0]]
    if hline:
        ys.append(hline[0])
    if diagonal:
        xs, ys = xs + ys, ys + xs
    if not xs:
        return '<p class="muted">nothing to plot</p>'
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(0.0, min(ys)), max(ys)
    if diagonal:  # the same scale on both axes, from 0
        x0 = y0 = min(x0, y0)
        x1 = y1 = max(x1, y1)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y1 = y0 + 1

    def sx(x: float) -> float:
        return pad + (x - x0) / (x1 - x0) * (w - 2 * pad)

    def sy(y: float) -> float:
        return h - pad + -(y - y0) / (y1 - y0) * (h - 2 * pad)

    out = [f'<svg class="chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}">']
    out.append(
        f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" class="axis"/>'
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" class="axis"/>'
    )
    integral = all(float(x).is_integer() for x in xs) and x1 - x0 <= 40
    xticks = (
        list(range(math.ceil(x0), math.floor(x1) + 1, max(1, round((x1 - x0) / 10))))
        if integral
        else _axis_ticks(x0, x1)
    )
    for t in xticks:
        out.append(
            f'<text x="{sx(t):.1f}" y="{h - pad + 16}" class="tick" text-anchor="middle">'
            f"{_num(t, 3)}</text>"
        )
    for t in _axis_ticks(y0, y1):
        out.append(
            f'<text x="{pad - 6}" y="{sy(t) + 4:.1f}" class="tick" text-anchor="end">'
            f"{_num(t, 3)}</text>"
            f'<line x1="{pad}" x2="{w - pad}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" class="grid"/>'
        )
    if diagonal:
        lo, hi = max(x0, y0), min(x1, y1)
        out.append(
            f'<line x1="{sx(lo):.1f}" y1="{sy(lo):.1f}" x2="{sx(hi):.1f}" y2="{sy(hi):.1f}" '
            'class="diag"><title>audit = plan</title></line>'
        )
    if hline:
        y, label = hline
        out.append(
            f'<line x1="{pad}" x2="{w - pad}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" class="ldp">'
            f"<title>{_e(label)}</title></line>"
            f'<text x="{w - pad}" y="{sy(y) - 4:.1f}" class="tick ldp-label" text-anchor="end">'
            f"{_e(label)}</text>"
        )
    for pts, cls, label in lines or []:
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        out.append(f'<polyline points="{path}" class="{cls}"><title>{_e(label)}</title></polyline>')
    for x, y, title in points:
        out.append(
            f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" class="{css}">'
            f"<title>{_e(title)}</title></circle>"
        )
    out.append(
        f'<text x="{w / 2}" y="{h - 12}" class="label" text-anchor="middle">{_e(xlabel)}</text>'
        f'<text x="14" y="{h / 2}" class="label" text-anchor="middle" '
        f'transform="rotate(-90 14 {h / 2})">{_e(ylabel)}</text></svg>'
    )
    return "".join(out)


def timeline_svg(rows: list[dict], steps: int, injected: list[dict]) -> str:
    """One row per node: its logged steps as a bar, each value it missed as a dot at that
    step, each injected fault as a red cross."""
    n = len(rows)
    rh = max(3, min(16, 480 // max(1, n)))
    w, pad, left = 720, 24, 56
    h = pad * 2 + n * rh
    last = [f["step"] for f in injected if isinstance(f.get("step"), int)]
    span = max([1, steps, *last])

    def sx(step: float) -> float:
        return left + step / span * (w - left - pad)

    out = [f'<svg class="timeline" viewBox="0 0 {w} {h}" width="{w}" height="{h}">']
    for r in rows:
        y = pad + r["node"] * rh
        if r["last_step"] is not None:
            ok = "bar-ok" if r["end"] == "finished" else "bar-bad"
            out.append(
                f'<rect x="{left}" y="{y + 1}" width="{max(1.0, sx(r["last_step"]) - left):.1f}" '
                f'height="{rh - 2}" class="{ok}"><title>node {r["node"]}: steps 0–'
                f"{r['last_step']}, log ends with {_e(r['end'])}</title></rect>"
            )
        if n <= 64 or r["node"] % max(1, n // 16) == 0:
            out.append(
                f'<text x="{left - 6}" y="{y + rh - 2}" class="tick" text-anchor="end">'
                f"{r['node']}</text>"
            )
        for step, peer, reason in r["misses"][:500]:
            if isinstance(step, int):
                out.append(
                    f'<circle cx="{sx(step):.1f}" cy="{y + rh / 2}" r="{max(1.5, rh / 3)}" '
                    f'class="miss"><title>node {r["node"]} missed node {_e(peer)}\'s value at '
                    f"step {step} ({_e(reason)})</title></circle>"
                )
    for f in injected:
        node, step = f.get("node"), f.get("step")
        if isinstance(node, int) and isinstance(step, int) and 0 <= node < n:
            x, y = sx(step), pad + node * rh + rh / 2
            d = max(3, rh / 2)
            out.append(
                f'<path d="M{x - d:.1f},{y - d:.1f}L{x + d:.1f},{y + d:.1f}M{x - d:.1f},'
                f'{y + d:.1f}L{x + d:.1f},{y - d:.1f}" class="fault"><title>injected '
                f"{_e(f.get('spec') or f.get('fault'))} on node {node} at step {step}"
                "</title></path>"
            )
    for t in _axis_ticks(0, span):
        out.append(
            f'<text x="{sx(t):.1f}" y="{h - 6}" class="tick" text-anchor="middle">{round(t)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


# ------------------------------------------------------------------------------ the page

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#1d1d1f;
padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px}td,th{padding:3px 8px;border-bottom:1px solid #eee;
text-align:left}th{background:#f6f6f6}.num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;padding:2px 8px;border-radius:10px;font-weight:600;font-size:12px}
.ok{background:#e3f4e5;color:#1b5e20}.bad{background:#fde7e7;color:#b71c1c}
.muted{color:#777}.below{font-size:12px;font-weight:bold;fill:#c62828}.tick{font-size:10px;fill:#555}.label{font-size:12px;fill:#333}
.axis{stroke:#333}.grid{stroke:#eee}.diag{stroke:#999;stroke-dasharray:4 3}
.ldp{stroke:#c62828;stroke-dasharray:6 3}.ldp-label{fill:#c62828}
.pt{fill:#1f77b4;fill-opacity:.55}.pt2{fill:#ff7f0e}.mean{fill:none;stroke:#ff7f0e;stroke-width:2}
.acc{fill:none;stroke:#ff7f0e;stroke-width:2}.band{fill:none;stroke:#1f77b4;stroke-width:1}.ref{fill:none;stroke:#555;stroke-dasharray:3 3}
.bar-ok{fill:#c8e6c9}.bar-bad{fill:#ffcdd2}.miss{fill:#ef6c00}.fault{stroke:#c62828;
stroke-width:2.5}.cell:hover,.picked{stroke:#000;stroke-width:1.5}
#hover{min-height:1.4em;font-weight:600}dl{display:grid;grid-template-columns:max-content auto;
gap:2px 14px;margin:0}dt{color:#555}dd{margin:0}
"""

SCRIPT = """
(function () {
  var out = document.getElementById('hover');
  var cells = document.querySelectorAll('svg.heat rect.cell');
  function show(r) {
    cells.forEach(function (c) { c.classList.remove('picked'); });
    r.classList.add('picked');
    if (out) { out.textContent = r.querySelector('title').textContent; }
  }
  cells.forEach(function (r) {
    r.addEventListener('mouseenter', function () { show(r); });
    r.addEventListener('click', function () {
      history.replaceState(null, '', '#pair=' + r.dataset.v + ',' + r.dataset.u);
      show(r);
    });
  });
  // #pair=V,U (a link to one pair): that cell's value, as if hovered.
  var m = /^#pair=(\\d+),(\\d+)$/.exec(location.hash);
  if (m) {
    var r = document.querySelector('svg.heat rect.cell[data-v="' + m[1] + '"][data-u="' + m[2] + '"]');
    if (r) { show(r); } else if (out) { out.textContent = 'no pair ' + m[1] + ',' + m[2]; }
  }
  var count = document.getElementById('cells');
  if (count) { count.textContent = String(cells.length); }
  document.documentElement.setAttribute('data-ready', '1');
})();
"""


def _table(head: list[str], rows: list[list[str]], num: set[int] | None = None) -> str:
    num = num or set()
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{c}</td>' if k in num else f"<td>{c}</td>" for k, c in enumerate(r)
        )
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def build_html(
    run_dir: Path, audit: dict, *, method: str, notes: list[str], metrics: Any = None
) -> str:
    """The page; ``metrics``: the run's ``report.Metrics`` (learning runs), or None."""
    n = int(audit["n"])
    cfg_text = rundir.config_path(run_dir)
    summary = _read_json(rundir.summary_path(run_dir), notes) or {}
    faults = audit.get("faults") or _read_json(rundir.faults_path(run_dir), notes) or {}
    rows = node_status(run_dir, n, audit, notes)
    ldp = float((audit.get("ldp") or {}).get("eps", math.nan))
    pairs = _pair_losses(audit, method)
    title, graph = _title_and_graph(run_dir, cfg_text)
    parts = _head(title, audit)
    parts += _summary(audit, method, n, graph, ldp, pairs, summary, run_dir, cfg_text)
    parts += _nodes(rows)
    parts += _faults(audit, faults, rows)
    parts += _privacy_loss(audit, method, n, ldp, pairs)
    parts += _accuracy(metrics, summary)
    parts += _yardstick(summary)
    parts += _integrity(audit)
    parts += _plan_against_audit(planned(run_dir, audit, notes), pairs, method)
    parts += _notes(audit, notes)
    parts.append(f"<script>{SCRIPT}</script></body></html>\n")
    return "".join(parts)


def _pair_losses(audit: dict, method: str) -> dict[tuple[int, int], tuple[float, int]]:
    """(observer, source) -> (eps, hop distance) of ``method``, between distinct nodes."""
    pairs: dict[tuple[int, int], tuple[float, int]] = {}
    for o in audit.get("observers", []):
        for x in o.get("losses", []):
            if x.get("method") == method and x.get("source") != o.get("observer"):
                pairs[(o["observer"], x["source"])] = (float(x["eps"]), x.get("distance", -1))
    return pairs


def _title_and_graph(run_dir: Path, cfg_text: Path) -> tuple[str, str]:
    try:
        from coordinator_free import config as config_mod

        cfg = config_mod.load(cfg_text)
        return cfg.run.name, cfg.graph.kind
    except Exception:  # no config, or one that no longer loads: the audit still shows
        return run_dir.resolve().name, "–"


def _badge(ok: bool, yes: str, no: str) -> str:
    return f'<span class="badge {"ok" if ok else "bad"}">{_e(yes if ok else no)}</span>'


def _head(title: str, audit: dict) -> list[str]:
    """The document head, the title and the run's badges."""
    fault_free = audit.get("fault_free") is True
    return [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">",
        f"<title>cfree report: {_e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>Run {_e(title)}</h1>",
        f"<p>{_badge(fault_free, 'fault-free', 'NOT fault-free')} "
        f"{_badge(not audit.get('integrity'), 'no integrity findings', 'integrity findings')} "
        f"{_badge(audit.get('complete') is not False, 'complete', 'incomplete')}</p>",
    ]


def _summary(audit, method, n, graph, ldp, pairs, summary, run_dir, cfg_text) -> list[str]:
    worst = max((e for e, _ in pairs.values()), default=None)
    flagged, n_below = below_exact(audit, method)
    facts = [
        ("protocol", audit.get("protocol")),
        ("graph", graph),
        ("nodes", n),
        ("steps", audit.get("steps")),
        ("Rényi order α, δ", f"{audit.get('alpha')}, {audit.get('delta')}"),
        ("local-DP ε (everything a node sends, composed)", _num(ldp)),
        (f"worst pairwise ε ({method})", _num(worst)),
        *([(f"{method} figures below the exact loss ({BELOW_MARK})", n_below)] if flagged else []),
        ("wall time", f"{summary['wall_s']:.1f} s" if "wall_s" in summary else "–"),
        ("run directory", str(run_dir)),
        ("config", str(cfg_text) if cfg_text.exists() else "missing"),
    ]
    return [
        '<h2 id="summary">Summary</h2><dl>',
        *(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts),
        "</dl>",
    ]


def _nodes(rows: list[dict]) -> list[str]:
    node_rows = []
    for r in rows:
        ok = r["result"] and r["end"] == "finished" and not r["findings"]
        node_rows.append([
            str(r["node"]),
            _badge(ok, "finished", "finished" if r["result"] else "no result"),
            _e(r["end"]) + ("" if r["intact"] in (None, True) else " (damaged)"),
            _e(r["last_step"] if r["last_step"] is not None else "–"),
            str(len(r["misses"])),
            "<br>".join(_e(f) for f in r["findings"]) or '<span class="muted">–</span>',
        ])  # fmt: skip
    return [
        '<h2 id="nodes">Nodes</h2>',
        _table(
            ["node", "status", "log ends with", "last step", "missed values", "findings"],
            node_rows,
            {0, 3, 4},
        ),
    ]


def _faults(audit: dict, faults: dict, rows: list[dict]) -> list[str]:
    """The declared and injected faults, and the timeline of every node's steps."""
    injected = [f for f in faults.get("injected", []) if isinstance(f, dict)]
    declared = faults.get("declared") or []
    steps = int(audit.get("steps") or max([r["last_step"] or 0 for r in rows] + [1]))
    return [
        '<h2 id="faults">Faults over time</h2>',
        "<p>declared: "
        + (", ".join(f"<code>{_e(d)}</code>" for d in declared) or "none")
        + f" · injected: {len(injected)} · missed values logged: "
        + f"{sum(len(r['misses']) for r in rows)}</p>",
        timeline_svg(rows, steps, injected),
        '<p class="muted">bar: steps a node logged (green: its log ends finished); orange '
        "dot: a value it missed; red cross: an injected fault.</p>",
    ]


def _privacy_loss(audit: dict, method: str, n: int, ldp: float, pairs: dict) -> list[str]:
    """The pair map and the loss against distance (central DP: the one loss, no pairs)."""
    parts = [f'<h2 id="heatmap">Pairwise privacy loss ε(u→v), {_e(method)}</h2>']
    flagged, n_below = below_exact(audit, method)
    if audit.get("central") is True:
        every = [
            float(x["eps"])
            for o in audit.get("observers", [])
            for x in o.get("losses", [])
            if x.get("method") == method
        ]
        eps_c = max(every, default=ldp)
        parts.append(
            f"<p><strong>central DP (a trusted curator, no graph)</strong>: every user loses "
            f"ε = {_num(eps_c)} to anyone who sees the released models; no pairs to map.</p>"
        )
    elif pairs:
        parts.append(heatmap_svg(n, {k: e for k, (e, _d) in pairs.items()}, ldp, flagged))
        parts.append(
            '<p id="hover" class="muted">hover a cell for its value (a click links to it)</p>'
        )
        parts.append('<p class="muted"><span id="cells">?</span> cells drawn</p>')
        pts = [
            (
                float(d),
                e,
                f"{u}→{v}: ε = {_num(e)}{BELOW_MARK * ((v, u) in flagged)} at distance {d}",
            )
            for (v, u), (e, d) in pairs.items()
            if isinstance(d, int) and d >= 0 and math.isfinite(e)
        ]
        by_d: dict[int, list[float]] = {}
        for x, e, _t in pts:
            by_d.setdefault(int(x), []).append(e)
        mean = [(float(d), sum(v) / len(v)) for d, v in sorted(by_d.items())]
        parts.append('<h2 id="distance">Loss against distance</h2>')
        parts.append(
            _scatter(
                pts,
                xlabel="hop distance between u and v",
                ylabel="ε(u→v)",
                hline=(ldp, f"local DP ε = {_num(ldp, 3)}") if math.isfinite(ldp) else None,
                lines=[(mean, "mean", "mean per distance")],
            )
        )
        parts.append(below_exact_html(flagged, n_below, method))
        infinite = sum(1 for e, _d in pairs.values() if math.isinf(e))
        if infinite:
            parts.append(
                f"<p><strong>{infinite} pair(s) at ε = ∞</strong> (red cells): no privacy "
                "for them.</p>"
            )
    else:
        parts.append(f'<p class="muted">no {_e(method)} losses between distinct nodes</p>')
        parts.append('<p id="hover"></p><p class="muted"><span id="cells">?</span> cells</p>')
    return parts


def _accuracy(m: Any, summary: dict | None = None) -> list[str]:
    """Test accuracy (or loss) by round, of a learning run's metrics, with the references of
    ``summary`` (summary.json) as flat lines; nothing when there are no metrics."""
    if m is None or not m.rounds.size:
        return []
    gap = m.columns.get("objective_gap")
    if gap is not None and (gap == gap).any():
        return _objective_gap(m, summary)
    acc = m.columns["avg_test_accuracy"]
    key = "avg_test_accuracy" if (acc == acc).any() else "avg_test_loss"
    label = "test accuracy" if key == "avg_test_accuracy" else "test loss"
    series = [(float(r), float(y)) for r, y in zip(m.rounds, m.columns[key], strict=True) if y == y]
    lines = [(series, "acc", f"{label}, node-average model")]
    for k in ("node_test_accuracy_min", "node_test_accuracy_max"):
        col = m.columns[k]
        if key == "avg_test_accuracy" and (col == col).any():
            pts = [(float(r), float(y)) for r, y in zip(m.rounds, col, strict=True)]
            lines.append(([p for p in pts if p[1] == p[1]], "band", k))
    ref = (summary or {}).get("reference")
    ref_key = key.removeprefix("avg_")
    if isinstance(ref, dict) and series:
        lo, hi = series[0][0], series[-1][0]
        for name, what in (("noise_free", "without noise (sigma = 0)"), ("trivial", "trivial")):
            y = (ref.get(name) or {}).get(ref_key)
            if isinstance(y, int | float) and math.isfinite(y):
                lines.append(
                    ([(lo, float(y)), (hi, float(y))], "ref", f"reference {what}: {_num(y)}")
                )
    pts2 = [(x, y, f"round {int(x)}: {label} {_num(y)}") for x, y in series]
    return [
        f'<h2 id="accuracy">{_e(label.capitalize())} by round</h2>',
        _scatter(pts2, xlabel="round", ylabel=label, lines=lines, css="pt2"),
    ]


def _objective_gap(m: Any, summary: dict | None = None) -> list[str]:
    """Private ADMM: the objective gap F(z) - F* of the released model by step (the token's
    steps, or a one-process run's rounds), with the same run's final gap without noise as a flat
    line (step 0 is the trivial model z = 0)."""
    col = m.columns["objective_gap"]
    series = [(float(r), float(y)) for r, y in zip(m.rounds, col, strict=True) if y == y]
    lines = [(series, "acc", "F(z) - F*, released model")]
    ref = ((summary or {}).get("reference") or {}).get("noise_free") or {}
    y = ref.get("objective_gap")
    if isinstance(y, int | float) and math.isfinite(y) and series:
        lo, hi = series[0][0], series[-1][0]
        lines.append(([(lo, float(y)), (hi, float(y))], "ref", f"without noise: {_num(y)}"))
    pts = [(x, v, f"step {int(x)}: objective gap {_num(v)}") for x, v in series]
    return [
        '<h2 id="accuracy">Objective gap by step</h2>',
        _scatter(pts, xlabel="step", ylabel="objective gap", lines=lines, css="pt2"),
    ]


def _yardstick(summary: dict) -> list[str]:
    """The references and the yardstick, in the words the run summary prints them."""
    from coordinator_free import yardstick
    from coordinator_free.ml.reference import lines as reference_lines

    try:
        said = reference_lines(summary.get("reference")) + yardstick.lines(summary.get("yardstick"))
    except (KeyError, TypeError, AttributeError, ValueError):
        return ['<h2 id="yardstick">Yardstick</h2><p class="muted">summary.json: unreadable</p>']
    if not said:
        return []
    cls = ' class="bad"' if (summary.get("yardstick") or {}).get("far") else ""
    return [
        '<h2 id="yardstick">Yardstick</h2>',
        "".join(f"<p{cls}>{_e(line)}</p>" for line in said),
        '<p class="muted">the error the noise alone would give, computed from the plan '
        "(docs/yardstick.md); flagged when the measured error is more than 3 times it</p>",
    ]


def _integrity(audit: dict) -> list[str]:
    parts = ['<h2 id="integrity">Integrity findings</h2>']
    integ = audit.get("integrity") or []
    if integ:
        parts.append(
            "<ul>"
            + "".join(
                f"<li><strong>{_e(f.get('kind'))}</strong> (node {_e(f.get('node'))}): "
                f"{_e(f.get('message'))}</li>"
                if isinstance(f, dict)
                else f"<li>{_e(f)}</li>"
                for f in integ
            )
            + "</ul><p>Where a log is missing or damaged the audit assumes the worst it can "
            "and never reports less than the plan.</p>"
        )
    else:
        parts.append("<p>none: every log is intact and consistent with the others.</p>")
    return parts


def _plan_against_audit(plan: dict, pairs: dict, method: str) -> list[str]:
    """How many pairs the audit puts at, above and below the plan, and the largest gaps."""
    parts = ['<h2 id="plan">Plan against audit</h2>']
    both = [
        (v, u, plan[(v, u, method)], e)
        for (v, u), (e, _d) in pairs.items()
        if (v, u, method) in plan
    ]
    if not both:
        parts.append('<p class="muted">no planned losses to compare with</p>')
        return parts
    tol = 1e-9
    above = sum(1 for *_k, p, a in both if a > p * (1 + tol) + tol)
    below = sum(1 for *_k, p, a in both if a < p * (1 - tol) - tol)
    parts.append(
        f"<p>{len(both)} pairs: <strong>{len(both) - above - below}</strong> equal to the "
        f"plan, <strong>{above}</strong> above it, <strong>{below}</strong> below it.</p>"
    )
    fin = [(p, a, f"{u}→{v}: plan {_num(p)}, audit {_num(a)}") for v, u, p, a in both]
    fin = [x for x in fin if math.isfinite(x[0]) and math.isfinite(x[1])]
    parts.append(_scatter(fin, xlabel="planned ε (fault-free)", ylabel="audited ε", diagonal=True))
    diff = sorted(both, key=lambda x: -abs(x[3] - x[2]) if math.isfinite(x[3] - x[2]) else 0)
    shown = [x for x in diff if x[3] != x[2]][:20]
    if shown:
        parts.append("<p>largest differences:</p>")
        parts.append(
            _table(
                ["observer v", "source u", "plan ε", "audit ε"],
                [[str(v), str(u), _num(p), _num(a)] for v, u, p, a in shown],
                {0, 1, 2, 3},
            )
        )
    return parts


def _notes(audit: dict, notes: list[str]) -> list[str]:
    """The report's own notes, then the audit's (folded)."""
    audit_notes = [x for x in audit.get("notes", []) if isinstance(x, dict)]
    parts = ['<h2 id="notes">Notes</h2>']
    if notes:
        parts.append("<ul>" + "".join(f"<li>{_e(x)}</li>" for x in notes) + "</ul>")
    if audit_notes:
        parts.append(
            f"<details><summary>{len(audit_notes)} note(s) of the audit</summary><ul>"
            + "".join(f"<li>{_e(x.get('kind'))}: {_e(x.get('message'))}</li>" for x in audit_notes)
            + "</ul></details>"
        )
    if not notes and not audit_notes:
        parts.append("<p>none</p>")
    return parts


def write_html(
    run_dir: Path,
    audit_path: Path,
    out: Path,
    *,
    method: str,
    notes: list[str],
    metrics: Any = None,
) -> Path:
    """Write ``out/report.html`` for the run; return its path."""
    audit = json.loads(audit_path.read_bytes())
    text = build_html(Path(run_dir), audit, method=method, notes=notes, metrics=metrics)
    path = Path(out) / FILE
    rundir.write_text(path, text)
    return path
