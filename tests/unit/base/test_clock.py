"""The one clock: monotonic time, and a wait that a stop event ends."""

from __future__ import annotations

import threading

from vramguard.base.clock import SYSTEM_CLOCK, UNINTERRUPTED, Clock, SystemClock
from vramguard_testbed.fakes import FakeClock


def test_the_system_clock_is_monotonic() -> None:
    """now() never goes back (wall time may: NTP, a VM resumed)."""
    readings = [SYSTEM_CLOCK.now() for _ in range(1000)]
    assert readings == sorted(readings)


def test_a_wait_on_a_set_event_returns_at_once_saying_so() -> None:
    """The stop ends a wait, however long it was to be: True says it was the stop."""
    stop = threading.Event()
    stop.set()
    assert SystemClock().wait(stop, 3600.0) is True


def test_a_wait_of_no_time_returns_saying_no_stop() -> None:
    """A wait of zero (or less: a deadline already passed) does not block, and False says no stop came."""
    assert SYSTEM_CLOCK.wait(threading.Event(), 0.0) is False
    assert SYSTEM_CLOCK.wait(threading.Event(), -5.0) is False


def test_uninterrupted_is_never_set() -> None:
    """A pause on UNINTERRUPTED is ended by its length alone, never by the agent's stop."""
    assert not UNINTERRUPTED.is_set()
    assert SYSTEM_CLOCK.wait(UNINTERRUPTED, 0.0) is False


def test_the_fake_clock_is_a_clock() -> None:
    """Tests drive time with FakeClock.step(); its wait passes the time it was asked for, unless stopped."""
    clock: Clock = FakeClock(start=10.0)
    assert clock.wait(threading.Event(), 2.5) is False
    assert clock.now() == 12.5
    stop = threading.Event()
    stop.set()
    assert clock.wait(stop, 100.0) is True
    assert clock.now() == 12.5
