"""Which workload each pod belongs to: the owner a person edits, and its pod template. Pure: it reads lists of
objects as the API server serialises them (camelCase dicts) and pod names from Prometheus or the agents.

A workload is a Deployment (its pods belong to a ReplicaSet it owns), a StatefulSet, a DaemonSet, a CronJob (its
pods belong to a Job it owns), a Job, a ReplicaSet that no Deployment owns, another controller (an operator's
custom resource: shown, never patched), or the bare pod. A pod is placed by its controller as the agent saw it (the
`owner_kind` and `owner_name` of its series, kube-state-metrics' `kube_pod_owner` labels; the `owner` of the agents'
peaks), followed up to the workload a person edits (ReplicaSet → Deployment, Job → CronJob). Only a series without
them, from an agent older than those labels, is placed as before: a pod that still exists is followed through its
controller references; one that is gone (seven days of history hold many) is placed by its name, which its
controller generated: `<replicaset>-<5>`, `<deployment>-<hash>-<5>`, `<daemonset>-<5>`, `<job>-<5>`,
`<cronjob>-<scheduled minute>-<5>`, `<statefulset>-<ordinal>`, where `<5>` and `<hash>` use Kubernetes' random
alphabet; the longest live owner whose name fits wins. A gone pod that fits no live owner is a workload of its
own, a bare pod, with no template.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

# Kubernetes' rand.String alphabet (no vowels, no 0/1/3): generated name suffixes and pod-template hashes use it.
_RANDOM: Final = "[bcdfghjklmnpqrstvwxz2456789]"
_POD_SUFFIX: Final = re.compile(rf"(?P<owner>.+)-{_RANDOM}{{5}}")
_TEMPLATE_HASH: Final = re.compile(rf"(?P<owner>.+)-{_RANDOM}{{1,10}}")
_ORDINAL: Final = re.compile(r"(?P<owner>.+)-(?:0|[1-9][0-9]{0,8})")
_SCHEDULED: Final = re.compile(r"(?P<owner>.+)-[0-9]{1,12}")

# The kinds listed, and where each keeps its pod template.
TEMPLATE_PATHS: Final[Mapping[str, tuple[str, ...]]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
KINDS: Final = ("Pod", *TEMPLATE_PATHS)


@dataclass(frozen=True, slots=True, order=True)
class WorkloadRef:
    namespace: str
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


@dataclass(frozen=True, slots=True)
class Workload:
    ref: WorkloadRef
    # The pod template as a pod manifest ({"metadata": ..., "spec": ...}); for a bare pod the pod itself. None for
    # a pod that is gone or a controller this module does not read.
    template: Mapping[str, Any] | None
    path: tuple[str, ...]  # where `template` sits in the workload's object (() for a bare pod)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _controller(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the object's controller reference, if any."""
    for ref in _meta(obj).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") and ref.get("kind") and ref.get("name"):
            return str(ref["kind"]), str(ref["name"])
    return None


def _dig(obj: Mapping[str, Any], path: Sequence[str]) -> Mapping[str, Any] | None:
    here: object = obj
    for key in path:
        if not isinstance(here, Mapping):
            return None
        here = here.get(key)
    return here if isinstance(here, Mapping) else None


class Owners:
    """The live objects of each kind, by (namespace, name), and the workload of any pod name in a namespace."""

    def __init__(self, objects: Mapping[str, Iterable[Mapping[str, Any]]]) -> None:
        self._by_kind: dict[str, dict[tuple[str, str], Mapping[str, Any]]] = {kind: {} for kind in KINDS}
        for kind, items in objects.items():
            index = self._by_kind.setdefault(kind, {})
            for obj in items:
                meta = _meta(obj)
                index[(str(meta.get("namespace") or ""), str(meta.get("name") or ""))] = obj

    def _get(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self._by_kind.get(kind, {}).get((namespace, name))

    def _has(self, kind: str, namespace: str, name: str) -> bool:
        return (namespace, name) in self._by_kind.get(kind, {})

    def workload_of(self, namespace: str, pod: str, owner: str = "") -> WorkloadRef:
        """The workload of the pod `pod`: by `owner`, its controller as the agent saw it ("ReplicaSet/web-7d9f";
        "Pod/<pod>" for a pod without one), where the series carries it; else by its controller reference while it
        exists, else by its name."""
        if "/" in owner:
            return self._up(namespace, *owner.split("/", 1))
        live = self._get("Pod", namespace, pod)
        controller = _controller(live) if live is not None else None
        if controller is not None:
            return self._up(namespace, *controller)
        if live is not None:
            return WorkloadRef(namespace, "Pod", pod)
        return self._by_name(namespace, pod)

    def _up(self, namespace: str, kind: str, name: str) -> WorkloadRef:
        """A pod's controller → the workload a person edits: a ReplicaSet's Deployment, a Job's CronJob."""
        if kind in ("ReplicaSet", "Job"):
            parent = "Deployment" if kind == "ReplicaSet" else "CronJob"
            obj = self._get(kind, namespace, name)
            above = _controller(obj) if obj is not None else None
            if above is not None:
                return WorkloadRef(namespace, *above) if above[0] == parent else WorkloadRef(namespace, kind, name)
            if obj is None:  # gone too: its generated name may still name the parent
                pattern = _TEMPLATE_HASH if kind == "ReplicaSet" else _SCHEDULED
                m = pattern.fullmatch(name)
                if m is not None and self._has(parent, namespace, m["owner"]):
                    return WorkloadRef(namespace, parent, m["owner"])
        return WorkloadRef(namespace, kind, name)

    def _by_name(self, namespace: str, pod: str) -> WorkloadRef:
        """A gone pod's workload from its generated name: the longest live owner that fits."""
        found: list[WorkloadRef] = []
        m = _POD_SUFFIX.fullmatch(pod)
        if m is not None:
            stem = m["owner"]
            for kind in ("ReplicaSet", "DaemonSet", "Job"):
                if self._has(kind, namespace, stem):
                    found.append(self._up(namespace, kind, stem))
            for pattern, kind in ((_TEMPLATE_HASH, "Deployment"), (_SCHEDULED, "CronJob")):
                owner = pattern.fullmatch(stem)
                if owner is not None and self._has(kind, namespace, owner["owner"]):
                    found.append(WorkloadRef(namespace, kind, owner["owner"]))
        ordinal = _ORDINAL.fullmatch(pod)
        if ordinal is not None and self._has("StatefulSet", namespace, ordinal["owner"]):
            found.append(WorkloadRef(namespace, "StatefulSet", ordinal["owner"]))
        if not found:
            return WorkloadRef(namespace, "Pod", pod)
        return max(found, key=lambda ref: (len(ref.name), ref.kind))

    def workload(self, ref: WorkloadRef) -> Workload:
        """The workload and its pod template (None where none is known)."""
        obj = self._get(ref.kind, ref.namespace, ref.name)
        if obj is None:
            return Workload(ref, None, ())
        if ref.kind == "Pod":
            return Workload(ref, obj, ())
        path = TEMPLATE_PATHS.get(ref.kind)
        template = _dig(obj, path) if path is not None else None
        if template is None or path is None:
            return Workload(ref, None, ())
        meta = dict(_meta(template))
        meta["namespace"] = ref.namespace
        return Workload(ref, {**template, "metadata": meta}, path)
