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
    assert (
        isinstance(recv["value"], list)
        and recv["digest"].startswith("blake3:")
        and len(recv["digest"]) == 39
    )


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
    assert (
        rows["half"]["status"] == "unfinished (5/5 results)" and rows["half"]["worst_eps"] is None
    )
    assert main(["ls", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "muffliato" in table and f"{worst:.3f}" in table
    assert main(["ls", str(tmp_path / "missing")]) == 2


# ----------------------------------------------------------------------- every kind of run


def _fabricate(base, name, cfg, *, results, summary=None, audit=True, around=None,
               hosts="127.0.0.1", missed=None, interrupted=False):  # fmt: skip
    """A run directory as its launcher leaves it (cluster/*.py, cli/run.py, rundir.py):
    config.toml, roster.json, a result per node in ``results``, and the launcher's own
    files: summary.json (cfree run, lab, central), an orchestrator's file in the directory
    around it (compose, stack, k8s), audit.json (the auditor), interrupted.json."""
    parent = base / name
    run = parent / "run" if around else parent
    (run / "results").mkdir(parents=True)
    (run / "logs").mkdir()
    (run / "config.toml").write_text(cfg.to_toml())
    n = cfg.graph_n()
    nodes = [{"id": i, "host": hosts.format(i=i), "port": 9000 + i, "public_key": "00"}
             for i in range(n)]  # fmt: skip
    (run / "roster.json").write_text(json.dumps({"format": "cfree-roster", "nodes": nodes}))
    for v in results:
        res = {"node": v, "estimate": [0.0], "missed": (missed or {}).get(v, [])}
        (run / "results" / f"node-{v}.json").write_text(json.dumps(res))
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))
    if audit:
        (run / "audit.json").write_text(json.dumps({"fault_free": True, "observers": []}))
    if around:
        (parent / around).write_text("# the orchestrator's file\n")
    if interrupted:
        (run / "interrupted.json").write_text(json.dumps({"command": "cfree run"}))
    return run


def test_ls_status_of_every_kind_of_run(tmp_path, capsys):
    cfg = config.load(None, ["graph.nodes=4", "protocol.steps=3"])
    every = range(4)
    missed = {1: [{"peer": 2, "step": 1, "reason": "deadline"}]}
    made = {
        "local": _fabricate(tmp_path / "a", "local", cfg, results=every,
                            summary={"completed_as_planned": True, "problems": []}),
        "local-bad": _fabricate(tmp_path / "a", "local-bad", cfg, results=every, summary={
            "completed_as_planned": False, "problems": [{"node": 2}, {"node": 3}]}),
        "lab": _fabricate(tmp_path / "a", "lab", cfg, results=every, hosts="10.77.0.{i}",
                          summary={"completed_as_planned": True, "problems": [], "lab": {}}),
        "central": _fabricate(tmp_path / "a", "central", cfg, results=(), summary={
            "results": {"central": {"test_loss": 0.3, "test_accuracy": 0.9}}, "failed": []}),
        "compose": _fabricate(tmp_path / "b", "compose", cfg, results=every,
                              around="docker-compose.yml", hosts="peer-{i}"),
        "compose-missed": _fabricate(tmp_path / "c", "compose", cfg, results=every,
                                     around="docker-compose.yml", hosts="peer-{i}",
                                     missed=missed),
        "stack": _fabricate(tmp_path / "d", "stack", cfg, results=every,
                            around="docker-stack.yml", hosts="peer-{i}"),
        "k8s": _fabricate(tmp_path / "e", "k8s", cfg, results=range(3),
                          hosts="cfree-peer-{i}.cfree-peers"),
        "interrupted": _fabricate(tmp_path / "a", "interrupted", cfg, results=range(2),
                                  audit=False, interrupted=True),
        "going": _fabricate(tmp_path / "a", "going", cfg, results=range(1), audit=False),
        "by hand": _fabricate(tmp_path / "f", "lan", cfg, results=(), audit=False,
                              hosts="192.168.1.{i}"),
    }  # fmt: skip
    expect = {
        "local": ("local", "ok"),
        "local-bad": ("local", "problems (2)"),
        "lab": ("lab", "ok"),
        "central": ("central", "ok"),
        "compose": ("compose", "ok"),
        "compose-missed": ("compose", "problems (1)"),
        "stack": ("stack", "ok"),
        # the auditor gave up waiting for node 3: a missing result is a problem
        "k8s": ("k8s", "problems (1)"),
        "interrupted": ("local", "interrupted (2/4 results)"),
        "going": ("local", "unfinished (1/4 results)"),
        "by hand": ("peers", "unfinished (0/4 results)"),
    }
    for key, run in made.items():
        assert main(["ls", str(run.parent), "--json"]) == 0
        rows = {r["path"]: r for r in json.loads(capsys.readouterr().out)}
        row = rows[str(run)]
        assert (row["kind"], row["status"]) == expect[key], key
    assert main(["ls", str(tmp_path / "a")]) == 0
    table = capsys.readouterr().out
    assert "kind" in table.splitlines()[0] and "interrupted (2/4 results)" in table


def test_an_interrupted_launcher_leaves_its_mark(tmp_path):
    import pytest

    from coordinator_free.cli.run import note_interruption

    with pytest.raises(KeyboardInterrupt), note_interruption("cfree run", tmp_path):
        raise KeyboardInterrupt
    assert json.loads((tmp_path / "interrupted.json").read_text())["command"] == "cfree run"
    with note_interruption("cfree run", tmp_path / "other"):
        pass
    assert not (tmp_path / "other").exists()
