"""``cfree report``: PNG plots of a finished run directory.

Reads ``RUN_DIR/audit.json`` and ``RUN_DIR/metrics.jsonl`` (optional, per-round learning
metrics of learning protocols) and writes, into ``RUN_DIR/report/`` by default the plots below.
An audit.json that is missing (a ``--no-audit``, LAN or collected run) or older than the view
logs beside it is first recomputed from them and written; one whose logs are gone cannot be
checked and is refused unless ``--trust-audit`` says to plot it as it stands.


* ``accuracy.png``: test accuracy of the node-average model per round with the min-max band over
  the nodes' own models (regression runs, whose accuracy is null: the test loss on a log axis);
* ``loss_vs_distance.png``: the pairwise loss eps_{u->v} against the hop distance between u and v,
  one point per pair plus the mean per distance, with the local-DP eps as a dashed line;
* ``eps_heatmap.png``: eps_{u->v} as an n x n matrix (rows observer v, columns source u).

Plotting uses matplotlib's object API on the Agg canvas only (no pyplot, no global backend
state), so it works headless and never opens a window. matplotlib is imported lazily: importing
this module (e.g. to build the CLI parser) stays cheap.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from coordinator_free import rundir
from coordinator_free.accounting.baseline import BELOW_MARK
from coordinator_free.errors import CfreeError

METHODS = ("exact", "paper")
METHOD_LABELS = {"exact": "exact (whole view)", "paper": "paper Eq. (6)"}
FILES = {
    "accuracy": "accuracy.png",
    "distance": "loss_vs_distance.png",
    "heatmap": "eps_heatmap.png",
    "objective": "objective_gap.png",
}
#: report.html: beside the PNGs, instead of them, or not at all.
HTML_MODES = ("also", "only", "no")
# Above this many nodes the heat map carries no per-cell numbers.
CELL_TEXT_MAX_N = 16
DPI = 120


class ReportError(CfreeError, ValueError):
    """A run directory's input files are missing or unreadable (the message names the file)."""


# ------------------------------------------------------------------------------------ inputs


@dataclass
class Audit:
    n: int
    alpha: float
    delta: float
    ldp_eps: float
    # method -> list of (observer v, source u, hop distance, eps_{u->v})
    pairs: dict[str, list[tuple[int, int, int, float]]] = field(default_factory=dict)
    observers: list[int] = field(default_factory=list)
    integrity: list = field(default_factory=list)
    upper_bound_observers: list[int] = field(default_factory=list)
    # central DP (a trusted curator): one loss for every user, no graph to plot it against
    central: bool = False
    # (observer v, source u) whose paper entry the accountant flagged below the exact loss of
    # the pair (``below_exact``), and its count of them (``baseline.paper_below_exact``)
    below_exact: set[tuple[int, int]] = field(default_factory=set)
    paper_below_exact: int = 0


