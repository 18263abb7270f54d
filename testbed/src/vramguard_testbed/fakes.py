"""Hand-written fakes for every seam in `vramguard.core.ports`, and small builders for test data.

Fakes record what they were asked to do and can be told to fail (`inject_error`); they never pretend to do
more than they do. Use them for unit tests of the loop and the decision core; the end-to-end tests use the real
implementations over the test NVML library and real cgroups instead. Only vramguard's own tests and bench use
them (nothing outside the agent implements its Protocols), so they live here, out of the agent's wheel.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from vramguard.core.actions import KillTarget
from vramguard.core.pod import ContainerInfo, EventSubject, PodInfo
from vramguard.core.ports import LIMIT_MAX, DriverLimit, EvictResult, KillResult, LimitFailed, LimitsUnavailable
from vramguard.core.process import CgroupIdentity, KubeletPod, ProcessRef
from vramguard.core.quantity import GiB
from vramguard.core.sample import GpuDevice, GpuMemory, GpuSample
from vramguard.core.snapshot import ContainerUsage, Snapshot


class FakeClock:
    """A monotonic clock that moves only when told: a scenario reads as a sequence of `step()` calls. `wait`
    returns at once, the time passed; `waits` records each wait's length and `on_wait` runs before it passes (a
    test can set a loop's stop event there)."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self.waits: list[float] = []
        self.on_wait: Callable[[], None] = lambda: None

    def now(self) -> float:
        return self._now

    def step(self, seconds: float) -> float:
        self._now += seconds
        return self._now

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        self.waits.append(seconds)
        self.on_wait()
        if not stop.is_set():
            self._now += max(0.0, seconds)
        return stop.is_set()


class SteppedClock(FakeClock):
    """A FakeClock for parts that run their own threads: `wait` blocks until `step` passes the time it waits for,
    or its `stop` is set. `waiting` counts the threads blocked in it."""

    def __init__(self, start: float = 0.0) -> None:
        super().__init__(start)
        self._moved = threading.Condition()
        self.waiting = 0

    def step(self, seconds: float) -> float:
        with self._moved:
            now = super().step(seconds)
            self._moved.notify_all()
        return now

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        until = self.now() + seconds
        with self._moved:
            self.waits.append(seconds)
            self.waiting += 1
            try:
                while not stop.is_set() and self.now() < until:
                    self._moved.wait(0.01)  # `stop` cannot notify this condition: look at it every 10 ms
            finally:
                self.waiting -= 1
        return stop.is_set()


class FakeSampler:
    """A GPU sampler that reports what the test set: `sample` is returned as is, or `error` is raised."""

    def __init__(self, sample: GpuSample | None = None) -> None:
        self.next = sample if sample is not None else GpuSample(devices=(), processes=())
        self.error: Exception | None = None
        self.calls = 0
        self.memory_calls = 0

    def inject_error(self, error: Exception | None) -> None:
        self.error = error

    def sample(self) -> GpuSample:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.next

    def memory(self) -> tuple[GpuMemory, ...]:
        """The whole, healthy GPUs of `next`, as the watch reads them (`memory_calls` counts the readings)."""
        self.memory_calls += 1
        return tuple(
            GpuMemory(d.index, d.total_bytes, d.used_bytes, d.free_bytes)
            for d in self.next.devices
            if d.mig_index is None and d.healthy
        )


class FakeIdentifier:
    """Process identities as the test declares them: `add(pid, pod_uid, container_id)`; unknown PIDs are gone."""

    def __init__(self) -> None:
        self.known: dict[int, tuple[ProcessRef, CgroupIdentity | None]] = {}
        # What identify() (a fresh look through /proc) says instead of `known`: a PID recycled since the scan.
        self.now_known: dict[int, tuple[ProcessRef, CgroupIdentity | None] | None] = {}

    def add(self, pid: int, pod_uid: str | None, container_id: str | None = None) -> ProcessRef:
        ref = ProcessRef(pid=pid, start_time=pid * 10)
        self.known[pid] = (ref, CgroupIdentity(pod_uid, container_id) if pod_uid is not None else None)
        return ref

    def identify(self, pid: int) -> tuple[ProcessRef, CgroupIdentity | None] | None:
        return self.now_known[pid] if pid in self.now_known else self.known.get(pid)

    def scan(self, pids: Iterable[int]) -> dict[int, tuple[ProcessRef, CgroupIdentity | None]]:
        return {pid: self.known[pid] for pid in pids if pid in self.known}


