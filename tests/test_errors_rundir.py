"""One error root with exit codes, and the run-directory contract (paths and atomic writes)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from coordinator_free import cli, rundir
from coordinator_free.errors import CfreeError, ConfigError
from tests.netrun import cfree_run_json

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
