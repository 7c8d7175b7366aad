"""Small in-memory runs written as run directories, for the auditor's robustness tests
(tests/test_audit_robust.py) and the log fuzzer (tests/test_fuzz_logs.py)."""

from __future__ import annotations

from pathlib import Path

from memrun import write_run_dir

from coordinator_free import config
from coordinator_free.engine.memnet import Faults
from coordinator_free.inmemory import run_config

EX = Path(__file__).resolve().parent.parent / "examples"

RUNS = {
    "muffliato": (None, ["graph.nodes=4", "protocol.steps=4"], None),
    "randomized-gossip": (EX / "randomized-gossip-ring.toml", ["graph.nodes=5", "protocol.steps=14"], None),
    "muffliato-gd": (
        EX / "muffliato-gd-breast-cancer.toml",
        ["graph.nodes=4", "protocol.rounds=2", "protocol.gossip_steps=2"],
        None,
    ),
    "dsgd": (EX / "dsgd-breast-cancer.toml", ["graph.nodes=4", "protocol.rounds=3", "log.values=false"], None),
    # Values missed at their step and logged late: a realised fault with intact logs.
    "muffliato-late": (None, ["graph.nodes=4", "protocol.steps=5"], Faults(delay=(0.001, 1.6))),
}  # fmt: skip


def make_run(name: str, out: Path) -> Path:
    path, sets, faults = RUNS[name]
    cfg = config.load(path, [*sets, "network.deadline_s=1"])
    return write_run_dir(cfg, run_config(cfg, faults, seed=1), out)
