"""The composition root: which real part goes behind each seam, and the agent's life from start to stop.

`main.py` turns flags into a `RunConfig`; everything here builds parts from it and never touches a terminal. A
configuration the agent cannot run with raises `WiringError` with a message for the user. Every background part
is built idle, started here in dependency order into one `lifecycle.Services` group, and stopped in reverse
within `SHUTDOWN_BUDGET_S`; one `Clock` is handed to every part that reads time.
"""

from __future__ import annotations

import os
import resource
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import structlog
from kubernetes.client import ApiClient

from vramguard import __version__
from vramguard.agent.act import Enforcer
from vramguard.agent.health import Checks, HealthWriter
from vramguard.agent.loop import Agent
from vramguard.agent.metrics import Metrics
from vramguard.agent.orphan_reads import OrphanReads
from vramguard.agent.reload import PolicyReloader, digest_of
from vramguard.agent.report import LastScan
from vramguard.agent.watch import MemoryWatch, ScanCalls, ScanTrigger
from vramguard.base import healthfile
from vramguard.base.backoff import Backoff
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.heartbeat import Heartbeat
from vramguard.base.lifecycle import Service, Services
from vramguard.base.logs import FailureRun
from vramguard.base.policyfile import read_policy
from vramguard.core.exited import EXITED_HOLD_S
from vramguard.core.limit_plan import LimitPlanner, uses_limiter, whole_gpus
from vramguard.core.model import DriverLimits, EventSubject, GpuDevice, PodInfo, Policy
from vramguard.core.policy import Overrides, PolicyError
from vramguard.core.ports import (
    EventRecorder,
    Evictor,
    EvictResult,
    KillMemory,
    LimitsSupport,
    MemoryLimiter,
    PodSource,
)
from vramguard.core.quota import reads_claims
from vramguard.core.text import show_value
from vramguard.http.server import BindError, HealthServer
from vramguard.http.status import AgentFacts, DriverFacts, PolicyFacts, StatusPage
from vramguard.kube.capacity import KubeCapacityPublisher
from vramguard.kube.claims import KubeClaimSource
from vramguard.kube.client import load_api_client
from vramguard.kube.events import KubeEventRecorder, KubeEventSink
from vramguard.kube.eviction import KubeEvictor
from vramguard.kube.pods import KubePodSource
from vramguard.kube.pods_file import FilePodSource
from vramguard.node.api_uids import ApiUids
from vramguard.node.cgroup import HOST_KUBELET, KubeletTree, find_namespace, kubelet_root, v2_root
from vramguard.node.cgroup_tree import CgroupfsTree
from vramguard.node.cgroupwatch import CgroupWatcher, InotifyUnavailable
from vramguard.node.describe import describer
from vramguard.node.freezes import FreezeJournal, freeze_journal
from vramguard.node.identify import ProcIdentifier
from vramguard.node.kill import PidfdKiller
from vramguard.node.kubelet_pods import DEFAULT_POD_LOGS_DIR, KubeletPods
from vramguard.node.limiter import DriverLimiter, probe_limits
from vramguard.node.repeats import KillFile
from vramguard.nvml import (
    LOADER_SEARCH,
    NvmlLocation,
    NvmlMemoryLimiter,
    NvmlSampler,
    NvmlUnavailable,
    binding_version,
    binds_limits,
)

# What stopping may take in all, from the stop signal. The DaemonSet sets no terminationGracePeriodSeconds, so the
# kubelet sends SIGKILL after Kubernetes' default of 30 s; the agent aims far lower (docs/scale.md promises SIGTERM
# ends it within 2 s) because the node is unguarded from the stop until its successor scans. A part still busy at
# the deadline (a request to a frozen API server) is abandoned: its thread is a daemon.
SHUTDOWN_BUDGET_S = 1.5
# A part whose thread has not gone round for this long is stuck (liveness fails): ten times the longest NVML call
# deadline, and far beyond any round a flood or a busy node makes (the HTTP server's rounds end within 0.1 s).
PART_STUCK_S = 30.0
# An agent that does not use the driver's limits does not ask the driver about them either.
LIMITS_UNASKED = (
    "not asked: the agent uses the driver's limits in evict and kill modes only, not with --dry-run or "
    "driver_limits: off (`vramguard version` on the node asks)"
)


class WiringError(Exception):
    """The agent cannot start with this configuration; the message says why, for the user."""


