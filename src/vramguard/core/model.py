"""The vocabulary of vramguard: plain, frozen data shared by every stage.

The agent is a pipeline, observe → attribute → decide → act, and these types are what flows between the
stages. None of them knows about NVML, /proc or the Kubernetes API: the adapters translate at the edge, so the
decision core can be tested with nothing but constructors (node-problem-detector's `pkg/types` habit).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar, NamedTuple

from vramguard.core.text import MAX_TEXT_CHARS, cut, format_bytes

GiB = 1024**3
MiB = 1024**2


def _frozen_map(m: Mapping[str, str] | None = None) -> Mapping[str, str]:
    return MappingProxyType(dict(m or {}))


# --------------------------------------------------------------------------------------------------------------
# Enums


class Mode(str, enum.Enum):
    """The policy's mode: what the agent does to an offender (`action`), and whether it enforces at all."""

    WARN = "warn"
    EVICT = "evict"
    KILL = "kill"

    @property
    def action(self) -> ActionKind:
        """The action an offender gets in this mode (a repeat's may go further: `Escalation.kind`)."""
        return _MODE_ACTION[self]


class ActionKind(str, enum.Enum):
    """What an `Action` does: the `action` label of vramguard_actions_total and of the `action` log line."""

    WARN = "warn"  # a Warning Event on the pod
    EVICT = "evict"  # an Eviction through the API server
    KILL = "kill"  # SIGKILL of the container's GPU processes (of all its processes, for a repeat)


_MODE_ACTION = {Mode.WARN: ActionKind.WARN, Mode.EVICT: ActionKind.EVICT, Mode.KILL: ActionKind.KILL}


class ProcessKind(str, enum.Enum):
    """Which NVML process list a process came from."""

    COMPUTE = "compute"
    GRAPHICS = "graphics"
    MPS = "mps"


class DefaultKind(str, enum.Enum):
    """What quota a pod that declares none gets."""

    NONE = "none"  # unmanaged: reported, never acted on
    FIXED = "fixed"  # a fixed number of bytes per container
    FAIR_SHARE = "fair-share"  # GPU memory ÷ the node's nvidia.com/gpu.replicas label


class Orphans(str, enum.Enum):
    """`orphans` in the policy file: what the agent does with the GPU processes of a pod that is gone."""

    RECLAIM = "reclaim"  # kill them (through the kill path, every check of it)
    REPORT = "report"  # a Warning on the Node, the metric: nothing is signalled


class EvictionRefused(str, enum.Enum):
    """What to do when the Eviction API keeps refusing (PodDisruptionBudget)."""

    WAIT = "wait"
    KILL = "kill"


class OnRepeat(str, enum.Enum):
    """What a repeat gets: a container instance found over its quota again within the repeat window after a kill."""

    KILL_CONTAINER = "kill-container"  # every process of the container, GPU holders or not: the runtime restarts it
    EVICT = "evict"  # the pod, through the Eviction API (PodDisruptionBudgets and on_eviction_refused apply)
    WAIT = "wait"  # a plain kill once the cooldown since the last one ends: over its quota that long


class DriverLimits(str, enum.Enum):
    """Whether the agent programs the driver's per-cgroup memory limits (R615+) from quotas, in evict/kill."""

    AUTO = "auto"  # where the driver, the GPU and the host support them; reactive enforcement everywhere else
    OFF = "off"  # never call them
    REQUIRE = "require"  # as auto, and /readyz fails on a node where they cannot be applied


class Reason(str, enum.Enum):
    """Why an action was decided."""

    HARD_LIMIT = "hard-limit"  # usage above the hard limit for longer than hard_grace
    SOFT_LIMIT = "soft-limit"  # usage above the soft limit (burst set) for longer than soft_grace
    GPU_PRESSURE = "gpu-pressure"  # usage above quota while the GPU is short of free memory
    OVER_QUOTA = "over-quota"  # the first warning of a violation episode


