"""Programs the driver's per-cgroup memory limits (`limit_plan.LimitTarget`s) on a worker thread.

The scan hands over the limits it wants (`update`, never blocking) and takes back what came of them (`collect`);
the cgroup watcher hands over each new pod and container cgroup (`appeared`). Everything that touches the file
system (through one `cgroup_tree.CgroupTree`) or NVML runs on the worker, started by `start()` and ended by
`stop(deadline)`. See docs/design.md "Driver limits: the limiter" for how it stays idempotent, retries and gives up.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

import structlog

from vramguard.base.backoff import Backoff
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.worker import Runner, Worker
from vramguard.core.limit_plan import LimitOutcome, LimitResult, LimitTarget
from vramguard.core.model import CgroupIdentity, ContainerUsage, GpuDevice, SubjectKey
from vramguard.core.ports import LIMIT_MAX, LimitFailed, LimitsUnavailable, MemoryLimiter
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


@dataclass(frozen=True, slots=True)
class LimitsSupport:
    """Whether the driver can hold per-cgroup limits here, as it answered for the cgroup v2 root on each of `gpus`
    (`probe_limits`), or as the limiter has found out since (`DriverLimiter.support`)."""

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


@dataclass
class _Failing:
    """A (cgroup, GPU) whose limit calls fail: when to try again, and how many attempts failed in this run."""

    target: LimitTarget
    provisional: bool
    backoff: Backoff
    due_at: float
    failures: int = 0


Planner = Callable[[str], "tuple[LimitTarget, ...] | None"]
"""The limits one pod calls for now, by pod UID, read fresh from the agent's sources; None when the pod is not
known (yet). Called on the limiter's worker."""


class DriverLimiter:
    """`cgroup_root`: where the cgroups are found (cgroupfs), unless a `tree` stands in for them."""

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
        self.max_retry_s = max_retry_s
        # The scan's clock: a limit set after the targets were computed (`update`'s `now`) is newer than them.
        self.clock = clock
        self.plan = plan
        self.watching = False  # set once a `CgroupWatcher` hands over new cgroups
        self.log = log if log is not None else structlog.get_logger("vramguard.core.limit_plan")
        self._lock = threading.Lock()
        self._outcomes: list[LimitOutcome] = []
        self._held: dict[SubjectKey, LimitTarget] = {}
        self._usage: dict[SubjectKey, int] = {}
        # Each task handed to the worker gets a ticket; usage counts as fresh only when read by the latest one.
        self._ticket = 0
        self._usage_ticket = -1
        self._unavailable: str | None = None
        self._unsupported_gpus: dict[int, str] = {}
        self._first_answer: LimitsSupport | None = None  # the first probe's, once it came (under _lock)
        # New cgroups from the watcher, waiting for the worker, and those it saw created (under _lock).
        self._appeared: list[tuple[str, CgroupIdentity]] = []
        self._fresh: set[str] = set()
        self._waiting = 0  # appeared cgroups not programmed yet: handed over, or parked
        # Worker-only: what this agent knows the driver holds, by (cgroup directory, GPU index), and when it set
        # it; which of those went on a container cgroup not yet identified (its pod's not-started containers all
        # call for the same limit; the sandbox's cgroup may get it too, harmlessly: it never allocates); the
        # targets failing with back-off; each pod's targets as last handed over; new cgroups whose pod is unknown.
        self._programmed: dict[tuple[str, int], LimitTarget] = {}
        self._programmed_at: dict[tuple[str, int], float] = {}
        self._provisional: set[tuple[str, int]] = set()
        self._failing: dict[tuple[str, int], _Failing] = {}
        self._latest: dict[str, tuple[LimitTarget, ...]] = {}
        self._parked: dict[str, tuple[CgroupIdentity, float]] = {}
        self._read: dict[SubjectKey, int] = {}  # the usage the current reconcile read back
        self._probed = False
        # Written by the worker, read by the loop: when to look for cgroups that were not there yet.
        self._relocate_at = math.inf
        # Loop-only: the targets last handed to the worker, and when.
        self._submitted: tuple[LimitTarget, ...] | None = None
        self._submitted_at = -math.inf

    # -- the loop's side ---------------------------------------------------------------------------------------

    def update(self, targets: tuple[LimitTarget, ...], gpus: Iterable[int], now: float) -> None:
        """Hand the limits wanted now to the worker: when they changed, when a retry is due, or for the periodic
        resync (and in every other scan just a refresh of the limited cgroups' usage). The first call also asks
        the driver whether it can hold limits on `gpus` at all, so `unavailable` is known before any pod has a
        quota. Never blocks."""
        if self._unavailable is not None:
            return
        if not self._probed:
            gpu_list = tuple(gpus)
            self._probed = self.runner.submit(lambda: self._probe(gpu_list))
        ticket = self._ticket + 1
        due = now >= self._relocate_at or now - self._submitted_at >= self.resync_s
        if targets == self._submitted and not due:  # failing limits are retried there, each when its back-off ends
            if self.runner.submit(lambda: self._refresh_usage(ticket)):
                self._ticket = ticket  # else the worker is still busy: the next scan asks again
            return
        relocate_at, self._relocate_at = self._relocate_at, math.inf  # the reconcile sets it again if need be
        if self.runner.submit(lambda: self._reconcile(targets, ticket, now)):
            self._submitted, self._submitted_at, self._ticket = targets, now, ticket
        else:
            self._relocate_at = relocate_at

    def collect(self) -> list[LimitOutcome]:
        """The outcomes since the last call (for Events, metrics, the log)."""
        with self._lock:
            outcomes, self._outcomes = self._outcomes, []
        return outcomes

    def held(self) -> Mapping[SubjectKey, LimitTarget]:
        """The limits the driver holds, as of the last reconcile."""
        with self._lock:
            return dict(self._held)

    def fresh_usage(self) -> Mapping[SubjectKey, int]:
        """Each limited cgroup's memory per GPU as the driver counts it, read since the previous `update` (by
        the task it handed over); empty when that task has not finished, so a scan never takes an old figure."""
        with self._lock:
            return dict(self._usage) if self._usage_ticket == self._ticket else {}

    def failing(self) -> int:
        """How many (cgroup, GPU) limits are failing now, each retried on its own back-off."""
        return len(self._failing)

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

    def appeared(self, path: str, identity: CgroupIdentity, fresh: bool = True) -> None:
        """A pod's or a container's cgroup (`cgroupwatch.CgroupWatcher`): program its limits now, before anything
        runs in it. `fresh`: created while watched (not found already there at start), so a process in it when
        its limit goes on is one that started with the cgroup, not one found running without its limit. Never
        blocks: the worker takes it as its next task, or as the first thing of the task already queued."""
        if self._unavailable is not None:
            return
        with self._lock:
            self._appeared.append((path, identity))
            self._waiting += 1
            if fresh:
                self._fresh.add(path)
        self.runner.submit(self._drain)

    def retry_parked(self) -> bool:
        """Try again the new cgroups whose pod was not known yet; whether any are still waiting (handed over and
        not programmed yet, or parked), so the watcher knows to call again."""
        with self._lock:
            waiting = self._waiting
        if waiting:
            self.runner.submit(self._drain)
        with self._lock:
            return self._waiting > 0

    # -- the worker's side -------------------------------------------------------------------------------------

    def _probe(self, gpus: tuple[int, ...]) -> None:
        support = probe_limits(self.memory, self.tree, gpus)
        for gpu, reason in support.unsupported.items():
            self.log.warning("driver_limits_unsupported", gpu=gpu, reason=reason, fallback="reactive enforcement")
        with self._lock:
            self._unsupported_gpus.update(support.unsupported)
            self._first_answer = support
        if support.unavailable is not None:
            self._give_up(support.unavailable)

    def _drain(self) -> None:
        outcomes: list[LimitOutcome] = []
        try:
            self._program_appeared(outcomes)
        except _GiveUp:
            return
        self._publish(outcomes)

    def _is_fresh(self, path: str) -> bool:
        with self._lock:
            return path in self._fresh

    def _take_appeared(self, outcomes: list[LimitOutcome]) -> None:
        """Between two calls of a long task: a cgroup that just appeared goes first, before its process starts."""
        if self._appeared:
            self._program_appeared(outcomes)

    def _program_appeared(self, outcomes: list[LimitOutcome]) -> None:
        """Program the cgroups that appeared since the last task, and those parked until their pod is known."""
        with self._lock:
            appeared, self._appeared = self._appeared, []
        now = self.clock.now()
        parked, self._parked = self._parked, {}
        for path, (identity, since) in parked.items():
            if now - since < _PARK_S:  # later, the reconcile's walk finds it once its pod has a quota
                appeared.append((path, identity))
        for path, identity in appeared:
            targets = self.plan(identity.pod_uid) if self.plan is not None else None
            if targets is None:
                targets = self._latest.get(identity.pod_uid)
            if targets is None:
                self._parked[path] = (identity, parked[path][1] if path in parked else now)
                continue
            provisional = False
            if identity.container_id is None:
                chosen = [t for t in targets if t.container is None]
            else:
                chosen = [t for t in targets if t.container_id == identity.container_id and t.container is not None]
                if not chosen:
                    chosen, provisional = _unambiguous(targets, self.tree.sibling_container_ids(path)), True
            for t in chosen:
                if t.gpu_index not in self._unsupported_gpus:
                    self._try(path, t, now, outcomes, provisional=provisional)
        with self._lock:
            self._waiting = len(self._appeared) + len(self._parked)

    def _reconcile(self, targets: tuple[LimitTarget, ...], ticket: int, computed_at: float) -> None:
        outcomes: list[LimitOutcome] = []
        self._read = {}
        try:
            self._program_appeared(outcomes)
            root = self.tree.v2_root()
            if root is None:
                self._give_up(_no_v2(self.tree))
                return
            by_pod: dict[str, list[LimitTarget]] = {}
            for t in targets:
                by_pod.setdefault(t.pod.uid, []).append(t)
            self._latest = {uid: tuple(ts) for uid, ts in by_pod.items()}
            located = self.tree.locate(root, by_pod)
            wanted: dict[tuple[str, int], tuple[LimitTarget, bool]] = {}
            missing = False
            for t in targets:
                if t.pending:
                    continue
                path = located.get((t.pod.uid, t.container_id))
                if path is None:
                    missing = True  # the cgroup is not there yet (or is gone): try again soon
                    continue
                wanted[(path, t.gpu_index)] = (t, False)
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
                    wanted.setdefault((path, t.gpu_index), (t, True))
            now = self.clock.now()
            for (path, gpu), (t, provisional) in wanted.items():
                self._take_appeared(outcomes)
                if gpu not in self._unsupported_gpus:
                    self._try(path, t, now, outcomes, provisional=provisional)
            outcomes += self._clear_unwanted(wanted, computed_at)
            with self._lock:  # forget the cgroups that are gone
                fresh = list(self._fresh)
            gone = {p for p in fresh if not self.tree.exists(p)}
            with self._lock:
                self._fresh -= gone
        except _GiveUp:
            return
        if missing and not self.watching:  # with the watcher, a cgroup that appears is programmed then
            self._relocate_at = now + self.retry_s
        self._publish(outcomes, (ticket, self._read))

    def _try(self, path: str, t: LimitTarget, now: float, outcomes: list[LimitOutcome], *, provisional: bool) -> None:
        """Program one limit, unless its back-off says not yet; failures are reported once per run of them."""
        key = (path, t.gpu_index)
        failing = self._failing.get(key)
        if failing is not None and now < failing.due_at:
            failing.target, failing.provisional = t, provisional  # its retry sets what is wanted now
            return
        try:
            outcome = self._program(path, t, provisional=provisional)
        except LimitsUnavailable as e:
            if e.whole_driver:
                self._give_up(str(e))
                raise _GiveUp from e
            with self._lock:
                self._unsupported_gpus[t.gpu_index] = str(e)
            outcomes.append(LimitOutcome(t, LimitResult.UNSUPPORTED, str(e)))
            return
        except LimitFailed as e:
            if failing is None:
                backoff = Backoff(self.retry_s, self.max_retry_s)
                failing = self._failing[key] = _Failing(t, provisional, backoff, now)
                outcomes.append(LimitOutcome(t, LimitResult.FAILED, str(e)))
            failing.failures += 1
            failing.due_at = now + failing.backoff.next()
            return
        self._programmed_at[key] = now
        if provisional:
            self._provisional.add(key)
        else:
            self._provisional.discard(key)
        if failing is not None:
            del self._failing[key]
            if outcome is not None:
                outcome = replace(outcome, detail=f"{outcome.detail} (after {failing.failures} failed attempts)")
        if outcome is not None:
            outcomes.append(outcome)

    def _program(self, path: str, t: LimitTarget, *, provisional: bool) -> LimitOutcome | None:
        """Make the driver hold `t` on `path`; the outcome to report, or None when nothing new happened."""
        gpu = t.gpu_index
        current = self.memory.get(gpu, path)
        known = self._programmed.get((path, gpu))
        if current is not None and not t.pending:
            self._read[t.key] = current.used_bytes
        if current is not None and current.soft_bytes == 0 and current.hard_bytes == t.hard_bytes:
            self._programmed[(path, gpu)] = t
            return None if known is not None else LimitOutcome(t, LimitResult.UNCHANGED, "the driver already held it")
        self.memory.set(gpu, path, 0, t.hard_bytes)
        # One report per limit: a not-yet-identified container cgroup that takes a limit someone already
        # announced (the sandbox's, next to the container's own) says nothing again.
        announced = provisional and any(o.key == t.key for o in self._programmed.values())
        self._programmed[(path, gpu)] = t
        if announced:
            return None
        was = f" (was {current.hard_bytes} bytes)" if current is not None else ""
        if t.container is not None and not provisional and not self._is_fresh(path) and self.tree.populated(path):
            return LimitOutcome(t, LimitResult.LATE, f"{t.describe()}{was}: the container was already running")
        return LimitOutcome(t, LimitResult.APPLIED, f"{t.describe()}{was}")

    def _clear_unwanted(self, wanted: Mapping[tuple[str, int], object], computed_at: float) -> list[LimitOutcome]:
        """Clear the limits no target asks for any more. One set after the targets were computed (a cgroup that
        appeared since, programmed from fresher knowledge) stays; a provisional one is forgotten, not cleared
        (it was the sandbox's, or its container has its own target now)."""
        outcomes = []
        for key, old in list(self._programmed.items()):
            if key in wanted or self._programmed_at.get(key, -math.inf) > computed_at:
                continue
            self._forget(key)
            path, gpu = key
            if key in self._provisional or not self.tree.exists(path):
                self._provisional.discard(key)
                continue  # or removed with its cgroup, and its limits with it
            try:
                self.memory.set(gpu, path, 0, LIMIT_MAX)
            except (LimitsUnavailable, LimitFailed) as e:
                outcomes.append(LimitOutcome(old, LimitResult.FAILED, f"clearing: {e}"))
                continue
            outcomes.append(LimitOutcome(old, LimitResult.CLEARED))
        for key in [k for k in self._failing if k not in wanted]:
            del self._failing[key]
        return outcomes

    def _forget(self, key: tuple[str, int]) -> None:
        self._programmed.pop(key, None)
        self._programmed_at.pop(key, None)

    def _refresh_usage(self, ticket: int) -> None:
        outcomes: list[LimitOutcome] = []
        try:
            self._program_appeared(outcomes)
            now = self.clock.now()
            for (path, _), f in list(self._failing.items()):
                if now >= f.due_at:
                    self._try(path, f.target, now, outcomes, provisional=f.provisional)
            usage: dict[SubjectKey, int] = {}
            for (path, gpu), t in list(self._programmed.items()):
                if t.pending or t.container is None:
                    continue  # a pod's own cgroup: its containers' rows carry the usage
                self._take_appeared(outcomes)
                try:
                    current = self.memory.get(gpu, path)
                except (LimitsUnavailable, LimitFailed):
                    continue  # the next reconcile reports it
                if current is not None:
                    usage[t.key] = current.used_bytes
        except _GiveUp:
            return
        self._publish(outcomes, (ticket, usage))

    def _publish(self, outcomes: list[LimitOutcome], usage: tuple[int, dict[SubjectKey, int]] | None = None) -> None:
        with self._lock:
            self._outcomes += outcomes
            self._held = {t.key: t for t in self._programmed.values()}
            if usage is not None:
                self._usage_ticket, self._usage = usage

    def _give_up(self, reason: str) -> None:
        if self._unavailable is None:
            self.log.warning("driver_limits_unavailable", reason=reason, fallback="reactive enforcement")
        self._unavailable = reason
        with self._lock:
            self._held = {}
            self._usage = {}


class _GiveUp(Exception):
    """The whole driver cannot hold limits: the task stops where it is."""


# How long a new cgroup whose pod is not known waits to be tried again (the pod source may lag the kubelet by a
# moment); after that, the reconcile's walk finds it once its pod has a quota.
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