class LogEventRecorder:
    """Events when there is no API server to write them to (`--pods-file`): they go to the log instead."""

    def __init__(self) -> None:
        self.log = structlog.get_logger(__name__)

    def record(
        self, pod: EventSubject, reason: str, message: str, warning: bool = True, important: bool = False
    ) -> None:
        self.log.warning("event", pod=pod.key, reason=reason, message=message)


class NoApiEvictor:
    """Eviction is an API call; with `--pods-file` there is no API server, so every eviction fails, visibly."""

    def evict(self, pod: PodInfo, message: str) -> EvictResult:
        return EvictResult(evicted=False, refused=False, message="no API server: eviction needs the Kubernetes API")


@dataclass(frozen=True)
class ScanSetup:
    """What the scanning parts are built from (`connect`, `open_nvml`, `build_agent`): `vramguard run`'s agent and
    `vramguard top`'s own (dry run) alike."""

    node_name: str | None
    policy: Policy
    dry_run: bool
    proc_root: str
    cgroup_root: str
    pods_file: Path | None
    kubeconfig: str | None
    device_prefix: str = "/dev/nvidia"
    nvml_location: NvmlLocation = LOADER_SEARCH  # where libnvidia-ml.so.1 is (--driver-root, --nvml-library)
    exited_hold_s: float = EXITED_HOLD_S  # exited PIDs holding GPU memory this long make a GPU need a reset
    pod_logs_dir: str = DEFAULT_POD_LOGS_DIR  # the kubelet's, as mounted here: what backs a mirror pod's claim
    kubelet: KubeletTree = HOST_KUBELET  # where this node's kubelet makes pod cgroups (`kubelet_tree`)


@dataclass
class Cluster:
    """Where pods come from and where Events and evictions go: the API server, or a pods file and the log.
    `parts` are its background parts, built idle, in the order they start (`start`)."""

    pods: FilePodSource | KubePodSource
    events: EventRecorder
    evictor: Evictor
    api: ApiClient | None = None
    claims: KubeClaimSource | FilePodSource | None = None  # with a `claim:` quota source
    parts: tuple[tuple[str, Service], ...] = ()
    # Where scans are called for between polls: by the pod sources (a pod learned late) and the memory watch.
    scan_calls: ScanCalls | None = None
    # The UIDs the API server gave this node's pods: only theirs can be orphans (`core/orphans.py`).
    api_uids: ApiUids = field(default_factory=ApiUids)

    def start(self, services: Services) -> None:
        """Start the background parts in `services`, which stops them in reverse."""
        for name, part in self.parts:
            services.start(name, part)


def kubelet_tree(kubelet_cgroup_root: str, proc_root: str, cgroup_root: str) -> KubeletTree:
    """Where this node's kubelet makes pod cgroups: below its --cgroup-root (`kubelet_cgroup_root`, checked), read
    from wherever this agent's cgroup namespace is rooted (`cgroup.find_namespace`, once). Logged once; a
    hierarchy read through a namespace that could not be placed is a warning: none of its paths is a pod's."""
    log = structlog.get_logger(__name__)
    try:
        root = kubelet_root(kubelet_cgroup_root)
    except ValueError as e:
        raise WiringError(f"--kubelet-cgroup-root: {show_value(kubelet_cgroup_root)} {e}") from None
    try:
        namespace = find_namespace(proc_root, cgroup_root, os.getpid())
    except OSError as e:
        # Without the host's PID 1 the agent sees no host process anyway: nothing to place.
        log.warning("cgroup_namespace_unknown", error=e.strerror or repr(e), proc_root=proc_root)
        namespace = ()
    tree = KubeletTree(root, namespace)
    log.info(
        "kubelet_cgroups",
        kubelet_cgroup_root="/" + "/".join(root),
        cgroup_namespace={hid: None if at is None else "/" + "/".join(at) for hid, at in namespace} or "host",
    )
    for hid, at in namespace:
        if at is None:
            log.warning(
                "cgroup_namespace_unplaced",
                hierarchy=hid,
                cgroup_root=cgroup_root,
                consequence="no process read through it is attributed to a pod",
                fix="mount the host's cgroup filesystem at --cgroup-root, or run the agent in the host's cgroup "
                "namespace",
            )
    return tree