def _is_num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def load_audit(path: Path) -> Audit:
    """Parse and check ``audit.json``; every problem is a ReportError naming the file."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ReportError(
            f"{path}: not found (run `cfree audit RUN_DIR` or `cfree run` to write it)"
        ) from None
    except OSError as exc:
        raise ReportError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ReportError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ReportError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None

    def bad(what: str) -> ReportError:
        return ReportError(f"{path}: {what}")

    if not isinstance(doc, dict):
        raise bad(f"expected a JSON object at the top level, got {type(doc).__name__}")
    n = doc.get("n")
    if not _is_int(n) or n < 1:
        raise bad(f"'n' must be a positive integer, got {n!r}")
    for key in ("alpha", "delta"):
        if not _is_num(doc.get(key)):
            raise bad(f"'{key}' must be a number, got {doc.get(key)!r}")
    ldp = doc.get("ldp")
    if not isinstance(ldp, dict) or not _is_num(ldp.get("eps")):
        raise bad("'ldp' must be an object with a numeric 'eps'")
    observers = doc.get("observers")
    if not isinstance(observers, list):
        raise bad("'observers' must be a list")
    audit = Audit(
        n=n, alpha=float(doc["alpha"]), delta=float(doc["delta"]), ldp_eps=float(ldp["eps"])
    )
    for i, obs in enumerate(observers):
        where = f"observers[{i}]"
        if not isinstance(obs, dict):
            raise bad(f"{where} must be an object")
        v = obs.get("observer")
        if not _is_int(v) or not 0 <= v < n:
            raise bad(f"{where}.observer must be a node id in 0..{n - 1}, got {v!r}")
        losses = obs.get("losses")
        if not isinstance(losses, list):
            raise bad(f"{where}.losses must be a list")
        audit.observers.append(v)
        for j, loss in enumerate(losses):
            lw = f"{where}.losses[{j}]"
            if not isinstance(loss, dict):
                raise bad(f"{lw} must be an object")
            u, d, eps, m = (loss.get(k) for k in ("source", "distance", "eps", "method"))
            if not _is_int(u) or not 0 <= u < n:
                raise bad(f"{lw}.source must be a node id in 0..{n - 1}, got {u!r}")
            if not _is_int(d):
                raise bad(f"{lw}.distance must be an integer, got {d!r}")
            if not _is_num(eps):
                raise bad(f"{lw}.eps must be a number, got {eps!r}")
            if not isinstance(m, str):
                raise bad(f"{lw}.method must be a string, got {m!r}")
            audit.pairs.setdefault(m, []).append((v, u, d, float(eps)))
            if m == "paper" and loss.get("below_exact") is True:
                audit.below_exact.add((v, u))
    integrity = doc.get("integrity", [])
    audit.integrity = integrity if isinstance(integrity, list) else [integrity]
    audit.central = doc.get("central") is True
    count = (doc.get("baseline") or {}).get("paper_below_exact")
    audit.paper_below_exact = max(int(count) if _is_int(count) else 0, len(audit.below_exact))
    for note in doc.get("notes", []) if isinstance(doc.get("notes"), list) else []:
        if isinstance(note, dict) and note.get("kind") == "exact-upper-bound":
            if _is_int(note.get("observer")):
                audit.upper_bound_observers.append(note["observer"])
    return audit


@dataclass
class Metrics:
    rounds: np.ndarray
    columns: dict[str, np.ndarray]  # metric name -> float array (NaN where null or absent)


METRIC_KEYS = (
    "avg_test_loss",
    "avg_test_accuracy",
    "avg_train_loss",
    "node_test_accuracy_min",
    "node_test_accuracy_mean",
    "node_test_accuracy_max",
    "consensus_distance",
    "objective",
    "objective_gap",
)


def load_metrics(path: Path, notes: list[str]) -> Metrics:
    """Parse ``metrics.jsonl``. A torn last line is skipped with a note; any other bad line is a
    ReportError naming the file and the line number."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ReportError(f"{path}: cannot read: {exc.strerror or exc}") from None
    lines = data.split(b"\n")
    nonblank = [i for i, line in enumerate(lines) if line.strip()]
    last = nonblank[-1] if nonblank else -1
    records: list[tuple[int, dict]] = []
    for i in nonblank:
        lineno = i + 1
        try:
            rec = json.loads(lines[i].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if i == last:
                notes.append(
                    f"{path.name}: last line {lineno} is incomplete (torn write?); skipped it"
                )
                continue
            msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
            raise ReportError(f"{path}: line {lineno}: not valid JSON ({msg})") from None
        if not isinstance(rec, dict):
            raise ReportError(f"{path}: line {lineno}: expected a JSON object")
        r = rec.get("round")
        if not _is_int(r) or r < 0:
            raise ReportError(f"{path}: line {lineno}: 'round' must be an integer >= 0, got {r!r}")
        for key in METRIC_KEYS:
            val = rec.get(key)
            if val is not None and not _is_num(val):
                raise ReportError(
                    f"{path}: line {lineno}: {key!r} must be a number or null, got {val!r}"
                )
        records.append((r, rec))
    records.sort(key=lambda x: x[0])
    rounds = np.array([r for r, _ in records], dtype=np.int64)
    columns = {
        key: np.array(
            [np.nan if rec.get(key) is None else float(rec[key]) for _, rec in records],
            dtype=np.float64,
        )
        for key in METRIC_KEYS
    }
    return Metrics(rounds=rounds, columns=columns)


# ---------------------------------------------------------------------------------- plotting


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path) -> None:
    """Write atomically; no 'Software' metadata so identical plots give identical bytes."""
    rundir.atomic_write(
        path, lambda f: fig.savefig(f, format="png", dpi=DPI, metadata={"Software": None})
    )
    fig.clear()


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _reference_lines(ax, summary: dict | None, key: str) -> None:
    """The run's references (summary.json's ``reference``: the same run without noise, the
    trivial model) as horizontal lines, ``key`` being ``test_accuracy`` or ``test_loss``."""
    ref = (summary or {}).get("reference")
    if not isinstance(ref, dict):
        return
    for name, label, style in (
        ("noise_free", "reference without noise (sigma = 0)", ":"),
        ("trivial", "trivial reference (no learning)", "-."),
    ):
        x = (ref.get(name) or {}).get(key)
        if _is_num(x) and math.isfinite(x):
            ax.axhline(x, color="0.3", ls=style, lw=1, label=f"{label}: {_fmt(x)}")


