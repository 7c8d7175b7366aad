"""Whether the tests run in CI, and what a test does when something it needs is missing.

CI (``CI=true``) installs every tool the suites use, so there a missing tool fails the test
instead of skipping it: a CI runner without it cannot pass by silently skipping."""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI") == "true"


def unavailable(reason: str | None) -> None:
    """Skip, saying why, when something a test needs is missing (``reason`` not None); in CI
    fail instead."""
    if reason is None:
        return
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: failing instead of skipping)", pytrace=False)
    pytest.skip(reason)
