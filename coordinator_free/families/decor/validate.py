"""DECOR's configuration keys."""

from __future__ import annotations

from coordinator_free.errors import ConfigError


def validate_decor(cfg, s: str) -> None:
    """DECOR's own keys: the correlated noise and the collusion level."""
    pv = cfg.privacy
    if not 0 <= pv.sigma_cor < 1e150:
        raise ConfigError(f"{s}: privacy.sigma_cor must be in [0, 1e150), got {pv.sigma_cor}")
    if cfg.graph.resample:
        raise ConfigError(
            f"{s}: decor keeps one pair secret per edge for the whole run: graph.resample is "
            "not supported (use a fixed graph)"
        )
    n = cfg.graph_n() if cfg.graph.kind != "edgelist" else None
    if isinstance(pv.collusion, bool) or not isinstance(pv.collusion, int) or pv.collusion < 0:
        raise ConfigError(
            f"{s}: privacy.collusion must be an integer >= 0 (0: an external eavesdropper, "
            f"1: curious users), got {pv.collusion!r}"
        )
    if n is not None and pv.collusion > n - 2:
        raise ConfigError(
            f"{s}: privacy.collusion {pv.collusion} leaves fewer than 2 honest nodes of {n}"
        )
