"""The one clock: every decision, probe, deadline and back-off reads time through a `Clock`, so a test drives time
instead of waiting for it (`vramguard_testbed.fakes.FakeClock`)."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale (not wall time)."""
        ...

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        """Block up to `seconds` or until `stop` is set; True when it was set (`threading.Event.wait`)."""
        ...


class SystemClock:
    """The machine's monotonic clock; `wait` sleeps on the event."""

    def now(self) -> float:
        return time.monotonic()

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        return stop.wait(max(0.0, seconds))


SYSTEM_CLOCK = SystemClock()

# Never set: `clock.wait(UNINTERRUPTED, s)` is a pause that only its length ends (a kill's or a retry's pause,
# which must not be cut short by the agent's stop: they end by their own deadline).
UNINTERRUPTED = threading.Event()
