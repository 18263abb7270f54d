"""The Event correlator: which Events are written at all, and which only bump the count of one written before.

Pure, its clock injected (client-go's `events_cache.go`): a spam filter per (pod, reason) — `SPAM_BURST` at once,
then one per `SPAM_REFILL_S` — so one noisy pod cannot starve the others; and the Events written in the last
`REPEAT_WINDOW_S`, so the same thing said again is one object whose count grows. Not thread-safe: the recorder
calls `allow` under its lock and the rest from its writer thread only.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Final, NamedTuple

from vramguard.base.backoff import TokenBucket
from vramguard.base.clock import SYSTEM_CLOCK, Clock

SPAM_BURST: Final = 25
SPAM_REFILL_S: Final = 300.0
SPAM_KEYS: Final = 4096  # (pod, reason) pairs remembered, least recently used forgotten first, as client-go's LRU
REPEAT_WINDOW_S: Final = 600.0


class EventKey(NamedTuple):
    """What makes two Events the same: said about one pod, for one reason, in the same words."""

    pod_uid: str
    reason: str
    message: str


@dataclass(slots=True)
class Written:
    """An Event on the API server: its name, namespace and count, and when it was last written."""

    name: str
    namespace: str
    count: int
    at: float


class EventCorrelator:
    def __init__(
        self,
        *,
        spam_burst: int = SPAM_BURST,
        spam_refill_s: float = SPAM_REFILL_S,
        repeat_window_s: float = REPEAT_WINDOW_S,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.spam_burst = spam_burst
        self.spam_per_minute = 60.0 / spam_refill_s
        self.repeat_window_s = repeat_window_s
        self.clock = clock
        self._spam: OrderedDict[tuple[str, str], TokenBucket] = OrderedDict()
        self._written: dict[EventKey, Written] = {}

    def allow(self, pod_uid: str, reason: str) -> bool:
        """The spam filter: whether one more Event for this pod and reason may be written."""
        key = (pod_uid, reason)
        bucket = self._spam.get(key)
        if bucket is None:
            bucket = self._spam[key] = TokenBucket(self.spam_burst, self.spam_per_minute, self.clock)
            if len(self._spam) > SPAM_KEYS:
                self._spam.popitem(last=False)
        else:
            self._spam.move_to_end(key)
        return bucket.take()

    def repeat_of(self, key: EventKey) -> Written | None:
        """The Event written for `key` within the repeat window, whose count a repeat bumps; None: write anew."""
        t = self.clock.now()
        if any(t - w.at >= self.repeat_window_s for w in self._written.values()):
            self._written = {k: w for k, w in self._written.items() if t - w.at < self.repeat_window_s}
        return self._written.get(key)

    def wrote(self, key: EventKey, name: str, namespace: str, count: int) -> None:
        """The Event for `key` now stands on the server with this count (created, or its count bumped)."""
        self._written[key] = Written(name, namespace, count, self.clock.now())

    def gone(self, key: EventKey) -> None:
        """The Event for `key` is no longer on the server (it expired or was deleted): the next is written anew."""
        self._written.pop(key, None)
