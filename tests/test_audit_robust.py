"""The auditor never crashes and never under-reports: whatever is missing or damaged in a run
directory, ``audit_run`` returns a report that says so (integrity findings) and gives every
(observer, source, method) a loss at least as large as the fault-free plan's, on in-memory runs
of the gossip families written as real run directories."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from auditruns import RUNS, make_run
from logfuzz import Log, encode, entries, fuzz, planned, verdict
from memrun import write_run_dir

from coordinator_free import config, rundir
from coordinator_free.accounting import audit
from coordinator_free.engine.memnet import Faults
from coordinator_free.families import family_of
from coordinator_free.inmemory import run_config
from coordinator_free.viewlog import ViewLogWriter, read_viewlog

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("runs")
    return {name: make_run(name, base / name) for name in RUNS}


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def assert_at_least_plan(rep: dict, run: Path) -> None:
    """Integrity findings, a conservative report, and every entry of every node at least the
    plan's."""
    plan_eps = planned(run)
    got = entries(rep)
    assert rep["integrity"] and rep["conservative"] is True
    assert set(got) == set(plan_eps)
    for k, e in plan_eps.items():
        assert got[k]["eps"] >= e - 1e-12, (k, got[k], e)
        assert got[k]["basis"] in ("realised", "plan", "worst-case")
        if got[k]["basis"] != "realised":
            assert got[k]["why"]


def log_of(run: Path, v: int) -> Path:
    return rundir.log_path(run, v)


# ------------------------------------------------------------------------------ the interface


@pytest.mark.parametrize(
    "name, path, sets",
    [
        (n, RUNS[n][0], RUNS[n][1])
        for n in ("muffliato", "randomized-gossip", "muffliato-gd", "dsgd")
    ]
    + [("central-dp", EX / "central-dp-breast-cancer.toml", ["protocol.rounds=3"])],
)
def test_planned_losses_are_the_plan_reports_numbers(name, path, sets):
    """planned_losses gives, pair by pair, what `cfree plan --source U` reports; the worst case
    is that or local DP, whichever is larger."""
    cfg = config.load(path, sets)
    fam = family_of(cfg.protocol.name)
    plan = fam.make_plan(cfg)
    observers = list(range(plan.n))
    got = fam.planned_losses(cfg, plan, observers)
    worst = fam.worst_case_losses(cfg, plan, observers)
    for m in audit.METHODS:
        # local DP in the method's conversion (paper formulas and their cap: the RDP one)
        ldp = audit.plan_report(cfg, source=None, method=m)["ldp"]
        for src in range(min(plan.n, 2)):
            rep = audit.plan_report(cfg, source=src, method=m)
            assert len(rep["losses"]) == plan.n - 1
            for x in rep["losses"]:
                p = got[x["observer"]][(src, m)]
                assert (p["factor"], p["rdp"], p["eps"]) == (x["factor"], x["rdp"], x["eps"])
                w = worst[x["observer"]][(src, m)]
                assert w["eps"] == max(x["eps"], ldp["eps"])
    assert set(got) == set(observers)
    assert all(len(d) == 2 * (plan.n - 1) for d in got.values())


# --------------------------------------------------------------------------- intact runs


@pytest.mark.parametrize("name", list(RUNS))
def test_intact_runs_are_realised_and_not_conservative(runs, name):
    """No finding on intact logs (the new cross-checks included, late values too): every entry
    is the realised loss and nothing is raised."""
    rep = audit.audit_run(runs[name])
    assert rep["integrity"] == [], rep["integrity"]
    assert rep["conservative"] is False
    assert {x["basis"] for o in rep["observers"] for x in o["losses"]} == {"realised"}
    assert not any("why" in x for o in rep["observers"] for x in o["losses"])
    if name == "muffliato-late":
        assert rep["realised"]["missed"] > 0 and rep["realised"]["late"] > 0


