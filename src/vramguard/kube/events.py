"""The Event writer: core/v1 Events on pods (and on the Node, for a GPU fault), queued by `record` (never blocks,
never raises) and written by one background loop through an `EventSink` (client-go's `event.go`); which are
written, and as what, the correlator decides (`vramguard.kube.correlator`). Its bounds and priorities:
docs/architecture.md "Writing Events".
"""

from __future__ import annotations

import enum
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Final, Protocol

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from vramguard.base.background import BackgroundLoop
from vramguard.base.backoff import Backoff, TokenBucket
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.logs import FailureRun
from vramguard.core.pod import EventSubject, NodeRef
from vramguard.core.text import MAX_TEXT_CHARS, cut, printable
from vramguard.kube.client import (
    FORBIDDEN_GRACE_S,
    TIMEOUT_WRITE,
    describe,
    forbidden_for_now,
    retry_backoff,
    status_message,
    transient,
)
from vramguard.kube.correlator import Create, Drop, Event, EventCorrelator, EventKey, Patch, Write

COMPONENT: Final = "vramguard"
EVENT_QUEUE: Final = 256  # Events waiting at most; past it, what is recorded is dropped and counted
EVENT_BURST: Final = 25  # writes paced at this many at once, then EVENT_PER_MINUTE
EVENT_PER_MINUTE: Final = 20
EVENT_MAX_AGE_S: Final = 600.0  # an Event still unwritten after this long is stale news: dropped as failed
# A namespace whose 403 outlived FORBIDDEN_GRACE_S (a quota on Events, a policy): its next 403s within this long fail
# at once, so its Events never hold up the other namespaces' a grace each.
EVENT_DENIED_S: Final = 600.0
EVENT_DENIED_NAMESPACES: Final = 256  # namespaces remembered so, the oldest forgotten first
EVENT_MESSAGE_CHARS: Final = MAX_TEXT_CHARS

Log = structlog.typing.FilteringBoundLogger


class EventResult(str, enum.Enum):
    """What became of one Event recorded (`KubeEventRecorder`'s `count`): the `result` label of
    vramguard_events_total, each exported at 0 from the start."""

    WRITTEN = "written"
    PATCHED = "patched"  # a repeat of a written one: its count bumped
    AGGREGATED = "aggregated"  # a repeat of a queued one: written once, counted in it
    DROPPED = "dropped"  # over a bound: the correlator's spam filter, the queue, or queued at stop
    FAILED = "failed"  # refused, or unanswered for EVENT_MAX_AGE_S


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


@dataclass(frozen=True, slots=True)
class EventRecord:
    """One Event as the sink writes it."""

    name: str  # fixed at record time: a create retried after a timeout finds it, never writes a second object
    pod: EventSubject
    reason: str
    message: str
    warning: bool
    count: int
    first: datetime
    last: datetime


class EventSink(Protocol):
    """Where Events go. Raises on failure; `vramguard.kube.client` tells a retry from a refusal (`transient`,
    `forbidden_for_now`)."""

    def create(self, event: EventRecord) -> bool:
        """Write a new Event; False when one of that name exists already (an attempt whose answer was lost)."""
        ...

    def bump(self, namespace: str, name: str, count: int, last: datetime) -> bool:
        """Set a written Event's count and last time; False when that Event is gone (expired or deleted)."""
        ...


