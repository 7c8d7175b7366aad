"""A paper figure below the exact loss of its pair is marked ``!`` wherever it is printed, with
the legend and the accountant's count: the plan's tables, the audit's matrix, the run summary's
compact audit, the PNG report and the HTML page. Every mark is read against the flags the
accountant wrote into the JSON (``below_exact``, ``eps_exact``, ``paper_below_exact``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from memrun import write_run_dir

from coordinator_free import cli, config
from coordinator_free.accounting import baseline
from coordinator_free.accounting import render as acc_render
from coordinator_free.accounting.audit import audit_run, save_audit
from coordinator_free.accounting.render import fmt
from coordinator_free.config import DEFAULT_CONFIG
from coordinator_free.families.averaging import render as gossip
from coordinator_free.inmemory import run_config
from coordinator_free.report import load_audit, render_report

RING = str(DEFAULT_CONFIG)  # examples/muffliato-ring.toml
MARK = baseline.BELOW_MARK


def _cli(capsys, *argv) -> str:
    assert cli.main(list(argv)) == 0
    return capsys.readouterr().out


def _table_after(out: str, title: str) -> list[list[str]]:
    """The rows (split on blanks) of the table printed after the line starting with ``title``."""
    lines = out.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(title))
    rows = []
    for line in lines[i + 3 :]:
        if not line.strip() or not line.strip()[0].isdigit():
            break
        rows.append(line.split())
    return rows


def _legend_count(out: str) -> int:
    (line,) = [x for x in out.splitlines() if x.startswith(baseline.BELOW_LEGEND)]
    assert line == baseline.below_exact_legend(int(line.rsplit("[", 1)[1].split()[0]))
    return int(line.rsplit("[", 1)[1].split()[0])


# ------------------------------------------------------------------------------------- plan


def test_one_source_paper_plan_marks_exactly_the_flagged_rows(capsys):
    rep = json.loads(_cli(capsys, "plan", RING, "--source", "0", "--method", "paper", "--json"))
    flagged = {x["observer"]: x["eps_exact"] for x in rep["losses"] if x.get("below_exact")}
    assert flagged and len(flagged) < len(rep["losses"])  # some rows, not all
    assert rep["baseline"]["paper_below_exact"] == len(flagged)
    for x in rep["losses"]:  # the accountant's flag is what it says
        if x.get("below_exact"):
            assert x["eps"] < x["eps_exact"]

    out = _cli(capsys, "plan", RING, "--source", "0", "--method", "paper")
    head = out.splitlines()[out.splitlines().index("losses from source 0:") + 1].split()
    assert head == ["observer", "dist", "factor", "rdp", "eps", "exact", "eps"]
    rows = _table_after(out, "losses from source 0:")
    assert len(rows) == len(rep["losses"])
    marked = {int(r[0]): r for r in rows if r[4].endswith(MARK)}
    assert set(marked) == set(flagged)
    for v, r in marked.items():
        assert r[5] == fmt(flagged[v])  # the exact loss beside the marked figure
    for r in rows:
        if int(r[0]) not in flagged:
            assert MARK not in "".join(r) and r[5] == "-"
    assert _legend_count(out) == len(flagged)


def test_paper_plan_by_distance_marks_the_distances_with_flagged_pairs(capsys):
    rep = json.loads(_cli(capsys, "plan", RING, "--method", "paper", "--json"))
    want = {r["distance"]: r["below_exact"] for r in rep["by_distance"]}
    assert any(want.values()) and not all(want.values())
    assert sum(want.values()) == rep["baseline"]["paper_below_exact"]
    out = _cli(capsys, "plan", RING, "--method", "paper")
    assert "below exact" in out.splitlines()[2]
    rows = _table_after(out, "LDP baseline")
    assert {int(r[0]): int(r[-1]) for r in rows} == want
    for r in rows:
        assert r[6].endswith(MARK) == (want[int(r[0])] > 0)
    assert _legend_count(out) == rep["baseline"]["paper_below_exact"]


def test_exact_plan_has_no_mark(capsys):
    out = _cli(capsys, "plan", RING, "--source", "0", "--method", "exact")
    assert MARK not in out and baseline.BELOW_LEGEND not in out


# ------------------------------------------------------------------------------------ audit


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    cfg = config.load(RING)
    out = write_run_dir(cfg, run_config(cfg, None, seed=5), tmp_path_factory.mktemp("m") / "run")
    save_audit(out, audit_run(out))
    return out


def _flagged(rep: dict) -> dict[tuple[int, int], float]:
    return {
        (o["observer"], x["source"]): x["eps_exact"]
        for o in rep["observers"]
        for x in o["losses"]
        if x["method"] == "paper" and x.get("below_exact")
    }


def test_audit_flags_agree_with_its_exact_entries(run):
    rep = json.loads((run / "audit.json").read_text())
    flagged = _flagged(rep)
    assert flagged and rep["baseline"]["paper_below_exact"] == len(flagged)
    exact = {
        (o["observer"], x["source"]): x["eps"]
        for o in rep["observers"]
        for x in o["losses"]
        if x["method"] == "exact"
    }
    for o in rep["observers"]:
        for x in o["losses"]:
            if x["method"] == "paper":
                pair = (o["observer"], x["source"])
                assert bool(x.get("below_exact")) == (x["eps"] < exact[pair] * (1 - 1e-9))
                if pair in flagged:
                    assert flagged[pair] == exact[pair]


def test_audit_text_marks_the_flagged_cells_and_prints_the_count(run, capsys):
    rep = json.loads((run / "audit.json").read_text())
    flagged = _flagged(rep)
    acc_render.print_audit(rep)
    out = capsys.readouterr().out
    rows = _table_after(out, "paper: eps_(u->v)")
    assert len(rows) == rep["n"]
    marked = {(int(r[0]), u) for r in rows for u, cell in enumerate(r[1:]) if cell.endswith(MARK)}
    assert marked == set(flagged)
    exact_rows = _table_after(out, "exact: eps_(u->v)")
    assert not any(MARK in c for r in exact_rows for c in r)
    assert _legend_count(out) == len(flagged)


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> dict:
    """The audit of a 20-node ring (past 16 nodes its text gives a row per observer) whose
    node 5 left no log: its row is a worst case (#), and the rows of the others are raised to
    the plan where its missing log leaves their views unknown (*)."""
    cfg = config.load(RING, ["graph.nodes=20"])
    out = write_run_dir(cfg, run_config(cfg, None, seed=5), tmp_path_factory.mktemp("w") / "run")
    (out / "logs" / "node-5.vlog").unlink()
    return audit_run(out)


def test_audit_text_rows_per_observer_follow_its_entries(wide, capsys):
    rep = wide
    acc_render.print_audit(rep)
    out = capsys.readouterr().out
    seen = {"raised": 0, "below": 0, "capped": 0}
    for method in ("exact", "paper"):
        rows = _table_after(out, f"{method}: per observer")
        assert [int(r[0]) for r in rows] == [o["observer"] for o in rep["observers"]]
        for r, o in zip(rows, rep["observers"], strict=True):
            xs = sorted(
                (x for x in o["losses"] if x["method"] == method), key=lambda x: x["source"]
            )
            # What is shown is the usable figure (capped by local DP) where there is one.
            shown = [float(x.get("eps_usable", x["eps"])) for x in xs]
            raised = sum(1 for x in xs if x.get("basis", "realised") in acc_render.MARKS)
            low = sum(1 for x in xs if x.get("below_exact"))
            mark = MARK if low else ""
            assert r[1:4] == [
                fmt(max(shown)) + mark,
                fmt(float(np.mean(shown))) + mark,
                str(raised),
            ]
            assert r[4:] == ([str(low)] if method == "paper" else [])
            seen["raised"] += raised
            seen["below"] += low
            seen["capped"] += sum(1 for x in xs if "eps_usable" in x)
    # The rows above cover every kind of mark: raised, below exact and capped entries.
    assert all(seen.values()), seen
    assert f"{acc_render.MARKS['worst-case']} " in out and f"{acc_render.MARKS['plan']} " in out


def test_compact_audit_marks_the_distances_with_flagged_pairs(run, capsys):
    rep = json.loads((run / "audit.json").read_text())
    dist = {
        (o["observer"], x["source"]): x["distance"] for o in rep["observers"] for x in o["losses"]
    }
    by_d: dict[int, int] = {}
    for pair in _flagged(rep):
        by_d[dist[pair]] = by_d.get(dist[pair], 0) + 1
    gossip.print_audit_compact(rep)
    out = capsys.readouterr().out
    assert out.splitlines()[1].split()[-3:] == ["paper", "below", "exact"]
    rows = _table_after(out, "pairwise network DP")
    assert {int(r[0]) for r in rows} >= set(by_d)
    for r in rows:
        d = int(r[0])
        assert r[5].endswith(MARK) == r[6].endswith(MARK) == (d in by_d)
        assert int(r[7]) == by_d.get(d, 0)
        assert MARK not in r[3] + r[4]  # the exact columns are never marked
    assert _legend_count(out) == len(_flagged(rep))


def test_worst_case_and_below_exact_marks_differ():
    assert MARK not in acc_render.MARKS.values()


# ---------------------------------------------------------------------------- PNG and HTML


def test_png_report_carries_the_marked_pairs_and_count(run, tmp_path):
    rep = json.loads((run / "audit.json").read_text())
    flagged = _flagged(rep)
    out = render_report(run, tmp_path / "png", method="paper", html="no")
    assert {Path(f).name for f in out["files"]} == {"loss_vs_distance.png", "eps_heatmap.png"}
    assert any(n.startswith(f"{len(flagged)} pair(s) marked {MARK}") for n in out["notes"])
    drawn = load_audit(run / "audit.json")  # what the plots draw from
    assert drawn.below_exact == set(flagged)
    assert drawn.paper_below_exact == len(flagged)
    exact = render_report(run, tmp_path / "ex", method="exact", html="no")
    assert not any(MARK in n for n in exact["notes"])


def test_html_report_marks_the_cells_and_prints_the_count(run, tmp_path):
    rep = json.loads((run / "audit.json").read_text())
    flagged = _flagged(rep)
    (page,) = render_report(run, tmp_path / "html", method="paper", html="only")["files"]
    text = Path(page).read_text()
    assert f"<strong>{MARK} {len(flagged)} pair(s)</strong>" in text
    assert text.count('<text class="below"') == len(flagged)  # one ! per marked cell (n <= 96)
    assert f"<dd>{len(flagged)}</dd>" in text
    for v, u in flagged:
        assert f"observer {v} ← source {u}: ε = " in text
    assert text.count("(below the exact loss)</title>") == len(flagged)
    (plain,) = render_report(run, tmp_path / "html-exact", method="exact", html="only")["files"]
    assert 'id="below-exact"' not in Path(plain).read_text()