def _yardstick_caption(summary: dict | None) -> str | None:
    y = (summary or {}).get("yardstick")
    if not isinstance(y, dict) or not _is_num(y.get("ratio")):
        return None
    flag = "  FAR OUTSIDE the yardstick" if y.get("far") else ""
    what = "test objective" if y.get("kind") == "test-objective" else "test loss"
    return (
        f"yardstick: {what} {_fmt(y['measured'])} vs {_fmt(y['expected'])} without noise "
        f"(ratio {y['ratio']:.2f}){flag}"
    )


def plot_accuracy(
    metrics: Metrics, path: Path, run_name: str, notes: list[str], summary: dict | None = None
) -> None:
    """``summary``: the run's summary.json, whose references (and yardstick) are drawn too."""
    from matplotlib.ticker import MaxNLocator

    rounds = metrics.rounds
    col = metrics.columns
    fig = _figure(7.0, 4.5)
    ax = fig.add_subplot()
    marker = "o" if len(rounds) <= 60 else None
    acc = col["avg_test_accuracy"]
    if np.isfinite(acc).any():
        lo, hi = col["node_test_accuracy_min"], col["node_test_accuracy_max"]
        band = np.isfinite(lo) & np.isfinite(hi)
        if band.any():
            ax.fill_between(
                rounds, lo, hi, where=band, color="C0", alpha=0.2, lw=0, label="min-max over nodes"
            )
        mean = col["node_test_accuracy_mean"]
        if np.isfinite(mean).any():
            ax.plot(rounds, mean, "--", color="C0", lw=1, label="mean over nodes")
        ax.plot(rounds, acc, color="C1", marker=marker, ms=3, label="node-average model")
        _reference_lines(ax, summary, "test_accuracy")
        ax.set_ylabel("test accuracy")
        ax.set_title(f"Test accuracy vs round — {run_name}")
    else:
        ax.plot(
            rounds,
            col["avg_test_loss"],
            color="C1",
            marker=marker,
            ms=3,
            label="test loss, node-average model",
        )
        if np.isfinite(col["avg_train_loss"]).any():
            ax.plot(rounds, col["avg_train_loss"], "--", color="C2", lw=1, label="train loss, same")
        _reference_lines(ax, summary, "test_loss")
        vals = np.concatenate([col["avg_test_loss"], col["avg_train_loss"]])
        vals = vals[np.isfinite(vals)]
        if vals.size and (vals > 0).all():
            ax.set_yscale("log")
            ax.set_ylabel("loss (log scale)")
        else:
            ax.set_ylabel("loss")
            if vals.size:
                notes.append("accuracy.png: some losses are <= 0, so the loss axis is linear")
        ax.set_title(f"Test loss vs round (regression: no accuracy) — {run_name}")
    caption = _yardstick_caption(summary)
    ax.set_xlabel("round (0 = before training)" + (f"\n{caption}" if caption else ""))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    _save(fig, path)


