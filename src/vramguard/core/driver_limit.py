"""Driver limits: the key of a limit (a cgroup on one GPU), the hard limit the driver should hold there, and what
programming it came to. The vocabulary of the limiter's port (`ports.DriverLimiter`), the planner (`limit_plan.py`)
and the limiter (`node/limiter.py`); plain frozen data, no I/O, no clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from vramguard.core.pod import PodInfo
from vramguard.core.text import format_bytes


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

    def describe(self) -> str:
        return f"hard limit {format_bytes(self.hard_bytes)} on GPU {self.gpu_index} ({self.gpu_uuid}) ({self.source})"


class LimitResult(str, enum.Enum):
    """What programming one limit came to (`LimitOutcome.result`): the `outcome` label of
    vramguard_driver_limits_total, each exported at 0 from the start."""

    APPLIED = "applied"  # set now
    LATE = "late"  # set now, but the container was already running: found without its limit
    UNCHANGED = "unchanged"  # the driver already held it: an agent restart
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
