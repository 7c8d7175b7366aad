"""Protocol families and their registry.

``family_of(protocol_name)`` returns the :class:`~coordinator_free.families.base.Family` serving
that protocol; everything outside this package reaches a protocol only through it.
"""

from __future__ import annotations

import dataclasses

from coordinator_free.families.base import Family

_REGISTRY: dict[str, Family] = {}
_FAMILIES: list[Family] = []


class UnknownProtocol(KeyError):
    def __str__(self) -> str:
        return f"unknown protocol {self.args[0]!r}; choose one of {', '.join(protocol_names())}"


def register(family: Family) -> Family:
    """Register a family for its protocol names (each name at most once)."""
    for name in family.protocols:
        if name in _REGISTRY:
            raise ValueError(f"protocol {name!r} is registered twice")
        _REGISTRY[name] = family
    _FAMILIES.append(family)
    return family


def family_of(protocol_name: str) -> Family:
    _load()
    try:
        return _REGISTRY[protocol_name]
    except KeyError:
        raise UnknownProtocol(protocol_name) from None


def families() -> list[Family]:
    _load()
    return list(_FAMILIES)


def protocol_names() -> tuple[str, ...]:
    """Every registered protocol name, family by family in registration order."""
    _load()
    return tuple(n for f in _FAMILIES for n in f.protocols)


def make_plan(cfg):
    """The public plan of a run, made by the protocol's family."""
    return family_of(cfg.protocol.name).make_plan(cfg)


#: The plan :func:`share_plan` made, with the config it was made from.
_shared: tuple[object, object] | None = None


def share_plan(cfg):
    """Make the plan of ``cfg`` and keep it for :func:`shared_plan`. The fork server does this
    before it forks a run's peers: each peer then reads the one plan through pages it shares
    with the server and its siblings (copy-on-write) instead of making its own (at 1024 nodes
    a dense 8 MiB gossip matrix, and the eigenvalue work of its spectral gap, per peer)."""
    global _shared
    plan = make_plan(cfg)
    _shared = (cfg, plan)
    return plan


def shared_plan(cfg):
    """The plan :func:`share_plan` made, when it was made from a config equal to ``cfg`` in
    every key (where either was read from does not matter: a plan is a function of the keys
    alone); None otherwise."""
    if _shared is None:
        return None
    made_from, plan = _shared
    same = all(
        getattr(made_from, f.name) == getattr(cfg, f.name)
        for f in dataclasses.fields(cfg)
        if f.name != "source"
    )
    return plan if same else None


_loaded = False


def _load() -> None:
    # The family packages import numpy, networkx and their math: load them on first use so that
    # light commands (and config parsing) stay cheap.
    global _loaded
    if _loaded:
        return
    _loaded = True
    from coordinator_free.families import admm, averaging, decor, learning, randomized, walk

    for mod in (averaging, randomized, learning, decor, walk, admm):
        register(mod.FAMILY)
