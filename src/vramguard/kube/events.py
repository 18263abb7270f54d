"""The Event writer: core/v1 Events on pods, queued by `record` (never blocks, never raises) and written by one
background thread through an `EventSink` (client-go's `event.go`); which are written, and as what, the correlator
decides (`vramguard.kube.correlator`). Its bounds and priorities: docs/design.md "Writing Events".
"""

from __future__ import annotations

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

from vramguard.base.backoff import Backoff, TokenBucket
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.logs import FailureRun
from vramguard.core.model import PodInfo
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
from vramguard.kube.correlator import EventCorrelator, EventKey

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


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


@dataclass(frozen=True, slots=True)
class EventRecord:
    """One Event as the sink writes it."""

    name: str  # fixed at record time: a create retried after a timeout finds it, never writes a second object
    pod: PodInfo
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
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=event.name, namespace=pod.namespace),
            involved_object=client.V1ObjectReference(
                api_version="v1", kind="Pod", namespace=pod.namespace, name=pod.name, uid=pod.uid
            ),
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
    """An Event waiting for the writer, with the repeats that arrived meanwhile folded into its count."""

    pod: PodInfo
    reason: str
    message: str
    warning: bool
    important: bool  # an enforcement Event: written ahead of the others, never dropped to make room for them
    name: str
    count: int
    first: datetime
    last: datetime
    queued_at: float


