"""Driver-level memory limits: which cgroup should hold which hard limit on which GPU. No I/O, no clock.

In the enforcing modes, one hard limit per container with a quota (its burst where set, capped at the GPU's
memory) on each whole GPU, the pod's own cgroup holding the sum, a DRA share on its GPU only; never on a MIG
instance, an unhealthy GPU, the agent's pod or an exempt namespace. Why: `docs/architecture.md` "Driver memory limits".
`limiter.DriverLimiter` programs them; the reactive loop stays the backstop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from vramguard.core.driver_limit import LimitKey, LimitTarget
from vramguard.core.pod import PodInfo
from vramguard.core.policy import DriverLimits, Mode, Policy
from vramguard.core.ports import ClaimSource, PodSource
from vramguard.core.quota import NO_HARD_LIMIT, NO_SHARE, PodQuota, RowQuota, resolve_pod_quota, row_quota
from vramguard.core.sample import GpuDevice
from vramguard.core.shares import PodShares
from vramguard.core.snapshot import ContainerUsage, Snapshot


def limits_enabled(policy: Policy, dry_run: bool) -> bool:
    """Whether the agent may program driver limits at all: never with `--dry-run` or `driver_limits: off`."""
    return not dry_run and policy.driver_limits is not DriverLimits.OFF


def uses_limiter(policy: Policy, dry_run: bool) -> bool:
    """Whether the agent programs driver limits under `policy`: it enforces somewhere (evict or kill) and
    `limits_enabled`. A warn-only policy holds no quota, so it limits nothing."""
    enforcing = policy.mode is not Mode.WARN or any(
        ns.mode is not None and ns.mode is not Mode.WARN for ns in policy.namespaces.values()
    )
    return enforcing and limits_enabled(policy, dry_run)


def whole_gpus(devices: Iterable[GpuDevice]) -> list[GpuDevice]:
    """The GPUs a limit can go on: healthy, whole, and not split into MIG instances."""
    devices = list(devices)
    split = {d.parent_uuid for d in devices if d.parent_uuid is not None}
    return [d for d in devices if d.mig_index is None and d.healthy and d.uuid not in split]


@dataclass(frozen=True, slots=True)
class WantedLimits:
    """The targets `wanted_limits` gave, with what they were computed from, to reuse while nothing changed
    (`computed_from`). Keyed on the pods, node labels and DRA shares the sources handed out, compared with ``==``
    (as fast as ``is`` for the same mapping, which a source keeps handing out until something changes:
    `ports.PodSource`), and on the GPUs by value: UUID, index and size."""

    pods: Mapping[str, PodInfo]
    node_labels: Mapping[str, str]
    shares: Mapping[str, PodShares] | None
    gpus: tuple[tuple[str, int, int], ...]
    targets: tuple[LimitTarget, ...]

    @classmethod
    def of(
        cls,
        pods: Mapping[str, PodInfo],
        node_labels: Mapping[str, str],
        shares: Mapping[str, PodShares] | None,
        gpus: Iterable[GpuDevice],
        targets: tuple[LimitTarget, ...],
    ) -> WantedLimits:
        return cls(pods, node_labels, shares, _shape(gpus), targets)

    def computed_from(
        self,
        pods: Mapping[str, PodInfo],
        node_labels: Mapping[str, str],
        shares: Mapping[str, PodShares] | None,
        gpus: Iterable[GpuDevice],
    ) -> bool:
        return (self.pods, self.node_labels, self.shares, self.gpus) == (pods, node_labels, shares, _shape(gpus))


def _shape(gpus: Iterable[GpuDevice]) -> tuple[tuple[str, int, int], ...]:
    return tuple((d.uuid, d.index, d.total_bytes) for d in gpus)


@dataclass(frozen=True, slots=True)
class _Seen:
    """What the last scan saw that the limits depend on: the GPUs a limit can go on, and the agent's own pod."""

    gpus: tuple[GpuDevice, ...]
    agent_pod_uid: str | None


