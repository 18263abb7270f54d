"""Which VRAM quota applies to each container of a pod: sources, policy defaults, burst and namespace caps.

`resolve_pod_quota` is pure: it reads the pod as the pod cache holds it, the policy and the node's labels, and
never raises on what a user wrote. `row_quota` is the pod's quota layout, pure too: which subject and quota govern a
container's row on a GPU; the decision, the limit planner and `kubectl vramguard recommend` all ask it. The rules:
`docs/architecture.md` "Quotas". Policies built by `vramguard.core.policy` contain only valid sources; a `Policy`
built in code with a source this module cannot read skips that source.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Final, NamedTuple

from vramguard.core.driver_limit import LimitKey
from vramguard.core.pod import ContainerInfo, PodInfo
from vramguard.core.policy import DefaultKind, Policy
from vramguard.core.quantity import (
    MAX_BYTES,
    QuantityError,
    format_quantity,
    parse_quota_bytes,
)
from vramguard.core.shares import PodShares, Share
from vramguard.core.snapshot import ContainerUsage
from vramguard.core.sources import BURST_ANNOTATION, QuotaError, QuotaSource, SourceKind, readable_sources
from vramguard.core.text import cut, show_value


@dataclass(frozen=True, slots=True)
class Quota:
    """A VRAM quota on one GPU. `limit_bytes` is the soft limit when `burst_bytes` is set, the hard one otherwise.

    A fair-share quota is not a number of bytes until it meets a GPU: it is `share_divisor`, and the limit is the
    device's total memory divided by it.
    """

    limit_bytes: int | None = None
    burst_bytes: int | None = None
    share_divisor: int | None = None
    source: str = ""  # where it came from, for messages: "limits[vramguard.io/vram]", "annotation ...", "default"
    # The policy's quota source that gave it, where one did (None: a default, or the namespace cap standing in).
    origin: QuotaSource | None = None
    cap_bytes: int | None = None  # the namespace max: bounds a fair share, whose bytes depend on the device
    # For a DRA share (`claim:` source): which allocation it is, e.g. "<claim UID>/0"; the containers of a pod
    # holding the same share on a GPU are judged together against it, as the share is one amount of memory.
    share: str | None = None
    claim: str | None = None  # the ResourceClaim(s) the share comes from, by name ("a+b" for two on one GPU)

    def limit_for(self, device_total_bytes: int) -> int:
        if self.share_divisor is not None:
            share = device_total_bytes // self.share_divisor
            return share if self.cap_bytes is None else min(share, self.cap_bytes)
        assert self.limit_bytes is not None, "a Quota needs limit_bytes or share_divisor"
        return self.limit_bytes

    def hard_for(self, device_total_bytes: int) -> int:
        """The bytes over which the agent acts at once on a GPU of that size: the burst where set (the whole GPU for a
        soft limit with no hard one, `NO_HARD_LIMIT`), else the limit."""
        limit = self.limit_for(device_total_bytes)
        if self.burst_bytes is None:
            return limit
        return max(limit, device_total_bytes if self.burst_bytes >= NO_HARD_LIMIT else self.burst_bytes)

    @property
    def hard_bytes(self) -> int | None:
        """`hard_for` on any GPU; None for a fair share, whose bytes depend on the GPU it meets."""
        return None if self.share_divisor is not None else self.hard_for(0)


# The burst of a soft limit declared with no hard one (NVIDIA_GPU_MEMORY_REQUEST alone, which the toolkit's hook
# programs with no hard cap): above the soft limit for `soft_grace` the agent acts, and no hard limit below the GPU's
# own size holds it.
NO_HARD_LIMIT: Final = MAX_BYTES


class QuotaScope(str, enum.Enum):
    """Whose quota holds a row of usage (`quota.row_quota`), and so which rows are judged together against it."""

    CONTAINER = "container"  # the container's own quota (`NO_SHARE` included): its row alone, per GPU
    POD = "pod"  # the pod-wide quota (an annotation): the rows of the containers it covers on a GPU, summed
    SHARE = "share"  # a DRA share: the rows of the pod's containers holding that share on its GPU, summed


@dataclass(frozen=True, slots=True)
class PodQuota:
    """The quotas that apply to one pod.

    Each container whose first matching source is a resource limit has its own quota in `containers`; the
    containers covered by a pod-wide source (an annotation) share `pod`, checked against their summed usage.
    Which of them governs a container's row on a GPU is `quota.row_quota`'s answer, for every consumer.
    """

    containers: Mapping[str, Quota] = field(default_factory=lambda: MappingProxyType({}))
    pod: Quota | None = None
    errors: tuple[QuotaError, ...] = ()
    # Per-GPU quotas from DRA claims: container → GPU UUID → its share there. A container listed here is held to
    # its share on each GPU where it holds one and to nothing (NO_SHARE) on any other: a claim is all the GPU
    # memory the pod was given, so memory on a GPU it was not allocated is over its quota.
    shares: Mapping[str, Mapping[str, Quota]] = field(default_factory=lambda: MappingProxyType({}))

    def own(self, container: str, device_uuid: str) -> Quota | None:
        """The container's own quota on one GPU (its share there, or its quota on every GPU), or None when it
        has none (it is then covered by `pod`, or unmanaged)."""
        shares = self.shares.get(container)
        if shares is not None:
            return shares.get(device_uuid, NO_SHARE)
        return self.containers.get(container)


NO_SHARE = Quota(limit_bytes=0, source="no DRA claim share on this GPU")


class Subject(NamedTuple):
    """What is judged against one quota on one device (or MIG instance): a container with its own quota, the
    containers a pod-wide quota covers, or those holding one DRA share. The key of a violation and its episode."""

    pod_uid: str
    gpu_uuid: str
    scope: QuotaScope
    name: str | None  # the container (CONTAINER), the share's allocation (`Quota.share`: SHARE), None (POD)


class RowQuota(NamedTuple):
    """The quota a row of usage answers to: the subject it is judged in and the quota that holds it
    (`quota.row_quota`)."""

    subject: Subject
    quota: Quota
    # The container whose own quota holds the row (its quota, or a DRA share), None under the pod-wide quota: the
    # `container` of the quota's metric series, and the cgroup whose driver limit holds the row.
    holder: str | None

    @property
    def limit_key(self) -> LimitKey:
        """The key of the driver limit that holds the row's quota, where the driver holds one (`holder`'s cgroup)."""
        return LimitKey(self.subject.pod_uid, self.holder, self.subject.gpu_uuid)


QuotaRow = tuple[ContainerUsage, RowQuota | None]
"""One row of usage and the quota it answers to (None: unmanaged), found once per scan (`decide.quota_rows`) and read by
all that judges or shows a row: the violations, the pressure notices, /status and `vramguard top`, the quota metrics. A
plain pair, read by unpacking (`for usage, governing in rows`): one is built per row per scan, at a quarter of a
NamedTuple's cost."""