# --------------------------------------------------------------------------------------------------------------
# What NVML tells us


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One schedulable GPU memory domain: a whole GPU, or one MIG instance of it."""

    index: int  # the parent GPU's NVML index
    uuid: str  # the GPU's UUID, or the MIG instance's UUID
    name: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    mig_index: int | None = None  # None for a whole GPU
    parent_uuid: str | None = None  # set for a MIG instance
    healthy: bool = True
    error: str | None = None  # why it is unhealthy

    @property
    def label(self) -> str:
        """Short human/metric label: "0" for GPU 0, "0/mig1" for its MIG instance 1."""
        return str(self.index) if self.mig_index is None else f"{self.index}/mig{self.mig_index}"


@dataclass(frozen=True, slots=True)
class GpuMemory:
    """One whole GPU's memory counters, as the watch between scans reads them (`GpuSampler.memory`)."""

    index: int
    total_bytes: int
    used_bytes: int
    free_bytes: int


class GpuProcess(NamedTuple):
    """One row of an NVML process list: a host PID using memory on one device.

    A NamedTuple rather than a frozen dataclass, like `ContainerUsage`: both are rebuilt for every GPU process
    on every scan, and a tuple is built about three times faster (the scan budget is 2 ms for 512 processes).
    """

    pid: int
    device_uuid: str
    used_bytes: int | None  # None: NVML reported NVML_VALUE_NOT_AVAILABLE
    kind: ProcessKind = ProcessKind.COMPUTE


@dataclass(frozen=True, slots=True)
class GpuSample:
    """Everything one NVML pass saw. Processes of unhealthy devices are absent.

    At most one row per (pid, device): a process NVML lists on several of a device's lists (compute, graphics,
    MPS) is one address space, merged by the sampler, which knows the lists.
    """

    devices: tuple[GpuDevice, ...]
    processes: tuple[GpuProcess, ...]
    # NVML errors met while taking this sample, as (kind, count): vramguard_nvml_errors_total{kind} adds them up.
    errors: tuple[tuple[str, int], ...] = ()
    # Rows whose PID has no process under the proc root (left out of `processes`, counted as dead-pid errors):
    # memory the driver still holds for a process that exited, torn down in a moment or stuck (`core/exited.py`).
    exited: tuple[GpuProcess, ...] = ()

    def device(self, uuid: str) -> GpuDevice | None:
        return next((d for d in self.devices if d.uuid == uuid), None)


# --------------------------------------------------------------------------------------------------------------
# What /proc tells us


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


# --------------------------------------------------------------------------------------------------------------
# What the API server tells us (the kube adapter converts V1Pod into these)


@dataclass(frozen=True, slots=True)
class ClaimUse:
    """A container's `resources.claims[]` entry: the pod's claim it uses, and which of its requests ("" for all)."""

    name: str  # an entry of the pod's spec.resourceClaims[].name
    request: str = ""


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    name: str
    container_id: str | None = None  # runtime ID without the "containerd://" scheme
    # Raw resources.limits, e.g. {"vramguard.io/vram": "12Gi"}.
    limits: Mapping[str, str] = field(default_factory=_frozen_map)
    claims: tuple[ClaimUse, ...] = ()  # the DRA claims the container uses (resources.claims)


