"""The patch `kubectl vramguard recommend` prints for a workload whose quota is not ok: a strategic merge patch of
its pod template that sets each recommendation in the field it names, and only values the agent itself reads there
(`QuotaSource.value_bytes`). Pure.

A pair of NVIDIA's declarations (the toolkit's `NVIDIA_GPU_MEMORY_REQUEST`/`_LIMIT` in a container's `env[]`, KAI's
`nvidia.com/container.<name>.gpu-memory.request`/`.limit` annotations) takes the recommendation in its limit, the
hard limit the verdict is on; a declared request, the soft limit (and what KAI schedules by), is kept where it is
at most the new limit, and becomes the limit otherwise, as every reader refuses a request above its limit.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from vramguard.core.quantity import QuantityError
from vramguard.core.sources import QuotaSource, SourceKind
from vramguard.plugin.in_force import spell
from vramguard.plugin.recommend import Recommendation
from vramguard.plugin.verdict import Verdict
from vramguard.plugin.workloads import Owners, Workload, WorkloadRef

_KUBECTL_KIND: Final = {
    "Deployment": "deployment",
    "StatefulSet": "statefulset",
    "DaemonSet": "daemonset",
    "ReplicaSet": "replicaset",
    "CronJob": "cronjob",
    "Pod": "pod",
}


def _nest(path: Sequence[str], leaf: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = dict(leaf)
    for key in reversed(path):
        out = {key: out}
    return out


@dataclass(frozen=True, slots=True)
class Patch:
    """A strategic merge patch of one workload (None: it cannot take one, `why`)."""

    workload: WorkloadRef
    body: dict[str, Any] | None
    why: str = ""

    def command(self) -> str:
        ref = self.workload
        if self.body is None:
            return f"# {ref.namespace} {ref}: {self.why}"
        body = json.dumps(self.body, separators=(",", ":"), sort_keys=True)
        kind = _KUBECTL_KIND[ref.kind]
        return f"kubectl patch {kind} {ref.name} --namespace {ref.namespace} --type strategic --patch '{body}'"


def patches(rows: Sequence[Recommendation], owners: Owners) -> list[Patch]:
    """For each workload with a row that is not ok, the patch of its pod template that sets every row's
    recommendation in the field the row names (a container's limit, and its request where it sets one, as an
    extended resource's request must equal its limit; a container's NVIDIA_GPU_MEMORY_LIMIT or KAI's `.limit`
    annotation for it, and its request where above that; or the pod's annotation)."""
    by_workload: dict[WorkloadRef, list[Recommendation]] = defaultdict(list)
    for r in rows:
        by_workload[r.workload].append(r)
    out = []
    for ref, its_rows in sorted(by_workload.items()):
        if all(r.verdict is Verdict.OK for r in its_rows):
            continue
        workload = owners.workload(ref)
        out.append(_patch(workload, its_rows))
    return out


# Why a bare pod cannot take a field: its containers' fields are fixed, and NVIDIA's tools read KAI's annotations only
# when a container is created (its NRI plugin writes the variables the toolkit's hook programs then).
_FIXED_IN_A_POD: Final = {
    SourceKind.RESOURCE: "a pod's resource limits cannot change",
    SourceKind.ENV: "a pod's environment cannot change",
    SourceKind.ANNOTATION: "KAI's annotations are read only when a container is created",
}


def _patch(workload: Workload, rows: Sequence[Recommendation]) -> Patch:
    ref = workload.ref
    if workload.template is None:
        return Patch(ref, None, "no pod template to patch (the pods are gone, or a controller kubectl cannot patch)")
    if ref.kind == "Job":
        return Patch(ref, None, "a Job's pod template cannot change; set the values in what creates it")
    annotations: dict[str, str] = {}
    containers: dict[tuple[str, str], dict[str, Any]] = {}  # (the pod spec's list, container name) → its patch
    fixed: dict[str, list[str]] = defaultdict(list)  # why a bare pod cannot take it → "<container>: <field>=<value>"
    spec = workload.template.get("spec") or {}
    for r in rows:
        value = r.value
        if r.target.kind is SourceKind.ANNOTATION and not r.target.per_container:
            # A new annotation covers the pod's containers together: the sum of their recommendations.
            value = spell(r.target, sum(x.recommended_bytes for x in rows if x.target == r.target))
        try:
            r.target.value_bytes(value, r.target.pair_keys(r.containers[0])[1] if r.target.pair else "")
        except QuantityError as e:
            return Patch(ref, None, f"the agent would refuse {r.target.field} {value!r}: {e.reason}")
        if r.target.kind is SourceKind.ANNOTATION and not r.target.per_container:
            annotations[r.target.name] = value
            continue
        for name in r.containers:
            if r.target.pair:
                settings, refused = _pair_settings(workload.template, r.target, name, value)
                if refused:
                    return Patch(ref, None, refused)
                if r.target.kind is SourceKind.ENV:
                    where, _ = _container(spec, name)
                    env = [{"name": key, "value": v} for key, v in sorted(settings.items())]
                    containers[(where, name)] = {"name": name, "env": env}
                else:
                    annotations.update(settings)
            else:
                where, listed = _container(spec, name)
                requests = ((listed.get("resources") or {}).get("requests")) or {}
                resources: dict[str, Any] = {"limits": {r.target.name: r.value}}
                if r.target.name in requests:
                    resources["requests"] = {r.target.name: r.value}
                containers[(where, name)] = {"name": name, "resources": resources}
                settings = {r.target.name: r.value}
            fixed[_FIXED_IN_A_POD[r.target.kind]].extend(f"{name}: {k}={v}" for k, v in sorted(settings.items()))
    if fixed and ref.kind == "Pod":
        return Patch(
            ref, None, "; ".join(fixed) + "; recreate it with " + ", ".join(s for f in fixed.values() for s in f)
        )
    leaf: dict[str, Any] = {}
    if annotations:
        leaf["metadata"] = {"annotations": annotations}
    for (where, _), c in containers.items():
        leaf.setdefault("spec", {}).setdefault(where, []).append(c)
    return Patch(ref, _nest(workload.path, leaf))


def _container(spec: Mapping[str, Any], name: str) -> tuple[str, Mapping[str, Any]]:
    """The pod spec's list that holds container `name` (`containers`, or `initContainers` for a sidecar), and it."""
    for where in ("containers", "initContainers"):
        for c in spec.get(where) or []:
            if isinstance(c, Mapping) and c.get("name") == name:
                return where, c
    return "containers", {}


def _pair_settings(
    template: Mapping[str, Any], target: QuotaSource, name: str, limit: str
) -> tuple[dict[str, str], str]:
    """What container `name`'s pair `target` (NVIDIA's variables in its `env[]`, or KAI's annotations for it) is set
    to: its limit `limit`, and its request, where it declares one, at most that (a request the agent reads at or below
    the new limit is left as it is; any other, above it or unreadable, becomes the limit). Or, where the pair cannot
    be patched, why not."""
    request_key, limit_key = target.pair_keys(name)
    declared: dict[str, str] = {}
    if target.kind is SourceKind.ENV:
        where, listed = _container(template.get("spec") or {}, name)
        entries = [e for e in listed.get("env") or [] if isinstance(e, Mapping)]
        for key in (request_key, limit_key):
            found = [e for e in entries if e.get("name") == key]
            field = f"spec.{where}[{name}].env[{key}]"
            if len(found) > 1:
                return (
                    {},
                    f"{field} is listed {len(found)} times, which no patch makes one: keep one, {limit_key}={limit}",
                )
            if found and found[0].get("valueFrom") is not None:
                return {}, f"{field} is set from elsewhere (valueFrom): set {limit_key}={limit} where it comes from"
            if found:
                declared[key] = str(found[0].get("value") or "")
    else:
        written = (template.get("metadata") or {}).get("annotations") or {}
        declared = {key: str(written[key]) for key in (request_key, limit_key) if key in written}
    settings = {limit_key: limit}
    if request_key in declared and not _at_most(target, request_key, declared[request_key], limit):
        settings[request_key] = limit
    return settings, ""


def _at_most(target: QuotaSource, key: str, value: str, limit: str) -> bool:
    """Whether the agent reads `value` as at most `limit` (a value it reads)."""
    try:
        return target.value_bytes(value, key) <= target.value_bytes(limit, key)
    except QuantityError:
        return False
