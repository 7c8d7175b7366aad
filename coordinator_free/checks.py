"""Small checks shared by the config layer and the families' own key checks (a leaf module: it
imports nothing that imports the config, so families can validate their keys without an import
cycle). Every check raises ConfigError naming the source and the key."""

from __future__ import annotations

from typing import Any

from coordinator_free.errors import ConfigError

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