@dataclass(frozen=True, slots=True)
class PodInfo:
    # The UID the kubelet runs the pod under, which names its cgroup: attribution, quotas, limits and kills go by
    # it. A pod's metadata.uid; for a static pod, the UID its mirror pod names (`kube/pod_manifest.py`).
    uid: str
    namespace: str
    name: str
    containers: tuple[ContainerInfo, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=_frozen_map)
    priority: int = 0
    qos: str = "BestEffort"
    owner: str | None = None  # "ReplicaSet/web-7d9f" etc.
    terminating: bool = False  # metadata.deletionTimestamp is set
    # The pod's DRA claims: spec.resourceClaims[].name → the ResourceClaim object's name (resourceClaimName, or
    # for a template the name status.resourceClaimStatuses gives it; None until the claim controller made it).
    claims: Mapping[str, str | None] = field(default_factory=lambda: MappingProxyType({}))
    # A static pod's: its mirror pod's own metadata.uid, which differs from `uid`. None for any other pod.
    mirror_uid: str | None = None
    # A static pod the API server holds no believed mirror of, known from the node alone (`ports.KubeletPods`): its
    # namespace and name are the kubelet's, its containers unknown (its quota is pod-wide: `core/quota.py`).
    mirrorless: bool = False
    # Derived index: attribution looks containers up by runtime ID once per GPU process per scan.
    _by_id: Mapping[str, ContainerInfo] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {c.container_id: c for c in self.containers if c.container_id})

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def static(self) -> bool:
        """Run by the kubelet from a manifest on the node; the API server holds only its mirror pod, if that."""
        return self.mirror_uid is not None or self.mirrorless

    @property
    def object_uid(self) -> str:
        """The API object's metadata.uid (an eviction's precondition; the pod cache's key): the mirror pod's, for a
        static pod. Its Events name `uid`, as the kubelet's do, which is what `kubectl describe` looks for."""
        return self.mirror_uid if self.mirror_uid is not None else self.uid

    def container_by_id(self, container_id: str) -> ContainerInfo | None:
        return self._by_id.get(container_id)


# --------------------------------------------------------------------------------------------------------------
# Quotas and policy


class SourceKind(str, enum.Enum):
    RESOURCE = "resource"  # a container's resources.limits
    ANNOTATION = "annotation"  # a pod annotation, covering the whole pod
    CLAIM = "claim"  # the GPU memory shares of the container's DRA claims, per GPU (`core/shares.py`)


@dataclass(frozen=True, slots=True)
class QuotaSource:
    """One entry of `Policy.quota_sources`, e.g. `resource:nvidia.com/gpumem`, with the bytes per unit."""

    kind: SourceKind
    name: str
    unit_bytes: int

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.name}"

    @property
    def field(self) -> str:
        """The field of the pod it reads, as messages name it: `limits[<name>]`, `annotation <name>`, `claim <name>`."""
        return f"limits[{self.name}]" if self.kind is SourceKind.RESOURCE else f"{self.kind.value} {self.name}"


@dataclass(frozen=True, slots=True)
class Quota:
    """A VRAM quota on one GPU. `limit_bytes` is the soft limit when `burst_bytes` is set, the hard one otherwise.

    A fair-share quota is not a number of bytes until it meets a GPU: it is `share_divisor`, and the limit is the
    device's total memory divided by it.
    """

    limit_bytes: int | None = None
    burst_bytes: int | None = None
    share_divisor: int | None = None
    source: str = ""  # where it came from, for messages: "limits[vramguard.io/vram]", "annotation ...", "default"
    # The policy's quota source that gave it, where one did (None: a default, or the namespace cap standing in).
    origin: QuotaSource | None = None
    cap_bytes: int | None = None  # the namespace max: bounds a fair share, whose bytes depend on the device
    # For a DRA share (`claim:` source): which allocation it is, e.g. "<claim UID>/0"; the containers of a pod
    # holding the same share on a GPU are judged together against it, as the share is one amount of memory.
    share: str | None = None
    claim: str | None = None  # the ResourceClaim(s) the share comes from, by name ("a+b" for two on one GPU)

    def limit_for(self, device_total_bytes: int) -> int:
        if self.share_divisor is not None:
            share = device_total_bytes // self.share_divisor
            return share if self.cap_bytes is None else min(share, self.cap_bytes)
        assert self.limit_bytes is not None, "a Quota needs limit_bytes or share_divisor"
        return self.limit_bytes

    def hard_for(self, device_total_bytes: int) -> int:
        """The bytes over which the agent acts at once on a GPU of that size: the burst where set, else the limit."""
        limit = self.limit_for(device_total_bytes)
        return max(limit, self.burst_bytes) if self.burst_bytes is not None else limit

    @property
    def hard_bytes(self) -> int | None:
        """`hard_for` on any GPU; None for a fair share, whose bytes depend on the GPU it meets."""
        return None if self.share_divisor is not None else self.hard_for(0)