def test_duplicated_messages_are_no_finding(tmp_path):
    cfg = config.load(None, ["graph.nodes=5", "protocol.steps=6", "network.deadline_s=1"])
    out = write_run_dir(cfg, run_config(cfg, Faults(duplicate=0.4), seed=2), tmp_path / "dup")
    rep = audit.audit_run(out)
    assert rep["integrity"] == [] and rep["conservative"] is False


# ---------------------------------------------------------------------------- damaged logs


@pytest.mark.parametrize("name", list(RUNS))
def test_a_deleted_log_gives_that_observer_its_worst_case(runs, name, tmp_path):
    base = runs[name]
    cfg, plan = audit.load_run(base)
    worst = family_of(cfg.protocol.name).worst_case_losses(cfg, plan, list(range(plan.n)))
    for v in range(plan.n):
        run = copy_run(base, tmp_path / f"del{v}")
        log_of(run, v).unlink()
        rep = audit.audit_run(run)
        assert_at_least_plan(rep, run)
        (obs,) = [o for o in rep["observers"] if o["observer"] == v]
        assert {x["basis"] for x in obs["losses"]} == {"worst-case"}
        for x in obs["losses"]:
            assert x["eps"] >= worst[v][(x["source"], x["method"])]["eps"]
            assert "missing-log" in x["why"]
        # Asked for explicitly, the observer without a log is reported, not an error.
        alone = audit.audit_run(run, observers=[v])
        assert [o["observer"] for o in alone["observers"]] == [v]
        assert {x["basis"] for x in alone["observers"][0]["losses"]} == {"worst-case"}


@pytest.mark.slow  # exhaustive or long: in the slow suite, which CI runs
@pytest.mark.parametrize("name", list(RUNS))
def test_truncation_at_every_record_boundary_never_lowers_a_loss(runs, name, tmp_path):
    """The curious node that cuts its own log short (at a record boundary, so the file is
    well formed) gets the plan's loss at least, with its log named unfinished."""
    base = runs[name]
    run = copy_run(base, tmp_path / "run")
    n = audit.load_run(run)[1].n
    checked = 0
    for v in range(n):
        raw = log_of(base, v).read_bytes()
        for cut in Log.parse(raw).boundaries()[:-1]:
            log_of(run, v).write_bytes(raw[:cut])
            rep = audit.audit_run(run)
            assert_at_least_plan(rep, run)
            assert any(f["node"] == v for f in rep["integrity"])
            checked += 1
        log_of(run, v).write_bytes(raw)
    assert checked > 10 * n


@pytest.mark.parametrize("name", list(RUNS))
def test_random_truncations_and_byte_flips_never_lower_a_loss(runs, name, tmp_path):
    base = runs[name]
    run = copy_run(base, tmp_path / "run")
    rng = random.Random(name)
    n = audit.load_run(run)[1].n
    for v in range(n):
        raw = log_of(base, v).read_bytes()
        for _ in range(3):
            log_of(run, v).write_bytes(raw[: rng.randrange(len(raw))])
            assert_at_least_plan(audit.audit_run(run), run)
            flipped = bytearray(raw)
            flipped[rng.randrange(len(raw))] ^= rng.randrange(1, 256)
            log_of(run, v).write_bytes(bytes(flipped))
            assert_at_least_plan(audit.audit_run(run), run)
        log_of(run, v).write_bytes(raw)


def test_the_truncated_curious_node_no_longer_reports_zero(runs, tmp_path):
    """The measured failure: a log cut at a record boundary used to give its observer an
    exact row of zeros, unflagged."""
    run = copy_run(runs["muffliato"], tmp_path / "cut")
    raw = log_of(run, 2).read_bytes()
    cut = Log.parse(raw).boundaries()[3]  # the header and two records survive
    log_of(run, 2).write_bytes(raw[:cut])
    rep = audit.audit_run(run)
    (obs,) = [o for o in rep["observers"] if o["observer"] == 2]
    exact = [x for x in obs["losses"] if x["method"] == "exact"]
    assert all(x["eps"] > 0 for x in exact)
    assert all(x["basis"] == "plan" and "unfinished" in x["why"] for x in exact)
    assert all(x["from_logs"]["eps"] < x["eps"] for x in exact)