class LimitPlanner:
    """The limits the quotas call for: for the scan, every pod's (`wanted`, computed again only when its inputs
    change), and for one pod at a time on the driver limiter's worker (`plan`, the moment a cgroup of it appears).
    Built before the Agent and the limiter and handed to each.

    The scan's thread writes, the worker reads: the policy in force (`use`, at each reload) and what the last
    scan saw (`wanted`) are each published as one reference, replaced whole and never mutated, and the sources
    hand out mappings they replace whole too (`ports.PodSource`), so `plan` needs no lock. The memo is the scan's
    alone."""

    def __init__(self, pods: PodSource, claims: ClaimSource | None, policy: Policy, *, dry_run: bool = False) -> None:
        self.pods = pods
        self.claims = claims  # None: no claim quota source in the policy
        self.dry_run = dry_run
        self._policy = policy
        self._seen: _Seen | None = None  # None until a scan saw the GPUs
        self._memo: WantedLimits | None = None

    def use(self, policy: Policy) -> None:
        """Plan with a reloaded policy from now on (the scan's thread): every limit is computed afresh."""
        self._policy = policy
        self._memo = None

    def wanted(
        self,
        pods: Mapping[str, PodInfo],
        labels: Mapping[str, str],
        shares: Mapping[str, PodShares] | None,
        quotas: Mapping[str, PodQuota],
        devices: Iterable[GpuDevice],
        agent_pod_uid: str | None,
    ) -> tuple[tuple[LimitTarget, ...], list[int]]:
        """The limits the scan's quotas call for, and the GPUs that can hold them (the scan's thread); computed
        again only when the pods, the node's labels, the DRA shares or the GPUs change (`WantedLimits`)."""
        gpus = whole_gpus(devices)
        self._seen = _Seen(tuple(gpus), agent_pod_uid)
        memo = self._memo
        if memo is None or not memo.computed_from(pods, labels, shares, gpus):
            targets = self._limits(pods, quotas, gpus, self._policy, agent_pod_uid)
            memo = self._memo = WantedLimits.of(pods, labels, shares, gpus, targets)
        return memo.targets, [d.index for d in gpus]

    def plan(self, pod_uid: str) -> tuple[LimitTarget, ...] | None:
        """The limits one pod calls for now, read fresh from the sources (any thread); None when the pod is not
        known yet, or no scan has seen the GPUs."""
        policy, seen = self._policy, self._seen
        pod = self.pods.pods().get(pod_uid)
        if pod is None or seen is None:
            return None
        shares = self.claims.shares() if self.claims is not None else None
        held = shares.get(pod_uid) if shares is not None else None
        quota = resolve_pod_quota(pod, policy, self.pods.node_labels(), held)
        return self._limits({pod_uid: pod}, {pod_uid: quota}, list(seen.gpus), policy, seen.agent_pod_uid)

    def _limits(
        self,
        pods: Mapping[str, PodInfo],
        quotas: Mapping[str, PodQuota],
        gpus: list[GpuDevice],
        policy: Policy,
        agent_pod_uid: str | None,
    ) -> tuple[LimitTarget, ...]:
        """The limits `policy` wants; none once a reload turned them off (the limiter clears its own)."""
        if not uses_limiter(policy, self.dry_run):
            return ()
        return wanted_limits(pods, quotas, gpus, policy, agent_pod_uid=agent_pod_uid)


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
        if pod is None or policy.exemption(uid, pod.namespace, agent_pod_uid) is not None:
            continue
        if policy.mode_for(pod.namespace) is Mode.WARN:
            continue
        targets += pod_limits(pod, pod_quota, gpus)
    return tuple(targets)


def pod_limits(pod: PodInfo, pod_quota: PodQuota, gpus: list[GpuDevice]) -> list[LimitTarget]:
    """One pod's limits on `gpus` (whole GPUs): its own cgroup's, then each container's.

    The pod's cgroup holds, on each GPU, the sum of what its containers may hold there (their own hard limits,
    DRA shares, and the pod-wide quota for the containers it covers), so the limit is in place from the moment
    the kubelet creates the cgroup, before any container of the pod exists; summing init containers too is never
    tighter than the pod needs. Where one container has no quota at all, or one with no hard limit (a request
    alone in NVIDIA's variables: `quota.NO_HARD_LIMIT`), the pod's cgroup holds none (it would bound that
    container), and such a container gets no limit of its own: the agent holds its soft limit itself. Which quota
    holds which container on which GPU is `quota.row_quota`'s answer, as for the decision. A container that has not
    started yet has a target without `container_id` (`pending`): the limiter gives it to a new container cgroup of
    the pod when that cannot be another's."""
    targets: list[LimitTarget] = []
    names = [c.name for c in pod.containers]
    for gpu in gpus:
        # Each listed container's row on this GPU, then the pod's own cgroup's (the pod-wide quota, if any).
        rows = [_bounded(row_quota(pod.uid, pod_quota, name, gpu.uuid)) for name in names]
        wide = row_quota(pod.uid, pod_quota, "", gpu.uuid)
        own = [r for r in rows if r is not None and r.holder is not None]
        total = sum(r.quota.hard_for(gpu.total_bytes) for r in own)
        if wide is not None:
            total += wide.quota.hard_for(gpu.total_bytes)
        source = wide.quota.source if wide is not None and not own else "the sum of its containers' limits"
        if None not in rows and total > 0:
            targets.append(_target(pod, None, None, gpu, total, source))
    for container in pod.containers:
        for gpu in gpus:
            row = _bounded(row_quota(pod.uid, pod_quota, container.name, gpu.uuid))
            # A container's own quota with a hard limit; a DRA share on its own GPU only (none where it holds no
            # share: NO_SHARE).
            if row is not None and row.holder is not None and row.quota is not NO_SHARE:
                hard = row.quota.hard_for(gpu.total_bytes)
                targets.append(_target(pod, container.name, container.container_id, gpu, hard, row.quota.source))
    return targets


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
    # Plain tuples, equal to LimitKeys and a fifth of their cost to build, for every row of every scan.
    index: dict[tuple[str, str | None, str], int] = {
        (u.pod.uid, u.container, u.device_uuid): i for i, u in enumerate(rows)
    }
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


def _bounded(row: RowQuota | None) -> RowQuota | None:
    """The row, where its quota has a hard limit for the driver to hold: None for a soft limit declared with no hard
    one (`NO_HARD_LIMIT`), which the agent holds alone (a driver limit of the GPU's size would bound nothing)."""
    if row is None or row.quota.burst_bytes is None or row.quota.burst_bytes < NO_HARD_LIMIT:
        return row
    return None


def _target(
    pod: PodInfo, container: str | None, container_id: str | None, gpu: GpuDevice, hard_bytes: int, source: str
) -> LimitTarget:
    hard = min(hard_bytes, gpu.total_bytes)
    return LimitTarget(
        pod, container, container_id, gpu.index, gpu.uuid, hard, source, gpu_label=gpu.label, holder=gpu.backend.holder
    )