def plot_objective(metrics: Metrics, path: Path, run_name: str, summary: dict | None) -> None:
    """Private ADMM: the objective gap F(z) - F* of the released model after every step (the
    token's steps, or the rounds of a one-process run), on a log scale."""
    from matplotlib.ticker import MaxNLocator

    rounds = metrics.rounds
    gap = metrics.columns["objective_gap"]
    fig = _figure(7.0, 4.5)
    ax = fig.add_subplot()
    keep = np.isfinite(gap)
    positive = keep & (gap > 0)
    ax.plot(rounds[keep], gap[keep], color="C1", lw=1.2, label="F(z) - F*, released model")
    if positive.any() and positive.sum() == keep.sum():
        ax.set_yscale("log")
        ax.set_ylabel("objective gap (log scale)")
    else:
        ax.set_ylabel("objective gap")
    nf = (((summary or {}).get("reference") or {}).get("noise_free") or {}).get("objective_gap")
    if _is_num(nf):
        ax.axhline(
            nf, color="0.3", ls=":", lw=1,
            label=f"same run without noise (sigma = 0): final gap {_fmt(nf)}",
        )  # fmt: skip
    caption = _yardstick_caption(summary)
    ax.set_xlabel(
        "step of the token (0 = before the first step: the trivial model z = 0)"
        + (f"\n{caption}" if caption else "")
    )
    ax.set_title(f"Objective gap vs step — {run_name}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    _save(fig, path)


def _pairs_matrix(audit: Audit, method: str) -> np.ndarray:
    mat = np.full((audit.n, audit.n), np.nan)
    for v, u, _d, eps in audit.pairs.get(method, []):
        mat[v, u] = eps
    return mat


def _subtitle(audit: Audit, method: str, tail: str = "") -> str:
    plain = ", σ = 0: NO PRIVACY" if math.isinf(audit.ldp_eps) else ""
    return (
        f"method: {METHOD_LABELS.get(method, method)}, α = {audit.alpha:g}, δ = {audit.delta:g}"
        + plain
        + tail
        + _below_exact_title(audit, method)
    )


def _below_exact_title(audit: Audit, method: str) -> str:
    """The count of marked pairs, for a plot of paper figures some of which are below the exact
    loss of their pair ('' otherwise)."""
    if method != "paper" or not audit.paper_below_exact:
        return ""
    return (
        f"\n{BELOW_MARK} {audit.paper_below_exact} pair(s) below the exact loss: the paper's "
        "formula is not an upper bound there"
    )


def plot_loss_vs_distance(
    audit: Audit, method: str, path: Path, run_name: str, notes: list[str]
) -> None:
    from matplotlib.ticker import LogFormatter, MaxNLocator

    pairs = [(v, u, d, e) for v, u, d, e in audit.pairs[method] if u != v]
    unreachable = sum(1 for p in pairs if p[2] < 0)
    if unreachable:
        notes.append(
            f"loss_vs_distance.png: {unreachable} pair(s) with no path between them not shown"
        )
    pairs = [p for p in pairs if p[2] >= 0]
    dist = np.array([p[2] for p in pairs], dtype=np.float64)
    eps = np.array([p[3] for p in pairs], dtype=np.float64)
    finite = np.isfinite(eps)
    if (~finite).any():
        notes.append(f"loss_vs_distance.png: {int((~finite).sum())} non-finite eps not shown")
    dist, eps = dist[finite], eps[finite]
    positive = eps > 0
    log = bool(positive.any())
    zeros = int((~positive).sum()) if log else 0

    fig = _figure(7.0, 4.8)
    ax = fig.add_subplot()
    rng = np.random.default_rng(0)  # fixed jitter: the same run gives the same picture
    jitter = rng.uniform(-0.12, 0.12, size=dist.size)
    shown = positive if log else np.ones_like(positive)
    label = f"pair u→v ({eps.size})"
    if zeros:
        label = f"pair u→v ({int(shown.sum())}; {zeros} with ε = 0 not shown on log axis)"
        notes.append(f"loss_vs_distance.png: {zeros} pair(s) with eps = 0 not shown (log axis)")
    ax.scatter(
        dist[shown] + jitter[shown],
        eps[shown],
        s=14 if eps.size <= 600 else 6,
        alpha=0.5 if eps.size <= 600 else 0.3,
        color="C0",
        lw=0,
        label=label,
    )
    flagged = [p for p in pairs if (p[0], p[1]) in audit.below_exact and np.isfinite(p[3])]
    if method == "paper" and flagged:
        fj = rng.uniform(-0.12, 0.12, size=len(flagged))
        ax.scatter(
            [p[2] + j for p, j in zip(flagged, fj, strict=True)],
            [p[3] for p in flagged],
            marker="x",
            s=30,
            color="C3",
            lw=1.2,
            label=f"{BELOW_MARK} below the exact loss ({audit.paper_below_exact} pair(s))",
        )
    ds = np.unique(dist)
    means = np.array([eps[dist == d].mean() for d in ds])
    keep = means > 0 if log else np.ones_like(means, dtype=bool)
    ax.plot(ds[keep], means[keep], "D-", color="C1", ms=5, lw=1.5, label="mean per distance")
    if math.isfinite(audit.ldp_eps) and (audit.ldp_eps > 0 or not log):
        ax.axhline(
            audit.ldp_eps, ls="--", color="C3", lw=1.2, label=f"local DP: ε = {audit.ldp_eps:.3g}"
        )
    if log:
        ax.set_yscale("log")
        # Plain numbers ("3", "0.05") rather than "3 x 10^0": eps rarely spans many decades.
        ax.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4)))
    ax.set_xlabel("graph distance between u and v (hops)")
    ax.set_ylabel(f"ε(u→v) at δ = {audit.delta:g}" + (" (log scale)" if log else ""))
    if ds.size <= 20:
        ax.set_xticks(ds)
        ax.set_xticklabels([str(int(d)) for d in ds])
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(
        f"Pairwise privacy loss vs distance — {run_name}\n{_subtitle(audit, method)}",
        fontsize="medium",
    )
    ax.grid(True, alpha=0.3, which="major")
    ax.legend(loc="best", fontsize="small")
    _save(fig, path)


