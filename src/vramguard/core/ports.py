"""The seams: one narrow Protocol per side effect, injected into the agent through its constructor.

Real implementations live next to the thing they wrap (`nvml`, `identify.py`, `kill.py`, `limiter.py`, the `kube`
package, `kube/pods_file.py`); honest fakes in the test bench, `vramguard_testbed.fakes`. The decision core sees none
of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from vramguard.core.actions import KillRecord, KillTarget
from vramguard.core.driver_limit import LimitKey, LimitOutcome, LimitTarget
from vramguard.core.pod import EventSubject, PodInfo
from vramguard.core.process import Identity, KubeletPod, ProcessRef
from vramguard.core.sample import GpuMemory, GpuSample
from vramguard.core.shares import PodShares


class GpuSampler(Protocol):
    """Reads GPUs, MIG instances and per-process memory. Never raises for one bad GPU: marks it unhealthy."""

    def sample(self) -> GpuSample: ...

    def memory(self) -> tuple[GpuMemory, ...]:
        """Each healthy whole GPU's memory counters, cheaply (no process lists): what the watch between scans
        reads. A GPU that fails or hangs is left out (the next scan reports it)."""
        ...


class ProcessIdentifier(Protocol):
    """Finds a process' identity (PID + start time) and its pod cgroup; caches by that identity."""

    def identify(self, pid: int) -> Identity | None:
        """None when the process is gone."""
        ...

    def scan(self, pids: Iterable[int]) -> Mapping[int, Identity]:
        """Identify every PID of one scan (the gone ones are absent) and forget cached PIDs not among them."""
        ...


class PodSource(Protocol):
    """The pods bound to this node, from a cache: no API call per scan.

    What it hands out it replaces, never mutates, and so does a `ClaimSource`: a new mapping once something in it
    changes, the same object for a pod (or a pod's shares) while nothing the agent reads of it changes. The
    memos downstream key on those objects (`quota.QuotaBook`, `limit_plan.WantedLimits`)."""

    def pods(self) -> Mapping[str, PodInfo]:
        """Pods by UID."""
        ...

    def synced(self) -> bool:
        """True once the cache holds a complete list."""
        ...

    def problem(self) -> str | None:
        """Why the pod list cannot be trusted to be current right now (for /readyz and the log), or None.

        E.g. "pod cache not synced", "API server unreachable: ...", "pods file: ...". The agent keeps enforcing
        with the pods it has either way; this only says that they may be stale."""
        ...

    def node_labels(self) -> Mapping[str, str]: ...


class KubeletPods(Protocol):
    """The pods this node's kubelet has set up, as the node itself records them (`node/kubelet_pods.py`): what a
    tenant cannot forge. Never blocks: it answers from what it last read."""

    def runs(self, uid: str) -> KubeletPod | None:
        """The namespace and name the kubelet runs `uid` as; None when it runs no pod of that UID (or cannot say)."""
        ...

    def pods(self) -> Mapping[str, KubeletPod]:
        """Every pod the kubelet runs, by UID, as last read."""
        ...

    def refresh(self) -> bool:
        """Read the node's word again now (one small directory listing: for a pod source's thread, never the
        scan's); True when it changed."""
        ...


class ApiUidRecord(Protocol):
    """The UIDs the API server gave this node's pods, as this node's agents saw them (`node/api_uids.py`)."""

    def add(self, uids: Iterable[str]) -> None: ...

    def __contains__(self, uid: object) -> bool: ...


class PodLister(Protocol):
    """A fresh read of the pods bound to this node, from where the pod cache comes from (the API server: a
    consistent LIST, not the watch cache's) — what confirms an orphan (`core/orphans.py`). May block: only the
    orphan reads' worker (`agent/orphan_reads.py`) calls it."""

    def present(self) -> frozenset[str]:
        """The UIDs the kubelet runs this node's pods under (a mirror pod's `kubernetes.io/config.mirror` as well
        as its own). Raises when the read fails: an orphan is never confirmed by a read that did not happen."""
        ...


