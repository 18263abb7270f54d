"""Carrying out decided actions through the seams: Events, eviction, killing. Dry-run turns each into a report.

Every Event the agent writes leaves from here (`execute`, `collect`, `report_invalid`, `report_limits`,
`report_pressure`), so dry-run is decided in one place. The Enforcer never decides: it does what an `Action`
says, the way the policy says, and reports a result for each; a failing seam is a result, not an exception.
Killing is local and happens on the scan; an eviction is an API call made off the scan (`base/offscan.py`, on the
Enforcer's worker: `start()`, `stop(deadline)`), its outcome returned by a later `collect`, or counted as failed
once `policy.eviction_timeout_s` passes without an answer. An eviction given up so is never sent if it has not been
yet (it may be queued behind a frozen API server's requests); one already sent is still the pod's eviction: no
other of the pod is sent before its answer, and an acceptance is reported when it comes, so that the decision core
holds the pod's next eviction (`decide.spacing_hold`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog

from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.offscan import Ending, Fate, OffScanCalls
from vramguard.base.worker import Runner, Worker
from vramguard.core.actions import Action, PressureNotice, Violation
from vramguard.core.driver_limit import LimitOutcome, LimitResult
from vramguard.core.exited import HeldByExited
from vramguard.core.orphans import Orphan
from vramguard.core.pod import EventSubject, NodeRef, PodInfo
from vramguard.core.policy import ActionKind, EvictionRefused, Policy
from vramguard.core.ports import EventRecorder, Evictor, EvictResult, Killer, KillResult
from vramguard.core.quantity import format_duration
from vramguard.core.quota import invalid_message
from vramguard.core.sample import GpuDevice, GpuSample
from vramguard.core.sources import QuotaError
from vramguard.core.text import cut, format_bytes

# Event reasons, as they appear on the pod (`kubectl describe pod`).
EVENT_EXCEEDED = "VRAMQuotaExceeded"
EVENT_EVICTED = "VRAMEvicted"
EVENT_EVICTION_REFUSED = "VRAMEvictionRefused"  # a PodDisruptionBudget said no, or the pod is static
EVENT_EVICTION_FAILED = "VRAMEvictionFailed"  # no answer, or an error from the API server
EVENT_KILLED = "VRAMKilled"
EVENT_INVALID = "VRAMQuotaInvalid"
EVENT_LIMIT_APPLIED = "VRAMLimitApplied"  # Normal: the driver now holds the container to its quota
EVENT_LIMIT_FAILED = "VRAMLimitFailed"  # the driver could not: the agent enforces the quota itself
EVENT_LIMIT_LATE = "VRAMLimitLate"  # the container ran before the driver held its limit (agent restart, missed cgroup)
EVENT_LIMIT_TOOLKIT = "VRAMLimitSetByToolkit"  # Normal: NVIDIA's container toolkit set the limit there; left alone
EVENT_PRESSURE = "VRAMPressure"  # a GPU the pod uses entered memory pressure: who is over their quota there
EVENT_NEEDS_RESET = "VRAMGPUNeedsReset"  # on the Node: exited processes hold GPU memory only a reset frees
EVENT_ORPHAN_RECLAIMED = "VRAMOrphanReclaimed"  # on the Node: the processes of a pod that is gone, killed
EVENT_ORPHAN_FOUND = "VRAMOrphanFound"  # on the Node: such processes, reported (orphans: report, or warn mode)
STATIC_REFUSAL = (
    "a static pod cannot be evicted (the kubelet runs it from a manifest on the node; evicting it would delete "
    "its mirror pod alone)"
)
# What was done to a pod: written ahead of warnings, never crowded out by them (`EventRecorder.record`).
ENFORCEMENT_EVENTS = frozenset(
    {EVENT_KILLED, EVENT_EVICTED, EVENT_EVICTION_REFUSED, EVENT_EVICTION_FAILED, EVENT_ORPHAN_RECLAIMED}
)


class ActionResult(str, enum.Enum):
    """What one action came to (`Outcome.result`): the `result` label of vramguard_actions_total. The Enforcer
    produces every one; metrics iterate them (`ends`), so a result added here is exported at 0 with no second list."""

    OK = "ok"
    DRY_RUN = "dry-run"
    FAILED = "failed"  # a seam raised, an eviction had no answer or an error, or killed processes did not exit
    NOTHING_TO_KILL = "nothing-to-kill"  # the killer found no process it may signal
    MEMORY_NOT_FREED = "memory-not-freed"  # killed, and yet /proc or NVML shows the container's processes there
    GONE = "gone"  # the pod to evict no longer exists
    REFUSED = "refused"  # an eviction refused (a PodDisruptionBudget, a static pod); on_eviction_refused: wait
    REFUSED_THEN_KILLED = "refused-then-killed"  # on_eviction_refused: kill
    FAILED_THEN_KILLED = "failed-then-killed"  # an eviction failed (no answer, an error); on_eviction_refused: kill

    def ends(self, kind: ActionKind) -> bool:
        """Whether an action of `kind` can end in this result: a warning is written or not; a kill may find
        nothing to kill or leave memory behind; an eviction may end in any result, a kill's included."""
        if self in (ActionResult.OK, ActionResult.DRY_RUN, ActionResult.FAILED):
            return True
        if self in (ActionResult.NOTHING_TO_KILL, ActionResult.MEMORY_NOT_FREED):
            return kind is not ActionKind.WARN
        return kind is ActionKind.EVICT