def policy_file(path: Path | None, overrides: Overrides) -> tuple[Policy, str | None]:
    """The policy file's policy (defaults without one) through the flags' `overrides`, as every reload of it goes
    (`reload.PolicyReloader`), and the hash of the content read (None without a file)."""
    if path is None:
        return overrides.apply(Policy()), None
    try:
        policy, text = read_policy(path)
    except PolicyError as e:
        raise WiringError(str(e)) from None
    return overrides.apply(policy), digest_of(text.content)


def policy_reloader(config: RunConfig, metrics: Metrics, clock: Clock) -> PolicyReloader | None:
    """The watch on the policy file (not started), None without one: a change is in force from the next scan."""
    if config.policy_path is None or config.policy_digest is None:
        return None
    reloader = PolicyReloader(
        config.policy_path,
        config.overrides.apply,
        config.policy_digest,
        clock=clock,
        count=lambda result: metrics.policy_reloads.labels(result=result.value).inc(),
    )
    metrics.policy_invalid.set_function(lambda: reloader.invalid is not None)
    return reloader


def connect(
    setup: ScanSetup, metrics: Metrics, clock: Clock = SYSTEM_CLOCK, api_uids: ApiUids | None = None
) -> Cluster:
    """The pods file and the log, or the API server (pods watched in the background, Events on a writer, and
    where the policy reads quotas from DRA claims, this node's ResourceSlices and its pods' claims), and the
    kubelet's own word on its pods (`KubeletPods`, which mirror claims are judged by). `api_uids`: the UIDs the
    API server gave this node's pods, kept across restarts (in memory when None). Nothing is started:
    `Cluster.start`."""
    policy, pods_file, node_name = setup.policy, setup.pods_file, setup.node_name
    api_uids = api_uids if api_uids is not None else ApiUids()
    kubelet = KubeletPods(setup.pod_logs_dir, clock=clock)
    claim_sources = reads_claims(policy.quota_sources)
    calls = scan_calls(policy, metrics, clock)
    on_pods = calls.pods_updated if calls is not None else None
    if pods_file is not None:
        from_file = FilePodSource(
            str(pods_file), node_name=node_name, clock=clock, on_pods=on_pods, kubelet=kubelet, api_uids=api_uids
        )
        kubelet.on_change = from_file.rejudge
        metrics.mirror_claims_refused.set_function(lambda: len(from_file.refused()))
        # The file's ResourceClaims and ResourceSlices, read with its pods.
        file_claims = from_file if claim_sources else None
        parts: tuple[tuple[str, Service], ...] = (("kubelet-pods", kubelet), ("pods-file", from_file))
        return Cluster(
            from_file, LogEventRecorder(), NoApiEvictor(), claims=file_claims, parts=parts, scan_calls=calls,
            api_uids=api_uids,
        )  # fmt: skip
    if not node_name:
        raise WiringError("--node-name (or NODE_NAME) is required to watch this node's pods")
    try:
        api = load_api_client(setup.kubeconfig, node_name)
    except Exception as e:  # the client raises several unrelated types for a bad or missing configuration
        where = setup.kubeconfig or "the in-cluster ServiceAccount"
        raise WiringError(f"cannot load the Kubernetes configuration from {where}: {e}") from None
    events = KubeEventRecorder(
        KubeEventSink(api, node_name),
        count=lambda result: metrics.events.labels(result=result.value).inc(),
        clock=clock,
    )
    metrics.events_queued.set_function(events.queued)

    def count(resource: str, verb: str) -> None:
        metrics.api_requests.labels(resource=resource, verb=verb).inc()

    pods = KubePodSource(api, node_name, count=count, clock=clock, on_pods=on_pods, kubelet=kubelet, api_uids=api_uids)
    kubelet.on_change = pods.rejudge
    metrics.mirror_claims_refused.set_function(lambda: len(pods.refused()))
    kube_parts: list[tuple[str, Service]] = [("events", events), ("kubelet-pods", kubelet), ("pods", pods)]
    claims = None
    if claim_sources:
        claims = KubeClaimSource(api, node_name, pods, count=count, clock=clock)
        kube_parts.append(("claims", claims))  # after the pods: it reads the claims the pods name
    return Cluster(pods, events, KubeEvictor(api, clock=clock), api, claims, tuple(kube_parts), calls, api_uids)