class ClaimSource(Protocol):
    """The DRA memory shares the containers of this node's pods hold (`core/shares.py`), from a cache: no API call
    per scan."""

    def shares(self) -> Mapping[str, PodShares]:
        """By pod UID; only pods whose containers hold a share or an unreadable claim are present."""
        ...

    def problem(self) -> str | None:
        """Why claims cannot be read right now (e.g. the API server does not serve resource.k8s.io/v1), or None."""
        ...


@dataclass(frozen=True, slots=True)
class KillResult:
    """What a kill did: every process signalled, and every one skipped with the reason."""

    killed: tuple[ProcessRef, ...]
    skipped: tuple[tuple[ProcessRef, str], ...]
    exited: bool  # every killed process was seen to exit before the deadline
    # Processes of the violating containers that still held the GPU when the killer gave up (a fork it could not
    # catch, one it was not allowed to signal): the job is not finished while any is left.
    remaining: tuple[ProcessRef, ...] = ()

    @property
    def ok(self) -> bool:
        return bool(self.killed) and self.exited and not self.remaining


class Killer(Protocol):
    """SIGKILLs the GPU processes of the containers a target names (a violation's, an orphan's), safely (no
    PID-reuse race)."""

    def kill(self, target: KillTarget, every_process: bool = False) -> KillResult:
        """`every_process`: every process of the containers, not only those holding the GPU (a repeat)."""
        ...


@dataclass(frozen=True, slots=True)
class EvictResult:
    """What an eviction came to. Neither evicted nor refused nor gone: it failed (no answer, an error)."""

    evicted: bool
    refused: bool  # the API server said 429 (a PodDisruptionBudget) until the retries ran out
    message: str = ""
    gone: bool = False  # the pod no longer exists (404), or another pod has its name (409): nothing to do


class Evictor(Protocol):
    """Evicts a pod through the policy/v1 Eviction API (respects PodDisruptionBudgets).

    May block on the network (with request timeouts): the enforcer calls it from a background worker."""

    def evict(self, pod: PodInfo, message: str) -> EvictResult: ...


class KillMemory(Protocol):
    """Where the container instances the agent killed in (`DecisionState.kills`) outlive the agent's process."""

    def load(self, now: float) -> Mapping[str, KillRecord]:
        """The kills remembered that the node does not contradict, on the agent's clock at `now`, each marked
        `restored`; {} when none. Says what it restored and what it refused. Never raises: read once at start."""
        ...

    def save(self, kills: Mapping[str, KillRecord]) -> None:
        """Remember `kills` instead; called after a kill, on the scan. Never raises."""
        ...


class EventRecorder(Protocol):
    """Records a Kubernetes Event on a pod, or on the Node (`NodeRef`). Implementations deduplicate and rate-limit.

    Must not block and must not raise: the scan calls it (the Kubernetes one queues for a writer thread)."""

    def record(
        self, pod: EventSubject, reason: str, message: str, warning: bool = True, important: bool = False
    ) -> None:
        """`important`: an enforcement Event (a kill, an eviction, a refused or failed one), written ahead of every
        other and never dropped to make room for them."""
        ...


class CapacityPublisher(Protocol):
    """Advertises the node's schedulable GPU memory as an extended resource (idempotent: publishes changes).

    Best effort and non-blocking: the PATCH runs in the background; a failure is logged and retried later,
    never raised into the loop."""

    def publish(self, sample: GpuSample) -> None: ...

    def withdraw(self) -> None:
        """Remove the advertised resource (the agent runs without --advertise-capacity)."""
        ...


@dataclass(frozen=True, slots=True)
class DriverLimit:
    """The memory limits the driver holds for one cgroup on one GPU (nvmlGetMemoryLimits_v1_t)."""

    soft_bytes: int
    hard_bytes: int
    used_bytes: int  # what the cgroup's processes hold on that GPU, every context counted


class LimitsUnavailable(Exception):
    """The driver cannot hold limits: not at all (`whole_driver`: a driver before R615, no symbol), or not on
    this GPU (NVML_ERROR_NOT_SUPPORTED)."""

    def __init__(self, message: str, *, whole_driver: bool) -> None:
        super().__init__(message)
        self.whole_driver = whole_driver


