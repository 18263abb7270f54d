"""`kubectl vramguard recommend`: per workload and container, the GPU memory quota it needs. Pure: peaks in
(from Prometheus or the agents), the live owners (`workloads.Owners`) and the policy, recommendations out.

A container's peak is the highest usage any of its pods had on any one GPU over the window (a quota applies per
GPU). Containers a pod-wide quota covers (an annotation) are judged together, as the agent judges them: their
peaks on one GPU summed, per pod (a sum of peaks is never below the peak of the sum, so the recommendation is on
the safe side). The recommended quota is the peak plus the headroom, rounded up to a friendly amount (`friendly`)
and to the unit of the field it goes into; the quota in force is the agent's own resolution of the workload's pod
template under the policy (`core.quota.resolve_pod_quota`), with its source.

A peak is a fact only within the GPU memory the agents report: one above it (`within_gpu_memory`) is impossible, and
is refused and reported rather than taken as a workload's need. A patch carries only values the agent's own quota
parser (`core.quantity.parse_quota_bytes`) accepts.
"""

from __future__ import annotations

import enum
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from vramguard.core.model import NO_SHARE, MiB, PodQuota, Policy, Quota, QuotaScope, QuotaSource, RowOwner, SourceKind
from vramguard.core.quantity import MIN_QUOTA_BYTES, QuantityError, format_quantity, parse_quota_bytes
from vramguard.core.quota import invalid_message, parse_quota_source, resolve_pod_quota, row_owner
from vramguard.kube.pod_manifest import PodSourceError, pod_info_from_manifest
from vramguard.plugin.workloads import Owners, Workload, WorkloadRef

DEFAULT_HEADROOM: Final = 0.20
WASTEFUL_RATIO: Final = 2.0  # a quota at least this many times the recommendation is wasteful
POD_WIDE: Final = ""  # the container of a row for a pod-wide quota (the pod's covered containers together)
# Where a workload with no quota field gets one: an annotation needs nothing of the node (a resource limit needs
# its capacity advertised), and covers the pod's containers together.
NEW_FIELD: Final = parse_quota_source("annotation:vramguard.io/vram-limit")


class Verdict(str, enum.Enum):
    KILLED = "would have been killed"  # its peak passed the quota's hard limit
    WASTEFUL = "wasteful"  # the quota is at least WASTEFUL_RATIO times the recommendation
    NO_QUOTA = "no quota"
    OK = "ok"
    UNKNOWN = "unknown"  # no pod template to read the quota in force from (a bare pod since gone)


@dataclass(frozen=True, slots=True)
class PeakSeries:
    """One (pod, container, GPU)'s highest usage over the window. `owner`: the pod's controller as the agent saw
    it ("ReplicaSet/web-7d9f"), where known."""

    namespace: str
    pod: str
    container: str
    gpu_uuid: str
    peak_bytes: int
    owner: str = ""


@dataclass(frozen=True, slots=True)
class Impossible:
    """A peak above the memory of the GPU it was on: `bound_bytes`, that GPU's (or, where its GPU is not reported,
    the largest GPU's on its node, or in the fleet); None where the agents report no GPU at all."""

    series: PeakSeries
    bound_bytes: int | None


def within_gpu_memory(
    series: Iterable[PeakSeries], total_bytes: Mapping[str, int]
) -> tuple[list[PeakSeries], list[Impossible]]:
    """The peaks no larger than their GPU's memory (`total_bytes`, by GPU UUID, as the agents report it; a GPU it
    does not name: its largest), and the others, refused."""
    largest = max(total_bytes.values(), default=None)
    kept: list[PeakSeries] = []
    refused: list[Impossible] = []
    for s in series:
        bound = total_bytes.get(s.gpu_uuid, largest)
        if bound is None or s.peak_bytes > bound:
            refused.append(Impossible(s, bound))
        else:
            kept.append(s)
    return kept, refused


