"""The Kubernetes adapters: the pod cache, Events, Eviction and node capacity — every call to the API server.

Each class implements one seam of `vramguard.ports` and converts between the API's objects and the agent's own
types here, at the edge, so nothing else in the agent imports the client.

Contract with the API server (what the agent costs a cluster):
- Pods: one LIST of the pods bound to this node (`fieldSelector=spec.nodeName=<node>`), then one long WATCH
  from its resourceVersion, with bookmarks, renewed every `watch_timeout_s`; a 410 Gone relists; errors back off
  exponentially (1 s → 60 s). No request per scan.
- Node: one GET at start and after each relist, for its labels (fair share reads `nvidia.com/gpu.replicas`).
- Events: at most `EVENT_BURST` writes at once and `EVENT_PER_MINUTE` per minute after that (a token bucket);
  an Event identical to one written in the last 10 minutes is a PATCH of its count, not a new object. What is
  over the bound is dropped and counted (`vramguard_events_total{result="dropped"}`), never queued.
- Eviction: one POST per decided eviction; a 429 (a PodDisruptionBudget says no) is retried `attempts` times
  with doubling back-off, then reported refused.
- Capacity: one status PATCH when the advertised amount changes, none otherwise.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import structlog
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from vramguard.model import GpuSample, PodInfo
from vramguard.pods import PodSourceError, pod_info_from_manifest
from vramguard.ports import EvictResult

VRAM_RESOURCE = "vramguard.io/vram"
EVENT_BURST = 25
EVENT_PER_MINUTE = 20
EVENT_REPEAT_WINDOW_S = 600.0
COMPONENT = "vramguard"

Log = structlog.typing.FilteringBoundLogger


def load_api_client(kubeconfig: str | None) -> client.ApiClient:
    """An API client from a kubeconfig file, or the in-cluster ServiceAccount when none is given."""
    if kubeconfig:
        api: client.ApiClient = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        return api
    config.load_incluster_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


# --------------------------------------------------------------------------------------------------------------
# The pod cache


class KubePodSource:
    """The pods bound to one node, kept current by a list+watch on a background thread.

    `synced()` is true from the first successful LIST until the connection to the API server is lost, and again
    after the next successful relist; while disconnected the agent keeps enforcing with the pods it has. A relist
    replaces the cache whole, so a pod deleted while the agent was disconnected is forgotten, never acted on.
    """

    def __init__(
        self,
        api: client.ApiClient,
        node_name: str,
        *,
        watch_timeout_s: int = 300,
        log: Log | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.node_name = node_name
        self.watch_timeout_s = watch_timeout_s
        self.log = log if log is not None else structlog.get_logger("vramguard.pods")
        self._stop = threading.Event()
        self._sleep = sleep if sleep is not None else self._stop.wait
        self._pods: dict[str, PodInfo] = {}
        self._labels: dict[str, str] = {}
        self._connected = False
        self._listed = False
        self._response: Any = None  # the watch in flight, closed by stop() to end it at once
        self.lists = 0  # LIST requests made, for tests and logs
        self._thread = threading.Thread(target=self._run, name="vramguard-pod-watch", daemon=True)

    # -- PodSource ------------------------------------------------------------------------------------------

    def pods(self) -> Mapping[str, PodInfo]:
        return self._pods  # replaced, never mutated: a reader always sees one consistent version

    def synced(self) -> bool:
        return self._listed and self._connected

    def problem(self) -> str | None:
        return None if self.synced() else "pod cache not synced"

    def node_labels(self) -> Mapping[str, str]:
        return self._labels

    # -- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> KubePodSource:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            # shutdown() interrupts the read blocked in the watch thread; close() alone would wait for data.
            response.shutdown()
        self._thread.join(timeout=5)

    def wait_synced(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.synced() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.synced()

    # -- the loop --------------------------------------------------------------------------------------------

    def _run(self) -> None:
        backoff_s = 1.0
        resource_version: str | None = None
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    resource_version = self._list()
                resource_version = self._watch(resource_version)
                backoff_s = 1.0
            except _Gone:
                self.log.info("pod_watch_expired", detail="410 Gone: relisting")
                resource_version = None
            except Exception as e:  # the API server is down or refusing: keep the cache, back off, relist
                if self._stop.is_set():
                    break
                if self._connected:
                    self.log.warning("pod_watch_disconnected", error=_describe(e), retry_in_s=backoff_s)
                self._connected = False
                resource_version = None
                self._sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 60.0)

    def _list(self) -> str:
        # Raw responses (`_preload_content=False`): the agent reads plain JSON into its own types, skipping the
        # client's model objects, which cost more than the whole conversion.
        resp: Any = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node_name}", _preload_content=False, _request_timeout=(5, 30)
        )
        body = json.loads(resp.data)
        pods: dict[str, PodInfo] = {}
        for item in body.get("items") or []:
            info = self._convert(item)
            if info is not None:
                pods[info.uid] = self._keep_identity(info)
        # Labels before pods: a reader that sees these pods must also see their node's labels, or a fair share
        # would be computed without nvidia.com/gpu.replicas (the whole GPU) for a scan.
        self._labels = self._read_node_labels()
        self._pods = pods
        self.lists += 1
        if not self._connected:
            self.log.info("pod_cache_synced", pods=len(pods), resource_version=body["metadata"]["resourceVersion"])
        self._listed = self._connected = True
        return str(body["metadata"]["resourceVersion"])

    def _watch(self, resource_version: str) -> str:
        resp: Any = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node_name}",
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=resource_version,
            timeout_seconds=self.watch_timeout_s,
            _preload_content=False,
            # The read timeout outlasts the server's own timeout: only a dead connection trips it.
            _request_timeout=(5, self.watch_timeout_s + 30),
        )
        self._response = resp
        try:
            for event in _events(resp):
                if self._stop.is_set():
                    break
                resource_version = self._apply(event, resource_version)
        finally:
            self._response = None
            resp.release_conn()
        return resource_version

    def _apply(self, event: Mapping[str, Any], resource_version: str) -> str:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Gone()
            raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
        rv = str((obj.get("metadata") or {}).get("resourceVersion") or resource_version)
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
            self.log.warning("pod_unreadable", error=str(e))
            return None

    def _keep_identity(self, info: PodInfo) -> PodInfo:
        """The cached object when nothing changed, so quotas resolved for it stay resolved (see QuotaBook)."""
        old = self._pods.get(info.uid)
        return old if old == info else info

    def _read_node_labels(self) -> dict[str, str]:
        try:
            resp: Any = self.core.read_node(self.node_name, _preload_content=False, _request_timeout=(5, 30))
        except ApiException as e:
            if e.status == 404:
                self.log.warning("node_not_found", node=self.node_name)
                return {}
            raise
        labels = (json.loads(resp.data).get("metadata") or {}).get("labels") or {}
        return {str(k): str(v) for k, v in labels.items()}


class _Gone(Exception):
    """The watch's resourceVersion is too old: relist."""