class OrphanResult(str, enum.Enum):
    """What acting on one orphan came to (`OrphanOutcome.result`): the `result` label of
    vramguard_orphan_reclaims_total, each exported at 0 from the start."""

    OK = "ok"
    FAILED = "failed"
    NOTHING_TO_KILL = "nothing-to-kill"
    MEMORY_NOT_FREED = "memory-not-freed"
    REPORTED = "reported"  # the policy reports orphans (orphans: report, warn mode, an exempt namespace)
    DRY_RUN = "dry-run"


@dataclass(frozen=True, slots=True)
class OrphanOutcome:
    """What happened to one orphan."""

    orphan: Orphan
    result: OrphanResult
    detail: str = ""
    kill: KillResult | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to one action."""

    action: Action
    result: ActionResult
    detail: str = ""
    kill: KillResult | None = None

    @property
    def action_name(self) -> str:
        return self.action.kind.value

    @property
    def kill_finished(self) -> bool:
        """A kill that signalled processes and saw them exit, and after which /proc shows none of the container's
        processes holding the GPU: whether NVML agrees is what `confirm_freed` checks."""
        return self.kill is not None and self.kill.ok


class Enforcer:
    def __init__(
        self,
        *,
        killer: Killer,
        evictor: Evictor,
        events: EventRecorder,
        policy: Policy,
        dry_run: bool = False,
        log: structlog.typing.FilteringBoundLogger | None = None,
        clock: Clock = SYSTEM_CLOCK,
        evictions: Runner | None = None,
        node_name: str | None = None,
    ) -> None:
        """`evictions` runs eviction calls; by default a worker thread with room for 16 queued evictions, which
        `start()` starts. `clock` times the evictions' answers (the scan's clock). `node_name`: the Node that GPU
        faults are reported on (None: the log alone says them)."""
        self.node = NodeRef(node_name) if node_name else None
        self.killer = killer
        self.evictor = evictor
        self.events = events
        self.policy = policy
        self.dry_run = dry_run
        self.log = log if log is not None else structlog.get_logger(__name__)
        self.clock = clock
        runner = evictions if evictions is not None else Worker("vramguard-evict", max_queue=16, clock=clock)
        # By pod UID; waited for as long as the policy in force says, a reloaded one included.
        self._evictions: OffScanCalls[Action, EvictResult] = OffScanCalls(
            runner, lambda: self.policy.eviction_timeout_s
        )

    def execute(self, action: Action) -> Outcome | None:
        """Carry out `action`; its outcome, or None for an eviction now in flight (see `collect`)."""
        if self.dry_run:
            return Outcome(action, ActionResult.DRY_RUN, f"would {action.kind.value}: {action.message}")
        try:
            if action.kind is ActionKind.WARN:
                self._event(action, EVENT_EXCEEDED, action.message)
                return Outcome(action, ActionResult.OK)
            if action.kind is ActionKind.EVICT:
                return self._start_eviction(action)
            return self._kill(action)
        except Exception as e:  # a seam failed: report it and keep the loop alive
            self.log.error("action_failed", action=action.kind.value, pod=action.pod.key, error=repr(e))
            return Outcome(action, ActionResult.FAILED, repr(e))

    def report_invalid(self, pod: PodInfo, error: QuotaError) -> None:
        """An invalid quota value: a log line and a VRAMQuotaInvalid Event naming the field, the value (bounded)
        and what applies instead."""
        self.log.warning(
            "quota_invalid",
            pod=pod.key,
            field=error.field,
            value=error.value,
            error=error.message,
            applies=error.applies,
        )
        self._record(pod, EVENT_INVALID, invalid_message(error))

    def report_pressure(self, notices: Iterable[PressureNotice]) -> None:
        """A VRAMPressure Warning on each pod told that a GPU it uses entered memory pressure."""
        for notice in notices:
            self._record(notice.pod, EVENT_PRESSURE, cut(notice.message, 1024))

    def report_needs_reset(self, onsets: Iterable[HeldByExited], devices: Iterable[GpuDevice], hold_s: float) -> None:
        """A VRAMGPUNeedsReset Warning on the Node for each GPU whose memory exited processes came to hold past a
        teardown (`core/exited.py`): called once per onset, so one Event each, whatever the scans in between."""
        if self.node is None:
            return
        by_uuid = {d.uuid: d for d in devices}
        for h in onsets:
            device = by_uuid.get(h.device_uuid)
            gpu = device.label if device is not None else h.device_uuid
            index = device.index if device is not None else gpu
            pids = ", ".join(str(p) for p in h.pids[:16]) + (", ..." if len(h.pids) > 16 else "")
            message = (
                f"GPU {gpu} ({h.device_uuid}) needs a reset: {format_bytes(h.held_bytes)} held by exited processes "
                f"(PIDs {pids}, listed with no process for {format_duration(hold_s)} or more): nothing is left to "
                f"kill. Drain the node, then reset the GPU (nvidia-smi --gpu-reset -i {index})"
            )
            self._record(self.node, EVENT_NEEDS_RESET, cut(message, 1024))

    def handle_orphan(self, orphan: Orphan, devices: Iterable[GpuDevice], reclaim: bool) -> OrphanOutcome:
        """Reclaim an orphan (`reclaim`: kill its processes through the killer, every check of it) or report it:
        a Warning on the Node either way, naming the pod (where the agent saw it), the PIDs, the bytes and GPUs."""
        where = _held_where(orphan, devices)
        pids = _pids(orphan.pids)
        if not reclaim or self.dry_run:
            how = "would kill them (--dry-run)" if reclaim else "reported, not killed (orphans: report)"
            message = f"{orphan.subject} is gone; its processes (PIDs {pids}) still hold {where}: {how}"
            self._record_node(EVENT_ORPHAN_FOUND, message)
            return OrphanOutcome(orphan, OrphanResult.DRY_RUN if reclaim else OrphanResult.REPORTED, message)
        target = orphan.target
        if not target.processes:
            why = "its processes are in the pod's own cgroup, in no container: nothing the killer may signal"
            self._record_node(EVENT_ORPHAN_FOUND, f"{orphan.subject} is gone; PIDs {pids} still hold {where}: {why}")
            return OrphanOutcome(orphan, OrphanResult.NOTHING_TO_KILL, why)
        try:
            kill = self.killer.kill(target)
        except Exception as e:  # a seam failed: report it and keep the loop alive
            self.log.error("orphan_reclaim_failed", pod_uid=orphan.pod_uid, error=repr(e))
            return OrphanOutcome(orphan, OrphanResult.FAILED, repr(e))
        if not kill.killed:
            why = "; ".join(f"{ref.pid}: {reason}" for ref, reason in kill.skipped[:10]) or "no GPU process found"
            return OrphanOutcome(orphan, OrphanResult.NOTHING_TO_KILL, why, kill)
        killed = _pids(tuple(ref.pid for ref in kill.killed))
        message = f"{orphan.subject} is gone; killed the processes it left holding {where}: PIDs {killed}"
        self._record_node(EVENT_ORPHAN_RECLAIMED, message)
        if kill.remaining:
            left = _pids(tuple(sorted(ref.pid for ref in kill.remaining)))
            return OrphanOutcome(orphan, OrphanResult.MEMORY_NOT_FREED, f"PIDs {left} still hold the GPU", kill)
        if not kill.exited:
            return OrphanOutcome(orphan, OrphanResult.FAILED, "processes did not exit before the deadline", kill)
        return OrphanOutcome(orphan, OrphanResult.OK, "", kill)

    def _record_node(self, reason: str, message: str) -> None:
        if self.node is None:
            self.log.warning("event", node=None, reason=reason, message=message)
            return
        self._record(self.node, reason, cut(message, 1024))

    def collect(self) -> list[Outcome]:
        """Outcomes of the evictions answered since the last call, and of those left unanswered too long; and of
        an abandoned one that the API server accepted after all (the pod is being evicted)."""
        outcomes: list[Outcome] = []
        for end in self._evictions.collect(self.clock.now()):
            action = end.call.about
            if end.fate is Fate.NOT_MADE:
                self.log.info("eviction_not_sent", pod=action.pod.key, why="abandoned")
            elif end.fate is Fate.ANSWERED:
                outcomes.append(self._finish_eviction(action, _answer(end)))
            elif end.fate is Fate.LATE:
                if (result := _answer(end)).evicted:
                    outcomes.append(self._accepted_late(action, result))
                else:
                    ticket = end.call.ticket
                    self.log.info("eviction_answer_too_late", ticket=ticket, evicted=False, detail=result.message)
            else:
                waited = format_duration(self.policy.eviction_timeout_s)
                result = EvictResult(evicted=False, refused=False, message=f"no answer from the API server in {waited}")
                outcomes.append(self._finish_eviction(action, result))
        return outcomes

    def evictions_in_flight(self) -> int:
        return self._evictions.waiting()

    def _accepted_late(self, action: Action, result: EvictResult) -> Outcome:
        """An abandoned eviction accepted after all: reported, since the pod is being evicted."""
        waited = format_duration(self.policy.eviction_timeout_s)
        self.log.info("eviction_accepted_late", pod=action.pod.key, detail=result.message)
        answered = EvictResult(evicted=True, refused=False, message=f"accepted after more than {waited}")
        return self._finish_eviction(action, answered)

    def start(self) -> None:
        """Start the eviction worker."""
        self._evictions.start()

    def stop(self, deadline: float) -> None:
        """Stop the eviction worker; an eviction in flight at `deadline` is abandoned (its request has a timeout)."""
        self._evictions.stop(deadline)

    # -- eviction --------------------------------------------------------------------------------------------

    def _start_eviction(self, action: Action) -> Outcome | None:
        pod = action.pod
        if pod.static:
            # The API server would delete the mirror pod alone, and the kubelet would put it back: nothing can
            # evict a static pod, so its eviction is refused here, without a request, and on_eviction_refused applies.
            return self._finish_eviction(action, EvictResult(evicted=False, refused=True, message=STATIC_REFUSAL))
        if self._evictions.waiting(pod.uid):
            return None  # one eviction per pod at a time; the first one's outcome will be reported
        if self._evictions.unfinished(pod.uid):
            # Two of the pod's evictions on the worker would both be sent once the API server answers again.
            unanswered = EvictResult(evicted=False, refused=False, message="its last eviction is still unanswered")
            return self._finish_eviction(action, unanswered)

        def evict() -> EvictResult:
            return self.evictor.evict(pod, action.message)

        if self._evictions.submit(pod.uid, action, evict, self.clock.now()) is not None:
            return None
        return self._finish_eviction(
            action, EvictResult(evicted=False, refused=False, message="too many evictions in flight")
        )

    def _finish_eviction(self, action: Action, result: EvictResult) -> Outcome:
        if result.evicted:
            came_back = f"{action.escalation.came_back}: " if action.escalation is not None else ""
            self._event(action, EVENT_EVICTED, f"{came_back}evicted: {action.message}")
            return Outcome(action, ActionResult.OK, result.message)
        if result.gone:
            return Outcome(action, ActionResult.GONE, result.message)
        refused = result.refused
        then_kill = self.policy.on_eviction_refused is EvictionRefused.KILL
        what = "eviction refused" if refused else "eviction failed"
        next_step = "killing its GPU processes" if then_kill else "it keeps running (on_eviction_refused: wait)"
        self._event(
            action,
            EVENT_EVICTION_REFUSED if refused else EVENT_EVICTION_FAILED,
            f"{what}: {result.message}; {next_step}: {action.message}",
        )
        if not then_kill:
            return Outcome(action, ActionResult.REFUSED if refused else ActionResult.FAILED, result.message)
        killed = ActionResult.REFUSED_THEN_KILLED if refused else ActionResult.FAILED_THEN_KILLED
        try:
            return self._kill(action, after=f"{what}: {result.message}", result=killed)
        except Exception as e:
            self.log.error("action_failed", action="kill", pod=action.pod.key, error=repr(e))
            return Outcome(action, ActionResult.FAILED, repr(e))

    # -- killing ---------------------------------------------------------------------------------------------

    def _kill(self, action: Action, *, after: str = "", result: ActionResult = ActionResult.OK) -> Outcome:
        # A repeat takes every process of the container, so that its supervisor cannot respawn GPU workers again.
        whole = action.escalation is not None
        kill = self.killer.kill(action.violation.target, every_process=whole)
        if not kill.killed:
            why = "; ".join(f"{ref.pid}: {reason}" for ref, reason in kill.skipped[:10]) or "no GPU process found"
            if len(kill.skipped) > 10:
                why += f"; and {len(kill.skipped) - 10} more"
            return Outcome(action, ActionResult.NOTHING_TO_KILL, why, kill)
        pids = ", ".join(str(ref.pid) for ref in kill.killed[:20])
        if len(kill.killed) > 20:
            pids += f" and {len(kill.killed) - 20} more"
        prefix = f"{after}; " if after else ""
        if whole:
            assert action.escalation is not None
            prefix += f"{action.escalation.came_back}: stopped the whole container; "
        self._event(action, EVENT_KILLED, f"{prefix}killed PIDs {pids}: {action.message}")
        if kill.remaining:
            left = _pids(tuple(sorted(ref.pid for ref in kill.remaining)))
            return _memory_not_freed(action, kill, f"PIDs {left} of the container still hold the GPU")
        if not kill.exited:
            return Outcome(action, ActionResult.FAILED, "processes did not exit before the deadline", kill)
        return Outcome(action, result, after, kill)

    def _event(self, action: Action, reason: str, message: str) -> None:
        self._record(action.pod, reason, message)

    def report_limits(self, outcomes: Iterable[LimitOutcome]) -> None:
        """One Event per container (or pod-wide quota) for the driver limits just applied, and a Warning for
        those that failed, naming the GPUs."""
        grouped: dict[tuple[str, str | None, LimitResult], list[LimitOutcome]] = {}
        for o in outcomes:
            if o.result in (LimitResult.APPLIED, LimitResult.LATE, LimitResult.FAILED, LimitResult.TOOLKIT):
                grouped.setdefault((o.target.pod.uid, o.target.container, o.result), []).append(o)
        for (_, _, result), group in grouped.items():
            t = group[0].target
            gpus = ", ".join(o.target.gpu for o in group)
            if result is LimitResult.APPLIED:
                message = (
                    f"the {t.holder} now holds {t.subject} to {format_bytes(t.hard_bytes)} on GPU {gpus} ({t.source}): "
                    f"an allocation beyond it fails in this {'container' if t.container is not None else 'pod'} only"
                )
                self._record(t.pod, EVENT_LIMIT_APPLIED, message, warning=False)
            elif result is LimitResult.LATE and t.holder != "driver":
                message = (
                    f"{t.subject} was running before the {t.holder} held its limit; the {t.holder} now holds it to "
                    f"{format_bytes(t.hard_bytes)} on GPU {gpus} ({t.source}): what it allocated before counts "
                    "toward the limit, and an allocation beyond it fails"
                )
                self._record(t.pod, EVENT_LIMIT_LATE, cut(message, 1024))
            elif result is LimitResult.LATE:
                message = (
                    f"{t.subject} was running before the driver held its limit; the driver now holds it to "
                    f"{format_bytes(t.hard_bytes)} on GPU {gpus} ({t.source}). Whether a limit set late binds memory "
                    "allocated before is not documented: vramguard enforces the quota itself, and restarting the pod "
                    "puts the limit in place before its first instruction"
                )
                self._record(t.pod, EVENT_LIMIT_LATE, cut(message, 1024))
            elif result is LimitResult.TOOLKIT:
                message = (
                    f"the driver holds {t.subject} on GPU {gpus} by a limit vramguard did not set: {group[0].detail}"
                )
                self._record(t.pod, EVENT_LIMIT_TOOLKIT, cut(message, 1024), warning=False)
            else:
                message = (
                    f"could not set the {t.holder}'s memory limit for {t.subject} on GPU {gpus}: {group[0].detail}; "
                    "vramguard enforces the quota itself"
                )
                self._record(t.pod, EVENT_LIMIT_FAILED, cut(message, 1024))

    def _record(self, pod: EventSubject, reason: str, message: str, *, warning: bool = True) -> None:
        if self.dry_run:
            self.log.warning("event", pod=pod.key, reason=reason, message=message, dry_run=True)
            return
        try:
            self.events.record(pod, reason, message, warning=warning, important=reason in ENFORCEMENT_EVENTS)
        except Exception as e:  # an Event is a report; failing to queue it must not undo the action
            self.log.warning("event_failed", pod=pod.key, reason=reason, error=repr(e))


def confirm_freed(
    outcomes: tuple[Outcome, ...], after: GpuSample, belongs: Callable[[int, Violation], bool]
) -> tuple[Outcome, ...]:
    """The outcomes, each finished kill (`Outcome.kill_finished`) checked against `after`, an NVML sample taken
    since: a kill frees the memory only when NVML lists neither a killed process nor any other process of the
    violation's containers (`belongs`) on that GPU (a forked child the kill did not reach, a zombie the driver has
    not released). What /proc shows the killer reported already (`KillResult.remaining`)."""
    confirmed = []
    for o in outcomes:
        if o.kill is not None and o.kill_finished:
            v = o.action.violation
            killed = {r.pid for r in o.kill.killed}
            lingering = [
                p.pid
                for p in after.processes
                if p.device_uuid == v.device.uuid and (p.pid in killed or belongs(p.pid, v))
            ]
            if lingering:
                o = _memory_not_freed(
                    o.action, o.kill, f"PIDs {sorted(lingering)} still hold memory on {v.device.uuid}"
                )
        confirmed.append(o)
    return tuple(confirmed)


def _answer(end: Ending[Action, EvictResult]) -> EvictResult:
    """An eviction's answer; an evictor should answer with a result, and an exception is a failure too."""
    if end.value is not None:
        return end.value
    return EvictResult(evicted=False, refused=False, message=f"{type(end.error).__name__}: {end.error}")


def _memory_not_freed(action: Action, kill: KillResult, detail: str) -> Outcome:
    """A kill after which the container's processes still hold GPU memory, as /proc (`KillResult.remaining`) or a
    fresh NVML sample (`confirm_freed`) shows them."""
    return Outcome(action, ActionResult.MEMORY_NOT_FREED, detail, kill)


def _pids(pids: tuple[int, ...]) -> str:
    """At most 20 PIDs, and how many more."""
    shown = ", ".join(str(p) for p in pids[:20])
    return shown + (f" and {len(pids) - 20} more" if len(pids) > 20 else "")


def _held_where(orphan: Orphan, devices: Iterable[GpuDevice]) -> str:
    """ "3GiB on GPU 0 (GPU-...)", per GPU."""
    by_uuid = {d.uuid: d for d in devices}
    parts = []
    for uuid, used in orphan.bytes_by_gpu().items():
        device = by_uuid.get(uuid)
        gpu = f"GPU {device.label} ({uuid})" if device is not None else uuid
        parts.append(f"{format_bytes(used)} on {gpu}")
    return ", ".join(parts) or "no memory NVML counts"