# ------------------------------------------------------------------------ malformed records


def rewrite(run: Path, v: int, edit) -> None:
    """Rewrite node v's log through the writer: ``edit(kind, fields)`` returns the records
    (kind, fields) to write in its place (an empty list drops it)."""
    vl = read_viewlog(log_of(run, v))
    h = vl.header
    log_of(run, v).unlink()
    with ViewLogWriter(log_of(run, v), run_id=h["run_id"], node=h["node"], params=h["params"]) as w:
        for r in vl.records:
            fields = {k: x for k, x in r.items() if k not in ("k", "seq", "t_mono", "t_wall")}
            for kind, f in edit(r["k"], fields):
                w.write(kind, **f)


def first_only(kind: str, change):
    done = []

    def edit(k, f):
        if k == kind and not done:
            done.append(1)
            return change(f)
        return [(k, f)]

    return edit


BAD_FIELDS = {
    "recv-no-digest-no-value": (
        "recv",
        lambda f: [("recv", {k: x for k, x in f.items() if k not in ("digest", "value")})],
        "digest",
    ),
    "step-a-string": ("recv", lambda f: [("recv", {**f, "step": "0"})], "step"),
    "step-a-bool": ("recv", lambda f: [("recv", {**f, "step": True})], "step"),
    "peer-a-float": ("recv", lambda f: [("recv", {**f, "peer": float(f["peer"])})], "peer"),
    "digest-an-int": ("recv", lambda f: [("recv", {**f, "digest": 7})], "digest"),
    "value-not-an-array": (
        "recv",
        lambda f: [("recv", {**{k: x for k, x in f.items() if k != "digest"}, "value": "abc"})],
        "value",
    ),
    "value-2d": (
        "recv",
        lambda f: [
            ("recv", {**{k: x for k, x in f.items() if k != "digest"}, "value": np.zeros((2, 2))})
        ],
        "value",
    ),
    "send-digest-none": ("send", lambda f: [("send", {**f, "digest": None})], "digest"),
    "late-no-now": ("recv", lambda f: [("late", f)], "now"),
    "finished-steps-a-string": (
        "finished",
        lambda f: [("finished", {**f, "steps": "all"})],
        "steps",
    ),
}


@pytest.mark.parametrize("case", list(BAD_FIELDS))
@pytest.mark.parametrize("name", ["muffliato", "randomized-gossip", "muffliato-gd"])
def test_records_with_wrong_fields_are_findings_not_tracebacks(runs, tmp_path, name, case):
    kind, change, field = BAD_FIELDS[case]
    run = copy_run(runs[name], tmp_path / "run")
    rewrite(run, 1, first_only(kind, change))
    rep = audit.audit_run(run)
    assert_at_least_plan(rep, run)
    bad = [f for f in rep["integrity"] if f["kind"] == "bad-record" and f["node"] == 1]
    assert bad, rep["integrity"]
    assert bad[0]["field"] == field and isinstance(bad[0]["seq"], int)
    assert f"seq {bad[0]['seq']}" in bad[0]["message"]


def test_hand_framed_records_with_wrong_types_are_findings(runs, tmp_path):
    """Records the writer would never produce (a non-string kind, a list for a record, a
    header whose params are not a map), framed by hand with a valid checksum."""
    base = runs["muffliato"]
    for i, junk in enumerate(([1, 2, 3], {"k": 5, "seq": 1}, {"k": "recv"}, "text", None)):
        run = copy_run(base, tmp_path / f"junk{i}")
        log = Log.parse(log_of(run, 0).read_bytes())
        log_of(run, 0).write_bytes(log.bytes(log.payloads[:4] + [encode(junk)] + log.payloads[4:]))
        assert_at_least_plan(audit.audit_run(run), run)
    run = copy_run(base, tmp_path / "params")
    log = Log.parse(log_of(run, 3).read_bytes())
    header = dict(log.records[0], params=["not", "a", "map"])
    log_of(run, 3).write_bytes(log.bytes([encode(header), *log.payloads[1:]]))
    rep = audit.audit_run(run)
    assert_at_least_plan(rep, run)
    (obs,) = [o for o in rep["observers"] if o["observer"] == 3]
    assert {x["basis"] for x in obs["losses"]} == {"worst-case"}