class FakeKubeletPods:
    """What the node says its kubelet runs (`ports.KubeletPods`): UID → (namespace, name), as the test sets it."""

    def __init__(self, pods: Mapping[str, tuple[str, str]] | None = None) -> None:
        self.running: dict[str, tuple[str, str]] = dict(pods or {})
        self.refreshes = 0  # how often a pod source asked to read the node again

    def runs(self, uid: str) -> KubeletPod | None:
        found = self.running.get(uid)
        return KubeletPod(*found) if found is not None else None

    def pods(self) -> Mapping[str, KubeletPod]:
        return {uid: KubeletPod(*found) for uid, found in self.running.items()}

    def refresh(self) -> bool:
        """Nothing to read again: what the test set is what the node says."""
        self.refreshes += 1
        return False


class FakePodSource:
    """A pod cache that holds what the test puts in it."""

    def __init__(self, pods: Iterable[PodInfo] = (), labels: Mapping[str, str] | None = None) -> None:
        self._pods: Mapping[str, PodInfo] = MappingProxyType({p.uid: p for p in pods})
        self._labels = dict(labels or {})
        # The UIDs the API server gave the pods this cache held (`ports.ApiUidRecord`, as `KubePodSource` keeps it):
        # each pod's own metadata.uid, a mirror pod's included.
        self.given: set[str] = {p.object_uid for p in self._pods.values()}
        self.is_synced = True
        self.problem_text: str | None = None  # what problem() says; set it to simulate a stale source
        # What a fresh read of the API server finds (`PodLister.present`): None, the cache's pods (a cache in
        # step); a set, those UIDs (a cache behind the API server). `read_error` makes the read fail.
        self.api_uids: frozenset[str] | None = None
        self.read_error: Exception | None = None
        self.reads = 0

    def set_pods(self, pods: Iterable[PodInfo]) -> None:
        self._pods = MappingProxyType({p.uid: p for p in pods})
        self.given.update(p.object_uid for p in self._pods.values())

    def pods(self) -> Mapping[str, PodInfo]:
        """The same mapping until `set_pods` replaces it, as `ports.PodSource` promises."""
        return self._pods

    def synced(self) -> bool:
        return self.is_synced

    def problem(self) -> str | None:
        return self.problem_text if self.is_synced else (self.problem_text or "pod cache not synced")

    def node_labels(self) -> Mapping[str, str]:
        return dict(self._labels)

    def present(self) -> frozenset[str]:
        self.reads += 1
        if self.read_error is not None:
            raise self.read_error
        if self.api_uids is not None:
            return self.api_uids
        return frozenset(self._pods) | frozenset(p.object_uid for p in self._pods.values())


class HeldRunner:
    """A `Runner` that runs nothing until told to (`run_all`): an API server that has not answered yet. With
    `max_queue`, a full queue refuses a task, as the real worker's does."""

    def __init__(self, max_queue: int | None = None) -> None:
        self.tasks: list[Callable[[], None]] = []
        self.max_queue = max_queue

    def start(self) -> None:
        pass

    def submit(self, task: Callable[[], None]) -> bool:
        if self.max_queue is not None and len(self.tasks) >= self.max_queue:
            return False
        self.tasks.append(task)
        return True

    def pending(self) -> int:
        return len(self.tasks)

    def stop(self, deadline: float) -> None:
        pass

    def run_all(self) -> None:
        tasks, self.tasks = self.tasks, []
        for task in tasks:
            task()


