import re
from pathlib import Path

import pytest

from coordinator_free import config

ROOT = Path(__file__).resolve().parent.parent


def test_builtin_defaults_are_the_shipped_examples():
    for name in ("muffliato-hypercube", "muffliato-ring"):
        packaged = (ROOT / "coordinator_free" / "examples" / f"{name}.toml").read_text()
        shipped = (ROOT / "examples" / f"{name}.toml").read_text()
        assert packaged == shipped, name
    cfg = config.load(None)  # the library default, lab and compose: one host per peer
    assert cfg.graph.kind == "ring" and cfg.graph.nodes == 8
    assert cfg.protocol.name == "muffliato"
    # cfree run, plan and simulate: 64 peers, most pairs amplified below local DP.
    big = config.load(None, default=config.RUN_DEFAULT_CONFIG)
    assert big.graph.kind == "hypercube" and big.graph.dim == 6 and big.graph_n() == 64


def test_overrides_are_parsed_as_toml_values():
    cfg = config.load(
        None,
        ["graph.nodes=12", "privacy.sigma=2", "protocol.accelerated=false", "protocol.steps=auto"],
    )
    assert cfg.graph.nodes == 12
    assert cfg.privacy.sigma == 2.0 and isinstance(cfg.privacy.sigma, float)
    assert cfg.protocol.accelerated is False
    assert cfg.protocol.steps == "auto"


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("graph.nodez=3", "unknown key graph.nodez"),
        ("grph.nodes=3", "unknown section [grph]"),
        ("graph.nodes=true", "graph.nodes must be int"),
        ("graph.nodes=2", "graph.nodes must be an integer >= 3"),
        ("graph.kind=moebius", "graph.kind 'moebius' unknown"),
        ("protocol.steps=0", "protocol.steps must be in 1..100000"),
        ("protocol.steps=soon", 'protocol.steps must be a positive integer or "auto"'),
        ("protocol.weights=hamilton", "protocol.weights 'hamilton' unknown"),
        ("privacy.sigma=-0.5", "privacy.sigma must be in (1e-150, 1e150)"),
        ("privacy.alpha=1", "privacy.alpha must be in (1, 1e6]"),
        ("privacy.delta=1", "privacy.delta must be in (0, 1)"),
        ("data.kind=images", "data.kind 'images' unknown"),
        ("network.deadline_s=-1", "network.deadline_s must be in (0, 3600]"),
        ("nodes=3", "the key must look like section.key"),
        ("run.seed=-1", "run.seed must be in 0..2^63-1"),
        ("run.name=../escape", "run.name '../escape' must be letters"),
        ("protocol.spread=inf", "protocol.spread must be a finite number"),
        ("data.mean=nan", "data.mean must be a finite number"),
        ("data.low=-1e200", "|data.low| must be at most 1e100"),
        ("privacy.sigma=1e-300", "privacy.sigma must be in (1e-150, 1e150)"),
        ("privacy.alpha=inf", "privacy.alpha must be a finite number"),
        ("network.deadline_s=inf", "network.deadline_s must be a finite number"),
        ("network.connect_timeout_s=1e9", "network.connect_timeout_s must be in (0, 3600]"),
        ("graph.nodes=100000", "graph.nodes 100000 is above the limit 65536"),
        ("data.dim=9000000", "raise it or lower data.dim"),
    ],
)
def test_bad_values_name_the_key(override, fragment):
    with pytest.raises(config.ConfigError) as ei:
        config.load(None, [override])
    assert fragment in str(ei.value)


