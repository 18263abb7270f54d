"""The agent's own Node, from a watch on its name: the labels fair share reads (`nvidia.com/gpu.replicas`)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import structlog
from kubernetes import client

from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.kube.reflector import Log, Reflector, RequestCounter, uncounted


class NodeSource:
    """One Node's labels, kept by a reflector watching `fieldSelector=metadata.name=<node>`.

    A label changed on the Node reaches the agent with the watch event, within a second; a Node that does not
    exist has no labels (and is logged once).
    """

    def __init__(
        self,
        api: client.ApiClient,
        node_name: str,
        *,
        log: Log | None = None,
        clock: Clock = SYSTEM_CLOCK,
        count: RequestCounter = uncounted,
    ) -> None:
        self.node_name = node_name
        self.log = log if log is not None else structlog.get_logger(__name__)
        self._labels: Mapping[str, str] = {}
        self._found: bool | None = None  # None until listed
        core = client.CoreV1Api(api)
        self.reflector = Reflector(
            "nodes",
            functools.partial(core.list_node, field_selector=f"metadata.name={node_name}"),
            self,
            log=self.log,
            clock=clock,
            count=count,
        )

    def labels(self) -> Mapping[str, str]:
        return self._labels  # replaced, never mutated

    # -- Store ---------------------------------------------------------------------------------------------------

    def replace(self, items: Sequence[Mapping[str, Any]]) -> None:
        self._set(items[0] if items else None)

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        self._set(None if kind == "DELETED" else obj)

    def _set(self, node: Mapping[str, Any] | None) -> None:
        if node is None:
            if self._found is not False:
                self.log.warning("node_not_found", node=self.node_name)
            self._found = False
            self._labels = {}
            return
        raw = (node.get("metadata") or {}).get("labels") or {}
        labels = {str(k): str(v) for k, v in raw.items()}
        if self._found and labels != self._labels:
            self.log.info("node_labels_changed", node=self.node_name)
        self._found = True
        if labels != self._labels:
            self._labels = labels
