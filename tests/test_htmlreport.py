"""`cfree report --html`: the self-contained page of a run, read as HTML here and rendered in
headless Chromium (Debian's package, installed by .ci/run; never a browser download).

The runs are real in-memory runs of the engines, written as run directories and audited; one
has a node killed mid-run. In CI (CI=true) a missing Chromium fails the browser tests instead
of skipping them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from ci import IN_CI
from memrun import write_run_dir

from coordinator_free import config, htmlreport
from coordinator_free.accounting.audit import audit_run, save_audit
from coordinator_free.inmemory import run_config
from coordinator_free.report import render_report

N = 8


class Page(HTMLParser):
    """Elements by tag, attributes, and the text inside every element with an id."""

    def __init__(self, text: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text_of: dict[str, str] = {}
        self._open: list[str | None] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag not in ("meta", "br", "line", "circle", "path", "polyline"):
            self._open.append(a.get("id"))
            if a.get("id"):
                self.text_of[a["id"]] = ""

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        if self._open and tag not in ("meta", "br", "line", "circle", "path", "polyline"):
            self._open.pop()

    def handle_data(self, data):
        for i in self._open:
            if i:
                self.text_of[i] += data

    def all(self, tag: str, cls: str | None = None) -> list[dict]:
        return [a for t, a in self.tags if t == tag and (cls is None or cls in a.get("class", ""))]


def _run(tmp_path: Path, faults: list[str] | None = None) -> Path:
    sets = [f"graph.nodes={N}", "graph.kind=ring", "protocol.steps=6"]
    cfg = config.load(None, sets, faults or [])
    run = write_run_dir(cfg, run_config(cfg, None, seed=3), tmp_path / "run")
    save_audit(run, audit_run(run))
    return run


def _audit_eps(run: Path) -> dict[tuple[int, int], float]:
    rep = json.loads((run / "audit.json").read_text())
    return {
        (o["observer"], x["source"]): x["eps"]
        for o in rep["observers"]
        for x in o["losses"]
        if x["method"] == "exact"
    }


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> tuple[Path, Path]:
    run = _run(tmp_path_factory.mktemp("clean"))
    rep = render_report(run, html="only")
    (page,) = rep["files"]
    return run, Path(page)


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> tuple[Path, Path]:
    run = _run(tmp_path_factory.mktemp("killed"), ["kill:3@2"])
    (page,) = render_report(run, html="only")["files"]
    return run, Path(page)


# ------------------------------------------------------------------------ the page as HTML


def test_the_page_is_self_contained(clean):
    _run_dir, page = clean
    text = page.read_text()
    p = Page(text)
    # Nothing is loaded from anywhere: no src/href/url(), and the browser is told so.
    assert not re.search(r"\b(src|href)\s*=|url\(|@import|https?://", text)
    (csp,) = [a for a in p.all("meta") if a.get("http-equiv") == "Content-Security-Policy"]
    assert csp["content"].startswith("default-src 'none'")
    assert len(p.all("script")) == 1 and len(p.all("style")) == 1


def test_the_page_shows_every_pair_with_its_audited_value(clean):
    run, page = clean
    p = Page(page.read_text())
    eps = _audit_eps(run)
    cells = p.all("rect", "cell")
    assert len(cells) == N * (N - 1) == len(eps)
    for c in cells:
        v, u = int(c["data-v"]), int(c["data-u"])
        assert float(c["data-eps"]) == pytest.approx(eps[(v, u)], rel=1e-5)
    # Fault-free: every node finished, and every pair equals the plan.
    assert "NOT fault-free" not in page.read_text()
    assert len(p.all("circle", "miss")) == 0 and len(p.all("path", "fault")) == 0
    assert re.search(
        rf"{N * (N - 1)} pairs: <strong>{N * (N - 1)}</strong> equal", page.read_text()
    )


def test_a_killed_node_shows_in_the_status_the_timeline_and_the_findings(killed):
    run, page = killed
    text = page.read_text()
    p = Page(text)
    assert "NOT fault-free" in text
    rows = re.findall(r"<tr><td class=\"num\">(\d+)</td><td>(.*?)</td>", text)
    status = {int(i): s for i, s in rows}
    assert sorted(status) == list(range(N))
    assert "no result" in status[3] and all("no result" not in status[i] for i in status if i != 3)
    # Its neighbours logged the values they missed from it, each a dot on the timeline.
    misses = p.all("circle", "miss")
    assert misses
    rep = json.loads((run / "audit.json").read_text())
    assert any(f["node"] == 3 for f in rep["integrity"])
    assert re.search(r"<strong>[a-z-]+</strong> \(node 3\)", text)
    # Never below the plan: the audit of the damaged run shows no pair under it.
    assert re.search(r"<strong>0</strong> below it", text)


def test_large_runs_are_drawn_in_blocks_showing_their_largest_loss():
    n = 200
    eps = {(v, u): float((v * 7 + u * 3) % 11) for v in range(n) for u in range(n) if u != v}
    svg = htmlreport.heatmap_svg(n, eps, ldp=5.0)
    p = Page(svg)
    cells = p.all("rect", "cell")
    block = -(-n // htmlreport.HEAT_MAX)
    side = -(-n // block)
    assert len(cells) == side * side
    for c in cells[:: max(1, len(cells) // 50)]:
        bv, bu = int(c["data-v"]), int(c["data-u"])
        members = [
            eps[(v, u)]
            for v in range(bv * block, min(n, bv * block + block))
            for u in range(bu * block, min(n, bu * block + block))
            if u != v
        ]
        assert float(c["data-eps"]) == max(members)


def test_text_from_logs_is_escaped(tmp_path):
    run = _run(tmp_path)
    rep = json.loads((run / "audit.json").read_text())
    rep["integrity"] = [{"node": 1, "kind": "bad", "message": "<script>alert(1)</script>"}]
    (run / "audit.json").write_text(json.dumps(rep))
    text = htmlreport.build_html(run, rep, method="exact", notes=[])
    assert "<script>alert(1)" not in text and "&lt;script&gt;alert(1)" in text


def test_cli_html_writes_only_the_page(clean, tmp_path, capsys):
    from coordinator_free.cli import main

    run, _ = clean
    assert main(["report", str(run), "--html", "--out", str(tmp_path / "o"), "--json"]) == 0
    files = json.loads(capsys.readouterr().out)["files"]
    assert [Path(f).name for f in files] == ["report.html"]
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["report.html"]


# ------------------------------------------------------------------------ in headless Chromium


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if IN_CI:
            pytest.fail("chromium is needed for the HTML report test (.ci/run installs it)")
        pytest.skip("chromium not installed (apt-get install chromium)")
    return path


def _browse(page: Path, *args: str, fragment: str = "") -> str:
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
    cmd += ["--disable-extensions", "--user-data-dir=" + str(page.parent / ".chromium")]
    done = subprocess.run(
        [*cmd, *args, page.resolve().as_uri() + fragment],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_chromium_runs_the_script_and_shows_a_pair_on_request(killed):
    run, page = killed
    dom = _browse(page, "--dump-dom", fragment="#pair=2,5")
    p = Page(dom)
    (html,) = p.all("html")
    assert html.get("data-ready") == "1"  # the script ran to its end, without an error
    assert p.text_of["cells"] == str(N * (N - 1))
    eps = _audit_eps(run)[(2, 5)]
    assert p.text_of["hover"].startswith("observer 2 ← source 5: ε = ")
    assert float(p.text_of["hover"].rsplit("= ", 1)[1]) == pytest.approx(eps, rel=1e-3)
    (picked,) = p.all("rect", "picked")
    assert (picked["data-v"], picked["data-u"]) == ("2", "5")


def test_chromium_renders_a_page_that_is_not_blank(killed, tmp_path):
    _run_dir, page = killed
    shot = tmp_path / "shot.png"
    _browse(page, f"--screenshot={shot}", "--window-size=1200,1800", "--hide-scrollbars")
    from matplotlib.image import imread

    img = imread(shot)[..., :3]
    assert img.shape[:2] == (1800, 1200)
    colours = {tuple(px) for px in (img[::7, ::7] * 255).astype(int).reshape(-1, 3).tolist()}
    inked = (img.min(axis=2) < 0.9).mean()
    # Text, the status badges, the timeline and the heat map: many colours, plenty of ink.
    assert len(colours) > 40 and inked > 0.03, (len(colours), inked)
    # The red of the killed node's fault marks and badges is on the page.
    red = (img[..., 0] > 0.7) & (img[..., 1] < 0.35) & (img[..., 2] < 0.35)
    assert red.sum() > 20


def test_a_learning_run_shows_its_accuracy_by_round(tmp_path):
    run = _run(tmp_path)
    rows = [
        {"round": r, "avg_test_accuracy": 0.5 + 0.05 * r, "node_test_accuracy_min": 0.4 + 0.05 * r}
        for r in range(5)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    (page,) = render_report(run, html="only")["files"]
    p = Page(Path(page).read_text())
    assert p.text_of["accuracy"] == "Test accuracy by round"
    points = p.all("circle", "pt2")
    assert len(points) == 5
    assert "round 4: test accuracy 0.7" in Path(page).read_text()
