"""Programs the driver's per-cgroup memory limits (`limit_plan.LimitTarget`s) on a worker thread.

The scan hands over the limits it wants (`update`, never blocking) and takes back what came of them (`collect`);
the cgroup watcher hands over each new pod and container cgroup (`appeared`). Both put (cgroup, GPU) places on one
reconcile queue (`workqueue.WorkQueue`: de-duplicated, each failing place on its own back-off), which the worker
takes in passes. Everything that touches the file system (through one `cgroup_tree.CgroupTree`) or NVML runs on
the worker, started by `start()` and ended by `stop(deadline)`. See docs/architecture.md "Driver limits: the limiter"
for how it stays idempotent, retries and gives up.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import NoReturn

import structlog

from vramguard.base.backoff import Backoff
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.worker import Runner, Worker
from vramguard.base.workqueue import WorkQueue
from vramguard.core.limit_plan import LimitOutcome, LimitResult, LimitTarget
from vramguard.core.model import CgroupIdentity, ContainerUsage, GpuDevice, SubjectKey
from vramguard.core.ports import LIMIT_MAX, LimitFailed, LimitsSupport, LimitsUnavailable, MemoryLimiter
from vramguard.node.cgroup_tree import CgroupfsTree, CgroupTree


def read_held_limits(
    memory: MemoryLimiter,
    cgroup_root: str,
    containers: Iterable[ContainerUsage],
    devices: Iterable[GpuDevice],
    *,
    tree: CgroupTree | None = None,
) -> dict[SubjectKey, int]:
    """The hard limits the driver holds now for these containers (and their pods' own cgroups), by key: what
    `vramguard top` shows. Empty where the node cannot hold limits. Blocks on NVML: not for the scan loop.
    `tree`: where the cgroups are found, cgroupfs at `cgroup_root` unless given."""
    tree = tree if tree is not None else CgroupfsTree(cgroup_root)
    root = tree.v2_root()
    rows = [u for u in containers if u.container_id]
    if root is None or not rows:
        return {}
    index = {d.uuid: d.index for d in devices if d.mig_index is None}
    located = tree.locate(root, {u.pod.uid for u in rows})
    held: dict[SubjectKey, int] = {}
    for u in rows:
        gpu = index.get(u.device_uuid)
        if gpu is None:
            continue
        for name, container_id in ((u.container, u.container_id), (None, None)):
            path = located.get((u.pod.uid, container_id))
            if path is None or SubjectKey(u.pod.uid, name, u.device_uuid) in held:
                continue
            try:
                found = memory.get(gpu, path)
            except LimitsUnavailable as e:
                if e.whole_driver:
                    return held
                break
            except LimitFailed:
                continue
            if found is not None and found.hard_bytes != LIMIT_MAX:
                held[SubjectKey(u.pod.uid, name, u.device_uuid)] = found.hard_bytes
    return held


def probe_limits(memory: MemoryLimiter, tree: CgroupTree, gpus: Iterable[int]) -> LimitsSupport:
    """Ask the driver for the limits of the cgroup v2 root on each GPU: it holds none there, so a driver that can
    answers NOT_FOUND (None). Blocks on NVML: the limiter's worker and the commands (`vramguard version`) call it."""
    asked = tuple(gpus)
    root = tree.v2_root()
    if root is None:
        return LimitsSupport(asked, unavailable=_no_v2(tree))
    unsupported: dict[int, str] = {}
    unanswered: dict[int, str] = {}
    for gpu in asked:
        try:
            memory.get(gpu, root)
        except LimitsUnavailable as e:
            if e.whole_driver:
                return LimitsSupport(asked, str(e), unsupported, unanswered)
            unsupported[gpu] = str(e)
        except LimitFailed as e:
            unanswered[gpu] = str(e)  # this cgroup only; the containers' own are what matter
    return LimitsSupport(asked, None, unsupported, unanswered)


def _no_v2(tree: CgroupTree) -> str:
    return f"no cgroup v2 hierarchy under {tree.root} (the driver's limits need cgroup v2)"


Planner = Callable[[str], "tuple[LimitTarget, ...] | None"]
"""The limits one pod calls for now, by pod UID, read fresh from the agent's sources (`LimitPlanner.plan`); None
when the pod is not known (yet). Called on the limiter's worker."""

Place = tuple[str, int]
"""Where one limit goes: a cgroup directory (its full path) on a whole GPU (its index)."""

Key = tuple[str, "int | None"]
"""What the limiter's queue holds: a `Place`, a new cgroup whose limits are not looked up yet (no GPU), or `_PLAN`."""

_PLAN: Key = ("", None)  # no cgroup: the scan's targets as a whole, each located and compared


@dataclass(frozen=True, slots=True)
class _Want:
    """The limit a place is to hold, wanted since `at`: by the scan's targets (computed then), or by a cgroup's
    lookup as it appeared. `provisional`: on a container cgroup not identified yet (its pod's not-started
    containers all call for the same limit; the sandbox's cgroup may get it too, harmlessly: it never allocates)."""

    target: LimitTarget
    provisional: bool
    at: float


@dataclass(frozen=True, slots=True)
class _Plan:
    """The scan's latest hand-over: the targets, computed at `computed_at`, and the whole GPUs (for the probe)."""

    targets: tuple[LimitTarget, ...]
    gpus: tuple[int, ...]
    computed_at: float


class DriverLimiter:
    """A reconcile queue (`workqueue.WorkQueue`) of (cgroup, GPU) places, driven in passes by one worker: the scan's
    targets (`update`) and each cgroup that appears (`appeared`) put the places they concern on it, and
    `_reconcile_place` compares what one place should hold with what the driver holds, and sets or clears it; a
    failing call is retried on the place's own back-off. `cgroup_root`: where the cgroups are found (cgroupfs),
    unless a `tree` stands in for them. `plan`: a pod's limits read fresh, for a cgroup the moment it appears
    (without it, the pod's targets as the scan last handed them over)."""

    def __init__(
        self,
        memory: MemoryLimiter,
        cgroup_root: str = "/sys/fs/cgroup",
        *,
        runner: Runner | None = None,
        resync_s: float = 30.0,
        retry_s: float = 2.0,
        max_retry_s: float = 300.0,
        clock: Clock = SYSTEM_CLOCK,
        plan: Planner | None = None,
        log: structlog.typing.FilteringBoundLogger | None = None,
        tree: CgroupTree | None = None,
    ) -> None:
        self.memory = memory
        self.tree = tree if tree is not None else CgroupfsTree(cgroup_root)
        self.runner = runner if runner is not None else Worker("driver-limits", max_queue=1, clock=clock)
        self.resync_s = resync_s
        self.retry_s = retry_s
        # The scan's clock: a limit wanted after the targets were computed (`update`'s `now`) is newer than them.
        self.clock = clock
        self.plan = plan
        self.log = log if log is not None else structlog.get_logger(__name__)
        self.queue: WorkQueue[Key] = WorkQueue(lambda: Backoff(retry_s, max_retry_s), clock)
        self._watched = False  # a `CgroupWatcher` hands over new cgroups (`watched`)
        self._lock = threading.Lock()
        # Under _lock: the scan's latest targets; the cgroups handed over and not looked up yet, with when they
        # appeared; those seen created (a process in one when its limit goes on started with it: not "late").
        self._plan: _Plan | None = None
        self._new: dict[str, tuple[CgroupIdentity, float]] = {}
        self._fresh: set[str] = set()
        # Under _lock, for the scan: what came of the limits, what the driver holds, the usage read back and by
        # which hand-over, the GPUs that said they cannot (the worker, their one writer, reads them unlocked).
        self._outcomes: list[LimitOutcome] = []
        self._held: dict[SubjectKey, LimitTarget] = {}
        self._usage: dict[SubjectKey, int] = {}
        self._usage_ticket = -1
        self._unsupported_gpus: dict[int, str] = {}
        self._first_answer: LimitsSupport | None = None  # the first probe's, once it came
        self._unavailable: str | None = None  # written once, by the worker, as it gives up
        # The scan's only: the targets last handed over, and the hand-over's ticket (usage counts as fresh only when
        # read by the pass the latest hand-over started).
        self._submitted: tuple[LimitTarget, ...] | None = None
        self._ticket = 0
        # The worker's only: what each place should hold, and what this agent knows the driver holds there; each
        # pod's targets as last handed over; whether the driver was asked yet; the places compared in this pass,
        # and the usage their calls read back.
        self._wanted: dict[Place, _Want] = {}
        self._holds: dict[Place, _Want] = {}
        self._latest: dict[str, tuple[LimitTarget, ...]] = {}
        self._probed = False
        self._compared: set[Place] = set()
        self._read: dict[SubjectKey, int] = {}

    # -- the loop's side ---------------------------------------------------------------------------------------

    def update(self, targets: tuple[LimitTarget, ...], gpus: Iterable[int], now: float) -> None:
        """Hand the limits wanted now to the worker: a change puts the whole plan on the queue (so does the resync,
        every `resync_s`); every call starts a pass, which retries the failing limits that are due and reads back
        the limited cgroups' usage. The first pass also asks the driver whether it can hold limits on `gpus` at all,
        so `unavailable` is known before any pod has a quota. Never blocks."""
        if self._unavailable is not None:
            return
        with self._lock:
            self._plan = _Plan(targets, tuple(gpus), now)
        if targets != self._submitted:
            self._submitted = targets
            self.queue.add(_PLAN)
        ticket = self._ticket + 1
        if self.runner.submit(lambda: self._pass(ticket)):
            self._ticket = ticket  # else the worker is busy: its queued pass takes the plan, the next scan asks again

    def collect(self) -> list[LimitOutcome]:
        """The outcomes since the last call (for Events, metrics, the log)."""
        with self._lock:
            outcomes, self._outcomes = self._outcomes, []
        return outcomes

    def held(self) -> Mapping[SubjectKey, LimitTarget]:
        """The limits the driver holds, as of the last pass."""
        with self._lock:
            return dict(self._held)

    def fresh_usage(self) -> Mapping[SubjectKey, int]:
        """Each limited cgroup's memory per GPU as the driver counts it, read since the previous `update` (by the
        pass it started); empty when that pass has not finished, so a scan never takes an old figure."""
        with self._lock:
            return dict(self._usage) if self._usage_ticket == self._ticket else {}

    def failing(self) -> int:
        """How many (cgroup, GPU) limits are failing now, each retried on its own back-off."""
        return self.queue.failing()

    @property
    def unavailable(self) -> str | None:
        """Why this node cannot hold driver limits at all, or None (as far as the limiter has found out)."""
        return self._unavailable

    def unsupported_gpus(self) -> Mapping[int, str]:
        with self._lock:
            return dict(self._unsupported_gpus)

    def support(self) -> LimitsSupport | None:
        """Whether the driver can hold limits here, as far as the limiter has found out: None before its first
        probe (at the first `update`) has run. Never blocks on NVML."""
        with self._lock:
            first = self._first_answer
            if first is None:
                return None
            unavailable = self._unavailable if self._unavailable is not None else first.unavailable
            return replace(first, unavailable=unavailable, unsupported=dict(self._unsupported_gpus))

    def start(self) -> None:
        self.runner.start()

    def stop(self, deadline: float) -> None:
        """Stop the worker. The limits stay: they protect the neighbours while the agent is away."""
        self.runner.stop(deadline)

    # -- the watcher's side ------------------------------------------------------------------------------------

    def watched(self) -> None:
        """A `CgroupWatcher` hands over each new cgroup from now on: a target whose cgroup is not there yet is
        programmed when it appears, not looked for again every `retry_s` (only at the resync)."""
        self._watched = True

    def appeared(self, path: str, identity: CgroupIdentity, fresh: bool = True) -> None:
        """A pod's or a container's cgroup (`cgroupwatch.CgroupWatcher`): program its limits now, before anything
        runs in it. `fresh`: created while watched (not found already there at start), so a process in it when
        its limit goes on is one that started with the cgroup, not one found running without its limit. Never
        blocks: the worker takes it ahead of every other key, in the pass under way or the next."""
        if self._unavailable is not None:
            return
        with self._lock:
            self._new.setdefault(path, (identity, self.clock.now()))
            if fresh:
                self._fresh.add(path)
        self.queue.add((path, None), first=True)
        self.runner.submit(lambda: self._pass(None))

    def retry_parked(self) -> bool:
        """Start a pass for the new cgroups not looked up yet (whose pod was not known at the last look); whether
        any still wait, so the watcher knows to call again."""
        with self._lock:
            waiting = bool(self._new)
        if waiting:
            self.runner.submit(lambda: self._pass(None))
        with self._lock:
            return bool(self._new)

    # -- the worker's side -------------------------------------------------------------------------------------

    def _pass(self, ticket: int | None) -> None:
        """One pass over the queue: every key that is ready, the new cgroups first; then, for a scan's hand-over
        (`ticket`), the usage of the limited cgroups not compared in this pass."""
        if self._unavailable is not None:
            return
        outcomes: list[LimitOutcome] = []
        self._compared, self._read = set(), {}
        try:
            self._probe_once()
            self.queue.release_due()
            self._work(outcomes)
            usage = self._read_usage(outcomes) if ticket is not None else None
        except _GiveUp:
            return
        self._publish(outcomes, (ticket, usage) if ticket is not None and usage is not None else None)

    def _work(self, outcomes: list[LimitOutcome]) -> None:
        while (key := self.queue.get()) is not None:
            try:
                self._reconcile(key, outcomes)
            finally:
                self.queue.done(key)

    def _reconcile(self, key: Key, outcomes: list[LimitOutcome]) -> None:
        path, gpu = key
        if key == _PLAN:
            self._replan()
        elif gpu is None:
            self._look_up(path)
        else:
            self._reconcile_place((path, gpu), outcomes)

    def _probe_once(self) -> None:
        if self._probed:
            return
        with self._lock:
            plan = self._plan
        if plan is None:
            return  # no scan has handed over the GPUs yet
        self._probed = True
        support = probe_limits(self.memory, self.tree, plan.gpus)
        for gpu, reason in support.unsupported.items():
            self.log.warning("driver_limits_unsupported", gpu=gpu, reason=reason, fallback="reactive enforcement")
        with self._lock:
            self._unsupported_gpus.update(support.unsupported)
            self._first_answer = support
        if support.unavailable is not None:
            self._give_up(support.unavailable)

    def _replan(self) -> None:
        """The scan's targets, located: each place they want is compared with the driver, each place no longer
        wanted cleared. A place wanted since the targets were computed (a cgroup that appeared since, looked up
        from fresher knowledge) stays wanted."""
        with self._lock:
            plan = self._plan
        if plan is None:
            return
        root = self.tree.v2_root()
        if root is None:
            self._give_up(_no_v2(self.tree))
        by_pod: dict[str, list[LimitTarget]] = {}
        for t in plan.targets:
            by_pod.setdefault(t.pod.uid, []).append(t)
        self._latest = {uid: tuple(ts) for uid, ts in by_pod.items()}
        located = self.tree.locate(root, by_pod)
        wanted: dict[Place, _Want] = {}
        missing = False
        for t in plan.targets:
            if t.pending:
                continue
            path = located.get((t.pod.uid, t.container_id))
            if path is None:
                missing = True  # the cgroup is not there yet (or is gone): look again soon
                continue
            wanted[(path, t.gpu_index)] = _Want(t, False, plan.computed_at)
        # Container cgroups the pod's status does not name yet: the not-started containers' limit, if theirs.
        living: dict[str, set[str]] = {}
        for uid, container_id in located:
            if container_id is not None:
                living.setdefault(uid, set()).add(container_id)
        for (uid, container_id), path in located.items():
            pod_targets = self._latest[uid]
            if container_id is None or pod_targets[0].pod.container_by_id(container_id) is not None:
                continue
            for t in _unambiguous(pod_targets, living[uid]):
                wanted.setdefault((path, t.gpu_index), _Want(t, True, plan.computed_at))
        for place, want in self._wanted.items():
            if place not in wanted and want.at > plan.computed_at:
                wanted[place] = want
        before, self._wanted = self._wanted, wanted
        for place in dict.fromkeys([*wanted, *before, *self._holds]):
            if place not in wanted or not self.queue.failures(place):  # a failing one waits for its back-off
                self.queue.add(place)
        with self._lock:  # forget the cgroups that are gone
            fresh = list(self._fresh)
        gone = {p for p in fresh if not self.tree.exists(p)}
        with self._lock:
            self._fresh -= gone
        self.queue.add_after(_PLAN, self.resync_s)
        if missing and not self._watched:  # with the watcher, a cgroup that appears is looked up then
            self.queue.add_after(_PLAN, self.retry_s)

    def _look_up(self, path: str) -> None:
        """A new cgroup's limits, from what the sources know of its pod now: each place wanted, ahead of the queue.
        One whose pod is not known yet is looked up again at the next pass (the pod source may lag the kubelet by
        a moment) for `_PARK_S`; after that, the plan's walk finds it once its pod has a quota."""
        with self._lock:
            found = self._new.get(path)
        if found is None:
            return
        identity, since = found
        targets = self.plan(identity.pod_uid) if self.plan is not None else None
        if targets is None:
            targets = self._latest.get(identity.pod_uid)
        now = self.clock.now()
        if targets is None and now - since < _PARK_S:
            self.queue.add_after((path, None), 0.0)  # the watcher's tick starts the next pass
            return
        with self._lock:
            del self._new[path]
        if targets is None:
            return
        provisional = False
        if identity.container_id is None:
            chosen = [t for t in targets if t.container is None]
        else:
            chosen = [t for t in targets if t.container_id == identity.container_id and t.container is not None]
            if not chosen:
                chosen, provisional = _unambiguous(targets, self.tree.sibling_container_ids(path)), True
        for t in chosen:
            place = (path, t.gpu_index)
            self._wanted[place] = _Want(t, provisional, now)
            if not self.queue.failures(place):  # a failing one is retried with what is wanted now, when due
                self.queue.add(place, first=True)

    def _reconcile_place(self, place: Place, outcomes: list[LimitOutcome]) -> None:
        """Make the driver hold what `place` should hold: set it where it differs, clear it where nothing is
        wanted any more. A failure is reported when its run starts and retried on the place's back-off."""
        want = self._wanted.get(place)
        if want is None:
            self.queue.forget(place)
            self._clear(place, outcomes)
            return
        path, gpu = place
        if gpu in self._unsupported_gpus:
            return
        t = want.target
        failures = self.queue.failures(place)
        try:
            outcome = self._program(path, t, provisional=want.provisional)
        except LimitsUnavailable as e:
            if e.whole_driver:
                self._give_up(str(e))
            with self._lock:
                self._unsupported_gpus[gpu] = str(e)
            outcomes.append(LimitOutcome(t, LimitResult.UNSUPPORTED, str(e)))
            return
        except LimitFailed as e:
            if not failures:
                outcomes.append(LimitOutcome(t, LimitResult.FAILED, str(e)))
            self.queue.add_rate_limited(place)
            return
        self._holds[place] = want
        self._compared.add(place)
        self.queue.forget(place)
        if outcome is not None and failures:
            outcome = replace(outcome, detail=f"{outcome.detail} (after {failures} failed attempts)")
        if outcome is not None:
            outcomes.append(outcome)

    def _program(self, path: str, t: LimitTarget, *, provisional: bool) -> LimitOutcome | None:
        """Make the driver hold `t` on `path`; the outcome to report, or None when nothing new happened."""
        gpu = t.gpu_index
        current = self.memory.get(gpu, path)
        known = self._holds.get((path, gpu))
        if current is not None and not t.pending:
            self._read[t.key] = current.used_bytes
        if current is not None and current.soft_bytes == 0 and current.hard_bytes == t.hard_bytes:
            return None if known is not None else LimitOutcome(t, LimitResult.UNCHANGED, "the driver already held it")
        self.memory.set(gpu, path, 0, t.hard_bytes)
        # One report per limit: a not-yet-identified container cgroup that takes a limit someone already
        # announced (the sandbox's, next to the container's own) says nothing again.
        if provisional and any(h.target.key == t.key for h in self._holds.values()):
            return None
        was = f" (was {current.hard_bytes} bytes)" if current is not None else ""
        if t.container is not None and not provisional and not self._is_fresh(path) and self.tree.populated(path):
            return LimitOutcome(t, LimitResult.LATE, f"{t.describe()}{was}: the container was already running")
        return LimitOutcome(t, LimitResult.APPLIED, f"{t.describe()}{was}")

    def _clear(self, place: Place, outcomes: list[LimitOutcome]) -> None:
        """Clear a limit no longer wanted. A provisional one is forgotten, not cleared (it was the sandbox's, or its
        container has its own target now), and so is one whose cgroup is gone (its limits went with it)."""
        held = self._holds.pop(place, None)
        path, gpu = place
        if held is None or held.provisional or not self.tree.exists(path):
            return
        try:
            self.memory.set(gpu, path, 0, LIMIT_MAX)
        except (LimitsUnavailable, LimitFailed) as e:
            outcomes.append(LimitOutcome(held.target, LimitResult.FAILED, f"clearing: {e}"))
            return
        outcomes.append(LimitOutcome(held.target, LimitResult.CLEARED))

    def _is_fresh(self, path: str) -> bool:
        with self._lock:
            return path in self._fresh

    def _read_usage(self, outcomes: list[LimitOutcome]) -> dict[SubjectKey, int]:
        """The usage this pass read back, and each other limited container cgroup's, read now; a cgroup that
        appears meanwhile goes first."""
        usage = dict(self._read)
        for place, held in list(self._holds.items()):
            t = held.target
            if t.pending or t.container is None or place in self._compared:
                continue  # a pod's own cgroup: its containers' rows carry the usage
            self._work(outcomes)
            try:
                current = self.memory.get(place[1], place[0])
            except (LimitsUnavailable, LimitFailed):
                continue  # the next compare reports it
            if current is not None:
                usage[t.key] = current.used_bytes
        return usage

    def _publish(self, outcomes: list[LimitOutcome], usage: tuple[int, dict[SubjectKey, int]] | None) -> None:
        with self._lock:
            self._outcomes += outcomes
            self._held = {h.target.key: h.target for h in self._holds.values()}
            if usage is not None:
                self._usage_ticket, self._usage = usage

    def _give_up(self, reason: str) -> NoReturn:
        """The whole driver cannot hold limits: say so once, hold nothing, and end the pass."""
        if self._unavailable is None:
            self.log.warning("driver_limits_unavailable", reason=reason, fallback="reactive enforcement")
        self._unavailable = reason
        with self._lock:
            self._held = {}
            self._usage = {}
        raise _GiveUp


class _GiveUp(Exception):
    """The whole driver cannot hold limits: the pass stops where it is."""


# How long a new cgroup whose pod is not known is looked up again at each pass (the pod source may lag the kubelet
# by a moment); after that, the plan's walk finds it once its pod has a quota.
_PARK_S = 30.0


def _unambiguous(targets: tuple[LimitTarget, ...], living: set[str]) -> list[LimitTarget]:
    """The limit a new container cgroup of this pod gets before the pod's status names it: that of the pod's
    containers not running now (no ID yet, or an ID whose cgroup is gone: a restart; `living` are the IDs of the
    pod's container cgroups) when they all call for the same one (one container, or identical quotas), else none
    (the reconcile sets it once the status names the container; the pod's cgroup holds meanwhile)."""
    if not targets:
        return []
    pod = targets[0].pod
    not_started = {c.name for c in pod.containers if not c.container_id or c.container_id not in living}
    per_container: dict[str, dict[int, int]] = {}
    for t in targets:
        if t.pending and t.container is not None:
            per_container.setdefault(t.container, {})[t.gpu_index] = t.hard_bytes
    if not per_container or set(per_container) != not_started:
        return []  # a not-started container without a quota of its own could be the one
    first, *others = per_container.values()
    if any(o != first for o in others):
        return []
    name = next(iter(per_container))
    return [t for t in targets if t.pending and t.container == name]
