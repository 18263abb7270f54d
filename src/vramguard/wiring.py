"""The composition root: which real part goes behind each seam, and the agent's life from start to stop.

`cli.py` turns flags into a `RunConfig`; everything here builds parts from it and never touches a terminal. A
configuration the agent cannot run with raises `WiringError` with a message for the user.
"""

from __future__ import annotations

import os
import resource
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import structlog
from kubernetes.client import ApiClient

from vramguard import __version__
from vramguard.act import Enforcer
from vramguard.agent import Agent
from vramguard.backoff import Backoff
from vramguard.cgroupwatch import CgroupWatcher
from vramguard.freezes import FreezeJournal
from vramguard.health import HealthServer
from vramguard.identify import ProcIdentifier
from vramguard.kill import PidfdKiller
from vramguard.kube.capacity import KubeCapacityPublisher
from vramguard.kube.claims import KubeClaimSource
from vramguard.kube.client import load_api_client
from vramguard.kube.events import KubeEventRecorder, KubeEventSink
from vramguard.kube.eviction import KubeEvictor
from vramguard.kube.pods import KubePodSource
from vramguard.limiter import DriverLimiter, v2_root
from vramguard.limits import limits_enabled
from vramguard.metrics import Metrics
from vramguard.model import DriverLimits, Mode, PodInfo, Policy
from vramguard.nvml import NvmlMemoryLimiter, NvmlSampler, NvmlUnavailable
from vramguard.pods import FilePodSource
from vramguard.policy import PolicyError, load_policy
from vramguard.ports import EventRecorder, Evictor, EvictResult, PodSource
from vramguard.quota import reads_claims


class WiringError(Exception):
    """The agent cannot start with this configuration; the message says why, for the user."""


class LogEventRecorder:
    """Events when there is no API server to write them to (`--pods-file`): they go to the log instead."""

    def __init__(self) -> None:
        self.log = structlog.get_logger("vramguard.events")

    def record(self, pod: PodInfo, reason: str, message: str, warning: bool = True, important: bool = False) -> None:
        self.log.warning("event", pod=pod.key, reason=reason, message=message)


class NoApiEvictor:
    """Eviction is an API call; with `--pods-file` there is no API server, so every eviction fails, visibly."""

    def evict(self, pod: PodInfo, message: str) -> EvictResult:
        return EvictResult(evicted=False, refused=False, message="no API server: eviction needs the Kubernetes API")


@dataclass
class Cluster:
    """Where pods come from and where Events and evictions go: the API server, or a pods file and the log."""

    pods: FilePodSource | KubePodSource
    events: EventRecorder
    evictor: Evictor
    api: ApiClient | None = None
    claims: KubeClaimSource | FilePodSource | None = None  # with a `claim:` quota source

    def close(self, timeout_s: float) -> None:
        """Stop the background threads, within `timeout_s` in all (a stuck request is abandoned, not awaited)."""
        deadline = time.monotonic() + timeout_s
        if isinstance(self.claims, KubeClaimSource):
            self.claims.stop(max(0.05, (deadline - time.monotonic()) / 3))
        self.pods.stop(max(0.05, deadline - time.monotonic()))
        if isinstance(self.events, KubeEventRecorder):
            self.events.stop(max(0.05, deadline - time.monotonic()))


def policy_for(
    path: Path | None, mode: Mode | None, agent_namespace: str | None, driver_limits: DriverLimits | None = None
) -> Policy:
    """The policy file's policy (defaults without one), with `--mode`, `--driver-limits` and the agent's own
    namespace exempted."""
    try:
        policy = load_policy(path) if path is not None else Policy()
    except PolicyError as e:
        raise WiringError(str(e)) from None
    if mode is not None:
        policy = replace(policy, mode=mode)
    if driver_limits is not None:
        policy = replace(policy, driver_limits=driver_limits)
    if agent_namespace:
        policy = replace(policy, exempt_namespaces=policy.exempt_namespaces | {agent_namespace})
    return policy


def connect(
    pods_file: Path | None,
    kubeconfig: str | None,
    node_name: str | None,
    metrics: Metrics,
    policy: Policy | None = None,
) -> Cluster:
    """The pods file and the log, or the API server (pods watched in the background, Events on a writer, and
    where `policy` reads quotas from DRA claims, this node's ResourceSlices and its pods' claims)."""
    claim_sources = policy is not None and reads_claims(policy.quota_sources)
    if pods_file is not None:
        from_file = FilePodSource(str(pods_file), node_name=node_name).start()
        # The file's ResourceClaims and ResourceSlices, read with its pods.
        return Cluster(from_file, LogEventRecorder(), NoApiEvictor(), claims=from_file if claim_sources else None)
    if not node_name:
        raise WiringError("--node-name (or NODE_NAME) is required to watch this node's pods")
    try:
        api = load_api_client(kubeconfig, node_name)
    except Exception as e:  # the client raises several unrelated types for a bad or missing configuration
        where = kubeconfig or "the in-cluster ServiceAccount"
        raise WiringError(f"cannot load the Kubernetes configuration from {where}: {e}") from None
    events = KubeEventRecorder(
        KubeEventSink(api, node_name), count=lambda result: metrics.events.labels(result=result).inc()
    ).start()

    def count(resource: str, verb: str) -> None:
        metrics.api_requests.labels(resource=resource, verb=verb).inc()

    pods = KubePodSource(api, node_name, count=count).start()
    claims = KubeClaimSource(api, node_name, pods, count=count).start() if claim_sources else None
    return Cluster(pods, events, KubeEvictor(api), api, claims)


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


