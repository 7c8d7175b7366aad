"""`cfree keypair` and `cfree roster`: deploying peers on LAN hosts (the work is in
:mod:`coordinator_free.cluster.lan`, which also declares their arguments)."""

from __future__ import annotations


def add_parser(sub) -> None:
    from coordinator_free.cluster import lan

    lan.add_parsers(sub)


def cmd_lan(args) -> int:
    from coordinator_free.cluster import lan

    return lan.COMMANDS[args.command](args)
