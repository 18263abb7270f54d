"""The quota in force for a workload, as `kubectl vramguard recommend` reads it. Pure.

The agent's own resolution of the workload's pod template under the policy (`core.quota.resolve_pod_quota`), laid
out by the agent's own function (`core.quota.row_quota`): which quota governs which container, so recommend sums
the containers a pod-wide quota covers exactly as the agent judges them, and names the field the recommendation
goes into: the one the quota in force came from, else the pair of NVIDIA's declarations the container writes but the
agent could not read (a valueFrom, an invalid value, an envFrom), else NEW_FIELD, never a vramguard field in place
of NVIDIA's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from vramguard.core.pod import PodInfo
from vramguard.core.policy import Policy
from vramguard.core.quantity import format_quantity
from vramguard.core.quota import NO_SHARE, PodQuota, Quota, QuotaScope, invalid_message, resolve_pod_quota, row_quota
from vramguard.core.sources import QuotaSource, SourceKind, parse_quota_source, readable_sources
from vramguard.kube.pod_manifest import PodSourceError, pod_info_from_manifest
from vramguard.plugin.workloads import Workload

# Where a workload with no quota field gets one: an annotation needs nothing of the node (a resource limit needs
# its capacity advertised), and covers the pod's containers together.
NEW_FIELD: Final = parse_quota_source("annotation:vramguard.io/vram-limit")


@dataclass(frozen=True, slots=True)
class Governs:
    """What governs one container of a workload, as the agent lays its pod template's quota out."""

    quota: Quota | None  # its own quota or the pod-wide one; None: none, or a DRA share (no field of the template)
    pod_wide: bool  # the pod-wide quota (an annotation): judged with the other containers it covers
    share: bool  # held to its DRA claims' shares
    managed: bool  # under some quota at all


@dataclass(frozen=True, slots=True)
class QuotaInForce:
    """A workload's quotas as the agent resolves its pod template, or why they are unknown (`quotas` None)."""

    uid: str  # the template's pod UID, as the layout names it
    quotas: PodQuota | None
    notes: tuple[str, ...]
    # Per container, the first of the policy's request/limit pairs (NVIDIA's variables, KAI's annotations) its
    # template declares at all: valid, invalid, set by a valueFrom, or perhaps by a GPU container's envFrom
    # (`declared_pairs`).
    declared: Mapping[str, QuotaSource] = field(default_factory=lambda: MappingProxyType({}))

    def governs(self, container: str, gpu_uuid: str) -> Governs | None:
        """What governs `container` on a GPU it used (`row_quota`); None when the quota in force is unknown."""
        if self.quotas is None:
            return None
        row = row_quota(self.uid, self.quotas, container, gpu_uuid)
        if row is None:
            return Governs(None, pod_wide=False, share=False, managed=False)
        share = row.subject.scope is QuotaScope.SHARE or row.quota is NO_SHARE
        pod_wide = row.subject.scope is QuotaScope.POD
        return Governs(None if share else row.quota, pod_wide=pod_wide, share=share, managed=True)


def in_force(workload: Workload, policy: Policy) -> QuotaInForce:
    """The quotas of `workload`'s pod template under `policy`, with a note for each invalid value; none where no
    template is read (a bare pod since gone, a controller this plugin does not read) or it cannot be read."""
    uid = f"template:{workload.ref}"
    if workload.template is None:
        what = "its pods are gone" if workload.ref.kind == "Pod" else f"no {workload.ref.kind} template is read"
        return QuotaInForce(uid, None, (f"quota unknown: {what}",))
    manifest = dict(workload.template)
    meta = dict(manifest.get("metadata") or {})
    meta.setdefault("uid", uid)
    meta["namespace"] = workload.ref.namespace
    meta.setdefault("name", workload.ref.name)
    try:
        pod = pod_info_from_manifest({**manifest, "metadata": meta})
    except (PodSourceError, ValueError, TypeError, AttributeError) as e:
        return QuotaInForce(uid, None, (f"quota unknown: the pod template cannot be read ({e})",))
    quotas = resolve_pod_quota(pod, policy, {})
    notes = tuple(f"invalid: {invalid_message(err)}" for err in quotas.errors)
    return QuotaInForce(pod.uid, quotas, notes, MappingProxyType(declared_pairs(pod, policy)))


def declared_pairs(pod: PodInfo, policy: Policy) -> dict[str, QuotaSource]:
    """Per container, the first request/limit pair source of `policy` whose request or limit `pod` names for it: a
    variable in its `env[]` (a literal or a valueFrom), KAI's annotation for it; or the variables, for a container
    with NVIDIA GPUs and an `envFrom` that may set them unread (an entry in `env[]` overrides it). Where the agent
    could not read it, the recommendation still goes there: the team declares its limits in that field."""
    pairs = [s for s in readable_sources(policy.quota_sources) if s.pair]
    found: dict[str, QuotaSource] = {}
    for c in pod.containers:
        for source in pairs:
            within = c.env if source.kind is SourceKind.ENV else pod.annotations
            if any(key in within for key in source.pair_keys(c.name)) or (source.kind is SourceKind.ENV and c.env_from):
                found[c.name] = source
                break
    return found


def field_of(quota: Quota | None, declared: QuotaSource | None = None) -> QuotaSource:
    """The template field a recommendation goes into: the one the quota in force came from, where it is one (a
    container's limit, NVIDIA's variables or KAI's annotations for it, the pod's annotation); else the pair the
    container `declared` (its value unreadable: a valueFrom, an invalid one); else NEW_FIELD."""
    origin = quota.origin if quota is not None else None
    if origin is not None and origin.kind is not SourceKind.CLAIM:
        return origin
    return declared if declared is not None else NEW_FIELD


def spell(target: QuotaSource, n_bytes: int) -> str:
    """`n_bytes` as the field `target` takes it: a byte quantity, or a count of its unit (rounded up)."""
    unit = target.unit_bytes
    return format_quantity(n_bytes) if unit == 1 else str(math.ceil(n_bytes / unit))
