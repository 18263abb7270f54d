"""A keyed work queue with per-key back-off, after client-go's `util/workqueue` rate-limiting, delaying queue.

A key waits at most once (`add` of a waiting key does nothing), is handed out at most once at a time (`get`), and
one added again while it is handed out waits until its `done`. `add_after` holds a key back for a while,
`add_rate_limited` for that key's own back-off, which grows with each call until `forget`. The queue starts no
thread and wakes itself: `get` makes ready the held-back keys whose time has come, and a blocking `get` waits until
a key is added, the earliest held-back key comes due, or `shut_down`, so nobody has to poll it for a delayed key.
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
    """Thread-safe: any thread may add; the worker's thread takes (`get`, then `done`). `backoff` makes each failing
    key's delays. A blocking `get` waits in real seconds for a held-back key's time on `clock` (whose `now` is
    monotonic seconds); any add wakes it and it reads the clock again."""

    def __init__(self, backoff: Callable[[], Backoff], clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self._backoff = backoff
        self._cond = threading.Condition(threading.Lock())
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
        self._shut_down = False

    def add(self, key: K, *, first: bool = False) -> None:
        """Make `key` ready; `first`: ahead of every key added without it (a waiting key moves up)."""
        with self._cond:
            self._add(key, first)

    def add_after(self, key: K, delay_s: float) -> None:
        """Make `key` ready once `delay_s` has passed on the clock (client-go's `AddAfter`): a waiting `get` wakes
        for it then. A key already held back keeps the earlier of its two times."""
        with self._cond:
            due = self.clock.now() + delay_s
            self._delayed[key] = min(due, self._delayed.get(key, due))
            self._cond.notify()  # a waiting `get` may have to wake sooner

    def add_rate_limited(self, key: K) -> None:
        """Hold `key` back for its own next back-off delay: the first after a `forget` is the shortest."""
        with self._cond:
            backoff = self._backoffs.get(key)
            if backoff is None:
                backoff = self._backoffs[key] = self._backoff()
            self._failures[key] = self._failures.get(key, 0) + 1
            delay = backoff.next()
        self.add_after(key, delay)

    def forget(self, key: K) -> None:
        """`key` succeeded (or is no longer wanted): its back-off starts again from the shortest delay. A delay
        already running is not cut short."""
        with self._cond:
            self._backoffs.pop(key, None)
            self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        """How often `key` was held back for its back-off since it was last forgotten (client-go's NumRequeues)."""
        with self._cond:
            return self._failures.get(key, 0)

    def failing(self) -> int:
        """How many keys are on a back-off now."""
        with self._cond:
            return len(self._failures)

    def snapshot(self) -> list[K]:
        """Every key the queue holds now: ready, held back or handed out."""
        with self._cond:
            return list(
                {**dict.fromkeys(self._ready), **dict.fromkeys(self._delayed), **dict.fromkeys(self._processing)}
            )

    def get(self, *, block: bool = False) -> K | None:
        """The next ready key (the held-back keys whose time has come are ready now), handed out until `done(key)`.
        None when no key is ready, or, with `block`, only once the queue is shut down: a blocking `get` waits for
        an add or for the earliest held-back key's time."""
        with self._cond:
            while not self._shut_down:
                self._release_due()
                key = self._pop()
                if key is not None or not block:
                    return key
                self._cond.wait(self._until_due())
            return None

    def done(self, key: K) -> None:
        """The worker is through with `key`: one added meanwhile is ready now."""
        with self._cond:
            self._processing.discard(key)
            if key in self._again:
                self._add(key, self._again.pop(key))

    def shut_down(self) -> None:
        """Hand out nothing more: every `get`, waiting or to come, returns None (the worker's stop)."""
        with self._cond:
            self._shut_down = True
            self._cond.notify_all()

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
        self._cond.notify()

    def _release_due(self) -> None:
        if not self._delayed:
            return
        now = self.clock.now()
        due = sorted((at, next(self._seq), key) for key, at in self._delayed.items() if at <= now)
        for _, _, key in due:
            del self._delayed[key]
            self._add(key, False)

    def _pop(self) -> K | None:
        while self._heap:
            order, seq, key = heapq.heappop(self._heap)
            if self._ready.get(key) == (order, seq):
                del self._ready[key]
                self._processing.add(key)
                return key
        return None

    def until_due(self) -> float | None:
        """How long a `get` that finds nothing ready waits now before it looks again: the seconds until the
        earliest held-back key's time, or None (until a key is added)."""
        with self._cond:
            return self._until_due()

    def _until_due(self) -> float | None:
        if not self._delayed:
            return None
        return max(0.0, min(self._delayed.values()) - self.clock.now())
