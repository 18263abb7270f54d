"""Which VRAM quota applies to each container of a pod: sources, policy defaults, burst and namespace caps.

`resolve_pod_quota` is pure: it reads the pod as the pod cache holds it, the policy and the node's labels, and
never raises on what a user wrote. The rules (DESIGN.md "Quotas"):

1. **Sources, per container, in `policy.quota_sources` order.** Each container walks the list and stops at the
   first source that gives it a valid value:
   - `resource:<name>`: the container's own `resources.limits[<name>]`, converted with that name's unit. The
     container gets its own quota in `PodQuota.containers`.
   - `annotation:<name>`: the pod's annotation. The container is covered by the one pod-wide quota,
     `PodQuota.pod`, which the decision core checks against the summed usage of every covered container.
   So in a pod with a `vramguard.io/vram` limit on `trainer` and a `vramguard.io/vram-limit` annotation,
   `trainer` has its own quota and every other container shares the annotation's. Reorder the sources to put an
   annotation first and it covers every container, limits or not.
2. **The pod-wide quota is the first valid annotation source**, and it is set whenever the pod carries one,
   even if every listed container has a limit of its own: it then covers usage from containers the pod cache
   does not list. The invariant the decision core relies on: when `pod` is set, every container absent from
   `containers` is covered by it; when it is not, such containers are unmanaged.
3. **Invalid values never raise.** A value that does not parse (`12GB`, `-1`, `abc`, an overflow) adds a
   `QuotaError` naming the field and the value, and the walk goes on to the next source. Only values the walk
   actually reads are reported: a bad value shadowed by a valid one of higher precedence is never looked at.
4. **Policy default** (`policy.default_for(namespace)`) for a container no source covers, one per container:
   `none` leaves it unmanaged (absent from `containers`); `fixed` gives it that many bytes; `fair-share` gives
   it `share_divisor = nvidia.com/gpu.replicas`. A node without that label does not time-slice its GPUs, so the
   share is the whole GPU (replicas=1). A label that is not a positive integer cannot be trusted either way: the
   pod gets a `QuotaError` naming the label, and the containers stay unmanaged rather than get a made-up share.
5. **Burst**: the `vramguard.io/vram-burst` annotation sets `burst_bytes` on every quota of the pod. A burst
   below any of the pod's byte quotas (compared before capping) is a `QuotaError` and is ignored for the whole
   pod; so is a burst on a pod with no quota at all, since it would silently do nothing. A fair share cannot be
   compared before it meets a device; `Quota.hard_for` takes the larger of the two there.
6. **Namespace cap** (`policy.cap_for(namespace)`): no quota, from any source or default, and no burst, may
   exceed it, so users cannot exempt themselves by annotating their own pod. A capped quota's source ends with
   ` capped by namespace max 16Gi`. Limitation: a fair share is only bytes once it meets a device, and
   `model.Quota` has no field to carry the cap to `limit_for`, so a fair-share quota's limit is not capped
   (its burst is). The fair share is the operator's own default, not something a user can raise.

Policies built by `vramguard.policy` contain only valid sources; a `Policy` built in code with a source this
module cannot read skips that source.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Final

from vramguard.model import DefaultKind, PodInfo, PodQuota, Policy, Quota, QuotaError
from vramguard.quantity import (
    ANNOTATION_UNIT_BYTES,
    RESOURCE_UNIT_BYTES,
    QuantityError,
    format_quantity,
    parse_count_bytes,
    parse_quantity,
    show_value,
)

BURST_ANNOTATION: Final = "vramguard.io/vram-burst"
REPLICAS_LABEL: Final = "nvidia.com/gpu.replicas"  # set by GPU feature discovery; time-slicing replicas per GPU

_REPLICAS = re.compile(r"[0-9]{1,9}")  # bounded: int() of a 5000-digit label would raise


class SourceKind(str, enum.Enum):
    RESOURCE = "resource"  # a container's resources.limits
    ANNOTATION = "annotation"  # a pod annotation, covering the whole pod


@dataclass(frozen=True, slots=True)
class QuotaSource:
    """One entry of `Policy.quota_sources`, e.g. `resource:nvidia.com/gpumem`, with the bytes per unit."""

    kind: SourceKind
    name: str
    unit_bytes: int

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.name}"


# The annotation that sets a burst is not a quota source: listing it would make a burst a quota.
QUOTA_ANNOTATION_UNIT_BYTES: Final[Mapping[str, int]] = MappingProxyType(
    {name: unit for name, unit in ANNOTATION_UNIT_BYTES.items() if name != BURST_ANNOTATION}
)


def parse_quota_source(text: str) -> QuotaSource:
    """`resource:vramguard.io/vram` or `annotation:gpu-memory` → QuotaSource; ValueError says what is wrong."""
    kind_text, sep, name = text.partition(":")
    known_by_kind = {SourceKind.RESOURCE: RESOURCE_UNIT_BYTES, SourceKind.ANNOTATION: QUOTA_ANNOTATION_UNIT_BYTES}
    kind = next((k for k in SourceKind if k.value == kind_text), None)
    if not sep or kind is None:
        raise ValueError("must be resource:<name> or annotation:<name>")
    known = known_by_kind[kind]
    if name not in known:
        raise ValueError(f"vramguard knows the unit of no {kind.value} named {name!r}; known: {', '.join(known)}")
    return QuotaSource(kind, name, known[name])


def resolve_pod_quota(pod: PodInfo, policy: Policy, node_labels: Mapping[str, str]) -> PodQuota:
    """The quotas of `pod` under `policy` on a node with `node_labels`. Never raises on pod content."""
    errors: list[QuotaError] = []
    sources = _readable_sources(policy.quota_sources)

    pod_source, pod_quota = _pod_wide_quota(pod, sources, errors)
    default: Quota | None = None
    default_resolved = False

    containers: dict[str, Quota] = {}
    for container in pod.containers:
        own = _container_quota(container.name, container.limits, sources, pod_source, errors)
        if own is not None:
            containers[container.name] = own
        elif pod_source is None:  # otherwise the walk reached the pod-wide source: the container is covered
            if not default_resolved:
                default = _default_quota(pod, policy, node_labels, errors)
                default_resolved = True
            if default is not None:
                containers[container.name] = default

    containers, pod_quota = _apply_burst(pod, containers, pod_quota, errors)
    cap = policy.cap_for(pod.namespace)
    if cap is not None:
        containers = {name: _capped(q, cap) for name, q in containers.items()}
        pod_quota = _capped(pod_quota, cap) if pod_quota is not None else None
    return PodQuota(containers=MappingProxyType(containers), pod=pod_quota, errors=tuple(errors))


def _readable_sources(texts: Sequence[str]) -> tuple[QuotaSource, ...]:
    readable = []
    for text in texts:
        try:
            readable.append(parse_quota_source(text))
        except ValueError:
            continue  # the policy loader reports these; a Policy built in code just goes without
    return tuple(readable)


def _pod_wide_quota(
    pod: PodInfo, sources: Sequence[QuotaSource], errors: list[QuotaError]
) -> tuple[QuotaSource | None, Quota | None]:
    """The first annotation source with a valid value on the pod, and its quota."""
    for source in sources:
        if source.kind is not SourceKind.ANNOTATION or source.name not in pod.annotations:
            continue
        raw = pod.annotations[source.name]
        try:
            limit = parse_count_bytes(raw, source.unit_bytes, source.name)
        except QuantityError as e:
            errors.append(QuotaError(f"metadata.annotations[{source.name}]", raw, str(e)))
            continue
        return source, Quota(limit_bytes=limit, source=f"annotation {source.name}")
    return None, None


def _container_quota(
    container: str,
    limits: Mapping[str, str],
    sources: Sequence[QuotaSource],
    pod_source: QuotaSource | None,
    errors: list[QuotaError],
) -> Quota | None:
    """The container's own quota from the first valid resource source ahead of the pod-wide one, if any."""
    for source in sources:
        if source == pod_source:
            return None  # covered by the pod-wide quota
        if source.kind is not SourceKind.RESOURCE or source.name not in limits:
            continue
        raw = limits[source.name]
        try:
            limit = parse_count_bytes(raw, source.unit_bytes, source.name)
        except QuantityError as e:
            errors.append(QuotaError(f"spec.containers[{container}].resources.limits[{source.name}]", raw, str(e)))
            continue
        return Quota(limit_bytes=limit, source=f"limits[{source.name}]")
    return None