class RecordingEventRecorder:
    """Records Events instead of writing them: `events` is a list of (pod key, reason, message, warning), and
    `important` the reasons recorded as enforcement Events."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, bool]] = []
        self.important: list[str] = []
        self._error: Exception | None = None

    def inject_error(self, error: Exception | None) -> None:
        self._error = error

    def record(
        self, pod: EventSubject, reason: str, message: str, warning: bool = True, important: bool = False
    ) -> None:
        if self._error is not None:
            raise self._error
        self.events.append((pod.key, reason, message, warning))
        if important:
            self.important.append(reason)

    def reasons(self) -> list[str]:
        return [reason for _, reason, _, _ in self.events]


class FakeEvictor:
    """Evicts nothing; answers as scripted: evicted, or refused (a PodDisruptionBudget said 429)."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.evicted: list[str] = []
        self.refused: list[str] = []

    def evict(self, pod: PodInfo, message: str) -> EvictResult:
        if self.refuse:
            self.refused.append(pod.key)
            return EvictResult(
                evicted=False,
                refused=True,
                message="Cannot evict pod as it would violate the pod's disruption budget.",
            )
        self.evicted.append(pod.key)
        return EvictResult(evicted=True, refused=False)


class GatedEvictor:
    """An API server that takes a request and answers it only once `gate` is set (an outage): answers `result`.
    `entered` is set once a request was sent; `calls` lists the pods each request named."""

    def __init__(self, result: EvictResult | None = None) -> None:
        self.result = result if result is not None else EvictResult(evicted=True, refused=False)
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.calls: list[str] = []

    def evict(self, pod: PodInfo, message: str) -> EvictResult:
        self.calls.append(pod.key)
        self.entered.set()
        self.gate.wait(30)
        return self.result


class RecordingKiller:
    """Kills nothing; records each target it was asked to kill and reports its processes as killed.

    With a `FakeSampler`, the "killed" processes leave the sampler's next sample, as their memory would leave
    NVML's process list; without one, they stay (a kill whose memory was not freed).
    """

    def __init__(self, sampler: FakeSampler | None = None) -> None:
        self.killed: list[KillTarget] = []
        self.whole: list[bool] = []  # for each kill: every process of the containers (a repeat), or the GPU ones
        self.sampler = sampler

    def kill(self, target: KillTarget, every_process: bool = False) -> KillResult:
        self.killed.append(target)
        self.whole.append(every_process)
        if self.sampler is not None:
            gone = {p.pid for p in target.processes}
            s = self.sampler.next
            self.sampler.next = GpuSample(s.devices, tuple(p for p in s.processes if p.pid not in gone))
        return KillResult(killed=target.processes, skipped=(), exited=True)


# --------------------------------------------------------------------------------------------------------------
# Builders


_uids = itertools.count(1)


def pod(
    name: str,
    namespace: str = "default",
    *,
    containers: Mapping[str, Mapping[str, str]] | None = None,
    annotations: Mapping[str, str] | None = None,
    priority: int = 0,
    uid: str | None = None,
    terminating: bool = False,
    mirror_uid: str | None = None,
) -> PodInfo:
    """A PodInfo; `containers` maps container name → resources.limits. Container IDs are derived from names.
    With `mirror_uid`, a static pod: `uid` the kubelet's, `mirror_uid` its mirror pod's own."""
    uid = uid or f"00000000-0000-4000-8000-{next(_uids):012d}"
    specs = containers if containers is not None else {"main": {}}
    return PodInfo(
        uid=uid,
        namespace=namespace,
        name=name,
        containers=tuple(
            ContainerInfo(name=c, container_id=container_id(uid, c), limits=dict(limits)) for c, limits in specs.items()
        ),
        annotations=dict(annotations or {}),
        priority=priority,
        terminating=terminating,
        mirror_uid=mirror_uid,
    )


def container_id(pod_uid: str, container: str) -> str:
    """A stable fake 64-hex runtime ID for a pod's container."""
    return hashlib.sha256(f"{pod_uid}/{container}".encode()).hexdigest()


