"""``cfree keypair`` and ``cfree roster``: LAN deployment files."""

from __future__ import annotations


def cmd_lan(args) -> int:
    from coordinator_free.cluster import lan

    return lan.COMMANDS[args.command](args)
