"""The Kubernetes adapters: the pod cache, Events, Eviction and node capacity — every call to the API server.

Each class implements one seam of `vramguard.ports` and converts between the API's objects and the agent's own
types here, at the edge, so nothing else in the agent imports the client.

Nothing here runs on the scan thread's time: the pod cache is read from memory, and every request is made by a
background thread with a request timeout (`_TIMEOUT_*`), so a frozen, slow or absent API server never delays a
scan, and the agent stops within a second or two whatever the API server does. The client's own urllib3 retries
are off (`load_api_client`): every retry is ours, with jittered back-off (`vramguard.backoff`).

Contract with the API server (what the agent costs a cluster):
- Pods: one LIST of the pods bound to this node (`fieldSelector=spec.nodeName=<node>`), then one long WATCH
  from its resourceVersion, with bookmarks, renewed every 5 to 10 minutes (randomised); a 410 Gone relists; errors
  back off exponentially with jitter (1 s → 60 s), so a fleet does not relist in lockstep after a restart.
- Node: one GET of its own Node every `NODE_REFRESH_S` (5 s, jittered): its labels (fair share reads
  `nvidia.com/gpu.replicas`, so a changed label applies within seconds) and the proof that the API server
  answers (`/readyz` says "unreachable" within seconds of a freeze). RBAC stays `get` on nodes: a watch of one
  node would need `list` and `watch` on every node.
- Events (client-go's recorder, for an agent): queued, at most `EVENT_QUEUE` waiting; a spam filter per
  (pod, reason) — `EVENT_SPAM_BURST` at once, then one per `EVENT_SPAM_REFILL_S` — so one noisy pod cannot
  starve the others; an Event repeated while queued or within 10 minutes of being written is one object whose
  count grows (a PATCH); writes paced at `EVENT_BURST` at once and `EVENT_PER_MINUTE` after that. Each Event's
  name is fixed when it is recorded, so a create retried after a timeout can never write it twice. What is over
  a bound is dropped and counted (`vramguard_events_total{result="dropped"}`). Enforcement Events (`important`:
  a kill, an eviction, a refused or failed one) take the next token before any other, and a full queue makes
  room for one by dropping its oldest other Event: warnings never delay or crowd them out. Messages are shown
  to people by `kubectl describe`: their control and bidi characters are escaped (`text.printable`).
- Eviction: one POST per decided eviction, on the enforcer's worker; a 429 (a PodDisruptionBudget says no) is
  retried `attempts` times with jittered back-off, then reported refused.
- Capacity: one status PATCH when the advertised amount changes, none otherwise; failures back off (10 s → 10 min).
"""

from __future__ import annotations

import abc
import functools
import json
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

import structlog
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from vramguard.backoff import Backoff, TokenBucket
from vramguard.model import MAX_TEXT_CHARS, GpuSample, PodInfo, cut
from vramguard.pods import PodSourceError, pod_info_from_manifest
from vramguard.ports import EvictResult
from vramguard.text import printable
from vramguard.worker import Runner, Worker

VRAM_RESOURCE = "vramguard.io/vram"
COMPONENT = "vramguard"

# Events
EVENT_QUEUE = 256
EVENT_SPAM_BURST = 25
EVENT_SPAM_REFILL_S = 300.0
EVENT_BURST = 25
EVENT_PER_MINUTE = 20
EVENT_REPEAT_WINDOW_S = 600.0
EVENT_MAX_AGE_S = 600.0  # an Event still unwritten after this long is stale news: dropped as failed
EVENT_MESSAGE_CHARS = MAX_TEXT_CHARS

# Node labels and reachability
NODE_REFRESH_S = 5.0

# Request timeouts, (connect, read) seconds. The read timeout bounds each wait for the server's next bytes.
_TIMEOUT_WRITE = (5.0, 10.0)
_TIMEOUT_LIST = (5.0, 30.0)
_TIMEOUT_NODE = (3.0, 3.0)

Log = structlog.typing.FilteringBoundLogger


