"""Validation bounds the memory a plan needs: a config whose plan (graph, dense matrices,
dataset, models, walk state) would need more than the limit is refused with an error naming the
keys that drive it and the estimate, before anything is allocated."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from coordinator_free import checks, config

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples"
GIB = 1 << 30


def refused(path, sets) -> str:
    with pytest.raises(config.ConfigError) as ei:
        config.load(path, sets)
    msg = str(ei.value)
    assert "over the 4 GiB limit" in msg and checks.MEMORY_ENV in msg, msg
    return msg


def estimate_gib(msg: str) -> float:
    size, unit = re.search(r"needs about ([\d.e+]+) (KiB|MiB|GiB|TiB)", msg).groups()
    return float(size) * {"KiB": 2**-20, "MiB": 2**-10, "GiB": 1, "TiB": 1024}[unit]


def test_a_65536_node_graph_is_refused_naming_the_key():
    msg = refused(None, ["graph.nodes=65536"])
    assert msg.startswith("<built-in default> (with --set graph.nodes=65536): graph.nodes = 65536")
    assert "dense 65536 x 65536 matrices" in msg
    assert estimate_gib(msg) >= 32  # one dense float64 matrix alone is 32 GiB


def test_decor_with_100000_features_is_refused_naming_the_key():
    msg = refused(EX / "decor-ring.toml", ["data.features=100000"])
    assert "data.features = 100000, graph.nodes = 16" in msg
    assert "1.6e+06 x 100000 design matrix" in msg
    assert estimate_gib(msg) >= 1.16 * 1024  # the design matrix alone is 1.16 TiB


@pytest.mark.parametrize(
    "path, sets, keys",
    [
        # averaging: n x dim node values in the simulator
        (None, ["graph.nodes=2000", "data.dim=1000000"], "graph.nodes = 2000, data.dim = 1000000"),
        # averaging on a grid: the keys are rows and cols
        (None, ["graph.kind=grid", "graph.rows=200", "graph.cols=200"], "graph.rows = 200"),
        # randomized gossip: its dense matrices
        (
            EX / "randomized-gossip-ring.toml",
            ["graph.nodes=30000"],
            "graph.nodes = 30000",
        ),
        # learning: a synthetic dataset
        (
            EX / "muffliato-gd-breast-cancer.toml",
            ["data.kind=synthetic-logistic", "data.samples=10000000", "data.features=100000"],
            "data.samples = 10000000, data.features = 100000",
        ),
        # learning: every node's model after every round
        (
            EX / "dsgd-breast-cancer.toml",
            [
                "data.kind=synthetic-logistic",
                "data.features=100000",
                "protocol.rounds=100000",
                "graph.nodes=64",
            ],
            "protocol.rounds = 100000, graph.nodes = 64",
        ),
        # learning with a fresh graph every round: one dense matrix per round
        (
            EX / "muffliato-gd-breast-cancer.toml",
            [
                "graph.kind=erdos_renyi",
                "graph.p=0.5",
                "graph.nodes=2000",
                "graph.resample=true",
                "protocol.rounds=1000",
            ],
            "protocol.rounds = 1000, graph.nodes = 2000 (graph.resample)",
        ),
        # decor: its dense matrices
        (EX / "decor-ring.toml", ["graph.nodes=12000"], "graph.nodes = 12000"),
        # token walks: a complete graph's adjacency and transition matrix
        (EX / "complete-sum.toml", ["graph.nodes=30000"], "graph.nodes = 30000"),
        # token walks: the per-hop records
        (
            EX / "complete-sum.toml",
            ["protocol.hops=1000000", "protocol.tokens=64"],
            "protocol.hops = 1000000",
        ),
        # walk-sgd: its dataset
        (
            EX / "walk-sgd.toml",
            ["data.kind=synthetic-lstsq", "data.samples=10000000", "data.features=100000"],
            "data.samples = 10000000, data.features = 100000",
        ),
    ],
    ids=[
        "averaging-values",
        "averaging-grid",
        "randomized",
        "learning-dataset",
        "learning-models",
        "learning-resample",
        "decor-graph",
        "walk-complete",
        "walk-hops",
        "walk-sgd-dataset",
    ],
)
def test_each_family_refuses_a_plan_over_the_limit(path, sets, keys):
    msg = refused(path, sets)
    assert keys in msg, msg


def test_every_example_and_the_default_fit_with_room_to_spare(monkeypatch):
    monkeypatch.setenv(checks.MEMORY_ENV, "0.25")
    for path in [None, *sorted(EX.glob("*.toml"))]:
        config.load(path)


def test_the_limit_follows_the_environment(monkeypatch):
    monkeypatch.setenv(checks.MEMORY_ENV, "512")
    cfg = config.load(None, ["graph.nodes=65536"])  # validated only: never planned here
    assert cfg.graph.nodes == 65536
    monkeypatch.setenv(checks.MEMORY_ENV, "0.00001")
    with pytest.raises(config.ConfigError, match=r"over the 10.5 KiB limit"):
        config.load(None, ["graph.nodes=64"])
    for bad in ("lots", "-1", "0", "nan", "inf"):
        monkeypatch.setenv(checks.MEMORY_ENV, bad)
        with pytest.raises(config.ConfigError, match=f"{checks.MEMORY_ENV} must be a positive"):
            config.load(None)


def test_an_edge_list_is_counted_and_named(tmp_path, monkeypatch):
    path = tmp_path / "g.txt"
    path.write_text("".join(f"{i} {i + 1}\n" for i in range(3000)))
    monkeypatch.setenv(checks.MEMORY_ENV, "0.1")
    with pytest.raises(config.ConfigError) as ei:
        config.load(None, ["graph.kind=edgelist", f"graph.path={path}"])
    assert f"graph.path = {path} (3001 nodes)" in str(ei.value)
