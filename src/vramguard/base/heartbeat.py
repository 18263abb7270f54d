"""A heartbeat: when a loop last went round, written on its thread and read on another's."""

from __future__ import annotations

import threading


class Heartbeat:
    """`beat(now)` on the loop's thread each round; `age(now)` anywhere: seconds since the last beat, None before
    the first. Times are on the one clock both threads are given."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at: float | None = None

    def beat(self, now: float) -> None:
        with self._lock:
            self._at = now

    def age(self, now: float) -> float | None:
        with self._lock:
            at = self._at
        return None if at is None else now - at
