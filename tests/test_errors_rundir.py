"""The error root and its exit codes, the run-directory module (paths and atomic writes), and
the boundaries of the CLI package (nothing outside it imports it; it knows no protocol by name)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import numpy as np
import pytest

import coordinator_free
from coordinator_free import cli, errors, rundir
from coordinator_free.cli import common

PKG = Path(coordinator_free.__file__).parent
EXAMPLES = PKG.parent / "examples"


# ---------------------------------------------------------------------------------- exit codes


def _error_classes() -> list[type[BaseException]]:
    """Every error class of the package a command can end with; imported here so that a class
    renamed or moved fails this test rather than silently leaving the map."""
    from coordinator_free.accounting.audit import AuditError
    from coordinator_free.cluster.compose import ComposeError
    from coordinator_free.cluster.lan import LanError
    from coordinator_free.cluster.local import LaunchError
    from coordinator_free.cluster.netns import LabError
    from coordinator_free.config import ConfigError
    from coordinator_free.graphs import GraphError
    from coordinator_free.report import ReportError
    from coordinator_free.roster import KeyFileError, RosterError
    from coordinator_free.viewlog import ViewLogError

    return [
        ReportError,
        AuditError,
        ComposeError,
        LanError,
        LaunchError,
        LabError,
        ConfigError,
        GraphError,
        KeyFileError,
        RosterError,
        ViewLogError,
        common.CliError,
        errors.InputError,
        errors.UsageError,
    ]


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda c: c.__name__)
def test_bad_input_errors_exit_2_with_one_line(cls, monkeypatch, capsys):
    def boom(args):
        raise cls("the message")

    monkeypatch.setitem(cli.COMMANDS, "plan", boom)
    assert cli.main(["plan"]) == 2
    err = capsys.readouterr().err
    assert err == "cfree plan: error: the message\n"


def test_errors_under_the_root_keep_their_other_bases():
    from coordinator_free.cluster.compose import ComposeError
    from coordinator_free.cluster.lan import LanError
    from coordinator_free.cluster.local import LaunchError
    from coordinator_free.cluster.netns import LabError
    from coordinator_free.roster import KeyFileError, RosterError

    for cls, base in [
        (RosterError, ValueError),
        (KeyFileError, ValueError),
        (LanError, ValueError),
        (ComposeError, ValueError),
        (LaunchError, RuntimeError),
        (LabError, RuntimeError),
        (common.CliError, ValueError),
    ]:
        assert issubclass(cls, errors.CfreeError) and issubclass(cls, base), cls
        assert cls("x").exit_code == errors.EXIT_BAD_INPUT


def test_a_failed_run_exits_1_and_the_code_comes_from_the_class(monkeypatch, capsys):
    class Custom(errors.CfreeError):
        exit_code = 7

    for exc, code in [(errors.RunError("went wrong"), 1), (Custom("odd"), 7)]:

        def boom(args, exc=exc):
            raise exc

        monkeypatch.setitem(cli.COMMANDS, "audit", boom)
        assert cli.main(["audit", "somewhere"]) == code
        assert capsys.readouterr().err.startswith("cfree audit: error: ")


def test_interrupt_exits_130_and_a_bug_keeps_its_traceback(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.COMMANDS, "plan", interrupted)
    assert cli.main(["plan"]) == errors.EXIT_INTERRUPTED
    assert "interrupted" in capsys.readouterr().err

    def bug(args):
        raise ZeroDivisionError("a bug, not an error of the input")

    monkeypatch.setitem(cli.COMMANDS, "plan", bug)
    with pytest.raises(ZeroDivisionError):
        cli.main(["plan"])


def test_real_commands_map_their_errors(tmp_path, capsys):
    # A usage error, a missing config, a directory that is not a run.
    assert cli.main(["plan", "--target-eps", "1", "--source", "0"]) == 2
    assert cli.main(["plan", str(tmp_path / "missing.toml")]) == 2
    assert cli.main(["audit", str(tmp_path)]) == 2
    assert cli.main(["simulate", "--run", str(tmp_path)]) == 2
    assert cli.main([]) == 2
    err = capsys.readouterr().err
    assert "cfree plan: error: --target-eps calibrates over all pairs" in err
    assert "cfree audit: error:" in err and "cfree simulate: error:" in err


# ------------------------------------------------------------------------------- atomic writes


def _leftovers(directory: Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name not in keep)


def test_atomic_writes_round_trip_and_leave_no_temporary(tmp_path):
    rundir.write_json(tmp_path / "a.json", {"x": [1, 2.5]})
    rundir.write_jsonl(tmp_path / "m.jsonl", [{"round": 0}, {"round": 1}])
    rundir.write_text(tmp_path / "t.txt", "hello\n")
    arr = np.arange(12, dtype=np.float64).reshape(3, 4)
    rundir.write_npy(tmp_path / "m.npy", arr)
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": [1, 2.5]}
    assert (tmp_path / "a.json").read_text() == json.dumps({"x": [1, 2.5]}, indent=1)
    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == [{"round": 0}, {"round": 1}]
    assert (tmp_path / "t.txt").read_text() == "hello\n"
    assert np.array_equal(np.load(tmp_path / "m.npy"), arr)
    assert _leftovers(tmp_path, {"a.json", "m.jsonl", "t.txt", "m.npy"}) == []
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644
    rundir.write_text(tmp_path / "secret", "k", mode=0o600)
    assert (tmp_path / "secret").stat().st_mode & 0o777 == 0o600


def test_a_failing_write_keeps_the_old_file_whole(tmp_path):
    target = tmp_path / "summary.json"
    rundir.write_json(target, {"old": True})
    before = target.read_bytes()

    def half_then_fail(f):
        f.write(b'{"new": tr')  # a torn file, if it ever reached the target's name
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        rundir.atomic_write(target, half_then_fail)
    assert target.read_bytes() == before
    assert _leftovers(tmp_path, {"summary.json"}) == []
    # An object JSON cannot encode writes nothing at all, not even a temporary.
    with pytest.raises(TypeError):
        rundir.write_json(target, {"x": object()})
    assert target.read_bytes() == before
    assert _leftovers(tmp_path, {"summary.json"}) == []
    # No old file: a failed first write leaves none.
    with pytest.raises(OSError):
        rundir.atomic_write(tmp_path / "new.json", half_then_fail)
    assert not (tmp_path / "new.json").exists()
    assert _leftovers(tmp_path, {"summary.json"}) == []


def test_an_interrupted_write_removes_its_temporary(tmp_path):
    def interrupted(f):
        f.write(b"partial")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rundir.atomic_write(tmp_path / "x", interrupted)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------ the run directory


def _layout(out: Path, n: int) -> set[Path]:
    expected = {
        rundir.config_path(out),
        rundir.roster_path(out),
        rundir.summary_path(out),
        rundir.audit_path(out),
    }
    for v in range(n):
        expected |= {
            rundir.key_path(rundir.keys_dir(out), v),
            rundir.log_path(out, v),
            rundir.stderr_path(out, v),
            rundir.result_path(out, v),
        }
    return expected


def test_rundir_paths_are_what_a_real_run_writes(tmp_path, capsys):
    out = tmp_path / "run"
    n = 4
    assert cli.main(["run", "--out", str(out), "--quiet", "--set", f"graph.nodes={n}"]) == 0
    capsys.readouterr()
    files = {p for p in out.rglob("*") if p.is_file()}
    assert files == _layout(out, n)
    assert {p.name for p in out.iterdir()} == {
        rundir.CONFIG,
        rundir.ROSTER,
        rundir.KEYS,
        rundir.LOGS,
        rundir.RESULTS,
        rundir.SUMMARY,
        rundir.AUDIT,
    }
    summary = json.loads(rundir.summary_path(out).read_text())
    assert summary["run_dir"] == str(out)
    assert json.loads(rundir.audit_path(out).read_text())["n"] == n
    # The other modules that name these files agree with it.
    from coordinator_free import roster
    from coordinator_free.families.learning.protocol import models_path

    assert roster.key_path(rundir.keys_dir(out), 2) == rundir.key_path(rundir.keys_dir(out), 2)
    assert models_path(out, 3) == rundir.models_path(out, 3)


def test_rundir_paths_of_a_curator_run(tmp_path, capsys):
    out = tmp_path / "central"
    cfg = EXAMPLES / "central-dp-breast-cancer.toml"
    assert cli.main(["run", str(cfg), "--out", str(out), "--quiet", "--no-audit"]) == 0
    capsys.readouterr()
    files = {p for p in out.rglob("*") if p.is_file()}
    assert files == {
        rundir.config_path(out),
        rundir.summary_path(out),
        rundir.metrics_path(out),
        rundir.central_models_path(out),
    }
    metrics = [json.loads(x) for x in rundir.metrics_path(out).read_text().splitlines()]
    assert np.load(rundir.central_models_path(out)).shape[0] == len(metrics)


# --------------------------------------------------------------------------------- boundaries


def _imports(path: Path) -> set[str]:
    mods: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            mods.add(node.module)
            mods.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
    return mods


@pytest.mark.parametrize("leaf", ["errors.py", "rundir.py"])
def test_leaf_modules_import_nothing_from_the_package(leaf):
    assert not [m for m in _imports(PKG / leaf) if m.startswith("coordinator_free")]


def test_nothing_outside_the_cli_imports_it():
    offenders = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        if rel.parts[0] == "cli" or rel.name == "__main__.py":
            continue
        if any(m == "coordinator_free.cli" or m.startswith("coordinator_free.cli.")
               for m in _imports(path)):  # fmt: skip
            offenders.append(str(rel))
    assert offenders == []


# What deciding by protocol looks like: a name compared, a plan type tested, the old flags.
_PROTOCOL_SWITCH = re.compile(
    r"protocol\.name\s*(==|!=|in\b|not in\b)|rep\[\"protocol\"\]\s*(==|!=|in\b)"
    r"|\bcfg\.(walk|learning)\b|\.decentralized\b|isinstance\([^)]*Plan\)|WALK_PROTOCOLS"
)


def test_cli_and_launchers_know_no_protocol_by_name():
    offenders = []
    for sub in ("cli", "cluster"):
        for path in sorted((PKG / sub).rglob("*.py")):
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if _PROTOCOL_SWITCH.search(line):
                    offenders.append(f"{path.relative_to(PKG)}:{i}: {line.strip()}")
    # collect_results in cluster/local.py chooses by family until it moves into the families.
    offenders = [o for o in offenders if not o.startswith("cluster/local.py")]
    assert offenders == []
