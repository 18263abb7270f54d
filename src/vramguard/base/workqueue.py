"""A keyed work queue with per-key back-off, after client-go's `util/workqueue` rate-limiting queue, without threads.

A key waits at most once (`add` of a waiting key does nothing), is handed out at most once at a time (`get`), and
one added again while it is handed out waits until its `done`. `add_after` holds a key back for a while,
`add_rate_limited` for that key's own back-off, which grows with each call until `forget`. The queue starts no
thread and never blocks: whoever owns it drives it in passes (`release_due`, then `get`/`done` until `get` has
nothing), on the clock it was given.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from vramguard.base.backoff import Backoff
from vramguard.base.clock import SYSTEM_CLOCK, Clock

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """Thread-safe: any thread may add; the driver's thread takes. `backoff` makes each failing key's delays."""

    def __init__(self, backoff: Callable[[], Backoff], clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self._backoff = backoff
        self._lock = threading.Lock()
        self._seq = itertools.count()
        # Ready keys in order: (0 for `first`, else 1; when added; key). An entry is live only while `_ready`
        # holds that key with that order; one superseded (moved ahead by a later `first`) is skipped when popped.
        self._heap: list[tuple[int, int, K]] = []
        self._ready: dict[K, tuple[int, int]] = {}
        self._processing: set[K] = set()
        self._again: dict[K, bool] = {}  # added while handed out: waits for `done`, `first` or not
        self._delayed: dict[K, float] = {}  # held back until this time on `clock`
        self._backoffs: dict[K, Backoff] = {}
        self._failures: dict[K, int] = {}

    def add(self, key: K, *, first: bool = False) -> None:
        """Make `key` ready; `first`: ahead of every key added without it (a waiting key moves up)."""
        with self._lock:
            self._add(key, first)

    def add_after(self, key: K, delay_s: float) -> None:
        """Make `key` ready once `delay_s` has passed, at the first `release_due` from then on: a key put back with
        no delay is taken on the driver's next pass, not again in this one. A key already held back keeps the
        earlier of its two times."""
        with self._lock:
            due = self.clock.now() + delay_s
            self._delayed[key] = min(due, self._delayed.get(key, due))

    def add_rate_limited(self, key: K) -> None:
        """Hold `key` back for its own next back-off delay: the first after a `forget` is the shortest."""
        with self._lock:
            backoff = self._backoffs.get(key)
            if backoff is None:
                backoff = self._backoffs[key] = self._backoff()
            self._failures[key] = self._failures.get(key, 0) + 1
            delay = backoff.next()
        self.add_after(key, delay)

    def forget(self, key: K) -> None:
        """`key` succeeded (or is no longer wanted): its back-off starts again from the shortest delay. A delay
        already running is not cut short."""
        with self._lock:
            self._backoffs.pop(key, None)
            self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        """How often `key` was held back for its back-off since it was last forgotten (client-go's NumRequeues)."""
        with self._lock:
            return self._failures.get(key, 0)

    def failing(self) -> int:
        """How many keys are on a back-off now."""
        with self._lock:
            return len(self._failures)

    def release_due(self) -> None:
        """Make ready the held-back keys whose time has come (the driver calls it once per pass)."""
        with self._lock:
            now = self.clock.now()
            due = sorted((at, next(self._seq), key) for key, at in self._delayed.items() if at <= now)
            for _, _, key in due:
                del self._delayed[key]
                self._add(key, False)

    def get(self) -> K | None:
        """The next ready key, handed out until `done(key)`; None when no key is ready."""
        with self._lock:
            while self._heap:
                order, seq, key = heapq.heappop(self._heap)
                if self._ready.get(key) == (order, seq):
                    del self._ready[key]
                    self._processing.add(key)
                    return key
            return None

    def done(self, key: K) -> None:
        """The driver is through with `key`: one added meanwhile is ready now."""
        with self._lock:
            self._processing.discard(key)
            if key in self._again:
                self._add(key, self._again.pop(key))

    def _add(self, key: K, first: bool) -> None:
        if key in self._processing:
            self._again[key] = first or self._again.get(key, False)
            return
        order = 0 if first else 1
        waiting = self._ready.get(key)
        if waiting is not None and waiting[0] <= order:
            return  # waiting already, as far ahead
        entry = (order, next(self._seq))
        self._ready[key] = entry
        heapq.heappush(self._heap, (*entry, key))
