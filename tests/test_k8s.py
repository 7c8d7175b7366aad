"""`cfree k8s`: the Kustomize directory, rendered by kubectl and validated against the
Kubernetes schemas with kubernetes-validate --strict (offline: no cluster runs here).

kubectl and kubernetes-validate are needed; in CI (CI=true) a missing one fails the test
instead of skipping it."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ci import IN_CI

from coordinator_free.cli import main

EX = Path(__file__).resolve().parents[1] / "examples"


def _tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        if IN_CI:
            pytest.fail(f"{name} is needed to validate the Kubernetes manifests")
        pytest.skip(f"{name} not installed")
    return path


def _render(d: Path) -> str:
    out = subprocess.run(
        [_tool("kubectl"), "kustomize", str(d)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _validate(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [_tool("kubernetes-validate"), "--strict", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def manifests(tmp_path):
    d = tmp_path / "k8s"
    assert main(["k8s", str(EX / "muffliato-ring.toml"), "--dir", str(d), "--json"]) == 0
    rendered = tmp_path / "all.yaml"
    rendered.write_text(_render(d))
    return d, rendered


def test_the_manifests_render_and_validate_strictly(manifests):
    d, rendered = manifests
    docs = list(yaml.safe_load_all(rendered.read_text()))
    kinds = sorted(x["kind"] for x in docs)
    assert kinds == sorted(
        ["ConfigMap", "PersistentVolumeClaim", "Service", *["Secret"] * 8, *["Job"] * 9]
    )
    done = _validate(rendered)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (done.stdout + done.stderr).count("passed") == len(docs)


def test_the_validation_catches_a_misspelled_field_and_a_string_port(manifests, tmp_path):
    _, rendered = manifests
    text = rendered.read_text()
    for bad in (
        text.replace("restartPolicy: Never", "restartPolicyy: Never", 1),
        text.replace("containerPort: 7000", 'containerPort: "7000"', 1),
    ):
        assert bad != text
        path = tmp_path / "bad.yaml"
        path.write_text(bad)
        done = _validate(path)
        assert done.returncode != 0, done.stdout


def test_each_peer_mounts_only_its_own_key_and_the_roster_names_the_pods(manifests):
    d, rendered = manifests
    docs = list(yaml.safe_load_all(rendered.read_text()))
    secrets = {x["metadata"]["name"]: x for x in docs if x["kind"] == "Secret"}
    roster = json.loads((d / "roster.json").read_text())
    for i in range(8):
        (job,) = [
            x for x in docs if x["kind"] == "Job" and x["metadata"]["name"] == f"cfree-peer-{i}"
        ]
        spec = job["spec"]["template"]["spec"]
        assert spec["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 0
        assert (spec["hostname"], spec["subdomain"]) == (f"cfree-peer-{i}", "cfree-peers")
        keys = [v["secret"] for v in spec["volumes"] if "secret" in v]
        assert keys == [{"secretName": f"cfree-key-{i}", "defaultMode": 0o400}]
        data = secrets[f"cfree-key-{i}"]["data"]
        assert list(data) == [f"node-{i}.key"]
        assert (
            base64.b64decode(data[f"node-{i}.key"]) == (d / "keys" / f"node-{i}.key").read_bytes()
        )
        entry = roster["nodes"][i]
        assert (entry["host"], entry["port"]) == (f"cfree-peer-{i}.cfree-peers", 7000)
    (cm,) = [x for x in docs if x["kind"] == "ConfigMap"]
    assert cm["data"]["config.toml"] == (d / "config.toml").read_text()


def test_a_directory_with_keys_is_refused(manifests, capsys):
    d, _ = manifests
    assert main(["k8s", str(EX / "muffliato-ring.toml"), "--dir", str(d)]) == 2
    assert "already holds manifests or keys" in capsys.readouterr().err