def scan_calls(policy: Policy, metrics: Metrics, clock: Clock) -> ScanCalls | None:
    """Where scans are called for between polls (`watch.ScanCalls`), None with `watch_interval: 0s` (then a pod
    update calls for none either)."""
    if policy.watch_interval_s <= 0:
        return None
    return ScanCalls(policy, clock, count_held=metrics.scan_triggers_held.inc)


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft open-file limit to the hard one, as far as the kernel allows; (before, after).

    Container runtimes often start processes with a soft limit of 1024 under a far higher hard one. The agent's
    fd use is bounded (no fd per GPU process, a capped number of HTTP connections), but headroom costs nothing
    and keeps a flood elsewhere from starving the kill path.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if target == resource.RLIM_INFINITY:  # NOFILE cannot be unlimited: the kernel's ceiling is fs.nr_open
        try:
            with open("/proc/sys/fs/nr_open") as f:
                target = int(f.read())
        except (OSError, ValueError):
            target = 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft, soft
    return soft, target


@dataclass(frozen=True)
class Serving:
    """What the agent `serve` runs adds to the scanning parts. `top` has none of it: no driver limits programmed,
    no capacity published, no freeze journalled or kill remembered, no policy reloads, and no fresh reads of the pod
    source to confirm orphans (so it never counts memory orphaned)."""

    planner: LimitPlanner | None = None  # the one the limiter plans with too (`driver_limiter`)
    limiter: DriverLimiter | None = None  # None in dry-run: driver_limiter makes none
    capacity: KubeCapacityPublisher | None = None  # None in dry-run: capacity_publisher makes none
    journal: FreezeJournal | None = None
    kill_memory: KillMemory | None = None
    reloads: PolicyReloader | None = None  # a reloaded policy is in force from the scan after it was read
    policy_digest: str | None = None


def open_nvml(setup: ScanSetup, services: Services) -> NvmlSampler:
    """NVML started in `services`, or NvmlUnavailable saying why not."""
    return services.start("nvml", NvmlSampler(proc_root=setup.proc_root, location=setup.nvml_location))


def build_agent(
    setup: ScanSetup,
    sampler: NvmlSampler,
    cluster: Cluster,
    metrics: Metrics,
    clock: Clock = SYSTEM_CLOCK,
    serving: Serving | None = None,
) -> Agent:
    """The loop with its real parts, none started (the Enforcer's eviction worker: `Enforcer.start`; with `serving`,
    the orphans' fresh reads: `Agent.orphan_reads`). Dry-run is the Enforcer's business alone (its Events go to the
    log). GPU faults are told on the Node `setup` names."""
    serves = serving if serving is not None else Serving()
    killer = PidfdKiller(
        proc_root=setup.proc_root,
        cgroup_root=setup.cgroup_root,
        device_prefix=setup.device_prefix,
        journal=serves.journal,
        clock=clock,
        kubelet=setup.kubelet,
    )
    enforcer = Enforcer(
        killer=killer,
        evictor=cluster.evictor,
        events=cluster.events,
        policy=setup.policy,
        dry_run=setup.dry_run,
        clock=clock,
        node_name=setup.node_name,
    )
    return Agent(
        sampler=sampler,
        identifier=ProcIdentifier(proc_root=setup.proc_root, kubelet=setup.kubelet),
        pods=cluster.pods,
        policy=setup.policy,
        enforcer=enforcer,
        metrics=metrics,
        capacity=serves.capacity,
        limiter=serves.limiter,
        planner=serves.planner,
        claims=cluster.claims,
        kill_memory=serves.kill_memory,
        watch=memory_watch(sampler, setup.policy, metrics, clock, cluster.scan_calls),
        clock=clock,
        reloads=serves.reloads,
        policy_digest=serves.policy_digest,
        exited_hold_s=setup.exited_hold_s,
        # Only the agent that runs confirms orphans: `top` never counts memory orphaned.
        orphan_reads=OrphanReads(cluster.pods, clock=clock) if serving is not None else None,
        api_uids=cluster.api_uids,
    )


def memory_watch(
    sampler: NvmlSampler, policy: Policy, metrics: Metrics, clock: Clock, calls: ScanCalls | None = None
) -> MemoryWatch | None:
    """The watch between scans (not started: `serve` starts it with the loop), posting to `calls` (the cluster's,
    which its pod sources post to as well), None with `watch_interval: 0s`."""
    if policy.watch_interval_s <= 0:
        return None
    if calls is None:
        calls = scan_calls(policy, metrics, clock)
    return MemoryWatch(sampler.memory, ScanTrigger(policy), policy.watch_interval_s, clock, calls=calls)


