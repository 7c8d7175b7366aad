"""cfree report: PNG plots of a run directory (synthetic inputs, plus one real run end to end)."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator_free import report
from coordinator_free.config import DEFAULT_CONFIG
from coordinator_free.report import ReportError, render_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
N = 5
LDP_EPS = 4.7284


def ring_distance(u: int, v: int, n: int = N) -> int:
    d = abs(u - v) % n
    return min(d, n - d)


def synthetic_audit(n: int = N) -> dict:
    """An audit.json of a ring of n nodes: exact losses 1 everywhere except a zero pair,
    paper losses decaying with distance (both above and below the LDP line)."""
    observers = []
    for v in range(n):
        losses = []
        for u in range(n):
            if u == v:
                continue
            d = ring_distance(u, v, n)
            exact = 0.0 if (v, u) == (0, 2) else LDP_EPS * (1.0 if d == 1 else 0.5 + 0.1 * u)
            paper = LDP_EPS * 1.6 / d**2
            for method, eps in (("exact", exact), ("paper", paper)):
                losses.append(
                    {
                        "source": u,
                        "method": method,
                        "distance": d,
                        "factor": eps / LDP_EPS,
                        "rdp": 2.0 * eps / LDP_EPS,
                        "eps": eps,
                    }
                )
        observers.append({"observer": v, "losses": losses})
    return {
        "run_dir": "/nowhere/run",
        "alpha": 2.0,
        "delta": 1e-5,
        "n": n,
        "steps": 4,
        "fault_free": True,
        "ldp": {"factor": 1.0, "rdp": 2.0, "eps": LDP_EPS},
        "observers": observers,
        "complete": True,
        "integrity": [],
        "notes": [{"observer": 0, "source": 3, "kind": "paper-below-exact", "message": "x"}],
        "some_future_key": {"tolerated": True},
    }


def metrics_lines(rounds: int = 6, *, regression: bool = False) -> list[str]:
    lines = []
    for r in range(rounds):
        acc = None if regression else 0.3 + 0.1 * r
        lines.append(
            json.dumps(
                {
                    "round": r,
                    "avg_test_loss": 2.0 / (1 + r),
                    "avg_test_accuracy": acc,
                    "avg_train_loss": 1.8 / (1 + r),
                    "node_test_accuracy_min": None if regression else acc - 0.05,
                    "node_test_accuracy_mean": None if regression else acc - 0.02,
                    "node_test_accuracy_max": None if regression else acc + 0.03,
                    "consensus_distance": 1.0 / (1 + r),
                }
            )
        )
    return lines


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    (d / "audit.json").write_text(json.dumps(synthetic_audit(), indent=1))
    (d / "metrics.jsonl").write_text("\n".join(metrics_lines()) + "\n")
    return d


def assert_png(path: str | Path, min_size: int = 5000) -> None:
    data = Path(path).read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert len(data) > min_size, (path, len(data))


@pytest.mark.parametrize("method", ["exact", "paper"])
def test_renders_three_pngs(run_dir, method):
    rep = render_report(run_dir, method=method)
    names = [Path(f).name for f in rep["files"]]
    assert names == ["accuracy.png", "loss_vs_distance.png", "eps_heatmap.png", "report.html"]
    for f in rep["files"]:
        assert Path(f).parent == run_dir / "report"
    for f in rep["files"][:-1]:
        assert_png(f)
    if method == "exact":
        # The exact zero pair cannot go on the log axis; the report says so.
        assert any("eps = 0 not shown" in n for n in rep["notes"])


def test_out_dir_and_deterministic_bytes(run_dir, tmp_path):
    a = render_report(run_dir, tmp_path / "a")
    b = render_report(run_dir, tmp_path / "b" / "nested")
    for fa, fb in zip(a["files"], b["files"], strict=True):
        assert Path(fa).name == Path(fb).name
        assert Path(fa).read_bytes() == Path(fb).read_bytes()
    assert not (run_dir / "report").exists()


def test_no_metrics_skips_accuracy_with_note(run_dir):
    (run_dir / "metrics.jsonl").unlink()
    rep = render_report(run_dir)
    assert [Path(f).name for f in rep["files"]] == [
        "loss_vs_distance.png",
        "eps_heatmap.png",
        "report.html",
    ]
    assert any("accuracy.png skipped" in n and "metrics.jsonl" in n for n in rep["notes"])


def test_torn_last_metrics_line_is_noted_and_skipped(run_dir):
    lines = metrics_lines()
    torn = lines[-1][: len(lines[-1]) // 2]
    (run_dir / "metrics.jsonl").write_text("\n".join([*lines[:-1], torn]))
    rep = render_report(run_dir)
    assert any("line 6" in n and "torn" in n for n in rep["notes"]), rep["notes"]
    assert_png(run_dir / "report" / "accuracy.png")


def test_corrupt_middle_metrics_line_names_file_and_line(run_dir):
    lines = metrics_lines()
    lines[2] = lines[2][:-5]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ReportError, match=r"metrics\.jsonl: line 3"):
        render_report(run_dir)


def test_wrong_metric_type_names_line(run_dir):
    lines = metrics_lines()
    rec = json.loads(lines[1])
    rec["avg_test_accuracy"] = "high"
    lines[1] = json.dumps(rec)
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ReportError, match=r"metrics\.jsonl: line 2: 'avg_test_accuracy'"):
        render_report(run_dir)


@pytest.mark.parametrize(
    "content, match",
    [
        ('{"n": 5, "alpha": 2.0,', "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"n": 5, "alpha": 2, "delta": 1e-5, "observers": []}', "'ldp'"),
        (None, "not found"),
    ],
)
def test_broken_audit_names_the_file(run_dir, content, match):
    path = run_dir / "audit.json"
    if content is None:
        path.unlink()
    else:
        path.write_text(content)
    with pytest.raises(ReportError, match=match) as ei:
        render_report(run_dir)
    assert "audit.json" in str(ei.value)


def test_bad_loss_entry_is_located(run_dir):
    doc = synthetic_audit()
    doc["observers"][1]["losses"][3]["source"] = 99
    (run_dir / "audit.json").write_text(json.dumps(doc))
    with pytest.raises(ReportError, match=r"audit\.json: observers\[1\]\.losses\[3\]\.source"):
        render_report(run_dir)


def test_unknown_method_and_missing_run_dir(run_dir, tmp_path):
    with pytest.raises(ReportError, match="unknown method"):
        render_report(run_dir, method="magic")
    with pytest.raises(ReportError, match="not a run directory"):
        render_report(tmp_path / "absent")


def test_regression_metrics_render_loss_plot(run_dir, monkeypatch):
    (run_dir / "metrics.jsonl").write_text("\n".join(metrics_lines(regression=True)) + "\n")
    rep = render_report(run_dir)
    assert Path(rep["files"][0]).name == "accuracy.png"
    assert_png(rep["files"][0])

    saved = []
    monkeypatch.setattr(report, "_save", lambda fig, path: saved.append(fig))
    render_report(run_dir)
    ax = saved[0].axes[0]
    assert ax.get_yscale() == "log"
    assert "loss" in ax.get_ylabel() and "loss" in ax.get_title().lower()

    (run_dir / "metrics.jsonl").write_text("\n".join(metrics_lines()) + "\n")
    saved.clear()
    render_report(run_dir)
    ax = saved[0].axes[0]
    assert ax.get_yscale() == "linear" and ax.get_ylabel() == "test accuracy"


def test_titles_name_method_alpha_delta(run_dir, monkeypatch):
    saved = []
    monkeypatch.setattr(report, "_save", lambda fig, path: saved.append((Path(path).name, fig)))
    render_report(run_dir, method="paper")
    figs = dict(saved)
    for name in ("loss_vs_distance.png", "eps_heatmap.png"):
        title = figs[name].axes[0].get_title()
        assert "paper" in title and "α = 2" in title and "δ = 1e-05" in title
    # The colour bar names delta; small n: one number per off-diagonal cell.
    assert "δ = 1e-05" in figs["eps_heatmap.png"].axes[1].get_ylabel()
    assert len(figs["eps_heatmap.png"].axes[0].texts) == N * (N - 1)


def test_large_n_heatmap_has_no_cell_text(tmp_path, monkeypatch):
    d = tmp_path / "big"
    d.mkdir()
    (d / "audit.json").write_text(json.dumps(synthetic_audit(n=40)))
    saved = []
    monkeypatch.setattr(report, "_save", lambda fig, path: saved.append((Path(path).name, fig)))
    render_report(d)
    heat = dict(saved)["eps_heatmap.png"]
    assert len(heat.axes[0].texts) == 0


def test_cmd_report_via_add_parser(run_dir, tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="cfree")
    sub = parser.add_subparsers(dest="command")
    report.add_parser(sub)
    out = tmp_path / "plots"
    args = parser.parse_args(["report", str(run_dir), "--out", str(out), "--method", "paper"])
    assert args.func is report.cmd_report
    assert args.func(args) == 0
    printed = capsys.readouterr().out.split()
    assert [Path(p).name for p in printed] == [
        "accuracy.png",
        "loss_vs_distance.png",
        "eps_heatmap.png",
        "report.html",
    ]
    assert all(Path(p).parent == out for p in printed)

    args = parser.parse_args(["report", str(run_dir), "--json"])
    assert args.func(args) == 0
    rep = json.loads(capsys.readouterr().out)
    assert set(rep) == {"files", "notes"} and len(rep["files"]) == 4

    (run_dir / "audit.json").write_text("{")
    assert args.func(parser.parse_args(["report", str(run_dir)])) == 2
    assert "audit.json" in capsys.readouterr().err

    with pytest.raises(SystemExit):
        parser.parse_args(["report", str(run_dir), "--method", "magic"])


def test_help_describes_the_plots(capsys):
    parser = argparse.ArgumentParser(prog="cfree")
    report.add_parser(parser.add_subparsers(dest="command"))
    with pytest.raises(SystemExit):
        parser.parse_args(["report", "--help"])
    text = capsys.readouterr().out
    for word in ("accuracy.png", "loss_vs_distance.png", "eps_heatmap.png", "--method", "--out"):
        assert word in text


def test_real_run_end_to_end(tmp_path):
    run = tmp_path / "r"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "coordinator_free",
            "run",
            str(DEFAULT_CONFIG),
            "--quiet",
            "--out",
            str(run),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    rep = render_report(run)
    assert [Path(f).name for f in rep["files"]] == [
        "loss_vs_distance.png",
        "eps_heatmap.png",
        "report.html",
    ]
    for f in rep["files"][:-1]:
        assert_png(f)
    assert any("metrics.jsonl" in n for n in rep["notes"])
    rep = render_report(run, tmp_path / "paper", method="paper")
    assert len(rep["files"]) == 3


@pytest.mark.slow  # a second real run; test_real_run_end_to_end stays quick
def test_report_audits_a_run_without_audit_json_and_refuses_one_without_logs(tmp_path, capsys):
    """A --no-audit (or LAN, or collected) run: report audits the logs first and writes
    audit.json; a changed log makes it stale (re-audited); logs gone: refused, unless
    --trust-audit. `cfree audit` writes audit.json too, except with --no-write."""
    from coordinator_free import cli
    from coordinator_free.accounting import audit as audit_mod

    run = tmp_path / "r"
    proc = subprocess.run(
        [sys.executable, "-m", "coordinator_free", "run", str(DEFAULT_CONFIG), "--no-audit"]
        + ["--quiet", "--out", str(run)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    audit_json = run / "audit.json"
    assert not audit_json.exists() and audit_mod.audit_state(run) == "missing"

    rep = render_report(run)
    assert [Path(f).name for f in rep["files"]] == [
        "loss_vs_distance.png",
        "eps_heatmap.png",
        "report.html",
    ]
    assert any("audit.json was missing" in n for n in rep["notes"]), rep["notes"]
    first = json.loads(audit_json.read_text())
    assert first["logs"]["files"] == 8 and audit_mod.audit_state(run) == "current"
    assert not any("audited" in n for n in render_report(run)["notes"])  # current: kept

    # A log cut short after the audit: the audit no longer describes the logs.
    log = run / "logs" / "node-3.vlog"
    log.write_bytes(log.read_bytes()[: log.stat().st_size // 2])
    assert audit_mod.audit_state(run) == "stale"
    rep = render_report(run)
    assert any("did not match the view logs" in n for n in rep["notes"])
    again = json.loads(audit_json.read_text())
    assert again["logs"] != first["logs"] and again["integrity"]  # the damage is named

    # `cfree audit` writes the full audit; --no-write and --observer leave it alone.
    audit_json.unlink()
    assert cli.main(["audit", str(run), "--json", "--no-write"]) == 0
    assert cli.main(["audit", str(run), "--json", "--observer", "1"]) == 0
    assert not audit_json.exists()
    capsys.readouterr()
    assert cli.main(["audit", str(run), "--json"]) == 0
    assert f"wrote {audit_json}" in capsys.readouterr().err
    assert audit_mod.audit_state(run) == "current"

    # Logs gone: nothing can check audit.json any more.
    for f in (run / "logs").glob("*.vlog"):
        f.unlink()
    assert audit_mod.audit_state(run) == "unverifiable"
    with pytest.raises(ReportError, match="are gone.*--trust-audit"):
        render_report(run)
    rep = render_report(run, trust_audit=True)
    assert len(rep["files"]) == 3 and any("--trust-audit" in n for n in rep["notes"])
    audit_json.unlink()
    with pytest.raises(ReportError, match="no audit.json and no view logs"):
        render_report(run)