def test_file_errors_name_the_file(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(config.ConfigError, match="does not exist"):
        config.load(missing)
    bad = tmp_path / "bad.toml"
    bad.write_text("[graph\nkind = 'ring'\n")
    with pytest.raises(config.ConfigError) as ei:
        config.load(bad)
    assert str(bad) in str(ei.value) and "invalid TOML" in str(ei.value)
    needs_p = tmp_path / "er.toml"
    needs_p.write_text('[graph]\nkind = "erdos_renyi"\nnodes = 10\n')
    with pytest.raises(config.ConfigError, match=r"graph.p must be in \(0, 1\]"):
        config.load(needs_p)


def test_round_trip_through_toml(tmp_path):
    cfg = config.load(None, ["graph.kind=grid", "graph.rows=2", "graph.cols=3", "data.dim=3"])
    path = tmp_path / "c.toml"
    path.write_text(cfg.to_toml())
    again = config.load(path)
    assert again.to_dict() == cfg.to_dict()


def test_edgelist_path_is_relative_to_the_config(tmp_path):
    (tmp_path / "g.txt").write_text("# a triangle plus a tail\n0 1\n1 2\n2 0\n2 3\n")
    (tmp_path / "c.toml").write_text('[graph]\nkind = "edgelist"\npath = "g.txt"\n')
    cfg = config.load(tmp_path / "c.toml")
    assert cfg.graph_n() == 4


def test_text_keys_take_the_raw_override_text(tmp_path, monkeypatch):
    cfg = config.load(None, ["run.name=2024", "network.host=127.0.0.2"])
    assert cfg.run.name == "2024" and cfg.network.host == "127.0.0.2"
    # --set graph.path is relative to the working directory, not to the config file.
    (tmp_path / "g.txt").write_text("0 1\n1 2\n")
    monkeypatch.chdir(tmp_path)
    cfg = config.load(None, ["graph.kind=edgelist", "graph.path=g.txt"])
    assert cfg.graph.path == str(tmp_path / "g.txt") and cfg.graph_n() == 3


@pytest.mark.parametrize(
    "base, overrides, fragment",
    [
        (
            config.RUN_DEFAULT_CONFIG,
            ["graph.nodes=6"],
            "graph.kind is 'hypercube', whose size is 2^graph.dim; 6 is not a power of two",
        ),
        (
            config.RUN_DEFAULT_CONFIG,
            ["graph.nodes=16", "graph.dim=3"],
            "graph.nodes=16 is a hypercube of dim 4, not --set graph.dim=3",
        ),
        (None, ["graph.dim=3"], "graph.dim is read only by hypercube graphs"),
        (None, ["graph.p=0.3"], "add e.g. --set graph.kind=erdos_renyi"),
        (
            None,
            ["graph.kind=torus", "graph.rows=3", "graph.cols=3", "graph.nodes=9"],
            "rows x graph",
        ),
        (
            None,
            ["graph.kind=hypercube", "graph.dim=3", "graph.rows=2"],
            "graph.rows=2 changes nothing",
        ),
    ],
)
def test_an_override_the_graph_kind_ignores_is_refused(base, overrides, fragment):
    """`--set graph.nodes=6` on the 64-node hypercube would silently run 64 nodes."""
    with pytest.raises(config.ConfigError, match=re.escape(fragment)):
        config.load(base, overrides)


def test_nodes_on_a_hypercube_is_its_power_of_two():
    """`cfree run --set graph.nodes=256` on the default hypercube runs the 256-node hypercube."""
    cfg = config.load(config.RUN_DEFAULT_CONFIG, ["graph.nodes=256"])
    assert cfg.graph.kind == "hypercube" and cfg.graph.dim == 8 and cfg.graph_n() == 256
    assert config.load(config.RUN_DEFAULT_CONFIG, ["graph.nodes=8", "graph.dim=3"]).graph_n() == 8
    # The dim written in the file gives way to the override; the config records the dim.
    assert "dim = 8" in cfg.to_toml()


def test_keys_of_other_graph_kinds_in_a_file_or_with_the_kind_are_accepted(tmp_path):
    # A resolved config spells out every key; only an explicit override is checked.
    written = tmp_path / "c.toml"
    written.write_text(config.load(None, ["graph.kind=hypercube", "graph.dim=3"]).to_toml())
    assert config.load(written).graph_n() == 8
    cfg = config.load(config.RUN_DEFAULT_CONFIG, ["graph.kind=ring", "graph.nodes=6"])
    assert cfg.graph_n() == 6
    cfg = config.load(None, ["graph.kind=erdos_renyi", "graph.nodes=10", "graph.p=0.5"])
    assert cfg.graph_n() == 10