def watch_cgroups(
    limiter: DriverLimiter | None,
    cgroup_root: str,
    services: Services,
    clock: Clock,
    kubelet: KubeletTree = HOST_KUBELET,
) -> None:
    """Limits at cgroup creation: the kubelet's cgroup v2 tree (`kubelet`) watched with inotify (started in
    `services`), each new pod and container cgroup handed to the limiter. Nothing where there is nothing to program
    or no way to watch (then the limiter programs each container once the pod's status names it)."""
    root = v2_root(cgroup_root)
    if limiter is None or root is None:
        return
    watcher = CgroupWatcher(root, limiter.appeared, tick=limiter.retry_parked, clock=clock, kubelet=kubelet)
    log = structlog.get_logger(__name__)
    try:
        services.start("cgroup-watch", watcher)
    except InotifyUnavailable as e:
        log.warning("cgroup_watch_unavailable", reason=str(e), fallback="reconcile")
        return
    limiter.watched()
    log.info("cgroup_watch", root=root)


def driver_limiter(
    planner: LimitPlanner,
    policy: Policy,
    dry_run: bool,
    cgroup_root: str,
    services: Services,
    clock: Clock = SYSTEM_CLOCK,
    kubelet: KubeletTree = HOST_KUBELET,
) -> DriverLimiter | None:
    """The driver-limits programmer (not started), where the policy enforces anywhere (evict or kill) and allows
    them; None in --dry-run, with `driver_limits: off`, or with a warn-only policy. A cgroup that appears is
    programmed from `planner`, the agent's, which reads the sources fresh. Its NVML initialisation is started in
    `services`: call once NVML is up."""
    if not uses_limiter(policy, dry_run):
        return None
    memory = services.start("nvml-limits", NvmlMemoryLimiter())
    return DriverLimiter(memory, clock=clock, plan=planner.plan, tree=CgroupfsTree(cgroup_root, kubelet))


def capacity_publisher(
    cluster: Cluster, node_name: str | None, reserve_bytes: int, advertise: bool, dry_run: bool, clock: Clock
) -> KubeCapacityPublisher | None:
    """The publisher, not started; it withdraws what an earlier run may have advertised when not advertising
    (once started, in the background like every publish: a failure is logged, never raised, never waited for)."""
    if cluster.api is None or node_name is None or dry_run:
        return None
    publisher = KubeCapacityPublisher(cluster.api, node_name, reserve_bytes, clock=clock)
    if not advertise:
        publisher.withdraw()
    return publisher


def open_sampler(
    setup: ScanSetup,
    services: Services,
    stop: threading.Event,
    clock: Clock,
    problem: Callable[[str | None], None],
) -> NvmlSampler | None:
    """NVML, once it loads (`open_nvml`): it may come up after the agent (a driver container still installing), so
    retry with back-off on `clock` until `stop`. `problem` hears why it failed, and None once it is up; the log hears
    once per run of the same failure."""
    log = structlog.get_logger(__name__)
    backoff = Backoff(1.0, 60.0)
    failures = FailureRun()
    while not stop.is_set():
        try:
            sampler = open_nvml(setup, services)
        except NvmlUnavailable as e:
            if failures.failed(str(e)):
                log.error("nvml_unavailable", error=str(e))
            problem(str(e))
            clock.wait(stop, backoff.next())
            continue
        problem(None)
        return sampler
    return None


def nvidia_side(sampler: NvmlSampler | None) -> DriverFacts:
    """nvidia-ml-py's version and whether it binds the limits; with NVML up (`sampler` started), the driver's and
    NVML's versions. `with_limits` adds whether the driver can hold limits."""
    facts = DriverFacts(binding_version(), binds_limits())
    if sampler is None:
        return facts
    return replace(
        facts,
        driver_version=sampler.driver_version,
        nvml_version=sampler.nvml_version,
        nvml_library=sampler.library_path,
    )


def with_limits(facts: DriverFacts, support: LimitsSupport | None, unknown: str) -> DriverFacts:
    """`facts` saying whether the driver can hold limits, as `support` found; where it is None, not known, and why
    (`unknown`)."""
    if support is None:
        return replace(facts, limits_possible=None, limits_reason=unknown)
    return replace(facts, limits_possible=support.possible, limits_reason=support.reason)


