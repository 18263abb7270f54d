"""Driver-level memory limits: which cgroup should hold which hard limit on which GPU. Pure.

NVIDIA's driver R615 added a hard GPU memory limit per cgroup (`nvmlDeviceSetMemoryLimits_v1`): an allocation
that would take the cgroup over it fails with CUDA out-of-memory *in that cgroup only*, so a neighbour never
runs short while the agent's poll comes round. In the enforcing modes (evict, kill; never warn or dry-run) the
agent asks for one limit per container that has a quota, on every whole GPU of the node, or one on the pod's
cgroup for a pod-wide quota; a DRA share (a `claim:` quota source) goes on its own GPU only:

- the hard limit is the quota's hard limit (its burst where one is set, else the quota itself), capped at the
  GPU's memory, as the driver refuses more; the soft limit is always 0 (a soft limit reserves memory in every
  parent cgroup and would outlive a removed cgroup), so the quota stays the reactive soft limit;
- never on a MIG instance (the driver does not support MIG handles), an unhealthy GPU, the agent's own pod or
  an exempt namespace, and not before the container has an ID (its cgroup does not exist yet).

`limiter.DriverLimiter` programs these on a worker; the reactive loop goes on unchanged as the backstop (UVM
memory, MIG, cgroup v1 hosts, drivers before R615).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from vramguard.model import (
    ContainerUsage,
    DriverLimits,
    GpuDevice,
    Mode,
    PodInfo,
    PodQuota,
    Policy,
    Quota,
    Snapshot,
    format_bytes,
)

LimitKey = tuple[str, str | None, str]
"""(pod UID, container name or None for the pod's own cgroup, GPU UUID): one limit's identity."""


@dataclass(frozen=True, slots=True)
class LimitTarget:
    """One hard limit the driver should hold: on the cgroup of `pod`'s container `container_id` (the pod's
    own cgroup when `container` is None), on whole GPU `gpu_index`."""

    pod: PodInfo
    container: str | None
    container_id: str | None
    gpu_index: int
    gpu_uuid: str
    hard_bytes: int
    source: str  # the quota's source, for messages

    @property
    def key(self) -> LimitKey:
        return (self.pod.uid, self.container, self.gpu_uuid)

    @property
    def subject(self) -> str:
        return f"container {self.container}" if self.container is not None else f"pod {self.pod.name}"

    def describe(self) -> str:
        return f"hard limit {format_bytes(self.hard_bytes)} on GPU {self.gpu_index} ({self.gpu_uuid}) ({self.source})"


@dataclass(frozen=True, slots=True)
class LimitOutcome:
    """What programming one limit came to. `result`: applied (set now), unchanged (the driver already held it:
    an agent restart), cleared (no longer wanted), unsupported (this driver or GPU cannot: the reactive modes
    hold the quota), failed (an error; retried later)."""

    target: LimitTarget
    result: str
    detail: str = ""


def limits_enabled(policy: Policy, dry_run: bool) -> bool:
    """Whether the agent may program driver limits at all: never with `--dry-run` or `driver_limits: off`."""
    return not dry_run and policy.driver_limits is not DriverLimits.OFF


def whole_gpus(devices: Iterable[GpuDevice]) -> list[GpuDevice]:
    """The GPUs a limit can go on: healthy, whole, and not split into MIG instances."""
    devices = list(devices)
    split = {d.parent_uuid for d in devices if d.parent_uuid is not None}
    return [d for d in devices if d.mig_index is None and d.healthy and d.uuid not in split]


def wanted_limits(
    pods: Mapping[str, PodInfo],
    quotas: Mapping[str, PodQuota],
    devices: Iterable[GpuDevice],
    policy: Policy,
    *,
    agent_pod_uid: str | None = None,
) -> tuple[LimitTarget, ...]:
    """Every limit the driver should hold now (call only when `limits_enabled`)."""
    gpus = whole_gpus(devices)
    if not gpus:
        return ()
    targets: list[LimitTarget] = []
    for uid, pod_quota in quotas.items():
        pod = pods.get(uid)
        if pod is None or uid == agent_pod_uid or pod.namespace in policy.exempt_namespaces:
            continue
        if policy.mode_for(pod.namespace) is Mode.WARN:
            continue
        if pod_quota.pod is not None:
            targets += _per_gpu(pod, None, None, pod_quota.pod, gpus)
        for container in pod.containers:
            if not container.container_id:
                continue
            shares = pod_quota.shares.get(container.name)
            if shares is not None:  # DRA shares: each on its own GPU, none elsewhere
                for gpu in gpus:
                    if gpu.uuid in shares:
                        targets += _per_gpu(pod, container.name, container.container_id, shares[gpu.uuid], [gpu])
                continue
            quota = pod_quota.containers.get(container.name)
            if quota is not None:
                targets += _per_gpu(pod, container.name, container.container_id, quota, gpus)
    return tuple(targets)


@dataclass(frozen=True, slots=True)
class UsageDisagreement:
    """A limited container whose usage on one GPU the driver counts differently from NVML's process rows."""

    target: LimitTarget
    rows_bytes: int  # the sum of its processes' rows
    driver_bytes: int  # nvmlDeviceGetMemoryLimits_v1's currentUsed for its cgroup


def with_driver_usage(
    snapshot: Snapshot, held: Mapping[LimitKey, LimitTarget], usage: Mapping[LimitKey, int]
) -> tuple[Snapshot, tuple[UsageDisagreement, ...]]:
    """The snapshot with each limited container's usage as the driver counts it for its cgroup (every context,
    which per-process rows can miss), and where the two disagree. `usage` must be fresh (read since the last
    scan: `DriverLimiter.fresh_usage`). A container the driver counts memory for but NVML lists no process of
    gets a row without processes: the killer then finds its holders through the cgroup."""
    if not usage:
        return snapshot, ()
    rows = list(snapshot.containers)
    index: dict[LimitKey, int] = {(u.pod.uid, u.container, u.device_uuid): i for i, u in enumerate(rows)}
    disagreements = []
    for key, driver_bytes in usage.items():
        target = held.get(key)
        if target is None or target.container is None:
            continue  # a pod's own cgroup: its containers' rows carry the usage
        at = index.get(key)
        rows_bytes = rows[at].used_bytes if at is not None else 0
        if rows_bytes == driver_bytes:
            continue
        disagreements.append(UsageDisagreement(target, rows_bytes, driver_bytes))
        if at is not None:
            rows[at] = rows[at]._replace(used_bytes=driver_bytes)
        elif driver_bytes > 0:
            t = target
            rows.append(ContainerUsage(t.pod, t.container or "", t.container_id, t.gpu_uuid, driver_bytes, ()))
    return replace(snapshot, containers=tuple(rows)), tuple(disagreements)


def _per_gpu(
    pod: PodInfo, container: str | None, container_id: str | None, quota: Quota, gpus: list[GpuDevice]
) -> list[LimitTarget]:
    return [
        LimitTarget(
            pod=pod,
            container=container,
            container_id=container_id,
            gpu_index=gpu.index,
            gpu_uuid=gpu.uuid,
            hard_bytes=min(quota.hard_for(gpu.total_bytes), gpu.total_bytes),
            source=quota.source,
        )
        for gpu in gpus
    ]
