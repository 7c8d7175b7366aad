"""The keys of the private-ADMM protocols (checked only when one of them is selected)."""

from __future__ import annotations

from coordinator_free.checks import (
    Need,
    check_memory,
    graph_keys,
    graph_needs,
    graph_size,
    int_or_auto,
)
from coordinator_free.errors import ConfigError
from coordinator_free.families.admm.protocol import ADMM_MODELS, DEFAULT_GAMMA, DEFAULT_LAM
from coordinator_free.families.learning.validate import dataset_needs

#: Dataset kinds the ADMM protocols learn from, by loss.
LSTSQ_DATA = ("synthetic-sparse", "synthetic-lstsq", "quadratic", "csv", "libsvm")
LOGISTIC_DATA = ("synthetic-logistic", "breast_cancer", "csv", "libsvm")


def validate_admm(cfg, s: str) -> None:
    """Keys of admm, admm-central, admm-federated and prox-sgd; ConfigError names the source
    and the key."""
    from coordinator_free.ml.datasets import DATASET_KINDS

    pr, d, m, g = cfg.protocol, cfg.data, cfg.model, cfg.graph
    gamma = DEFAULT_GAMMA if pr.gamma is None else pr.gamma
    lam = DEFAULT_LAM if pr.lam is None else pr.lam
    if pr.name == "prox-sgd":
        for key in ("gamma", "lam", "users_per_round", "secure_aggregation"):
            if getattr(pr, key) is not None:
                raise ConfigError(
                    f"{s}: protocol.{key} is an ADMM key; prox-sgd is proximal SGD (its step is "
                    "protocol.step_size; remove protocol." + key + ")"
                )
    if not 0 < gamma <= 1e6:
        raise ConfigError(f"{s}: protocol.gamma must be in (0, 1e6] (the prox step), got {gamma}")
    if not 0 < lam <= 1:
        raise ConfigError(
            f"{s}: protocol.lam must be in (0, 1] (the relaxation lambda of u <- u + 2 lam "
            f"(x - z + eta/2); 1/2 is plain Douglas-Rachford), got {lam}"
        )
    if not 0 < pr.clip < 1e150:
        raise ConfigError(
            f"{s}: protocol.clip must be > 0 (the Lipschitz bound L of a user's loss: its "
            f"records' derivatives are clamped so that their gradients are clipped to it), got {pr.clip}"
        )
    if pr.name != "admm-federated":
        for key in ("users_per_round", "secure_aggregation"):
            if getattr(pr, key) is not None:
                raise ConfigError(
                    f"{s}: protocol.{key} belongs to admm-federated (users sampled per round), "
                    f"not {pr.name!r} (remove it)"
                )
    if pr.users_per_round is not None and not 1 <= pr.users_per_round <= cfg.graph_n():
        raise ConfigError(
            f"{s}: protocol.users_per_round must be in 1..{cfg.graph_n()} (the users, "
            f"graph nodes), got {pr.users_per_round}"
        )
    if cfg.privacy.sensitivity is not None:
        raise ConfigError(
            f"{s}: privacy.sensitivity: the ADMM protocols derive it (4 gamma L; prox-sgd: 2, "
            "its sigma being a noise multiplier); remove it"
        )
    if m.kind not in ADMM_MODELS:
        raise ConfigError(
            f"{s}: model.kind {m.kind!r}: protocol {pr.name!r} minimises a loss plus a "
            f"regulariser; choose one of {', '.join(ADMM_MODELS)} (lasso: least squares + "
            "model.l1 |x|_1; ridge: least squares + model.l2/2 |x|^2; logistic: logistic loss + "
            "model.l1 or model.l2)"
        )
    l1 = m.l1 or 0.0
    if not 0 <= l1 < 1e6:
        raise ConfigError(f"{s}: model.l1 must be in [0, 1e6), got {l1}")
    if not 0 <= m.l2 < 1e6:
        raise ConfigError(f"{s}: model.l2 must be in [0, 1e6), got {m.l2}")
    if m.kind == "lasso" and (l1 <= 0 or m.l2):
        raise ConfigError(
            f'{s}: model.kind = "lasso" needs model.l1 > 0 and no model.l2 (got l1 = {l1}, '
            f"l2 = {m.l2})"
        )
    if m.kind == "ridge" and (m.l2 <= 0 or l1):
        raise ConfigError(
            f'{s}: model.kind = "ridge" needs model.l2 > 0 and no model.l1 (got l1 = {l1}, '
            f"l2 = {m.l2})"
        )
    if m.kind == "logistic" and l1 and m.l2:
        raise ConfigError(
            f'{s}: model.kind = "logistic" takes one regulariser: model.l1 or model.l2, not both'
        )
    if m.init is not None:
        raise ConfigError(
            f"{s}: model.init: the ADMM protocols start from u_i = 0 (z = 0); remove it"
        )
    if d.kind not in DATASET_KINDS:
        raise ConfigError(
            f"{s}: protocol {pr.name!r} learns from a dataset: data.kind must be one of "
            f"{', '.join(DATASET_KINDS)}, got {d.kind!r}"
        )
    fits = LSTSQ_DATA if m.kind in ("lasso", "ridge") else LOGISTIC_DATA
    if d.kind not in fits:
        raise ConfigError(
            f"{s}: data.kind {d.kind!r} does not fit model.kind {m.kind!r}; choose one of "
            f"{', '.join(fits)}"
        )
    if not 0 <= pr.batch_size <= 10_000_000:
        raise ConfigError(f"{s}: protocol.batch_size must be >= 0 (0: the whole local shard)")
    if pr.name == "prox-sgd":
        if not 1 <= pr.rounds <= 1_000_000:
            raise ConfigError(f"{s}: protocol.rounds must be in 1..1000000, got {pr.rounds}")
        if not 0 < pr.step_size <= 1e6:
            raise ConfigError(f"{s}: protocol.step_size must be in (0, 1e6], got {pr.step_size}")
    elif pr.name != "admm":
        if not 1 <= pr.rounds <= 1_000_000:
            raise ConfigError(f"{s}: protocol.rounds must be in 1..1000000, got {pr.rounds}")
    if pr.name == "admm":
        int_or_auto(s, "protocol.hops", pr.hops, 1_000_000)
        if not 1 <= pr.tokens <= 64:
            raise ConfigError(f"{s}: protocol.tokens must be in 1..64, got {pr.tokens}")
        if pr.cap:
            raise ConfigError(
                f"{s}: protocol.cap: every visit of the ADMM token is a contribution of its "
                "holder (K_i, counted by the accountant); admm has no cap (remove it)"
            )
    elif pr.hops != "auto" or pr.tokens != 1 or pr.cap:
        raise ConfigError(
            f"{s}: protocol.hops, protocol.tokens and protocol.cap are the token walk's keys; "
            f"{pr.name} runs in one process for protocol.rounds iterations (remove them)"
        )
    if g.resample:
        raise ConfigError(
            f"{s}: graph.resample is for the gossip learning protocols, not {pr.name}"
        )
    if pr.distributed_noise:
        raise ConfigError(f"{s}: protocol.distributed_noise is ring-sum's, not {pr.name!r}'s")
    check_memory(s, admm_needs(cfg, s))


def admm_needs(cfg, s: str) -> list[Need]:
    """What an ADMM plan allocates: the graph and its transition matrix, the dataset, a record
    and a model per hop of every token (the simulator keeps z_hat after every step)."""
    pr = cfg.protocol
    n, edges = graph_size(cfg, s)
    needs = graph_needs(cfg, n, 3, "transition matrix and its workspace", edges)
    data, dim = dataset_needs(cfg, s, n)
    needs += data
    hops = (10 * n if pr.hops == "auto" else int(pr.hops)) if pr.name == "admm" else pr.rounds
    needs.append(
        Need(
            (200.0 + 8.0 * max(dim, 1)) * hops * pr.tokens,
            f"protocol.hops = {pr.hops}, {graph_keys(cfg.graph, n)}, protocol.tokens = {pr.tokens}",
            f"a record and the model after each of {hops} steps of {pr.tokens} token(s)",
        )
    )
    return needs