def gpu(index: int = 0, total_bytes: int = 16 * GiB, used_bytes: int = 0, *, healthy: bool = True) -> GpuDevice:
    return GpuDevice(
        index=index,
        uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000",
        name="Fake GPU",
        total_bytes=total_bytes,
        used_bytes=used_bytes,
        free_bytes=total_bytes - used_bytes,
        healthy=healthy,
        error=None if healthy else "injected",
    )


class FakeMemoryLimiter:
    """The driver's per-cgroup memory limits as a dict: `limits[(gpu, cgroup)] = (soft, hard)`; `calls` lists
    every ("get"|"set", gpu, cgroup, soft, hard). `older_driver` raises as a driver before R615 does,
    `unsupported_gpus` as a GPU that answers NOT_SUPPORTED, and `failing` cgroups as one that cannot be opened."""

    def __init__(self) -> None:
        self.limits: dict[tuple[int, str], tuple[int, int]] = {}
        self.used: dict[tuple[int, str], int] = {}
        self.calls: list[tuple[str, int, str, int, int]] = []
        self.older_driver = False
        self.unsupported_gpus: set[int] = set()
        self.failing: set[str] = set()

    def get(self, gpu_index: int, cgroup: str) -> DriverLimit | None:
        self.calls.append(("get", gpu_index, cgroup, 0, 0))
        self._check(gpu_index, cgroup)
        held = self.limits.get((gpu_index, cgroup))
        return None if held is None else DriverLimit(held[0], held[1], self.used.get((gpu_index, cgroup), 0))

    def set(self, gpu_index: int, cgroup: str, soft_bytes: int, hard_bytes: int) -> None:
        self.calls.append(("set", gpu_index, cgroup, soft_bytes, hard_bytes))
        self._check(gpu_index, cgroup)
        if soft_bytes == 0 and hard_bytes == LIMIT_MAX:
            self.limits.pop((gpu_index, cgroup), None)
        else:
            self.limits[(gpu_index, cgroup)] = (soft_bytes, hard_bytes)

    def sets(self) -> list[tuple[int, str, int, int]]:
        return [(gpu, cgroup, soft, hard) for verb, gpu, cgroup, soft, hard in self.calls if verb == "set"]

    def _check(self, gpu_index: int, cgroup: str) -> None:
        if self.older_driver:
            raise LimitsUnavailable("the driver has no nvmlDeviceGetMemoryLimits_v1", whole_driver=True)
        if gpu_index in self.unsupported_gpus:
            raise LimitsUnavailable(f"GPU {gpu_index} does not support memory limits", whole_driver=False)
        if cgroup in self.failing:
            raise LimitFailed(f"cannot open {cgroup}")


@dataclass
class SnapshotBuilder:
    """Builds a Snapshot row by row: `.use(pod, "main", gpu0, 6*GiB, pid=100)`; device used/free follow the rows."""

    devices: list[GpuDevice] = field(default_factory=list)
    rows: list[ContainerUsage] = field(default_factory=list)
    agent_pod_uid: str | None = None
    agent_pid: int | None = None

    def use(self, p: PodInfo, container: str, device: GpuDevice, used_bytes: int, pid: int = 100) -> SnapshotBuilder:
        info = next((c for c in p.containers if c.name == container), None)
        self.rows.append(
            ContainerUsage(
                pod=p,
                container=container,
                container_id=info.container_id if info else None,
                device_uuid=device.uuid,
                used_bytes=used_bytes,
                processes=(ProcessRef(pid=pid, start_time=pid * 10),),
            )
        )
        if device.uuid not in {d.uuid for d in self.devices}:
            self.devices.append(device)
        return self

    def build(self) -> Snapshot:
        devices = []
        for d in self.devices:
            used = max(d.used_bytes, sum(r.used_bytes for r in self.rows if r.device_uuid == d.uuid))
            devices.append(replace(d, used_bytes=used, free_bytes=max(0, d.total_bytes - used)))
        return Snapshot(
            devices=tuple(devices),
            containers=tuple(self.rows),
            agent_pod_uid=self.agent_pod_uid,
            agent_pid=self.agent_pid,
        )