def ask_limits(memory: MemoryLimiter, cgroup_root: str, devices: Iterable[GpuDevice]) -> LimitsSupport:
    """Whether the driver can hold limits on these GPUs (the whole ones) now. Blocks on NVML: for the commands."""
    return probe_limits(memory, CgroupfsTree(cgroup_root), [d.index for d in whole_gpus(devices)])


def ask_driver(proc_root: str, cgroup_root: str, location: NvmlLocation = LOADER_SEARCH) -> DriverFacts:
    """The NVIDIA side, asked now (`vramguard version`): NVML started here and stopped, one sample for the GPUs, and
    the limits of the cgroup v2 root asked for on each whole one. Where NVML cannot start, says why (`problem`).
    Blocks on NVML (each call of the sample under its deadline, the limits not): never for the agent."""
    services = Services()
    try:
        try:
            sampler = services.start("nvml", NvmlSampler(proc_root=proc_root, location=location))
        except NvmlUnavailable as e:
            return replace(
                nvidia_side(None), limits_possible=False, limits_reason="NVML is not available", problem=str(e)
            )
        facts = nvidia_side(sampler)
        try:
            memory = services.start("nvml-limits", NvmlMemoryLimiter())
        except Exception as e:  # pynvml.NVMLError from a second nvmlInit: NVML came up for the sampler just now
            return with_limits(facts, None, f"nvmlInit: {e}")
        return with_limits(facts, ask_limits(memory, cgroup_root, sampler.sample().devices), "")
    finally:
        services.stop(SHUTDOWN_BUDGET_S)


@dataclass(frozen=True, slots=True)
class Running:
    """The parts that exist only once NVML is up: the agent, and the NVIDIA side as NVML told it at its start."""

    agent: Agent
    driver: DriverFacts


