"""The keys of the averaging protocols (Muffliato and randomized gossip): one private value per
node."""

from __future__ import annotations

from coordinator_free.checks import (
    VALUE_KINDS,
    Need,
    check_memory,
    graph_keys,
    graph_needs,
    graph_size,
)
from coordinator_free.errors import ConfigError
from coordinator_free.families.catalog import LEARNING_ALL


def refuse_resample(cfg, s: str) -> None:
    """Per-round graphs are for the protocols with rounds."""
    if cfg.graph.resample:
        raise ConfigError(
            f"{s}: graph.resample draws a fresh graph every round of a learning protocol "
            f"({', '.join(LEARNING_ALL)}); protocol {cfg.protocol.name!r} has no rounds"
        )


def validate_values(cfg, s: str) -> None:
    pr, d, nw = cfg.protocol, cfg.data, cfg.network
    refuse_resample(cfg, s)
    if d.kind not in VALUE_KINDS:
        raise ConfigError(
            f"{s}: protocol {pr.name!r} averages one private value per node: data.kind must be "
            f"one of {', '.join(VALUE_KINDS)}, got {d.kind!r} (datasets are for the learning "
            f"protocols {', '.join(LEARNING_ALL)})"
        )
    # One value message carries dim float64 numbers plus a small envelope.
    need = 8 * d.dim + 4096
    if need > nw.max_frame_bytes:
        raise ConfigError(
            f"{s}: data.dim {d.dim} needs frames of about {need} bytes but "
            f"network.max_frame_bytes is {nw.max_frame_bytes}; raise it or lower data.dim"
        )
    check_memory(s, value_needs(cfg, s))


def value_needs(cfg, s: str) -> list:
    """What a gossip averaging plan allocates: the graph, its dense gossip matrix (with the
    eigenvalue workspace of its spectral gap and the exact accountant's Krylov basis; a
    Muffliato plan past ``graphs.DENSE_MAX_N`` nodes of a hypercube or ring keeps it sparse),
    the simulator's values
    of every node and, for randomized gossip, the exchange schedule."""
    from coordinator_free.graphs import DENSE_MAX_N, TRANSLATION_KINDS

    n, edges = graph_size(cfg, s)
    dim = cfg.data.dim
    if n > DENSE_MAX_N and not cfg.family.clocks and cfg.graph.kind in TRANSLATION_KINDS:
        # Muffliato past DENSE_MAX_N on a hypercube or ring: a sparse gossip matrix
        # (docs/benchmarks.md); what stays n x n is a plan's or an audit's all-pairs factors.
        needs = graph_needs(cfg, n, 1, "the pairwise loss factors; W itself is sparse", edges)
    else:
        needs = graph_needs(
            cfg, n, 4, "gossip matrix, eigenvalue workspace, accountant's Krylov basis", edges
        )
    needs.append(
        Need(
            32.0 * n * dim,
            f"{graph_keys(cfg.graph, n)}, data.dim = {dim}",
            f"the simulator's {n} x {dim} node values",
        )
    )
    steps = cfg.protocol.steps
    if cfg.family.clocks and isinstance(steps, int):
        needs.append(Need(200.0 * steps, f"protocol.steps = {steps}", "the exchange schedule"))
    return needs
