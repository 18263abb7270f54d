"""Programs the driver's per-cgroup memory limits (`driver_limit.LimitTarget`s) on a worker thread.

A controller: the scan hands over the limits it wants (`update`, never blocking) and takes back what came of them
(`collect`); the cgroup watcher hands over each new pod and container cgroup (`appeared`). Both put typed keys
(`Key`: a `PlaceKey` is a cgroup on one GPU) on one work queue (`workqueue.WorkQueue`: de-duplicated, each failing
key on its own back-off, waking the worker when a held-back key comes due). Everything that touches the file
system (through one `cgroup_tree.CgroupTree`) or NVML runs on the worker, started by `start()` and ended by
`stop(deadline)`. See docs/architecture.md "Driver limits: the limiter" for how it stays idempotent, retries and
gives up.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import NoReturn

import structlog

from vramguard.base.background import BackgroundLoop
from vramguard.base.backoff import Backoff
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.worker import Runner
from vramguard.base.workqueue import WorkQueue
from vramguard.core.driver_limit import (
    HeldLimit,
    LimitKey,
    LimitOutcome,
    LimitResult,
    LimitSetter,
    LimitTarget,
    holds_quota,
)
from vramguard.core.ports import LIMIT_MAX, DriverLimit, LimitFailed, LimitsSupport, LimitsUnavailable, MemoryLimiter
from vramguard.core.process import CgroupIdentity
from vramguard.core.sample import GpuDevice
from vramguard.core.snapshot import ContainerUsage
from vramguard.core.text import format_bytes
from vramguard.node.cgroup_tree import CgroupfsTree, CgroupTree


def read_held_limits(
    memory: MemoryLimiter,
    cgroup_root: str,
    containers: Iterable[ContainerUsage],
    devices: Iterable[GpuDevice],
    *,
    tree: CgroupTree | None = None,
) -> dict[LimitKey, HeldLimit]:
    """The hard limits the driver holds now for these containers (and their pods' own cgroups), by key, and who set
    each (`LimitSetter`): what `vramguard top` shows. Empty where the node cannot hold limits. Blocks on NVML: not
    for the scan loop. `tree`: where the cgroups are found, cgroupfs at `cgroup_root` unless given."""
    tree = tree if tree is not None else CgroupfsTree(cgroup_root)
    root = tree.v2_root()
    rows = [u for u in containers if u.container_id]
    if root is None or not rows:
        return {}
    index = {d.uuid: d.index for d in devices if d.mig_index is None}
    located = tree.locate(root, {u.pod.uid for u in rows})
    held: dict[LimitKey, HeldLimit] = {}
    for u in rows:
        gpu = index.get(u.device_uuid)
        if gpu is None:
            continue
        for name, container_id in ((u.container, u.container_id), (None, None)):
            path = located.get((u.pod.uid, container_id))
            if path is None or LimitKey(u.pod.uid, name, u.device_uuid) in held:
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
                held[LimitKey(u.pod.uid, name, u.device_uuid)] = HeldLimit(
                    found.hard_bytes, LimitSetter.of(found.soft_bytes)
                )
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


@dataclass(frozen=True, slots=True)
class PlaceKey:
    """Where one limit goes: a cgroup directory (its full path) on one whole GPU (its index)."""

    cgroup: str
    gpu: int


@dataclass(frozen=True, slots=True)
class CgroupKey:
    """A pod's or a container's cgroup the watcher handed over, its limits not looked up yet. One key per cgroup:
    what the cgroup is and when it appeared ride along, outside the key's identity."""

    cgroup: str
    identity: CgroupIdentity = field(compare=False)
    appeared_at: float = field(compare=False)


@dataclass(frozen=True, slots=True)
class TargetsKey:
    """The scan's latest targets as a whole: each located and compared (after a change, at the resync, and while a
    cgroup is missing that no watcher will report)."""


@dataclass(frozen=True, slots=True)
class UsageKey:
    """The scan's latest hand-over asks for the limited cgroups' usage: read back once the keys ready with it are
    done, so the figures are those of the limits just compared."""


Key = PlaceKey | CgroupKey | TargetsKey | UsageKey
"""What the limiter's work queue holds, and nothing else."""


@dataclass(frozen=True, slots=True)
class _Want:
    """The limit a place is to hold, wanted since `at`: by the scan's targets (computed then), or by a cgroup's
    lookup as it appeared. `provisional`: on a container cgroup not identified yet (its pod's not-started
    containers all call for the same limit; the sandbox's cgroup may get it too, harmlessly: it never allocates)."""

    target: LimitTarget
    provisional: bool
    at: float


@dataclass(frozen=True, slots=True)
class _Handover:
    """The scan's latest `update`: the targets, computed at `computed_at`, the whole GPUs (for the probe), and its
    number (usage counts as fresh only when read for the latest)."""

    targets: tuple[LimitTarget, ...]
    gpus: tuple[int, ...]
    computed_at: float
    ticket: int


@dataclass(slots=True)
class _Shared:
    """Everything that crosses threads, read and written only under `DriverLimiter._lock`. In: the scan's latest
    hand-over, whether a watcher reports new cgroups, the cgroups seen created (a process in one when its limit
    goes on started with it: not "late"). Out, written by the worker: what came of the limits, what the driver
    holds, the usage read back and for which hand-over, the GPUs that cannot hold limits, the first probe's
    answer, and why the node cannot hold any (written once, as the worker gives up)."""

    handover: _Handover | None = None
    watched: bool = False
    fresh: set[str] = field(default_factory=set)
    outcomes: list[LimitOutcome] = field(default_factory=list)
    held: dict[LimitKey, LimitTarget] = field(default_factory=dict)
    usage: dict[LimitKey, int] = field(default_factory=dict)
    usage_ticket: int = 0
    unsupported: dict[int, str] = field(default_factory=dict)
    first_answer: LimitsSupport | None = None
    unavailable: str | None = None


@dataclass(slots=True)
class _Books:
    """The worker's own, never shared: what each place should hold (the targets located, and the new cgroups
    looked up), what this agent knows the driver holds there, each pod's targets as last located, and whether
    the driver was asked yet whether it can hold limits at all."""

    wanted: dict[PlaceKey, _Want] = field(default_factory=dict)
    holds: dict[PlaceKey, _Want] = field(default_factory=dict)
    by_pod: dict[str, tuple[LimitTarget, ...]] = field(default_factory=dict)
    probed: bool = False


@dataclass(slots=True)
class _Pass:
    """One pass of the worker: its outcomes, the places it compared and the usage their calls read back, and the
    hand-over whose usage it reads back at its end (None: no `UsageKey` came)."""

    outcomes: list[LimitOutcome] = field(default_factory=list)
    compared: set[PlaceKey] = field(default_factory=set)
    read: dict[LimitKey, int] = field(default_factory=dict)
    usage_for: int | None = None


class DriverLimiter:
    """A controller over the driver's limits, as one built on client-go's `util/workqueue` is: the planner lists
    the desired state (the scan's targets, handed over by `update`, and one pod's, read fresh by `plan` when a
    cgroup of it appears), one `WorkQueue` holds typed keys (`Key`), and the worker reconciles them:
    `_reconcile` compares what one place should hold with what the driver holds, and sets or clears it; a
    failing call is retried on the place's own back-off. `cgroup_root`: where the cgroups are found (cgroupfs),
    unless a `tree` stands in for them.

    Who owns what: the constructor's settings and the queue (thread-safe itself) are read by every thread and
    never written after; `_shared` crosses threads, only under `_lock`; `_books` and each pass are the worker's
    alone. The worker is a thread of its own (`start`), waiting in the queue, which wakes it for each key added and
    for each held-back key (a back-off, the resync, a parked cgroup) when it comes due. `runner` stands in for the
    thread (`Inline` in tests and the bench): each hand-over then runs a pass on it, taking the keys that are
    ready."""

    def __init__(
        self,
        memory: MemoryLimiter,
        cgroup_root: str = "/sys/fs/cgroup",
        *,
        runner: Runner | None = None,
        resync_s: float = 30.0,
        retry_s: float = 2.0,
        max_retry_s: float = 300.0,
        lookup_retry_s: float = 0.1,
        clock: Clock = SYSTEM_CLOCK,
        plan: Planner | None = None,
        log: structlog.typing.FilteringBoundLogger | None = None,
        tree: CgroupTree | None = None,
    ) -> None:
        self.memory = memory
        self.tree = tree if tree is not None else CgroupfsTree(cgroup_root)
        self.resync_s = resync_s
        self.retry_s = retry_s
        self.lookup_retry_s = lookup_retry_s  # how soon a cgroup whose pod is not known yet is looked up again
        # The scan's clock: a limit wanted after the targets were computed (`update`'s `now`) is newer than them.
        self.clock = clock
        self.plan = plan
        self.log = log if log is not None else structlog.get_logger(__name__)
        self.queue: WorkQueue[Key] = WorkQueue(lambda: Backoff(retry_s, max_retry_s), clock)
        self.runner = runner
        self._loop = BackgroundLoop("driver-limits", self._step, clock=clock, wake=self.queue.shut_down, log=self.log)
        self._lock = threading.Lock()
        self._shared = _Shared()
        self._books = _Books()

    # -- the loop's side ---------------------------------------------------------------------------------------

    def update(self, targets: tuple[LimitTarget, ...], gpus: Iterable[int], now: float) -> None:
        """Hand the limits wanted now to the worker: a change puts the targets as a whole on the queue (so does
        the resync, every `resync_s`), and every call asks for the limited cgroups' usage. The first pass also asks
        the driver whether it can hold limits on `gpus` at all, so `unavailable` is known before any pod has a
        quota. Never blocks."""
        with self._lock:
            if self._shared.unavailable is not None:
                return
            last = self._shared.handover
            self._shared.handover = _Handover(targets, tuple(gpus), now, last.ticket + 1 if last is not None else 1)
        if last is None or targets != last.targets:
            self.queue.add(TargetsKey())
        self.queue.add(UsageKey())
        self._kick()

    def collect(self) -> list[LimitOutcome]:
        """The outcomes since the last call (for Events, metrics, the log)."""
        with self._lock:
            outcomes, self._shared.outcomes = self._shared.outcomes, []
        return outcomes

    def held(self) -> Mapping[LimitKey, LimitTarget]:
        """The limits the driver holds, as of the last pass."""
        with self._lock:
            return dict(self._shared.held)

    def fresh_usage(self) -> Mapping[LimitKey, int]:
        """Each limited cgroup's memory per GPU as the driver counts it, read since the previous `update` (for the
        latest); empty when that read has not finished, so a scan never takes an old figure."""
        with self._lock:
            shared = self._shared
            latest = shared.handover.ticket if shared.handover is not None else None
            return dict(shared.usage) if shared.usage_ticket == latest else {}

    def failing(self) -> int:
        """How many (cgroup, GPU) limits are failing now, each retried on its own back-off."""
        return self.queue.failing()

    @property
    def unavailable(self) -> str | None:
        """Why this node cannot hold driver limits at all, or None (as far as the limiter has found out)."""
        with self._lock:
            return self._shared.unavailable

    def unsupported_gpus(self) -> Mapping[int, str]:
        with self._lock:
            return dict(self._shared.unsupported)

    def support(self) -> LimitsSupport | None:
        """Whether the driver can hold limits here, as far as the limiter has found out: None before its first
        probe (at the first `update`) has run. Never blocks on NVML."""
        with self._lock:
            shared = self._shared
            first = shared.first_answer
            if first is None:
                return None
            unavailable = shared.unavailable if shared.unavailable is not None else first.unavailable
            return replace(first, unavailable=unavailable, unsupported=dict(shared.unsupported))

    def start(self) -> None:
        if self.runner is not None:
            self.runner.start()
        else:
            self._loop.start()

    def stop(self, deadline: float) -> None:
        """Stop the worker. The limits stay: they protect the neighbours while the agent is away."""
        if self.runner is not None:
            self.runner.stop(deadline)
        else:
            self._loop.stop(deadline)

    # -- the watcher's side ------------------------------------------------------------------------------------

    def watched(self) -> None:
        """A `CgroupWatcher` hands over each new cgroup from now on: a target whose cgroup is not there yet is
        programmed when it appears, not looked for again every `retry_s` (only at the resync)."""
        with self._lock:
            self._shared.watched = True

    def appeared(self, path: str, identity: CgroupIdentity, fresh: bool = True) -> None:
        """A pod's or a container's cgroup (`cgroupwatch.CgroupWatcher`): program its limits now, before anything
        runs in it. `fresh`: created while watched (not found already there at start), so a process in it when
        its limit goes on is one that started with the cgroup, not one found running without its limit. Never
        blocks: the worker takes it ahead of every other key, in the pass under way or the next."""
        with self._lock:
            if self._shared.unavailable is not None:
                return
            if fresh:
                self._shared.fresh.add(path)
        self.queue.add(CgroupKey(path, identity, self.clock.now()), first=True)
        self._kick()

    def retry_parked(self) -> bool:
        """Whether a new cgroup still waits to be looked up (handed over and not taken, or its pod not known yet).
        The queue wakes the worker for a parked cgroup by itself; a `runner` standing in for the thread (tests,
        `bench/scan.py`) is given a pass here."""
        if self.unavailable is not None:
            return False
        self._kick()
        return any(isinstance(key, CgroupKey) for key in self.queue.snapshot())

    # -- the worker's side -------------------------------------------------------------------------------------

    def _kick(self) -> None:
        """Where a `runner` stands in for the worker's thread, run a pass over the keys that are ready."""
        if self.runner is not None:
            self.runner.submit(lambda: self._pass(block=False))

    def _step(self) -> float:
        """The worker thread's round: one pass, waiting in the queue for its first key."""
        if self.unavailable is not None:
            return _GAVE_UP_WAIT_S  # nothing left to do but wait for the stop
        self._pass(block=True)
        return 0.0

    def _pass(self, *, block: bool) -> None:
        """Every key that is ready (with `block`, once one is), the new cgroups first; then, if a `UsageKey` came,
        the usage of the limited cgroups not compared in this pass."""
        if self.unavailable is not None:
            return
        key = self.queue.get(block=block)
        if key is None:
            return
        work = _Pass()
        try:
            try:
                self._probe_once()
                self._take(key, work)
            finally:
                self.queue.done(key)
            self._work(work)
            usage = self._read_usage(work) if work.usage_for is not None else None
        except _GiveUp:
            return
        self._publish(work, usage)

    def _work(self, work: _Pass) -> None:
        while (key := self.queue.get()) is not None:
            try:
                self._take(key, work)
            finally:
                self.queue.done(key)

    def _take(self, key: Key, work: _Pass) -> None:
        if isinstance(key, PlaceKey):
            self._reconcile(key, work)
        elif isinstance(key, CgroupKey):
            self._look_up(key)
        elif isinstance(key, TargetsKey):
            self._locate_targets()
        else:
            with self._lock:
                handover = self._shared.handover
            work.usage_for = handover.ticket if handover is not None else 0

    def _probe_once(self) -> None:
        if self._books.probed:
            return
        with self._lock:
            handover = self._shared.handover
        if handover is None:
            return  # no scan has handed over the GPUs yet
        self._books.probed = True
        support = probe_limits(self.memory, self.tree, handover.gpus)
        for gpu, reason in support.unsupported.items():
            self.log.warning("driver_limits_unsupported", gpu=gpu, reason=reason, fallback="reactive enforcement")
        with self._lock:
            self._shared.unsupported.update(support.unsupported)
            self._shared.first_answer = support
        if support.unavailable is not None:
            self._give_up(support.unavailable)

    def _locate_targets(self) -> None:
        """The scan's targets, located: each place they want is compared with the driver, each place no longer
        wanted cleared. A place wanted since the targets were computed (a cgroup that appeared since, looked up
        from fresher knowledge) stays wanted."""
        with self._lock:
            handover, watched = self._shared.handover, self._shared.watched
        if handover is None:
            return
        root = self.tree.v2_root()
        if root is None:
            self._give_up(_no_v2(self.tree))
        books = self._books
        by_pod: dict[str, list[LimitTarget]] = {}
        for t in handover.targets:
            by_pod.setdefault(t.pod.uid, []).append(t)
        books.by_pod = {uid: tuple(ts) for uid, ts in by_pod.items()}
        located = self.tree.locate(root, by_pod)
        wanted: dict[PlaceKey, _Want] = {}
        missing = False
        for t in handover.targets:
            if t.pending:
                continue
            path = located.get((t.pod.uid, t.container_id))
            if path is None:
                missing = True  # the cgroup is not there yet (or is gone): look again soon
                continue
            wanted[PlaceKey(path, t.gpu_index)] = _Want(t, False, handover.computed_at)
        # Container cgroups the pod's status does not name yet: the not-started containers' limit, if theirs.
        living: dict[str, set[str]] = {}
        for uid, container_id in located:
            if container_id is not None:
                living.setdefault(uid, set()).add(container_id)
        for (uid, container_id), path in located.items():
            pod_targets = books.by_pod[uid]
            if container_id is None or pod_targets[0].pod.container_by_id(container_id) is not None:
                continue
            for t in _unambiguous(pod_targets, living[uid]):
                wanted.setdefault(PlaceKey(path, t.gpu_index), _Want(t, True, handover.computed_at))
        for key, want in books.wanted.items():
            if key not in wanted and want.at > handover.computed_at:
                wanted[key] = want
        before, books.wanted = books.wanted, wanted
        for key in dict.fromkeys([*wanted, *before, *books.holds]):
            if key not in wanted or not self.queue.failures(key):  # a failing one waits for its back-off
                self.queue.add(key)
        with self._lock:  # forget the cgroups that are gone
            fresh = list(self._shared.fresh)
        gone = {p for p in fresh if not self.tree.exists(p)}
        with self._lock:
            self._shared.fresh -= gone
        self.queue.add_after(TargetsKey(), self.resync_s)
        if missing and not watched:  # with the watcher, a cgroup that appears is looked up then
            self.queue.add_after(TargetsKey(), self.retry_s)

    def _look_up(self, key: CgroupKey) -> None:
        """A new cgroup's limits, from what the sources know of its pod now: each place wanted, ahead of the queue.
        One whose pod is not known yet is looked up again every `lookup_retry_s` (the pod source may lag the
        kubelet by a moment) for `_PARK_S`; after that, the targets' walk finds it once its pod has a quota."""
        identity, path = key.identity, key.cgroup
        targets = self.plan(identity.pod_uid) if self.plan is not None else None
        if targets is None:
            targets = self._books.by_pod.get(identity.pod_uid)
        now = self.clock.now()
        if targets is None:
            if now - key.appeared_at < _PARK_S:
                self.queue.add_after(key, self.lookup_retry_s)
            return
        provisional = False
        if identity.container_id is None:
            chosen = [t for t in targets if t.container is None]
        else:
            chosen = [t for t in targets if t.container_id == identity.container_id and t.container is not None]
            if not chosen:
                chosen, provisional = _unambiguous(targets, self.tree.sibling_container_ids(path)), True
        for t in chosen:
            place = PlaceKey(path, t.gpu_index)
            self._books.wanted[place] = _Want(t, provisional, now)
            if not self.queue.failures(place):  # a failing one is retried with what is wanted now, when due
                self.queue.add(place, first=True)

    def _reconcile(self, key: PlaceKey, work: _Pass) -> None:
        """Make the driver hold what `key` should hold: set it where it differs, clear it where nothing is wanted
        any more. A failure is reported when its run starts and retried on the key's back-off."""
        want = self._books.wanted.get(key)
        if want is None:
            self.queue.forget(key)
            self._clear(key, work)
            return
        with self._lock:
            if key.gpu in self._shared.unsupported:
                return
        t = want.target
        failures = self.queue.failures(key)
        try:
            held, outcome = self._program(key, want, work)
        except LimitsUnavailable as e:
            if e.whole_driver:
                self._give_up(str(e))
            with self._lock:
                self._shared.unsupported[key.gpu] = str(e)
            work.outcomes.append(LimitOutcome(t, LimitResult.UNSUPPORTED, str(e)))
            return
        except LimitFailed as e:
            if not failures:
                work.outcomes.append(LimitOutcome(t, LimitResult.FAILED, str(e)))
            self.queue.add_rate_limited(key)
            return
        self._books.holds[key] = held
        work.compared.add(key)
        self.queue.forget(key)
        if outcome is not None and failures:
            outcome = replace(outcome, detail=f"{outcome.detail} (after {failures} failed attempts)")
        if outcome is not None:
            work.outcomes.append(outcome)

    def _program(self, key: PlaceKey, want: _Want, work: _Pass) -> tuple[_Want, LimitOutcome | None]:
        """Make the driver hold `want` at `key`: what it holds there now, and the outcome to report (None when
        nothing new happened). A limit the toolkit's hook set (`LimitSetter`) is left as it is: held, not written."""
        t, provisional = want.target, want.provisional
        current = self.memory.get(key.gpu, key.cgroup)
        known = self._books.holds.get(key)
        if current is not None and not t.pending:
            work.read[t.key] = current.used_bytes
        if current is not None and LimitSetter.of(current.soft_bytes) is LimitSetter.TOOLKIT:
            return _toolkits(want, current, known)
        if current is not None and current.hard_bytes == t.hard_bytes:
            if known is not None and known.target.set_by is LimitSetter.AGENT:
                return want, None
            return want, LimitOutcome(t, LimitResult.UNCHANGED, "the driver already held it")
        self.memory.set(key.gpu, key.cgroup, 0, t.hard_bytes)
        # One report per limit: a not-yet-identified container cgroup that takes a limit someone already
        # announced (the sandbox's, next to the container's own) says nothing again.
        if provisional and any(h.target.key == t.key for h in self._books.holds.values()):
            return want, None
        was = f" (was {current.hard_bytes} bytes)" if current is not None else ""
        if (
            t.container is not None
            and not provisional
            and not self._is_fresh(key.cgroup)
            and self.tree.populated(key.cgroup)
        ):
            return want, LimitOutcome(t, LimitResult.LATE, f"{t.describe()}{was}: the container was already running")
        return want, LimitOutcome(t, LimitResult.APPLIED, f"{t.describe()}{was}")

    def _clear(self, key: PlaceKey, work: _Pass) -> None:
        """Clear a limit no longer wanted. A provisional one is forgotten, not cleared (it was the sandbox's, or its
        container has its own target now), and so is one whose cgroup is gone (its limits went with it), and one
        the toolkit's hook set, even over the agent's own (`LimitSetter`): the agent clears only its own limits."""
        held = self._books.holds.pop(key, None)
        if held is None or held.provisional or held.target.set_by is not LimitSetter.AGENT:
            return
        if not self.tree.exists(key.cgroup):
            return
        try:
            current = self.memory.get(key.gpu, key.cgroup)
            if current is None or LimitSetter.of(current.soft_bytes) is not LimitSetter.AGENT:
                return
            self.memory.set(key.gpu, key.cgroup, 0, LIMIT_MAX)
        except (LimitsUnavailable, LimitFailed) as e:
            work.outcomes.append(LimitOutcome(held.target, LimitResult.FAILED, f"clearing: {e}"))
            return
        work.outcomes.append(LimitOutcome(held.target, LimitResult.CLEARED))

    def _is_fresh(self, path: str) -> bool:
        with self._lock:
            return path in self._shared.fresh

    def _read_usage(self, work: _Pass) -> dict[LimitKey, int]:
        """The usage this pass read back, and each other limited container cgroup's, read now; a cgroup that
        appears meanwhile goes first."""
        usage = dict(work.read)
        for key, held in list(self._books.holds.items()):
            t = held.target
            if t.pending or t.container is None or key in work.compared:
                continue  # a pod's own cgroup: its containers' rows carry the usage
            self._work(work)
            try:
                current = self.memory.get(key.gpu, key.cgroup)
            except (LimitsUnavailable, LimitFailed):
                continue  # the next compare reports it
            if current is not None:
                usage[t.key] = current.used_bytes
        return usage

    def _publish(self, work: _Pass, usage: dict[LimitKey, int] | None) -> None:
        held = {h.target.key: h.target for h in self._books.holds.values()}
        with self._lock:
            shared = self._shared
            shared.outcomes += work.outcomes
            shared.held = held
            if usage is not None and work.usage_for is not None:
                shared.usage_ticket, shared.usage = work.usage_for, usage

    def _give_up(self, reason: str) -> NoReturn:
        """The whole driver cannot hold limits: say so once, hold nothing, and end the pass."""
        with self._lock:
            shared = self._shared
            first = shared.unavailable is None
            shared.unavailable = reason
            shared.held = {}
            shared.usage = {}
        if first:
            self.log.warning("driver_limits_unavailable", reason=reason, fallback="reactive enforcement")
        raise _GiveUp


class _GiveUp(Exception):
    """The whole driver cannot hold limits: the pass stops where it is."""


# How long a new cgroup whose pod is not known is looked up again (the pod source may lag the kubelet by a moment);
# after that, the targets' walk finds it once its pod has a quota.
_PARK_S = 30.0
# The worker's pause once the node cannot hold limits: nothing is left to do but wait for the stop.
_GAVE_UP_WAIT_S = 3600.0


def _toolkits(want: _Want, current: DriverLimit, known: _Want | None) -> tuple[_Want, LimitOutcome | None]:
    """A place where the driver holds a limit the toolkit's hook set: what it holds (the target with the hook's hard
    limit), and the outcome to report the first time it is found so (again only if the hook's limit changes)."""
    t = want.target
    held = replace(want, target=replace(t, hard_bytes=current.hard_bytes, set_by=LimitSetter.TOOLKIT))
    found = (LimitSetter.TOOLKIT, current.hard_bytes)
    if known is not None and (known.target.set_by, known.target.hard_bytes) == found:
        return held, None
    hard = format_bytes(current.hard_bytes) if current.hard_bytes != LIMIT_MAX else "none"
    quota = f"the quota's hard limit {format_bytes(t.hard_bytes)} ({t.source})"
    if holds_quota(current.hard_bytes, t.hard_bytes):
        then = f"which holds {quota}"
    else:
        then = f"looser than {quota}, which vramguard enforces itself"
    detail = (
        f"NVIDIA's container toolkit set it to soft {format_bytes(current.soft_bytes)}, hard {hard}, {then}; left alone"
    )
    return held, LimitOutcome(t, LimitResult.TOOLKIT, detail)


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