REPLICAS_LABEL: Final = "nvidia.com/gpu.replicas"  # set by GPU feature discovery; time-slicing replicas per GPU


_REPLICAS = re.compile(r"[0-9]{1,9}")  # bounded: int() of a 5000-digit label would raise


UNMANAGED: Final = "no quota: unmanaged"  # what applies to a container with no quota, in QuotaError.applies


# The longest VRAMQuotaInvalid text: the events.k8s.io/v1 API refuses a note over 1 kB, and a log line built
# from a tenant's 10 MB annotation must stay a line.
MAX_MESSAGE_CHARS: Final = 1024


def resolve_pod_quota(
    pod: PodInfo, policy: Policy, node_labels: Mapping[str, str], shares: PodShares | None = None
) -> PodQuota:
    """The quotas of `pod` under `policy` on a node with `node_labels`, with the DRA `shares` its containers hold
    (`shares.pod_shares`; None: the node has no claim source). Never raises on pod content."""
    findings: list[_Finding] = []
    sources = readable_sources(policy.quota_sources)
    cap = policy.cap_for(pod.namespace)

    pod_source, pod_quota = _pod_wide_quota(pod, sources, cap, findings)
    default: Quota | None = None
    default_resolved = False

    containers: dict[str, Quota] = {}
    per_gpu: dict[str, dict[str, Quota]] = {}
    stopped_at: dict[str, int] = {}  # the index in `sources` where each container's walk ended
    defaulted: list[str] = []  # the containers no source covers, in pod order
    for container in pod.containers:
        held = (shares or {}).get(container.name, ())
        own, stopped_at[container.name] = _container_quota(
            container, pod.annotations, held, sources, pod_source, cap, findings
        )
        if isinstance(own, dict):
            per_gpu[container.name] = own
        elif own is not None:
            containers[container.name] = own
        elif pod_source is None:  # otherwise the walk reached the pod-wide source: the container is covered
            if not default_resolved:
                default = _default_quota(pod, policy, node_labels, findings)
                default_resolved = True
            defaulted.append(container.name)
            if default is not None:
                containers[container.name] = default

    if any(s.kind is SourceKind.ENV for s in sources):
        for container in pod.containers:
            if container.env_from and container.name in defaulted and not container.env:
                error = QuotaError(
                    f"spec.containers[{container.name}].envFrom",
                    "envFrom",
                    "may set NVIDIA_GPU_MEMORY_REQUEST or NVIDIA_GPU_MEMORY_LIMIT, which vramguard does not read "
                    "there; set them in env[]",
                )
                findings.append(_Finding(error, _Governs.CONTAINER, container=container.name))

    if pod.mirrorless and pod_quota is None:
        # Its containers are unknown (`PodInfo.mirrorless`): what a container declaring nothing gets, pod-wide.
        pod_quota = _default_quota(pod, policy, node_labels, findings)
        if pod_quota is None and cap is not None:
            pod_quota = Quota(limit_bytes=cap, source=f"namespace max_quota {format_quantity(cap)} (no valid quota)")
    containers, per_gpu, pod_quota = _apply_burst(pod, containers, per_gpu, pod_quota, cap, findings)
    applies = {name: _describe(q, cap) for name, q in containers.items()}
    applies |= {name: "; ".join(_describe(q, cap) for q in gpus.values()) for name, gpus in per_gpu.items()}
    pod_applies = _describe(pod_quota, cap) if pod_quota is not None else None
    if cap is not None:
        per_gpu = {name: {gpu: _capped(q, cap) for gpu, q in gpus.items()} for name, gpus in per_gpu.items()}
        containers = {name: _capped(q, cap) for name, q in containers.items()}
        pod_quota = _capped(pod_quota, cap) if pod_quota is not None else None
        fallback = Quota(limit_bytes=cap, source=f"namespace max_quota {format_quantity(cap)} (no valid quota)")
        for name in defaulted:
            if name not in containers:
                containers[name] = fallback
                applies[name] = fallback.source
        containers = {c.name: containers[c.name] for c in pod.containers if c.name in containers}  # pod order

    errors = _with_applies(findings, pod, stopped_at, defaulted, applies, pod_applies)
    return PodQuota(
        containers=MappingProxyType(containers),
        pod=pod_quota,
        errors=errors,
        shares=MappingProxyType({name: MappingProxyType(gpus) for name, gpus in per_gpu.items()}),
    )


