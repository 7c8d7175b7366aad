"""The keys of the token-forwarding protocols."""

from __future__ import annotations

from coordinator_free.checks import (
    VALUE_KINDS,
    Need,
    check_memory,
    graph_keys,
    graph_needs,
    graph_size,
    int_or_auto,
)
from coordinator_free.errors import ConfigError
from coordinator_free.families.learning.validate import dataset_needs, validate_learning

#: The graph each token protocol runs on (walk-sgd: any connected graph).
WALK_GRAPH = {
    "ring-sum": "ring",
    "ring-histogram": "ring",
    "complete-sum": "complete",
    "complete-histogram": "complete",
    "complete-sgd": "complete",
}


def validate_walk(cfg, s: str) -> None:
    """Keys of the token-forwarding protocols (checked only when one of them is selected)."""
    pr, d, g = cfg.protocol, cfg.data, cfg.graph
    need_graph = WALK_GRAPH.get(pr.name)
    if need_graph and g.kind != need_graph:
        raise ConfigError(
            f'{s}: protocol {pr.name!r} runs on graph.kind = "{need_graph}", got {g.kind!r} '
            "(random-walk DP-SGD on any graph is walk-sgd)"
        )
    if not 1 <= pr.cycles <= 10_000:
        raise ConfigError(f"{s}: protocol.cycles must be in 1..10000, got {pr.cycles}")
    int_or_auto(s, "protocol.hops", pr.hops, 1_000_000)
    if pr.name.startswith("ring-") and pr.hops != "auto":
        raise ConfigError(
            f"{s}: a ring token makes protocol.cycles turns of n hops; protocol.hops is for the "
            "complete-graph and walk-sgd protocols (remove it)"
        )
    if not 1 <= pr.tokens <= 64:
        raise ConfigError(f"{s}: protocol.tokens must be in 1..64, got {pr.tokens}")
    if not 0 <= pr.cap <= 1_000_000:
        raise ConfigError(f"{s}: protocol.cap must be in 0..1000000 (0: no cap), got {pr.cap}")
    if pr.name == "walk-sgd" and pr.cap < 1:
        raise ConfigError(
            f"{s}: walk-sgd needs protocol.cap >= 1: Theorem 3 of the random-walk paper bounds "
            "the loss per contribution, so each node's number of contributions must be bounded "
            "(the papers' experiments use about 1.25 x hops / n)"
        )
    if pr.name.startswith("ring-") and pr.cap:
        raise ConfigError(
            f"{s}: on the ring every node contributes exactly once per cycle; protocol.cap is for "
            "the complete-graph and walk-sgd protocols"
        )
    if pr.distributed_noise and pr.name != "ring-sum":
        raise ConfigError(
            f"{s}: protocol.distributed_noise is ring-sum's Remark 1 variant; protocol "
            f"{pr.name!r} has no such option"
        )
    if g.resample:
        raise ConfigError(f"{s}: graph.resample is for the learning protocols, not {pr.name!r}")
    if pr.name.endswith("-sum"):
        if d.kind not in VALUE_KINDS:
            raise ConfigError(
                f"{s}: protocol {pr.name!r} sums private values: data.kind must be one of "
                f"{', '.join(VALUE_KINDS)}, got {d.kind!r}"
            )
        need = 8 * d.dim + 4096
    elif pr.name.endswith("-histogram"):
        if d.kind != "categorical":
            raise ConfigError(
                f'{s}: protocol {pr.name!r} counts categories: data.kind must be "categorical", '
                f"got {d.kind!r}"
            )
        if not 2 <= d.levels <= 1_000_000:
            raise ConfigError(f"{s}: data.levels must be in 2..1000000, got {d.levels}")
        need = 8 * d.levels + 4096
    else:
        validate_learning(cfg, s, memory=False)
        need = 0
    if need > cfg.network.max_frame_bytes:
        raise ConfigError(
            f"{s}: a token needs frames of about {need} bytes but network.max_frame_bytes is "
            f"{cfg.network.max_frame_bytes}; raise it"
        )
    check_memory(s, walk_needs(cfg, s))


def walk_needs(cfg, s: str) -> list[Need]:
    """What a token plan allocates: the graph and its dense transition matrix (walk-sgd: the
    gossip matrix and its eigenvalues), the tokens' values, a record per hop of every token
    and, for walk-sgd, the dataset."""
    pr, d = cfg.protocol, cfg.data
    n, edges = graph_size(cfg, s)
    sgd = pr.name not in WALK_GRAPH or pr.name == "complete-sgd"
    needs = graph_needs(cfg, n, 3 if sgd else 2, "transition matrix and its workspace", edges)
    if sgd:
        data, dim = dataset_needs(cfg, s, n)
        needs += data
    else:
        dim = d.levels if pr.name.endswith("-histogram") else d.dim
    hops = (
        pr.cycles * n
        if pr.name.startswith("ring-")
        else (10 * n if pr.hops == "auto" else int(pr.hops))
    )
    hop_keys = (
        f"protocol.cycles = {pr.cycles}, {graph_keys(cfg.graph, n)}"
        if pr.name.startswith("ring-")
        else f"protocol.hops = {pr.hops}, {graph_keys(cfg.graph, n)}"
    )
    needs.append(
        Need(
            200.0 * hops * pr.tokens,
            f"{hop_keys}, protocol.tokens = {pr.tokens}",
            f"a record for each of {hops} hops of {pr.tokens} token(s)",
        )
    )
    needs.append(
        Need(
            32.0 * pr.tokens * max(dim, 1),
            f"protocol.tokens = {pr.tokens}, {dim} values per token",
            "the tokens' values",
        )
    )
    return needs
