"""What the decision core outputs: violations, the actions they call for, the kills it remembers and the pressure
notices, each carrying what its message needs. Plain frozen data; no I/O, no clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from vramguard.core.pod import PodInfo
from vramguard.core.policy import ActionKind, OnRepeat
from vramguard.core.process import ProcessRef
from vramguard.core.quota import Subject
from vramguard.core.sample import GpuDevice
from vramguard.core.text import format_bytes


class Reason(str, enum.Enum):
    """Why an action was decided."""

    HARD_LIMIT = "hard-limit"  # usage above the hard limit for longer than hard_grace
    SOFT_LIMIT = "soft-limit"  # usage above the soft limit (burst set) for longer than soft_grace
    GPU_PRESSURE = "gpu-pressure"  # usage above quota while the GPU is short of free memory
    OVER_QUOTA = "over-quota"  # the first warning of a violation episode


@dataclass(frozen=True, slots=True)
class KillTarget:
    """What a kill may signal: the GPU processes sampled, and every other device holder, of these containers of
    this pod (by the UID its cgroup names), each checked against PID reuse and membership first (`kill.py`)."""

    pod_uid: str
    container_ids: tuple[str, ...]  # runtime IDs
    processes: tuple[ProcessRef, ...]


@dataclass(frozen=True, slots=True)
class Violation:
    """A subject (`Subject`) above its limit on one device."""

    pod: PodInfo
    # As messages name the subject: the container, the containers holding a DRA share ("a, b"); None for a
    # pod-wide quota.
    container: str | None
    device: GpuDevice
    used_bytes: int
    limit_bytes: int
    hard_bytes: int
    quota_source: str
    processes: tuple[ProcessRef, ...]
    container_ids: tuple[str, ...]  # the runtime IDs of the containers involved
    key: Subject

    @property
    def target(self) -> KillTarget:
        """What killing it signals: its processes, in its containers."""
        return KillTarget(self.pod.uid, self.container_ids, self.processes)

    @property
    def hard(self) -> bool:
        return self.used_bytes > self.hard_bytes

    @property
    def overage_bytes(self) -> int:
        return self.used_bytes - self.limit_bytes

    @property
    def subject(self) -> str:
        return f"container {self.container}" if self.container is not None else f"pod {self.pod.name}"


@dataclass(frozen=True, slots=True)
class KillRecord:
    """A kill the agent remembers in one container instance (`DecisionState.kills`): when, and which processes it
    killed there, as the killer signalled them."""

    at: float  # the agent's clock (CLOCK_MONOTONIC seconds)
    killed: tuple[ProcessRef, ...]  # start times in clock ticks since boot, as /proc gives them
    restored: bool = False  # read from the state directory (recorded by an earlier agent), not by this process


@dataclass(frozen=True, slots=True)
class Escalation:
    """Why an action goes further than the mode's first step: its container instance was killed in within the
    repeat window, and a GPU process that started after that kill puts it over its quota again (a supervisor
    respawning GPU workers)."""

    step: OnRepeat  # KILL_CONTAINER or EVICT
    since_kill_s: float  # how long after the last kill it was found over its quota again
    restored: bool = False  # the kill it rests on was recorded by an earlier agent (`KillRecord.restored`)

    @property
    def kind(self) -> ActionKind:
        """The action its step calls for."""
        return ActionKind.EVICT if self.step is OnRepeat.EVICT else ActionKind.KILL

    @property
    def came_back(self) -> str:
        said = f"GPU processes came back within {self.since_kill_s:.1f} s of the last kill"
        return said + (" (a kill recorded by an earlier agent, restored from kills.json)" if self.restored else "")


@dataclass(frozen=True, slots=True)
class Action:
    """One thing to do to a pod. Carries its violation so every side effect can say exactly why."""

    kind: ActionKind
    reason: Reason
    violation: Violation
    escalation: Escalation | None = None  # set on a repeat: a kill takes every process of the container

    @property
    def pod(self) -> PodInfo:
        return self.violation.pod

    @property
    def repeat_step(self) -> OnRepeat | None:
        """The step a repeat is taken as, by what the action does (a terminating pod is killed whole where it would
        be evicted): the `step` label of vramguard_escalations_total. None for a first offence."""
        if self.escalation is None:
            return None
        return OnRepeat.KILL_CONTAINER if self.kind is ActionKind.KILL else OnRepeat.EVICT

    @property
    def message(self) -> str:
        v = self.violation
        return (
            f"{v.subject} uses {format_bytes(v.used_bytes)} on GPU {v.device.label} ({v.device.uuid}); "
            f"quota {format_bytes(v.limit_bytes)}"
            + (f", burst {format_bytes(v.hard_bytes)}" if v.hard_bytes != v.limit_bytes else "")
            + f" ({v.quota_source}); {self.reason.value}"
        )


@dataclass(frozen=True, slots=True)
class PressureNotice:
    """A pod told that a GPU it uses entered memory pressure, and who holds the memory there: the subjects over
    their quota, furthest over first, or, when none is, where the memory is (a CUDA out-of-memory in a pod within
    its quota is someone else's doing, and `kubectl describe pod` is where its owner looks)."""

    NAMED: ClassVar[int] = 5  # offenders named in one message; the rest are counted

    pod: PodInfo  # who is told
    device: GpuDevice
    offenders: tuple[Violation, ...]  # every subject over its quota on the device, furthest over first
    # Where the memory is, said when no one is over: pods within their quotas, pods without a quota there,
    # processes outside any known pod.
    within_quota_bytes: int = 0
    unmanaged_bytes: int = 0
    outside_pods_bytes: int = 0

    @property
    def message(self) -> str:
        d = self.device
        percent = d.used_bytes * 100 // d.total_bytes if d.total_bytes > 0 else 100
        head = f"GPU {d.label} is {percent} % full ({format_bytes(d.used_bytes)} of {format_bytes(d.total_bytes)})"
        if self.offenders:
            named = [
                f"{v.pod.key}{'' if v.container is None else f' container {v.container}'} holds "
                f"{format_bytes(v.used_bytes)}, {format_bytes(v.overage_bytes)} over its "
                f"{format_bytes(v.limit_bytes)} quota"
                for v in self.offenders[: self.NAMED]
            ]
            more = len(self.offenders) - self.NAMED
            if more > 0:
                named.append(f"and {more} more over their quota")
            return f"{head}; " + "; ".join(named)
        listed = self.within_quota_bytes + self.unmanaged_bytes + self.outside_pods_bytes
        parts = [
            f"{format_bytes(n)} {what}"
            for n, what in (
                (self.within_quota_bytes, "by pods within their quotas"),
                (self.unmanaged_bytes, "by pods without a quota there"),
                (self.outside_pods_bytes, "by processes outside any pod"),
                (max(0, d.used_bytes - listed), "not listed against any process"),
            )
            if n > 0
        ]
        return f"{head}; no pod is over its quota there" + (f": {', '.join(parts)}" if parts else "")
