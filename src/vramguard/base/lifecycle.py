"""One lifecycle for every background part: constructed idle, `start()`, `stop(deadline)`.

A part starts nothing in its constructor: it starts its threads (or opens what it needs) in `start()`, and
`stop(deadline)` ends them by `deadline`, a time on the part's clock (`Clock.now()`), abandoning what cannot
finish by then rather than waiting on it. `Services` is how the composition root uses them: it starts parts in
order and stops them in reverse, every one within one shutdown budget.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

import structlog

from vramguard.base.clock import SYSTEM_CLOCK, Clock


class Service(Protocol):
    def start(self) -> None:
        """Start the background work; called once."""
        ...

    def stop(self, deadline: float) -> None:
        """End it by `deadline` (on the clock's `now()` scale); never raises for a part that is already stopped."""
        ...


S = TypeVar("S", bound=Service)


class Services:
    """Parts started in order and stopped in reverse (the last started depends on the earlier ones)."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self.log = structlog.get_logger(__name__)
        self._started: list[tuple[str, Service]] = []

    def start(self, name: str, part: S) -> S:
        part.start()
        self._started.append((name, part))
        return part

    def stop(self, budget_s: float) -> None:
        """Stop every started part, the last started first, all within `budget_s` from now."""
        deadline = self.clock.now() + budget_s
        while self._started:
            name, part = self._started.pop()
            try:
                part.stop(deadline)
            except Exception as e:  # one part failing to stop must not leave the others running
                self.log.exception("stop_failed", part=name, error=repr(e))
            late_s = self.clock.now() - deadline
            if late_s > 0:
                self.log.warning("stop_late", part=name, late_s=round(late_s, 3))
