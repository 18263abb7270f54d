"""The Event correlator: asked once per Event, it answers what the writer does with it (client-go's
`EventCorrelate`): create it, patch the count of the same Event written before, or drop it.

Pure, its clock injected (client-go's `events_cache.go`): a spam filter per (pod, reason) — `SPAM_BURST` at once,
then one per `SPAM_REFILL_S` — so one noisy pod cannot starve the others; and the Events said in the last
`REPEAT_WINDOW_S`, so the same thing said again is one object whose count grows. Optimistic, as client-go's
`lastObservedEventCache`: an Event counts as written once answered. A create that never lands needs no word back —
the next repeat's patch finds nothing (404) and the writer creates it afresh — so the writer tells back one thing
only, the replacement it created for a patch's 404 (`gone`). Not thread-safe: the writer calls it under its lock.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass, replace
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


@dataclass(frozen=True, slots=True)
class Event:
    """An Event to correlate: about which pod, why, and the name it is created under if it is new."""

    pod_uid: str
    namespace: str
    reason: str
    message: str
    name: str

    @property
    def key(self) -> EventKey:
        return EventKey(self.pod_uid, self.reason, self.message)


@dataclass(frozen=True, slots=True)
class Create:
    """Write a new Event: `name` in `namespace`, with this count."""

    namespace: str
    name: str
    count: int


@dataclass(frozen=True, slots=True)
class Patch:
    """Set the count of the Event written before as `name` in `namespace`."""

    namespace: str
    name: str
    count: int


class DropReason(enum.Enum):
    SPAM = "spam"  # the pod's budget for this reason is spent


@dataclass(frozen=True, slots=True)
class Drop:
    """Write nothing."""

    reason: DropReason


Write = Create | Patch
Answer = Create | Patch | Drop


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
        # key -> (the last answer for it, when): oldest first, since every answer moves its key to the end.
        self._said: OrderedDict[EventKey, tuple[Write, float]] = OrderedDict()

    def correlate(self, event: Event, *, owed: bool = False) -> Answer:
        """What to write for `event`. Said within the repeat window of the last time: a patch of that Event's count;
        otherwise a new Event. Either costs one of the pod's spam budget for the reason, or it is dropped.

        `owed`: the writer holds this Event still unwritten, so the repeat joins that write at no cost: the answer
        is the held answer with one more in its count, for the writer to write instead."""
        now = self.clock.now()
        while self._said and next(iter(self._said.values()))[1] <= now - self.repeat_window_s:
            self._said.popitem(last=False)
        key = event.key
        said = self._said.get(key)
        answer: Write
        if owed and said is not None:
            answer = replace(said[0], count=said[0].count + 1)
        elif not owed and not self._spend(event.pod_uid, event.reason):
            return Drop(DropReason.SPAM)
        elif said is None:
            answer = Create(event.namespace, event.name, 1)
        else:
            answer = Patch(said[0].namespace, said[0].name, said[0].count + 1)
        self._remember(key, answer, now)
        return answer

    def gone(self, key: EventKey, created: Create) -> None:
        """The Event a patch for `key` was answered with is gone (expired or deleted) and `created` replaces it: a
        repeat patches that one. The writer alone learns this, from the server's 404."""
        self._remember(key, Patch(created.namespace, created.name, created.count), self.clock.now())

    def _remember(self, key: EventKey, answer: Write, now: float) -> None:
        self._said[key] = (answer, now)
        self._said.move_to_end(key)

    def _spend(self, pod_uid: str, reason: str) -> bool:
        """The spam filter: whether one more write for this pod and reason is within its budget (and spend it)."""
        key = (pod_uid, reason)
        bucket = self._spam.get(key)
        if bucket is None:
            bucket = self._spam[key] = TokenBucket(self.spam_burst, self.spam_per_minute, self.clock)
            if len(self._spam) > SPAM_KEYS:
                self._spam.popitem(last=False)
        else:
            self._spam.move_to_end(key)
        return bucket.take()
