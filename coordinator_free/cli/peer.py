"""``cfree peer``: run one node (what every launcher starts)."""

from __future__ import annotations


def cmd_peer(args) -> int:
    from coordinator_free.peer.runner import peer_main

    return peer_main(args)
