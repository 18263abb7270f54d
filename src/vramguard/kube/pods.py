"""The pod source: the pods bound to this node, and its Node's labels, each from a reflector."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import structlog
from kubernetes import client

from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.core.model import PodInfo
from vramguard.core.text import cut
from vramguard.kube.client import MAX_ERROR_CHARS
from vramguard.kube.nodes import NodeSource
from vramguard.kube.pod_manifest import PodSourceError, pod_info_from_manifest
from vramguard.kube.reflector import SILENCE_S, Log, Reflector, RequestCounter, uncounted


class KubePodSource:
    """`PodSource` for a node: its pods (`fieldSelector=spec.nodeName=<node>`) and its labels (`NodeSource`).

    `synced()` is true while both caches are complete and their watches work; `problem()` says why not. Either
    way the agent keeps enforcing with the pods it has. A relist replaces the cache whole, so a pod deleted while
    the agent was disconnected is forgotten, never acted on. `on_pods` hears each pod version the cache takes in,
    once the cache serves it (the watch's `ScanCalls.pods_updated`: a pod learned late calls for a scan).
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
    ) -> None:
        self.node_name = node_name
        self.on_pods = on_pods
        self.log = log if log is not None else structlog.get_logger("vramguard.kube.pods_file")
        self.clock = clock
        self._pods: Mapping[str, PodInfo] = {}
        self.node = NodeSource(api, node_name, clock=clock, count=count)
        core = client.CoreV1Api(api)
        self.reflector = Reflector(
            "pods",
            functools.partial(core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node_name}"),
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

    # -- Store ---------------------------------------------------------------------------------------------------

    def replace(self, items: Sequence[Mapping[str, Any]]) -> None:
        pods: dict[str, PodInfo] = {}
        for item in items:
            info = self._convert(item)
            if info is not None:
                pods[info.uid] = info
        self._pods = pods
        self.log.info("pod_cache_synced", pods=len(pods))
        if self.on_pods is not None:
            self.on_pods(pods.values())

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        info = self._convert(obj)
        if info is None:
            return
        pods = dict(self._pods)  # replaced, never mutated: a reader always sees one consistent version
        if kind == "DELETED":
            pods.pop(info.uid, None)
        else:
            pods[info.uid] = info
        self._pods = pods
        if self.on_pods is not None and kind != "DELETED":
            self.on_pods((info,))

    def _convert(self, obj: Mapping[str, Any]) -> PodInfo | None:
        try:
            info = pod_info_from_manifest(obj)
        except (PodSourceError, ValueError, TypeError) as e:
            self.log.warning("pod_unreadable", error=cut(str(e), MAX_ERROR_CHARS))
            return None
        # The cached object when nothing the agent reads changed (most MODIFIED events are status changes), so
        # quotas resolved for it stay resolved (QuotaBook's cache keys on the object).
        old = self._pods.get(info.uid)
        return old if old == info else info
