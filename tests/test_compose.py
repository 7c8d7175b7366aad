"""docker-compose clusters for real: the peer image built without a registry, 8 peer containers
on a bridge network, the auditor's output against `cfree plan`, and a peer container killed
mid-run.

These run with ``-m docker`` (CI does); the compose-file tests at the top are pure and run in
the quick default. The image is built from Debian's packages (deploy/build-base-image.sh) and
wheels fetched beforehand (deploy/fetch-wheels.sh), with ``docker build --network none``: the
build itself cannot reach any network.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator_free import config
from coordinator_free.cluster import compose
from coordinator_free.families import make_plan
from coordinator_free.viewlog import read_viewlog
from tests import dockerimg
from tests.netrun import assert_audit_equals_plan, assert_killed_node_audited

ROOT = dockerimg.ROOT
BASE_IMAGE = dockerimg.BASE_IMAGE


def cfree(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "coordinator_free", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


# ------------------------------------------------------------------- the compose file (pure)


def test_top_level_compose_file_is_what_cfree_compose_writes(tmp_path):
    """The committed docker-compose.yml and peer/cluster.toml are `cfree compose`'s output for
    the built-in default, so they never drift from the generator."""
    r = cfree(
        "compose",
        "--dir",
        str(tmp_path),
        "--config-file",
        "peer/cluster.toml",
        "--run-dir",
        "./runs/compose",
    )
    assert r.returncode == 0, r.stderr
    made = (tmp_path / "docker-compose.yml").read_text()
    # Outside the checkout the build context is absolute; in it, the file says ".".
    made = made.replace(json.dumps(str(ROOT)), json.dumps("."))
    assert made == (ROOT / "docker-compose.yml").read_text()
    assert (tmp_path / "peer" / "cluster.toml").read_text() == (
        ROOT / "peer" / "cluster.toml"
    ).read_text()
    assert config.load(ROOT / "peer" / "cluster.toml").to_toml() == config.load(None).to_toml()


def test_compose_file_shape_and_key_isolation(tmp_path):
    cfg = config.load(None, ["graph.nodes=5", "graph.kind=complete"])
    info = compose.write_compose(cfg, tmp_path / "c")
    text = Path(info["compose_file"]).read_text()
    assert info["nodes"] == 5
    services = text.split("\nservices:\n", 1)[1].split("\nnetworks:\n", 1)[0]
    blocks: dict[str, str] = {}
    for line in services.splitlines():
        if re.fullmatch(r"  [a-z0-9-]+:", line):
            name = line.strip(" :")
            blocks[name] = ""
        else:
            blocks[name] += line + "\n"
    assert set(blocks) == {"keygen", "auditor", *(f"peer-{i}" for i in range(5))}
    for i in range(5):
        body = blocks[f"peer-{i}"]
        # A peer mounts exactly one key volume: its own, read-only.
        assert [ln.strip() for ln in body.splitlines() if "key-" in ln] == [
            f'- "key-{i}:/cfree/key:ro"'
        ]
        assert f'CFREE_NODE_ID: "{i}"' in body and "service_completed_successfully" in body
    assert all(f'"key-{i}:/cfree/keys/{i}"' in blocks["keygen"] for i in range(5))
    assert "key-" not in blocks["auditor"] and blocks["auditor"].count("condition:") == 5
    assert "\nversion:" not in text  # both compose v1 (1.29) and v2 read a version-less file
    # Deterministic: the same config gives the same bytes.
    again = compose.write_compose(cfg, tmp_path / "d")
    assert Path(again["compose_file"]).read_text() == text


def test_compose_copies_files_the_config_names(tmp_path):
    edges = tmp_path / "g.edgelist"
    edges.write_text("0 1\n1 2\n2 3\n3 0\n0 2\n")
    cfg = config.load(None, ["graph.kind=edgelist", f"graph.path={edges}"])
    info = compose.write_compose(cfg, tmp_path / "c")
    assert info["nodes"] == 4
    copied = tmp_path / "c" / "files" / "graph-g.edgelist"
    assert copied.read_text() == edges.read_text()
    # The containers' config points at the copy, relative to itself (resolved under /cfree).
    inner = config.load(tmp_path / "c" / "config.toml")
    assert Path(inner.graph.path) == copied.resolve()
    assert '"./files:/cfree/files:ro"' in Path(info["compose_file"]).read_text()


def test_keygen_makes_the_run_directory_self_contained(tmp_path):
    """A config naming an edge list: the run directory gets a copy and a config pointing at it
    relative to itself, so the host can audit the run where the containers' paths do not exist."""
    edges = tmp_path / "g.edgelist"
    edges.write_text("0 1\n1 2\n2 3\n3 0\n")
    info = compose.write_compose(
        config.load(None, ["graph.kind=edgelist", f"graph.path={edges}"]), tmp_path / "c"
    )
    run = tmp_path / "run"
    compose.keygen_role(
        4, 7000, config_path=Path(info["config"]), run_dir=run, keys_root=tmp_path / "keys"
    )
    assert "files/graph-g.edgelist" in (run / "config.toml").read_text()
    assert (run / "files" / "graph-g.edgelist").read_text() == edges.read_text()
    edges.unlink()  # the host's original is gone: the run directory still reads on its own
    moved = tmp_path / "elsewhere"
    run.rename(moved)
    assert make_plan(config.load(moved / "config.toml")).n == 4