@dataclass(frozen=True, slots=True)
class QuotaError:
    """A quota value the agent could not use. Becomes a VRAMQuotaInvalid Warning Event on the pod.

    `quota.invalid_message` turns one into the Event's text. Every field is stored cut to MAX_CHARS (with a
    marker saying how long it was): a tenant can write a 10 MB annotation, and whoever logs an error must never
    log megabytes.
    """

    MAX_CHARS: ClassVar[int] = MAX_TEXT_CHARS

    field: str  # e.g. "spec.containers[trainer].resources.limits[vramguard.io/vram]"
    value: str  # as written, cut to MAX_CHARS
    message: str  # reads after the value: "is not a valid quantity (GB is not a Kubernetes suffix; ...)"
    # What applies instead, filled in once the pod's quotas are resolved: "limits[nvidia.com/gpumem] 2Gi",
    # "default fixed 4Gi", "namespace max_quota 8Gi (no valid quota)", "no quota: unmanaged".
    applies: str = ""

    def __post_init__(self) -> None:
        for name in ("field", "value", "message", "applies"):
            text = getattr(self, name)
            if isinstance(text, str) and len(text) > self.MAX_CHARS:
                object.__setattr__(self, name, cut(text, self.MAX_CHARS))


class QuotaScope(str, enum.Enum):
    """Whose quota holds a row of usage (`quota.row_owner`), and so which rows are judged together against it."""

    CONTAINER = "container"  # the container's own quota (`NO_SHARE` included): its row alone, per GPU
    POD = "pod"  # the pod-wide quota (an annotation): the rows of the containers it covers on a GPU, summed
    SHARE = "share"  # a DRA share: the rows of the pod's containers holding that share on its GPU, summed


@dataclass(frozen=True, slots=True)
class PodQuota:
    """The quotas that apply to one pod.

    Each container whose first matching source is a resource limit has its own quota in `containers`; the
    containers covered by a pod-wide source (an annotation) share `pod`, checked against their summed usage.
    Which of them governs a container's row on a GPU is `quota.row_owner`'s answer, for every consumer.
    """

    containers: Mapping[str, Quota] = field(default_factory=lambda: MappingProxyType({}))
    pod: Quota | None = None
    errors: tuple[QuotaError, ...] = ()
    # Per-GPU quotas from DRA claims: container → GPU UUID → its share there. A container listed here is held to
    # its share on each GPU where it holds one and to nothing (NO_SHARE) on any other: a claim is all the GPU
    # memory the pod was given, so memory on a GPU it was not allocated is over its quota.
    shares: Mapping[str, Mapping[str, Quota]] = field(default_factory=lambda: MappingProxyType({}))

    def own(self, container: str, device_uuid: str) -> Quota | None:
        """The container's own quota on one GPU (its share there, or its quota on every GPU), or None when it
        has none (it is then covered by `pod`, or unmanaged)."""
        shares = self.shares.get(container)
        if shares is not None:
            return shares.get(device_uuid, NO_SHARE)
        return self.containers.get(container)


NO_SHARE = Quota(limit_bytes=0, source="no DRA claim share on this GPU")


@dataclass(frozen=True, slots=True)
class DefaultQuota:
    kind: DefaultKind = DefaultKind.NONE
    bytes: int | None = None  # for FIXED


@dataclass(frozen=True, slots=True)
class NamespacePolicy:
    mode: Mode | None = None  # overrides Policy.mode
    max_quota_bytes: int | None = None  # cap on every quota in the namespace; annotations cannot exceed it
    default: DefaultQuota | None = None  # overrides Policy.default
    on_repeat: OnRepeat | None = None  # overrides Policy.on_repeat


DEFAULT_QUOTA_SOURCES: tuple[str, ...] = (
    "resource:vramguard.io/vram",
    "resource:aliyun.com/gpu-mem",
    "resource:nvidia.com/gpumem",
    "resource:tencent.com/vcuda-memory",
    "annotation:vramguard.io/vram-limit",
    "annotation:gpu-memory",
)


