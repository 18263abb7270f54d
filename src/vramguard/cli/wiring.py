"""Which real part goes behind each of the agent's seams: the scanning parts (`build_agent`, the same for `vramguard
run` and `vramguard top`), and what `serve` adds to them (`Serving`: the driver limiter, the cgroup watch). Every part
is built idle; the caller starts it (`lifecycle.Services`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import structlog

from vramguard.agent.act import Enforcer
from vramguard.agent.loop import Agent
from vramguard.agent.metrics import Metrics
from vramguard.agent.orphan_reads import OrphanReads
from vramguard.agent.reload import PolicyReloader
from vramguard.agent.watch import MemoryWatch, ScanCalls, ScanTrigger
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.lifecycle import Services
from vramguard.cli.cluster import Cluster, scan_calls
from vramguard.cli.config import ScanSetup
from vramguard.cli.gpus import Gpus
from vramguard.core.limit_plan import LimitPlanner, uses_limiter
from vramguard.core.policy import Policy
from vramguard.core.ports import GpuSampler, KillMemory, MemoryLimiter
from vramguard.kube.capacity import KubeCapacityPublisher
from vramguard.node.cgroup import HOST_KUBELET, KubeletTree, v2_root
from vramguard.node.cgroup_tree import CgroupfsTree
from vramguard.node.cgroupwatch import CgroupWatcher, InotifyUnavailable
from vramguard.node.freezes import FreezeJournal
from vramguard.node.identify import ProcIdentifier
from vramguard.node.kill import PidfdKiller
from vramguard.node.limiter import DriverLimiter


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


def build_agent(
    setup: ScanSetup,
    gpus: Gpus,
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
        device_prefix=gpus.device_prefixes(setup),
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
        sampler=gpus,
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
        watch=memory_watch(gpus, setup.policy, metrics, clock, cluster.scan_calls),
        clock=clock,
        reloads=serves.reloads,
        exited_hold_s=setup.exited_hold_s,
        # Only the agent that runs confirms orphans: `top` never counts memory orphaned.
        orphan_reads=OrphanReads(cluster.pods, clock=clock) if serving is not None else None,
        api_uids=cluster.api_uids,
    )


def memory_watch(
    sampler: GpuSampler, policy: Policy, metrics: Metrics, clock: Clock, calls: ScanCalls | None = None
) -> MemoryWatch | None:
    """The watch between scans (not started: `serve` starts it with the loop), posting to `calls` (the cluster's,
    which its pod sources post to as well), None with `watch_interval: 0s`."""
    if policy.watch_interval_s <= 0:
        return None
    if calls is None:
        calls = scan_calls(policy, metrics, clock)
    return MemoryWatch(sampler.memory, ScanTrigger(policy), policy.watch_interval_s, clock, calls=calls)


def driver_limiter(
    planner: LimitPlanner,
    policy: Policy,
    dry_run: bool,
    cgroup_root: str,
    memory: Callable[[], MemoryLimiter],
    clock: Clock = SYSTEM_CLOCK,
    kubelet: KubeletTree = HOST_KUBELET,
) -> DriverLimiter | None:
    """The driver-limits programmer (not started), where the policy enforces anywhere (evict or kill) and allows
    them; None in --dry-run, with `driver_limits: off`, or with a warn-only policy. A cgroup that appears is
    programmed from `planner`, the agent's, which reads the sources fresh. The limits go through what `memory`
    makes (`gpus.memory_limiter`: NVIDIA's driver, the kernel's dmem controller), only made where they are used."""
    if not uses_limiter(policy, dry_run):
        return None
    return DriverLimiter(memory(), clock=clock, plan=planner.plan, tree=CgroupfsTree(cgroup_root, kubelet))


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
    watcher = CgroupWatcher(root, limiter.appeared, clock=clock, kubelet=kubelet)
    log = structlog.get_logger(__name__)
    try:
        services.start("cgroup-watch", watcher)
    except InotifyUnavailable as e:
        log.warning("cgroup_watch_unavailable", reason=str(e), fallback="reconcile")
        return
    limiter.watched()
    log.info("cgroup_watch", root=root)
