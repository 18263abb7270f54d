"""The agent's loop: sample → identify → attribute → resolve quotas → (driver limits) → decide → act → report.

This is the only stateful piece, and it is short on purpose: every step is a call into a module that can be read
and tested alone. Side effects and the clock come in through the constructor (kubelet eviction manager style).
`run` is the foreground loop, on the composition root's thread; the Agent has no background part of its own.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Container, Mapping
from types import MappingProxyType

import structlog

from vramguard.agent.act import ActionResult, Enforcer, OrphanOutcome, Outcome, confirm_freed
from vramguard.agent.metrics import Metrics
from vramguard.agent.orphan_reads import OrphanReads
from vramguard.agent.reload import Built, InForce, PolicyReloader
from vramguard.agent.report import LastScan, ScanReport
from vramguard.agent.watch import MemoryWatch
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.logs import FailureRun
from vramguard.core.actions import Action, Violation
from vramguard.core.attribute import attribute, awaited
from vramguard.core.decide import Decision, DecisionState, decide, record_outcomes
from vramguard.core.driver_limit import LimitKey, LimitOutcome, LimitTarget
from vramguard.core.exited import EXITED_HOLD_S, ExitedScan, ExitedTracker
from vramguard.core.limit_plan import LimitPlanner, UsageDisagreement, with_driver_usage
from vramguard.core.orphans import OrphanScan, OrphanTracker
from vramguard.core.peaks import Peak, PeakWindow
from vramguard.core.pod import PodInfo
from vramguard.core.policy import ActionKind, Policy
from vramguard.core.ports import (
    CapacityPublisher,
    ClaimSource,
    GpuSampler,
    KillMemory,
    LimitProgrammer,
    PodSource,
    ProcessIdentifier,
)
from vramguard.core.process import CgroupIdentity
from vramguard.core.quota import PodQuota, QuotaBook
from vramguard.core.sample import GpuSample
from vramguard.core.snapshot import Snapshot


def settle_heap() -> None:
    """Exempt everything start-up allocated (modules, clients, caches) from the cyclic garbage collector.

    Each scan allocates a few thousand short-lived objects, so the collector runs often, and every hundred scans
    or so a full collection walks the whole heap: measured on 8 GPUs x 64 processes, that made the scan p99
    14 ms against a 2 ms median (bench/scan.py). Frozen objects are still freed by reference counting.
    """
    gc.collect()
    gc.freeze()


class Agent:
    def __init__(
        self,
        *,
        sampler: GpuSampler,
        identifier: ProcessIdentifier,
        pods: PodSource,
        policy: Policy,
        enforcer: Enforcer,
        metrics: Metrics,
        clock: Clock = SYSTEM_CLOCK,
        log: structlog.typing.FilteringBoundLogger | None = None,
        agent_pid: int | None = None,
        capacity: CapacityPublisher | None = None,
        limiter: LimitProgrammer | None = None,
        planner: LimitPlanner | None = None,
        claims: ClaimSource | None = None,
        kill_memory: KillMemory | None = None,
        watch: MemoryWatch | None = None,
        reloads: PolicyReloader | None = None,
        exited_hold_s: float = EXITED_HOLD_S,
        orphan_reads: OrphanReads | None = None,
        api_uids: Container[str] = frozenset(),
    ) -> None:
        self.sampler = sampler
        self.identifier = identifier
        self.pods = pods
        self.policy = policy
        self.enforcer = enforcer
        self.metrics = metrics
        self.capacity = capacity
        self.limiter = limiter  # None: no driver limits (warn-only policy, --dry-run, driver_limits: off)
        # The driver limits the quotas call for; the limiter is handed the same planner, for the cgroups that appear.
        self.planner = planner if planner is not None else LimitPlanner(pods, claims, policy, dry_run=enforcer.dry_run)
        self.claims = claims  # None: no claim quota source in the policy
        self.watch = watch  # None: no watch between scans (scans on the poll alone)
        self.reloads = reloads  # None: the policy is the one given here for the agent's life
        self.built = Built(claims is not None, limiter is not None, watch is not None, enforcer.dry_run)
        if reloads is not None:  # the parts here that hold policy, in the order a reload reaches them
            reloads.register("scan", self._use_policy)
            reloads.register("limit-planner", lambda in_force: self.planner.use(in_force.policy))
            reloads.register("enforcer", self._use_enforcer_policy)
            if watch is not None:
                reloads.register("memory-watch", lambda in_force: watch.retune(in_force.policy))
        if watch is not None:  # said at each scrape, as /readyz says it
            metrics.watch_stuck.set_function(lambda: self.watch_problem() is not None)
        self.clock = clock  # the scan's time: decisions, the limiter's targets, the probes' scan age
        self.log = log if log is not None else structlog.get_logger(__name__)
        self.agent_pid = agent_pid if agent_pid is not None else os.getpid()
        # The agent finds its own pod the way it finds everyone else's: through its cgroup.
        me = self.identifier.identify(self.agent_pid)
        self.agent_pod_uid = me[1].pod_uid if me is not None and isinstance(me[1], CgroupIdentity) else None
        self.quotas = QuotaBook(policy)
        self.peaks = PeakWindow()  # each subject's highest usage over the last minute, for the metric
        self.exited = ExitedTracker(exited_hold_s)  # how long exited PIDs have held GPU memory: a GPU to reset
        # The processes of pods that are gone (`core/orphans.py`): only of pods the API server had (`api_uids`).
        self.orphans = OrphanTracker(api_uids)
        self.orphan_reads = orphan_reads  # None: no fresh reads, so no orphan is ever confirmed (tests, the demo)
        self.kill_memory = kill_memory  # None: kills are forgotten with the process (--dry-run, tests)
        kills = kill_memory.load(self.clock.now()) if kill_memory is not None else {}
        self.state = DecisionState(kills=MappingProxyType(dict(kills)))
        self.last_scan_at: float | None = None
        self.last_scan: LastScan | None = None
        # The last scan that read a current pod list: one before it attributed nothing (what /readyz waits for).
        self.last_synced_scan_at: float | None = None
        self._unhealthy: dict[str, str | None] = {}  # device UUID → error, to log transitions once
        self._watch_stuck = FailureRun()  # the watch stuck in the driver, to log transitions once
        self._disagreeing: set[LimitKey] = set()  # limited containers whose usage NVML rows undercount

    def scan(self) -> ScanReport:
        started = time.perf_counter()  # the scan's duration, for its metric only: no decision reads it
        cpu_started = time.process_time()  # and its CPU (the process's, all threads: the NVML worker's too)
        # 0. A reloaded policy, read and checked off this thread, is in force from here on, in every part holding one.
        if self.reloads is not None:
            self.reloads.apply_pending(self.built)
        # 1. Sample NVML: devices and per-process usage. A failing GPU comes back unhealthy, with no processes.
        sampled_at = self.clock.now()
        sample = self._sample()
        if self.watch is not None:
            self.watch.scanned(sample.devices, sampled_at)  # the watch's readings are compared with this sample's
        if self.capacity is not None:
            self.capacity.publish(sample)  # the node's advertised VRAM: a PATCH only when it changes
        # 2. Identify each process' pod and container from its cgroup (cached by PID and start time).
        identities = self.identifier.scan(p.pid for p in sample.processes)
        # 3. Attribute usage to containers and pods, per device.
        pods_synced = self.pods.synced()
        pods = self.pods.pods()
        self._confirm_orphans(sampled_at)  # before attribution: the processes of a pod just confirmed gone say so
        snapshot = attribute(
            sample,
            identities,
            pods,
            agent_pod_uid=self.agent_pod_uid,
            agent_pid=self.agent_pid,
            orphaned=self.orphans.orphaned(),
        )
        if self.watch is not None:  # a pod update naming what the pod cache lacked calls for a scan
            self.watch.awaiting(awaited(snapshot), self.pods.pods)
        if self.limiter is not None:  # where the driver holds a limit, its count of the cgroup's memory
            snapshot, disagreements = with_driver_usage(snapshot, self.limiter.held(), self.limiter.fresh_usage())
            self._log_disagreements(disagreements)
        # 4. Resolve each pod's quota (once per pod version, and per version of the DRA shares it holds).
        labels = self.pods.node_labels()
        shares = self.claims.shares() if self.claims is not None else None
        quotas, invalid = self.quotas.resolve(pods, labels, shares)
        for pod, error in invalid:
            self.enforcer.report_invalid(pod, error)
        now = self.clock.now()
        # 4b. Driver limits (R615+): hand the limits the quotas call for to the limiter's worker, which programs
        #     them into the driver; the decision below enforces every quota either way.
        if self.limiter is not None:
            wanted = self.planner.wanted(pods, labels, shares, quotas, sample.devices, self.agent_pod_uid)
            self.limiter.update(*wanted, now)
        # 5. Decide, purely (each row's owner worked out once per version of its pod's quota: `QuotaBook.rows`).
        rows = self.quotas.rows(snapshot.containers)
        decision, self.state = decide(snapshot, quotas, self.policy, self.state, now, rows)
        # 6. Act (evictions go to a worker; their outcomes come back in a later scan), then confirm that killed
        #    processes let go of their memory. The pods on a GPU that entered pressure are told who holds it.
        self.enforcer.report_pressure(decision.notices)
        actions = [a for a in decision.actions if a.kind is ActionKind.WARN or self._evidence_holds(a)]
        outcomes = tuple(o for a in actions if (o := self.enforcer.execute(a)) is not None)
        outcomes += tuple(self.enforcer.collect())
        if any(o.kill_finished for o in outcomes):  # a kill is `ok` once NVML, sampled again, agrees
            outcomes = confirm_freed(outcomes, self._sample(), self._belongs_to)
        # What was done goes into the decision's state: a container killed in is watched for a repeat (a supervisor
        # respawning its GPU workers), what was killed there being the evidence a later process is measured against;
        # an accepted eviction holds the pod's next one until the pod is seen going (`decide.spacing_hold`).
        killed = [(o.action, o.kill.killed) for o in outcomes if o.kill is not None and o.kill.killed]
        killed_in = [(c, refs) for action, refs in killed for c in action.violation.container_ids]
        evicted = [
            o.action.pod.uid for o in outcomes if o.action.kind is ActionKind.EVICT and o.result is ActionResult.OK
        ]
        self.state = record_outcomes(self.state, now, killed_in=killed_in, evicted=evicted)
        if killed and self.kill_memory is not None:
            self.kill_memory.save(self.state.kills)
        # 6b. The processes of pods that are gone: reclaimed or reported once confirmed (`core/orphans.py`).
        orphans, orphan_outcomes = self._orphans(snapshot, pods, pods_synced and self.pods.problem() is None, now)
        # 7. Report.
        peaks = self.peaks.observe(snapshot.containers, {d.uuid: d for d in snapshot.devices}, now)
        exited = self.exited.observe(snapshot.unattributed, now)
        duration_s = time.perf_counter() - started
        held = self.limiter.held() if self.limiter is not None else {}  # a copy of the limiter's record
        self._report(snapshot, quotas, decision, outcomes, duration_s, held, peaks, exited, orphans)
        self._report_orphans(orphan_outcomes)
        self.metrics.scan_cpu.inc(time.process_time() - cpu_started)
        self.last_scan_at = now
        if pods_synced:
            self.last_synced_scan_at = now
        report = ScanReport(snapshot, quotas, decision, outcomes, duration_s, self.peaks.highest(now), exited, orphans)
        self.last_scan = LastScan(report, held, self.clock.now())
        return report

    def _confirm_orphans(self, now: float) -> None:
        """Take the answer of a fresh read of the API server, when one came since the last scan."""
        if self.orphan_reads is None or (read := self.orphan_reads.collect(now)) is None:
            return
        lagging = self.orphans.confirm(read)
        if lagging:  # the API server has pods the cache lacked past their grace: a watch delivering late
            self.log.warning("pod_cache_behind", pod_uids=list(lagging[:20]), pods=len(lagging))

    def _orphans(
        self, snapshot: Snapshot, pods: Mapping[str, PodInfo], healthy: bool, now: float
    ) -> tuple[OrphanScan, tuple[OrphanOutcome, ...]]:
        """Follow the pods absent from the cache, ask for a fresh read of the API server once one is past its grace
        (`_confirm_orphans` takes the answer), and act on the confirmed orphans while the cache is healthy, as many
        per scan as the policy allows actions."""
        reads = self.orphan_reads
        policy = self.policy
        scan = self.orphans.observe(
            snapshot.unattributed,
            pods,
            healthy=healthy,
            now=now,
            grace_s=policy.orphan_grace_s,
            agent_pod_uid=self.agent_pod_uid,
        )
        if scan.read_wanted and reads is not None:
            reads.request(now)
        if not scan.healthy:
            return scan, ()
        outcomes: list[OrphanOutcome] = []
        for orphan in scan.orphans:
            if len(outcomes) >= policy.max_actions_per_scan:
                break
            if orphan.due(policy, now):
                outcomes.append(self.enforcer.handle_orphan(orphan, snapshot.devices, orphan.reclaims(policy)))
                self.orphans.acted(orphan.pod_uid, now)
        return scan, tuple(outcomes)

    def _report_orphans(self, outcomes: tuple[OrphanOutcome, ...]) -> None:
        for o in outcomes:
            self.metrics.orphan_reclaims.labels(result=o.result.value).inc()
            orphan = o.orphan
            self.log.warning(
                "orphan_reclaimed" if o.kill is not None and o.kill.killed else "orphan_found",
                result=o.result.value,
                pod_uid=orphan.pod_uid,
                pod=orphan.known.key if orphan.known is not None else None,
                held_bytes=orphan.used_bytes,
                gpus=sorted(orphan.bytes_by_gpu()),
                pids=[r.pid for r in o.kill.killed] if o.kill is not None else list(orphan.pids),
                absent_s=round(self.clock.now() - orphan.absent_since, 1),
                detail=o.detail or None,
            )

    def _use_policy(self, in_force: InForce) -> None:
        """The policy every step of the scan reads (`decide`), and the quotas resolved afresh under it."""
        self.policy = in_force.policy
        self.quotas = QuotaBook(in_force.policy)

    def _use_enforcer_policy(self, in_force: InForce) -> None:
        """The Enforcer's eviction timeout and refusal."""
        self.enforcer.policy = in_force.policy

    def watch_problem(self) -> str | None:
        """Why the watch between scans calls for no scan (stuck in the driver), or None (for /readyz)."""
        return self.watch.problem(self.clock.now()) if self.watch is not None else None

    def run(self, poll_interval_s: float, stop: threading.Event) -> None:
        """Scan every `poll_interval_s` until `stop` is set, on the caller's thread (the composition root's main
        thread), and in between whenever the watch calls for a scan (`watch.py`). A failed scan is logged and
        the loop goes on."""
        settled = False
        while not stop.is_set():
            due = self.clock.now() + poll_interval_s
            self._scan_or_log()
            if not settled:
                settle_heap()
                settled = True
            while self.watch is not None and (reason := self.watch.wait(stop, due)) is not None:
                self.metrics.triggered_scans.labels(reason=reason.value).inc()
                self._scan_or_log()
            self.clock.wait(stop, due - self.clock.now())  # without a watch (with one, `due` has come already)

    def _scan_or_log(self) -> None:
        try:
            self.scan()
        except Exception as e:  # degrade, don't die: the next scan may well succeed
            self.metrics.scans_failed.inc()
            self.log.exception("scan_failed", error=repr(e))

    def _sample(self) -> GpuSample:
        sample = self.sampler.sample()
        self.metrics.count_nvml_errors(sample.errors)
        return sample

    def _evidence_holds(self, action: Action) -> bool:
        """Check the evidence for an eviction or a kill once more, through /proc whatever the cache believes:
        every sampled process of the violation is still the one sampled (PID and start time) and still in the
        pod. A PID recycled since the sample means the usage may have been someone else's: no action this scan,
        the next one decides afresh."""
        v = action.violation
        for ref in v.processes:
            found = self.identifier.identify(ref.pid)
            if found is None:
                continue  # gone since the sample: nothing of it left to act on (the killer reports it)
            if found[0] != ref or not isinstance(found[1], CgroupIdentity) or found[1].pod_uid != v.pod.uid:
                self.log.warning("evidence_changed", pod=v.pod.key, pid=ref.pid, action=action.kind.value)
                return False
        return True

    def _log_disagreements(self, disagreements: tuple[UsageDisagreement, ...]) -> None:
        """Once per container and GPU, when the driver's count of its memory starts to differ from its rows."""
        now = {d.target.key for d in disagreements}
        for d in disagreements:
            if d.target.key not in self._disagreeing:
                self.log.info(
                    "usage_disagrees",
                    pod=d.target.pod.key,
                    container=d.target.container,
                    gpu=d.target.log_gpu,
                    process_rows_bytes=d.rows_bytes,
                    driver_bytes=d.driver_bytes,
                    using="driver",
                )
        self._disagreeing = now

    def _report_limits(self, outcomes: list[LimitOutcome]) -> None:
        self.enforcer.report_limits(outcomes)
        for o in outcomes:
            self.metrics.driver_limit_results.labels(outcome=o.result.value).inc()
            t = o.target
            log = self.log.warning if o.result.warns else self.log.info
            log(
                "driver_limit",
                result=o.result.value,
                pod=t.pod.key,
                container=t.container,
                gpu=t.log_gpu,
                hard_bytes=t.hard_bytes,
                detail=o.detail or None,
            )

    def _report_exited(self, snapshot: Snapshot, exited: ExitedScan) -> None:
        """A GPU whose memory exited processes hold past a teardown: a Warning Event on the Node and a log line once
        per onset, not once per scan; a log line when it is free again (a reset). Nothing is signalled: no process
        is left to signal."""
        for h in exited.onsets:
            device = snapshot.device(h.device_uuid)
            label = device.label if device is not None else h.device_uuid
            self.log.warning(
                "gpu_needs_reset", gpu=label, uuid=h.device_uuid, held_bytes=h.held_bytes, pids=list(h.pids)
            )
        self.enforcer.report_needs_reset(exited.onsets, snapshot.devices, self.exited.hold_s)
        for uuid in exited.cleared:
            device = snapshot.device(uuid)
            self.log.info("gpu_memory_released", gpu=device.label if device is not None else uuid, uuid=uuid)

    def _belongs_to(self, pid: int, v: Violation) -> bool:
        """Whether `pid` is a process of the violation's pod (of one of its containers, when it names them)."""
        found = self.identifier.identify(pid)
        cgroup = found[1] if found is not None else None
        if not isinstance(cgroup, CgroupIdentity) or cgroup.pod_uid != v.pod.uid:
            return False
        return not v.container_ids or cgroup.container_id in v.container_ids

    def _report(
        self,
        snapshot: Snapshot,
        quotas: Mapping[str, PodQuota],
        decision: Decision,
        outcomes: tuple[Outcome, ...],
        duration_s: float,
        held: Mapping[LimitKey, LimitTarget],
        peaks: tuple[Peak, ...] = (),
        exited: ExitedScan | None = None,
        orphans: OrphanScan | None = None,
    ) -> None:
        claims_up = self.claims.problem() is None if self.claims is not None else None
        self.metrics.observe_scan(
            snapshot,
            decision,
            held.values(),
            claims_up,
            peaks,
            exited.held if exited is not None else None,
            orphaned=orphans.bytes_by_gpu() if orphans is not None else None,
        )
        if exited is not None:
            self._report_exited(snapshot, exited)
        self.metrics.scan_duration.observe(duration_s)
        if self.limiter is not None:
            self._report_limits(self.limiter.collect())
            self.metrics.driver_limits_failing.set(self.limiter.failing())
        for o in outcomes:
            self.metrics.actions.labels(action=o.action_name, result=o.result.value).inc()
            step = o.action.repeat_step
            if step is not None:
                self.metrics.escalations.labels(namespace=o.action.pod.namespace, step=step.value).inc()
            v = o.action.violation
            self.log.warning(
                "action",
                action=o.action_name,
                reason=o.action.reason.value,
                result=o.result.value,
                pod=v.pod.key,
                container=v.container,
                gpu=v.device.label,
                used_bytes=v.used_bytes,
                limit_bytes=v.limit_bytes,
                pids=[p.pid for p in (o.kill.killed if o.kill else v.processes)],
                detail=o.detail or None,
                message=o.action.message,
                escalation=o.action.escalation.came_back if o.action.escalation is not None else None,
            )
        for h in decision.held:
            self.log.debug("held", pod=h.violation.pod.key, reason=h.reason.value, why=h.why)
        # A GPU going bad or coming back is logged once per transition, not once per scan.
        unhealthy = {d.uuid: d.error for d in snapshot.devices if not d.healthy}
        for d in snapshot.devices:
            if d.uuid in unhealthy and d.uuid not in self._unhealthy:
                self.log.warning("gpu_unhealthy", gpu=d.label, uuid=d.uuid, error=d.error)
            elif d.uuid not in unhealthy and d.uuid in self._unhealthy:
                self.log.info("gpu_recovered", gpu=d.label, uuid=d.uuid)
        self._unhealthy = unhealthy
        # So is the watch between scans stuck in the driver, and back.
        watch_problem = self.watch_problem()
        if watch_problem is None:
            if self._watch_stuck.ok():
                self.log.info("watch_recovered")
        elif self._watch_stuck.failed("stuck"):
            self.log.warning("watch_stuck", problem=watch_problem)