def test_compose_run_dir_is_always_a_host_path(tmp_path):
    text = compose.render(3, describe="t", run_dir="run")  # a bare name would be a volume
    assert '"${CFREE_RUN_DIR:-./run}:/cfree/run"' in text
    assert '"${CFREE_RUN_DIR:-/abs/run}:/cfree/run"' in compose.render(
        3, describe="t", run_dir="/abs/run"
    )
    # The image is built by one service only; the others use it by name.
    assert text.count("build:") == 1 and text.count("image:") == 3 + 2


def test_compose_refuses_a_trusted_curator_config(tmp_path):
    cfg = config.load(ROOT / "examples" / "central-dp-breast-cancer.toml")
    with pytest.raises(compose.ComposeError, match="trusted-curator"):
        compose.write_compose(cfg, tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_compose_refuses_to_overwrite_and_names_bad_input(tmp_path, capsys):
    from coordinator_free.cli import main

    def run(*args: str) -> tuple[int, str]:  # the command in this process: its code, stderr
        try:
            code = main(["compose", *args])
        except SystemExit as stop:  # argparse refusing an argument
            code = stop.code
        return code, capsys.readouterr().err

    assert run("--dir", str(tmp_path))[0] == 0
    code, err = run("--dir", str(tmp_path))
    assert code == 2 and "already exists" in err and "--force" in err
    assert run("--dir", str(tmp_path), "--force")[0] == 0
    code, err = run("--dir", str(tmp_path / "x"), "--port", "70000")
    assert code == 2 and "--port" in err
    code, err = run("--dir", str(tmp_path / "y"), "--set", "graph.nodes=1")
    assert code == 2 and "graph.nodes" in err


def test_keygen_role_writes_one_key_per_volume_and_refuses_an_old_run(tmp_path):
    cfg_path = tmp_path / "config.toml"
    cfg_path.write_text(config.load(None, ["graph.nodes=4"]).to_toml())
    run, keys = tmp_path / "run", tmp_path / "keys"
    ros = compose.keygen_role(4, 7000, config_path=cfg_path, run_dir=run, keys_root=keys)
    assert [e.address for e in ros] == [(f"peer-{i}", 7000) for i in range(4)]
    for i in range(4):
        (only,) = list((keys / str(i)).iterdir())  # node i's volume holds node i's key only
        assert only.name == f"node-{i}.key" and only.stat().st_mode & 0o077 == 0
    # Keys were staged outside the run directory (a bind mount the host and all peers see).
    assert sorted(p.name for p in keys.iterdir()) == ["0", "1", "2", "3"]
    assert not list(run.rglob("*.key")) and (run / "logs").is_dir()
    assert config.load(run / "config.toml").to_toml() == config.load(cfg_path).to_toml()
    raw = (run / "roster.json").read_bytes() + (run / "config.toml").read_bytes()
    for i in range(4):
        assert (keys / str(i) / f"node-{i}.key").read_bytes() not in raw
    with pytest.raises(compose.ComposeError, match="already holds a run"):
        compose.keygen_role(4, 7000, config_path=cfg_path, run_dir=run, keys_root=keys)
    with pytest.raises(compose.ComposeError, match="written for 5"):
        compose.keygen_role(5, 7000, config_path=cfg_path, run_dir=tmp_path / "r2", keys_root=keys)
    # A fresh run over volumes kept from the old one replaces their keys.
    ros2 = compose.keygen_role(
        4, 7000, config_path=cfg_path, run_dir=tmp_path / "r3", keys_root=keys
    )
    assert ros2.run_id != ros.run_id and len(list((keys / "0").iterdir())) == 1


def test_a_refusing_keygen_tells_every_peer_why_and_no_peer_starts(tmp_path):
    """Compose v1 shows no output once a dependency fails, so keygen leaves its reason in every
    key volume and succeeds; each peer's entrypoint prints it and ends without starting."""
    cfg_path = tmp_path / "config.toml"
    cfg_path.write_text(config.load(None, ["graph.nodes=3"]).to_toml())
    run, keys = tmp_path / "run", tmp_path / "keys"
    assert compose.keygen_main(3, 7000, config_path=cfg_path, run_dir=run, keys_root=keys) == 0
    roster_before = (run / "roster.json").read_bytes()
    key_before = (keys / "1" / "node-1.key").read_bytes()
    assert compose.keygen_main(3, 7000, config_path=cfg_path, run_dir=run, keys_root=keys) == 0
    assert (run / "roster.json").read_bytes() == roster_before  # the earlier run is untouched
    assert (keys / "1" / "node-1.key").read_bytes() == key_before
    for i in range(3):
        reason = (keys / str(i) / compose.REFUSED).read_text()
        assert "already holds a run" in reason and str(run / "roster.json") in reason
        env = dict(os.environ, CFREE_NODE_ID=str(i), CFREE_KEY_DIR=str(keys / str(i)))
        r = subprocess.run(
            ["sh", str(ROOT / "peer" / "entrypoint.sh"), "peer"],
            capture_output=True, text=True, env=env, timeout=30,
        )  # fmt: skip
        assert r.returncode == 0
        assert r.stderr.startswith(f"cfree peer {i}: not started: keygen made no keys: ")
        assert "already holds a run" in r.stderr
    # Moved away, a new run clears the refusal and makes fresh keys.
    run.rename(tmp_path / "old-run")
    assert compose.keygen_main(3, 7000, config_path=cfg_path, run_dir=run, keys_root=keys) == 0
    assert not list(keys.glob(f"*/{compose.REFUSED}"))
    assert (keys / "1" / "node-1.key").read_bytes() != key_before
    # A count that does not match the file is refused the same way.
    assert compose.keygen_main(4, 7000, config_path=cfg_path, run_dir=tmp_path / "r4",
                               keys_root=keys) == 0  # fmt: skip
    assert "written for 4" in (keys / "3" / compose.REFUSED).read_text()
    # With no way to reach the peers, keygen itself fails.
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the key volumes should be")
    assert compose.keygen_main(3, 7000, config_path=cfg_path, run_dir=run, keys_root=blocked) == 2


# ----------------------------------------------------------------- real containers (-m docker)


def _compose_commands() -> dict[str, list[str]]:
    found = {}
    if shutil.which("docker-compose"):
        found["v1"] = ["docker-compose"]
    if shutil.which("docker"):
        r = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
        if r.returncode == 0:
            found["v2"] = ["docker", "compose"]
    return found


@pytest.fixture(scope="session")
def peer_image() -> str:
    return dockerimg.peer_image()


class Cluster:
    """One compose project: ``up``, ``run``, ``kill`` and an always-run ``down -v``."""

    def __init__(self, cmd: list[str], compose_file: Path, run_dir: Path, image: str):
        self.cmd = cmd
        self.file = compose_file
        self.project = f"cfreetest{os.getpid()}{compose_file.parent.name}".lower().replace("_", "")
        # The offline build settings (docs/deploy.md), for the tests that run `up --build`.
        self.env = dict(
            os.environ,
            CFREE_IMAGE=image,
            CFREE_RUN_DIR=str(run_dir),
            CFREE_BASE_IMAGE=BASE_IMAGE,
            CFREE_PIP_OPTIONS="--no-index",
        )
        self.run_dir = run_dir

    def argv(self, *args: str) -> list[str]:
        return [*self.cmd, "-f", str(self.file), "-p", self.project, *args]

    def call(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.argv(*args),
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            self.argv(*args),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
            stdin=subprocess.DEVNULL,
        )

    def container(self, service: str) -> str:
        r = self.call("ps", "-a", "-q", service)
        ids = r.stdout.split()
        assert r.returncode == 0 and len(ids) == 1, (service, r.stdout, r.stderr)
        return ids[0]

    def inspect(self, service: str) -> dict:
        r = subprocess.run(
            ["docker", "inspect", self.container(service)], capture_output=True, text=True
        )
        return json.loads(r.stdout)[0]

    def leftovers(self) -> list[str]:
        label = f"label=com.docker.compose.project={self.project}"
        found = []
        for kind in (["ps", "-a", "-q"], ["volume", "ls", "-q"], ["network", "ls", "-q"]):
            r = subprocess.run(["docker", *kind, "--filter", label], capture_output=True, text=True)
            found += r.stdout.split()
        return found

    def down(self) -> None:
        r = self.call("down", "-v", "--remove-orphans", timeout=180)
        assert r.returncode == 0, r.stderr
        assert self.leftovers() == []


@pytest.fixture
def clusters():
    made: list[Cluster] = []
    yield made
    for c in made:
        c.down()


def _cluster(clusters, how: str, compose_file: Path, run_dir: Path, image: str) -> Cluster:
    cmds = _compose_commands()
    dockerimg.need(f"compose {how}", how in cmds)
    c = Cluster(cmds[how], compose_file, run_dir, image)
    clusters.append(c)
    return c


def _check_isolation_and_network(c: Cluster, n: int) -> None:
    """Each peer container mounted only its own key; each talked from its own bridge address."""
    ips = {}
    for i in range(n):
        res = json.loads((c.run_dir / "results" / f"node-{i}.json").read_text())
        assert res["channels"], i
        for j, ends in res["channels"].items():
            local_ip, local_port = ends["local"].rsplit(":", 1)
            ips.setdefault(i, local_ip)
            assert local_ip == ips[i], (i, ends)  # one address per container
            if int(j) < i:  # the other end saw this channel from the same address pair
                theirs = json.loads((c.run_dir / "results" / f"node-{j}.json").read_text())
                assert theirs["channels"][str(i)] == {
                    "local": ends["remote"],
                    "remote": ends["local"],
                }
    assert len(set(ips.values())) == n
    assert not any(ip.startswith("127.") for ip in ips.values())
    for i in range(n):
        info = c.inspect(f"peer-{i}")
        assert info["State"]["ExitCode"] == 0, (i, info["State"])
        key_mounts = [m for m in info["Mounts"] if m["Destination"].startswith("/cfree/key")]
        assert [(m["Name"].rsplit("_", 1)[-1], m["Destination"], m["RW"]) for m in key_mounts] == [
            (f"key-{i}", "/cfree/key", False)
        ]


@pytest.mark.docker
@pytest.mark.parametrize("how", ["v1", "v2"])
def test_eight_peer_cluster_audit_equals_plan(how, peer_image, clusters, tmp_path):
    """v1 runs the top-level docker-compose.yml unchanged; v2 a file `cfree compose` wrote for a
    different graph. Each: `up --build` (the compose tool builds the image itself, from the base
    made of Debian's packages), 8 containers to completion, auditor's audit.json == cfree plan."""
    run_dir = tmp_path / "run"
    if how == "v1":
        compose_file = ROOT / "docker-compose.yml"
        cfg = config.load(ROOT / "peer" / "cluster.toml")
    else:
        d = tmp_path / "c"
        r = cfree("compose", "--dir", str(d), "--set", "graph.kind=complete")
        assert r.returncode == 0, r.stderr
        compose_file = d / "docker-compose.yml"
        cfg = config.load(d / "config.toml")
    image = f"{peer_image}-{how}"  # built by this compose run, not the fixture's
    subprocess.run(["docker", "rmi", "-f", image], capture_output=True)
    c = _cluster(clusters, how, compose_file, run_dir, image)
    r = c.call("up", "--build", timeout=1200)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert c.inspect("auditor")["State"]["ExitCode"] == 0
    assert c.inspect("peer-0")["Config"]["Image"] == image  # the image this `up` built
    _check_isolation_and_network(c, 8)
    ros = json.loads((run_dir / "roster.json").read_text())
    assert [(e["host"], e["port"]) for e in ros["nodes"]] == [(f"peer-{i}", 7000) for i in range(8)]
    rep = json.loads((run_dir / "audit.json").read_text())
    assert rep["fault_free"] is True and rep["integrity"] == []
    assert_audit_equals_plan(rep, make_plan(cfg), 1e-9)
    for i in range(8):
        vl = read_viewlog(run_dir / "logs" / f"node-{i}.vlog")
        assert vl.intact and vl.records[-1]["k"] == "finished"
    # No private key reached the bind mount the host sees.
    assert not [p for p in run_dir.rglob("*.key")]
    if how == "v1":
        # A second `up` on the same run directory: v1 shows nothing once a dependency fails, so
        # keygen refuses through the peers, which say why; the earlier run stays as it was.
        before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
        again = c.call("up", "--no-build", timeout=600)
        said = again.stdout + again.stderr
        assert again.returncode == 0, said[-4000:]
        for i in range(8):
            assert f"cfree peer {i}: not started: keygen made no keys" in said, said[-4000:]
        assert "already holds a run" in said and "not redone" in said, said[-4000:]
        assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


@pytest.mark.docker
def test_killed_peer_container_is_recorded_by_survivors_and_the_audit(
    peer_image, clusters, tmp_path
):
    d = tmp_path / "k"
    sets = dockerimg.KILLED_RUN_SETS
    r = cfree("compose", "--dir", str(d), *[a for s in sets for a in ("--set", s)])
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "run"
    c = _cluster(clusters, "v1", d / "docker-compose.yml", run_dir, peer_image)
    victim = 3
    up = c.popen("up", "--no-build")
    try:
        # Kill once the victim has logged a value sent at step 2 or later.
        vlog = run_dir / "logs" / f"node-{victim}.vlog"
        dockerimg.wait_for_send(vlog, 2, 240, alive=lambda: up.poll() is None or up.stdout.read())
        k = c.call("kill", "-s", "SIGKILL", f"peer-{victim}")
        assert k.returncode == 0, k.stderr
        out, _ = up.communicate(timeout=600)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert c.inspect(f"peer-{victim}")["State"]["ExitCode"] == 137
    survivors = [i for i in range(8) if i != victim]
    for i in survivors:  # `up` may return as soon as the auditor's dependency failed
        w = subprocess.run(
            ["docker", "wait", c.container(f"peer-{i}")],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert w.stdout.strip() == "0", (i, w)
    # The auditor did not start by itself (a dependency failed): run it over what was logged.
    a = c.call("run", "--rm", "--no-deps", "auditor")
    assert a.returncode == 0, a.stdout[-3000:] + a.stderr[-3000:]
    assert f"node {victim}: unfinished" in a.stdout and "fault-free=False" in a.stdout
    for w in (victim - 1, victim + 1):
        vl = read_viewlog(run_dir / "logs" / f"node-{w}.vlog")
        assert vl.intact and vl.records[-1]["k"] == "finished"
        misses = [x for x in vl.records if x["k"] == "miss" and x["peer"] == victim]
        assert misses, f"node {w} did not record the dropout"
        assert {x["reason"] for x in misses} <= {"peer-down", "deadline"}
        # Missed to the end of the run: the survivor's last step went on without the victim.
        assert max(x["step"] for x in misses) == max(
            x["step"] for x in vl.records if x["k"] == "send"
        )
    assert_killed_node_audited(json.loads((run_dir / "audit.json").read_text()), victim)


def test_the_auditor_role_leaves_a_current_audit_alone_and_redoes_a_stale_one(tmp_path, capsys):
    from memrun import write_run_dir

    from coordinator_free.inmemory import run_config

    cfg = config.load(None, ["graph.nodes=4", "protocol.steps=3"])
    run = write_run_dir(cfg, run_config(cfg, None, seed=1), tmp_path / "run")
    rep = compose.audit_role(run)
    assert rep["fault_free"] is True
    first = (run / "audit.json").read_bytes()
    again = compose.audit_role(run)  # e.g. after keygen refused: the peers did not run
    assert "not redone" in capsys.readouterr().out
    assert (run / "audit.json").read_bytes() == first and again["observers"] == rep["observers"]
    log = run / "logs" / "node-1.vlog"
    log.write_bytes(log.read_bytes()[:-40])  # the logs changed: the audit is redone
    assert compose.audit_role(run)["fault_free"] is False
    assert (run / "audit.json").read_bytes() != first