def spell(target: QuotaSource, n_bytes: int) -> str:
    """`n_bytes` as the field `target` takes it: a byte quantity, or a count of its unit (rounded up)."""
    unit = target.unit_bytes
    return format_quantity(n_bytes) if unit == 1 else str(math.ceil(n_bytes / unit))


@dataclass(frozen=True, slots=True)
class Recommendation:
    workload: WorkloadRef
    container: str  # POD_WIDE: the containers a pod-wide quota covers, summed per GPU
    containers: tuple[str, ...]  # the containers the row stands for
    pods: int  # pods seen with GPU memory in the window
    gpus: int  # the most GPUs one pod of it used (the container, or the covered containers)
    peak_bytes: int
    recommended_bytes: int
    quota_bytes: int | None  # the hard limit in force per GPU; None: none, or not a number of bytes
    quota_source: str
    verdict: Verdict
    target: QuotaSource  # where the recommendation goes: the field in force, or NEW_FIELD
    value: str  # the recommendation as `target` takes it
    notes: tuple[str, ...] = ()


def friendly(n_bytes: float, unit_bytes: int = 1) -> int:
    """`n_bytes` rounded up to a friendly amount: a multiple of the largest power of two MiB that is at most an
    eighth of it (so at most 12.5 % above it: 10.8Gi → 11Gi, 700Mi → 704Mi), and of `unit_bytes`; at least 1Mi."""
    step = MiB
    while step * 16 <= n_bytes:
        step *= 2
    step = math.lcm(step, unit_bytes)
    return max(MIN_QUOTA_BYTES, math.ceil(n_bytes / step) * step)


def recommended_bytes(peak_bytes: int, headroom: float, unit_bytes: int = 1) -> int:
    return friendly(peak_bytes * (1.0 + headroom), unit_bytes)


def _field_of(quota: Quota | None) -> QuotaSource | None:
    """The template field a quota came from, where it is one (a container's limit or the pod's annotation)."""
    origin = quota.origin if quota is not None else None
    return origin if origin is not None and origin.kind is not SourceKind.CLAIM else None


def verdict(peak_bytes: int, quota: int | None, recommended: int, has_quota: bool | None) -> Verdict:
    """`has_quota` None: the quota in force is unknown."""
    if has_quota is None:
        return Verdict.UNKNOWN
    if not has_quota:
        return Verdict.NO_QUOTA
    if quota is not None and peak_bytes > quota:
        return Verdict.KILLED
    if quota is not None and quota >= WASTEFUL_RATIO * recommended:
        return Verdict.WASTEFUL
    return Verdict.OK


@dataclass(frozen=True, slots=True)
class _InForce:
    """A workload's quotas as the agent resolves its pod template, or why they are unknown."""

    quotas: PodQuota | None
    notes: tuple[str, ...]


def _in_force(workload: Workload, policy: Policy) -> _InForce:
    if workload.template is None:
        what = "its pods are gone" if workload.ref.kind == "Pod" else f"no {workload.ref.kind} template is read"
        return _InForce(None, (f"quota unknown: {what}",))
    manifest = dict(workload.template)
    meta = dict(manifest.get("metadata") or {})
    meta.setdefault("uid", f"template:{workload.ref}")
    meta["namespace"] = workload.ref.namespace
    meta.setdefault("name", workload.ref.name)
    try:
        pod = pod_info_from_manifest({**manifest, "metadata": meta})
    except (PodSourceError, ValueError, TypeError, AttributeError) as e:
        return _InForce(None, (f"quota unknown: the pod template cannot be read ({e})",))
    quotas = resolve_pod_quota(pod, policy, {})
    notes = tuple(f"invalid: {invalid_message(err)}" for err in quotas.errors)
    return _InForce(quotas, notes)


def _most_gpus(series: Iterable[PeakSeries]) -> int:
    per_pod: dict[str, set[str]] = defaultdict(set)
    for s in series:
        per_pod[s.pod].add(s.gpu_uuid)
    return max((len(g) for g in per_pod.values()), default=0)


