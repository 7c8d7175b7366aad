"""Experiment configuration: TOML file -> validated, frozen dataclasses.

The schema is a public contract, documented key by key in docs/config.md. Every error names the
file (or override) and the key at fault. ``--set section.key=value`` overrides any key; the value
is parsed as a TOML value (``--set graph.nodes=16``, ``--set protocol.steps='"auto"'`` or simply
``--set protocol.steps=auto``: a bare word that is not valid TOML is taken as a string).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coordinator_free.checks import (  # noqa: F401  (re-exported: the config's vocabulary)
    CATEGORY_KINDS,
    CLIPPINGS,
    MODEL_KINDS,
    PARTITIONS,
    VALUE_KINDS,
    int_or_auto,
    positive_int,
)
from coordinator_free.errors import ConfigError  # noqa: F401  (re-exported)
from coordinator_free.families import catalog
from coordinator_free.graphs import GRAPH_KINDS, WEIGHT_SCHEMES
from coordinator_free.ml.datasets import (
    DATASET_KINDS,  # numpy only; scikit-learn is imported on use
)

#: What ``config.load(None)`` gives, and the default of the commands that start one host,
#: container or namespace per peer (``cfree lab run``, ``cfree compose``): 8 peers on a ring.
DEFAULT_CONFIG = Path(__file__).parent / "examples" / "muffliato-ring.toml"
#: What ``cfree run``, ``cfree plan`` and ``cfree simulate`` run without a config: private
#: averaging on a 64-node hypercube, where most pairs are amplified below local DP.
RUN_DEFAULT_CONFIG = Path(__file__).parent / "examples" / "muffliato-hypercube.toml"
DATA_KINDS = VALUE_KINDS + CATEGORY_KINDS + DATASET_KINDS
#: Graph kinds that graph.resample can draw afresh every round.
RESAMPLE_KINDS = ("erdos_renyi", "geometric")
#: Graph kinds whose size is graph.nodes (the others: 2^dim, rows x cols, the edge list's).
SIZED_BY_NODES = ("ring", "path", "complete", "star", "erdos_renyi", "geometric")
#: The graph keys that only some kinds read, and the kinds that read them.
GRAPH_KEY_KINDS = {
    "nodes": SIZED_BY_NODES,
    "dim": ("hypercube",),
    "rows": ("grid", "torus"),
    "cols": ("grid", "torus"),
    "p": ("erdos_renyi",),
    "radius": ("geometric",),
    "path": ("edgelist",),
}


@dataclass(frozen=True)
class RunSection:
    name: str = "muffliato-ring"
    seed: int = 0


@dataclass(frozen=True)
class GraphSection:
    kind: str = "ring"
    nodes: int | None = 8
    dim: int | None = None
    rows: int | None = None
    cols: int | None = None
    p: float | None = None
    radius: float | None = None
    path: str | None = None
    seed: int = 0
    # Learning protocols: a fresh random graph (erdos_renyi, geometric) every round.
    resample: bool = False
    # With resample and erdos_renyi: the rounds' edges come from pairwise secrets, so each node
    # knows only its own neighbours (None: public per-round seeds; left out of written configs).
    hidden: bool | None = None


@dataclass(frozen=True)
class ProtocolSection:
    name: str = "muffliato"
    weights: str = "metropolis"
    steps: int | str = "auto"
    accelerated: bool = True
    spread: float = 0.25
    # randomized-gossip: seconds of wall time per unit of the nodes' Poisson clocks.
    tick: float = 0.0
    # Learning protocols (muffliato-gd/sgd, dsgd, central-dp).
    rounds: int = 20
    gossip_steps: int | str = "auto"
    step_size: float = 0.5
    batch_size: int = 0
    clip: float = 1.0
    # "example": clip every per-example gradient, then average; "batch": clip the batch's mean
    # gradient (user-level clipping, as in the DECOR paper). Both bound one node's change by 2C.
    clipping: str = "example"
    # Token forwarding (ring-*, complete-*, walk-sgd).
    cycles: int = 1  # ring protocols: K full turns of the ring
    hops: int | str = "auto"  # complete-* and walk-sgd: token steps per token
    tokens: int = 1  # independent walks at once
    cap: int = 0  # contributions per node and token (0: no cap); past it a node adds noise only
    distributed_noise: bool = False  # ring-sum: Remark 1 (every hop adds sigma/sqrt(n-1))
    # Private ADMM (admm, admm-central, admm-federated; prox-sgd reads clip and step_size):
    # the prox step gamma, the relaxation lambda (u <- u + 2 lam (x - z + eta/2)); protocol.clip
    # is the Lipschitz bound L of every record's loss (its convex surrogate: derivative clamped).
    # None: the family's default (left out of written configs).
    gamma: float | None = None
    lam: float | None = None
    # admm-federated: users sampled per round (None: all) and secure aggregation of their updates.
    users_per_round: int | None = None
    secure_aggregation: bool | None = None


@dataclass(frozen=True)
class DataSection:
    kind: str = "uniform"
    dim: int = 1
    low: float = 0.0
    high: float = 1.0
    mean: float = 0.0
    scale: float = 1.0
    p: float = 0.5
    # Datasets for learning protocols.
    path: str | None = None
    samples: int = 1000
    features: int = 10
    label_noise: float = 0.1
    test_fraction: float = 0.2
    standardize: bool = True
    normalize: bool = True
    intercept: bool = True
    label_column: int = -1
    levels: int = 4  # categorical: the histogram domain {0, ..., levels - 1}
    task: str = "classification"
    partition: str = "iid"
    beta: float = 1.0
    per_node: int | None = None


@dataclass(frozen=True)
class ModelSection:
    kind: str = "auto"
    l2: float = 0.0
    # The l1 regulariser's strength (the ADMM protocols' model.kind = "lasso", or "logistic"
    # with an l1 penalty).
    l1: float | None = None
    # Every parameter's starting value (public; None: 0, left out of written configs).
    init: float | None = None


@dataclass(frozen=True)
class PrivacySection:
    sigma: float = 1.0
    sensitivity: float | None = None
    alpha: float = 2.0
    delta: float = 1e-5
    # Histogram protocols: the local eps of one randomized response.
    eps0: float = 1.0
    # decor: the std of the pairwise-cancelling correlated noise (sigma is the independent
    # noise, sigma_cdp in the paper) and the collusion level q the guarantee is stated for
    # (0: an external eavesdropper; 1: curious users who see every message).
    sigma_cor: float = 0.0
    collusion: int = 0
    # admm: what a neighbouring dataset changes: one user's whole shard ("user", the theorems'
    # setting) or one record of one user ("record"). None: "user" (left out of written configs).
    unit: str | None = None


@dataclass(frozen=True)
class NetworkSection:
    host: str = "127.0.0.1"
    base_port: int = 0
    deadline_s: float = 10.0
    connect_timeout_s: float = 30.0
    max_frame_bytes: int = 64 << 20
    # Frame AEAD: "auto" (AES-256-GCM where both ends have AES instructions, else
    # ChaCha20-Poly1305), or one of them by name.
    cipher: str = "auto"


@dataclass(frozen=True)
class LogSection:
    values: bool = True


@dataclass(frozen=True)
class FaultsSection:
    # Fault specs (coordinator_free.faults), e.g. ["kill:3@5", "drop:0.01"]; --fault appends.
    inject: tuple[str, ...] = ()


@dataclass(frozen=True)
class Config:
    run: RunSection = field(default_factory=RunSection)
    graph: GraphSection = field(default_factory=GraphSection)
    protocol: ProtocolSection = field(default_factory=ProtocolSection)
    data: DataSection = field(default_factory=DataSection)
    model: ModelSection = field(default_factory=ModelSection)
    privacy: PrivacySection = field(default_factory=PrivacySection)
    network: NetworkSection = field(default_factory=NetworkSection)
    log: LogSection = field(default_factory=LogSection)
    faults: FaultsSection = field(default_factory=FaultsSection)
    source: str = "<defaults>"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "source":
                continue
            sec = getattr(self, f.name)
            values = {k: v for k, v in dataclasses.asdict(sec).items() if v is not None}
            if f.name == "faults":
                if not sec.inject:
                    continue  # no faults: the section is left out (older readers never knew it)
                values = {"inject": list(sec.inject)}
            out[f.name] = values
        return out

    def to_toml(self) -> str:
        lines: list[str] = []
        for sec, values in self.to_dict().items():
            lines.append(f"[{sec}]")
            for k, v in values.items():
                lines.append(f"{k} = {_toml_value(v)}")
            lines.append("")
        return "\n".join(lines)

    @property
    def sensitivity(self) -> float:
        """The L2 sensitivity in use: ``privacy.sensitivity`` if given, else 1 for averaging and
        ``2 * protocol.clip`` for learning (one node's whole shard replaced: two clipped mean
        gradients differ by at most 2C)."""
        if self.privacy.sensitivity is not None:
            return float(self.privacy.sensitivity)
        return self.family.sensitivity(self)

    @property
    def fault_plan(self):
        """The declared faults, parsed (coordinator_free.faults.FaultPlan)."""
        from coordinator_free import faults as faults_mod

        return faults_mod.plan_of(self.faults.inject, f"{self.source}: faults.inject")

    @property
    def family(self):
        """The protocol's family (coordinator_free.families.family_of)."""
        from coordinator_free.families import family_of

        return family_of(self.protocol.name)

    def graph_n(self) -> int:
        g = self.graph
        if g.kind in SIZED_BY_NODES:
            return int(g.nodes)
        if g.kind in ("grid", "torus"):
            return int(g.rows) * int(g.cols)
        if g.kind == "hypercube":
            return 2 ** int(g.dim)
        from coordinator_free.graphs import read_edgelist

        return read_edgelist(g.path).number_of_nodes()


