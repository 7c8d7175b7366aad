"""Helpers of the transport and liveness tests: a free loopback port, waiting on a condition
with a deadline, the next transport event of a kind."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

from coordinator_free.net.transport import PeerNet


def bound_socket() -> socket.socket:
    """A socket bound to a free loopback port, not yet listening (connects are refused)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock


async def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached within the deadline")
        await asyncio.sleep(0.005)


async def next_of(net: PeerNet, kind: type, timeout: float = 5.0):
    """The next event of type ``kind`` (others are returned too if they come first: fail)."""
    ev = await net.next_event(timeout)
    assert isinstance(ev, kind), f"node {net.node_id}: expected {kind.__name__}, got {ev!r}"
    return ev
