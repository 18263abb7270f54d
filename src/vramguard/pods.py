"""Pods as the agent sees them: Kubernetes Pod objects (as plain dicts) converted to `PodInfo` at the edge.

`pod_info_from_manifest` is the one translation from the Kubernetes API shape; the pod watch and the file source
below both use it. `FilePodSource` serves pods from a file in the shape `kubectl get pods -o yaml` prints (a
`List` of Pods, plus optionally the Node for its labels): the simulated node of `vramguard demo` and the
end-to-end tests use it, and so can an operator who wants to try the agent on a node without API access.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

import yaml

from vramguard.model import ContainerInfo, PodInfo


class PodSourceError(Exception):
    pass


def _strip_scheme(container_id: str | None) -> str | None:
    """`containerd://abc…` → `abc…`, as the cgroup path names it."""
    if not container_id:
        return None
    return container_id.split("://", 1)[-1]


def pod_info_from_manifest(obj: Mapping[str, Any]) -> PodInfo:
    """Convert one Pod object (camelCase keys, as the API server serialises it) into a PodInfo."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ids = {
        s.get("name"): _strip_scheme(s.get("containerID"))
        for s in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or [])
    }
    containers = tuple(
        ContainerInfo(
            name=str(c.get("name", "")),
            container_id=ids.get(c.get("name")),
            limits={str(k): str(v) for k, v in ((c.get("resources") or {}).get("limits") or {}).items()},
        )
        for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])
    )
    owners = meta.get("ownerReferences") or []
    owner = next((f"{o.get('kind')}/{o.get('name')}" for o in owners if o.get("controller")), None)
    uid = meta.get("uid")
    if not uid:
        raise PodSourceError(f"pod {meta.get('namespace')}/{meta.get('name')}: metadata.uid is missing")
    return PodInfo(
        uid=str(uid),
        namespace=str(meta.get("namespace", "default")),
        name=str(meta.get("name", "")),
        containers=containers,
        annotations={str(k): str(v) for k, v in (meta.get("annotations") or {}).items()},
        priority=int(spec.get("priority") or 0),
        qos=str(status.get("qosClass") or "BestEffort"),
        owner=owner,
        terminating=meta.get("deletionTimestamp") is not None,
    )


class FilePodSource:
    """Pods bound to `node_name` from a YAML/JSON file, re-read whenever the file changes.

    A file that cannot be read or parsed keeps the last good pods (and says why in `error`): the agent must
    not forget pods, and so stop protecting their neighbours, because someone saved a half-written file.
    """

    def __init__(self, path: str, node_name: str | None = None) -> None:
        self.path = path
        self.node_name = node_name
        self.error: str | None = None
        self._lock = threading.Lock()
        self._version: tuple[int, int, int] | None = None
        self._pods: dict[str, PodInfo] = {}
        self._labels: dict[str, str] = {}
        self._synced = False
        self._reload()

    def _reload(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError as e:
            self.error = f"{self.path}: {e.strerror}"
            return
        # The inode changes on an atomic rename, which a same-tick rewrite would hide from the mtime alone.
        version = (st.st_ino, st.st_mtime_ns, st.st_size)
        if version == self._version:
            return
        try:
            with open(self.path) as f:
                doc = yaml.safe_load(f)
            items = doc.get("items", []) if isinstance(doc, dict) and doc.get("kind") == "List" else [doc]
            pods: dict[str, PodInfo] = {}
            labels: dict[str, str] = {}
            for item in items:
                if not isinstance(item, dict):
                    raise PodSourceError(f"items: expected Pod or Node objects, got {type(item).__name__}")
                if item.get("kind") == "Node":
                    labels = {str(k): str(v) for k, v in ((item.get("metadata") or {}).get("labels") or {}).items()}
                    continue
                bound_to = (item.get("spec") or {}).get("nodeName")
                if self.node_name and bound_to and bound_to != self.node_name:
                    continue
                info = pod_info_from_manifest(item)
                pods[info.uid] = info
        except (OSError, yaml.YAMLError, PodSourceError, ValueError, TypeError, AttributeError) as e:
            self.error = f"{self.path}: {e}"
            return
        self._pods, self._labels, self._version = pods, labels, version
        self._synced, self.error = True, None

    def pods(self) -> Mapping[str, PodInfo]:
        with self._lock:
            self._reload()
            return self._pods

    def synced(self) -> bool:
        return self._synced

    def problem(self) -> str | None:
        return self.error if self.error is not None else (None if self._synced else "pods file not read yet")

    def node_labels(self) -> Mapping[str, str]:
        return self._labels