class Started:
    """Where `serve` publishes the `Running` parts once NVML is up, made before the parts that read them (the
    probes, and through them /status): one reference, set once on the main thread and read on the others'."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: Running | None = None

    def publish(self, running: Running) -> None:
        with self._lock:
            self._running = running

    def running(self) -> Running | None:
        """The running parts, None before NVML is up and the agent built."""
        with self._lock:
            return self._running


def _problem(problem: str | None) -> healthfile.Check:
    """A check that fails saying `problem`, where there is one."""
    return not problem, problem or ""


class Probes:
    """Liveness and readiness, each a set of named checks (`health.Checks`): what the health file (the kubelet's
    exec probes) and /healthz and /readyz (people; `?verbose` lists the checks) say.

    Live (`healthz`): the HTTP server's thread goes round, then the scan loop does. Ready (`readyz`): NVML is up,
    the pod list is current, the driver holds the limits `driver_limits: require` asks for and the watch between
    scans is not stuck; then, a scan with the pod list completed. What exists only once NVML is up is read from
    `started`; `reloader` is the policy file's watch, whose refusal /status shows."""

    def __init__(
        self,
        pods: PodSource,
        poll_interval_s: float,
        *,
        started: Started,
        reloader: PolicyReloader | None = None,
        clock: Clock = SYSTEM_CLOCK,
        http: Heartbeat | None = None,
    ) -> None:
        self.pods = pods
        self.poll_interval_s = poll_interval_s
        self.started = started
        self.reloader = reloader
        self.clock = clock  # the agent's: `last_scan_at` is on its scale
        self.http = http  # the HTTP server's rounds
        self.nvml_problem: str | None = "NVML not initialised yet"
        self.healthz = Checks("healthz", [[("http", self._http_rounds)], [("scan-loop", self._scans)]])
        self.readyz = Checks(
            "readyz",
            [
                [
                    ("nvml", lambda: _problem(self.nvml_problem)),
                    ("pods", lambda: _problem(self.pods.problem())),
                    ("driver-limits", lambda: _problem(self.limits_problem())),
                    ("memory-watch", self._watch),
                ],
                [("scan", self._scanned)],
            ],
            passed="ready",
        )

    def _agent(self) -> Agent | None:
        running = self.started.running()
        return running.agent if running is not None else None

    def _http_rounds(self) -> healthfile.Check:
        age = self.http.age(self.clock.now()) if self.http is not None else None
        if age is not None and age >= PART_STUCK_S:
            return False, f"HTTP server's last round {age:.1f}s ago: stuck"
        return True, ""

    def _scans(self) -> healthfile.Check:
        agent = self._agent()
        if agent is None or agent.last_scan_at is None:
            return True, "starting"
        age = self.clock.now() - agent.last_scan_at
        if age >= max(PART_STUCK_S, 10 * self.poll_interval_s):
            return False, f"last scan {age:.1f}s ago: the scan loop is stuck"
        return True, f"last scan {age:.1f}s ago"

    def _watch(self) -> healthfile.Check:
        agent = self._agent()
        return _problem(agent.watch_problem() if agent is not None else None)

    def _scanned(self) -> healthfile.Check:
        agent = self._agent()
        if agent is None or agent.last_scan_at is None:
            return False, "no scan completed yet"
        if agent.last_synced_scan_at is None:
            return False, "no scan with the pod list yet"  # the scans so far attributed nothing
        return True, ""

    def last_scan(self) -> LastScan | None:
        """The agent's last completed scan (for /status), None before it has one."""
        agent = self._agent()
        return agent.last_scan if agent is not None else None

    def nvml(self, problem: str | None) -> None:
        """Why NVML is not up (`open_sampler`), or None once it is."""
        self.nvml_problem = problem

    def policy_facts(self) -> PolicyFacts | None:
        """The policy in force for /status, None before the agent is built (its start policy is in the facts)."""
        agent = self._agent()
        if agent is None:
            return None
        invalid, checks = self.reloader.looked if self.reloader is not None else (None, 0)
        return PolicyFacts(agent.policy.mode.value, agent.policy_digest, invalid, agent.restart_needed, checks)

    def driver_facts(self) -> DriverFacts:
        """The NVIDIA side for /status, from what the agent found out (it asks NVML nothing for this): whether the
        driver can hold limits is what the limiter's probe found, where the agent uses them."""
        running = self.started.running()
        if running is None:
            return with_limits(nvidia_side(None), None, "not known yet: the agent is starting")
        if running.agent.limiter is None:
            return with_limits(running.driver, None, LIMITS_UNASKED)
        return with_limits(running.driver, running.agent.limiter.support(), "not known yet: asked at the first scan")

    def limits_problem(self) -> str | None:
        """With `driver_limits: require` (in the policy in force), why the driver cannot hold this node's quotas, or
        None."""
        agent = self._agent()
        if agent is None or agent.policy.driver_limits is not DriverLimits.REQUIRE:
            return None
        limiter = agent.limiter
        if limiter is None and "driver_limits" in agent.restart_needed:
            return "driver limits required by the reloaded policy: they apply after a restart of the agent"
        if limiter is None:
            return "driver limits required, but never applied in warn mode or with --dry-run"
        if limiter.unavailable is not None:
            return f"driver limits required: {limiter.unavailable}"
        unsupported = limiter.unsupported_gpus()
        if unsupported:
            return "driver limits required: " + "; ".join(unsupported[g] for g in sorted(unsupported))
        return None


@dataclass(frozen=True)
class RunConfig:
    """`vramguard run`'s flags, checked: the scanning parts' (`scan`) and the serving ones'."""

    scan: ScanSetup
    poll_interval_s: float
    metrics_port: int
    health_file: str  # where the kubelet's exec probes read liveness and readiness; "" writes none
    metrics_bind_address: str
    advertise_capacity: bool
    capacity_reserve_bytes: int
    state_dir: str
    status_command_lines: bool = False  # /status shows whole command lines (else the program's name)
    # The policy file, watched for changes (`reload.py`): each goes through the same overrides as `scan.policy` did.
    policy_path: Path | None = None
    overrides: Overrides = field(default_factory=Overrides)
    policy_digest: str | None = None  # the hash of the content `scan.policy` was read from


