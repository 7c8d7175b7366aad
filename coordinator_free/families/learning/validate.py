"""The keys of the learning protocols (checked only when one of them is selected; DECOR and the
model-carrying token protocols check them too)."""

from __future__ import annotations

from pathlib import Path

from coordinator_free.checks import (
    CLIPPINGS,
    MODEL_KINDS,
    PARTITIONS,
    Need,
    check_memory,
    graph_keys,
    graph_needs,
    graph_size,
    int_or_auto,
)
from coordinator_free.errors import ConfigError
from coordinator_free.ml.datasets import DATASET_KINDS


def validate_learning(cfg, s: str, *, memory: bool = True) -> None:
    """Keys of the learning protocols (checked only when one of them is selected), then the
    memory the plan needs (``memory=False``: the caller checks it with its own needs)."""
    pr, d, m = cfg.protocol, cfg.data, cfg.model
    if d.kind not in DATASET_KINDS:
        raise ConfigError(
            f"{s}: protocol {pr.name!r} learns from a dataset: data.kind must be one of "
            f"{', '.join(DATASET_KINDS)}, got {d.kind!r}"
        )
    if not 1 <= pr.rounds <= 100_000:
        raise ConfigError(f"{s}: protocol.rounds must be in 1..100000, got {pr.rounds}")
    int_or_auto(s, "protocol.gossip_steps", pr.gossip_steps, 10_000)
    if not 0 < pr.step_size <= 1e6:
        raise ConfigError(f"{s}: protocol.step_size must be in (0, 1e6], got {pr.step_size}")
    if not 0 <= pr.batch_size <= 10_000_000:
        raise ConfigError(f"{s}: protocol.batch_size must be >= 0 (0: the whole local shard)")
    if pr.name == "muffliato-sgd" and pr.batch_size < 1:
        raise ConfigError(
            f"{s}: muffliato-sgd samples a minibatch every round: set protocol.batch_size >= 1 "
            "(or use muffliato-gd for full local gradients)"
        )
    if pr.name == "muffliato-gd" and pr.batch_size:
        raise ConfigError(
            f"{s}: muffliato-gd uses each node's whole shard every round; for minibatches of "
            f"protocol.batch_size = {pr.batch_size} use muffliato-sgd (or leave batch_size at 0)"
        )
    if cfg.graph.hidden:
        if pr.name in ("decor", "central-dp"):
            raise ConfigError(
                f"{s}: graph.hidden is for the gossip learning protocols (muffliato-gd, "
                f"muffliato-sgd, dsgd), not {pr.name}"
            )
        if pr.name != "dsgd" and (pr.accelerated or pr.gossip_steps == "auto"):
            raise ConfigError(
                f"{s}: graph.hidden: nobody knows the rounds' spectral gap, so set "
                "protocol.accelerated = false and protocol.gossip_steps to a number"
            )
    if not 0 < pr.clip < 1e150:
        raise ConfigError(f"{s}: protocol.clip must be > 0 (the per-example L2 clipping norm C)")
    if pr.clipping not in CLIPPINGS:
        raise ConfigError(
            f"{s}: protocol.clipping {pr.clipping!r} unknown; choose one of {', '.join(CLIPPINGS)} "
            "(clip every example's gradient, or the batch's mean gradient)"
        )
    if d.kind == "quadratic" and d.partition != "ordered":
        raise ConfigError(
            f'{s}: data.kind = "quadratic" gives node v its own quadratic (rows v*dim..): set '
            f'data.partition = "ordered" (got {d.partition!r})'
        )
    if d.kind in ("csv", "libsvm"):
        if not d.path:
            raise ConfigError(f'{s}: data.path is required for data.kind = "{d.kind}"')
        if not Path(d.path).is_file():
            raise ConfigError(f"{s}: data.path {d.path} is not a file")
    if not 2 <= d.samples <= 10_000_000:
        raise ConfigError(f"{s}: data.samples must be in 2..10000000, got {d.samples}")
    if not 1 <= d.features <= 100_000:
        raise ConfigError(f"{s}: data.features must be in 1..100000, got {d.features}")
    if not 0 <= d.label_noise <= 1e6:
        raise ConfigError(f"{s}: data.label_noise must be >= 0, got {d.label_noise}")
    if not 0 < d.test_fraction < 1:
        raise ConfigError(f"{s}: data.test_fraction must be in (0, 1), got {d.test_fraction}")
    if d.task not in ("classification", "regression"):
        raise ConfigError(
            f'{s}: data.task must be "classification" or "regression", got {d.task!r}'
        )
    if d.partition not in PARTITIONS:
        raise ConfigError(
            f"{s}: data.partition {d.partition!r} unknown; choose one of {', '.join(PARTITIONS)}"
        )
    if not 0 < d.beta < 1e6:
        raise ConfigError(f"{s}: data.beta (Dirichlet concentration) must be > 0, got {d.beta}")
    if d.partition == "fixed":
        if d.per_node is None or d.per_node < 1:
            raise ConfigError(
                f'{s}: data.partition = "fixed" needs data.per_node >= 1 (points per node)'
            )
    if m.kind not in MODEL_KINDS:
        raise ConfigError(
            f"{s}: model.kind {m.kind!r} unknown; choose one of {', '.join(MODEL_KINDS)}"
        )
    if not 0 <= m.l2 < 1e6:
        raise ConfigError(f"{s}: model.l2 must be >= 0, got {m.l2}")
    if m.kind == "ridge" and m.l2 <= 0:
        raise ConfigError(f'{s}: model.kind = "ridge" needs model.l2 > 0')
    if m.init is not None and not abs(m.init) <= 1e6:
        raise ConfigError(f"{s}: model.init must be a number in [-1e6, 1e6], got {m.init}")
    if memory:
        check_memory(s, learning_needs(cfg, s))