def build_agent(
    *,
    sampler: NvmlSampler,
    cluster: Cluster,
    policy: Policy,
    dry_run: bool,
    proc_root: str,
    metrics: Metrics,
    cgroup_root: str = "/sys/fs/cgroup",
    device_prefix: str = "/dev/nvidia",
    capacity: KubeCapacityPublisher | None = None,
    limiter: DriverLimiter | None = None,
    journal: FreezeJournal | None = None,
) -> Agent:
    """The loop with its real parts. Dry-run is the Enforcer's business alone (its Events go to the log)."""
    killer = PidfdKiller(proc_root=proc_root, cgroup_root=cgroup_root, device_prefix=device_prefix, journal=journal)
    enforcer = Enforcer(
        killer=killer,
        evictor=cluster.evictor,
        events=cluster.events,
        policy=policy,
        dry_run=dry_run,
    )
    agent = Agent(
        sampler=sampler,
        identifier=ProcIdentifier(proc_root=proc_root),
        pods=cluster.pods,
        policy=policy,
        enforcer=enforcer,
        metrics=metrics,
        capacity=capacity,  # None in dry-run: capacity_publisher makes none
        limiter=limiter,  # None in dry-run: driver_limiter makes none
        claims=cluster.claims,
    )
    if limiter is not None:
        limiter.plan = agent.plan_limits  # a cgroup that appears is programmed from the sources, not the last scan
        limiter.clock = agent.clock.now  # the scan's clock: a limit set after the targets were computed is newer
    return agent


def watch_cgroups(limiter: DriverLimiter | None, cgroup_root: str) -> CgroupWatcher | None:
    """Limits at cgroup creation: the kubelet's cgroup v2 tree watched with inotify, each new pod and container
    cgroup handed to the limiter. None where there is nothing to program or no way to watch (then the limiter
    programs each container once the pod's status names it)."""
    root = v2_root(cgroup_root)
    if limiter is None or root is None:
        return None
    watcher = CgroupWatcher(root, limiter.appeared, tick=limiter.retry_parked)
    problem = watcher.start()
    log = structlog.get_logger("vramguard")
    if problem is not None:
        log.warning("cgroup_watch_unavailable", reason=problem, fallback="reconcile")
        return None
    limiter.watching = True
    log.info("cgroup_watch", root=root)
    return watcher


def driver_limiter(policy: Policy, dry_run: bool, cgroup_root: str) -> DriverLimiter | None:
    """The driver-limits programmer, where the policy enforces anywhere (evict or kill) and allows them; None in
    --dry-run, with `driver_limits: off`, or with a warn-only policy. Call once NVML is up."""
    enforcing = policy.mode is not Mode.WARN or any(
        ns.mode is not None and ns.mode is not Mode.WARN for ns in policy.namespaces.values()
    )
    if not enforcing or not limits_enabled(policy, dry_run):
        return None
    return DriverLimiter(NvmlMemoryLimiter(), cgroup_root)


def capacity_publisher(
    cluster: Cluster, node_name: str | None, reserve_bytes: int, advertise: bool, dry_run: bool
) -> KubeCapacityPublisher | None:
    """The publisher; it withdraws what an earlier run may have advertised when not advertising (in the
    background, like every publish: a failure is logged, never raised, never waited for)."""
    if cluster.api is None or node_name is None or dry_run:
        return None
    publisher = KubeCapacityPublisher(cluster.api, node_name, reserve_bytes)
    if not advertise:
        publisher.withdraw()
    return publisher


def open_sampler(
    proc_root: str, stop: threading.Event, unavailable: Callable[[str | None], None]
) -> NvmlSampler | None:
    """NVML, once it loads: it may come up after the agent (a driver container still installing), so retry with
    back-off until `stop`. `unavailable` hears why it failed, and None once it is up."""
    backoff = Backoff(1.0, 60.0)
    while not stop.is_set():
        try:
            sampler = NvmlSampler(proc_root=proc_root)
        except NvmlUnavailable as e:
            unavailable(str(e))
            stop.wait(backoff.next())
            continue
        unavailable(None)
        return sampler
    return None