def row_quota(pod_uid: str, pod_quota: PodQuota, container: str, gpu_uuid: str) -> RowQuota | None:
    """The quota the pod's row of `container` on one GPU answers to: the container alone under its own quota (a DRA
    share, where it holds one there: the share's subject; `NO_SHARE` where it holds none), else the pod-wide quota's
    subject; None: unmanaged there. A row of no known container ("": the pod's own cgroup, or one its status does not
    list yet) has no quota of its own. The hard limit is the quota's `hard_for` the GPU (its burst where set). No I/O,
    no clock, no memo: `QuotaBook.rows` keeps the agent's answers while a pod's quota is unchanged."""
    own = pod_quota.own(container, gpu_uuid) if container else None
    if own is not None and own.share is None:
        return RowQuota(Subject(pod_uid, gpu_uuid, QuotaScope.CONTAINER, container), own, container)
    if own is not None:
        return RowQuota(Subject(pod_uid, gpu_uuid, QuotaScope.SHARE, own.share), own, container)
    if pod_quota.pod is not None:
        return RowQuota(Subject(pod_uid, gpu_uuid, QuotaScope.POD, None), pod_quota.pod, None)
    return None


@dataclass(frozen=True, slots=True)
class _Resolved:
    """One pod's quota and what it was resolved from. Keyed on the PodInfo and the PodShares objects themselves,
    by identity (the sources hand out a new one only when it changes: `ports.PodSource`), and on the node's
    labels by value."""

    pod: PodInfo
    node_labels: Mapping[str, str]
    shares: PodShares | None
    quota: PodQuota

    def resolved_from(self, pod: PodInfo, node_labels: Mapping[str, str], shares: PodShares | None) -> bool:
        return self.pod is pod and self.shares is shares and self.node_labels == node_labels


