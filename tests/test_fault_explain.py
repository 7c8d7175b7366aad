"""A faulted run explains itself: the simulator difference is labelled as expected under the
declared faults, a failure caused by a declared fault names it (declared step, fired step),
and dropout says how often each node sat out."""

from __future__ import annotations

from coordinator_free import config
from coordinator_free.cli import run as run_cli
from coordinator_free.families import family_of
from coordinator_free.families.averaging import render


def _doc(declared, injected=()):
    return {"declared": list(declared), "injected": list(injected), "not_applied": [],
            "errors": [], "peers": {}}  # fmt: skip


def test_the_simulator_difference_is_expected_only_under_declared_faults() -> None:
    assert run_cli.simulator_note(_doc(["kill:2@5"]), 0.098).startswith(
        "expected under the declared faults (kill:2@5)"
    )
    assert run_cli.simulator_note(_doc(["kill:2@5"]), 0.0) is None  # nothing to explain
    assert run_cli.simulator_note(_doc(["dropout:0.3"]), 0.5) is None  # in the plan: replayed
    assert run_cli.simulator_note(_doc([]), 0.5) is None


def test_a_failure_names_the_declared_fault_with_its_declared_and_fired_steps() -> None:
    kill = {"fault": "kill", "spec": "kill:2@5", "node": 2, "step": 5, "reported_by": 2,
            "t_s": 3.07}  # fmt: skip
    stop = {"fault": "stop", "spec": "stop:4@7+2", "node": 4, "step": 8, "t_s": 4.0}
    failed = [{"node": 2, "returncode": -9, "error": "killed by SIGKILL after step 3"}]
    problems = [
        {"node": 2, "step": 3, "cause": "process failed (exit -9): killed by SIGKILL after step 3"},
        {"node": 2, "step": 6, "cause": "its values were missed by node(s) 1"},
    ]
    run_cli.explain_failures(failed, problems, _doc(["kill:2@5", "stop:4@7+2"], [kill, stop]))
    said = "[the declared fault kill:2@5 (declared for step 5, fired when node 2 reported step 5"
    assert said in failed[0]["error"] and said in problems[0]["cause"]
    assert "declared fault" not in problems[1]["cause"]  # a consequence, not the failure
    assert run_cli._fired(stop) == "stop:4@7+2 (declared for step 7, fired at step 8, 4.0s)"


def test_dropout_says_how_often_each_node_sat_out(capsys) -> None:
    cfg = config.load("examples/muffliato-ring.toml", [], ["dropout:0.3"])
    plan = family_of(cfg.protocol.name).make_plan(cfg)
    sat_out = [sum(v in out for out in plan.dropped) for v in range(plan.n)]
    assert sum(sat_out) > 0
    summary = {"dropout": {"p": 0.3, "steps": plan.steps, "sat_out": sat_out},
               "simulator_max_abs_diff": 0.0, "run_dir": "r"}  # fmt: skip
    render.print_footer(summary, None)
    out = capsys.readouterr().out
    counts = ", ".join(f"{v}: {c}" for v, c in enumerate(sat_out))
    assert f"steps each node sat out, of {plan.steps}: {counts}" in out
