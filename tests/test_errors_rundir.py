"""One error root with exit codes, the run-directory contract (paths and atomic writes), and
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
from coordinator_free.errors import CfreeError, ConfigError
from tests.netrun import cfree_run_json

PKG = Path(coordinator_free.__file__).parent
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_user_facing_errors_share_one_root_and_keep_their_old_bases():
    from coordinator_free.accounting.audit import AuditError
    from coordinator_free.cluster.local import LaunchError
    from coordinator_free.config import ConfigError as ConfigErrorFromConfig
    from coordinator_free.graphs import GraphError
    from coordinator_free.roster import KeyFileError, RosterError
    from coordinator_free.viewlog import ViewLogError

    assert ConfigErrorFromConfig is ConfigError
    for cls, base in [
        (ConfigError, ValueError),
        (RosterError, ValueError),
        (KeyFileError, ValueError),
        (ViewLogError, ValueError),
        (GraphError, ValueError),
        (AuditError, RuntimeError),
        (LaunchError, RuntimeError),
    ]:
        assert issubclass(cls, CfreeError) and issubclass(cls, base), cls
        assert cls.exit_code == 2


def test_main_turns_each_error_into_its_exit_code_and_one_line(capsys, tmp_path):
    assert cli.main(["plan", "--set", "graph.nodez=3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cfree plan: error: ") and "graph.nodez" in err
    assert "Traceback" not in err
    assert cli.main(["audit", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_atomic_write_replaces_whole_files_and_leaves_nothing_behind(tmp_path):
    path = tmp_path / "summary.json"
    rundir.write_json(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}

    def fails(f):
        f.write(b'{"half":')
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        rundir.atomic_write(path, fails)
    assert json.loads(path.read_text()) == {"a": 1}  # the old content, never a torn file
    with pytest.raises(TypeError):
        rundir.write_json(path, {"x": object()})  # serialised first: nothing written
    assert json.loads(path.read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]

    arr = np.arange(6.0).reshape(2, 3)
    rundir.write_npy(tmp_path / "m.npy", arr)
    assert np.array_equal(np.load(tmp_path / "m.npy"), arr)
    rundir.write_text(tmp_path / "k", "secret", mode=0o600)
    assert (tmp_path / "k").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k", "m.npy", "summary.json"]


def test_the_paths_are_where_a_real_run_writes(tmp_path):
    out = tmp_path / "run"
    cfree_run_json(
        EXAMPLES / "muffliato-ring.toml",
        ["graph.nodes=4", "protocol.steps=3", "protocol.accelerated=false"],
        out,
    )
    for path in (
        rundir.config_path(out),
        rundir.roster_path(out),
        rundir.summary_path(out),
        rundir.audit_path(out),
    ):
        assert path.is_file(), path
    for v in range(4):
        assert rundir.log_path(out, v).is_file()
        assert rundir.stderr_path(out, v).is_file()
        assert json.loads(rundir.result_path(out, v).read_text())["node"] == v
    left = [p for p in out.rglob("*") if p.name.startswith(".") or p.suffix == ".tmp"]
    assert left == []


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


def test_indented_json_is_the_same_value_with_deep_containers_on_one_line(tmp_path):
    from coordinator_free.rundir import dumps_json

    shallow = {"a": [1, 2.5, "é\n"], "b": {}, "c": [], 3: None, True: 1.0, None: [{"x": 1}]}
    # Down to the one-line depth the layout is json.dumps(indent=1)'s, byte for byte.
    assert dumps_json(shallow) == json.dumps(shallow, indent=1)
    deep = {"observers": [{"observer": 0, "losses": [{"source": 1, "eps": 0.5, "ok": [1, 2]}]}]}
    text = dumps_json(deep)
    assert json.loads(text) == deep
    assert '    {"source": 1, "eps": 0.5, "ok": [1, 2]}' in text.splitlines()
    for value in (float("inf"), [[[[[1, (2, 3)]]]]], "x", 7, [], {}):
        assert json.loads(dumps_json(value)) == json.loads(json.dumps(value))
    for bad, where in (({"a": np.float32(1)}, "float32"), ({(1, 2): 3}, "tuple")):
        with pytest.raises(TypeError, match=where):
            dumps_json(bad)
    with pytest.raises(TypeError):  # a value JSON cannot hold writes nothing
        rundir.write_json(tmp_path / "bad.json", [[[[{"x": object()}]]]])
    assert not (tmp_path / "bad.json").exists()