@dataclass(frozen=True, slots=True)
class Policy:
    """The operator's policy file, validated. Blast-radius limits are data here, not code."""

    mode: Mode = Mode.WARN
    hard_grace_s: float = 0.0
    soft_grace_s: float = 60.0
    # A GPU is under pressure when free memory is below either threshold (whichever is set).
    pressure_free_bytes: int | None = None
    pressure_free_ratio: float | None = 0.05
    # `pressure_transition_period` in the policy file: a GPU leaves pressure only once its free memory has stayed
    # above the threshold this long (the kubelet's --eviction-pressure-transition-period), so a GPU whose free
    # memory hovers around the threshold does not flap in and out of pressure with every allocation.
    pressure_transition_s: float = 30.0
    max_actions_per_scan: int = 1
    # How long an action holds the next one on the same target: a kill on that container instance (a repeat
    # excepted), an eviction on that pod. A restarted container is a new instance: the kubelet's back-off spaces it.
    cooldown_s: float = 60.0
    # `repeat_window` in the policy file (>= 10s): a container instance killed in and over its quota again within
    # this long is a repeat, whatever the cooldown.
    repeat_window_s: float = 300.0
    # None: the mode's next step (kill mode: kill-container; evict mode: evict), so a repeat is always bounded.
    on_repeat: OnRepeat | None = None
    on_eviction_refused: EvictionRefused = EvictionRefused.WAIT
    # `eviction_timeout` in the policy file (> 0): how long the agent tries to evict a pod, retries included,
    # before it counts the eviction as refused (then on_eviction_refused applies): a frozen or unreachable API
    # server must not protect an offender from `on_eviction_refused: kill`.
    eviction_timeout_s: float = 15.0
    driver_limits: DriverLimits = DriverLimits.AUTO
    # The watch between scans (`watch.py`): each GPU's memory counter read every `watch_interval_s` (0: no watch,
    # scans on the poll alone); a change since the last scan (a rise or a fall) by more than the smaller of the two
    # (whichever is set), or a GPU entering pressure, scans at once, at most `triggered_scans_per_second` (a burst
    # of as many). 20 ms: a reading costs ~0.1-0.2 ms of CPU in a VM (its wake-up more than its NVML call), a tenth
    # of the ~100 ms a killed CUDA process takes to let go of its memory
    # (docs/architecture.md "The watch between scans").
    watch_interval_s: float = 0.02
    watch_rise_bytes: int | None = 256 * 1024 * 1024
    watch_rise_ratio: float | None = 0.01
    triggered_scans_per_second: float = 10.0
    exempt_namespaces: frozenset[str] = frozenset({"kube-system"})
    # Orphans (`core/orphans.py`): GPU processes in the cgroup of a pod absent from a healthy pod cache for
    # `orphan_grace_s`, and from a fresh read of the API server. None: reclaimed in kill and evict mode, reported
    # in warn mode. The grace is long enough for the kubelet's own cleanup of a deleted pod to win.
    orphans: Orphans | None = None
    orphan_grace_s: float = 120.0
    quota_sources: tuple[str, ...] = DEFAULT_QUOTA_SOURCES
    default: DefaultQuota = DefaultQuota()
    namespaces: Mapping[str, NamespacePolicy] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def reclaims_orphans(self) -> bool:
        """Whether orphans are killed (`orphans: reclaim`, or the default in kill and evict mode)."""
        if self.orphans is not None:
            return self.orphans is Orphans.RECLAIM
        return self.mode in (Mode.KILL, Mode.EVICT)

    def mode_for(self, namespace: str) -> Mode:
        ns = self.namespaces.get(namespace)
        return ns.mode if ns is not None and ns.mode is not None else self.mode

    def on_repeat_for(self, namespace: str) -> OnRepeat:
        ns = self.namespaces.get(namespace)
        chosen = ns.on_repeat if ns is not None and ns.on_repeat is not None else self.on_repeat
        if chosen is not None:
            return chosen
        return OnRepeat.EVICT if self.mode_for(namespace) is Mode.EVICT else OnRepeat.KILL_CONTAINER

    def default_for(self, namespace: str) -> DefaultQuota:
        ns = self.namespaces.get(namespace)
        return ns.default if ns is not None and ns.default is not None else self.default

    def cap_for(self, namespace: str) -> int | None:
        ns = self.namespaces.get(namespace)
        return ns.max_quota_bytes if ns is not None else None

    def under_pressure(self, device: GpuDevice | GpuMemory) -> bool:
        if self.pressure_free_bytes is not None and device.free_bytes < self.pressure_free_bytes:
            return True
        return (
            self.pressure_free_ratio is not None and device.free_bytes < self.pressure_free_ratio * device.total_bytes
        )

    def watch_rise_for(self, total_bytes: int) -> int:
        """The change in a GPU's used memory since the last scan that scans at once: the smaller threshold set."""
        limits = [b for b in (self.watch_rise_bytes,) if b is not None]
        if self.watch_rise_ratio is not None:
            limits.append(int(self.watch_rise_ratio * total_bytes))
        return min(limits) if limits else total_bytes

    def exemption(self, pod_uid: str, namespace: str, agent_pod_uid: str | None = None) -> str | None:
        """Why the agent never acts on a pod (no kill, eviction, driver limit or orphan reclaim; warnings and
        notices still reach it), or None when it may: the agent's own pod, or a pod in an exempt namespace."""
        if agent_pod_uid is not None and pod_uid == agent_pod_uid:
            return "the agent's own pod"
        if namespace in self.exempt_namespaces:
            return f"namespace {namespace} is exempt"
        return None


