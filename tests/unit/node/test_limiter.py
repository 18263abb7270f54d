"""The driver limiter's decisions over a fake cgroup tree, a fake driver, a FakeClock and an inline worker: no root,
no cgroupfs (tests/node/test_limiter.py runs the real cgroupfs path)."""

from __future__ import annotations

import itertools
import posixpath
from collections.abc import Callable, Iterable
from dataclasses import replace

import pytest

from vramguard.base.worker import Inline, Runner
from vramguard.core.driver_limit import HeldLimit, LimitKey, LimitSetter, LimitTarget
from vramguard.core.limit_plan import wanted_limits
from vramguard.core.pod import PodInfo
from vramguard.core.policy import Mode, Policy
from vramguard.core.ports import LIMIT_MAX, DriverLimit, LimitsSupport
from vramguard.core.process import CgroupIdentity
from vramguard.core.quantity import GiB
from vramguard.core.quota import QuotaBook
from vramguard.core.sample import GpuDevice
from vramguard.core.snapshot import ContainerUsage
from vramguard.node.cgroup_tree import CgroupTree
from vramguard.node.limiter import DriverLimiter, probe_limits, read_held_limits
from vramguard_testbed.fakes import FakeClock, FakeMemoryLimiter, container_id, gpu, pod

QUOTA = "vramguard.io/vram"
KILL = Policy(mode=Mode.KILL)
# Never read: every directory lives in a FakeTree, so a stray cgroupfs read would find nothing here.
ROOT = "/nonexistent/vramguard-unit/cgroup"

TRAINER = pod("trainer", "ml", containers={"main": {QUOTA: "8Gi"}})
SHARED = pod("shared", "ml", annotations={"vramguard.io/vram-limit": "6Gi"})
PAIR = pod("pair", "ml", containers={"a": {QUOTA: "8Gi"}, "b": {QUOTA: "4Gi"}})
TWINS = pod("twins", "ml", containers={"a": {QUOTA: "4Gi"}, "b": {QUOTA: "4Gi"}})

Result = tuple[str, "str | None", int]  # (result, container, GPU index) of a LimitOutcome


class FakeTree:
    """A kubelet-shaped cgroup v2 tree as a dict of directory → whose it is: `pod` and `container` make
    directories, `remove` takes one away with everything below it, `run_in` puts a process in one; `v2=False` is
    a v1-only host. `reads` counts the calls, to prove a limiter that gave up reads nothing."""

    def __init__(self, *, v2: bool = True) -> None:
        self.root = ROOT
        self.v2 = v2
        self.dirs: dict[str, CgroupIdentity] = {}
        self.running: set[str] = set()
        self.reads = 0

    def pod(self, uid: str) -> str:
        path = f"{ROOT}/kubepods/besteffort/pod{uid}"
        self.dirs[path] = CgroupIdentity(pod_uid=uid, container_id=None, qos="besteffort")
        return path

    def container(self, pod_dir: str, cid: str) -> str:
        path = f"{pod_dir}/{cid}"
        self.dirs[path] = replace(self.dirs[pod_dir], container_id=cid)
        return path

    def remove(self, path: str) -> None:
        for p in [p for p in self.dirs if p == path or p.startswith(f"{path}/")]:
            del self.dirs[p]
            self.running.discard(p)

    def run_in(self, path: str) -> None:
        self.running.add(path)

    def v2_root(self) -> str | None:
        self.reads += 1
        return ROOT if self.v2 else None

    def locate(self, hierarchy: str, pod_uids: Iterable[str]) -> dict[tuple[str, str | None], str]:
        self.reads += 1
        assert hierarchy == ROOT
        wanted = set(pod_uids)
        found: dict[tuple[str, str | None], str] = {}
        for path, identity in sorted(self.dirs.items()):
            if identity.pod_uid in wanted:
                found.setdefault((identity.pod_uid, identity.container_id), path)
        return found

    def exists(self, path: str) -> bool:
        self.reads += 1
        return path in self.dirs

    def sibling_container_ids(self, path: str) -> set[str]:
        self.reads += 1
        parent = posixpath.dirname(path)
        return {i.container_id for p, i in self.dirs.items() if posixpath.dirname(p) == parent and i.container_id}

    def populated(self, path: str) -> bool:
        self.reads += 1
        return any(p == path or p.startswith(f"{path}/") for p in self.running)


def _is_a_tree(tree: FakeTree) -> CgroupTree:
    return tree  # mypy checks that the fake keeps to the Protocol


