"""The patch `kubectl vramguard recommend` prints for a workload whose quota is not ok: a strategic merge patch of
its pod template that sets each recommendation in the field it names, and only values the agent's own quota parser
(`core.quantity.parse_quota_bytes`) accepts. Pure.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from vramguard.core.quantity import QuantityError, parse_quota_bytes
from vramguard.core.sources import SourceKind
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
    extended resource's request must equal its limit; or the pod's annotation)."""
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


def _patch(workload: Workload, rows: Sequence[Recommendation]) -> Patch:
    ref = workload.ref
    if workload.template is None:
        return Patch(ref, None, "no pod template to patch (the pods are gone, or a controller kubectl cannot patch)")
    if ref.kind == "Job":
        return Patch(ref, None, "a Job's pod template cannot change; set the values in what creates it")
    annotations: dict[str, str] = {}
    containers: dict[str, dict[str, Any]] = {}
    spec = workload.template.get("spec") or {}
    for r in rows:
        value = r.value
        if r.target.kind is SourceKind.ANNOTATION:
            # A new annotation covers the pod's containers together: the sum of their recommendations.
            value = spell(r.target, sum(x.recommended_bytes for x in rows if x.target == r.target))
        try:
            parse_quota_bytes(value, r.target.unit_bytes, r.target.name)  # what the agent reads the field with
        except QuantityError as e:
            return Patch(ref, None, f"the agent would refuse {r.target.field} {value!r}: {e.reason}")
        if r.target.kind is SourceKind.ANNOTATION:
            annotations[r.target.name] = value
            continue
        for name in r.containers:
            listed: Mapping[str, Any] = next((c for c in spec.get("containers") or [] if c.get("name") == name), {})
            requests = ((listed.get("resources") or {}).get("requests")) or {}
            resources: dict[str, Any] = {"limits": {r.target.name: r.value}}
            if r.target.name in requests:
                resources["requests"] = {r.target.name: r.value}
            containers[name] = {"name": name, "resources": resources}
    if containers and ref.kind == "Pod":
        return Patch(ref, None, "a pod's resource limits cannot change; recreate it with " + _limits_text(containers))
    leaf: dict[str, Any] = {}
    if annotations:
        leaf["metadata"] = {"annotations": annotations}
    if containers:
        leaf["spec"] = {"containers": list(containers.values())}
    return Patch(ref, _nest(workload.path, leaf))


def _limits_text(containers: Mapping[str, Mapping[str, Any]]) -> str:
    parts = []
    for name, c in containers.items():
        for key, value in c["resources"]["limits"].items():
            parts.append(f"{name}: {key}={value}")
    return ", ".join(parts)