# --------------------------------------------------------------------- forged own views


@pytest.mark.parametrize("name", ["muffliato", "randomized-gossip", "dsgd"])
def test_a_node_that_deletes_its_receipts_and_renumbers_is_caught(runs, tmp_path, name):
    """A curious node rewrites its own log without some of the values it received, seqs
    consistent, still finished: every log is well formed, but a finished log must say, for
    every partner and step, received or missed."""
    run = copy_run(runs[name], tmp_path / "forged")
    rewrite(run, 1, lambda k, f: [] if k == "recv" else [(k, f)])
    rep = audit.audit_run(run)
    assert_at_least_plan(rep, run)
    kinds = {(f["node"], f["kind"]) for f in rep["integrity"]}
    assert (1, "missing-exchange-record") in kinds
    assert (1, "unacknowledged-send") in kinds


@pytest.mark.parametrize("name", ["muffliato", "randomized-gossip", "dsgd"])
def test_a_node_that_turns_its_receipts_into_misses_is_caught(runs, tmp_path, name):
    """The same node writes a proper miss in place of each value received: its senders logged
    sending them, and both logs are finished, so the values were never acknowledged."""
    run = copy_run(runs[name], tmp_path / "forged")

    def to_miss(k, f):
        if k == "recv":
            return [("miss", {"step": f["step"], "peer": f["peer"], "reason": "deadline"})]
        return [(k, f)]

    rewrite(run, 1, to_miss)
    rep = audit.audit_run(run)
    assert_at_least_plan(rep, run)
    assert [f["kind"] for f in rep["integrity"]] == ["unacknowledged-send"]


@pytest.mark.parametrize("name", ["muffliato", "randomized-gossip"])
def test_sha256_digests_and_values_without_digests_audit_alike(runs, tmp_path, name):
    """Logs written before BLAKE3 name what was sent by SHA-256 digests, and a log that keeps
    values may hold a received value without its digest: checked against each other, such logs
    give no finding and the intact run's every figure; a value that differs from the one sent
    is still caught."""
    from coordinator_free.viewlog import sha256_digest

    base = runs[name]
    nodes = [v for v in range(64) if log_of(base, v).exists()]
    sent = {
        (r["step"], r["peer"], v): r["value"]
        for v in nodes
        for r in read_viewlog(log_of(base, v)).records
        if r["k"] == "recv"
    }
    run = copy_run(base, tmp_path / "legacy")
    for v in nodes:

        def legacy(k, f, v=v):
            if k == "send":
                f = {**f, "digest": sha256_digest(sent[(f["step"], v, f["peer"])])}
            elif k == "recv":
                f = {x: y for x, y in f.items() if x != "digest"}
            return [(k, f)]

        rewrite(run, v, legacy)
    recs = read_viewlog(log_of(run, 1)).records
    assert all(":" not in r["digest"] for r in recs if r["k"] == "send")
    assert all("digest" not in r for r in recs if r["k"] == "recv")
    rep = audit.audit_run(run)
    assert rep["integrity"] == [], rep["integrity"]
    assert entries(rep) == entries(audit.audit_run(base))

    def altered(k, f):
        return [(k, {**f, "value": f["value"] + 1.0} if k == "recv" else f)]

    rewrite(run, 1, first_only("recv", lambda f: altered("recv", f)))
    kinds = {(f["node"], f["kind"]) for f in audit.audit_run(run)["integrity"]}
    assert (1, "digest-mismatch") in kinds


