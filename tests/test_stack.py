"""`cfree stack`: the Swarm stack file (pure, quick) and, with ``-m docker``, real stacks on a
single-node Swarm: 8 peer jobs to completion with the audit equal to the plan, and a peer
container killed mid-run. The tests remove every stack, secret, config and network they made,
and leave the Swarm only when they initialised it."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from coordinator_free import config
from coordinator_free.cli import main
from coordinator_free.cluster import stack
from coordinator_free.cluster.compose import ComposeError
from coordinator_free.families import make_plan
from coordinator_free.viewlog import read_viewlog
from tests import dockerimg
from tests.netrun import assert_audit_equals_plan, assert_killed_node_audited

EX = dockerimg.ROOT / "examples"
#: A made-up image ID for the stack files that need no docker.
FAKE_ID = "sha256:" + "ab12" * 16

# ------------------------------------------------------------------------ the stack file (pure)


def _write(tmp_path: Path, *args: str) -> tuple[Path, dict, dict]:
    d = tmp_path / "st"
    argv = ["stack", str(EX / "muffliato-ring.toml"), "--dir", str(d), *args]
    if "--image" not in args:
        argv += ["--image", FAKE_ID]
    assert main(argv) == 0
    doc = yaml.safe_load((d / stack.STACK_FILE).read_text())
    return d, doc, json.loads((d / "roster.json").read_text())


def test_each_peer_is_a_job_never_restarted_with_only_its_own_key(tmp_path):
    d, doc, ros = _write(tmp_path)
    services = doc["services"]
    assert set(services) == {"auditor", *(f"peer-{i}" for i in range(8))}
    for i in range(8):
        s = services[f"peer-{i}"]
        assert s["deploy"]["mode"] == "replicated-job"
        # A job's default restart condition is `any`: a peer started again over its own log.
        assert s["deploy"]["restart_policy"] == {"condition": "none"}
        assert s["deploy"]["endpoint_mode"] == "dnsrr"
        assert "placement" not in s["deploy"]
        assert s["secrets"] == [
            {"source": f"key-{i}", "target": f"/cfree/key/node-{i}.key", "mode": 0o400}
        ]
        assert s["environment"]["CFREE_NODE_ID"] == str(i)
        assert s["networks"] == ["cfree"]
    aud = services["auditor"]
    # The auditor mounts no node key, only the log collector's own key.
    assert aud["secrets"] == [
        {"source": "collector-key", "target": "/cfree/key/collector.key", "mode": 0o400}
    ]
    assert aud["deploy"]["endpoint_mode"] == "dnsrr"  # no routing mesh needed (no IP_VS)
    assert aud["hostname"] == "auditor" and "--collect-key" in aud["command"]
    coll = json.loads((d / "collector.json").read_text())
    assert coll["host"] == "auditor" and coll["port"] == 7001 and len(coll["public_key"]) == 64
    for i in range(8):
        s = services[f"peer-{i}"]
        assert s["environment"]["CFREE_COLLECTOR"] == "/cfree/public/collector.json"
        assert {"source": "collector", "target": "/cfree/public/collector.json"} in s["configs"]
    assert aud["deploy"]["placement"]["constraints"] == ["node.role == manager"]
    assert aud["command"][:3] == ["audit", "--wait-for", "8"]
    assert doc["networks"]["cfree"]["driver"] == "overlay"
    # Secrets and configs are files of DIR, named by the run id (a new run never collides).
    tag = ros["run_id"][:12]
    for i in range(8):
        sec = doc["secrets"][f"key-{i}"]
        assert sec["name"] == f"cfree-{tag}-key-{i}"
        assert (d / sec["file"]).read_bytes() == (d / "keys" / f"node-{i}.key").read_bytes()
    assert [(e["host"], e["port"]) for e in ros["nodes"]] == [(f"peer-{i}", 7000) for i in range(8)]
    # The run directory holds the config and roster the auditor reads, and no key.
    run = d / "run"
    assert (run / "roster.json").read_text() == (d / "roster.json").read_text()
    assert config.load(run / "config.toml").to_toml() == config.load(d / "config.toml").to_toml()
    assert not list(run.rglob("*.key"))
    assert f"${{CFREE_RUN_DIR:-{run.resolve()}}}" in (d / stack.STACK_FILE).read_text()


def test_without_log_shipping_there_is_no_collector(tmp_path):
    d, doc, _ = _write(tmp_path, "--no-ship-logs")
    text = (d / stack.STACK_FILE).read_text()
    assert "collector" not in text and "secrets" not in doc["services"]["auditor"]
    assert not (d / "keys" / "collector.key").exists()


def test_groups_pin_peers_to_labelled_hosts_and_the_readme_says_how(tmp_path):
    d, doc, _ = _write(tmp_path, "--groups", "3")
    for i in range(8):
        cons = doc["services"][f"peer-{i}"]["deploy"]["placement"]["constraints"]
        assert cons == [f"node.labels.cfree.group == {i % 3}"]
    readme = (d / "README.md").read_text()
    assert "docker node update --label-add cfree.group=2" in readme
    assert "docker stack deploy --resolve-image never -c docker-stack.yml" in readme


def test_the_stack_file_is_deterministic_for_a_run(tmp_path):
    kw = dict(run_id="0123456789abcdef", describe="t", run_dir="/r", groups=2, image=FAKE_ID)
    assert stack.render(4, **kw) == stack.render(4, **kw)
    assert "cfree-0123456789ab-key-3" in stack.render(4, **kw)


def test_stack_refuses_an_existing_dir_a_non_empty_run_dir_and_bad_groups(tmp_path, capsys):
    d, _, _ = _write(tmp_path)
    before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    assert (
        main(["stack", str(EX / "muffliato-ring.toml"), "--dir", str(d), "--image", FAKE_ID]) == 2
    )
    assert "already holds a stack or keys" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in d.rglob("*") if p.is_file()} == before
    run = tmp_path / "busy"
    run.mkdir()
    (run / "audit.json").write_text("{}")
    argv = ["stack", str(EX / "muffliato-ring.toml"), "--dir", str(tmp_path / "x")]
    assert main([*argv, "--run-dir", str(run), "--image", FAKE_ID]) == 2
    assert "is not empty" in capsys.readouterr().err
    with pytest.raises(ComposeError, match="--groups"):
        stack.render(3, run_id="r", describe="t", run_dir="/r", groups=-1, image=FAKE_ID)


def _fake_docker(tmp_path: Path, images: dict[str, str]) -> Path:
    """A `docker` on PATH that answers `docker image inspect --format {{.Id}} NAME` from
    ``images`` (and fails, as docker does, for any other name)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    cases = "".join(f'  "{k}") echo {v}; exit 0 ;;\n' for k, v in images.items())
    (bindir / "docker").write_text(
        "#!/bin/sh\n"
        '[ "$1 $2" = "image inspect" ] || exit 3\n'
        'case "$5" in\n'
        f"{cases}"
        '  *) echo "Error: No such image: $5" >&2; exit 1 ;;\n'
        "esac\n"
    )
    (bindir / "docker").chmod(0o755)
    return bindir