class QuotaBook:
    """Quotas per pod, each resolved again only when its pod, its DRA shares or the node's labels change
    (`_Resolved`).

    `resolve` also says which invalid quota values are new: each is reported once per pod, again only when a
    changed pod carries different errors (an edit that fixes nothing does not repeat the report).
    """

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._book: dict[str, _Resolved] = {}
        # `row_quota`'s answers for each pod's quota in the book, by pod UID, then (container, GPU UUID): at most
        # one per container and GPU, the pod's own cgroup too. Dropped with the pod's entry when it is resolved again.
        self._owners: dict[str, dict[tuple[str, str], RowQuota | None]] = {}

    def resolve(
        self,
        pods: Mapping[str, PodInfo],
        node_labels: Mapping[str, str],
        shares: Mapping[str, PodShares] | None = None,
    ) -> tuple[dict[str, PodQuota], list[tuple[PodInfo, QuotaError]]]:
        """(quota by pod UID, the invalid values to report now). `shares`: by pod UID, from the claim source."""
        book: dict[str, _Resolved] = {}
        new_errors: list[tuple[PodInfo, QuotaError]] = []
        for uid, pod in pods.items():
            held = shares.get(uid) if shares is not None else None
            cached = self._book.get(uid)
            if cached is not None and cached.resolved_from(pod, node_labels, held):
                book[uid] = cached
                continue
            pq = resolve_pod_quota(pod, self.policy, node_labels, held)
            if pq.errors and (cached is None or cached.quota.errors != pq.errors):
                new_errors.extend((pod, err) for err in pq.errors)
            book[uid] = _Resolved(pod, dict(node_labels), held, pq)
        self._owners = {uid: found for uid, found in self._owners.items() if book.get(uid) is self._book.get(uid)}
        self._book = book  # pods that left the cache leave the book
        return {uid: entry.quota for uid, entry in book.items()}, new_errors

    def rows(self, usage: Iterable[ContainerUsage]) -> tuple[QuotaRow, ...]:
        """Each row of usage with the quota governing it under the quotas the last `resolve` gave (`row_quota`; None for
        a pod without one), in order. Each is worked out once per container and GPU while its pod's quota is unchanged,
        since every scan asks for each row."""
        rows: list[QuotaRow] = []
        for u in usage:
            uid = u.pod.uid
            entry = self._book.get(uid)
            if entry is None:
                rows.append((u, None))
                continue
            found = self._owners.get(uid)
            if found is None:
                found = self._owners[uid] = {}
            key = (u.container, u.device_uuid)
            try:
                governing = found[key]
            except KeyError:  # not asked yet: once per container and GPU
                governing = found[key] = row_quota(uid, entry.quota, u.container, u.device_uuid)
            rows.append((u, governing))
        return tuple(rows)


def invalid_message(err: QuotaError) -> str:
    """The VRAMQuotaInvalid Event and log text of one error: the field, the value as written (bounded), what is
    wrong with it and what applies instead, e.g.

        metadata.annotations[vramguard.io/vram-limit]: "lots" is not a valid quantity (expected a number ...);
        applies instead: namespace max_quota 8Gi (no valid quota)

    Never longer than MAX_MESSAGE_CHARS, whatever the error holds: each part is bounded on its own, so a long
    field or reason never pushes what applies out of the message.
    """
    text = f"{cut(err.field, 200)}: {show_value(err.value)} {cut(err.message, 480)}"
    if err.applies:
        text += f"; applies instead: {cut(err.applies, 240)}"
    return cut(text, MAX_MESSAGE_CHARS)