#: Model parameters of the bundled scikit-learn datasets (features + intercept, x classes
#: above 2) and their size in float64 values (examples x features).
_SKLEARN = {"breast_cancer": (31, 569 * 30), "digits": (650, 1797 * 64), "wine": (42, 178 * 13)}


def dataset_needs(cfg, s: str, n: int) -> tuple[list[Need], int]:
    """The dataset's allocations (raw, split, standardised and normalised copies) and the
    model's number of parameters (0 when only the file tells)."""
    d = cfg.data
    if d.kind == "quadratic":
        k = f"data.features = {d.features}, {graph_keys(cfg.graph, n)}"
        rows = float(n) * d.features
        what = f"the quadratic task's {rows:.3g} x {d.features} design matrix and its copies"
        return [Need(24.0 * rows * d.features, k, what)], d.features
    if d.kind in ("synthetic-logistic", "synthetic-lstsq", "synthetic-sparse"):
        k = f"data.samples = {d.samples}, data.features = {d.features}"
        what = f"the {d.samples} x {d.features} synthetic dataset and its copies"
        # synthetic-sparse is used without an intercept column
        extra = 0 if d.kind == "synthetic-sparse" else 1
        return [Need(32.0 * d.samples * d.features, k, what)], d.features + extra
    if d.kind in _SKLEARN:
        dim, values = _SKLEARN[d.kind]
        return [Need(32.0 * values, f"data.kind = {d.kind}", "the dataset")], dim
    # csv / libsvm: about 8 bytes of values per byte of text, in a few copies
    try:
        size = Path(d.path).stat().st_size if d.path else 0
    except OSError:
        size = 0
    return [Need(32.0 * size, f"data.path = {d.path}", "the dataset read from the file")], 0


def learning_needs(cfg, s: str) -> list[Need]:
    """What a learning plan allocates: the graph and its dense matrices (per round with
    graph.resample), the dataset, the multi-round accountant's matrices (gossip learning) and
    every node's model after every round (the simulator keeps them all, twice)."""
    n, edges = graph_size(cfg, s)
    pr = cfg.protocol
    decor = cfg.family.correlated_noise
    what = "gossip matrix, eigenvalue workspace, accountant's basis"
    if decor:
        what += ", the accountant's Laplacian eigendecomposition"
    needs = graph_needs(cfg, n, 6 if decor else 4, what, edges)
    if cfg.graph.resample:
        g = graph_needs(cfg, n, 1, "", edges)
        needs.append(
            Need(
                pr.rounds * sum(x.nbytes for x in g),
                f"protocol.rounds = {pr.rounds}, {graph_keys(cfg.graph, n)} (graph.resample)",
                f"a graph and a dense gossip matrix for each of {pr.rounds} rounds",
            )
        )
    data, dim = dataset_needs(cfg, s, n)
    needs += data
    if not decor and pr.name != "central-dp":
        needs.append(multiround_need(cfg, n))
    needs.append(
        Need(
            16.0 * (pr.rounds + 1) * n * dim,
            f"protocol.rounds = {pr.rounds}, {graph_keys(cfg.graph, n)}, {dim} model parameters",
            f"every node's model after each of {pr.rounds} rounds",
        )
    )
    return needs


def multiround_need(cfg, n: int) -> Need:
    """The joint multi-round accountant of one observer (privacy/multiround.py, the Kalman
    path), what a plan or an audit of muffliato-gd/sgd or dsgd holds at once: the n x R x R
    information matrices Q (8 n R^2 bytes, the term that grows fastest), an R x R
    eigendecomposition workspace, and per round its D x D transition, closed loop and backward
    information and D x n sensitivities (D <= n)."""
    R = cfg.protocol.rounds
    nbytes = 8.0 * n * R**2 + 24.0 * R**2 + 8.0 * 4 * R * n**2
    return Need(
        nbytes,
        f"protocol.rounds = {R}, {graph_keys(cfg.graph, n)}",
        f"the multi-round accountant's {n} x {R} x {R} information matrices of one observer",
    )