def test_hiding_a_late_value_is_caught(runs, tmp_path):
    """On a run whose values really came late, dropping a late record (seqs renumbered) would
    lower the observer's view: the sender's send is then unacknowledged."""
    base = runs["muffliato-late"]
    v = next(
        v for v in range(4) if any(r["k"] == "late" for r in read_viewlog(log_of(base, v)).records)
    )
    run = copy_run(base, tmp_path / "forged")
    rewrite(run, v, first_only("late", lambda f: []))
    rep = audit.audit_run(run)
    assert_at_least_plan(rep, run)
    assert (v, "unacknowledged-send") in {(f["node"], f["kind"]) for f in rep["integrity"]}


# ---------------------------------------------------------------------- the whole report


def test_an_audit_that_fails_falls_back_on_the_plan(runs, tmp_path, monkeypatch):
    run = copy_run(runs["muffliato"], tmp_path / "run")
    fam = family_of("muffliato")

    def broken(*a, **k):
        raise ZeroDivisionError("from a damaged log")

    monkeypatch.setattr(type(fam), "audit", broken)
    rep = audit.audit_run(run)
    assert rep["integrity"][0]["kind"] == "audit-failed"
    assert "ZeroDivisionError" in rep["integrity"][0]["message"]
    assert_at_least_plan(rep, run)
    assert {x["basis"] for o in rep["observers"] for x in o["losses"]} == {"plan"}
    # With a log missing too, that observer gets its worst case, the others the plan.
    log_of(run, 1).unlink()
    rep = audit.audit_run(run)
    assert_at_least_plan(rep, run)
    basis = {o["observer"]: {x["basis"] for x in o["losses"]} for o in rep["observers"]}
    assert basis == {0: {"plan"}, 1: {"worst-case"}, 2: {"plan"}, 3: {"plan"}}


def test_an_observer_that_is_not_a_node_is_still_an_error(runs):
    with pytest.raises(audit.AuditError, match="not a node id"):
        audit.audit_run(runs["muffliato"], observers=[9])


@pytest.mark.parametrize("name", ["muffliato", "central-dp"])
def test_injected_faults_are_reported_and_a_damaged_faults_file_is_a_finding(
    runs, tmp_path, name, capsys
):
    if name == "central-dp":
        run = tmp_path / "central"
        rundir.make_dirs(run)
        cfg = config.load(EX / "central-dp-breast-cancer.toml", ["protocol.rounds=2"])
        rundir.config_path(run).write_text(cfg.to_toml())
    else:
        run = copy_run(runs[name], tmp_path / "run")
    faults = {
        "declared": ["crash:2@3"],
        "injected": [{"fault": "crash", "node": 2, "step": 3, "t_s": 0.5, "detail": "killed"}],
    }
    rundir.faults_path(run).write_text(json.dumps(faults))
    rep = audit.audit_run(run)
    assert rep["faults"] == faults and rep["integrity"] == []
    family_of(rep["protocol"]).print_audit(rep)
    text = capsys.readouterr().out
    assert "crash:2@3" in text and "crash (node 2, step 3, t=0.5s): killed" in text
    for damage in ("{not json", json.dumps({"declared": "crash", "injected": []})):
        rundir.faults_path(run).write_text(damage)
        rep = audit.audit_run(run)
        assert [f["kind"] for f in rep["integrity"]] == ["bad-faults-file"]
        assert "faults" not in rep
        assert_at_least_plan(rep, run)