class _Governs(enum.Enum):
    """What an invalid value would have governed, to say once the pod is resolved what applies instead."""

    CONTAINER = enum.auto()  # one container's own limit
    ANNOTATION = enum.auto()  # the listed containers whose walk reached this annotation, and the unlisted ones
    POD_WIDE = enum.auto()  # what the pod-wide quota covers: a valid annotation, over the namespace's cap
    DEFAULT = enum.auto()  # the containers that fell through to the policy default
    BURST = enum.auto()  # the burst of every quota of the pod
    CAPPED_BURST = enum.auto()  # a valid burst over the namespace's cap: the error says what applies already


@dataclass(frozen=True, slots=True)
class _Finding:
    error: QuotaError
    governs: _Governs
    container: str = ""  # for CONTAINER
    source_index: int = -1  # for ANNOTATION: its index in the readable sources


def _with_applies(
    findings: Sequence[_Finding],
    pod: PodInfo,
    stopped_at: Mapping[str, int],
    defaulted: Sequence[str],
    applies: Mapping[str, str],
    pod_applies: str | None,
) -> tuple[QuotaError, ...]:
    """Each finding's error, saying what applies instead to what the bad value would have governed."""

    def governing(names: Sequence[str]) -> str:
        """What applies to `names`: one text, or where they differ "limits[...] 2Gi for a; default fixed 4Gi for b"."""
        groups: dict[str, list[str]] = {}
        for name in names:
            groups.setdefault(applies.get(name, pod_applies or UNMANAGED), []).append(name)
        if len(groups) == 1:
            return next(iter(groups))
        return "; ".join(f"{text} for {', '.join(group)}" for text, group in groups.items())

    errors = []
    for f in findings:
        if f.governs is _Governs.CONTAINER:
            text = governing([f.container])
        elif f.governs is _Governs.ANNOTATION:
            reached = [c.name for c in pod.containers if stopped_at[c.name] > f.source_index]
            if reached:
                text = governing(reached)
            elif pod_applies is not None:
                text = pod_applies  # a later annotation covers the containers the pod cache does not list
            else:
                text = "no pod-wide quota (each container has a quota of its own)"
        elif f.governs is _Governs.POD_WIDE:
            text = pod_applies or UNMANAGED
        elif f.governs is _Governs.DEFAULT:
            text = governing(defaulted)
        elif f.governs is _Governs.CAPPED_BURST:
            text = f.error.applies
        else:
            text = "no burst (each quota is also the hard limit)"
        errors.append(replace(f.error, applies=text))
    return tuple(errors)


def _describe(quota: Quota, cap: int | None) -> str:
    """A quota as the message says what applies: "limits[nvidia.com/gpumem] 2Gi", before capping, with the cap."""
    if quota.limit_bytes is None:  # a fair share: bytes only once it meets a device
        capped = f" capped at {format_quantity(cap)} by namespace max_quota" if cap is not None else ""
        return f"{quota.source}{capped}"
    text = f"{quota.source} {format_quantity(quota.limit_bytes)}"
    if cap is not None and quota.limit_bytes > cap:
        text += f" capped to {format_quantity(cap)} by namespace max_quota"
    return text


def _reason(e: QuantityError) -> str:
    """A QuantityError as text that reads after the value, like the policy file's errors."""
    return f"is not a valid {e.what} ({e.reason})"


def _over_cap(field: str, raw: str, cap: int, applies: str = "") -> QuotaError:
    """A valid quota over its namespace's max_quota: capped, and reported, since it is not what the pod gets."""
    return QuotaError(field, raw, f"is over the namespace max_quota {format_quantity(cap)}", applies)


def _pod_wide_quota(
    pod: PodInfo, sources: Sequence[QuotaSource], cap: int | None, findings: list[_Finding]
) -> tuple[QuotaSource | None, Quota | None]:
    """The first annotation source with a valid value on the pod, and its quota."""
    for index, source in enumerate(sources):
        if source.per_container or source.name not in pod.annotations:
            continue
        raw = pod.annotations[source.name]
        field = f"metadata.annotations[{source.name}]"
        try:
            limit = source.value_bytes(raw)
        except QuantityError as e:
            findings.append(_Finding(QuotaError(field, raw, _reason(e)), _Governs.ANNOTATION, source_index=index))
            continue
        if cap is not None and limit > cap:
            findings.append(_Finding(_over_cap(field, raw, cap), _Governs.POD_WIDE))
        return source, Quota(limit_bytes=limit, source=source.field, origin=source)
    return None, None


