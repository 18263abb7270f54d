"""The stop signals: each sets the stop Event for the block, and the handlers before it are back after."""

from __future__ import annotations

import signal

import pytest

from vramguard.cli.signals import STOP_SIGNALS, stop_on_signals


@pytest.mark.parametrize("signum", [pytest.param(s, id=s.name) for s in STOP_SIGNALS])
def test_a_stop_signal_sets_the_event_instead_of_ending_the_process(signum: signal.Signals) -> None:
    """SIGTERM, SIGINT and SIGHUP (whose default would end the agent mid-kill) only ask it to stop."""
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    with stop_on_signals() as stop:
        assert not stop.is_set()
        signal.raise_signal(signum)  # the handler runs on this, the main, thread before the call returns
        assert stop.is_set()
    assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == before, "the handlers before the block are back"
