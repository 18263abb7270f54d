"""Driver limits: the key of a limit (a cgroup on one GPU), the hard limit the driver should hold there, who set the
one it holds, and what programming it came to. The vocabulary of the limiter's port (`ports.DriverLimiter`), the
planner (`limit_plan.py`) and the limiter (`node/limiter.py`); plain frozen data, no I/O, no clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from vramguard.core.pod import PodInfo
from vramguard.core.quantity import MiB
from vramguard.core.text import format_bytes


class LimitSetter(str, enum.Enum):
    """Who set the limit the driver holds on a cgroup. The agent never sets a soft limit (`docs/architecture.md`
    "Driver memory limits"), so a limit with one is another's: on R615+ drivers, NVIDIA's container toolkit hook
    (`apply-cuda-memory-limits`), which programs a container's `NVIDIA_GPU_MEMORY_REQUEST` as the soft limit and its
    `NVIDIA_GPU_MEMORY_LIMIT` as the hard one (KAI Scheduler's NRI plugin writes those from its annotations). The
    agent leaves such a limit alone: it never writes over it nor clears it."""

    AGENT = "agent"
    TOOLKIT = "toolkit"

    @classmethod
    def of(cls, soft_bytes: int) -> LimitSetter:
        """Who set a limit the driver holds with this soft limit."""
        return cls.TOOLKIT if soft_bytes != 0 else cls.AGENT


def holds_quota(held_hard_bytes: int, quota_hard_bytes: int) -> bool:
    """Whether a hard limit the driver holds keeps a cgroup within the quota's hard limit: at most that, rounded up
    to a whole MiB (the toolkit's hook takes whole MiB, which KAI's NRI plugin rounds a quantity up to)."""
    return held_hard_bytes <= -(-quota_hard_bytes // MiB) * MiB


class HeldLimit(NamedTuple):
    """A hard limit the driver holds, as read back from it (`limiter.read_held_limits`), and who set it."""

    hard_bytes: int
    set_by: LimitSetter


@dataclass(frozen=True, slots=True)
class LimitTarget:
    """One hard limit the driver should hold: on the cgroup of `pod`'s container `container_id` (the pod's
    own cgroup when `container` is None), on whole GPU `gpu_index`. A container's target without an ID is
    `pending`: the container has not started, and its cgroup is known only once the runtime creates it."""

    pod: PodInfo
    container: str | None
    container_id: str | None
    gpu_index: int
    gpu_uuid: str
    hard_bytes: int
    source: str  # the quota's source, for messages
    # Who set the limit the driver holds there: the agent's own target, or, as the limiter found it, the toolkit's
    # hook (with the hard limit the hook set: `LimitSetter`).
    set_by: LimitSetter = LimitSetter.AGENT
    gpu_label: str = ""  # how the GPU is shown (`GpuDevice.label`: "0", or a DRM GPU's PCI slot); its index if ""
    holder: str = "driver"  # who holds the limit (`GpuBackend.holder`): NVIDIA's driver, or the kernel's dmem
    # Built once: a target lives across scans, and its key is looked up several times per scan.
    key: LimitKey = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", LimitKey(self.pod.uid, self.container, self.gpu_uuid))

    @property
    def pending(self) -> bool:
        return self.container is not None and self.container_id is None

    @property
    def subject(self) -> str:
        return f"container {self.container}" if self.container is not None else f"pod {self.pod.name}"

    @property
    def gpu(self) -> str:
        """The GPU as messages name it."""
        return self.gpu_label or str(self.gpu_index)

    @property
    def log_gpu(self) -> int | str:
        """The GPU as log lines name it: an NVIDIA GPU's index (a number, as it always was), a DRM GPU's PCI slot."""
        return self.gpu_index if self.holder == "driver" else self.gpu

    def describe(self) -> str:
        return f"hard limit {format_bytes(self.hard_bytes)} on GPU {self.gpu} ({self.gpu_uuid}) ({self.source})"


class LimitResult(str, enum.Enum):
    """What programming one limit came to (`LimitOutcome.result`): the `outcome` label of
    vramguard_driver_limits_total, each exported at 0 from the start."""

    APPLIED = "applied"  # set now
    LATE = "late"  # set now, but the container was already running: found without its limit
    UNCHANGED = "unchanged"  # the driver already held it: an agent restart
    TOOLKIT = "toolkit"  # NVIDIA's container toolkit hook set a limit there (`LimitSetter`): left alone, not written
    CLEARED = "cleared"  # no longer wanted
    UNSUPPORTED = "unsupported"  # this driver or GPU cannot: the reactive modes hold the quota
    FAILED = "failed"  # an error; retried with back-off, reported once per run of failures

    @property
    def warns(self) -> bool:
        """Whether it is said as a warning (log line, Event): the quota is not held as it should be."""
        return self in (LimitResult.LATE, LimitResult.FAILED)


@dataclass(frozen=True, slots=True)
class LimitOutcome:
    """What programming one limit came to."""

    target: LimitTarget
    result: LimitResult
    detail: str = ""


class LimitKey(NamedTuple):
    """A cgroup on one GPU: a container's, or the pod's own. The key of a driver limit and of the usage the driver
    counts for it."""

    pod_uid: str
    container: str | None  # the container's name; None for the pod as a whole (a pod-wide quota, its own cgroup)
    gpu_uuid: str
