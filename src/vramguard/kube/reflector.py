"""The reflector: one kind of object kept in memory by a LIST and then a WATCH, as client-go's reflector keeps it.

Every object the agent reads from the API server (its pods, its Node, its ResourceSlices) comes through one
`Reflector`; what that costs the server is in docs/scale.md.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, Protocol

import structlog
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ReadTimeoutError

from vramguard.base.background import BackgroundLoop
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.logs import FailureRun
from vramguard.kube.client import TIMEOUT_LIST, describe, retry_backoff

# A watch is renewed after a random 5 to 10 minutes, so a fleet's renewals never line up.
WATCH_TIMEOUT_S: Final = (300, 600)
# Liveness: the API server's watch cache sends a bookmark once a minute on a watch that asks for them, whenever the
# resource changed anywhere in the cluster since the watch's resourceVersion (in a real cluster, pods always do).
# A watch silent for longer is on a server that stopped answering, or on a quiet resource: the watch is renewed,
# which tells the two apart. The pod source's watch does this for the agent; the others only guard against a dead
# connection (TCP keepalive, `load_api_client`, finds most sooner).
SILENCE_S: Final = 75.0
# A watch that outlives its own timeout by this much without a byte is on a dead connection.
DEAD_AFTER_S: Final = 30.0
# How long a renewal after silence may take before the API server is reported unreachable.
RENEWAL_GRACE_S: Final = 10.0
# After a working watch breaks (an API server restart breaks every agent's at once), the first retry waits a
# random part of this, so a fleet's LISTs and WATCHes reach the restarted server spread out, not in one burst.
SPREAD_S: Final = 20.0
# A watch open this long before it broke was working: the next failure starts a new run of back-off.
WORKING_S: Final = 30.0
# A watch the server ends sooner than this, with no event on it, counts as a failure (client-go does the same).
SHORT_WATCH_S: Final = 1.0


class WatchExpired(Exception):
    """The watch's resourceVersion is older than the API server keeps: relist."""


class ShortWatch(Exception):
    """The server ended a watch at once, with nothing on it (a proxy cutting long requests?): back off, do not spin."""


class WatchSilent(Exception):
    """Nothing arrived on the watch for `SILENCE_S`, not even a bookmark: renew it."""


class Store(Protocol):
    """What a reflector fills: a whole LIST, then each watch event."""

    def replace(self, items: Sequence[Mapping[str, Any]]) -> None:
        """Everything there is, from a LIST: what is not in `items` is gone."""

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        """One watch event: ADDED, MODIFIED or DELETED."""


# The client's list method for one kind, its selectors bound; the reflector adds what makes it a LIST or a WATCH.
ListCall = Callable[..., Any]
# Hears of each request a reflector makes: (resource, verb).
RequestCounter = Callable[[str, str], None]


def uncounted(resource: str, verb: str) -> None:
    """The default `RequestCounter`: counts nothing."""


Log = structlog.typing.FilteringBoundLogger


