"""A declared node fault that never takes effect is reported as not applied, with the reason:
in faults.json and on stderr of ``cfree run``, and in the in-memory network's run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from memcases import ALL, DEADLINE, EX

from coordinator_free import config, faults
from coordinator_free.cluster.faultsched import FaultSchedule
from coordinator_free.engine.memnet import Faults
from coordinator_free.inmemory import run_config


def _walk_results(last_step: int) -> dict:
    return {v: {"steps": 3, "walks": {"ended": {"0": {"how": "completed", "step": last_step}}}}
            for v in range(4)}  # fmt: skip


def test_a_nan_that_was_sent_is_not_listed_and_one_that_was_not_says_why():
    fp = faults.plan_of(["nan:2@3", "nan:2@5", "nan:1@50"])
    reached = faults.last_steps(_walk_results(20), global_steps=True)
    assert reached == {0: 20, 1: 20, 2: 20, 3: 20}
    out = faults.not_applied(
        fp, launcher_pending=[], nan_sent={2: {3}}, reached=reached, global_steps=True
    )
    assert [x["spec"] for x in out] == ["nan:2@5", "nan:1@50"]
    assert out[0]["reason"] == (
        "node 2 sent no value or token at step 5 (the token was not at that node then)"
    )
    assert out[1]["reason"] == "the run ended first: the walks ended at step 20, before step 50"


def test_a_launcher_fault_no_report_reached_says_how_far_its_node_got():
    fp = faults.plan_of(["kill:1@9", "cut:0@2"])
    results = {0: {"steps": 12}, 1: {"steps": 4}, 2: None}
    out = faults.not_applied(
        fp,
        launcher_pending=[faults.parse("kill:1@9")],
        nan_sent={},
        reached=faults.last_steps(results, global_steps=False),
        global_steps=False,
    )
    assert out == [
        {"spec": "kill:1@9", "fault": "kill", "node": 1, "step": 9,
         "reason": "the run ended first: node 1 ended at step 4, before step 9"}
    ]  # fmt: skip
    gone = faults.not_applied(
        faults.plan_of(["nan:2@1"]),
        launcher_pending=[],
        nan_sent={},
        reached=faults.last_steps(results, global_steps=False),
        global_steps=False,
    )
    assert gone[0]["reason"] == "node 2 wrote no result: nothing says it reached step 1"


def test_the_launcher_writes_what_never_applied_to_faults_json(tmp_path):
    fp = faults.plan_of(["nan:2@10", "nan:2@3", "stop:1@99+1"])
    s = FaultSchedule(fp, global_steps=True)
    peers = {2: {"link": {}, "nan": [{"step": 3, "peer": 3}], "signals": []}}
    doc = s.record(tmp_path, peers, _walk_results(30))
    assert json.loads((tmp_path / "faults.json").read_text()) == doc
    assert [(x["spec"], x["reason"]) for x in doc["not_applied"]] == [
        ("nan:2@10", "node 2 sent no value or token at step 10 (the token was not at that node "
                     "then)"),
        ("stop:1@99+1", "the run ended first: the walks ended at step 30, before step 99"),
    ]  # fmt: skip


def _ring(spec: str):
    path, sets = ALL["ring-sum"]
    cfg = config.load(path, [*sets, f"network.deadline_s={DEADLINE}"], [spec])
    return run_config(cfg, Faults.of_config(cfg), seed=3)


def test_in_memory_a_ring_node_without_the_token_at_the_step_reports_its_nan_not_applied():
    # ring-sum on 5 nodes: node 2 hands the token on at steps 3, 8, 13, 18 only.
    fired = _ring("nan:2@3")
    assert [(i["fault"], i["node"], i["step"]) for i in fired.injected] == [("nan", 2, 3)]
    assert fired.not_applied == []
    missed = _ring("nan:2@4")
    assert not any(i["fault"] == "nan" for i in missed.injected)
    assert missed.not_applied == [
        {"spec": "nan:2@4", "fault": "nan", "node": 2, "step": 4,
         "reason": "node 2 sent no value or token at step 4 (the token was not at that node "
                   "then)"}
    ]  # fmt: skip
    late = _ring("nan:2@400")
    assert late.not_applied[0]["reason"] == (
        "the run ended first: the walks ended at step 20, before step 400"
    )


@pytest.mark.slow
def test_cfree_run_says_a_nan_fault_never_applied(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "coordinator_free", "run", str(EX / "ring-sum.toml"),
         "--set", "graph.nodes=6", "--set", "protocol.cycles=5", "--set", "network.deadline_s=2",
         "--fault", "nan:2@10", "--out", str(out), "--json"],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "faults.json").read_text())
    assert doc["injected"] == []
    assert [(x["spec"], x["node"], x["step"]) for x in doc["not_applied"]] == [("nan:2@10", 2, 10)]
    reason = doc["not_applied"][0]["reason"]
    assert reason.startswith("node 2 sent no value or token at step 10"), reason
    assert f"--fault nan:2@10 never applied: {reason}" in proc.stderr
    assert json.loads(proc.stdout)["faults"]["not_applied"] == doc["not_applied"]
