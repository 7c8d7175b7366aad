"""`cfree log dump` and `cfree ls` on run directories written from in-memory runs."""

from __future__ import annotations

import json

from memrun import write_run_dir

from coordinator_free import config
from coordinator_free.cli import main
from coordinator_free.families import family_of
from coordinator_free.inmemory import run_config
from coordinator_free.viewlog import read_viewlog


def _run(tmp_path, name="ring"):
    cfg = config.load(None, ["graph.nodes=5", "protocol.steps=3"])
    return cfg, write_run_dir(cfg, run_config(cfg, seed=1), tmp_path / name)


def test_log_dump_prints_every_record_and_jsonl_in_full(tmp_path, capsys):
    _, run = _run(tmp_path)
    path = run / "logs" / "node-2.vlog"
    log = read_viewlog(path)
    assert main(["log", "dump", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + len(log.records)
    assert lines[0].split()[1] == "header"
    assert any("recv" in line and "<float64 array 4>" in line for line in lines)
    assert main(["log", "dump", str(path), "--jsonl"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[0]["k"] == "header" and rows[0]["node"] == 2
    assert [r["seq"] for r in rows[1:]] == [r["seq"] for r in log.records]
    recv = next(r for r in rows if r["k"] == "recv")
    assert isinstance(recv["value"], list) and len(recv["digest"]) == 32


def test_a_damaged_log_prints_what_is_readable_and_names_the_damage(tmp_path, capsys):
    _, run = _run(tmp_path)
    path = run / "logs" / "node-1.vlog"
    whole = read_viewlog(path)
    path.write_bytes(path.read_bytes()[:-5])  # a torn last record
    assert main(["log", "dump", str(path), "--jsonl"]) == 1
    out = capsys.readouterr()
    assert len(out.out.splitlines()) == len(whole.records)  # the header, all but the last
    assert "torn-tail" in out.err and f"byte {whole.offsets[-1]}" in out.err
    assert main(["log", "dump", str(tmp_path / "nope.vlog")]) == 2
    assert "no such view log" in capsys.readouterr().err


def test_ls_lists_runs_with_status_and_worst_eps(tmp_path, capsys):
    cfg, done = _run(tmp_path, "done")
    plan = family_of(cfg.protocol.name).make_plan(cfg)
    audit = family_of(cfg.protocol.name).audit(done, cfg, plan, None)
    (done / "audit.json").write_text(json.dumps(audit))
    (done / "summary.json").write_text(json.dumps({"completed_as_planned": True, "problems": []}))
    _run(tmp_path, "half")  # no summary: still going, or stopped
    (tmp_path / "not-a-run").mkdir()
    assert main(["ls", str(tmp_path), "--json"]) == 0
    rows = {r["run"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"done", "half"}
    worst = max(x["eps"] for o in audit["observers"] for x in o["losses"] if x["method"] == "exact")
    assert rows["done"]["status"] == "ok" and rows["done"]["fault_free"] is True
    assert rows["done"]["worst_eps"] == worst and rows["done"]["n"] == 5
    assert rows["half"]["status"] == "unfinished" and rows["half"]["worst_eps"] is None
    assert main(["ls", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "muffliato" in table and f"{worst:.3f}" in table
    assert main(["ls", str(tmp_path / "missing")]) == 2
