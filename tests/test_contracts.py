"""Golden contract tests: the JSON that cfree prints and writes, pinned against tests/golden/.

What is pinned (regenerate with ``python3 tests/golden/make_golden.py``, and only for an
intentional contract change):

* ``cfree plan CONFIG --json`` (both methods) and ``cfree simulate CONFIG --json`` for every
  example config, plus a few ``--source`` and ``--target-eps`` plans: every key, list length,
  value type, and every value (numbers to rel 1e-9 / abs 1e-12). They run in process.
* small real runs (``cfree run``, peer processes on loopback, one per protocol family; two
  of them only with ``-m slow``): the run directory's files, ``summary.json`` (which is also
  what ``cfree run --json`` prints), ``results/node-*.json``, ``roster.json``,
  ``metrics.jsonl``, ``cfree audit RUN --json`` (which is also ``audit.json``) and the view
  logs (header, record kinds, their fields and field types, records of each kind per node).
  Peers draw values and noise from fresh secret keys, so such values (and timings, ports,
  byte counts) are pinned by type only: the golden holds ``"<float>"`` where a run-dependent
  float was. Everything else is pinned by value: the plan part, protocol names, counts,
  fault-free flags, the simulator match, the audit (which must also equal ``cfree plan
  --source u`` for every pair).

A failure names the JSON path of every difference, e.g. ``plan/ring-sum.exact.by_distance[3].
eps_max: 4.1 != 4.2 (golden)``.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from netrun import cfree_run_json

from coordinator_free import cli
from coordinator_free.accounting import audit as audit_mod
from coordinator_free.viewlog import read_viewlog

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
GOLDEN = Path(__file__).resolve().parent / "golden"
REL_TOL = 1e-9
ABS_TOL = 1e-12
REGENERATE = "python3 tests/golden/make_golden.py (only for an intentional contract change)"

# ---------------------------------------------------------------------------------- comparing


def typename(x: Any) -> str:
    """The contract's name for a value's type (JSON types, plus what view logs decode to)."""
    if x is None:
        return "null"
    if isinstance(x, np.ndarray):
        return f"ndarray[{x.dtype}]"
    return {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict"}.get(
        type(x), type(x).__name__
    )


def _key_path(path: str, key: str) -> str:
    return f"{path}.{key}" if key.isidentifier() else f"{path}[{key!r}]"


def json_diff(actual: Any, golden: Any, path: str = "$") -> list[str]:
    """Every difference between ``actual`` and ``golden``, one line each, named by its JSON
    path: missing keys, list lengths, types (int, float, bool and null are all different) and
    values (floats to rel 1e-9 / abs 1e-12, everything else exactly). A key the golden does not
    have is allowed: a contract may be extended, never broken."""
    if typename(actual) != typename(golden):
        return [f"{path}: type {typename(actual)} != {typename(golden)} (golden): {actual!r:.80}"]
    if isinstance(golden, dict):
        diffs = [f"{_key_path(path, k)}: missing" for k in golden if k not in actual]
        for k in golden:
            if k in actual:
                diffs += json_diff(actual[k], golden[k], _key_path(path, k))
        return diffs
    if isinstance(golden, list):
        diffs = []
        if len(actual) != len(golden):
            diffs.append(f"{path}: length {len(actual)} != {len(golden)} (golden)")
        for i, (a, g) in enumerate(zip(actual, golden, strict=False)):
            diffs += json_diff(a, g, f"{path}[{i}]")
        return diffs
    if isinstance(golden, float):
        same = (math.isnan(actual) and math.isnan(golden)) or math.isclose(
            actual, golden, rel_tol=REL_TOL, abs_tol=ABS_TOL
        )
    else:
        same = actual == golden
    return [] if same else [f"{path}: {actual!r} != {golden!r} (golden)"]


def assert_matches(actual: Any, golden: Any, label: str) -> None:
    diffs = json_diff(actual, golden, label)
    if diffs:
        shown = "\n  ".join(diffs[:40]) + (
            f"\n  ... and {len(diffs) - 40} more" if len(diffs) > 40 else ""
        )
        pytest.fail(
            f"{len(diffs)} difference(s) from the golden contract:\n  {shown}\n"
            f"If the change is intended, regenerate: {REGENERATE}",
            pytrace=False,
        )


def mask(doc: Any, volatile: Sequence[str]) -> Any:
    """``doc`` with the values at the ``volatile`` paths (dotted, ``*`` matches any key or list
    index) replaced by type markers such as ``"<float>"``; lists under them keep their length
    and dicts their keys."""
    patterns = [tuple(p.split(".")) for p in volatile]

    def markers(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: markers(v) for k, v in x.items()}
        if isinstance(x, list):
            return [markers(v) for v in x]
        return f"<{typename(x)}>"

    def walk(x: Any, path: tuple[str, ...]) -> Any:
        for p in patterns:
            if len(p) == len(path) and all(a in ("*", b) for a, b in zip(p, path, strict=True)):
                return markers(x)
        if isinstance(x, dict):
            return {k: walk(v, (*path, k)) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v, (*path, str(i))) for i, v in enumerate(x)]
        return x

    return walk(doc, ())


def load_golden(name: str) -> dict:
    path = GOLDEN / f"{name}.json"
    if not path.is_file():
        pytest.fail(f"no golden file {path}; generate it: {REGENERATE}", pytrace=False)
    return json.loads(path.read_text())


def write_golden(name: str, doc: dict) -> Path:
    path = GOLDEN / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    return path


# ------------------------------------------------------------------------ plan and simulate


def cli_json(argv: Sequence[str]) -> Any:
    """``cfree ARGV`` in process; its stdout parsed as JSON. ``examples/...`` arguments are
    taken relative to the repository, so the tests run from any directory."""
    args = [str(ROOT / a) if a.startswith("examples/") else a for a in argv]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = cli.main(args)
    assert code == 0, f"cfree {' '.join(argv)} exited {code}"
    return json.loads(buf.getvalue())


def sets(overrides: Sequence[str]) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


#: Per example config, the overrides that keep its plan and simulation to a fraction of a
#: second (every example must be listed: a new one needs a golden too).
SMALL: dict[str, tuple[str, ...]] = {
    "central-dp-breast-cancer": ("graph.nodes=8", "protocol.rounds=10"),
    "complete-histogram": ("graph.nodes=8", "protocol.hops=48"),
    "complete-sgd": (),
    "complete-sum": (),
    "decor-breast-cancer": ("protocol.rounds=20",),
    "decor-ring": ("protocol.rounds=50",),
    "dsgd-breast-cancer": ("graph.nodes=8", "protocol.rounds=10"),
    "muffliato-gd-breast-cancer": ("graph.nodes=8", "protocol.rounds=10"),
    "muffliato-hypercube": (),
    "muffliato-ring": (),
    "randomized-gossip-ring": (),
    "ring-histogram": ("graph.nodes=16",),
    "ring-sum": (),
    "walk-sgd": (),
    "admm-lasso": ("graph.nodes=8", "protocol.hops=24", "data.samples=200", "data.features=8"),
    "prox-sgd-lasso": ("graph.nodes=4", "protocol.rounds=10", "data.samples=200",
                       "data.features=8"),
}  # fmt: skip


@dataclass(frozen=True)
class CliCase:
    """One ``cfree ... --json`` command and the golden file (``tests/golden/NAME.json``) that
    pins its output."""

    name: str
    argv: tuple[str, ...]


def _example_cases() -> list[CliCase]:
    cases = []
    for ex, small in SMALL.items():
        cfg = (f"examples/{ex}.toml", *sets(small))
        for method in ("exact", "paper"):
            cases.append(
                CliCase(f"plan/{ex}.{method}", ("plan", *cfg, "--method", method, "--json"))
            )
        cases.append(CliCase(f"simulate/{ex}", ("simulate", *cfg, "--json")))
    return cases


def _plan(name: str, ex: str, *args: str) -> CliCase:
    return CliCase(
        f"plan/{name}", ("plan", f"examples/{ex}.toml", *sets(SMALL[ex]), *args, "--json")
    )


CLI_CASES: list[CliCase] = [
    *_example_cases(),
    # One source's losses, per family.
    _plan("muffliato-ring.source0.exact", "muffliato-ring", "--source", "0"),
    _plan("randomized-gossip-ring.source0.exact", "randomized-gossip-ring", "--source", "0"),
    _plan("ring-sum.source0.exact", "ring-sum", "--source", "0"),
    _plan("complete-sum.source0.paper", "complete-sum", "--source", "0", "--method", "paper"),
    _plan("decor-ring.source0.exact", "decor-ring", "--source", "0"),
    _plan("dsgd-breast-cancer.source0.exact", "dsgd-breast-cancer", "--source", "0"),
    # Calibration (--target-eps): sigma, the binding pair; decor: the (sigma, sigma_cor) pairs.
    _plan("muffliato-ring.target5.worst", "muffliato-ring", "--target-eps", "5"),
    _plan(
        "muffliato-ring.target5.mean.paper",
        "muffliato-ring",
        *("--target-eps", "5", "--budget", "mean", "--method", "paper"),
    ),
    _plan("ring-sum.target2", "ring-sum", "--target-eps", "2"),
    _plan("walk-sgd.target10.paper", "walk-sgd", "--target-eps", "10", "--method", "paper"),
    _plan("decor-ring.target10.mid", "decor-ring", "--target-eps", "10"),
    _plan("decor-ring.target10.low", "decor-ring", "--target-eps", "10", "--pair", "low"),
]


def test_every_example_config_is_pinned() -> None:
    assert sorted(SMALL) == sorted(p.stem for p in EXAMPLES.glob("*.toml"))
    assert len(SMALL) == 16


@pytest.mark.parametrize("case", CLI_CASES, ids=lambda c: c.name)
def test_cli_json_matches_golden(case: CliCase) -> None:
    golden = load_golden(case.name)
    assert golden["argv"] == list(case.argv), f"golden {case.name} is for other arguments"
    assert_matches(cli_json(case.argv), golden["output"], case.name)


def test_builtin_default_config_is_muffliato_hypercube() -> None:
    """``cfree plan`` / ``cfree simulate`` without a config use the packaged copy of
    examples/muffliato-hypercube.toml."""
    assert_matches(
        cli_json(["plan", "--json"]),
        load_golden("plan/muffliato-hypercube.exact")["output"],
        "plan",
    )
    assert_matches(
        cli_json(["simulate", "--json"]),
        load_golden("simulate/muffliato-hypercube")["output"],
        "sim",
    )


# ------------------------------------------------------------------------------- real runs


@dataclass(frozen=True)
class RunCase:
    """A tiny ``cfree run`` of one protocol family, pinned by ``tests/golden/runs/NAME.json``."""

    name: str
    example: str
    overrides: tuple[str, ...]
    slow: bool = False

    @property
    def config(self) -> Path:
        return EXAMPLES / f"{self.example}.toml"


RUNS: list[RunCase] = [
    RunCase("muffliato-ring", "muffliato-ring", ("graph.nodes=4",)),
    RunCase("decor", "decor-ring", ("graph.nodes=4", "protocol.rounds=3")),
    RunCase("central-dp", "central-dp-breast-cancer", ("graph.nodes=4", "protocol.rounds=3")),
    RunCase("ring-sum", "ring-sum", ("graph.nodes=4", "protocol.cycles=1")),
    RunCase(
        "randomized-gossip",
        "randomized-gossip-ring",
        ("graph.nodes=4", "protocol.tick=0", "protocol.steps=8"),
        slow=True,
    ),
    RunCase(
        "muffliato-gd",
        "muffliato-gd-breast-cancer",
        ('graph.kind="ring"', "graph.nodes=4", "protocol.rounds=2"),
        slow=True,
    ),
]

#: Learning metrics: all but the round number depend on the nodes' secret noise.
_METRICS = tuple(f"avg_{m}" for m in ("test_loss", "test_accuracy", "train_loss")) + (
    "consensus_distance",
    "node_test_accuracy_min",
    "node_test_accuracy_mean",
    "node_test_accuracy_max",
)
#: Run-dependent values (secret keys, timing, ports): pinned by type and shape only.
SUMMARY_VOLATILE = (
    "run_dir",
    "wall_s",
    "results.true_mean",
    *(f"results.nodes.*.{k}" for k in ("estimate", "error", "test_loss", "test_accuracy")),
    *(f"results.nodes.*.{k}" for k in ("bytes_sent", "bytes_received", "elapsed_s", "steps_per_s")),
    *(f"results.metrics.*.{m}" for m in _METRICS),
    *(f"results.tokens.*.{k}" for k in ("final", "estimate", "truth", "error")),
    "results.central.test_loss",
    "results.central.test_accuracy",
    # The yardstick's measured side (and so its ratio and flag); its expected side is public.
    *(f"yardstick.{k}" for k in ("measured", "ratio", "far", "accuracy.measured")),
)
NODE_RESULT_VOLATILE = (
    "estimate",
    "elapsed_s",
    "bytes_sent",
    "bytes_received",
    "channels.*.local",
    "channels.*.remote",
    "walks.finals.*",
)
METRICS_VOLATILE = tuple(f"*.{m}" for m in _METRICS)
AUDIT_VOLATILE = ("run_dir",)
ROSTER_VOLATILE = ("run_id", "nodes.*.port", "nodes.*.public_key")
VIEWLOG_HEADER_VOLATILE = ("run_id", "t_mono", "t_wall")
#: View-log kinds whose presence depends on timing even in a fault-free run, with their
#: fields: a neighbour's "done" may reach a node before it has finished its own last step.
OPTIONAL_KINDS: dict[str, tuple[str, ...]] = {
    "peer-done": ("at", "k", "peer", "seq", "step", "t_mono", "t_wall"),
}


def _node_files(directory: Path, pattern: str) -> list[tuple[int, Path]]:
    """``node-<id>...`` files of ``directory`` in node order."""
    found = [(int(p.name.split(".")[0].removeprefix("node-")), p) for p in directory.glob(pattern)]
    return sorted(found)


def viewlog_contract(out: Path) -> dict:
    """The view logs of a run: problems (none), every header, the records of each kind per
    node, and every kind's fields with their types (the timing-dependent OPTIONAL_KINDS
    aside)."""
    problems: dict[str, list[str]] = {}
    headers: dict[str, Any] = {}
    counts: dict[str, dict[str, int]] = {}
    fields: dict[str, set[str]] = {}
    for v, path in _node_files(out / "logs", "node-*.vlog"):
        log = read_viewlog(path)
        problems[str(v)] = [str(p) for p in log.problems]
        headers[str(v)] = mask(log.header, VIEWLOG_HEADER_VOLATILE)
        kinds = [r["k"] for r in log.records if r["k"] not in OPTIONAL_KINDS]
        counts[str(v)] = dict(sorted(Counter(kinds).items()))
        for r in log.records:
            if r["k"] not in OPTIONAL_KINDS:
                shape = {k: typename(x) for k, x in sorted(r.items())}
                fields.setdefault(r["k"], set()).add(json.dumps(shape))
    return {
        "problems": problems,
        "headers": headers,
        "records_per_node": counts,
        "fields": {k: [json.loads(s) for s in sorted(v)] for k, v in sorted(fields.items())},
    }


def run_contract(out: Path, summary: dict, audit_rep: dict) -> dict:
    """Everything pinned about a finished run, run-dependent values masked."""
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    doc: dict[str, Any] = {
        "files": files,
        "summary": mask(summary, SUMMARY_VOLATILE),
        "node_results": {
            str(v): mask(json.loads(p.read_text()), NODE_RESULT_VOLATILE)
            for v, p in _node_files(out / "results", "node-*.json")
        },
        "audit": mask(audit_rep, AUDIT_VOLATILE),
        "roster": None,
        "metrics": None,
        "viewlogs": viewlog_contract(out),
    }
    if (out / "roster.json").is_file():
        doc["roster"] = mask(json.loads((out / "roster.json").read_text()), ROSTER_VOLATILE)
    if (out / "metrics.jsonl").is_file():
        lines = (out / "metrics.jsonl").read_text().splitlines()
        doc["metrics"] = mask([json.loads(line) for line in lines], METRICS_VOLATILE)
    return doc


@dataclass(frozen=True)
class RunOutput:
    case: RunCase
    out: Path
    summary: dict  # what `cfree run --json` printed
    audit: dict  # what `cfree audit RUN --json` printed


def do_run(case: RunCase, out: Path) -> RunOutput:
    """``cfree run CONFIG --set ... --out OUT --json`` (real peer processes), then
    ``cfree audit OUT --json``."""
    summary = cfree_run_json(case.config, list(case.overrides), out)
    return RunOutput(case, out, summary, cli_json(["audit", str(out), "--json"]))


@pytest.fixture(
    scope="module",
    params=[pytest.param(c, id=c.name, marks=[pytest.mark.slow] if c.slow else []) for c in RUNS],
)
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> RunOutput:
    case: RunCase = request.param
    return do_run(case, tmp_path_factory.mktemp(case.name) / "run")


@pytest.fixture(scope="module")
def contract(run: RunOutput) -> tuple[dict, dict]:
    """(this run's contract, the golden one), checked to be for the same config."""
    golden = load_golden(f"runs/{run.case.name}")
    assert golden["config"] == f"examples/{run.case.example}.toml"
    assert golden["overrides"] == list(run.case.overrides), "golden made with other overrides"
    return run_contract(run.out, run.summary, run.audit), golden


@pytest.mark.parametrize(
    "part", ["files", "summary", "node_results", "roster", "metrics", "audit", "viewlogs"]
)
def test_run_matches_golden(run: RunOutput, contract: tuple[dict, dict], part: str) -> None:
    actual, golden = contract
    assert_matches(actual[part], golden[part], f"runs/{run.case.name}.{part}")


def test_run_outputs_are_the_files_they_describe(run: RunOutput) -> None:
    """``cfree run --json`` prints summary.json; ``cfree audit --json`` prints what the run
    saved as audit.json."""
    saved = json.loads((run.out / "summary.json").read_text())
    assert_matches(run.summary, saved, f"runs/{run.case.name}: cfree run --json")
    saved = json.loads((run.out / "audit.json").read_text())
    # audit.json also records the logs it was computed from (cfree report checks them).
    assert saved.pop(audit_mod.LOGS_KEY) == audit_mod.logs_fingerprint(run.out)
    # ... and who wrote it (cfree audit keeps another auditor's audit.json aside).
    assert saved.pop(audit_mod.WRITER_KEY)["run_dir"] == str(run.out.resolve())
    assert_matches(run.audit, saved, f"runs/{run.case.name}: cfree audit --json")


def test_run_optional_viewlog_records_have_their_fields(run: RunOutput) -> None:
    for _, path in _node_files(run.out / "logs", "node-*.vlog"):
        for r in read_viewlog(path).records:
            if r["k"] in OPTIONAL_KINDS:
                assert tuple(sorted(r)) == OPTIONAL_KINDS[r["k"]], (path.name, r)


def audit_plan_diffs(run: RunOutput) -> list[str]:
    """Where ``cfree audit RUN --json`` of a fault-free run differs from ``cfree plan
    --source u --json`` of the same config: every (observer, source, method) loss and the
    parameters both report."""
    rep = run.audit
    base = ["plan", str(run.case.config), *sets(run.case.overrides)]
    diffs = []
    for method in ("exact", "paper"):
        for u in range(rep["n"]):
            plan = cli_json([*base, "--source", str(u), "--method", method, "--json"])
            if u == 0:
                for k in ("protocol", "alpha", "delta", "n", "steps"):
                    diffs += json_diff(rep[k], plan[k], f"audit.{k} vs plan({method})")
                # The audit's local DP is the exact one; a paper plan states it in the RDP
                # conversion of its formulas, which the audit keeps as eps_rdp.
                ldp = rep["ldp"]
                if method == "paper" and ldp.get("conversion") == "gaussian":
                    ldp = {**ldp, "eps": ldp["eps_rdp"], "conversion": "rdp"}
                    del ldp["eps_rdp"]
                diffs += json_diff(ldp, plan["ldp"], f"audit.ldp vs plan({method})")
            want = {x["observer"]: x for x in plan["losses"]}
            assert sorted(want) == sorted(set(range(rep["n"])) - {u})
            for o in rep["observers"]:
                v = o["observer"]
                if v == u:
                    continue
                (got,) = [x for x in o["losses"] if x["source"] == u and x["method"] == method]
                for k in ("distance", "factor", "rdp", "eps", "eps_rdp", "conversion"):
                    if k not in got and k not in want[v]:
                        continue
                    where = f"audit.observers[{v}] source {u} {method}.{k} vs plan"
                    diffs += json_diff(got[k], want[v][k], where)
    return diffs


def test_run_audit_equals_plan(run: RunOutput) -> None:
    """A fault-free run's audit is its plan: the schedule is public (for the token walk: the
    ring's), so the losses the auditor replays from the logs are the planned ones."""
    assert run.audit["fault_free"] is True and run.audit["integrity"] == []
    diffs = audit_plan_diffs(run)
    assert not diffs, "\n".join(diffs[:40])


# --------------------------------------------------------------------- the comparison itself


def test_json_diff_names_every_kind_of_change() -> None:
    golden = {"rows": [{"eps": 4.2, "n": 3, "ok": True, "x": None}], "name": "ring"}
    same = {"rows": [{"eps": 4.2 * (1 + 1e-12), "n": 3, "ok": True, "x": None}], "name": "ring"}
    assert json_diff(same, golden) == []
    changed = {"rows": [{"eps": 4.1, "n": 3.0, "ok": 1, "y": None}, {}], "title": "ring"}
    assert json_diff(changed, golden, "plan") == [
        "plan.name: missing",
        "plan.rows: length 2 != 1 (golden)",
        "plan.rows[0].x: missing",
        "plan.rows[0].eps: 4.1 != 4.2 (golden)",
        "plan.rows[0].n: type float != int (golden): 3.0",
        "plan.rows[0].ok: type int != bool (golden): 1",
    ]
    assert json_diff({"0": 1e-13}, {"0": 0.0}) == []
    assert json_diff({"0": 1e-11}, {"0": 0.0}) == ["$['0']: 1e-11 != 0.0 (golden)"]


def test_mask_keeps_shape_and_types() -> None:
    doc = {"run_dir": "/x", "nodes": [{"estimate": [0.5, 1.5], "node": 0, "t": {"a": 1}}]}
    masked = mask(doc, ["run_dir", "nodes.*.estimate", "nodes.*.t"])
    assert masked == {
        "run_dir": "<str>",
        "nodes": [{"estimate": ["<float>", "<float>"], "node": 0, "t": {"a": "<int>"}}],
    }


def test_no_stale_golden_files() -> None:
    want = {c.name for c in CLI_CASES} | {f"runs/{c.name}" for c in RUNS}
    have = {str(p.relative_to(GOLDEN).with_suffix("")) for p in GOLDEN.rglob("*.json")}
    assert have == want