def _events(resp: Any) -> Iterator[dict[str, Any]]:
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


def _describe(e: BaseException) -> str:
    if isinstance(e, ApiException):
        return f"{e.status} {e.reason}"
    return f"{type(e).__name__}: {e}"


# --------------------------------------------------------------------------------------------------------------
# Events


class TokenBucket:
    """`burst` tokens, refilled at `per_minute`; `take()` is False when empty."""

    def __init__(self, burst: int, per_minute: float, now: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.rate_per_s = per_minute / 60.0
        self.now = now
        self.tokens = float(burst)
        self.updated = now()

    def take(self) -> bool:
        t = self.now()
        self.tokens = min(self.burst, self.tokens + (t - self.updated) * self.rate_per_s)
        self.updated = t
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


@dataclass
class _Written:
    name: str
    namespace: str
    count: int
    at: float


class KubeEventRecorder:
    """Writes core/v1 Events on pods, bounded by a token bucket; repeats within 10 minutes bump a count."""

    def __init__(
        self,
        api: client.ApiClient,
        node_name: str,
        *,
        count: Callable[[str], None] | None = None,
        bucket: TokenBucket | None = None,
        now: Callable[[], float] = time.monotonic,
        log: Log | None = None,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.node_name = node_name
        self.log = log if log is not None else structlog.get_logger("vramguard.events")
        self.bucket = bucket if bucket is not None else TokenBucket(EVENT_BURST, EVENT_PER_MINUTE, now)
        self.now = now
        self._count = count if count is not None else (lambda result: None)
        self._written: dict[tuple[str, str, str], _Written] = {}
        self._lock = threading.Lock()

    def record(self, pod: PodInfo, reason: str, message: str, warning: bool = True) -> None:
        """Best effort: an Event that cannot be written is counted and logged, never raised into the loop."""
        with self._lock:
            if not self.bucket.take():
                self._count("dropped")
                return
            try:
                self._write(pod, reason, message, warning)
            except Exception as e:
                self._count("failed")
                self.log.warning("event_failed", pod=pod.key, reason=reason, error=_describe(e))

    def _write(self, pod: PodInfo, reason: str, message: str, warning: bool) -> None:
        key = (pod.uid, reason, message)
        t = self.now()
        self._written = {k: w for k, w in self._written.items() if t - w.at < EVENT_REPEAT_WINDOW_S}
        seen = self._written.get(key)
        if seen is not None:  # the same thing said again: bump the count on the Event already written
            seen.count += 1
            seen.at = t
            self.core.patch_namespaced_event(
                seen.name,
                seen.namespace,
                {"count": seen.count, "lastTimestamp": _now().strftime("%Y-%m-%dT%H:%M:%SZ")},
                _content_type="application/merge-patch+json",
            )
            self._count("patched")
            return
        stamp = _now()
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{pod.name}.", namespace=pod.namespace),
            involved_object=client.V1ObjectReference(
                api_version="v1", kind="Pod", namespace=pod.namespace, name=pod.name, uid=pod.uid
            ),
            reason=reason,
            message=message[:1024],
            type="Warning" if warning else "Normal",
            source=client.V1EventSource(component=COMPONENT, host=self.node_name),
            reporting_component=f"{COMPONENT}.io/agent",
            reporting_instance=self.node_name,
            first_timestamp=stamp,
            last_timestamp=stamp,
            count=1,
        )
        created = self.core.create_namespaced_event(pod.namespace, event)
        assert created.metadata is not None and created.metadata.name is not None
        self._written[key] = _Written(created.metadata.name, pod.namespace, 1, t)
        self._count("written")


# --------------------------------------------------------------------------------------------------------------
# Eviction


class KubeEvictor:
    """policy/v1 Eviction, so PodDisruptionBudgets are respected. Preconditioned on the pod's UID: a pod
    re-created under the same name is never evicted for its predecessor's usage."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        attempts: int = 3,
        backoff_s: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.sleep = sleep

    def evict(self, pod: PodInfo, message: str) -> EvictResult:
        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=pod.name, namespace=pod.namespace),
            delete_options=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=pod.uid)),
        )
        last = ""
        for attempt in range(self.attempts):
            try:
                self.core.create_namespaced_pod_eviction(pod.name, pod.namespace, body)
                return EvictResult(evicted=True, refused=False)
            except ApiException as e:
                if e.status == 429:
                    last = _status_message(e)
                    if attempt + 1 < self.attempts:
                        self.sleep(self.backoff_s * 2**attempt)
                    continue
                if e.status in (404, 409):  # gone already, or a new pod under the old name
                    return EvictResult(evicted=False, refused=False, message=f"not evicted: {_status_message(e)}")
                raise
        return EvictResult(evicted=False, refused=True, message=last)


def _status_message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason)
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


class KubeCapacityPublisher:
    """Advertises `vramguard.io/vram` in the Node's status capacity and allocatable, or withdraws it."""

    def __init__(
        self,
        api: client.ApiClient,
        node_name: str,
        reserve_bytes: int = 0,
        log: Log | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.node_name = node_name
        self.reserve_bytes = reserve_bytes
        self.log = log if log is not None else structlog.get_logger("vramguard.capacity")
        self.now = now
        self._published: int | str | None = "unknown"
        # After a failed PATCH, wait before the next (10 s doubling to 10 min): a policy that denies it would
        # otherwise cost the API server one PATCH per scan.
        self._retry_at = 0.0
        self._backoff_s = 10.0
        self._last_error: str | None = None

    def publish(self, sample: GpuSample) -> None:
        self._patch(advertisable_bytes(sample, self.reserve_bytes))

    def withdraw(self) -> None:
        self._patch(None)

    def _patch(self, total_bytes: int | None) -> None:
        if total_bytes == self._published or self.now() < self._retry_at:
            return
        value = str(total_bytes) if total_bytes is not None else None
        # A JSON merge patch sets the key, or with null removes it (and removing an absent key is no error).
        patch = {"status": {"capacity": {VRAM_RESOURCE: value}, "allocatable": {VRAM_RESOURCE: value}}}
        try:
            self.core.patch_node_status(self.node_name, patch, _content_type="application/merge-patch+json")
        except Exception as e:  # best effort: the scheduler's view must never hold up enforcement
            error = _describe(e)
            if error != self._last_error:  # once per distinct error, not once per retry
                self.log.warning(
                    "capacity_publish_failed", node=self.node_name, error=error, retry_in_s=self._backoff_s
                )
            self._last_error = error
            self._retry_at = self.now() + self._backoff_s
            self._backoff_s = min(self._backoff_s * 2, 600.0)
            return
        self.log.info("capacity_published", node=self.node_name, resource=VRAM_RESOURCE, bytes=total_bytes)
        self._published = total_bytes
        self._backoff_s, self._last_error = 10.0, None
