"""Attribute: how much GPU memory each container and pod uses, per device. Pure.

A GPU sample, the identities the identify stage found (`identify.ProcIdentifier`) and the pod cache in, a
`Snapshot` out::

    snapshot = attribute(sample, identities, pod_source.pods(), agent_pod_uid=..., agent_pid=os.getpid())
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from vramguard.core.pod import PodInfo
from vramguard.core.process import UNKNOWN_START_TIME, Identity, LookAlike, ProcessRef
from vramguard.core.sample import GpuSample
from vramguard.core.snapshot import ContainerUsage, Snapshot, UnattributedProcess, UnattributedReason

# The reasons an UnattributedProcess carries (`snapshot.UnattributedReason`).
NOT_IN_POD = UnattributedReason.NOT_IN_POD
OUTSIDE_KUBELET = UnattributedReason.OUTSIDE_KUBELET
POD_NOT_IN_CACHE = UnattributedReason.POD_NOT_IN_CACHE
ORPHANED = UnattributedReason.ORPHANED
PROCESS_GONE = UnattributedReason.PROCESS_EXITED  # NVML lists the PID; /proc has no process of that number


def attribute(
    sample: GpuSample,
    identities: Mapping[int, Identity],
    pods: Mapping[str, PodInfo],
    agent_pod_uid: str | None = None,
    agent_pid: int | None = None,
    orphaned: frozenset[str] = frozenset(),
) -> Snapshot:
    """Sum each container's GPU memory per device; report every other GPU process as unattributed (in a pod
    cgroup whose pod UID is among `orphaned`: orphaned, `core/orphans.py`; in a look-alike of one outside the
    kubelet's: outside the kubelet, with no pod cgroup, as a host process).

    Pure: no I/O. Equal inputs give equal snapshots (rows in NVML's order, unattributed processes sorted).
    Processes of unhealthy devices are already absent from the sample, so nothing here can act on a GPU in that
    state.
    """
    groups: dict[tuple[str, str | None, str], tuple[int, list[ProcessRef]]] = {}
    unattributed: list[UnattributedProcess] = []
    for pid, device_uuid, used, _kind in sample.processes:
        # NVML_VALUE_NOT_AVAILABLE (None) hides the amount, not the fact that the process is on the GPU: it
        # counts as 0 bytes, since any guess could push an innocent container over quota, but its ref stays
        # in the container's processes so a kill of that container still reaches it.
        used_bytes = used if used is not None else 0
        found = identities.get(pid)
        if found is None:
            ref = ProcessRef(pid, UNKNOWN_START_TIME)
            unattributed.append(UnattributedProcess(ref, device_uuid, used_bytes, PROCESS_GONE))
            continue
        ref, cgroup = found
        if cgroup is None:
            unattributed.append(UnattributedProcess(ref, device_uuid, used_bytes, NOT_IN_POD))
            continue
        if isinstance(cgroup, LookAlike):  # the pod it names is nobody's word: a host process, never a pod's
            unattributed.append(UnattributedProcess(ref, device_uuid, used_bytes, OUTSIDE_KUBELET))
            continue
        if cgroup.pod_uid not in pods:
            reason = ORPHANED if cgroup.pod_uid in orphaned else POD_NOT_IN_CACHE
            unattributed.append(UnattributedProcess(ref, device_uuid, used_bytes, reason, cgroup))
            continue
        group_key = (cgroup.pod_uid, cgroup.container_id, device_uuid)
        group = groups.get(group_key)
        if group is None:
            groups[group_key] = (used_bytes, [ref])
        else:
            group[1].append(ref)
            groups[group_key] = (group[0] + used_bytes, group[1])

    containers: list[ContainerUsage] = []
    for (pod_uid, container_id, device_uuid), (total, refs) in groups.items():
        pod = pods[pod_uid]
        container = pod.container_by_id(container_id) if container_id is not None else None
        # Positional, in ContainerUsage's field order: keyword construction doubles the cost of this line, which
        # runs once per (container, device) per scan. "" covers a process in the pod cgroup itself and a container
        # the pod's status does not list yet (or the sandbox): usage that is the pod's, not a named container's.
        containers.append(
            ContainerUsage(
                pod,
                container.name if container is not None else "",
                container_id,
                device_uuid,
                total,
                (refs[0],) if len(refs) == 1 else tuple(sorted(refs)),
            )
        )
    # Rows NVML lists under a PID with no process (the sampler checked): held by an exited process.
    for pid, device_uuid, used, _kind in sample.exited:
        ref = ProcessRef(pid, UNKNOWN_START_TIME)
        unattributed.append(UnattributedProcess(ref, device_uuid, used or 0, PROCESS_GONE))
    # Rows keep NVML's order (device, then list order), which equal samples repeat: sorting 512 rows would
    # cost a tenth of the scan budget, and every reader that shows rows to people sorts them its own way.
    unattributed.sort(key=lambda u: (u.device_uuid, u.process.pid, u.reason))
    return Snapshot(
        devices=sample.devices,
        containers=tuple(containers),
        unattributed=tuple(unattributed),
        agent_pod_uid=agent_pod_uid,
        agent_pid=agent_pid,
    )


@dataclass(frozen=True, slots=True)
class Awaited:
    """What a scan saw on the GPUs but could not attribute for want of it in the pod cache: pods the cache does not
    hold (by UID), and containers of pods it holds whose status names them not yet (pod UID → runtime IDs), whose
    usage is then the pod's alone and no container quota judges it. A pod update that names one calls for a scan."""

    pods: frozenset[str] = frozenset()
    containers: Mapping[str, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}))

    def __bool__(self) -> bool:
        return bool(self.pods or self.containers)

    def named_by(self, pod: PodInfo) -> bool:
        """Whether this version of a pod names something awaited: the pod itself, or one of its containers."""
        if pod.uid in self.pods:
            return True
        ids = self.containers.get(pod.uid)
        return ids is not None and any(pod.container_by_id(c) is not None for c in ids)

    def named_in(self, pods: Mapping[str, PodInfo]) -> bool:
        """Whether a pod list names something awaited (looked up by UID: as many lookups as awaited pods)."""
        return any((pod := pods.get(uid)) is not None and self.named_by(pod) for uid in (*self.pods, *self.containers))


def awaited(snapshot: Snapshot) -> Awaited:
    """What `snapshot` could not attribute for want of the pod cache (`Awaited`). Processes outside any pod cgroup,
    gone, or orphaned are not awaited: no pod update names them."""
    pods: set[str] = set()
    for u in snapshot.unattributed:
        if u.reason == POD_NOT_IN_CACHE and u.cgroup is not None:
            pods.add(u.cgroup.pod_uid)
    containers: dict[str, set[str]] = {}
    for c in snapshot.containers:
        if not c.container and c.container_id is not None:  # a runtime ID the pod's status does not list yet
            containers.setdefault(c.pod.uid, set()).add(c.container_id)
    if not pods and not containers:
        return NOTHING_AWAITED
    frozen = MappingProxyType({uid: frozenset(ids) for uid, ids in containers.items()})
    return Awaited(frozenset(pods), frozen)


NOTHING_AWAITED = Awaited()