class KubeEventSink:
    """`EventSink` on the API server: create and merge-patch core/v1 Events."""

    def __init__(self, api: client.ApiClient, node_name: str) -> None:
        self.core = client.CoreV1Api(api)
        self.node_name = node_name

    def create(self, event: EventRecord) -> bool:
        pod = event.pod
        if isinstance(pod, NodeRef):  # cluster-scoped: no namespace in the reference (the kubelet's Node Events)
            involved = client.V1ObjectReference(api_version="v1", kind="Node", name=pod.name, uid=pod.uid)
        else:
            involved = client.V1ObjectReference(
                api_version="v1", kind="Pod", namespace=pod.namespace, name=pod.name, uid=pod.uid
            )  # a static pod's: its mirror pod's name and its own UID, as the kubelet's and `kubectl describe` say
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=event.name, namespace=pod.namespace),
            involved_object=involved,
            reason=event.reason,
            message=event.message,
            type="Warning" if event.warning else "Normal",
            source=client.V1EventSource(component=COMPONENT, host=self.node_name),
            reporting_component=f"{COMPONENT}.io/agent",
            reporting_instance=self.node_name,
            first_timestamp=event.first,
            last_timestamp=event.last,
            count=event.count,
        )
        try:
            self.core.create_namespaced_event(pod.namespace, body, _request_timeout=TIMEOUT_WRITE)
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        return True

    def bump(self, namespace: str, name: str, count: int, last: datetime) -> bool:
        try:
            self.core.patch_namespaced_event(
                name,
                namespace,
                {"count": count, "lastTimestamp": last.strftime("%Y-%m-%dT%H:%M:%SZ")},
                _content_type="application/merge-patch+json",
                _request_timeout=TIMEOUT_WRITE,
            )
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True


@dataclass(slots=True)
class _Pending:
    """An Event waiting for the writer: the correlator's answer, with the repeats said meanwhile in its count."""

    pod: EventSubject
    reason: str
    message: str
    warning: bool
    name: str  # fixed at record time: what a patch that finds its Event gone (404) creates afresh
    write: Write
    times: int  # said this often since queued: the count of that fresh Event
    first: datetime
    last: datetime
    queued_at: float

    @property
    def key(self) -> EventKey:
        return EventKey(self.pod.uid, self.reason, self.message)


