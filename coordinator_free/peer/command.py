"""`cfree peer`: run one node (what the launchers start per node, or fork per node from the
fork server): its arguments and its entry point."""

from __future__ import annotations

import argparse
from pathlib import Path

from coordinator_free.helptext import examples


def add_parser(sub) -> None:
    p = sub.add_parser(
        "peer",
        help="run ONE node (what `cfree run` starts per node; use it on LAN hosts or containers)",
        description="Run a single peer: load its private key, dial its graph neighbours from the "
        "roster, run the protocol and write its view log and result under --out.",
        **examples(
            "cfree keygen --hosts 127.0.0.1:7311,127.0.0.1:7312 --out /tmp/two",
            "S='--config examples/muffliato-ring.toml --set graph.kind=complete --set "
            "graph.nodes=2 --roster /tmp/two/roster.json --out /tmp/two'",
            "cfree peer $S --key /tmp/two/keys/node-0.key --id 0 & "
            "cfree peer $S --key /tmp/two/keys/node-1.key --id 1; wait",
        ),
    )
    p.add_argument("--config", required=True, help="experiment config (TOML)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--roster", required=True, type=Path, help="public roster (roster.json)")
    p.add_argument("--key", required=True, type=Path, help="this node's private key file")
    p.add_argument("--id", required=True, type=int, help="this node's id in the roster")
    p.add_argument("--out", required=True, type=Path, help="run directory for logs/ and results/")
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="bind this address instead of the roster's (e.g. 0.0.0.0:7000 in a container or "
        "behind NAT, where the roster lists the name others dial)",
    )
    p.add_argument("--listen-fd", type=int, help="inherited listening socket (set by the launcher)")
    p.add_argument("--progress-fd", type=int, help="write JSON-lines progress events to this fd")
    p.add_argument(
        "--start-fd",
        type=int,
        metavar="FD",
        help="the local launcher's start signal: end-of-file on this inherited descriptor once "
        "every peer of the run has connected. The connect timeout counts, and the first step "
        "waits, from then",
    )
    p.add_argument(
        "--progress-every",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="write at most one step event per SECONDS (the last step always; other events as "
        "they come); 0, the default, writes every event, as the local launcher needs. The peer "
        "image uses 5: a container's output stays readable",
    )
    p.add_argument(
        "--ship-to",
        type=Path,
        metavar="COLLECTOR.json",
        help="once the run has ended, send this node's view log and result to the auditor's "
        "collector described there (address, port, public key), over an authenticated "
        "channel, for deployments whose nodes do not share a disk",
    )
    p.add_argument("-v", "--verbose", action="store_true")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 <= value <= 86400:
        raise argparse.ArgumentTypeError(f"expected 0..86400 seconds, got {text}")
    return value


def cmd_peer(args) -> int:
    from coordinator_free.peer.runner import peer_main

    return peer_main(args)