SECTIONS: dict[str, type] = {
    "run": RunSection,
    "graph": GraphSection,
    "protocol": ProtocolSection,
    "data": DataSection,
    "model": ModelSection,
    "privacy": PrivacySection,
    "network": NetworkSection,
    "log": LogSection,
    "faults": FaultsSection,
}


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        if isinstance(v, float) and (math.isinf(v) or math.isnan(v)):
            raise ConfigError(f"cannot write non-finite value {v}")
        return repr(v)
    if isinstance(v, str):
        escaped = v.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise ConfigError(f"cannot write value {v!r}")


def parse_override(text: str) -> tuple[str, str, Any]:
    """Parse ``section.key=value`` into (section, key, value).

    A key whose type is text only (``run.name``, ``graph.path``, ...) takes the raw text, so
    ``--set run.name=2024`` is the name "2024", not an integer."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected section.key=value")
    lhs, rhs = text.split("=", 1)
    lhs = lhs.strip()
    if lhs.count(".") != 1:
        raise ConfigError(
            f"override {text!r}: the key must look like section.key (e.g. graph.nodes)"
        )
    section, key = lhs.split(".")
    rhs = rhs.strip()
    cls = SECTIONS.get(section)
    fields = {f.name: str(f.type) for f in dataclasses.fields(cls)} if cls else {}
    if fields.get(key) in ("str", "str | None"):
        if len(rhs) >= 2 and rhs[0] == rhs[-1] and rhs[0] in "\"'":
            return section, key, rhs[1:-1]
        return section, key, rhs
    try:
        value = tomllib.loads(f"v = {rhs}")["v"]
    except tomllib.TOMLDecodeError:
        value = rhs
    return section, key, value


def _check_type(where: str, key: str, value: Any, ftype: Any) -> Any:
    t = str(ftype)
    if t.startswith("tuple[str"):
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise ConfigError(f"{where}: {key} must be a list of strings, got {value!r}")
        return tuple(value)
    allowed: list[type] = []
    if "bool" in t:
        allowed.append(bool)
    if "int" in t:
        allowed.append(int)
    if "float" in t:
        allowed.append(float)
        allowed.append(int)
    if "str" in t:
        allowed.append(str)
    if value is None and "None" in t:
        return None
    ok = any(
        isinstance(value, a) and not (a is int and isinstance(value, bool) and bool not in allowed)
        for a in allowed
    )
    if isinstance(value, bool) and bool not in allowed:
        ok = False
    if not ok:
        names = sorted({a.__name__ for a in allowed})
        raise ConfigError(
            f"{where}: {key} must be {' or '.join(names)}, got {type(value).__name__} {value!r}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: {key} must be a finite number, got {value!r}")
    if "float" in t and "int" not in t and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def from_dict(data: dict[str, Any], *, source: str = "<dict>") -> Config:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a table of sections")
    sections: dict[str, Any] = {}
    for name, sec_data in data.items():
        if name not in SECTIONS:
            raise ConfigError(
                f"{source}: unknown section [{name}]; known sections: {', '.join(SECTIONS)}"
            )
        if not isinstance(sec_data, dict):
            raise ConfigError(f"{source}: [{name}] must be a table")
        cls = SECTIONS[name]
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {}
        for key, value in sec_data.items():
            if key not in fields:
                raise ConfigError(
                    f"{source}: unknown key {name}.{key}; [{name}] accepts: {', '.join(fields)}"
                )
            kwargs[key] = _check_type(f"{source}", f"{name}.{key}", value, fields[key].type)
        sections[name] = cls(**kwargs)
    cfg = Config(**sections, source=source)
    validate(cfg)
    return cfg


PATH_SECTIONS = ("graph", "data")


def portable_config(cfg: Config, subdir: str = "") -> tuple[Config, dict[str, Path]]:
    """The config with the files it uses (an edge list, a CSV/LIBSVM dataset) renamed to paths
    relative to its own directory, ``subdir/graph-<name>`` and ``subdir/data-<name>``, and the
    map from those relative names to the files on this machine, to be copied there.

    ``load`` resolves such paths against the config file's directory, so a config written with
    the copies beside it reads the same anywhere (another host, a container, a run directory).
    """
    files: dict[str, Path] = {}
    graph, data = cfg.graph, cfg.data
    prefix = f"{subdir.rstrip('/')}/" if subdir else ""

    def rename(kind: str, path: str) -> str:
        base = Path(path).name
        name = prefix + (base if base.startswith(f"{kind}-") else f"{kind}-{base}")
        files[name] = Path(path)
        return name

    if graph.kind == "edgelist" and graph.path:
        graph = dataclasses.replace(graph, path=rename("graph", graph.path))
    if data.kind in ("csv", "libsvm") and data.path:
        data = dataclasses.replace(data, path=rename("data", data.path))
    return dataclasses.replace(cfg, graph=graph, data=data), files


def load(
    path: str | Path | None,
    overrides: list[str] | tuple[str, ...] = (),
    faults: list[str] | tuple[str, ...] = (),
    *,
    default: Path = DEFAULT_CONFIG,
) -> Config:
    """Load a TOML config (None: the built-in ``default``), apply ``--set`` overrides and
    append ``--fault`` specs to ``faults.inject``."""
    if path is None:
        path = default
        source = "<built-in default>"
    else:
        source = str(path)
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: invalid TOML: {exc}") from None
    data = copy.deepcopy(data)
    # File paths (an edgelist, a dataset) in the file are relative to the config file.
    for sec in PATH_SECTIONS:
        t = data.get(sec)
        if (
            isinstance(t, dict)
            and isinstance(t.get("path"), str)
            and not Path(t["path"]).is_absolute()
        ):
            t["path"] = str((p.parent / t["path"]).resolve())
    for ov in overrides:
        section, key, value = parse_override(ov)
        if section in PATH_SECTIONS and key == "path" and isinstance(value, str):
            value = str(Path(value).resolve())  # on the command line: relative to the cwd
        data.setdefault(section, {})
        if not isinstance(data[section], dict):
            raise ConfigError(f"override {ov!r}: [{section}] is not a table")
        data[section][key] = value
    if faults:
        sec = data.setdefault("faults", {})
        if not isinstance(sec, dict):
            raise ConfigError(f"{source}: [faults] must be a table")
        have = sec.get("inject", [])
        if not isinstance(have, list):
            raise ConfigError(f"{source}: faults.inject must be a list of strings, got {have!r}")
        sec["inject"] = [*have, *faults]
    plain_source = source
    if overrides:
        source = f"{source} (with --set {' '.join(overrides)})"
    if faults:
        source = f"{source} (with --fault {' '.join(faults)})"
    overrides = _hypercube_by_nodes(data, list(overrides), plain_source)
    cfg = from_dict(data, source=source)
    _refuse_ignored_graph_overrides(data, overrides, plain_source)
    return cfg


def _hypercube_by_nodes(data: dict, overrides: list[str], source: str) -> list[str]:
    """``--set graph.nodes=N`` on a hypercube asks for the hypercube of N = 2^d nodes: it sets
    graph.dim = d (refused when N is not a power of two, or disagrees with a graph.dim given
    beside it). Returns the overrides left for the other checks."""
    graph = data.get("graph")
    if not isinstance(graph, dict) or graph.get("kind", GraphSection.kind) != "hypercube":
        return overrides
    parsed = [(ov, *parse_override(ov)) for ov in overrides]
    by_nodes = [(ov, v) for ov, sec, key, v in parsed if sec == "graph" and key == "nodes"]
    if not by_nodes:
        return overrides
    ov, nodes = by_nodes[-1]
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 2 or nodes & (nodes - 1):
        raise ConfigError(
            f"{source}: --set {ov}: graph.kind is 'hypercube', whose size is 2^graph.dim; "
            f"{nodes!r} is not a power of two >= 2 (or add --set graph.kind=ring)"
        )
    dim = nodes.bit_length() - 1
    dims = [(o, v) for o, sec, key, v in parsed if sec == "graph" and key == "dim"]
    if dims and dims[-1][1] != dim:
        raise ConfigError(
            f"{source}: --set {ov} is a hypercube of dim {dim}, not --set {dims[-1][0]}"
        )
    graph["dim"] = dim
    graph.pop("nodes", None)
    return [o for o, sec, key, _ in parsed if not (sec == "graph" and key == "nodes")]


def _refuse_ignored_graph_overrides(data: dict, overrides, source: str) -> None:
    """An override of a graph key that the graph's kind does not read would change nothing
    (``--set graph.nodes=6`` on a hypercube): refuse it instead of running another graph than
    the one asked for. Keys written in a file are left alone (a resolved config spells out
    every key)."""
    graph = data.get("graph")
    kind = graph.get("kind", GraphSection.kind) if isinstance(graph, dict) else GraphSection.kind
    if not isinstance(kind, str) or kind not in GRAPH_KINDS:
        return  # validate() names the unknown kind
    for ov in overrides:
        section, key, _ = parse_override(ov)
        kinds = GRAPH_KEY_KINDS.get(key) if section == "graph" else None
        if kinds and kind not in kinds:
            size = {
                "hypercube": "its size is 2^graph.dim",
                "grid": "its size is graph.rows x graph.cols",
                "torus": "its size is graph.rows x graph.cols",
                "edgelist": "its size is that of the file graph.path",
            }.get(kind, "its size is graph.nodes")
            raise ConfigError(
                f"{source}: --set {ov} changes nothing: graph.kind is {kind!r} ({size}); "
                f"graph.{key} is read only by {', '.join(kinds)} graphs (add e.g. "
                f"--set graph.kind={kinds[0]})"
            )


#: Keys that only some families read (``Family.own_keys``); None when not given.
FAMILY_KEYS = (
    "protocol.gamma",
    "protocol.lam",
    "protocol.users_per_round",
    "protocol.secure_aggregation",
    "model.l1",
)

MAX_NODES = 1 << 16  # the plan keeps dense n x n matrices
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def validate(cfg: Config) -> None:
    """Check the config's values (types were checked on load): the generic keys here, section
    by section in this order, the family's own keys by the family. Raise ConfigError naming
    the source and the key."""
    s = cfg.source
    _check_run(cfg, s)
    _check_graph(cfg, s)
    fam = _check_protocol(cfg, s)
    _check_data(cfg, s)
    _check_privacy(cfg, s, fam)
    _check_network(cfg, s)
    _check_protocol_keys_in_use(cfg, s, fam)


def _check_run(cfg: Config, s: str) -> None:
    r = cfg.run
    if not r.name or not set(r.name) <= NAME_CHARS or r.name.startswith("."):
        raise ConfigError(
            f"{s}: run.name {r.name!r} must be letters, digits, '-', '_' or '.' (it names the run "
            "directory), not starting with '.'"
        )
    if not 0 <= r.seed < 2**63:
        raise ConfigError(f"{s}: run.seed must be in 0..2^63-1, got {r.seed}")


def _check_graph(cfg: Config, s: str) -> None:
    """The graph's kind and size (the keys that depend on the protocol: _check_protocol)."""
    g = cfg.graph
    if g.kind not in GRAPH_KINDS:
        raise ConfigError(
            f"{s}: graph.kind {g.kind!r} unknown; choose one of {', '.join(GRAPH_KINDS)}"
        )
    if g.kind in SIZED_BY_NODES:
        positive_int(s, "graph.nodes", g.nodes, 3 if g.kind == "ring" else 2)
    if g.kind in ("grid", "torus"):
        positive_int(s, "graph.rows", g.rows)
        positive_int(s, "graph.cols", g.cols)
        if g.rows * g.cols < 2:
            raise ConfigError(f"{s}: a grid needs rows*cols >= 2")
        if g.kind == "torus" and min(g.rows, g.cols) < 3:
            raise ConfigError(
                f"{s}: a torus needs graph.rows and graph.cols >= 3 (got {g.rows}x{g.cols}); "
                "with 2 the wrap-around edge repeats an edge of the grid"
            )
    if g.kind == "hypercube":
        positive_int(s, "graph.dim", g.dim)
        if g.dim > 16:
            raise ConfigError(f"{s}: graph.dim {g.dim} is too large (2^dim nodes; at most 16)")
    if g.kind == "erdos_renyi" and (g.p is None or not 0 < g.p <= 1):
        raise ConfigError(f"{s}: graph.p must be in (0, 1] for erdos_renyi, got {g.p!r}")
    if g.kind == "geometric" and (g.radius is None or not g.radius > 0):
        raise ConfigError(f"{s}: graph.radius must be > 0 for geometric, got {g.radius!r}")
    if g.kind == "edgelist":
        if not g.path:
            raise ConfigError(f'{s}: graph.path is required for kind = "edgelist"')
        if not Path(g.path).is_file():
            raise ConfigError(f"{s}: graph.path {g.path} is not a file")
    if g.kind in SIZED_BY_NODES:
        if g.nodes > MAX_NODES:
            raise ConfigError(f"{s}: graph.nodes {g.nodes} is above the limit {MAX_NODES}")
    if g.kind in ("grid", "torus") and g.rows * g.cols > MAX_NODES:
        raise ConfigError(f"{s}: a {g.rows}x{g.cols} grid is above the limit of {MAX_NODES} nodes")
    if g.resample and g.kind not in RESAMPLE_KINDS:
        raise ConfigError(
            f"{s}: graph.resample draws a fresh random graph every round: graph.kind must be "
            f"one of {', '.join(RESAMPLE_KINDS)}, got {g.kind!r}"
        )


