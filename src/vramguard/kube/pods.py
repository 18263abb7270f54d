"""The pod source: the pods bound to this node, and its Node's labels, each from a reflector."""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import structlog
from kubernetes import client

from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.core.pod import PodInfo
from vramguard.core.ports import ApiUidRecord, KubeletPods
from vramguard.core.text import cut
from vramguard.kube.client import MAX_ERROR_CHARS, TIMEOUT_LIST
from vramguard.kube.nodes import NodeSource
from vramguard.kube.pod_manifest import (
    UNBACKED,
    PodSourceError,
    index_pods,
    log_refused,
    pod_info_from_manifest,
)
from vramguard.kube.reflector import SILENCE_S, ListCall, Log, Reflector, RequestCounter, uncounted


class KubePodSource:
    """`PodSource` for a node: its pods (`fieldSelector=spec.nodeName=<node>`) and its labels (`NodeSource`).

    `synced()` is true while both caches are complete and their watches work; `problem()` says why not. Either
    way the agent keeps enforcing with the pods it has. A relist replaces the cache whole, so a pod deleted while
    the agent was disconnected is forgotten, never acted on. `on_pods` hears each pod version the cache takes in,
    once the cache serves it (the watch's `ScanCalls.pods_updated`: a pod learned late calls for a scan).

    The cache holds each Pod object by its metadata.uid, as the watch names it (a mirror pod's update or deletion
    finds its entry), and serves them by the UID the kubelet runs each under (`index_pods`, which also says which
    static pods' mirror claims are not believed: each such claim is logged once, when it appears). Claims are
    judged by what the node says (`kubelet`) and by the UIDs the API server gave (`api_uids`, to which the cache
    adds each pod's own UID as it arrives); `rejudge` when what the node says changed.
    """

    def __init__(
        self,
        api: client.ApiClient,
        node_name: str,
        *,
        log: Log | None = None,
        clock: Clock = SYSTEM_CLOCK,
        count: RequestCounter = uncounted,
        on_pods: Callable[[Iterable[PodInfo]], None] | None = None,
        kubelet: KubeletPods | None = None,
        api_uids: ApiUidRecord | None = None,
    ) -> None:
        self.node_name = node_name
        self.kubelet = kubelet
        self.api_uids: ApiUidRecord = api_uids if api_uids is not None else _MemoryUids()
        self._serving = threading.Lock()  # the watch's thread serves a new version; `rejudge`, the node's
        self.on_pods = on_pods
        self.log = log if log is not None else structlog.get_logger(__name__)
        self.clock = clock
        self._objects: Mapping[str, PodInfo] = {}  # by metadata.uid
        self._pods: Mapping[str, PodInfo] = {}  # by PodInfo.uid: `index_pods(self._objects.values())`
        self._refused: Mapping[str, str] = {}  # mirror claims not believed: UID claimed → why
        self.node = NodeSource(api, node_name, clock=clock, count=count)
        core = client.CoreV1Api(api)
        self._count = count
        self._list: ListCall = functools.partial(
            core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node_name}"
        )
        self.reflector = Reflector(
            "pods",
            self._list,
            self,
            log=self.log,
            clock=clock,
            count=count,
            silence_s=SILENCE_S,  # the agent's liveness probe: /readyz says when the API server stops answering
        )

    def start(self) -> None:
        self.node.reflector.start()
        self.reflector.start()

    def stop(self, deadline: float) -> None:
        self.reflector.stop(deadline)
        self.node.reflector.stop(deadline)

    def wait_synced(self, timeout_s: float) -> bool:
        """Block until the Node and the pods were listed once, `timeout_s` at most; True when they were."""
        deadline = self.clock.now() + timeout_s
        return self.node.reflector.wait_listed(deadline) and self.reflector.wait_listed(deadline)

    # -- PodSource -----------------------------------------------------------------------------------------------

    def pods(self) -> Mapping[str, PodInfo]:
        # Not before the Node was read (or failed to be): fair share computed without the Node's
        # nvidia.com/gpu.replicas label would hand each pod the whole GPU for a scan.
        node = self.node.reflector
        return self._pods if node.listed or node.error is not None else {}

    def synced(self) -> bool:
        return self.reflector.synced() and self.node.reflector.synced()

    def problem(self) -> str | None:
        return self.reflector.problem() or self.node.reflector.problem()

    def node_labels(self) -> Mapping[str, str]:
        return self.node.labels()

    @property
    def lists(self) -> int:
        return self.reflector.lists

    # -- PodLister -----------------------------------------------------------------------------------------------

    def present(self) -> frozenset[str]:
        """A consistent LIST of this node's pods, one request: with no resourceVersion the API server answers as of
        now (from its storage, or from a watch cache it first brought up to date), never from a watch that lags. The
        UIDs the kubelet runs them under: each pod's own, and a mirror pod's `kubernetes.io/config.mirror`."""
        self._count("pods", "LIST")
        resp = self._list(_preload_content=False, _request_timeout=TIMEOUT_LIST)
        body = json.loads(resp.data)
        return frozenset(self._uids(body.get("items") if isinstance(body, Mapping) else None))

    def _uids(self, items: object) -> Iterable[str]:
        """Each Pod's metadata.uid, and the UID a mirror pod's claim names where the claim is believed, from a LIST's
        items (anything else skipped: a UID is only ever added, so a malformed item can keep an orphan from being
        confirmed, never confirm one; a forged claim is not believed, so it keeps none from being confirmed)."""
        pods = []
        for item in items if isinstance(items, list) else ():
            meta = item.get("metadata") if isinstance(item, Mapping) else None
            uid = meta.get("uid") if isinstance(meta, Mapping) else None
            if isinstance(uid, str):
                yield uid
            try:
                pods.append(pod_info_from_manifest(item))
            except (PodSourceError, ValueError, TypeError, AttributeError):
                continue
        yield from index_pods(pods, kubelet=self.kubelet, api_uids=self.api_uids).pods

    # -- Store ---------------------------------------------------------------------------------------------------

    def replace(self, items: Sequence[Mapping[str, Any]]) -> None:
        objects: dict[str, PodInfo] = {}
        for item in items:
            info = self._convert(item)
            if info is not None:
                objects[info.object_uid] = info
        self._serve(objects)
        self.log.info("pod_cache_synced", pods=len(self._pods))
        if self.on_pods is not None:
            self.on_pods(self._pods.values())

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        info = self._convert(obj)
        if info is None:
            return
        objects = dict(self._objects)
        if kind == "DELETED":
            objects.pop(info.object_uid, None)
        else:
            objects[info.object_uid] = info
        self._serve(objects)
        if self.on_pods is not None and kind != "DELETED":
            self.on_pods((info,))
        if kind != "DELETED" and self._refused.get(info.object_uid, "").endswith(UNBACKED):
            self._look_again()

    def rejudge(self) -> None:
        """Judge the mirror claims again (what the node says changed: `KubeletPods.on_change`)."""
        with self._serving:
            objects = self._objects
            before = self._pods
            self._index(objects)
            changed = self._pods != before
        if changed and self.on_pods is not None:
            self.on_pods(self._pods.values())

    def _look_again(self) -> None:
        """A mirror claim was refused for want of the kubelet's word, which is up to `REFRESH_S` old: the kubelet
        may have set the pod up since (it makes the mirror pod and the pod at the same moment). Read it again now,
        on this watch's thread (one small listing), so that the claim is judged on it before the kubelet deletes a
        forged mirror, not after (then the right reason would never be said)."""
        if self.kubelet is not None:
            self.kubelet.refresh()  # a change calls `rejudge` (`KubeletPods.on_change`)

    def refused(self) -> Mapping[str, str]:
        """The mirror claims not believed now: the claiming pod's metadata.uid → why."""
        return self._refused

    def _serve(self, objects: dict[str, PodInfo]) -> None:
        """Serve `objects`, indexed; both replaced, never mutated: a reader always sees one consistent version."""
        self.api_uids.add(p.object_uid for p in objects.values())
        with self._serving:
            self._index(objects)

    def _index(self, objects: Mapping[str, PodInfo]) -> None:
        index = index_pods(objects.values(), kubelet=self.kubelet, api_uids=self.api_uids)
        self._objects, self._pods = objects, index.pods
        log_refused(self.log, index.refused, self._refused)
        self._refused = index.refused

    def _convert(self, obj: Mapping[str, Any]) -> PodInfo | None:
        try:
            info = pod_info_from_manifest(obj)
        except (PodSourceError, ValueError, TypeError) as e:
            self.log.warning("pod_unreadable", error=cut(str(e), MAX_ERROR_CHARS))
            return None
        # The cached object when nothing the agent reads changed (most MODIFIED events are status changes), so
        # quotas resolved for it stay resolved (QuotaBook's cache keys on the object).
        old = self._objects.get(info.object_uid)
        return old if old == info else info


class _MemoryUids:
    """An `ApiUidRecord` kept in memory only, for a source given none (`top`, tests)."""

    def __init__(self) -> None:
        self._uids: set[str] = set()

    def add(self, uids: Iterable[str]) -> None:
        self._uids.update(uids)

    def __contains__(self, uid: object) -> bool:
        return uid in self._uids