def plot_heatmap(audit: Audit, method: str, path: Path, run_name: str, notes: list[str]) -> None:
    import matplotlib
    from matplotlib.ticker import MaxNLocator

    n = audit.n
    mat = _pairs_matrix(audit, method)
    np.fill_diagonal(mat, np.nan)
    nonfinite = int(np.isinf(mat).sum())
    if nonfinite:
        notes.append(f"eps_heatmap.png: {nonfinite} infinite eps drawn as missing (grey)")
    masked = np.ma.masked_invalid(mat)
    hidden = np.ma.getmaskarray(masked)
    missing_rows = [v for v in range(n) if hidden[v].all()] if n > 1 else []
    if missing_rows:
        shown = ", ".join(map(str, missing_rows[:10])) + (" ..." if len(missing_rows) > 10 else "")
        notes.append(f"eps_heatmap.png: no {method} losses for observer(s) {shown} (grey rows)")
    vals = masked.compressed()
    vmax = float(vals.max()) if vals.size else 1.0
    if math.isfinite(audit.ldp_eps):
        vmax = max(vmax, audit.ldp_eps)
    vmax = vmax if vmax > 0 else 1.0

    side = min(10.0, 5.0 + 0.06 * n)
    fig = _figure(side + 1.4, side)
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="0.85")
    im = ax.imshow(masked, cmap=cmap, vmin=0.0, vmax=vmax, interpolation="nearest")
    cbar = fig.colorbar(im, ax=ax, shrink=0.85)
    label = f"ε(u→v) at δ = {audit.delta:g}"
    if math.isfinite(audit.ldp_eps) and audit.ldp_eps > 0:
        cbar.ax.axhline(audit.ldp_eps, color="red", lw=2.5)
        label += f"   (red line: local DP, ε = {audit.ldp_eps:.3g})"
    cbar.set_label(label)
    if n <= CELL_TEXT_MAX_N:
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
        for v in range(n):
            for u in range(n):
                if hidden[v, u]:
                    continue
                val = float(mat[v, u])
                mark = BELOW_MARK if method == "paper" and (v, u) in audit.below_exact else ""
                ax.text(
                    u,
                    v,
                    f"{val:.2g}{mark}",
                    ha="center",
                    va="center",
                    fontsize="x-small" if n > 8 else "small",
                    color="white" if val < 0.55 * vmax else "black",
                )
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("source u (whose input leaks)")
    ax.set_ylabel("observer v (who sees the messages)")
    ax.set_title(
        f"Pairwise privacy loss ε(u→v) — {run_name}\n"
        + _subtitle(audit, method, "; diagonal masked"),
        fontsize="medium",
    )
    _save(fig, path)


# --------------------------------------------------------------------------------------- API