# --------------------------------------------------------------------------------------------------------------
# The attributed snapshot the decision core reads


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
class NodeRef:
    """The agent's Node as the object of an Event (a GPU fault belongs to no pod): written in "default" with the
    node's name as its UID, as the kubelet writes its own Node Events. Shaped like `PodInfo` where the Event path
    reads it (`uid`, `namespace`, `name`, `key`)."""

    name: str
    namespace: str = "default"

    @property
    def uid(self) -> str:
        return self.name

    @property
    def key(self) -> str:
        return f"node/{self.name}"


EventSubject = PodInfo | NodeRef  # what an Event is about


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


# --------------------------------------------------------------------------------------------------------------
# What the decision core outputs


class Subject(NamedTuple):
    """What is judged against one quota on one device (or MIG instance): a container with its own quota, the
    containers a pod-wide quota covers, or those holding one DRA share. The key of a violation and its episode."""

    pod_uid: str
    gpu_uuid: str
    scope: QuotaScope
    name: str | None  # the container (CONTAINER), the share's allocation (`Quota.share`: SHARE), None (POD)


class RowOwner(NamedTuple):
    """Who owns a row of usage: the subject it is judged in and the quota that holds it (`quota.row_owner`)."""

    subject: Subject
    quota: Quota
    # The container whose own quota holds the row (its quota, or a DRA share), None under the pod-wide quota: the
    # `container` of the quota's metric series, and the cgroup whose driver limit holds the row.
    holder: str | None

    @property
    def limit_key(self) -> SubjectKey:
        """The key of the driver limit that holds the row's quota, where the driver holds one (`holder`'s cgroup)."""
        return SubjectKey(self.subject.pod_uid, self.holder, self.subject.gpu_uuid)


OwnedRow = tuple[ContainerUsage, RowOwner | None]
"""One row of usage and its owner (None: unmanaged), found once per scan (`decide.owners`) and read by all that
judges or shows a row: the violations, the pressure notices, /status and `vramguard top`, the quota metrics. A plain
pair, read by unpacking (`for usage, owner in rows`): one is built per row per scan, at a quarter of a NamedTuple's
cost."""


class SubjectKey(NamedTuple):
    """A cgroup on one GPU: a container's, or the pod's own. The key of a driver limit and of the usage the driver
    counts for it."""

    pod_uid: str
    container: str | None  # the container's name; None for the pod as a whole (a pod-wide quota, its own cgroup)
    gpu_uuid: str


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