def load_api_client(kubeconfig: str | None) -> client.ApiClient:
    """An API client from a kubeconfig file, or the in-cluster ServiceAccount when none is given.

    urllib3's own retries are turned off: they would multiply every request timeout by four, behind the back of
    the agent's back-off.
    """
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.retries = False
    return client.ApiClient(configuration)


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


def _describe(e: BaseException) -> str:
    if isinstance(e, ApiException):
        return f"{e.status} {e.reason}"
    return f"{type(e).__name__}: {e}"[:300]


def _transient(e: BaseException) -> bool:
    """Worth retrying: no answer (timeouts, refused connections) or the server saying "later"."""
    if isinstance(e, ApiException):
        return not e.status or e.status == 429 or e.status >= 500
    return True


# --------------------------------------------------------------------------------------------------------------
# The pod cache


_Source = TypeVar("_Source", bound="WatchingThreads")


class WatchingThreads(abc.ABC):
    """Daemon threads that keep a cache from the API server: started together, stopped together within a timeout
    (a watch in flight is cut at once, a stuck request abandoned), and `synced()` once the cache is complete."""

    _threads: tuple[threading.Thread, ...]
    _stop: threading.Event
    _stream: WatchStream

    @abc.abstractmethod
    def synced(self) -> bool:
        """Whether the cache is complete."""

    def start(self: _Source) -> _Source:
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout_s: float = 1.0) -> None:
        """Ends the threads; returns within `timeout_s` even if a request is stuck (the threads are daemons)."""
        self._stop.set()
        self._stream.interrupt()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            if t.is_alive():
                t.join(max(0.0, deadline - time.monotonic()))

    def wait_synced(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.synced() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.synced()

    def _list_and_watch(
        self,
        list_: Callable[[], str],
        watch: Callable[[str], str],
        failed: Callable[[Exception, Backoff], float],
        expired: Callable[[], None] = lambda: None,
    ) -> None:
        """The reflector's loop, until stopped: LIST (`list_` returns its resourceVersion), then WATCH from there
        (`watch` returns where to resume) again and again; a 410 relists (after `expired`); any other error relists
        after the delay `failed` returns (it records the error, and takes the delay from the back-off or not)."""
        backoff = Backoff(1.0, 60.0)
        resource_version: str | None = None
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    resource_version = list_()
                    backoff.reset()
                resource_version = watch(resource_version)
            except WatchExpired:
                expired()
                resource_version = None
            except Exception as e:  # the API server is down or refusing: keep the cache, back off, relist
                if self._stop.is_set():
                    break
                resource_version = None
                self._stop.wait(failed(e, backoff))


class KubePodSource(WatchingThreads):
    """The pods bound to one node, kept current by a list+watch on a background thread, and the node's labels,
    re-read by a second one (which also tells whether the API server answers).

    `synced()` is true from the first successful LIST until the watch breaks, and again after the next relist;
    `problem()` also reports an API server that stopped answering. Either way the agent keeps enforcing with
    the pods it has. A relist replaces the cache whole, so a pod deleted while the agent was disconnected is
    forgotten, never acted on.
    """

    def __init__(
        self,
        api: client.ApiClient,
        node_name: str,
        *,
        watch_timeout_s: int = 300,
        node_refresh_s: float = NODE_REFRESH_S,
        log: Log | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.node_name = node_name
        self.node_refresh_s = node_refresh_s
        self.log = log if log is not None else structlog.get_logger("vramguard.pods")
        self.now = now
        self._stop = threading.Event()
        self._pods: dict[str, PodInfo] = {}
        self._labels: dict[str, str] | None = None  # None until the node was read once
        self._connected = False
        self._listed = False
        self._watch_error: str | None = None
        self._unreachable: tuple[str, float] | None = None  # (error, since) while the node GET fails
        self._stream = WatchStream(self._stop, watch_timeout_s)
        self.lists = 0  # LIST requests made, for tests and logs
        self._threads = (
            threading.Thread(target=self._watch_pods, name="vramguard-pod-watch", daemon=True),
            threading.Thread(target=self._watch_node, name="vramguard-node-labels", daemon=True),
        )

    # -- PodSource ------------------------------------------------------------------------------------------

    def pods(self) -> Mapping[str, PodInfo]:
        return self._pods  # replaced, never mutated: a reader always sees one consistent version

    def synced(self) -> bool:
        return self._listed and self._connected

    def problem(self) -> str | None:
        unreachable = self._unreachable
        if unreachable is not None:
            error, since = unreachable
            return f"API server unreachable for {self.now() - since:.0f}s: {error}"
        if not self._listed:
            return "pod cache not synced" + (f": {self._watch_error}" if self._watch_error else "")
        if not self._connected:
            return f"pod watch disconnected: {self._watch_error}"
        return None

    def node_labels(self) -> Mapping[str, str]:
        return self._labels or {}

    # -- the pod watch ---------------------------------------------------------------------------------------

    def _watch_pods(self) -> None:
        self._list_and_watch(
            self._list,
            self._watch,
            self._watch_failed,
            expired=lambda: self.log.info("pod_watch_expired", detail="410 Gone: relisting"),
        )

    def _watch_failed(self, e: Exception, backoff: Backoff) -> float:
        delay = backoff.next()
        if self._connected or self._watch_error is None:
            self.log.warning("pod_watch_disconnected", error=_describe(e), retry_in_s=round(delay, 1))
        self._connected = False
        self._watch_error = _describe(e)
        return delay

    def _list(self) -> str:
        # Raw responses (`_preload_content=False`): the agent reads plain JSON into its own types, skipping the
        # client's model objects, which cost more than the whole conversion.
        resp: Any = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node_name}", _preload_content=False, _request_timeout=_TIMEOUT_LIST
        )
        body = json.loads(resp.data)
        pods: dict[str, PodInfo] = {}
        for item in body.get("items") or []:
            info = self._convert(item)
            if info is not None:
                pods[info.uid] = self._keep_identity(info)
        # Labels before pods: a reader that sees these pods must also see their node's labels, or a fair share
        # would be computed without nvidia.com/gpu.replicas (the whole GPU) for a scan.
        if self._labels is None:
            self._labels = self._read_node_labels()
        self._pods = pods
        self.lists += 1
        if not self._connected:
            self.log.info("pod_cache_synced", pods=len(pods), resource_version=body["metadata"]["resourceVersion"])
        self._listed = self._connected = True
        self._watch_error = None
        return str(body["metadata"]["resourceVersion"])

    def _watch(self, resource_version: str) -> str:
        selected = functools.partial(
            self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={self.node_name}"
        )
        return self._stream.run(selected, resource_version, self.apply_watch_event)

    def apply_watch_event(self, event: Mapping[str, Any], resource_version: str) -> str:
        """Apply one watch event to the cache; the resourceVersion to resume from. Raises WatchExpired for a
        410 (relist), RuntimeError for any other ERROR event."""
        kind, obj, rv = watched_object(event, resource_version)
        if kind == "BOOKMARK":
            return rv
        info = self._convert(obj)
        if info is None:
            return rv
        info = self._keep_identity(info)  # most MODIFIED events are status changes the agent does not read
        pods = dict(self._pods)
        if kind == "DELETED":
            pods.pop(info.uid, None)
        else:
            pods[info.uid] = info
        self._pods = pods
        return rv

    def _convert(self, obj: Mapping[str, Any]) -> PodInfo | None:
        try:
            return pod_info_from_manifest(obj)
        except (PodSourceError, ValueError, TypeError) as e:
            self.log.warning("pod_unreadable", error=str(e)[:300])
            return None

    def _keep_identity(self, info: PodInfo) -> PodInfo:
        """The cached object when nothing changed, so quotas resolved for it stay resolved (see QuotaBook)."""
        old = self._pods.get(info.uid)
        return old if old == info else info

    # -- the node's labels, and whether the API server answers ------------------------------------------------

    def _watch_node(self) -> None:
        backoff = Backoff(self.node_refresh_s, 60.0)
        while not self._stop.is_set():
            try:
                labels = self._read_node_labels()
            except Exception as e:
                if self._stop.is_set():
                    break
                error = _describe(e)
                if self._unreachable is None:
                    self.log.warning("api_server_unreachable", error=error)
                    self._unreachable = (error, self.now())
                else:
                    self._unreachable = (error, self._unreachable[1])
                # Short retries at first, so readiness comes back within seconds of the API server.
                self._stop.wait(min(backoff.next(), self.node_refresh_s))
                continue
            backoff.reset()
            if self._unreachable is not None:
                self.log.info("api_server_reachable", down_for_s=round(self.now() - self._unreachable[1], 1))
                self._unreachable = None
            if labels != self._labels:
                if self._labels is not None:
                    self.log.info("node_labels_changed", node=self.node_name)
                self._labels = labels
            self._stop.wait(self.node_refresh_s * (0.75 + 0.5 * random.random()))

    def _read_node_labels(self) -> dict[str, str]:
        try:
            resp: Any = self.core.read_node(self.node_name, _preload_content=False, _request_timeout=_TIMEOUT_NODE)
        except ApiException as e:
            if e.status == 404:
                if self._labels is None or self._labels:
                    self.log.warning("node_not_found", node=self.node_name)
                return {}
            raise
        labels = (json.loads(resp.data).get("metadata") or {}).get("labels") or {}
        return {str(k): str(v) for k, v in labels.items()}


