"""Kubernetes objects as the API server serialises them (camelCase dicts), for the recommend tests: workloads with
their pod templates, the ReplicaSets and Jobs between them and their pods, and the pods."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any


def template(
    limits: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    containers: tuple[str, ...] = ("main",),
    requests: bool = False,
    env: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A pod template: each container with `limits` (and as requests too with `requests`) and `env`, the pod
    `annotations`."""
    resources: dict[str, Any] = {"limits": dict(limits)} if limits else {}
    if limits and requests:
        resources["requests"] = dict(limits)
    listed: list[dict[str, Any]] = [{"name": c, "image": "trainer", "resources": resources} for c in containers]
    for c in listed if env else ():
        c["env"] = [dict(e) for e in env]
    return {
        "metadata": {"labels": {"app": "x"}, "annotations": dict(annotations or {})},
        "spec": {"containers": listed},
    }


def meta(namespace: str, name: str, owner: tuple[str, str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"namespace": namespace, "name": name, "uid": str(uuid.uuid4())}
    if owner is not None:
        out["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True, "uid": "x"}]
    return out


def workload(kind: str, namespace: str, name: str, pod_template: dict[str, Any], **owner: str) -> dict[str, Any]:
    """A Deployment, StatefulSet, DaemonSet, ReplicaSet or Job (spec.template), or a CronJob
    (spec.jobTemplate.spec.template). `owner=("Kind", "name")` as a keyword pair `owner_kind`, `owner_name`."""
    spec: dict[str, Any] = {"template": pod_template}
    if kind == "CronJob":
        spec = {"jobTemplate": {"spec": {"template": pod_template}}}
    controller = (owner["owner_kind"], owner["owner_name"]) if owner else None
    return {"kind": kind, "metadata": meta(namespace, name, controller), "spec": spec}


def pod(namespace: str, name: str, owner: tuple[str, str] | None = None, **kw: Any) -> dict[str, Any]:
    body = template(**kw)
    return {"kind": "Pod", "metadata": {**body["metadata"], **meta(namespace, name, owner)}, "spec": body["spec"]}


def by_kind(*objects: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        out.setdefault(obj["kind"], []).append(obj)
    return out