class KubeEventRecorder:
    """core/v1 Events on pods, written by one background loop. `record` never blocks and never raises.

    The correlator answers, once, when an Event is recorded, what to write for it; the writer carries the answer
    out. An Event said again while queued is one write whose count grows; each Event's name is fixed when it is
    recorded, so a create retried after a timeout never writes it twice. Enforcement Events (`important`) take the
    next write before any other, and a full queue drops its oldest other Event to make room for one. Messages are
    shown to people by `kubectl describe`: their control and bidi characters are escaped (`text.printable`).
    Results are counted through `count` (`EventResult`).

    A failed write is retried in place with `retry_backoff`: the writer holds the Event, since what failed it (an
    API server away, or restarting) fails the next one too. No answer, a 429 or a 5xx: until `EVENT_MAX_AGE_S`. A
    403 (a restarting API server's authorizer may not have loaded RBAC yet): until `FORBIDDEN_GRACE_S` after the
    first 403 since the last write that succeeded; past that, each 403 fails its Event at once, and a namespace
    whose own 403 outlived the grace fails its Events at once for `EVENT_DENIED_S` or until one is written there.
    Anything else fails the Event at once.
    """

    def __init__(
        self,
        sink: EventSink,
        *,
        count: Callable[[EventResult], None] | None = None,
        max_queue: int = EVENT_QUEUE,
        bucket: TokenBucket | None = None,
        correlator: EventCorrelator | None = None,
        clock: Clock = SYSTEM_CLOCK,
        rng: Callable[[], float] = random.random,
        log: Log | None = None,
    ) -> None:
        """Nothing is written before `start()`: until then, what `record` queues stays queued. `rng` jitters the
        retries' back-off."""
        self.sink = sink
        self.log = log if log is not None else structlog.get_logger(__name__)
        self.bucket = bucket if bucket is not None else TokenBucket(EVENT_BURST, EVENT_PER_MINUTE, clock)
        self.correlator = correlator if correlator is not None else EventCorrelator(clock=clock)
        self.clock = clock
        self.rng = rng
        self.max_queue = max_queue
        self._count = count if count is not None else (lambda result: None)
        self._queue: OrderedDict[EventKey, _Pending] = OrderedDict()  # oldest first
        self._urgent: OrderedDict[EventKey, _Pending] = OrderedDict()  # important Events, oldest first; same bound
        self._cond = threading.Condition()  # guards the queues, `_held` and the correlator
        self._held: _Pending | None = None  # taken off the queue: being written, or waiting to be retried
        self._backoff = retry_backoff(rng)  # the held Event's retries
        self._failures = FailureRun()  # writes failing: logged once per distinct error, not once per retry
        self._forbidden_since: float | None = None  # the first 403 since the last write that succeeded
        self._forbidden_told = False  # that run's 403s outlived the grace and the log said so
        self._denied: OrderedDict[str, float] = OrderedDict()  # namespace -> when its 403 outlived the grace
        self.loop = BackgroundLoop("vramguard-events", self.step, clock=clock, wake=self._wake, on_exit=self._exited)

    def start(self) -> None:
        """Start the writer loop."""
        self.loop.start()

    def record(
        self, pod: EventSubject, reason: str, message: str, warning: bool = True, important: bool = False
    ) -> None:
        # Cut, escape, and cut again: an escape is up to ten characters, so escaping can lengthen the message.
        message = cut(printable(cut(message, EVENT_MESSAGE_CHARS)), EVENT_MESSAGE_CHARS)
        event = Event(pod.uid, pod.namespace, reason, message, _event_name(pod.name))
        queue = self._urgent if important else self._queue
        stamp = _now()
        with self._cond:
            pending = queue.get(event.key)
            answer = self.correlator.correlate(event, owed=pending is not None)
            if isinstance(answer, Drop):
                self._count(EventResult.DROPPED)
                return
            if pending is not None:  # said again before it was even written: one write, counted twice
                pending.write, pending.times, pending.last = answer, pending.times + 1, stamp
                self._count(EventResult.AGGREGATED)
                return
            if not self._room(important):
                self._count(EventResult.DROPPED)
                return
            queue[event.key] = _Pending(
                pod, reason, message, warning, event.name, answer, 1, stamp, stamp, self.clock.now()
            )
            self._cond.notify()

    def _room(self, important: bool) -> bool:
        """Whether one more Event fits; an important one makes room by dropping the oldest other one (the least
        current news). Called with the lock held."""
        if len(self._queue) + len(self._urgent) < self.max_queue:
            return True
        if not important or not self._queue:
            return False
        self._queue.popitem(last=False)
        self._count(EventResult.DROPPED)
        return True

    def queued(self) -> int:
        """Events waiting to be written, the one being written included."""
        with self._cond:
            return len(self._queue) + len(self._urgent) + (self._held is not None)

    def stop(self, deadline: float) -> None:
        """Stop the writer; Events still queued are dropped (counted). Waits for the one being written until
        `deadline` at most: a request stuck there is abandoned (the thread is a daemon)."""
        self.loop.stopping.set()  # set first: no Event is taken off the queue once it is emptied
        with self._cond:
            left = len(self._queue) + len(self._urgent)
            self._queue.clear()
            self._urgent.clear()
        for _ in range(left):
            self._count(EventResult.DROPPED)
        self.loop.stop(deadline)

    def flush(self, timeout_s: float) -> bool:
        """Block until nothing is queued or being written, `timeout_s` at most (real time: it waits on the writer
        thread); True when it emptied in time."""
        with self._cond:
            return self._cond.wait_for(lambda: not (self._queue or self._urgent or self._held), timeout_s)

    def _wake(self) -> None:
        """Wake a step waiting for an Event: the loop is stopping."""
        with self._cond:
            self._cond.notify_all()

    def _exited(self) -> None:
        """The loop has ended: an Event it still held (waiting for a retry) is abandoned, as the queue is."""
        with self._cond:
            self._held = None
            self._cond.notify_all()  # `flush`

    # -- the writer loop ---------------------------------------------------------------------------------------

    def step(self) -> float:
        """One round of the writer (its loop's step; a test runs it on its own thread): wait for an Event, take a
        write token, and make one attempt at writing the Event; returns the seconds until the next round (a retry's
        back-off)."""
        stopping = self.loop.stopping
        with self._cond:
            while self._held is None and not (self._queue or self._urgent):
                if stopping.is_set():
                    return 0.0
                self._cond.wait()
            item = self._held
        if item is None:
            # The token first, the Event second: an important Event recorded while the writer waits for a token
            # is the one that gets it.
            if not self.bucket.wait(stopping):
                return 0.0
            with self._cond:
                if not (self._queue or self._urgent):
                    return 0.0  # emptied by stop()
                _, item = (self._urgent or self._queue).popitem(last=False)
                self._held = item
            self._backoff.reset()
        retry_s = self._attempt(item)
        if retry_s is None:
            with self._cond:
                self._held = None
                self._cond.notify_all()  # `flush` may be waiting for the queue to empty
            return 0.0
        return retry_s

    def _attempt(self, item: _Pending) -> float | None:
        """One attempt at writing `item`; the seconds until it is tried again, or None: done with it."""
        if self.clock.now() - item.queued_at > EVENT_MAX_AGE_S:
            self._count(EventResult.FAILED)
            self.log.warning("event_expired", pod=item.pod.key, reason=item.reason, age_s=EVENT_MAX_AGE_S)
            return None
        try:
            result = self._write(item)
        except Exception as e:
            error = describe(e)
            if self._failures.failed(error):
                self.log.warning("event_failed", pod=item.pod.key, reason=item.reason, error=error)
            delay = self._retry_in(item.pod.namespace, e, self._backoff)
            if delay is None:
                self._count(EventResult.FAILED)
            return delay
        self._count(result)
        after = self._failures.error
        if self._failures.ok():
            self.log.info("events_restored", after=after)
        self._forbidden_since, self._forbidden_told = None, False
        self._denied.pop(item.pod.namespace, None)
        return None

    def _retry_in(self, namespace: str, e: Exception, backoff: Backoff) -> float | None:
        """How long to wait before writing the Event again after `e`; None: it failed."""
        if transient(e):
            return backoff.next()
        if not forbidden_for_now(e):
            return None
        now = self.clock.now()
        denied_at = self._denied.get(namespace)
        if denied_at is not None and now - denied_at < EVENT_DENIED_S:
            return None
        if self._forbidden_since is None:
            self._forbidden_since = now
        left_s = self._forbidden_since + FORBIDDEN_GRACE_S - now
        if left_s > 0:
            return min(backoff.next(), left_s)
        self._denied[namespace] = now
        self._denied.move_to_end(namespace)
        if len(self._denied) > EVENT_DENIED_NAMESPACES:
            self._denied.popitem(last=False)
        if not self._forbidden_told:
            self._forbidden_told = True
            message = status_message(e) if isinstance(e, ApiException) else describe(e)
            self.log.warning(
                "events_forbidden",
                namespace=namespace,
                error=message,
                after_s=FORBIDDEN_GRACE_S,
                detail="a 403 past its grace: Events fail at once until one is written (RBAC: events create, patch)",
            )
        return None

    def _write(self, item: _Pending) -> EventResult:
        """Carry out the correlator's answer for `item`; the result to count."""
        write = item.write
        if isinstance(write, Patch):
            if self.sink.bump(write.namespace, write.name, write.count, item.last):
                return EventResult.PATCHED
            # Gone (expired or deleted): said afresh, as a new Event of the repeats this write carries.
            item.write = write = Create(item.pod.namespace, item.name, item.times)
            with self._cond:
                self.correlator.gone(item.key, write)
        record = EventRecord(
            write.name, item.pod, item.reason, item.message, item.warning, write.count, item.first, item.last
        )
        # False: an earlier attempt whose answer was lost (a timeout) did write it; writing it again under another
        # name would be the duplicate the fixed name exists to prevent.
        self.sink.create(record)
        return EventResult.WRITTEN


def _event_name(pod_name: str) -> str:
    """`<pod>.<hex nanoseconds>`, client-go's scheme, cut to fit the 253-character name limit."""
    return f"{pod_name[:235]}.{time.time_ns():x}"