def current_audit(run_dir: Path, notes: list[str], *, trust: bool = False) -> Path:
    """The path of an audit.json that is the audit of the view logs in ``run_dir`` now:
    audit them first if it is missing or stale; refuse one whose logs are gone (``trust``:
    use it anyway, with a note)."""
    from coordinator_free.accounting import audit as audit_mod
    from coordinator_free.errors import AuditError

    path = rundir.audit_path(run_dir)
    if not rundir.config_path(run_dir).is_file():
        # An audit.json on its own (copied out of its run): nothing to check it against.
        if path.exists():
            notes.append(f"{run_dir} holds no config.toml: {path.name} plotted unchecked")
        return path
    try:
        state = audit_mod.audit_state(run_dir)
        if state == "unverifiable":
            if not trust:
                raise ReportError(
                    f"{path}: the view logs it was computed from ({rundir.LOGS}/node-*.vlog) "
                    "are gone, so it cannot be checked or recomputed; restore the logs, or "
                    "pass --trust-audit to plot it as it stands"
                )
            notes.append(f"{path.name} plotted as it stands (--trust-audit): its logs are gone")
        elif state in ("missing", "stale"):
            if state == "missing" and not rundir.view_logs(run_dir):
                cfg, _plan = audit_mod.load_run(run_dir)
                from coordinator_free.families import family_of

                if family_of(cfg.protocol.name).has_peers(cfg):
                    raise ReportError(
                        f"{run_dir}: no audit.json and no view logs ({rundir.LOGS}/node-*.vlog): "
                        "nothing to compute the privacy loss from"
                    )
            print(f"cfree report: auditing {run_dir} (audit.json {state})...", file=sys.stderr)
            audit_mod.save_audit(run_dir, audit_mod.audit_run(run_dir), role="cfree report")
            why = "was missing" if state == "missing" else "did not match the view logs"
            notes.append(f"audited the view logs first ({path.name} {why}); wrote {path}")
    except AuditError as exc:
        raise ReportError(str(exc)) from None
    return path


def render_report(
    run_dir: str | Path,
    out_dir: str | Path | None = None,
    *,
    method: str = "exact",
    trust_audit: bool = False,
    html: str = "also",
) -> dict:
    """Render the PNG plots of RUN_DIR into OUT_DIR (default RUN_DIR/report/), auditing the
    view logs first when audit.json is missing or stale (see :func:`current_audit`), and
    ``report.html`` beside them (``html``: ``"also"``, ``"only"`` without the PNGs, ``"no"``;
    see :mod:`coordinator_free.htmlreport`).

    Returns ``{"files": [written paths], "notes": [human-readable remarks]}``; raises
    ReportError (a ValueError) naming the file when an input is missing or damaged.
    """
    if method not in METHODS:
        raise ReportError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: not a run directory")
    if html not in HTML_MODES:
        raise ReportError(f"unknown html mode {html!r}; expected one of {', '.join(HTML_MODES)}")
    notes: list[str] = []
    audit_path = current_audit(run_dir, notes, trust=trust_audit)
    audit = load_audit(audit_path)
    metrics_path = rundir.metrics_path(run_dir)
    metrics = load_metrics(metrics_path, notes) if metrics_path.exists() else None

    out = run_dir / "report" if out_dir is None else Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportError(f"{out}: cannot create the output directory: {exc.strerror}") from None
    run_name = run_dir.resolve().name
    files: list[str] = []
    if html == "only":
        page = _write_html(run_dir, audit_path, out, method, notes, metrics)
        return {"files": [page], "notes": notes}
    if metrics is None:
        notes.append(f"{FILES['accuracy']} skipped: no metrics.jsonl (not a learning run)")
    elif metrics.rounds.size == 0:
        notes.append(f"{FILES['accuracy']} skipped: metrics.jsonl has no complete record")
    elif np.isfinite(metrics.columns["objective_gap"]).any():
        path = out / FILES["objective"]
        plot_objective(metrics, path, run_name, _read_summary(run_dir))
        files.append(str(path))
    else:
        path = out / FILES["accuracy"]
        plot_accuracy(metrics, path, run_name, notes, _read_summary(run_dir))
        files.append(str(path))

    if math.isinf(audit.ldp_eps):
        notes.append(
            "sigma = 0: plain gossip, NO PRIVACY: every pair whose view depends on the source "
            "is at eps = inf"
        )
    if audit.integrity:
        notes.append(
            f"audit.json lists {len(audit.integrity)} integrity finding(s): part of the "
            "schedule was assumed (see `cfree audit`)"
        )
    if method == "paper" and audit.paper_below_exact:
        notes.append(
            f"{audit.paper_below_exact} pair(s) marked {BELOW_MARK}: the paper's formula is "
            "below the exact loss of the pair, not an upper bound there (--method exact)"
        )
    if method == "exact" and audit.upper_bound_observers:
        notes.append(
            "audit.json: for observer(s) "
            + ", ".join(map(str, sorted(set(audit.upper_bound_observers))))
            + " the exact loss is a Krylov upper bound, not the exact value"
        )
    if audit.central:
        eps = max((e for _v, _u, _d, e in audit.pairs.get(method, [])), default=audit.ldp_eps)
        notes.append(
            f"{FILES['distance']} and {FILES['heatmap']} skipped: central DP (a trusted curator, "
            f"no graph): every user loses the same eps = {eps:.4f} to anyone who sees the "
            "released models"
        )
    elif not any(u != v for v, u, _d, _e in audit.pairs.get(method, [])):
        notes.append(
            f"{FILES['distance']} and {FILES['heatmap']} skipped: audit.json has no "
            f"'{method}' losses between distinct nodes"
        )
    else:
        for key, plot in (("distance", plot_loss_vs_distance), ("heatmap", plot_heatmap)):
            path = out / FILES[key]
            plot(audit, method, path, run_name, notes)
            files.append(str(path))
    if html == "also":
        files.append(_write_html(run_dir, audit_path, out, method, notes, metrics))
    return {"files": files, "notes": notes}