class WatchExpired(Exception):
    """The watch's resourceVersion is too old: relist."""


_Apply = Callable[[Mapping[str, Any], str], str]


class WatchStream:
    """The watch half of a list+watch: opens a watch for a randomised renewal period (as client-go's reflector
    does, so a fleet's watches do not expire together), hands each event to `apply`, and can be cut at once from
    another thread (`interrupt`, for a prompt stop)."""

    def __init__(self, stop: threading.Event, timeout_s: int) -> None:
        self.stop = stop
        self.timeout_s = timeout_s
        self._response: Any = None

    def run(self, list_call: Callable[..., Any], resource_version: str, apply: _Apply) -> str:
        """Watch from `resource_version` until the server ends the watch; the resourceVersion to resume from.
        `list_call` is the client's list method with its selectors bound; this adds the watch's parameters."""
        timeout_s = int(self.timeout_s * (1 + random.random()))
        resp = list_call(
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=resource_version,
            timeout_seconds=timeout_s,
            _preload_content=False,  # raw JSON lines, read by watch_events
            # The read timeout outlasts the server's own timeout: only a dead connection trips it. A frozen API
            # server is noticed sooner by the node refresh (`problem()`), which does not need to break the watch.
            _request_timeout=(_TIMEOUT_LIST[0], timeout_s + 30),
        )
        self._response = resp
        try:
            if self.stop.is_set():
                return resource_version
            for event in watch_events(resp):
                if self.stop.is_set():
                    break
                resource_version = apply(event, resource_version)
        finally:
            self._response = None
            resp.release_conn()
        return resource_version

    def interrupt(self) -> None:
        response = self._response
        if response is not None:
            # shutdown() interrupts the read blocked in the watch thread; close() alone would wait for data.
            response.shutdown()


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