def _container_quota(
    info: ContainerInfo,
    annotations: Mapping[str, str],
    shares: Sequence[Share],
    sources: Sequence[QuotaSource],
    pod_source: QuotaSource | None,
    cap: int | None,
    findings: list[_Finding],
) -> tuple[Quota | dict[str, Quota] | None, int]:
    """The container's own quota from the first valid per-container source ahead of the pod-wide one, if any (a
    claim source gives one per GPU, by UUID), and the index in `sources` where the walk stopped (len(sources) when it
    went through every one)."""
    container, limits = info.name, info.limits
    for index, source in enumerate(sources):
        if source == pod_source:
            return None, index  # covered by the pod-wide quota
        if source.kind is SourceKind.CLAIM:
            per_gpu = _claim_quotas(container, shares, source, findings)
            if per_gpu:
                return per_gpu, index
            continue
        if source.pair:
            paired = _pair_quota(info, annotations, source, cap, findings)
            if paired is not None:
                return paired, index
            continue
        if source.kind is not SourceKind.RESOURCE or source.name not in limits:
            continue
        raw = limits[source.name]
        field = f"spec.containers[{container}].resources.limits[{source.name}]"
        try:
            limit = source.value_bytes(raw)
        except QuantityError as e:
            findings.append(_Finding(QuotaError(field, raw, _reason(e)), _Governs.CONTAINER, container=container))
            continue
        if cap is not None and limit > cap:
            findings.append(_Finding(_over_cap(field, raw, cap), _Governs.CONTAINER, container=container))
        return Quota(limit_bytes=limit, source=source.field, origin=source), index
    return None, len(sources)


def _pair_quota(
    info: ContainerInfo,
    annotations: Mapping[str, str],
    source: QuotaSource,
    cap: int | None,
    findings: list[_Finding],
) -> Quota | None:
    """The container's quota from a request and limit pair (`QuotaSource.pair`): the request the soft limit, the limit
    the hard one. None where it declares neither, or where either is unreadable or the request is above the limit
    (each reported: half a pair is no quota). A limit alone is the quota; a request alone is a soft limit, with no
    hard one for the toolkit's variable (its hook sets none) and the request as the limit for KAI's annotation (its
    NRI plugin sets the limit to the request)."""
    container = info.name
    read: list[tuple[str, str, int | None]] = []  # (field, value as written, bytes; None: not given) per key
    for key in source.pair_keys(container):
        raw: str | None
        if source.kind is SourceKind.ENV:
            field, raw, given = f"spec.containers[{container}].env[{key}]", info.env.get(key, ""), key in info.env
        else:
            field, raw, given = f"metadata.annotations[{key}]", annotations.get(key, ""), key in annotations
        if not given:
            read.append(("", "", None))
            continue
        if raw is None:  # a valueFrom
            error = QuotaError(field, "valueFrom", "sets it from elsewhere (valueFrom), which vramguard does not read")
            findings.append(_Finding(error, _Governs.CONTAINER, container=container))
            return None
        try:
            value = source.value_bytes(raw, key)
        except QuantityError as e:
            findings.append(_Finding(QuotaError(field, raw, _reason(e)), _Governs.CONTAINER, container=container))
            return None
        read.append((field, raw, value))
    (request_field, request_raw, request), (limit_field, limit_raw, limit) = read
    if request is None and limit is None:
        return None
    if request is not None and limit is not None and request > limit:
        reason = f"is above the limit {limit_raw} ({limit_field}): a request must be at most its limit"
        findings.append(
            _Finding(QuotaError(request_field, request_raw, reason), _Governs.CONTAINER, container=container)
        )
        return None
    hard_field = limit_field or request_field
    hard = limit if limit is not None else request
    assert hard is not None
    if cap is not None and hard > cap:
        findings.append(
            _Finding(_over_cap(hard_field, limit_raw or request_raw, cap), _Governs.CONTAINER, container=container)
        )
    declared = zip(source.pair_keys(container), (request_field, limit_field), strict=True)
    names = " and ".join(key for key, field in declared if field)
    described = f"{source.kind.value} {names}"
    if limit is None and source.kind is SourceKind.ENV:
        return Quota(limit_bytes=request, burst_bytes=NO_HARD_LIMIT, source=described, origin=source)
    soft = request if request is not None else limit
    return Quota(limit_bytes=soft, burst_bytes=hard if hard != soft else None, source=described, origin=source)