def _read_summary(run_dir: Path) -> dict | None:
    """summary.json when it reads as a JSON object (else None: the plots go without it)."""
    import json

    try:
        doc = json.loads(rundir.summary_path(run_dir).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _write_html(
    run_dir: Path,
    audit_path: Path,
    out: Path,
    method: str,
    notes: list[str],
    metrics: Metrics | None,
) -> str:
    from coordinator_free import htmlreport

    path = htmlreport.write_html(
        run_dir, audit_path, out, method=method, notes=list(notes), metrics=metrics
    )
    return str(path)


# --------------------------------------------------------------------------------------- CLI


def add_parser(subparsers) -> None:
    from coordinator_free.helptext import examples

    p = subparsers.add_parser(
        "report",
        help="render PNG plots of a finished run (accuracy, privacy loss by distance, heat map)",
        description="Render plots of a finished run directory: accuracy.png (test accuracy of the "
        "node-average model per round with the min-max band over nodes, or the test loss for "
        "regression; needs RUN_DIR/metrics.jsonl, written by learning protocols), "
        "loss_vs_distance.png (pairwise eps_{u->v} against the hop distance, with the local-DP "
        "eps) and eps_heatmap.png (eps_{u->v}, rows observer v, columns source u), both from "
        "RUN_DIR/audit.json. An audit.json that is missing (a --no-audit, LAN or collected run) "
        "or does not match the view logs is recomputed from them first and written. Plots whose "
        "input is absent are skipped with a note. report.html, written beside them (only it "
        "with --html), shows all of it on one self-contained page that loads nothing from any "
        "network.",
        **examples(
            "cfree run examples/dsgd-breast-cancer.toml --set protocol.rounds=5 --out /tmp/dsgd --quiet",
            "cfree report /tmp/dsgd",
            "cfree report /tmp/dsgd --method paper --out /tmp/dsgd-paper --no-html",
        ),
    )
    p.add_argument("run_dir", type=Path, help="run directory written by `cfree run`")
    p.add_argument(
        "--out", type=Path, metavar="DIR", help="output directory (default: RUN_DIR/report/)"
    )
    p.add_argument(
        "--method",
        choices=METHODS,
        default="exact",
        help="which pairwise loss to plot: exact (the exact Rényi divergence of the observer's "
        "whole view; default) or paper (Eq. (6) of the Muffliato paper)",
    )
    p.add_argument(
        "--trust-audit",
        action="store_true",
        help="plot audit.json as it stands even when the view logs it was computed from are "
        "gone (otherwise refused: nothing can check it)",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--html",
        dest="html",
        action="store_const",
        const="only",
        default="also",
        help="write only report.html, one self-contained page (summary, per-node status, "
        "fault timeline, eps heat map with values on hover, loss against distance, accuracy, "
        "integrity findings, plan against audit); by default it is written beside the PNGs",
    )
    g.add_argument("--no-html", dest="html", action="store_const", const="no", help="only the PNGs")
    p.add_argument(
        "--json", action="store_true", help='print {"files": [...], "notes": [...]} as JSON'
    )
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    """Render and print the written files (JSON with --json). A ReportError is printed as one
    line on stderr and gives exit status 2."""
    try:
        rep = render_report(
            args.run_dir,
            args.out,
            method=args.method,
            trust_audit=args.trust_audit,
            html=args.html,
        )
    except ReportError as exc:
        print(f"cfree report: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rep, indent=1))
    else:
        for f in rep["files"]:
            print(f)
        for note in rep["notes"]:
            print(f"note: {note}", file=sys.stderr)
    return 0