def _default_quota(
    pod: PodInfo, policy: Policy, node_labels: Mapping[str, str], errors: list[QuotaError]
) -> Quota | None:
    default = policy.default_for(pod.namespace)
    if default.kind is DefaultKind.FIXED and default.bytes is not None:
        return Quota(limit_bytes=default.bytes, source="default fixed")
    if default.kind is DefaultKind.FAIR_SHARE:
        raw = node_labels.get(REPLICAS_LABEL)
        if raw is None:
            return Quota(share_divisor=1, source="default fair-share (replicas=1)")
        if _REPLICAS.fullmatch(raw) and int(raw) > 0:
            return Quota(share_divisor=int(raw), source=f"default fair-share (replicas={int(raw)})")
        errors.append(
            QuotaError(
                f"node.metadata.labels[{REPLICAS_LABEL}]",
                raw,
                f"{show_value(raw)} is not a valid replica count (expected a positive integer); "
                "the fair-share default is not applied",
            )
        )
    return None


def _apply_burst(
    pod: PodInfo, containers: dict[str, Quota], pod_quota: Quota | None, errors: list[QuotaError]
) -> tuple[dict[str, Quota], Quota | None]:
    raw = pod.annotations.get(BURST_ANNOTATION)
    if raw is None:
        return containers, pod_quota
    field = f"metadata.annotations[{BURST_ANNOTATION}]"
    try:
        burst = parse_quantity(raw)
    except QuantityError as e:
        errors.append(QuotaError(field, raw, str(e)))
        return containers, pod_quota

    quotas = [*containers.values(), *([pod_quota] if pod_quota is not None else [])]
    if not quotas:
        reason = "the pod has no quota for it to extend"
        errors.append(QuotaError(field, raw, str(QuantityError(raw, reason, "burst"))))
        return containers, pod_quota
    largest = max((q for q in quotas if q.limit_bytes is not None), key=lambda q: q.limit_bytes or 0, default=None)
    if largest is not None and largest.limit_bytes is not None and burst < largest.limit_bytes:
        reason = (
            f"below the quota {format_quantity(largest.limit_bytes)} from {largest.source}; "
            "a burst must be at least the quota"
        )
        errors.append(QuotaError(field, raw, str(QuantityError(raw, reason, "burst"))))
        return containers, pod_quota

    return (
        {name: replace(q, burst_bytes=burst) for name, q in containers.items()},
        replace(pod_quota, burst_bytes=burst) if pod_quota is not None else None,
    )


def _capped(quota: Quota, cap: int) -> Quota:
    limit = min(quota.limit_bytes, cap) if quota.limit_bytes is not None else None
    burst = min(quota.burst_bytes, cap) if quota.burst_bytes is not None else None
    # A fair share's bytes depend on the device it meets, so its cap travels with it.
    cap_bytes = cap if quota.share_divisor is not None else None
    if limit == quota.limit_bytes and burst == quota.burst_bytes and cap_bytes is None:
        return quota
    return replace(
        quota,
        limit_bytes=limit,
        burst_bytes=burst,
        cap_bytes=cap_bytes,
        source=f"{quota.source} capped by namespace max {format_quantity(cap)}",
    )