class Reflector:
    """List, then watch from the list's resourceVersion, for as long as it runs, on one daemon thread.

    - The first LIST asks for `resourceVersion=0`, later ones for `resourceVersion=<last seen>` with
      `resourceVersionMatch=NotOlderThan`: the API server answers both from its watch cache, not from its storage. A
      LIST that answers 410 (that version is gone) is repeated without a version.
    - A WATCH that ends (its timeout) is renewed at once from the last resourceVersion seen (bookmarks advance it).
      A 410 relists; any other error keeps the cache and the resourceVersion and watches again after a delay: a
      random part of `spread_s` after a working watch broke, then `retry_backoff` (a 403 too: a restarting API
      server answers one until its authorizer has loaded RBAC).
    - `problem()` says when the cache is incomplete, the watch broken, or the API server silent.
    """

    def __init__(
        self,
        name: str,
        list_call: ListCall,
        store: Store,
        *,
        log: Log,
        clock: Clock = SYSTEM_CLOCK,
        rng: Callable[[], float] = random.random,
        watch_timeout_s: tuple[int, int] = WATCH_TIMEOUT_S,
        silence_s: float | None = None,
        spread_s: float = SPREAD_S,
        retry_after: Callable[[Exception], float | None] = lambda e: None,
        count: RequestCounter = uncounted,
    ) -> None:
        """`silence_s`: renew the watch after this long without a byte from the server, and report the server
        unreachable when the renewal gets no answer (None: only after the watch's own timeout, a dead connection).
        `retry_after` may set the delay after an error instead of the back-off (the claim source waits long
        on an API server that does not serve its group). The delays pass on `clock` (`Clock.wait`), cut short by
        `stop`. `count` hears of each request (resource, verb), for metrics."""
        self.name = name
        self.list_call = list_call
        self.store = store
        self.log = log
        self.clock = clock
        self.rng = rng
        self.watch_timeout_s = watch_timeout_s
        self.silence_s = silence_s
        self.spread_s = spread_s
        self.retry_after = retry_after
        self.count = count
        self.lists = 0  # requests made, for tests and logs
        self.watches = 0
        self.listed = False  # a LIST succeeded: the cache was complete once
        self.connected = False  # the last request succeeded and no watch failed since
        self.last_heard: float | None = None  # when the API server last answered
        self.resource_version: str | None = None  # where the watch resumes; None: LIST first
        self._failures = FailureRun()  # the error of the failures since the last success
        self._listed = threading.Event()  # set with `listed`: what `wait_listed` waits on
        self._connected_since: float | None = None
        self._unreachable_since: float | None = None  # the server has not answered since (no reply at all)
        self._renewing_since: float | None = None  # a silent watch's renewal, while in flight
        self._response: Any = None
        self._backoff = retry_backoff(rng)
        self._list_version = "0"  # the first LIST: whatever the watch cache has
        self.loop = BackgroundLoop(f"vramguard-{name}-reflector", self._step, clock=clock, wake=self._wake, log=log)

    def start(self) -> None:
        self.loop.start()

    def stop(self, deadline: float) -> None:
        """End the thread, waiting for it until `deadline` at most: a request stuck there is abandoned (the thread
        is a daemon, and every request has its own timeout)."""
        self.loop.stop(deadline)

    def _wake(self) -> None:
        response = self._response
        if response is not None:
            response.shutdown()  # interrupts the read blocked in the thread; close() alone would wait for data

    def wait_listed(self, deadline: float) -> bool:
        """Block until the first LIST landed, or until `deadline` (on the clock's scale); True when it did."""
        return self._listed.wait(max(0.0, deadline - self.clock.now()))

    @property
    def error(self) -> str | None:
        """The last failure, until the next success."""
        return self._failures.error

    def synced(self) -> bool:
        return self.listed and self.connected

    def problem(self) -> str | None:
        if not self.listed:
            return f"{self.name} not listed yet" + (f": {self.error}" if self.error else "")
        if not self.connected:
            if self._unreachable_since is not None:
                down_s = self.clock.now() - self._unreachable_since
                return f"API server unreachable for {down_s:.0f}s ({self.name} watch: {self.error})"
            return f"{self.name} watch failed: {self.error}"
        renewing, heard = self._renewing_since, self.last_heard
        now = self.clock.now()
        if renewing is not None and heard is not None and now - renewing > RENEWAL_GRACE_S:
            return f"API server unreachable: no answer on the {self.name} watch for {now - heard:.0f}s"
        return None

    # -- the loop ----------------------------------------------------------------------------------------------

    def _step(self) -> float:
        """A LIST when there is no resourceVersion to resume from, then one WATCH until it ends; the delay before the
        next round (0 but after a failure)."""
        try:
            if self.resource_version is None:
                self._list(self._list_version)
            self._watch()
            self._backoff.reset()
        except WatchSilent:
            self._renewing_since = self.clock.now()
        except WatchExpired:
            self.log.info("watch_expired", watch=self.name, detail="410 Gone: relisting")
            self._list_version, self.resource_version = self.resource_version or "", None
        except Exception as e:
            if self.loop.stopping.is_set():
                return 0.0
            if self.resource_version is None and _version_gone(e):
                self._list_version = ""  # asked for a version the server no longer has: the latest, then
            delay = self.retry_after(e)
            if delay is None and self._working():
                self._backoff.reset()
                delay = self.spread_s * self.rng()
            elif delay is None:
                delay = self._backoff.next()
            self._failed(e, delay)
            return delay
        return 0.0

    def _working(self) -> bool:
        """Whether the watch that just broke had been working for a while (not failing again at once)."""
        since = self._connected_since
        return self.connected and since is not None and self.clock.now() - since >= WORKING_S

    def _failed(self, e: Exception, delay: float) -> None:
        error = describe(e)
        # Once per run of failures, not once per retry, nor again when the error's text changes (a refused
        # connection's names the connection object).
        if not self._failures.failing:
            self.log.warning("watch_failed", watch=self.name, error=error, retry_in_s=round(delay, 1))
        self._failures.failed(error)
        if isinstance(e, ApiException) and e.status:
            self._unreachable_since = None  # it answered, with an error
        elif self._unreachable_since is None:
            self._unreachable_since = self._renewing_since or self.clock.now()
        self.connected = False
        self._renewing_since = None

    def _heard(self) -> None:
        self.last_heard = self.clock.now()
        self._renewing_since = self._unreachable_since = None
        if not self.connected:
            self._connected_since = self.last_heard
        after = self._failures.error
        if self._failures.ok() and self.listed:
            self.log.info("watch_restored", watch=self.name, after=after)
        self.connected = True

    def _list(self, resource_version: str) -> None:
        match = {"resource_version_match": "NotOlderThan"} if resource_version not in ("", "0") else {}
        self.lists += 1
        self.count(self.name, "LIST")
        # Raw JSON (`_preload_content=False`): the stores read plain dicts, skipping the client's model objects.
        resp = self.list_call(
            resource_version=resource_version, _preload_content=False, _request_timeout=TIMEOUT_LIST, **match
        )
        body = json.loads(resp.data)
        self.store.replace(body.get("items") or [])
        self.listed = True
        self._heard()
        self.resource_version = str(body["metadata"]["resourceVersion"])
        self._listed.set()

    def _watch(self) -> None:
        """Watch from `resource_version` until the server ends the watch, advancing `resource_version`."""
        low, high = self.watch_timeout_s
        timeout_s = int(low + (high - low) * self.rng())
        self.watches += 1
        self.count(self.name, "WATCH")
        resp = self.list_call(
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=self.resource_version,
            timeout_seconds=timeout_s,
            _preload_content=False,  # raw JSON lines, read by watch_events
            # The read timeout bounds each wait for the server's next bytes.
            _request_timeout=(TIMEOUT_LIST[0], self.silence_s or timeout_s + DEAD_AFTER_S),
        )
        self._response = resp
        events = 0
        try:
            if self.loop.stopping.is_set():
                return
            self._heard()
            opened = self.clock.now()
            for event in watch_events(resp):
                if self.loop.stopping.is_set():
                    return
                events += 1
                self.last_heard = self.clock.now()
                kind, obj, self.resource_version = watched_object(event, self.resource_version or "")
                if kind != "BOOKMARK":
                    self.store.apply(kind, obj)
        except ReadTimeoutError as e:
            raise WatchSilent() from e
        finally:
            self._response = None
            resp.release_conn()
        if not events and self.clock.now() - opened < SHORT_WATCH_S:
            raise ShortWatch(f"the server ended the {self.name} watch at once, with no event")


def _version_gone(e: Exception) -> bool:
    """A LIST's resourceVersion the server cannot serve: expired (410), or newer than it has (a restored backup)."""
    if not isinstance(e, ApiException):
        return False
    return e.status == 410 or (e.status == 504 and "Too large resource version" in str(e.body or ""))


def watched_object(event: Mapping[str, Any], resource_version: str) -> tuple[str, Mapping[str, Any], str]:
    """(type, object, resourceVersion to resume from) of one watch event. Raises WatchExpired for a 410
    (relist), RuntimeError for any other ERROR event."""
    kind, obj = str(event.get("type")), event.get("object") or {}
    if kind == "ERROR":
        if obj.get("code") == 410:
            raise WatchExpired()
        raise RuntimeError(f"watch error {obj.get('code')}: {str(obj.get('message'))[:200]}")
    return kind, obj, str((obj.get("metadata") or {}).get("resourceVersion") or resource_version)


def watch_events(resp: Any) -> Iterator[dict[str, Any]]:
    """Watch events, one JSON object per line of a chunked response."""
    pending = b""
    for chunk in resp.stream(amt=65536, decode_content=False):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)
    if pending.strip():
        yield json.loads(pending)