def agent_facts(config: RunConfig) -> AgentFacts:
    """What /status says of the agent itself."""
    return AgentFacts(
        version=__version__,
        node=config.scan.node_name or "",
        mode=config.scan.policy.mode.value,
        dry_run=config.scan.dry_run,
        poll_interval_s=config.poll_interval_s,
    )


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An Event set by SIGTERM, SIGINT or SIGHUP (whose default would end the agent mid-kill), for the block."""
    stop = threading.Event()
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in signals}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def serve(config: RunConfig, stop: threading.Event, clock: Clock = SYSTEM_CLOCK) -> None:
    """Run the agent until `stop`: start the cluster's parts and the probes and metrics, wait for NVML, start the
    enforcement parts, scan; then stop everything in reverse within `SHUTDOWN_BUDGET_S`."""
    log = structlog.get_logger(__name__)
    setup = config.scan
    if config.advertise_capacity and setup.pods_file is not None:
        raise WiringError("--advertise-capacity needs the API server, not --pods-file")
    open_files = raise_open_file_limit()
    journal = None if setup.dry_run else freeze_journal(config.state_dir, setup.cgroup_root, setup.kubelet)
    metrics = Metrics()
    # What earlier agents on this node saw the API server give its pods: a restarted agent still reclaims those.
    cluster = connect(setup, metrics, clock, ApiUids(None if setup.dry_run else config.state_dir))
    capacity = capacity_publisher(
        cluster, setup.node_name, config.capacity_reserve_bytes, config.advertise_capacity, setup.dry_run, clock
    )
    http_rounds = Heartbeat()
    reloader = policy_reloader(config, metrics, clock)
    started = Started()  # the agent and the driver's facts, once NVML is up
    probes = Probes(
        cluster.pods,
        config.poll_interval_s,
        started=started,
        reloader=reloader,
        clock=clock,
        http=http_rounds,
    )
    # /status says whose each process is, as `vramguard top` does; its program's name unless told otherwise.
    describe = describer(setup.proc_root, config.status_command_lines)
    status = StatusPage(
        agent_facts(config),
        probes.last_scan,
        clock,
        describe=describe,
        driver=probes.driver_facts,
        policy=probes.policy_facts,
    )
    server = HealthServer(
        config.metrics_port,
        metrics.registry,
        probes.healthz,
        probes.readyz,
        host=config.metrics_bind_address,
        status=status.body,
        progress=http_rounds,
        clock=clock,
    )
    services = Services(clock)
    try:
        cluster.start(services)
        if capacity is not None:
            services.start("capacity", capacity)
        services.start("status", status)
        try:
            services.start("http", server)
        except BindError as e:
            where = f"{config.metrics_bind_address or '*'}:{e.port}"
            raise WiringError(f"cannot serve /metrics on {where}: {e.strerror or e}") from None
        if config.health_file:
            services.start("health", HealthWriter(config.health_file, probes.healthz, probes.readyz, clock=clock))
        log.info(
            "starting",
            version=__version__,
            node=setup.node_name,
            mode=setup.policy.mode.value,
            dry_run=setup.dry_run,
            address=f"{config.metrics_bind_address or '*'}:{server.port}",
            health_file=config.health_file or None,
            open_file_limit=open_files[1],
        )
        sampler = open_sampler(setup, services, stop, clock, probes.nvml)
        if sampler is None:
            return
        # What the quotas call for in driver limits, for the scan and for the limiter's new cgroups alike.
        planner = LimitPlanner(cluster.pods, cluster.claims, setup.policy, dry_run=setup.dry_run)
        limiter = driver_limiter(
            planner, setup.policy, setup.dry_run, setup.cgroup_root, services, clock, setup.kubelet
        )
        serving = Serving(
            planner,
            limiter,
            capacity if config.advertise_capacity else None,
            journal,
            # Repeats survive a restart; what was killed is checked against the node's processes when read.
            None if setup.dry_run else KillFile(config.state_dir, proc_root=setup.proc_root, kubelet=setup.kubelet),
            reloader,
            config.policy_digest,
        )
        agent = build_agent(setup, sampler, cluster, metrics, clock, serving)
        services.start("evictions", agent.enforcer)
        if agent.orphan_reads is not None:
            services.start("orphan-reads", agent.orphan_reads)
        if agent.watch is not None:
            services.start("watch", agent.watch)
        if limiter is not None:
            services.start("driver-limits", limiter)
            watch_cgroups(limiter, setup.cgroup_root, services, clock, setup.kubelet)  # after the limiter it feeds
        if reloader is not None:
            services.start("policy-reload", reloader)  # what it reads is taken at the start of each scan
        started.publish(Running(agent, nvidia_side(sampler)))
        agent.run(config.poll_interval_s, stop)
    finally:
        services.stop(SHUTDOWN_BUDGET_S)
        log.info("stopped")