def _summed_peak(series: Iterable[PeakSeries]) -> int:
    """The highest, over pods and GPUs, of the peaks of the series' containers on one GPU summed."""
    per_gpu: dict[tuple[str, str], int] = defaultdict(int)
    for s in series:
        per_gpu[(s.pod, s.gpu_uuid)] += s.peak_bytes
    return max(per_gpu.values(), default=0)


def recommend(
    series: Iterable[PeakSeries],
    owners: Owners,
    policy: Policy,
    headroom: float = DEFAULT_HEADROOM,
) -> list[Recommendation]:
    """One row per workload and container (or pod-wide quota) that used GPU memory in the window."""
    by_workload: dict[WorkloadRef, list[PeakSeries]] = defaultdict(list)
    for s in series:
        if s.peak_bytes > 0:
            by_workload[owners.workload_of(s.namespace, s.pod, s.owner)].append(s)
    rows: list[Recommendation] = []
    for ref, found in by_workload.items():
        rows.extend(_rows(owners.workload(ref), found, policy, headroom))
    return sorted(rows, key=lambda r: (r.workload, r.container))


def _rows(workload: Workload, found: Sequence[PeakSeries], policy: Policy, headroom: float) -> list[Recommendation]:
    in_force = _in_force(workload, policy)
    quotas = in_force.quotas
    cap = policy.cap_for(workload.ref.namespace)
    by_container: dict[str, list[PeakSeries]] = defaultdict(list)
    for s in found:
        by_container[s.container].append(s)

    # Each container's row on a GPU it used, as the agent lays the pod's quota out (`row_owner`): under its own
    # quota, a DRA share, the pod-wide quota (one row for the containers it covers, POD_WIDE), or none.
    governs: dict[str, RowOwner | None] = {}
    groups: dict[str, list[str]] = {}  # row container → the containers it stands for
    for name in sorted(by_container):
        row = row_owner(str(workload.ref), quotas, name, by_container[name][0].gpu_uuid) if quotas is not None else None
        governs[name] = row
        wide = row is not None and row.subject.scope is QuotaScope.POD
        groups.setdefault(POD_WIDE if wide else name, []).append(name)

    rows = []
    for row_container, names in groups.items():
        covered = [s for name in names for s in by_container[name]]
        notes = list(in_force.notes)
        governed = governs[names[0]]
        shared = governed is not None and (governed.subject.scope is QuotaScope.SHARE or governed.quota is NO_SHARE)
        quota: Quota | None = governed.quota if governed is not None and not shared else None
        if row_container == POD_WIDE:
            peak = _summed_peak(covered)
        else:
            peak = max(s.peak_bytes for s in covered)
            if shared:
                notes.append("held to its DRA claims' shares: size the claim, not a quota field")
        target = _field_of(quota) or NEW_FIELD
        recommended = recommended_bytes(peak, headroom, target.unit_bytes)
        if cap is not None and recommended > cap:
            notes.append(f"over the namespace max_quota {format_quantity(cap)}: it would be capped there")
        hard = quota.hard_bytes if quota is not None else None
        if quota is not None and quota.share_divisor is not None:
            notes.append("a fair share: its bytes depend on the GPU")
        has_quota = None if quotas is None else governed is not None
        rows.append(
            Recommendation(
                workload=workload.ref,
                container=row_container,
                containers=tuple(names),
                pods=len({s.pod for s in covered}),
                gpus=_most_gpus(covered),
                peak_bytes=peak,
                recommended_bytes=recommended,
                quota_bytes=hard,
                quota_source=quota.source if quota is not None else ("unknown" if quotas is None else ""),
                verdict=verdict(peak, hard, recommended, has_quota),
                target=target,
                value=spell(target, recommended),
                notes=tuple(notes),
            )
        )
    return rows


# --------------------------------------------------------------------------------------------------------------
# Patches


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