# --------------------------------------------------------------------------------------------------------------
# Events


@dataclass(slots=True)
class _Pending:
    """An Event waiting for the writer, with the repeats that arrived meanwhile folded into its count."""

    pod: PodInfo
    reason: str
    message: str
    warning: bool
    important: bool  # an enforcement Event: written ahead of the others, never dropped to make room for them
    name: str  # fixed at record time: a create retried after a timeout hits 409, never a second object
    count: int
    first: datetime
    last: datetime
    queued_at: float


@dataclass(slots=True)
class _Written:
    name: str
    namespace: str
    count: int
    at: float


_Key = tuple[str, str, str]  # (pod UID, reason, message)


class KubeEventRecorder:
    """core/v1 Events on pods, written by one background thread. `record` never blocks and never raises.

    The bounds and the aggregation are in the module docstring. Results are counted through `count` (written,
    patched, aggregated, dropped, failed).
    """

    def __init__(
        self,
        api: client.ApiClient,
        node_name: str,
        *,
        count: Callable[[str], None] | None = None,
        max_queue: int = EVENT_QUEUE,
        bucket: TokenBucket | None = None,
        spam_burst: int = EVENT_SPAM_BURST,
        spam_refill_s: float = EVENT_SPAM_REFILL_S,
        now: Callable[[], float] = time.monotonic,
        log: Log | None = None,
        core: Any = None,
    ) -> None:
        """`core` is what writes: a CoreV1Api over `api` unless given (tests give a fake). Nothing is written
        before `start()`: until then, what `record` queues stays queued."""
        self.core = core if core is not None else client.CoreV1Api(api)
        self.node_name = node_name
        self.log = log if log is not None else structlog.get_logger("vramguard.events")
        self.bucket = bucket if bucket is not None else TokenBucket(EVENT_BURST, EVENT_PER_MINUTE, now)
        self.now = now
        self.max_queue = max_queue
        self._spam_burst = spam_burst
        self._spam_per_minute = 60.0 / spam_refill_s
        self._count = count if count is not None else (lambda result: None)
        self._spam: OrderedDict[tuple[str, str], TokenBucket] = OrderedDict()  # LRU, bounded like client-go's
        self._queue: OrderedDict[_Key, _Pending] = OrderedDict()  # oldest first
        self._urgent: OrderedDict[_Key, _Pending] = OrderedDict()  # important Events, oldest first; same bound
        self._written: dict[_Key, _Written] = {}  # touched by the writer thread only
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._last_error: str | None = None
        self._writing = False  # an Event taken off the queue is being written
        self._thread = threading.Thread(target=self._run, name="vramguard-events", daemon=True)

    def start(self) -> KubeEventRecorder:
        """Start the writer thread."""
        self._thread.start()
        return self

    def record(self, pod: PodInfo, reason: str, message: str, warning: bool = True, important: bool = False) -> None:
        # Cut, escape, and cut again: an escape is up to ten characters, so escaping can lengthen the message.
        message = cut(printable(cut(message, EVENT_MESSAGE_CHARS)), EVENT_MESSAGE_CHARS)
        key = (pod.uid, reason, message)
        queue = self._urgent if important else self._queue
        with self._cond:
            pending = queue.get(key)
            if pending is not None:  # said again before it was even written: one Event, counted twice
                pending.count += 1
                pending.last = _now()
                self._count("aggregated")
                return
            if not self._spam_filter(pod.uid, reason) or not self._room(important):
                self._count("dropped")
                return
            stamp = _now()
            queue[key] = _Pending(
                pod, reason, message, warning, important, _event_name(pod.name), 1, stamp, stamp, self.now()
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

    def stop(self, timeout_s: float = 1.0) -> None:
        """Stop the writer; Events still queued are dropped (counted). Returns within `timeout_s`."""
        self._stop.set()
        with self._cond:
            left = len(self._queue) + len(self._urgent)
            self._queue.clear()
            self._urgent.clear()
            self._cond.notify_all()
        for _ in range(left):
            self._count("dropped")
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def flush(self, timeout_s: float) -> bool:
        """Wait until the queue is empty (tests; a graceful stop). True when it emptied in time."""
        deadline = time.monotonic() + timeout_s
        while self.queued() and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self.queued()

    def _spam_filter(self, uid: str, reason: str) -> bool:
        key = (uid, reason)
        bucket = self._spam.get(key)
        if bucket is None:
            bucket = self._spam[key] = TokenBucket(self._spam_burst, self._spam_per_minute, self.now)
            if len(self._spam) > 4096:
                self._spam.popitem(last=False)
        else:
            self._spam.move_to_end(key)
        return bucket.take()

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

    def _deliver(self, key: _Key, item: _Pending) -> None:
        backoff = Backoff(1.0, 10.0)  # short: Events owed during an outage should arrive soon after it
        while not self._stop.is_set():
            if self.now() - item.queued_at > EVENT_MAX_AGE_S:
                self._count("failed")
                self.log.warning("event_expired", pod=item.pod.key, reason=item.reason, age_s=EVENT_MAX_AGE_S)
                return
            try:
                self._write(key, item)
            except Exception as e:
                error = _describe(e)
                if error != self._last_error:  # once per distinct error, not once per retry
                    self.log.warning("event_failed", pod=item.pod.key, reason=item.reason, error=error)
                    self._last_error = error
                if not _transient(e):
                    self._count("failed")
                    return
                self._stop.wait(backoff.next())
                continue
            self._last_error = None
            return

    def _write(self, key: _Key, item: _Pending) -> None:
        t = self.now()
        self._written = {k: w for k, w in self._written.items() if t - w.at < EVENT_REPEAT_WINDOW_S}
        seen = self._written.get(key)
        if seen is not None:  # the same thing said again: bump the count on the Event already written
            try:
                self.core.patch_namespaced_event(
                    seen.name,
                    seen.namespace,
                    {"count": seen.count + item.count, "lastTimestamp": item.last.strftime("%Y-%m-%dT%H:%M:%SZ")},
                    _content_type="application/merge-patch+json",
                    _request_timeout=_TIMEOUT_WRITE,
                )
            except ApiException as e:
                if e.status != 404:
                    raise
                del self._written[key]  # it expired or was deleted: write it afresh
            else:
                seen.count += item.count
                seen.at = t
                self._count("patched")
                return
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=item.name, namespace=item.pod.namespace),
            involved_object=client.V1ObjectReference(
                api_version="v1", kind="Pod", namespace=item.pod.namespace, name=item.pod.name, uid=item.pod.uid
            ),
            reason=item.reason,
            message=item.message,
            type="Warning" if item.warning else "Normal",
            source=client.V1EventSource(component=COMPONENT, host=self.node_name),
            reporting_component=f"{COMPONENT}.io/agent",
            reporting_instance=self.node_name,
            first_timestamp=item.first,
            last_timestamp=item.last,
            count=item.count,
        )
        try:
            self.core.create_namespaced_event(item.pod.namespace, event, _request_timeout=_TIMEOUT_WRITE)
        except ApiException as e:
            # 409: an earlier attempt whose answer was lost (a timeout) did write it; writing it again would be
            # the duplicate the fixed name exists to prevent.
            if e.status != 409:
                raise
        self._written[key] = _Written(item.name, item.pod.namespace, item.count, t)
        self._count("written")