def _check_protocol(cfg: Config, s: str):
    """The protocol's name and generic keys, and the graph keys that depend on it (resampled
    and hidden graphs); returns its family."""
    g, pr = cfg.graph, cfg.protocol
    if pr.name not in catalog.ALL:
        raise ConfigError(
            f"{s}: protocol.name {pr.name!r} unknown; choose one of {', '.join(catalog.ALL)}"
        )
    fam = cfg.family
    if pr.weights not in WEIGHT_SCHEMES:
        raise ConfigError(
            f"{s}: protocol.weights {pr.weights!r} unknown; choose one of {', '.join(WEIGHT_SCHEMES)}"
        )
    int_or_auto(s, "protocol.steps", pr.steps, 100_000)
    if not pr.spread >= 0:
        raise ConfigError(f"{s}: protocol.spread must be >= 0")
    if not 0 <= pr.tick <= 3600:
        raise ConfigError(
            f"{s}: protocol.tick must be in [0, 3600] seconds per clock unit, got {pr.tick}"
        )
    if pr.tick and not fam.clocks:
        raise ConfigError(
            f"{s}: protocol.tick paces the Poisson clocks of randomized-gossip; protocol "
            f"{pr.name!r} has none (remove the key or set it to 0)"
        )
    if g.hidden and not (g.resample and g.kind == "erdos_renyi"):
        raise ConfigError(
            f"{s}: graph.hidden draws every round's Erdos-Renyi edges from pair secrets: it "
            'needs graph.resample = true and graph.kind = "erdos_renyi"'
        )
    if g.hidden and pr.weights != "lazy":
        raise ConfigError(
            f'{s}: graph.hidden needs protocol.weights = "lazy" (W_uv = 1/n): on a secret '
            f"graph a node knows only its own degree, not its neighbours' ({pr.weights!r} needs them)"
        )
    if g.resample and not fam.has_peers(cfg):
        raise ConfigError(
            f"{s}: graph.resample redraws the gossip graph every round; {pr.name} has no gossip"
        )
    return fam


def _check_data(cfg: Config, s: str) -> None:
    """The synthetic data's kind, size and magnitude (protocol.spread, which scales the
    initial values, bounded with them)."""
    d, pr = cfg.data, cfg.protocol
    if d.kind not in DATA_KINDS:
        raise ConfigError(
            f"{s}: data.kind {d.kind!r} unknown; choose one of {', '.join(DATA_KINDS)}"
        )
    positive_int(s, "data.dim", d.dim)
    if d.dim > 10_000_000:
        raise ConfigError(f"{s}: data.dim {d.dim} is too large")
    for key in ("low", "high", "mean", "scale"):
        if abs(getattr(d, key)) > 1e100:
            raise ConfigError(f"{s}: |data.{key}| must be at most 1e100")
    if pr.spread > 1e100:
        raise ConfigError(f"{s}: protocol.spread must be at most 1e100")
    if d.kind == "uniform" and not d.low < d.high:
        raise ConfigError(f"{s}: data.low must be < data.high")
    if d.kind == "gaussian" and not d.scale >= 0:
        raise ConfigError(f"{s}: data.scale must be >= 0")
    if d.kind == "bernoulli" and not 0 <= d.p <= 1:
        raise ConfigError(f"{s}: data.p must be in [0, 1]")


def _check_privacy(cfg: Config, s: str, fam) -> None:
    pv = cfg.privacy
    if not (1e-150 < pv.sigma < 1e150 or (pv.sigma == 0 and fam.accepts_no_noise(cfg))):
        raise ConfigError(
            f"{s}: privacy.sigma must be in (1e-150, 1e150), got {pv.sigma}"
            + (
                " (sigma = 0, plain gossip or D-GD without privacy, is accepted for protocols "
                f"{', '.join(catalog.NO_NOISE)} only, to demonstrate `cfree attack`)"
                if pv.sigma == 0
                else ""
            )
        )
    if pv.sensitivity is not None and not 1e-150 < pv.sensitivity < 1e150:
        raise ConfigError(
            f"{s}: privacy.sensitivity must be in (1e-150, 1e150), got {pv.sensitivity}"
        )
    if not 1 < pv.alpha <= 1e6:
        raise ConfigError(f"{s}: privacy.alpha must be in (1, 1e6] (a Rényi order), got {pv.alpha}")
    if not 0 < pv.delta < 1:
        raise ConfigError(f"{s}: privacy.delta must be in (0, 1), got {pv.delta}")


def _check_network(cfg: Config, s: str) -> None:
    nw = cfg.network
    if not 0 <= nw.base_port <= 65535:
        raise ConfigError(f"{s}: network.base_port must be in 0..65535")
    if not 0 < nw.deadline_s <= 3600:
        raise ConfigError(f"{s}: network.deadline_s must be in (0, 3600], got {nw.deadline_s}")
    if not 0 < nw.connect_timeout_s <= 3600:
        raise ConfigError(
            f"{s}: network.connect_timeout_s must be in (0, 3600], got {nw.connect_timeout_s}"
        )
    if not 1024 <= nw.max_frame_bytes <= 1 << 31:
        raise ConfigError(f"{s}: network.max_frame_bytes must be in 1024..2^31")
    from coordinator_free.net.channel import CIPHER_CHOICES

    if nw.cipher not in CIPHER_CHOICES:
        raise ConfigError(
            f"{s}: network.cipher must be one of {', '.join(CIPHER_CHOICES)}, got {nw.cipher!r}"
        )
    if not nw.host:
        raise ConfigError(f"{s}: network.host must not be empty")


def _check_protocol_keys_in_use(cfg: Config, s: str, fam) -> None:
    """privacy.eps0, then the keys only some protocols use, refused where they would be
    ignored; then the family's own keys and the declared faults against the protocol."""
    pr, pv = cfg.protocol, cfg.privacy
    if not 0 < pv.eps0 <= 50:
        raise ConfigError(f"{s}: privacy.eps0 must be in (0, 50], got {pv.eps0}")
    if not fam.correlated_noise and (pv.sigma_cor or pv.collusion):
        raise ConfigError(
            f"{s}: privacy.sigma_cor and privacy.collusion belong to protocol decor; protocol "
            f"{pr.name!r} has no correlated noise (remove them or set them to 0)"
        )
    if pv.unit is not None and pv.unit not in ("user", "record"):
        raise ConfigError(
            f"{s}: privacy.unit must be 'user' (one user's whole shard changes) or 'record' (one "
            f"record of one user), got {pv.unit!r}"
        )
    if pv.unit is not None and pv.unit not in fam.privacy_units(cfg):
        raise ConfigError(
            f"{s}: privacy.unit = {pv.unit!r}: protocol {pr.name!r} is accounted at "
            f"{' or '.join(fam.privacy_units(cfg))} level only (remove privacy.unit, or use "
            "protocol admm for record level)"
        )
    if pr.clipping != "example" and not fam.learns(cfg):
        raise ConfigError(
            f"{s}: protocol.clipping applies to the learning protocols "
            f"({', '.join(catalog.LEARNING_ALL)}) only"
        )
    for key in FAMILY_KEYS:
        section, name = key.split(".")
        if getattr(getattr(cfg, section), name) is not None and key not in fam.own_keys:
            raise ConfigError(
                f"{s}: {key} is read by the protocols {', '.join(catalog.ADMM)} only, not by "
                f"{pr.name!r} (remove it)"
            )
    fam.validate(cfg, s)
    if cfg.faults.inject:
        from coordinator_free import faults as faults_mod

        faults_mod.check(
            cfg.fault_plan,
            cfg.graph_n(),
            f"{s}: faults.inject",
            dropout_ok=fam.dropout(cfg),
            protocol=pr.name,
            peers=fam.has_peers(cfg),
        )