def test_the_stack_names_the_image_by_id_never_by_a_tag(tmp_path, monkeypatch, capsys):
    """A tag makes every node's agent ask a registry first (10 s DNS timeouts per task on an
    air-gapped host); the stack names the image by the ID resolved when it is written."""
    monkeypatch.setenv("PATH", str(_fake_docker(tmp_path, {"my/peer:1.0": FAKE_ID})))
    d, doc, _ = _write(tmp_path, "--image", "my/peer:1.0")
    text = (d / stack.STACK_FILE).read_text()
    images = {s["image"] for s in doc["services"].values()}
    assert images == {FAKE_ID}
    assert "my/peer" not in text and "coordinator-free-peer" not in text
    out = capsys.readouterr().out
    assert f"image my/peer:1.0 = {FAKE_ID}" in out
    assert FAKE_ID in (d / "README.md").read_text()
    # An ID or a digest goes in as given, with no docker at all.
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    digest = "registry.example/peer@sha256:" + "cd34" * 16
    d2, doc2, _ = _write(tmp_path / "b", "--image", digest)
    assert {s["image"] for s in doc2["services"].values()} == {digest}
    # The default name resolves the same way (here: no docker to ask, so a clear refusal).
    assert main(["stack", str(EX / "muffliato-ring.toml"), "--dir", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "no docker here to resolve it to its image ID" in err
    assert not (tmp_path / "c").exists()  # refused before any key was made


def test_a_tag_that_is_not_an_image_here_is_refused_and_nothing_is_written(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("PATH", str(_fake_docker(tmp_path, {})))
    argv = ["stack", str(EX / "muffliato-ring.toml"), "--dir", str(tmp_path / "st")]
    assert main([*argv, "--image", "peer:missing"]) == 2
    err = capsys.readouterr().err
    assert "--image peer:missing: not an image here (Error: No such image: peer:missing)" in err
    assert "sha256:" in err and not (tmp_path / "st").exists()
    with pytest.raises(ComposeError, match="is a tag"):
        stack.render(3, run_id="r", describe="t", run_dir="/r", image="peer:latest")
    assert stack.pinned(FAKE_ID) and not stack.pinned("sha256:abc")


def test_the_auditor_waits_for_every_result_or_for_the_rest_to_go_quiet(tmp_path):
    from coordinator_free.cluster.compose import wait_for_peers

    run = tmp_path / "run"
    (run / "results").mkdir(parents=True)
    (run / "logs").mkdir()
    for i in range(3):
        (run / "results" / f"node-{i}.json").write_text("{}")
    assert wait_for_peers(run, 3, timeout_s=5, idle_s=60, poll_s=0.01) == "all"
    # One result missing: while a log keeps changing the auditor waits; once nothing moved for
    # the idle time it goes ahead (the audit then names the peer without a result).
    (run / "results" / "node-2.json").unlink()
    old = time.time() - 100
    for p in run.rglob("*.json"):
        os.utime(p, (old, old))
    (run / "logs" / "node-2.vlog").write_bytes(b"x")  # touched just now
    assert wait_for_peers(run, 3, timeout_s=0.3, idle_s=60, poll_s=0.01) == "timeout"
    assert wait_for_peers(run, 3, timeout_s=30, idle_s=0.2, poll_s=0.01) == "idle"
    # No peer finished at all: only the timeout ends the wait.
    for p in (run / "results").iterdir():
        p.unlink()
    assert wait_for_peers(run, 3, timeout_s=0.3, idle_s=0.0, poll_s=0.01) == "timeout"


# ------------------------------------------------------------- real stacks on a Swarm (-m docker)


def _docker(*args: str, timeout: float = 120, check: bool = True) -> str:
    r = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if check:
        assert r.returncode == 0, f"docker {' '.join(args)}: {r.stdout}{r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def swarm():
    """A single-node Swarm on loopback; left again only if this fixture initialised it."""
    dockerimg.need_docker()
    state = _docker("info", "--format", "{{.Swarm.LocalNodeState}}").strip()
    made = state == "inactive"
    if made:
        _docker("swarm", "init", "--advertise-addr", "127.0.0.1")
    else:
        dockerimg.need("a Swarm manager", state == "active")
    yield made
    if made:
        _docker("swarm", "leave", "--force")
        assert _docker("info", "--format", "{{.Swarm.LocalNodeState}}").strip() == "inactive"


class Stack:
    """One deployed stack; ``remove`` takes it down and checks nothing of it is left."""

    def __init__(self, name: str, stack_file: Path):
        self.name, self.file = name, stack_file

    def deploy(self, image: str) -> None:
        _docker(
            "stack", "deploy", "--resolve-image", "never", "-c", str(self.file), self.name,
            timeout=300,
        )  # fmt: skip
        # By ID: no node ever asks a registry for a tag.
        assert stack.resolve_image(image) in self.file.read_text()

    def tasks(self, service: str) -> list[str]:
        out = _docker(
            "service", "ps", f"{self.name}_{service}", "--no-trunc", "--format",
            "{{.CurrentState}}|{{.Error}}",
        )  # fmt: skip
        return out.splitlines()

    def container(self, service: str) -> str:
        out = _docker(
            "ps", "-q", "--filter", f"label=com.docker.swarm.service.name={self.name}_{service}"
        )
        ids = out.split()
        assert len(ids) == 1, (service, out)
        return ids[0]

    def wait_complete(self, service: str, timeout: float) -> list[str]:
        t0 = time.monotonic()
        while True:
            tasks = self.tasks(service)
            if tasks and all(t.startswith(("Complete", "Failed", "Rejected")) for t in tasks):
                return tasks
            assert time.monotonic() - t0 < timeout, (service, tasks)
            time.sleep(1)

    def leftovers(self) -> list[str]:
        label = f"label=com.docker.stack.namespace={self.name}"
        found = []
        for kind in ("service", "secret", "config", "network", "volume"):
            out = _docker(kind, "ls", "-q", "--filter", label)
            found += [f"{kind} {x}" for x in out.split()]
        found += [f"container {x}" for x in _docker("ps", "-aq", "--filter", label).split()]
        return found

    def remove(self) -> None:
        """``docker stack rm``, then the job containers it leaves behind (Swarm keeps the
        containers of completed job tasks), as the README says."""
        _docker("stack", "rm", self.name, check=False)
        label = f"label=com.docker.stack.namespace={self.name}"
        t0 = time.monotonic()
        while (left := self.leftovers()) and time.monotonic() - t0 < 300:
            # `stack rm` returns before the tasks and the network are gone
            if not _docker("service", "ls", "-q", "--filter", label).split():
                try:
                    # Unchecked: a busy daemon goes on pruning after its client is gone, and
                    # refuses a second prune meanwhile; the loop asks again until nothing is
                    # left (or the deadline, which fails the test).
                    _docker(
                        "container", "prune", "--force", "--filter", label, timeout=60, check=False
                    )
                except subprocess.TimeoutExpired:
                    pass
            time.sleep(1)
        assert left == [], left


@pytest.fixture
def stacks(swarm):
    made: list[Stack] = []
    yield made
    for s in made:
        s.remove()


def _stack(stacks, tmp_path: Path, image: str, *sets: str, groups: int = 0) -> Stack:
    d = tmp_path / "st"
    argv = ["stack", str(EX / "muffliato-ring.toml"), "--dir", str(d), "--image", image]
    image_id = stack.resolve_image(image)
    argv += [a for s in sets for a in ("--set", s)]
    if groups:
        argv += ["--groups", str(groups)]
    assert main(argv) == 0
    s = Stack(f"cfreetest{tmp_path.name[-12:]}".lower().replace("_", ""), d / stack.STACK_FILE)
    assert image_id.startswith("sha256:") and image not in s.file.read_text()
    stacks.append(s)
    return s


@pytest.fixture(scope="module")
def peer_image():
    return dockerimg.peer_image()


@pytest.fixture
def group_label(swarm):
    """This node labelled cfree.group=0 (the label removed afterwards if it was not there)."""
    me = _docker("info", "--format", "{{.Swarm.NodeID}}").strip()
    had = _docker("node", "inspect", me, "--format", "{{json .Spec.Labels}}").strip()
    _docker("node", "update", "--label-add", f"{stack.GROUP_LABEL}=0", me)
    yield
    if stack.GROUP_LABEL not in (json.loads(had) or {}):
        _docker("node", "update", "--label-rm", stack.GROUP_LABEL, me)


@pytest.mark.docker
def test_eight_peer_jobs_complete_and_the_audit_equals_the_plan(
    peer_image, stacks, group_label, tmp_path
):
    s = _stack(stacks, tmp_path, peer_image, groups=1)
    s.deploy(peer_image)
    for i in range(8):
        tasks = s.wait_complete(f"peer-{i}", 300)
        assert len(tasks) == 1 and tasks[0].startswith("Complete"), (i, tasks)
    assert s.wait_complete("auditor", 300)[0].startswith("Complete"), s.tasks("auditor")
    run = tmp_path / "st" / "run"
    rep = json.loads((run / "audit.json").read_text())
    assert rep["fault_free"] is True and rep["integrity"] == []
    assert_audit_equals_plan(rep, make_plan(config.load(run / "config.toml")), 1e-9)
    ips = set()
    for i in range(8):
        vl = read_viewlog(run / "logs" / f"node-{i}.vlog")
        assert vl.intact and vl.records[-1]["k"] == "finished"
        res = json.loads((run / "results" / f"node-{i}.json").read_text())
        local = {ends["local"].rsplit(":", 1)[0] for ends in res["channels"].values()}
        assert len(local) == 1 and not next(iter(local)).startswith("127."), res["channels"]
        ips |= local
    assert len(ips) == 8  # each peer in its own container on the overlay network
    # The key secret: mounted read-only for root alone, in peer i's container only.
    spec = json.loads(_docker("service", "inspect", f"{s.name}_peer-5"))[0]["Spec"]
    secrets = spec["TaskTemplate"]["ContainerSpec"]["Secrets"]
    assert [(x["File"]["Name"], x["File"]["Mode"]) for x in secrets] == [
        ("/cfree/key/node-5.key", 0o400)
    ]
    assert not list(run.rglob("*.key"))


@pytest.mark.docker
def test_a_killed_peer_job_is_not_restarted_and_the_audit_is_not_fault_free(
    peer_image, stacks, tmp_path
):
    sets = dockerimg.KILLED_RUN_SETS
    s = _stack(stacks, tmp_path, peer_image, *sets)
    s.deploy(peer_image)
    run = tmp_path / "st" / "run"
    victim = 3
    # Kill once the victim has logged a value sent at step 2 or later.
    dockerimg.wait_for_send(run / "logs" / f"node-{victim}.vlog", 2, 240)
    _docker("kill", "-s", "KILL", s.container(f"peer-{victim}"))
    tasks = s.wait_complete(f"peer-{victim}", 60)
    assert len(tasks) == 1 and tasks[0].startswith("Failed"), tasks  # one task: no restart
    for i in range(8):
        if i != victim:
            tasks = s.wait_complete(f"peer-{i}", 300)
            assert len(tasks) == 1 and tasks[0].startswith("Complete"), (i, tasks)
    # The auditor goes ahead once the survivors have finished and the victim's log stays still.
    assert s.wait_complete("auditor", 300)[0].startswith("Complete"), s.tasks("auditor")
    logs = _docker("service", "logs", "--raw", f"{s.name}_auditor")
    assert "7 of 8 peers finished and nothing moved" in logs, logs[-3000:]
    assert_killed_node_audited(json.loads((run / "audit.json").read_text()), victim)
    for w in (victim - 1, victim + 1):
        vl = read_viewlog(run / "logs" / f"node-{w}.vlog")
        assert vl.intact and vl.records[-1]["k"] == "finished"
        assert [x for x in vl.records if x["k"] == "miss" and x["peer"] == victim]