def _event_name(pod_name: str) -> str:
    """`<pod>.<hex nanoseconds>`, client-go's scheme, cut to fit the 253-character name limit."""
    return f"{pod_name[:235]}.{time.time_ns():x}"


# --------------------------------------------------------------------------------------------------------------
# Eviction


class KubeEvictor:
    """policy/v1 Eviction, so PodDisruptionBudgets are respected. Preconditioned on the pod's UID: a pod
    re-created under the same name is never evicted for its predecessor's usage.

    Blocking, with request timeouts: the enforcer calls it from its background worker, never from the scan.
    """

    def __init__(
        self,
        api: client.ApiClient,
        *,
        attempts: int = 3,
        backoff: Callable[[], Backoff] = lambda: Backoff(0.5, 4.0),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.attempts = attempts
        self.backoff = backoff
        self.sleep = sleep

    def evict(self, pod: PodInfo, message: str) -> EvictResult:
        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=pod.name, namespace=pod.namespace),
            delete_options=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=pod.uid)),
        )
        last = ""
        backoff = self.backoff()
        for attempt in range(self.attempts):
            try:
                self.core.create_namespaced_pod_eviction(pod.name, pod.namespace, body, _request_timeout=_TIMEOUT_WRITE)
                return EvictResult(evicted=True, refused=False)
            except ApiException as e:
                if e.status == 429:
                    last = _status_message(e)
                    if attempt + 1 < self.attempts:
                        self.sleep(backoff.next())
                    continue
                if e.status in (404, 409):  # gone already, or a new pod under the old name
                    return EvictResult(evicted=False, refused=False, gone=True, message=_status_message(e))
                return EvictResult(evicted=False, refused=False, message=f"{e.status}: {_status_message(e)}")
            except Exception as e:  # no answer: a timeout, a refused connection
                return EvictResult(evicted=False, refused=False, message=_describe(e))
        return EvictResult(evicted=False, refused=True, message=last)