@pytest.mark.slow  # a real-process run of several seconds; the in-memory suites cover the rule
def test_cli_audit_of_a_truncated_log_prints_the_flagged_entries(runs, tmp_path):
    run = copy_run(runs["muffliato"], tmp_path / "run")
    raw = log_of(run, 2).read_bytes()
    log_of(run, 2).write_bytes(raw[: Log.parse(raw).boundaries()[4]])
    log_of(run, 3).unlink()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "coordinator_free", "audit", str(run)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    assert "* raised to the plan's loss" in p.stdout
    assert "# worst case" in p.stdout  # (! marks a paper figure below the exact loss)
    assert "#" in p.stdout.split("exact:")[1].split("paper:")[0]
    assert "*" in p.stdout.split("exact:")[1].split("paper:")[0]
    p = subprocess.run([*cmd, "--json"], capture_output=True, text=True, env=env, timeout=120)
    rep = json.loads(p.stdout)
    assert rep["conservative"] is True and "Traceback" not in p.stderr
    assert verdict(rep, audit.audit_run(runs["muffliato"]), planned(run)) is None
    p = subprocess.run([*cmd, "--strict"], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 1 and "Traceback" not in p.stderr


# -------------------------------------------------------------------------- fuzz sample


@pytest.mark.parametrize("name", ["muffliato", "randomized-gossip", "muffliato-late"])
def test_a_sample_of_mutated_logs_keeps_the_rule(runs, tmp_path, name):
    """About 300 mutated logs over three runs (the slow suite runs over 10,000:
    tests/test_fuzz_logs.py)."""
    out = fuzz(runs[name], tmp_path / "work", 100, seed=11)
    assert out.cases == 100
    assert not out.failures, "\n".join(out.failures[:10])
    assert out.unchanged > 0 and out.flagged > 0 and out.raised > 0


def test_the_fuzzer_catches_an_auditor_without_the_floor(runs, tmp_path, monkeypatch):
    """The fuzzer's verdict is not vacuous: without the floor, mutated logs lower losses."""
    real = audit.floor

    def no_floor(rep, *a, **k):
        out = real(rep, *a, **k)
        for o in out["observers"]:
            for x in o["losses"]:
                x.update(x.pop("from_logs", {}))
        return out

    monkeypatch.setattr(audit, "floor", no_floor)
    out = fuzz(runs["muffliato"], tmp_path / "work", 60, seed=5)
    assert any("below the plan" in f for f in out.failures), out.failures[:3]


def test_the_verdict_flags_a_silent_change(runs):
    base = audit.audit_run(runs["muffliato"])
    plan_eps = planned(runs["muffliato"])
    assert verdict(base, base, plan_eps) is None
    changed = json.loads(json.dumps(base))
    changed["observers"][0]["losses"][0]["eps"] *= 0.5
    assert "no integrity finding" in verdict(changed, base, plan_eps)
    changed["integrity"] = [{"node": 0, "kind": "unfinished", "message": "x"}]
    changed["conservative"] = True
    assert "below the plan" in verdict(changed, base, plan_eps)


@pytest.mark.parametrize("name", ["muffliato", "muffliato-gd"])
def test_an_array_in_a_header_param_is_a_finding_for_single_and_coalition_audits(name, tmp_path):
    """A damaged header may decode to anything, an array included (whose comparison is
    element-wise): both audits name it and neither raises; the coalition's rows stay at or
    above its plan."""
    run = make_run(name, tmp_path / "run")
    path = rundir.log_path(run, 1)
    log = Log.parse(path.read_bytes())
    header = log.records[0]
    key = sorted(header["params"])[0]
    header["params"][key] = np.arange(3.0)
    path.write_bytes(log.bytes([encode(header), *log.payloads[1:]]))
    rep = audit.audit_run(run)
    assert any(f["node"] == 1 and f["kind"] == "param-mismatch" for f in rep["integrity"])
    cfg, plan = audit.load_run(run)
    members = [0, 1]
    co = audit.coalition_audit(run, cfg, plan, members)
    assert any(f.get("node") == 1 for f in co["integrity"]), co["integrity"]
    want = {
        r["source"]: r["eps"]
        for r in family_of(cfg.protocol.name).coalition_plan(cfg, plan, members)["losses"]
    }
    assert all(r["eps"] >= want[r["source"]] * (1 - 1e-9) for r in co["losses"])
