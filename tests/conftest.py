"""Fixtures shared by several test modules (helpers shared as plain functions and constants
live in the helper modules beside the tests: ci.py, netnslab.py, memcases.py, ...)."""

from __future__ import annotations

import shutil

import pytest
from ci import unavailable
from netnslab import why_no_netns


@pytest.fixture
def _netns_available() -> None:
    """Network namespaces can be made here (root and iproute2's `ip`)."""
    unavailable(why_no_netns())


@pytest.fixture
def _ip_available() -> None:
    unavailable(None if shutil.which("ip") else "needs iproute2's `ip` command")
