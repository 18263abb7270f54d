"""What /proc tells the agent about a GPU process: its reuse-proof reference and the kubelet cgroup it lives in.

Plain frozen data, built by the identify stage (`node/identify.py`) at the edge; no I/O, no clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True, slots=True, order=True)
class ProcessRef:
    """A process identity that survives PID reuse: the PID plus its start time (clock ticks since boot)."""

    pid: int
    start_time: int


# The start time of a process whose stat could not be read (gone before it was, or unreadable): no real process
# has one.
UNKNOWN_START_TIME = -1


@dataclass(frozen=True, slots=True)
class CgroupIdentity:
    """Where a process lives in the kubelet's cgroup tree."""

    pod_uid: str  # with dashes, as in metadata.uid
    container_id: str | None  # 64-hex runtime ID; None for a process in the pod cgroup itself
    runtime: str | None = None  # "containerd", "crio", "docker", or None when the leaf has no prefix
    qos: str | None = None  # "guaranteed", "burstable", "besteffort"


class KubeletPod(NamedTuple):
    """The namespace and name this node's kubelet runs a pod UID as, from the node itself (`ports.KubeletPods`)."""

    namespace: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class LookAlike(enum.Enum):
    """A cgroup shaped like a kubelet pod's outside this node's kubelet's pod cgroups (a rootless kubelet's, a nested
    node's, anyone's ``mkdir``): the pod and container it names are nobody's word, so it is no pod's. The identify
    stage's answer for such a process; attribution reports it as a host process
    (`UnattributedReason.OUTSIDE_KUBELET`)."""

    CGROUP = "look-alike"


LOOK_ALIKE = LookAlike.CGROUP


Identity = tuple[ProcessRef, CgroupIdentity | LookAlike | None]
"""A process's reuse-proof reference and where it lives (the identify stage's answer): a pod cgroup of this node's
kubelet, a look-alike outside it, or None outside any pod."""
