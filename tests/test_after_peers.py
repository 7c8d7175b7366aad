"""SIGTERM after the peers finished (cli/common.AfterPeers): noted while the summary is made,
an interruption of the audit only, never a kill."""

from __future__ import annotations

import os
import signal

import pytest

from coordinator_free.cli.common import AfterPeers, Terminated


def test_a_sigterm_while_the_summary_is_made_is_noted_and_skips_the_audit():
    before = signal.getsignal(signal.SIGTERM)
    with AfterPeers() as term:
        os.kill(os.getpid(), signal.SIGTERM)  # delivered to this thread before kill returns
        assert term.terminated
        with pytest.raises(Terminated), term.interruptible():
            raise AssertionError("the audit must not start")  # pragma: no cover
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_sigterm_during_the_audit_interrupts_it_and_one_after_is_ignored():
    with AfterPeers() as term:
        reached = []
        with pytest.raises(Terminated), term.interruptible():
            reached.append("audit")
            os.kill(os.getpid(), signal.SIGTERM)
            reached.append("not reached")  # pragma: no cover
        assert reached == ["audit"]
        os.kill(os.getpid(), signal.SIGTERM)  # after the audit: noted, nothing raised
        assert term.terminated
