"""The peer image for the docker suites (compose clusters, Swarm stacks), built once per test
session the offline way: a base image from Debian's packages (deploy/build-base-image.sh), the
wheels fetched beforehand (deploy/fetch-wheels.sh), then ``docker build --network none``, so the
build itself cannot reach a registry or an index."""

from __future__ import annotations

import functools
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from ci import IN_CI

ROOT = Path(__file__).resolve().parents[1]
TEST_IMAGE = "coordinator-free-peer:test"
BASE_IMAGE = "cfree-base:bookworm"

#: Settings of a run whose peer is killed mid-run. Peers take a few milliseconds a step, so
#: 400 undelayed steps can be over before a poll of the log and ``docker kill`` land (the
#: victim then dies lingering after its last step, with a finished log). Holding every data
#: frame 25 ms makes a step last at least that long on any machine: 400 steps take 10 s or
#: more, and the kill lands mid-run.
KILLED_RUN_SETS = (
    "protocol.steps=400",
    "network.deadline_s=2",
    "protocol.accelerated=false",
    'faults.inject=["delay:25"]',
)


def need(what: str, ok: bool) -> None:
    """Absent tools fail the run in CI (it installs them) and skip elsewhere, saying why."""
    if not ok:
        if IN_CI:
            pytest.fail(f"{what} is not available in CI")
        pytest.skip(f"{what} is not available here")


def need_docker() -> None:
    need("docker", shutil.which("docker") is not None)
    info = subprocess.run(["docker", "info"], capture_output=True, text=True)
    need("a running docker engine", info.returncode == 0)


@functools.cache
def _build() -> str:
    steps = [
        ["bash", "deploy/build-base-image.sh", "--tag", BASE_IMAGE],
        ["bash", "deploy/fetch-wheels.sh"],
        ["docker", "build", "--network", "none", "-q", "-f", "peer/Dockerfile"]
        + ["--build-arg", f"BASE_IMAGE={BASE_IMAGE}", "--build-arg", "PIP_OPTIONS=--no-index"]
        + ["-t", TEST_IMAGE, "."],
    ]
    for cmd in steps:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
        assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    r = subprocess.run(
        ["docker", "run", "--rm", TEST_IMAGE, "--version"], capture_output=True, text=True
    )
    assert r.returncode == 0 and r.stdout.startswith("cfree "), r
    return TEST_IMAGE


def wait_for_send(vlog: Path, step: int, timeout: float, alive=lambda: True) -> None:
    """Wait until the view log ``vlog`` (written by a container) holds a value sent at ``step``
    or later; ``alive()`` must stay true meanwhile (it may return what to report if not)."""
    from coordinator_free.viewlog import read_viewlog

    t0 = time.monotonic()
    while True:
        ok = alive()
        assert ok is True, ok
        assert time.monotonic() - t0 < timeout, f"{vlog.name} never reached step {step}"
        try:
            recs = read_viewlog(vlog).records if vlog.exists() else []
        except Exception:  # a record half-written right now: look again
            recs = []
        if any(x.get("k") == "send" and x.get("step", 0) >= step for x in recs):
            return
        time.sleep(0.2)  # the file is written in another container: no event to wait on


def peer_image() -> str:
    """The tag of the peer image built from this checkout (once per session)."""
    need_docker()
    return _build()