class KubeEventRecorder:
    """core/v1 Events on pods, written by one background thread. `record` never blocks and never raises.

    An Event said again while queued is one Event whose count grows; each Event's name is fixed when it is
    recorded, so a create retried after a timeout never writes it twice. Enforcement Events (`important`) take the
    next write before any other, and a full queue drops its oldest other Event to make room for one. Messages are
    shown to people by `kubectl describe`: their control and bidi characters are escaped (`text.printable`).
    Results are counted through `count` (written, patched, aggregated, dropped, failed).

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
        count: Callable[[str], None] | None = None,
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
        self.log = log if log is not None else structlog.get_logger("vramguard.events")
        self.bucket = bucket if bucket is not None else TokenBucket(EVENT_BURST, EVENT_PER_MINUTE, clock)
        self.correlator = correlator if correlator is not None else EventCorrelator(clock=clock)
        self.clock = clock
        self.rng = rng
        self.max_queue = max_queue
        self._count = count if count is not None else (lambda result: None)
        self._queue: OrderedDict[EventKey, _Pending] = OrderedDict()  # oldest first
        self._urgent: OrderedDict[EventKey, _Pending] = OrderedDict()  # important Events, oldest first; same bound
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._failures = FailureRun()  # writes failing: logged once per distinct error, not once per retry
        self._forbidden_since: float | None = None  # the first 403 since the last write that succeeded
        self._forbidden_told = False  # that run's 403s outlived the grace and the log said so
        self._denied: OrderedDict[str, float] = OrderedDict()  # namespace -> when its 403 outlived the grace
        self._writing = False  # an Event taken off the queue is being written
        self._thread = threading.Thread(target=self._run, name="vramguard-events", daemon=True)

    def start(self) -> None:
        """Start the writer thread."""
        self._thread.start()

    def record(self, pod: PodInfo, reason: str, message: str, warning: bool = True, important: bool = False) -> None:
        # Cut, escape, and cut again: an escape is up to ten characters, so escaping can lengthen the message.
        message = cut(printable(cut(message, EVENT_MESSAGE_CHARS)), EVENT_MESSAGE_CHARS)
        key = EventKey(pod.uid, reason, message)
        queue = self._urgent if important else self._queue
        with self._cond:
            pending = queue.get(key)
            if pending is not None:  # said again before it was even written: one Event, counted twice
                pending.count += 1
                pending.last = _now()
                self._count("aggregated")
                return
            if not self.correlator.allow(pod.uid, reason) or not self._room(important):
                self._count("dropped")
                return
            stamp = _now()
            queue[key] = _Pending(
                pod, reason, message, warning, important, _event_name(pod.name), 1, stamp, stamp, self.clock.now()
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
        self._count("dropped")
        return True

    def queued(self) -> int:
        """Events waiting to be written, the one being written included."""
        with self._cond:
            return len(self._queue) + len(self._urgent) + self._writing

    def stop(self, deadline: float) -> None:
        """Stop the writer; Events still queued are dropped (counted). Waits for the one being written until
        `deadline` at most: a request stuck there is abandoned (the thread is a daemon)."""
        self._stop.set()
        with self._cond:
            left = len(self._queue) + len(self._urgent)
            self._queue.clear()
            self._urgent.clear()
            self._cond.notify_all()
        for _ in range(left):
            self._count("dropped")
        if self._thread.ident is not None:
            self._thread.join(max(0.0, deadline - self.clock.now()))

    def flush(self, timeout_s: float) -> bool:
        """Block until nothing is queued or being written, `timeout_s` at most (real time: it waits on the writer
        thread); True when it emptied in time."""
        with self._cond:
            return self._cond.wait_for(lambda: not (self._queue or self._urgent or self._writing), timeout_s)

    # -- the writer thread -------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                while not (self._queue or self._urgent) and not self._stop.is_set():
                    self._cond.wait()
            # The token first, the Event second: an important Event recorded while the writer waits for a token
            # is the one that gets it.
            if not self.bucket.wait(self._stop):
                return
            with self._cond:
                if not (self._queue or self._urgent):
                    continue  # emptied by stop()
                key, item = (self._urgent or self._queue).popitem(last=False)
                self._writing = True
            try:
                self._deliver(key, item)
            finally:
                with self._cond:
                    self._writing = False
                    self._cond.notify_all()  # `flush` may be waiting for the queue to empty

    def _deliver(self, key: EventKey, item: _Pending) -> None:
        backoff = retry_backoff(self.rng)
        while not self._stop.is_set():
            if self.clock.now() - item.queued_at > EVENT_MAX_AGE_S:
                self._count("failed")
                self.log.warning("event_expired", pod=item.pod.key, reason=item.reason, age_s=EVENT_MAX_AGE_S)
                return
            try:
                self._write(key, item)
            except Exception as e:
                error = describe(e)
                if self._failures.failed(error):
                    self.log.warning("event_failed", pod=item.pod.key, reason=item.reason, error=error)
                delay = self._retry_in(item.pod.namespace, e, backoff)
                if delay is None:
                    self._count("failed")
                    return
                self.clock.wait(self._stop, delay)
                continue
            after = self._failures.error
            if self._failures.ok():
                self.log.info("events_restored", after=after)
            self._forbidden_since, self._forbidden_told = None, False
            self._denied.pop(item.pod.namespace, None)
            return

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

    def _write(self, key: EventKey, item: _Pending) -> None:
        seen = self.correlator.repeat_of(key)
        if seen is not None:  # the same thing said again: bump the count on the Event already written
            count = seen.count + item.count
            if self.sink.bump(seen.namespace, seen.name, count, item.last):
                self.correlator.wrote(key, seen.name, seen.namespace, count)
                self._count("patched")
                return
            self.correlator.gone(key)  # it expired or was deleted: write it afresh
        record = EventRecord(
            item.name, item.pod, item.reason, item.message, item.warning, item.count, item.first, item.last
        )
        # False: an earlier attempt whose answer was lost (a timeout) did write it; writing it again under another
        # name would be the duplicate the fixed name exists to prevent.
        self.sink.create(record)
        self.correlator.wrote(key, item.name, item.pod.namespace, item.count)
        self._count("written")


def _event_name(pod_name: str) -> str:
    """`<pod>.<hex nanoseconds>`, client-go's scheme, cut to fit the 253-character name limit."""
    return f"{pod_name[:235]}.{time.time_ns():x}"
