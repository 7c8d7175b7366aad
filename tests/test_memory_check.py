"""The memory check refuses, up front and naming the key, a plan whose multi-round accountant
would not fit (it used to die in privacy/multiround.py with a MemoryError after minutes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator_free import config
from coordinator_free.checks import MEMORY_ENV
from coordinator_free.errors import ConfigError

EX = Path(__file__).resolve().parent.parent / "examples"


# The sizes below are for 16 nodes on a ring (the muffliato-gd example itself is a hypercube).
RING16 = ["graph.kind=ring", "graph.nodes=16"]


@pytest.mark.parametrize(
    "example, rounds, size",
    [("muffliato-gd-breast-cancer", 20000, "56.9 GiB"), ("dsgd-breast-cancer", 100000, "1.38 TiB")],
)
def test_a_multi_round_plan_too_large_is_refused_naming_protocol_rounds(
    example, rounds, size, monkeypatch
):
    monkeypatch.delenv(MEMORY_ENV, raising=False)
    with pytest.raises(ConfigError) as err:
        config.load(EX / f"{example}.toml", [*RING16, f"protocol.rounds={rounds}"])
    msg = str(err.value)
    assert f"protocol.rounds = {rounds}, graph.nodes = 16" in msg
    assert f"needs about {size}" in msg
    assert f"16 x {rounds} x {rounds} information matrices" in msg
    assert MEMORY_ENV in msg


def test_the_limit_follows_the_environment_and_a_long_plan_that_fits_is_accepted(monkeypatch):
    monkeypatch.delenv(MEMORY_ENV, raising=False)
    path = EX / "muffliato-gd-breast-cancer.toml"
    assert config.load(path, [*RING16, "protocol.rounds=5000"]).protocol.rounds == 5000
    monkeypatch.setenv(MEMORY_ENV, "1")
    with pytest.raises(ConfigError, match=r"protocol.rounds = 5000.*over the 1 GiB limit"):
        config.load(path, [*RING16, "protocol.rounds=5000"])
    monkeypatch.setenv(MEMORY_ENV, "64")
    assert config.load(path, [*RING16, "protocol.rounds=20000"]).protocol.rounds == 20000