def _status_message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason)[:300]
    except ValueError:
        return str(e.reason)


# --------------------------------------------------------------------------------------------------------------
# Node capacity


def advertisable_bytes(sample: GpuSample, reserve_bytes: int) -> int:
    """GPU memory the scheduler may hand out: every schedulable memory domain (a whole GPU, or the MIG
    instances of a partitioned one — not the parent as well) that answers NVML, minus the reserve, never below
    zero."""
    partitioned = {d.parent_uuid for d in sample.devices if d.parent_uuid is not None}
    total = sum(d.total_bytes for d in sample.devices if d.healthy and d.uuid not in partitioned)
    return max(0, total - reserve_bytes)


_UNKNOWN = "unknown"


class KubeCapacityPublisher:
    """Advertises `vramguard.io/vram` in the Node's status capacity and allocatable, or withdraws it.

    `publish` and `withdraw` only hand the PATCH to a background worker; a PATCH is made only when the amount
    differs from the last one published, and after a failure not before the back-off (10 s doubling to 10 min,
    jittered) has passed: a policy that denies it must not cost the API server one PATCH per scan.
    """

    def __init__(
        self,
        api: client.ApiClient,
        node_name: str,
        reserve_bytes: int = 0,
        log: Log | None = None,
        now: Callable[[], float] = time.monotonic,
        runner: Runner | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.node_name = node_name
        self.reserve_bytes = reserve_bytes
        self.log = log if log is not None else structlog.get_logger("vramguard.capacity")
        self.now = now
        self.runner: Runner = runner if runner is not None else Worker("vramguard-capacity", max_queue=1)
        self._published: int | str | None = _UNKNOWN
        self._in_flight = False
        self._retry_at = 0.0
        self._backoff = backoff if backoff is not None else Backoff(10.0, 600.0, jitter=0.2)
        self._last_error: str | None = None

    def publish(self, sample: GpuSample) -> None:
        self._submit(advertisable_bytes(sample, self.reserve_bytes))

    def withdraw(self) -> None:
        self._submit(None)

    def stop(self, timeout_s: float = 1.0) -> None:
        self.runner.stop(timeout_s)

    def _submit(self, total_bytes: int | None) -> None:
        if self._in_flight or total_bytes == self._published or self.now() < self._retry_at:
            return
        self._in_flight = True
        if not self.runner.submit(lambda: self._patch(total_bytes)):
            self._in_flight = False

    def _patch(self, total_bytes: int | None) -> None:
        value = str(total_bytes) if total_bytes is not None else None
        # A JSON merge patch sets the key, or with null removes it (and removing an absent key is no error).
        patch = {"status": {"capacity": {VRAM_RESOURCE: value}, "allocatable": {VRAM_RESOURCE: value}}}
        try:
            self.core.patch_node_status(
                self.node_name, patch, _content_type="application/merge-patch+json", _request_timeout=_TIMEOUT_WRITE
            )
        except Exception as e:  # best effort: the scheduler's view must never hold up enforcement
            error = _describe(e)
            delay = self._backoff.next()
            if error != self._last_error:  # once per distinct error, not once per retry
                self.log.warning("capacity_publish_failed", node=self.node_name, error=error, retry_in_s=round(delay))
            self._last_error = error
            self._retry_at = self.now() + delay
            self._in_flight = False
            return
        self.log.info("capacity_published", node=self.node_name, resource=VRAM_RESOURCE, bytes=total_bytes)
        self._published = total_bytes
        self._backoff.reset()
        self._last_error = None
        self._in_flight = False  # last: a scan that sees it false also sees what was published