class Bench:
    """Pods with quotas, their cgroups in a FakeTree, a fake driver on two 24 GiB GPUs, and the limiter over
    them, its worker inline."""

    def __init__(self, *, v2: bool = True, runner: Runner | None = None) -> None:
        self.tree = FakeTree(v2=v2)
        self.driver = FakeMemoryLimiter()
        self.clock = FakeClock(0.0)
        self.devices = [gpu(0, 24 * GiB), gpu(1, 24 * GiB)]
        self.known: dict[str, PodInfo] = {}  # what the agent's sources know, for the limiter's plan
        self.limiter = self.make_limiter(runner)

    def make_limiter(self, runner: Runner | None = None) -> DriverLimiter:
        return DriverLimiter(
            self.driver,
            runner=runner if runner is not None else Inline(),
            resync_s=30,
            retry_s=2,
            clock=self.clock,
            plan=self.plan,
            tree=_is_a_tree(self.tree),
        )

    def plan(self, uid: str) -> tuple[LimitTarget, ...] | None:
        found = self.known.get(uid)
        return None if found is None else self.targets(found)

    def targets(self, *pods: PodInfo, policy: Policy = KILL) -> tuple[LimitTarget, ...]:
        by_uid = {p.uid: p for p in pods}
        quotas, _ = QuotaBook(policy).resolve(by_uid, {})
        return wanted_limits(by_uid, quotas, self.devices, policy)

    def start(self, p: PodInfo) -> str:
        """Make the pod's cgroup and one for each container its status names; the pod's directory."""
        pod_dir = self.tree.pod(p.uid)
        for c in p.containers:
            if c.container_id:
                self.tree.container(pod_dir, c.container_id)
        return pod_dir

    def at(self, now: float) -> None:
        self.clock.step(now - self.clock.now())

    def update(self, targets: tuple[LimitTarget, ...], now: float) -> list[Result]:
        self.at(now)
        self.limiter.update(targets, [0, 1], now)
        return self.collect()

    def appeared(self, path: str, *, fresh: bool = True) -> list[Result]:
        identity = self.tree.dirs[path]
        self.limiter.appeared(path, identity, fresh)
        return self.collect()

    def collect(self) -> list[Result]:
        return sorted(((o.result, o.target.container, o.target.gpu_index) for o in self.limiter.collect()), key=str)

    def held(self, path: str) -> list[int]:
        return [hard for (_, cgroup), (_, hard) in sorted(self.driver.limits.items()) if cgroup == path]

    def sets(self, path: str | None = None) -> int:
        return len([s for s in self.driver.sets() if path is None or s[1] == path])


def ctr_dir(pod_dir: str, p: PodInfo, name: str = "main") -> str:
    cid = next(c.container_id for c in p.containers if c.name == name)
    assert cid is not None
    return f"{pod_dir}/{cid}"


def not_started(p: PodInfo) -> PodInfo:
    """The pod as its status reads before the runtime made any container: no container IDs."""
    return replace(p, containers=tuple(replace(c, container_id=None) for c in p.containers))


def with_quota(p: PodInfo, quota: str) -> PodInfo:
    return replace(p, containers=tuple(replace(c, limits={QUOTA: quota}) for c in p.containers))


def each(result: str, *containers: str | None) -> list[Result]:
    """`result` for each of `containers` on both GPUs, sorted as `Bench.collect` sorts."""
    return sorted(((result, c, g) for c in containers for g in (0, 1)), key=str)


@pytest.fixture
def bench() -> Bench:
    return Bench()


# -- a reconcile: the targets the scan hands over, the cgroups the tree has ---------------------------------------


def test_each_cgroup_gets_its_limit_the_pods_holding_the_sum(bench: Bench) -> None:
    """The containers' cgroups and their pods' own get their hard limit on every GPU; `held` says so by key."""
    trainer, shared = bench.start(TRAINER), bench.start(SHARED)
    assert bench.update(bench.targets(TRAINER, SHARED), now=0) == each("applied", None, None, "main")
    assert bench.held(ctr_dir(trainer, TRAINER)) == bench.held(trainer) == [8 * GiB, 8 * GiB]
    assert bench.held(shared) == [6 * GiB, 6 * GiB]
    assert set(bench.limiter.held()) == {
        LimitKey(p.uid, c, g.uuid) for p, c in ((TRAINER, "main"), (TRAINER, None), (SHARED, None))
        for g in bench.devices
    }  # fmt: skip


@pytest.mark.parametrize(
    ("then", "now", "expected", "held"),
    [
        pytest.param(TRAINER, 1, [], [8 * GiB] * 2, id="unchanged-targets-only-refresh-usage"),
        pytest.param(TRAINER, 31, [], [8 * GiB] * 2, id="the-resync-finds-it-held-and-sets-nothing"),
        pytest.param(
            with_quota(TRAINER, "10Gi"), 2, each("applied", None, "main"), [10 * GiB] * 2, id="a-changed-quota-is-set"
        ),
        pytest.param(None, 2, each("cleared", None, "main"), [], id="a-quota-gone-is-cleared-never-left-behind"),
    ],
)
def test_a_limit_is_set_only_when_it_changes(
    bench: Bench, then: PodInfo | None, now: float, expected: list[Result], held: list[int]
) -> None:
    """A limit the driver holds is not programmed again; a changed one is, a limit no longer wanted is cleared."""
    pod_dir = bench.start(TRAINER)
    bench.update(bench.targets(TRAINER), now=0)
    before = bench.sets()
    assert bench.update(bench.targets(then) if then is not None else (), now=now) == expected
    assert bench.sets() - before == len(expected), "one write per outcome, none without"
    assert bench.held(ctr_dir(pod_dir, TRAINER)) == held


def test_a_changed_limit_says_what_it_was(bench: Bench) -> None:
    """The outcome of a reprogrammed limit names the limit the driver held before."""
    bench.start(TRAINER)
    bench.update(bench.targets(TRAINER), now=0)
    bench.limiter.update(bench.targets(with_quota(TRAINER, "10Gi")), [0, 1], 1)
    assert all("(was 8589934592 bytes)" in o.detail for o in bench.limiter.collect())


def test_a_cleared_limit_is_set_to_no_limit(bench: Bench) -> None:
    """Clearing writes soft 0 and hard LIMIT_MAX, the driver's "no limit"."""
    bench.start(TRAINER)
    bench.update(bench.targets(TRAINER), now=0)
    bench.update((), now=1)
    assert bench.driver.limits == {} and bench.driver.sets()[-1][2:] == (0, LIMIT_MAX)


def test_an_agent_restart_finds_the_limits_held_and_sets_nothing(bench: Bench) -> None:
    """A new limiter (the agent restarted) reports each held limit as unchanged and writes nothing."""
    bench.start(TRAINER)
    bench.update(bench.targets(TRAINER), now=0)
    sets = bench.sets()
    bench.limiter = bench.make_limiter()
    assert bench.update(bench.targets(TRAINER), now=1) == each("unchanged", None, "main")
    assert bench.sets() == sets


@pytest.mark.parametrize(
    ("running", "expected"),
    [
        pytest.param(False, "applied", id="a-container-not-running-yet-is-applied"),
        pytest.param(True, "late", id="a-container-found-running-without-its-limit-is-late"),
    ],
)
def test_a_container_running_before_its_limit_is_late(bench: Bench, running: bool, expected: str) -> None:
    """A reconcile that finds processes in a container's cgroup it had to limit says the limit came late."""
    pod_dir = bench.start(TRAINER)
    if running:
        bench.tree.run_in(ctr_dir(pod_dir, TRAINER))
    outcomes = bench.update(bench.targets(TRAINER), now=0)
    assert outcomes == sorted([*each(expected, "main"), *each("applied", None)], key=str)


def test_a_restarted_container_is_programmed_again_and_its_old_cgroup_forgotten(bench: Bench) -> None:
    """A restart makes a new cgroup: once the status names it, it gets the limit; the old cgroup, removed with
    its limit, is forgotten without a write."""
    pod_dir = bench.start(TRAINER)
    old = ctr_dir(pod_dir, TRAINER)
    bench.update(bench.targets(TRAINER), now=0)
    bench.tree.remove(old)
    restarted = replace(TRAINER, containers=(replace(TRAINER.containers[0], container_id=container_id("x", "y")),))
    new = bench.tree.container(pod_dir, container_id("x", "y"))
    before = bench.sets(old)
    assert bench.update(bench.targets(restarted), now=1) == each("applied", "main")
    assert bench.held(new) == [8 * GiB, 8 * GiB]
    assert bench.sets(old) == before


def test_a_pod_gone_is_forgotten_without_clearing(bench: Bench) -> None:
    """A pod deleted with its cgroups took its limits with it: nothing to clear, nothing to report."""
    pod_dir = bench.start(TRAINER)
    bench.update(bench.targets(TRAINER), now=0)
    sets = bench.sets()
    bench.tree.remove(pod_dir)
    assert bench.update((), now=1) == []
    assert bench.sets() == sets and bench.limiter.held() == {}


@pytest.mark.parametrize(
    ("watching", "found_at"),
    [
        pytest.param(False, 2, id="without-the-watcher-looked-for-again-after-retry_s"),
        pytest.param(True, 30, id="with-the-watcher-looked-for-only-at-the-resync"),
    ],
)
def test_a_cgroup_that_is_not_there_yet(bench: Bench, watching: bool, found_at: float) -> None:
    """A target whose cgroup is missing is looked for again soon, unless the watcher will report it (then a
    cgroup gone for good, an init container that completed, costs nothing until the resync)."""
    if watching:
        bench.limiter.watched()
    targets = bench.targets(TRAINER)
    assert bench.update(targets, now=0) == []
    bench.start(TRAINER)
    calls = len(bench.driver.calls)
    found = next(now for now in range(1, 60) if bench.update(targets, now=now))
    assert found == found_at
    assert len([c for c in bench.driver.calls[calls:] if c[0] == "set"]) == 4


def test_a_warn_only_policy_or_an_exempt_namespace_programs_nothing(bench: Bench) -> None:
    """No enforcing mode, no targets: the limiter writes nothing (warn mode never limits)."""
    bench.start(TRAINER)
    for policy in (Policy(mode=Mode.WARN), replace(KILL, exempt_namespaces=frozenset({"ml"}))):
        assert bench.update(bench.targets(TRAINER, policy=policy), now=0) == []
    assert bench.sets() == 0


# -- the provisional limit of a container cgroup the status does not name yet ----------------------------------------


def test_an_unnamed_container_cgroup_gets_its_pods_not_started_limit_announced_once(bench: Bench) -> None:
    """The pod's one not-started container's limit goes on every unnamed container cgroup of the pod (the
    sandbox's too, harmlessly): one report per limit, not one per cgroup."""
    fresh = not_started(TRAINER)
    pod_dir = bench.tree.pod(fresh.uid)
    sandbox = bench.tree.container(pod_dir, container_id(fresh.uid, "sandbox"))
    ctr = bench.tree.container(pod_dir, container_id(fresh.uid, "main"))
    assert bench.update(bench.targets(fresh), now=0) == each("applied", None, "main")
    assert bench.held(sandbox) == bench.held(ctr) == [8 * GiB, 8 * GiB]


def test_a_provisional_limit_no_longer_wanted_is_forgotten_not_cleared(bench: Bench) -> None:
    """A provisional limit (maybe the sandbox's) is not cleared when the pod's quota goes: the pod's own is."""
    fresh = not_started(TRAINER)
    pod_dir = bench.tree.pod(fresh.uid)
    ctr = bench.tree.container(pod_dir, container_id(fresh.uid, "main"))
    bench.update(bench.targets(fresh), now=0)
    before = bench.sets(ctr)
    assert bench.update((), now=1) == each("cleared", None)
    assert bench.sets(ctr) == before


def test_a_provisional_limit_the_status_then_names_is_not_set_again(bench: Bench) -> None:
    """Once the status names the container, the reconcile finds its limit held: no write, no report."""
    fresh = not_started(TRAINER)
    pod_dir = bench.tree.pod(fresh.uid)
    bench.tree.container(pod_dir, container_id(TRAINER.uid, "main"))
    bench.update(bench.targets(fresh), now=0)
    sets = bench.sets()
    assert bench.update(bench.targets(TRAINER), now=1) == []
    assert bench.sets() == sets


# -- a cgroup the watcher hands over ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("known", "which", "fresh", "running", "expected"),
    [
        pytest.param(not_started(TRAINER), "pod", True, False, each("applied", None), id="a-pods-cgroup"),
        pytest.param(TRAINER, "named", True, False, each("applied", "main"), id="a-named-container-gets-its-own"),
        pytest.param(
            not_started(TRAINER), "new", True, False, each("applied", "main"), id="the-one-not-started-container"
        ),
        pytest.param(TRAINER, "named", True, True, each("applied", "main"), id="fresh-and-running-is-not-late"),
        pytest.param(TRAINER, "named", False, True, each("late", "main"), id="found-running-at-start-is-late"),
        pytest.param(TRAINER, "named", False, False, each("applied", "main"), id="found-at-start-idle-is-applied"),
        pytest.param(
            not_started(TWINS), "new", True, False, each("applied", "a"), id="not-started-twins-share-one-limit"
        ),
        pytest.param(not_started(PAIR), "new", True, False, [], id="not-started-with-different-quotas-wait"),
        pytest.param(TRAINER, "new", True, False, [], id="a-restarted-container-waits-for-the-status"),
        pytest.param(None, "pod", True, False, [], id="a-pod-not-known-yet-is-parked"),
    ],
)
def test_a_cgroup_that_appears(
    bench: Bench, known: PodInfo | None, which: str, fresh: bool, running: bool, expected: list[Result]
) -> None:
    """A new cgroup is programmed at once from what the sources know of its pod, before anything runs in it."""
    p = known if known is not None else TRAINER
    pod_dir = bench.tree.pod(p.uid)
    if known is not None:
        bench.known[p.uid] = known
    path = {
        "pod": pod_dir,
        "named": f"{pod_dir}/{TRAINER.containers[0].container_id}",
        "new": f"{pod_dir}/{container_id(p.uid, 'new')}",
    }[which]
    if path != pod_dir:
        bench.tree.container(pod_dir, path.rsplit("/", 1)[1])
    if running:
        bench.tree.run_in(path)
    assert bench.appeared(path, fresh=fresh) == expected
    assert bench.limiter.retry_parked() is (known is None)


def test_a_container_starting_next_to_a_running_one_gets_the_not_started_ones_limit(bench: Bench) -> None:
    """The pod's container cgroups that exist tell which containers run: a new one is the not-started one's."""
    a, b = PAIR.containers
    half = replace(PAIR, containers=(a, replace(b, container_id=None)))
    bench.known[half.uid] = half
    pod_dir = bench.tree.pod(half.uid)
    assert a.container_id is not None
    bench.tree.container(pod_dir, a.container_id)
    new = bench.tree.container(pod_dir, container_id(half.uid, "b"))
    assert bench.appeared(new) == each("applied", "b")
    assert bench.held(new) == [4 * GiB, 4 * GiB]


def test_a_parked_cgroup_is_programmed_once_its_pod_is_known(bench: Bench) -> None:
    """A cgroup whose pod the sources do not know yet waits in the queue; it is looked up again each
    `lookup_retry_s` on the clock, and programmed once the sources know its pod."""
    pod_dir = bench.tree.pod(TRAINER.uid)
    assert bench.appeared(pod_dir) == [] and bench.limiter.retry_parked()
    bench.known[TRAINER.uid] = TRAINER
    assert bench.limiter.retry_parked() and bench.collect() == [], "not due yet"
    bench.at(0.1)
    assert not bench.limiter.retry_parked()
    assert bench.collect() == each("applied", None)


def test_a_parked_cgroup_is_dropped_after_30s_and_the_reconcile_finds_it(bench: Bench) -> None:
    """A pod the sources never learn of: its cgroup is looked up no more after 30 s; the next reconcile finds it."""
    pod_dir = bench.tree.pod(TRAINER.uid)
    bench.appeared(pod_dir)
    bench.at(29)
    assert bench.limiter.retry_parked()
    bench.at(30)
    assert not bench.limiter.retry_parked()
    bench.known[TRAINER.uid] = TRAINER
    bench.at(31)
    assert not bench.limiter.retry_parked() and bench.collect() == []
    assert bench.update(bench.targets(TRAINER), now=32) == each("applied", None)


def test_a_limit_set_from_a_fresher_plan_is_not_cleared_by_an_older_reconcile(bench: Bench) -> None:
    """A cgroup programmed after the scan computed its targets is newer than them: that reconcile leaves it."""
    bench.known[TRAINER.uid] = TRAINER
    pod_dir = bench.tree.pod(TRAINER.uid)
    bench.at(5)
    bench.appeared(pod_dir)
    bench.at(6)
    bench.limiter.update((), [0, 1], 4)  # targets computed at 4, before the cgroup appeared
    assert bench.held(pod_dir) == [8 * GiB, 8 * GiB]


class Queued(Inline):
    """A worker that runs its tasks only when told to (`run`), as a busy thread would."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks: list[Callable[[], None]] = []

    def submit(self, task: Callable[[], None]) -> bool:
        self.tasks.append(task)
        return True

    def run(self) -> None:
        tasks, self.tasks = self.tasks, []
        for task in tasks:
            task()


def test_the_watcher_keeps_ticking_while_a_cgroup_waits() -> None:
    """Handed over but not yet taken by the busy worker, or parked until its pod is known: either way the
    watcher is told to call again."""
    queued = Queued()
    bench = Bench(runner=queued)
    pod_dir = bench.tree.pod(TRAINER.uid)
    bench.limiter.appeared(pod_dir, bench.tree.dirs[pod_dir])
    assert bench.limiter.retry_parked(), "handed over, not taken yet"
    queued.run()
    assert bench.limiter.retry_parked(), "parked: its pod is not known"
    bench.known[TRAINER.uid] = TRAINER
    bench.at(0.1)  # its next lookup is due
    queued.run()
    assert not bench.limiter.retry_parked()
    assert bench.held(pod_dir) == [8 * GiB, 8 * GiB]


def test_a_cgroup_handed_over_twice_before_it_is_taken_is_looked_up_once() -> None:
    """One key per cgroup: a second hand-over of a cgroup still waiting (an inotify overflow's rescan) asks the
    sources for its pod once."""
    queued = Queued()
    bench = Bench(runner=queued)
    bench.known[TRAINER.uid] = TRAINER
    asked: list[str] = []

    def plan(uid: str) -> tuple[LimitTarget, ...] | None:
        asked.append(uid)
        return bench.plan(uid)

    bench.limiter.plan = plan
    pod_dir = bench.tree.pod(TRAINER.uid)
    bench.limiter.appeared(pod_dir, bench.tree.dirs[pod_dir])
    bench.at(1)
    bench.limiter.appeared(pod_dir, bench.tree.dirs[pod_dir], fresh=False)
    queued.run()
    assert asked == [TRAINER.uid]
    assert bench.collect() == each("applied", None)


class _Hooked(FakeMemoryLimiter):
    """A driver that runs `hook` once, on the first `get` of `path`."""

    def __init__(self, path: str, hook: Callable[[], None]) -> None:
        super().__init__()
        self.path, self.hook = path, hook

    def get(self, gpu_index: int, cgroup: str) -> DriverLimit | None:
        if cgroup == self.path:
            hook, self.hook = self.hook, lambda: None
            hook()
        return super().get(gpu_index, cgroup)


def test_a_cgroup_that_appears_during_a_reconcile_goes_before_the_rest_of_it() -> None:
    """Between two limits of a long reconcile, a new cgroup is programmed first, before its process starts."""
    queued = Queued()
    bench = Bench(runner=queued)
    trainer_dir, shared_dir = bench.start(TRAINER), bench.start(SHARED)
    bench.known[PAIR.uid] = PAIR
    fresh_dir = bench.tree.pod(PAIR.uid)
    bench.driver = _Hooked(trainer_dir, lambda: bench.limiter.appeared(fresh_dir, bench.tree.dirs[fresh_dir]))
    bench.limiter = bench.make_limiter(queued)
    bench.limiter.update(bench.targets(TRAINER, SHARED), [0, 1], 0)
    bench.at(1)  # the worker runs after the scan computed its targets
    queued.run()
    order = [cgroup for _, cgroup, _, _ in bench.driver.sets()]
    assert order.index(fresh_dir) < max(i for i, c in enumerate(order) if c == shared_dir)
    assert bench.held(fresh_dir) == [12 * GiB, 12 * GiB]


# -- the driver says no -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("v2", "older_driver", "unavailable"),
    [
        pytest.param(False, False, f"no cgroup v2 hierarchy under {ROOT}", id="a-cgroup-v1-host"),
        pytest.param(True, True, "the driver has no nvmlDeviceGetMemoryLimits_v1", id="a-driver-before-r615"),
    ],
)
def test_a_node_that_cannot_hold_limits_gives_up_once(v2: bool, older_driver: bool, unavailable: str) -> None:
    """No cgroup v2 or no limits in the driver: the limiter says why, holds nothing, and never looks again."""
    bench = Bench(v2=v2)
    bench.driver.older_driver = older_driver
    pod_dir = bench.start(TRAINER)
    assert bench.update(bench.targets(TRAINER), now=0) == []
    assert bench.limiter.unavailable is not None and bench.limiter.unavailable.startswith(unavailable)
    assert bench.limiter.held() == {} and bench.sets() == 0
    calls, reads = len(bench.driver.calls), bench.tree.reads
    bench.update(bench.targets(TRAINER), now=100)
    bench.appeared(pod_dir)
    assert (len(bench.driver.calls), bench.tree.reads) == (calls, reads), "never asked again"
    assert not bench.limiter.retry_parked()


def test_a_gpu_without_support_falls_back_alone(bench: Bench) -> None:
    """A GPU that answers NOT_SUPPORTED is left to reactive enforcement; the other GPUs get their limits."""
    bench.driver.unsupported_gpus = {1}
    bench.start(TRAINER)
    assert bench.update(bench.targets(TRAINER), now=0) == [("applied", "main", 0), ("applied", None, 0)]
    assert bench.limiter.unsupported_gpus() == {1: "GPU 1 does not support memory limits"}
    assert bench.limiter.unavailable is None


@pytest.mark.parametrize(
    ("v2", "older_driver", "unsupported", "failing", "possible", "reason"),
    [
        pytest.param(True, False, set(), False, True, "", id="every-gpu-can"),
        pytest.param(True, False, {1}, False, True, "GPU 1 does not support memory limits", id="one-gpu-cannot"),
        pytest.param(True, False, {0, 1}, False, False,
                     "GPU 0 does not support memory limits; GPU 1 does not support memory limits", id="no-gpu-can"),
        pytest.param(True, True, set(), False, False, "the driver has no nvmlDeviceGetMemoryLimits_v1",
                     id="a-driver-before-r615"),
        pytest.param(False, False, set(), False, False,
                     f"no cgroup v2 hierarchy under {ROOT} (the driver's limits need cgroup v2)",
                     id="a-cgroup-v1-host"),
        pytest.param(True, False, set(), True, None, f"cannot open {ROOT}", id="an-error-is-not-a-no"),
    ],
)  # fmt: skip
def test_probe_limits_asks_the_root_on_each_gpu(
    v2: bool, older_driver: bool, unsupported: set[int], failing: bool, possible: bool | None, reason: str
) -> None:
    """The driver is asked for the limits of the cgroup v2 root on each GPU: possible where one GPU can, not where
    none can or the node cannot at all (each saying why), unknown where the driver only answered errors."""
    driver = FakeMemoryLimiter()
    driver.older_driver, driver.unsupported_gpus = older_driver, unsupported
    if failing:
        driver.failing = {ROOT}
    support = probe_limits(driver, _is_a_tree(FakeTree(v2=v2)), [0, 1])
    assert (support.possible, support.reason) == (possible, reason)
    assert driver.sets() == [], "asking sets nothing"
    assert {cgroup for _, _, cgroup, _, _ in driver.calls} <= {ROOT}


@pytest.mark.parametrize(
    ("older_driver", "unsupported", "asked"),
    [
        pytest.param(True, set(), [0], id="whole-driver-stops-at-the-first-gpu"),
        pytest.param(False, {0}, [0, 1, 2], id="one-gpu-the-others-still-asked"),
    ],
)
def test_limits_unavailable_says_how_far(older_driver: bool, unsupported: set[int], asked: list[int]) -> None:
    """The whole driver (no symbol) or one GPU (NOT_SUPPORTED): the limiter stops asking accordingly, at the first
    GPU or going on to the others (counted in the fake driver's calls)."""
    driver = FakeMemoryLimiter()
    driver.older_driver, driver.unsupported_gpus = older_driver, unsupported
    probe_limits(driver, _is_a_tree(FakeTree()), [0, 1, 2])
    assert [gpu for _, gpu, _, _, _ in driver.calls] == asked


def test_probe_limits_without_a_whole_gpu_says_so() -> None:
    """No whole GPU to ask about (none, or all split into MIG instances): not possible, and why."""
    support = probe_limits(FakeMemoryLimiter(), _is_a_tree(FakeTree()), [])
    assert (support.possible, support.reason) == (False, "no whole, healthy GPU to hold a limit (MIG instances cannot)")


def test_the_limiters_support_is_its_probe_and_what_it_learned_since(bench: Bench) -> None:
    """`support()` is None until the first update's probe ran, then the probe's answer, with the GPUs found
    unsupported or the node found unable since."""
    assert bench.limiter.support() is None
    bench.start(TRAINER)
    bench.update(bench.targets(TRAINER), now=0)
    probed = bench.limiter.support()
    assert probed == LimitsSupport((0, 1)) and probed.possible is True

    bench.driver.older_driver = True  # the driver is swapped under the agent: the next reconcile finds out
    bench.update(bench.targets(TRAINER, SHARED), now=40)
    found = bench.limiter.support()
    assert found is not None and (found.possible, found.reason) == (
        False,
        "the driver has no nvmlDeviceGetMemoryLimits_v1",
    )


def test_failures_back_off_per_target_and_are_reported_once_per_run(bench: Bench) -> None:
    """A failing limit is retried ever more rarely (2 s doubling, jittered, up to 300 s), reported when its run of
    failures starts and when it ends; the limits that work are set once."""
    pod_dir = bench.start(TRAINER)
    ctr = ctr_dir(pod_dir, TRAINER)
    bench.driver.failing = {ctr}
    targets = bench.targets(TRAINER)
    assert bench.update(targets, now=0) == sorted([*each("applied", None), *each("failed", "main")], key=str)
    assert bench.limiter.failing() == 2

    def tries() -> int:
        return len([c for c in bench.driver.calls if c[1:3] == (0, ctr)])

    attempts = []
    for now in range(1, 400):  # a scan every second for 400 s
        before = tries()
        assert bench.update(targets, now=now) == [], "a failure is reported once per run of failures"
        if tries() > before:
            attempts.append(now)
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert 2 <= attempts[0] <= 3 and 5 <= len(attempts) <= 9, attempts
    assert all(b >= a - 1 for a, b in itertools.pairwise(gaps)) and gaps[-1] >= 64, gaps  # scans are 1 s apart
    assert bench.sets(pod_dir) == 2, "the pod's: set once"
    bench.driver.failing = set()
    now, outcomes = 400, []
    while bench.limiter.failing():
        bench.at(now)
        bench.limiter.update(targets, [0, 1], now)
        outcomes += bench.limiter.collect()
        now += 1
    assert sorted((o.result, o.target.gpu_index) for o in outcomes) == [("applied", 0), ("applied", 1)]
    assert all(o.detail.endswith("failed attempts)") for o in outcomes)
    bench.driver.failing = {ctr}
    assert ("failed", "main", 0) in bench.update(bench.targets(with_quota(TRAINER, "9Gi")), now=now + 1), "a new run"


def test_a_new_plan_waits_for_a_failing_limits_back_off_and_retries_what_is_wanted_then(bench: Bench) -> None:
    """A changed quota does not retry a failing limit before its back-off ends; the retry sets the limit wanted by
    then, and reports it with the failed attempts."""
    pod_dir = bench.start(TRAINER)
    ctr = ctr_dir(pod_dir, TRAINER)
    bench.driver.failing = {ctr}
    bench.update(bench.targets(TRAINER), now=0)
    calls = len([c for c in bench.driver.calls if c[2] == ctr])
    bigger = bench.targets(with_quota(TRAINER, "10Gi"))
    assert bench.update(bigger, now=1) == each("applied", None)
    assert len([c for c in bench.driver.calls if c[2] == ctr]) == calls, "not retried before its back-off"
    bench.driver.failing = set()
    outcomes = bench.update(bigger, now=4)  # the first back-off is 2 to 3 s
    assert outcomes == each("applied", "main") and bench.held(ctr) == [10 * GiB, 10 * GiB]
    assert bench.limiter.failing() == 0


def test_a_failing_limit_no_longer_wanted_stops_being_retried(bench: Bench) -> None:
    """A cgroup gone before its limit went on (the driver cannot open it) fails once, then the reconcile that no
    longer wants it drops it: no retries."""
    bench.known[TRAINER.uid] = TRAINER
    pod_dir = bench.tree.pod(TRAINER.uid)
    bench.driver.failing = {pod_dir}
    assert bench.appeared(pod_dir) == each("failed", None)
    bench.tree.remove(pod_dir)
    assert bench.limiter.failing() == 2
    bench.update((), now=1)
    calls = len(bench.driver.calls)
    for now in range(2, 400):
        bench.update((), now=now)
    assert bench.limiter.failing() == 0 and len(bench.driver.calls) == calls


# -- a limit NVIDIA's container toolkit hook set (R615+: NVIDIA_GPU_MEMORY_REQUEST soft, _LIMIT hard) ---------------

MiB = 2**20
HOOKED = replace(
    TRAINER,
    containers=tuple(
        replace(c, limits={}, env={"NVIDIA_GPU_MEMORY_REQUEST": "4096", "NVIDIA_GPU_MEMORY_LIMIT": "8192"})
        for c in TRAINER.containers
    ),
)
AGENT, TOOLKIT = LimitSetter.AGENT, LimitSetter.TOOLKIT


def hook(bench: Bench, path: str, soft: int, hard: int) -> None:
    """Program `path` on both GPUs as `apply-cuda-memory-limits` does: the request soft, the limit hard (or none)."""
    for g in (0, 1):
        bench.driver.limits[(g, path)] = (soft, hard)


@pytest.mark.parametrize(
    ("declared", "soft", "hard"),
    [
        pytest.param(HOOKED, 4 * GiB, 8 * GiB, id="the-hooks-limit-is-the-quotas-same-cgroup-same-number"),
        pytest.param(TRAINER, 8 * GiB, 8 * GiB, id="a-limit-alone-the-hook-sets-it-soft-and-hard"),
        pytest.param(TRAINER, 4 * GiB, 6 * GiB, id="tighter-than-the-quota"),
        pytest.param(TRAINER, 4 * GiB, 12 * GiB, id="looser-than-the-quota-the-agent-enforces-the-quota-itself"),
        pytest.param(TRAINER, 4 * GiB, LIMIT_MAX, id="a-request-alone-the-hook-sets-no-hard-limit"),
    ],
)
def test_a_limit_the_toolkit_set_is_never_written_over(bench: Bench, declared: PodInfo, soft: int, hard: int) -> None:
    """A limit with a soft one is the toolkit's hook's (the agent writes none): the agent writes nothing there, at
    the first compare or the resync, says once per GPU that the toolkit holds it, and keeps it as held with the
    hook's hard limit and who set it. The pod's own cgroup, which the hook leaves alone, still gets the sum."""
    pod_dir = bench.start(declared)
    ctr = ctr_dir(pod_dir, declared)
    hook(bench, ctr, soft, hard)
    assert bench.update(bench.targets(declared), now=0) == each("applied", None) + each("toolkit", "main")
    assert bench.update(bench.targets(declared), now=31) == [], "the resync finds it so again: nothing new"
    changed = replace(declared, annotations={**declared.annotations, "team": "b"})
    assert bench.update(bench.targets(changed), now=32) == [], "new targets (the pod changed), the same hook's limit"
    assert bench.sets(ctr) == 0, "never written"
    assert bench.driver.limits[(0, ctr)] == (soft, hard)
    held = bench.limiter.held()
    own = held[LimitKey(declared.uid, "main", bench.devices[0].uuid)]
    assert (own.hard_bytes, own.set_by) == (hard, TOOLKIT)
    assert held[LimitKey(declared.uid, None, bench.devices[0].uuid)].set_by is AGENT


def test_the_toolkit_setting_its_limit_after_the_agent_is_not_fought(bench: Bench) -> None:
    """The agent's watcher may program a new container before the toolkit's hook runs, which then writes over it:
    the next compare finds the hook's limit, reports it, and writes nothing back."""
    pod_dir = bench.start(HOOKED)
    ctr = ctr_dir(pod_dir, HOOKED)
    bench.update(bench.targets(HOOKED), now=0)
    assert bench.held(ctr) == [8 * GiB, 8 * GiB] and bench.sets(ctr) == 2
    hook(bench, ctr, 4 * GiB, 8 * GiB)
    assert bench.update(bench.targets(HOOKED), now=31) == each("toolkit", "main")
    assert bench.sets(ctr) == 2 and bench.driver.limits[(1, ctr)] == (4 * GiB, 8 * GiB)


@pytest.mark.parametrize(
    "hooked_after_the_agent",
    [
        pytest.param(False, id="found-the-hooks-at-the-compare"),
        pytest.param(True, id="the-hook-wrote-over-the-agents-since-the-last-compare"),
    ],
)
def test_a_limit_the_toolkit_set_is_never_cleared(bench: Bench, hooked_after_the_agent: bool) -> None:
    """A quota no longer wanted (a policy turned to warn, a reload) clears the agent's own limits only: the
    toolkit's stays, even where the agent set one there first and the hook wrote over it since."""
    pod_dir = bench.start(HOOKED)
    ctr = ctr_dir(pod_dir, HOOKED)
    if not hooked_after_the_agent:
        hook(bench, ctr, 4 * GiB, 8 * GiB)
    bench.update(bench.targets(HOOKED), now=0)
    if hooked_after_the_agent:
        hook(bench, ctr, 4 * GiB, 8 * GiB)
    assert bench.update((), now=1) == each("cleared", None)
    assert bench.sets(ctr) == (2 if hooked_after_the_agent else 0), "no clear on the container's cgroup"
    assert bench.driver.limits[(0, ctr)] == bench.driver.limits[(1, ctr)] == (4 * GiB, 8 * GiB)


def test_usage_is_read_back_under_the_toolkits_limit(bench: Bench) -> None:
    """The driver's count of a container the toolkit's hook limits is read back as under the agent's own limit."""
    pod_dir = bench.start(HOOKED)
    ctr = ctr_dir(pod_dir, HOOKED)
    hook(bench, ctr, 4 * GiB, 8 * GiB)
    targets = bench.targets(HOOKED)
    bench.update(targets, now=0)
    bench.driver.used[(0, ctr)] = 5 * GiB
    bench.update(targets, now=1)
    assert bench.limiter.fresh_usage()[LimitKey(HOOKED.uid, "main", bench.devices[0].uuid)] == 5 * GiB


def test_a_request_alone_programs_nothing(bench: Bench) -> None:
    """NVIDIA_GPU_MEMORY_REQUEST alone is a soft limit with no hard one: no target, no write on the container's
    cgroup nor the pod's, and the hook's soft limit stays as it set it."""
    soft_only = replace(HOOKED, containers=tuple(replace(c, env={"NVIDIA_GPU_MEMORY_REQUEST": "4096"})
                                                 for c in HOOKED.containers))  # fmt: skip
    pod_dir = bench.start(soft_only)
    ctr = ctr_dir(pod_dir, soft_only)
    hook(bench, ctr, 4 * GiB, LIMIT_MAX)
    assert bench.targets(soft_only) == ()
    assert bench.update(bench.targets(soft_only), now=0) == []
    assert bench.sets() == 0 and bench.driver.limits[(0, ctr)] == (4 * GiB, LIMIT_MAX)


# -- the driver's count of a limited container's memory ------------------------------------------------------------


def test_usage_counts_only_when_read_since_the_last_update(bench: Bench) -> None:
    """`fresh_usage` is the driver's count read by the latest task, and nothing while that task has not run."""
    pod_dir = bench.start(TRAINER)
    targets = bench.targets(TRAINER)
    bench.update(targets, now=0)
    key = LimitKey(TRAINER.uid, "main", bench.devices[0].uuid)
    bench.driver.used[(0, ctr_dir(pod_dir, TRAINER))] = 3 * GiB
    assert key not in bench.limiter.fresh_usage(), "just set: nothing read back yet"
    bench.update(targets, now=1)  # a usage refresh
    assert bench.limiter.fresh_usage() == {key: 3 * GiB, LimitKey(TRAINER.uid, "main", bench.devices[1].uuid): 0}
    busy = Bench(runner=Queued())
    busy.limiter.update(targets, [0, 1], 0)
    assert busy.limiter.fresh_usage() == {}, "a task that has not run yet leaves no figure to use"


# -- what `vramguard top` shows ------------------------------------------------------------------------------------


def _rows(p: PodInfo, devices: Iterable[GpuDevice]) -> list[ContainerUsage]:
    return [ContainerUsage(p, c.name, c.container_id, d.uuid, 0, ()) for c in p.containers for d in devices]


@pytest.mark.parametrize(
    ("v2", "older_driver", "cleared", "expected"),
    [
        pytest.param(True, False, False, {"main": 8 * GiB, None: 8 * GiB}, id="the-containers-and-the-pods-own"),
        pytest.param(True, False, True, {None: 8 * GiB}, id="a-cleared-limit-is-not-shown"),
        pytest.param(False, False, False, {}, id="a-cgroup-v1-host-holds-none"),
        pytest.param(True, True, False, {}, id="a-driver-before-r615-holds-none"),
    ],
)
def test_read_held_limits(
    bench: Bench, v2: bool, older_driver: bool, cleared: bool, expected: dict[str | None, int]
) -> None:
    """The hard limits the driver holds for a scan's containers and their pods, found through the tree, each set by
    the agent."""
    pod_dir = bench.start(TRAINER)
    bench.update(bench.targets(TRAINER), now=0)
    if cleared:
        bench.driver.set(0, ctr_dir(pod_dir, TRAINER), 0, LIMIT_MAX)
    bench.tree.v2, bench.driver.older_driver = v2, older_driver
    held = read_held_limits(bench.driver, "/unused", _rows(TRAINER, bench.devices[:1]), bench.devices, tree=bench.tree)
    assert held == {LimitKey(TRAINER.uid, c, bench.devices[0].uuid): HeldLimit(b, AGENT) for c, b in expected.items()}


@pytest.mark.parametrize(
    ("soft", "hard", "expected"),
    [
        pytest.param(4 * GiB, 8 * GiB, HeldLimit(8 * GiB, LimitSetter.TOOLKIT), id="a-soft-limit-is-the-toolkits"),
        pytest.param(4 * GiB, LIMIT_MAX, None, id="a-request-alone-holds-no-hard-limit"),
    ],
)
def test_read_held_limits_says_who_set_each(bench: Bench, soft: int, hard: int, expected: HeldLimit | None) -> None:
    """`vramguard top` reads who set each limit from the driver itself: the toolkit's hook where it holds a soft
    limit; a limit with no hard one holds nothing."""
    pod_dir = bench.start(TRAINER)
    bench.driver.limits[(0, ctr_dir(pod_dir, TRAINER))] = (soft, hard)
    held = read_held_limits(bench.driver, "/unused", _rows(TRAINER, bench.devices[:1]), bench.devices, tree=bench.tree)
    assert held.get(LimitKey(TRAINER.uid, "main", bench.devices[0].uuid)) == expected