def _claim_quotas(
    container: str, shares: Sequence[Share], source: QuotaSource, findings: list[_Finding]
) -> dict[str, Quota] | None:
    """The container's quota on each GPU from the shares `source` reads, or None when it reads none, or when one
    of them is unreadable (each is reported; half a claim is no quota)."""
    read = [s for s in shares if s.matches(source.name)]
    errors = [s.error for s in read if s.error is not None]
    for error in errors:
        findings.append(_Finding(error, _Governs.CONTAINER, container=container))
    if not read or errors:
        return None
    per_gpu: dict[str, list[Share]] = {}
    for share in read:
        per_gpu.setdefault(share.gpu_uuid, []).append(share)
    return {
        gpu: Quota(
            limit_bytes=sum(s.bytes for s in held),
            source=" + ".join(s.describe() for s in held),
            share="+".join(s.key for s in held),
            claim="+".join(dict.fromkeys(s.claim.partition("/")[2] for s in held)),
            origin=source,
        )
        for gpu, held in per_gpu.items()
    }


def _default_quota(
    pod: PodInfo, policy: Policy, node_labels: Mapping[str, str], findings: list[_Finding]
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
        error = QuotaError(
            f"node.metadata.labels[{REPLICAS_LABEL}]",
            raw,
            "is not a valid replica count (expected a positive integer); the fair-share default is not applied",
        )
        findings.append(_Finding(error, _Governs.DEFAULT))
    return None


def _apply_burst(
    pod: PodInfo,
    containers: dict[str, Quota],
    per_gpu: dict[str, dict[str, Quota]],
    pod_quota: Quota | None,
    cap: int | None,
    findings: list[_Finding],
) -> tuple[dict[str, Quota], dict[str, dict[str, Quota]], Quota | None]:
    raw = pod.annotations.get(BURST_ANNOTATION)
    if raw is None:
        return containers, per_gpu, pod_quota
    field = f"metadata.annotations[{BURST_ANNOTATION}]"
    try:
        burst = parse_quota_bytes(raw)
    except QuantityError as e:
        findings.append(_Finding(QuotaError(field, raw, _reason(e)), _Governs.BURST))
        return containers, per_gpu, pod_quota

    shares = [q for gpus in per_gpu.values() for q in gpus.values()]
    quotas = [*containers.values(), *shares, *([pod_quota] if pod_quota is not None else [])]
    if not quotas:
        reason = "the pod has no quota for it to extend"
        findings.append(_Finding(QuotaError(field, raw, _reason(QuantityError(raw, reason, "burst"))), _Governs.BURST))
        return containers, per_gpu, pod_quota
    largest = max((q for q in quotas if q.limit_bytes is not None), key=lambda q: q.limit_bytes or 0, default=None)
    if largest is not None and largest.limit_bytes is not None and burst < largest.limit_bytes:
        reason = (
            f"below the quota {format_quantity(largest.limit_bytes)} from {largest.source}; "
            "a burst must be at least the quota"
        )
        findings.append(_Finding(QuotaError(field, raw, _reason(QuantityError(raw, reason, "burst"))), _Governs.BURST))
        return containers, per_gpu, pod_quota
    if cap is not None and burst > cap:
        applies = f"burst {format_quantity(burst)} capped to {format_quantity(cap)} by namespace max_quota"
        findings.append(_Finding(_over_cap(field, raw, cap, applies), _Governs.CAPPED_BURST))

    def extended(q: Quota) -> Quota:  # a pair's own limit (its burst) is the one its owner declared: kept
        return replace(q, burst_bytes=burst) if q.burst_bytes is None else q

    return (
        {name: extended(q) for name, q in containers.items()},
        {name: {gpu: extended(q) for gpu, q in gpus.items()} for name, gpus in per_gpu.items()},
        extended(pod_quota) if pod_quota is not None else None,
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