class Probes:
    """/healthz: the loop is scanning. /readyz: NVML is up, the pod list is current and a scan completed."""

    def __init__(self, pods: PodSource, poll_interval_s: float, require_limits: bool = False) -> None:
        self.pods = pods
        self.poll_interval_s = poll_interval_s
        self.require_limits = require_limits  # driver_limits: require
        self.agent: Agent | None = None
        self.nvml_problem: str | None = "NVML not initialised yet"

    def healthz(self) -> tuple[bool, str]:
        if self.agent is None or self.agent.last_scan_at is None:
            return True, "starting"
        age = time.monotonic() - self.agent.last_scan_at
        return age < max(30.0, 10 * self.poll_interval_s), f"last scan {age:.1f}s ago"

    def readyz(self) -> tuple[bool, str]:
        problems = [p for p in (self.nvml_problem, self.pods.problem(), self.limits_problem()) if p]
        if not problems and (self.agent is None or self.agent.last_scan_at is None):
            problems.append("no scan completed yet")
        return (not problems), "; ".join(problems) or "ready"

    def limits_problem(self) -> str | None:
        """With `driver_limits: require`, why the driver cannot hold this node's quotas, or None."""
        if not self.require_limits or self.agent is None:
            return None
        limiter = self.agent.limiter
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
    """`vramguard run`'s flags, checked."""

    node_name: str | None
    policy: Policy
    dry_run: bool
    poll_interval_s: float
    metrics_port: int
    metrics_bind_address: str
    proc_root: str
    cgroup_root: str
    pods_file: Path | None
    kubeconfig: str | None
    advertise_capacity: bool
    capacity_reserve_bytes: int
    device_prefix: str
    state_dir: str


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


def freeze_journal(state_dir: str) -> FreezeJournal | None:
    """The journal of this agent's freezes, after thawing every container an earlier agent left frozen (killed
    mid-kill); None, and no freezing, where the state directory cannot be used."""
    log = structlog.get_logger("vramguard")
    journal = FreezeJournal(f"{state_dir.rstrip('/')}/freezes")
    try:
        os.makedirs(journal.directory, mode=0o700, exist_ok=True)
        left = journal.thaw_abandoned()
    except OSError as e:
        log.error(
            "freeze_journal_unavailable", directory=journal.directory, error=e.strerror or repr(e), freezing=False
        )
        return None
    for entry, outcome in left:
        log.warning("abandoned_freeze", cgroup=entry.cgroup, frozen_by_pid=entry.pid, outcome=outcome)
    return journal


def serve(config: RunConfig, stop: threading.Event) -> None:
    """Run the agent until `stop`: connect, serve the probes and metrics, wait for NVML, scan, shut down."""
    log = structlog.get_logger("vramguard")
    if config.advertise_capacity and config.pods_file is not None:
        raise WiringError("--advertise-capacity needs the API server, not --pods-file")
    open_files = raise_open_file_limit()
    journal = None if config.dry_run else freeze_journal(config.state_dir)
    metrics = Metrics()
    cluster = connect(config.pods_file, config.kubeconfig, config.node_name, metrics, config.policy)
    capacity = capacity_publisher(
        cluster, config.node_name, config.capacity_reserve_bytes, config.advertise_capacity, config.dry_run
    )
    probes = Probes(
        cluster.pods, config.poll_interval_s, require_limits=config.policy.driver_limits is DriverLimits.REQUIRE
    )
    server = HealthServer(
        config.metrics_port, metrics.registry, probes.healthz, probes.readyz, host=config.metrics_bind_address
    )
    log.info(
        "starting",
        version=__version__,
        node=config.node_name,
        mode=config.policy.mode.value,
        dry_run=config.dry_run,
        address=f"{config.metrics_bind_address or '*'}:{server.port}",
        open_file_limit=open_files[1],
    )

    def nvml_unavailable(problem: str | None) -> None:
        if problem is not None and problem != probes.nvml_problem:
            log.error("nvml_unavailable", error=problem)
        probes.nvml_problem = problem

    sampler = open_sampler(config.proc_root, stop, nvml_unavailable)
    if sampler is not None:
        probes.agent = build_agent(
            sampler=sampler,
            cluster=cluster,
            policy=config.policy,
            dry_run=config.dry_run,
            proc_root=config.proc_root,
            metrics=metrics,
            cgroup_root=config.cgroup_root,
            device_prefix=config.device_prefix,
            capacity=capacity if config.advertise_capacity else None,
            limiter=driver_limiter(config.policy, config.dry_run, config.cgroup_root),
            journal=journal,
        )
        watcher = watch_cgroups(probes.agent.limiter, config.cgroup_root)
        probes.agent.run(config.poll_interval_s, stop)
        if watcher is not None:
            watcher.stop(0.1)
    # Shutting down never waits on the API server: every background thread gets a fraction of a second, and
    # one stuck in a request is abandoned (they are daemons). SIGTERM ends the agent within 2 s.
    if probes.agent is not None:
        probes.agent.enforcer.close(0.3)
        if probes.agent.limiter is not None:
            probes.agent.limiter.close(0.2)
    if capacity is not None:
        capacity.stop(0.2)
    cluster.close(0.6)
    if sampler is not None:
        sampler.close()
    server.close()
    log.info("stopped")
