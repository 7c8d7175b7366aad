"""What the network-namespace lab tests share: whether namespaces can be made here, the mark of
the tests that make them (their fixtures are in conftest.py), and lab names unique to this test
process."""

from __future__ import annotations

import os
import shutil

import pytest


def why_no_netns() -> str | None:
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` command to create network namespaces"
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    return None


# Tests that create namespaces: skipped without root or `ip`, failed for that in CI.
needs_netns = pytest.mark.usefixtures("_netns_available")


def lab_name(tag: str) -> str:
    return f"t{os.getpid()}{tag}"
