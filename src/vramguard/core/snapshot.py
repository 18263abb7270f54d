"""The attributed snapshot: one scan's GPU memory per (pod, container, GPU), and what is tied to no pod.

The attribute stage (`attribute.py`) builds it; the decision core (`decide.py`) reads it. Plain frozen data; no I/O,
no clock.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from vramguard.core.pod import PodInfo
from vramguard.core.process import CgroupIdentity, ProcessRef
from vramguard.core.sample import GpuDevice


class ContainerUsage(NamedTuple):
    """GPU memory one container of a known pod uses on one device, with the processes that use it.

    A NamedTuple for speed, as `GpuProcess` explains.
    """

    pod: PodInfo
    container: str  # container name; "" when the cgroup names a container the pod cache does not list
    container_id: str | None
    device_uuid: str
    used_bytes: int
    processes: tuple[ProcessRef, ...]


class UnattributedReason(str, enum.Enum):
    """Why GPU memory is tied to no pod: the `reason` label of vramguard_unattributed_gpu_memory_bytes and of the
    unattributed rows of /status. Attribution owns it; metrics iterate it, so a reason added here is exported at 0 with
    no second list."""

    NOT_IN_POD = "not-in-pod"  # a host process, or the agent cannot see the host's PID namespace
    OUTSIDE_KUBELET = "outside-kubelet"  # a pod-shaped cgroup outside this node's kubelet's (`LookAlike`)
    POD_NOT_IN_CACHE = "pod-not-in-cache"  # a pod cgroup whose pod the cache does not hold (yet)
    ORPHANED = "orphaned"  # a pod cgroup whose pod is gone: absent from the cache and the API server (`orphans.py`)
    PROCESS_EXITED = "process-exited"  # NVML lists a PID /proc does not have: torn down, or stuck in the driver

    @property
    def why(self) -> str:
        """The words `vramguard top` and /status show after "unattributed: "."""
        return _UNATTRIBUTED_WHY[self]


_UNATTRIBUTED_WHY = {
    UnattributedReason.NOT_IN_POD: "not in a pod cgroup",
    UnattributedReason.OUTSIDE_KUBELET: "a pod-shaped cgroup outside this node's kubelet",
    UnattributedReason.POD_NOT_IN_CACHE: "pod not in cache",
    UnattributedReason.ORPHANED: "orphaned: its pod is gone",
    UnattributedReason.PROCESS_EXITED: "held by an exited process",
}


@dataclass(frozen=True, slots=True)
class UnattributedProcess:
    """A GPU process outside any known pod: reported, never acted on."""

    process: ProcessRef
    device_uuid: str
    used_bytes: int
    reason: UnattributedReason
    cgroup: CgroupIdentity | None = None  # the pod cgroup it is in (pod-not-in-cache, orphaned); None for the others


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One scan's view of the node, attributed: the input of `decide`."""

    devices: tuple[GpuDevice, ...]
    containers: tuple[ContainerUsage, ...]
    unattributed: tuple[UnattributedProcess, ...] = ()
    agent_pod_uid: str | None = None  # never act on the agent's own pod
    agent_pid: int | None = None
    # Derived index: the decision core looks a device up once per container row.
    _by_uuid: Mapping[str, GpuDevice] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_uuid", {d.uuid: d for d in self.devices})

    def device(self, uuid: str) -> GpuDevice | None:
        return self._by_uuid.get(uuid)
