"""The in-memory cases every family runs in (tests/test_memnet.py, and the fault matrix and
the non-finite tests on top): a small config per protocol, the deadline they run with."""

from __future__ import annotations

from pathlib import Path

from coordinator_free import config

EX = Path(__file__).resolve().parent.parent / "examples"

GOSSIP = {
    "muffliato": (None, ["graph.nodes=8", "protocol.steps=12", "network.deadline_s=1"]),
    "muffliato-accelerated": (
        None,
        ["graph.kind=hypercube", "graph.dim=3", "protocol.steps=10", "protocol.accelerated=true"],
    ),
    "randomized-gossip": (
        EX / "randomized-gossip-ring.toml",
        ["graph.nodes=8", "protocol.steps=60", "network.deadline_s=1"],
    ),
    "muffliato-gd": (
        EX / "muffliato-gd-breast-cancer.toml",
        ["graph.kind=ring", "graph.nodes=6", "protocol.rounds=3", "protocol.gossip_steps=2"],
    ),
    "dsgd": (EX / "dsgd-breast-cancer.toml", ["graph.nodes=6", "protocol.rounds=6"]),
    "decor": (EX / "decor-ring.toml", ["graph.nodes=6", "protocol.rounds=12"]),
    # Secret per-round graphs: each node draws its own neighbours from its pair secrets.
    "dsgd-secret": (
        EX / "dsgd-breast-cancer.toml",
        [
            "graph.kind=erdos_renyi",
            "graph.nodes=8",
            "graph.p=0.4",
            "graph.resample=true",
            "graph.hidden=true",
            "protocol.weights=lazy",
            "protocol.rounds=8",
        ],
    ),  # fmt: skip
}
WALKS = {
    "ring-sum": (EX / "ring-sum.toml", ["graph.nodes=5", "protocol.cycles=4"]),
    "complete-sum": (EX / "complete-sum.toml", ["graph.nodes=5", "protocol.hops=80"]),
    # its 16-node hypercube; step size 0.05 (the example takes 0.02): every draw depends on the
    # whole config, and with this one the fault matrix's walk (seed 3) meets its cut target
    "walk-sgd": (EX / "walk-sgd.toml", ["protocol.hops=60", "protocol.step_size=0.05"]),
    "admm": (
        EX / "admm-lasso.toml",
        ["graph.nodes=5", "protocol.hops=40", "data.samples=200", "data.features=8"],
    ),
}
ALL = {**GOSSIP, **WALKS}
DEADLINE = 1.0


def cfg_of(name: str, *extra: str):
    path, sets = ALL[name]
    return config.load(path, [*sets, f"network.deadline_s={DEADLINE}", *extra])