class LimitFailed(Exception):
    """A limits call failed for this cgroup (the path cannot be opened, no permission, an NVML error)."""


class MemoryLimiter(Protocol):
    """The driver's per-cgroup GPU memory limits (NVIDIA R615+). `cgroup` is the full path of a cgroup v2
    directory as this process sees it. May block (an NVML call): only `limiter.DriverLimiter`'s worker calls it.
    Raises `LimitsUnavailable` or `LimitFailed`."""

    def get(self, gpu_index: int, cgroup: str) -> DriverLimit | None:
        """The limits held for `cgroup` on the GPU, or None when none are set."""
        ...

    def set(self, gpu_index: int, cgroup: str, soft_bytes: int, hard_bytes: int) -> None:
        """Set the limits; soft 0 and hard `LIMIT_MAX` clear them."""
        ...


LIMIT_MAX = 0xFFFFFFFFFFFFFFFF  # NVML_DEVICE_MEMORY_LIMIT_MAX: "no hard limit"


@dataclass(frozen=True, slots=True)
class LimitsSupport:
    """Whether the driver can hold per-cgroup limits here, as it answered for the cgroup v2 root on each of `gpus`
    (`limiter.probe_limits`), or as the limiter has found out since (`LimitProgrammer.support`)."""

    gpus: tuple[int, ...]  # the whole GPUs asked about
    unavailable: str | None = None  # why the node cannot hold limits at all (no cgroup v2, no bindings, old driver)
    unsupported: Mapping[int, str] = field(default_factory=dict)  # GPUs that answered NOT_SUPPORTED, with why
    unanswered: Mapping[int, str] = field(default_factory=dict)  # GPUs whose answer was an error, not a no

    @property
    def possible(self) -> bool | None:
        """True where at least one GPU can hold limits; None where no GPU said no and some could not answer."""
        if self.unavailable is not None or not self.gpus:
            return False
        if any(g not in self.unsupported and g not in self.unanswered for g in self.gpus):
            return True
        return None if self.unanswered else False

    @property
    def reason(self) -> str:
        """Why not, or on which GPUs not; "" where every GPU can."""
        if self.unavailable is not None:
            return self.unavailable
        if not self.gpus:
            return "no whole, healthy GPU to hold a limit (MIG instances cannot)"
        said = [*(self.unsupported[g] for g in sorted(self.unsupported)), *self.unanswered.values()]
        return "; ".join(dict.fromkeys(said))  # each answer once: one error for every GPU reads as one


class LimitProgrammer(Protocol):
    """Programs the driver limits the scan wants (`driver_limit.LimitTarget`s) on a worker of its own, and reports
    what came of them: `limiter.DriverLimiter`. A `lifecycle.Service`. Nothing here blocks on NVML or the file
    system: the scan calls it."""

    def update(self, targets: tuple[LimitTarget, ...], gpus: Iterable[int], now: float) -> None:
        """The limits wanted now (computed at `now`, on the scan's clock) and the whole GPUs: handed over, never
        waited for."""
        ...

    def collect(self) -> list[LimitOutcome]:
        """The outcomes since the last call (for Events, metrics, the log)."""
        ...

    def held(self) -> Mapping[LimitKey, LimitTarget]:
        """The limits the driver holds, as far as the programmer knows."""
        ...

    def fresh_usage(self) -> Mapping[LimitKey, int]:
        """Each limited container's memory per GPU as the driver counts it, read since the previous `update`; empty
        when none was, so a scan never takes an old figure."""
        ...

    def failing(self) -> int:
        """How many (cgroup, GPU) limits are failing now."""
        ...

    @property
    def unavailable(self) -> str | None:
        """Why this node cannot hold driver limits at all, or None (as far as found out)."""
        ...

    def unsupported_gpus(self) -> Mapping[int, str]:
        """The GPUs that cannot hold limits, with why."""
        ...

    def support(self) -> LimitsSupport | None:
        """Whether the driver can hold limits here, None before it was asked."""
        ...

    def start(self) -> None: ...

    def stop(self, deadline: float) -> None: ...
