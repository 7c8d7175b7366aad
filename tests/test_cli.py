"""The cfree command line, in process (the end-to-end `cfree run` test is in test_integration)."""

import json
import stat
import subprocess
import sys

import pytest

from coordinator_free import cli, roster
from coordinator_free.config import DEFAULT_CONFIG

#: The 8-node ring (cfree run, plan and simulate default to the 64-node hypercube).
RING = str(DEFAULT_CONFIG)


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as ei:
        cli.main(["--help"])
    assert ei.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("run", "peer", "keygen", "plan", "audit", "simulate"):
        assert cmd in out


def test_plan_json_shape_for_one_source(capsys):
    code, out, _ = run_cli(capsys, "plan", RING, "--source", "0", "--method", "exact", "--json")
    assert code == 0
    rep = json.loads(out)
    assert rep["alpha"] == 2.0 and rep["method"] == "exact" and rep["source"] == 0
    assert [x["observer"] for x in rep["losses"]] == list(range(1, 8))
    for x in rep["losses"]:
        assert set(x) >= {"observer", "distance", "rdp", "eps"}
        assert 0 <= x["rdp"] <= rep["ldp"]["rdp"] + 1e-12
    assert {x["distance"] for x in rep["losses"]} == {1, 2, 3, 4}


def test_plan_paper_method_and_summary(capsys):
    code, out, _ = run_cli(
        capsys,
        "plan",
        "--method",
        "paper",
        "--json",
        "--set",
        "graph.kind=hypercube",
        "--set",
        "graph.dim=4",
    )
    assert code == 0
    rep = json.loads(out)
    assert rep["source"] is None and rep["n"] == 16
    dists = [r["distance"] for r in rep["by_distance"]]
    assert dists == [1, 2, 3, 4]
    # Hypercube: the paper's loss depends on the distance only (no spread within a distance).
    for r in rep["by_distance"]:
        assert r["factor_mean"] == pytest.approx(r["factor_max"], rel=1e-9)
    code, out, _ = run_cli(capsys, "plan")
    assert code == 0 and "worst pair" in out and "LDP baseline" in out


def test_plan_rejects_bad_source(capsys):
    code, _, err = run_cli(capsys, "plan", "--source", "99")
    assert code == 2 and "--source 99 is not a node id (0..63)" in err


def test_config_errors_exit_2_with_the_key(capsys):
    code, _, err = run_cli(capsys, "simulate", "--set", "privacy.sigma=-1")
    assert code == 2 and "privacy.sigma must be in (1e-150, 1e150)" in err
    code, _, err = run_cli(capsys, "plan", "/nonexistent/x.toml")
    assert code == 2 and "/nonexistent/x.toml does not exist" in err


def test_simulate_json(capsys):
    code, out, _ = run_cli(capsys, "simulate", RING, "--json", "--set", "protocol.steps=30")
    assert code == 0
    rep = json.loads(out)
    assert rep["n"] == 8 and len(rep["finals"]) == 8
    # 30 steps on a ring of 8: the noisy values have mixed, the MSE dropped a lot.
    assert rep["mse_by_step"][-1] < 0.5 * rep["mse_by_step"][0]


def test_keygen_writes_private_keys_and_roster(capsys, tmp_path):
    out = tmp_path / "cluster"
    code, text, _ = run_cli(
        capsys,
        "keygen",
        "--hosts",
        "127.0.0.1:7001,127.0.0.2:7002,[::1]:7003",
        "--out",
        str(out),
        "--json",
    )
    assert code == 0
    info = json.loads(text)
    ros = roster.load_roster(out / "roster.json")
    assert info["nodes"] == 3 and ros.addresses()[2] == ("::1", 7003)
    for i in range(3):
        p = roster.key_path(out / "keys", i)
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
        roster.check_key_matches(ros, i, roster.load_private_key(p))
    # Never overwrite keys.
    code, _, err = run_cli(capsys, "keygen", "--nodes", "3", "--out", str(out))
    assert code == 2 and "already exists" in err


def test_keygen_rejects_bad_hosts(capsys, tmp_path):
    code, _, err = run_cli(capsys, "keygen", "--hosts", "nohostport", "--out", str(tmp_path / "k"))
    assert code == 2 and "is not host:port" in err


def test_audit_of_a_non_run_directory(capsys, tmp_path):
    code, _, err = run_cli(capsys, "audit", str(tmp_path))
    assert code == 2 and "not a run directory" in err


def test_a_closed_stdout_ends_quietly():
    """`cfree plan --json | head -c 100`: the reader goes away mid-output (about 140 kB, more
    than a pipe holds); the command stops with the SIGPIPE status and no traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "coordinator_free", "plan", "--json", "--source", "0"]
        + ["--set", "graph.kind=hypercube", "--set", "graph.dim=10"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout.read(100).startswith(b"{")
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == cli.EXIT_BROKEN_PIPE
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_the_command_line_loads_without_the_launcher_or_scipy():
    """`cfree --help` and the parser of every command import neither the launcher (and the
    families and accountants it brings) nor scipy: they load when a command needs them."""
    code = (
        "import sys; from coordinator_free import cli; cli.build_parser(); "
        "heavy = [m for m in ('scipy', 'coordinator_free.cluster.local', "
        "'coordinator_free.accounting.loss') if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout
