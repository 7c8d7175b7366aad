"""Small checks shared by the config layer and the families' own key checks (a leaf module: it
imports nothing that imports the config, so families can validate their keys without an import
cycle). Every check raises ConfigError naming the source and the key."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from coordinator_free.errors import ConfigError
from coordinator_free.graphs import GraphError, read_edgelist

#: Per-node private values for averaging and sums.
VALUE_KINDS = ("uniform", "gaussian", "bernoulli")
#: Per-node categorical values for the histogram protocols.
CATEGORY_KINDS = ("categorical",)
PARTITIONS = ("iid", "dirichlet", "fixed", "ordered")
MODEL_KINDS = ("auto", "logistic", "multinomial", "least-squares", "ridge")
CLIPPINGS = ("example", "batch")


def positive_int(source: str, key: str, v: Any, minimum: int = 1) -> None:
    if v is None or v < minimum:
        raise ConfigError(f"{source}: {key} must be an integer >= {minimum}, got {v!r}")


def int_or_auto(source: str, key: str, v: int | str, maximum: int) -> None:
    """A count in 1..maximum, or the word "auto"."""
    if isinstance(v, str):
        if v != "auto":
            raise ConfigError(f'{source}: {key} must be a positive integer or "auto", got {v!r}')
    elif not 1 <= v <= maximum:
        raise ConfigError(f"{source}: {key} must be in 1..{maximum}, got {v}")


# ------------------------------------------------------------------------------ memory bound

#: The default bound on what one process of a run (the planner, the simulator, the auditor, a
#: peer) may need, in GiB; the environment variable raises or lowers it.
MEMORY_LIMIT_GIB = 4.0
MEMORY_ENV = "CFREE_MEMORY_LIMIT_GIB"
GIB = float(1 << 30)
#: Bytes per edge and per node of a networkx graph (dict of dicts), measured.
GRAPH_EDGE_BYTES = 150
GRAPH_NODE_BYTES = 500


@dataclass(frozen=True)
class Need:
    """One allocation of a plan: about ``nbytes``, driven by ``keys`` (``"graph.nodes = 8"``),
    described by ``what``."""

    nbytes: float
    keys: str
    what: str


def memory_limit_bytes() -> float:
    """The memory limit in bytes: ``CFREE_MEMORY_LIMIT_GIB`` if set, else the default."""
    raw = os.environ.get(MEMORY_ENV)
    if raw is None or raw.strip() == "":
        return MEMORY_LIMIT_GIB * GIB
    try:
        gib = float(raw)
    except ValueError:
        gib = math.nan
    if not (math.isfinite(gib) and gib > 0):
        raise ConfigError(
            f"environment variable {MEMORY_ENV} must be a positive number of GiB, got {raw!r}"
        )
    return gib * GIB


def human_bytes(n: float) -> str:
    for unit, size in (("TiB", GIB * 1024), ("GiB", GIB), ("MiB", float(1 << 20))):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n / 1024:.3g} KiB"


def check_memory(source: str, needs: list[Need]) -> None:
    """Refuse a plan whose allocations add up to more than the memory limit, naming the keys
    that drive the largest ones and the estimate."""
    limit = memory_limit_bytes()
    total = float(sum(x.nbytes for x in needs))
    if total <= limit:
        return
    big = sorted((x for x in needs if x.nbytes >= 0.1 * total), key=lambda x: -x.nbytes)
    keys = list(dict.fromkeys(x.keys for x in big))
    parts = "; ".join(f"{human_bytes(x.nbytes)} for {x.what}" for x in big)
    raise ConfigError(
        f"{source}: {'; '.join(keys)}: the plan needs about {human_bytes(total)} ({parts}), "
        f"over the {human_bytes(limit)} limit (lower these keys, or set the environment "
        f"variable {MEMORY_ENV} to raise the limit; see docs/config.md)"
    )


def graph_keys(g: Any, n: int) -> str:
    """The config keys that set the number of nodes (and edges) of the graph."""
    if g.kind in ("grid", "torus"):
        return f"graph.rows = {g.rows}, graph.cols = {g.cols}"
    if g.kind == "hypercube":
        return f"graph.dim = {g.dim}"
    if g.kind == "edgelist":
        return f"graph.path = {g.path} ({n} nodes)"
    return f"graph.nodes = {n}"


def graph_edges(g: Any, n: int) -> float:
    """About how many edges the config's graph has (expected, for the random kinds)."""
    pairs = n * (n - 1) / 2
    if g.kind in ("ring", "torus"):
        return float(n if g.kind == "ring" else 2 * n)
    if g.kind in ("path", "star"):
        return float(n - 1)
    if g.kind == "grid":
        return float(2 * n)
    if g.kind == "hypercube":
        return float(g.dim * n / 2)
    if g.kind == "complete":
        return pairs
    if g.kind == "erdos_renyi":
        return pairs * float(g.p or 1.0)
    if g.kind == "geometric":
        return pairs * min(1.0, math.pi * float(g.radius or 1.0) ** 2)
    return pairs  # an edge list: counted by the caller


def graph_needs(cfg: Any, n: int, dense: int, what: str, edges: float | None = None) -> list[Need]:
    """The graph (networkx) and ``dense`` n x n float64 matrices alive at once (``what`` says
    which)."""
    keys = graph_keys(cfg.graph, n)
    e = graph_edges(cfg.graph, n) if edges is None else edges
    return [
        Need(
            GRAPH_EDGE_BYTES * e + GRAPH_NODE_BYTES * n,
            keys,
            f"the graph's adjacency ({e:.3g} edges)",
        ),
        Need(8.0 * dense * n * n, keys, f"{dense} dense {n} x {n} matrices ({what})"),
    ]


def graph_size(cfg: Any, source: str) -> tuple[int, float | None]:
    """(nodes, edges) of the config's graph: the edge list's counted (it is read), else nodes
    from the keys and edges None (estimated by :func:`graph_edges`)."""
    if cfg.graph.kind == "edgelist":
        try:
            g = read_edgelist(cfg.graph.path)
        except GraphError as exc:
            raise ConfigError(f"{source}: graph.path: {exc}") from None
        return g.number_of_nodes(), float(g.number_of_edges())
    return int(cfg.graph_n()), None
