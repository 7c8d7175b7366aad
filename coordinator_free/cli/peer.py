"""`cfree peer`: run one node. The command lives with the peer (``peer/command.py``) so that
the fork server, below the command line, can run it too."""

from __future__ import annotations

from coordinator_free.peer.command import add_parser, cmd_peer

__all__ = ["add_parser", "cmd_peer"]
