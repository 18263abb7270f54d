"""The limiter programming driver-level limits into a fake driver, finding real cgroup v2 directories."""

from __future__ import annotations

import itertools
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from cgroup_fixtures import CgroupsFactory
from unit.node.test_limiter import Queued
from vramguard.base.clock import SYSTEM_CLOCK
from vramguard.base.worker import Inline
from vramguard.core.driver_limit import LimitKey, LimitTarget
from vramguard.core.limit_plan import wanted_limits
from vramguard.core.pod import PodInfo
from vramguard.core.policy import Mode, Policy
from vramguard.core.ports import LIMIT_MAX
from vramguard.core.quantity import GiB
from vramguard.core.quota import QuotaBook
from vramguard.node.cgroup import locate_cgroups, v2_root
from vramguard.node.limiter import DriverLimiter
from vramguard_testbed.cgroups import KubeletCgroups
from vramguard_testbed.fakes import FakeClock, FakeMemoryLimiter, gpu, pod
from vramguard_testbed.waiting import wait_until

QUOTA = "vramguard.io/vram"
KILL = Policy(mode=Mode.KILL)


PAIR = pod("pair", "ml", containers={"a": {QUOTA: "8Gi"}, "b": {QUOTA: "4Gi"}})


# -- the limiter, on real cgroup directories ---------------------------------------------------------------------


@pytest.fixture
def v2(make_cgroups: CgroupsFactory) -> KubeletCgroups:
    return make_cgroups(driver="cgroupfs", version=2)


class Node:
    """Two pods in real kubelet-shaped v2 cgroups, the limits their quotas call for, a fake driver."""

    def __init__(self, v2: KubeletCgroups) -> None:
        self.v2 = v2
        self.trainer_cg = v2.pod(qos="burstable")
        self.trainer_ctr = self.trainer_cg.container()
        self.shared_cg = v2.pod(qos="besteffort")
        self.trainer = pod("trainer", "ml", containers={"main": {QUOTA: "8Gi"}}, uid=self.trainer_cg.uid)
        self.trainer = replace(
            self.trainer, containers=(replace(self.trainer.containers[0], container_id=self.trainer_ctr.container_id),)
        )
        self.shared = pod("shared", "ml", annotations={"vramguard.io/vram-limit": "6Gi"}, uid=self.shared_cg.uid)
        self.driver = FakeMemoryLimiter()
        self.clock = FakeClock(0.0)
        self.known: dict[str, PodInfo] = {}  # what the agent's sources know, for the limiter's plan
        self.lookups = 0  # how often a threaded limiter asked for a pod's limits
        self.limiter = self.make_limiter()
        self.devices = [gpu(0, 24 * GiB), gpu(1, 24 * GiB)]
        self.policy = KILL

    def make_limiter(self) -> DriverLimiter:
        return DriverLimiter(self.driver, runner=Inline(), resync_s=30, retry_s=2, clock=self.clock, plan=self.plan)

    def at(self, now: float) -> None:
        """Set the clock to `now`."""
        self.clock.step(now - self.clock.now())

    def plan(self, uid: str) -> tuple[LimitTarget, ...] | None:
        found = self.known.get(uid)
        return None if found is None else self.targets(found)

    def targets(self, *pods: PodInfo) -> tuple[LimitTarget, ...]:
        by_uid = {p.uid: p for p in pods}
        quotas, _ = QuotaBook(self.policy).resolve(by_uid, {})
        return wanted_limits(by_uid, quotas, self.devices, self.policy)

    def update(self, targets: tuple[LimitTarget, ...], now: float) -> list[tuple[str, str | None, int, str]]:
        self.at(now)
        self.limiter.update(targets, [0, 1], now)
        return self.collect()

    def collect(self) -> list[tuple[str, str | None, int, str]]:
        return [(o.result, o.target.container, o.target.gpu_index, o.detail) for o in self.limiter.collect()]

    def held(self, path: str) -> list[int]:
        return [hard for (_, cgroup), (_, hard) in sorted(self.driver.limits.items()) if cgroup == path]


@pytest.fixture
def node(v2: KubeletCgroups) -> Node:
    return Node(v2)


def results(outcomes: list[tuple[str, str | None, int, str]]) -> list[tuple[str, str | None, int]]:
    return [o[:3] for o in outcomes]


def test_limits_go_on_the_containers_and_the_pods_own_cgroups(node: Node) -> None:
    outcomes = node.update(node.targets(node.trainer, node.shared), now=0)
    assert sorted(results(outcomes), key=str) == sorted(
        [("applied", c, g) for c in (None, None, "main") for g in (0, 1)], key=str
    )
    ctr, trainer, shared = node.trainer_ctr.dirs[0], node.trainer_cg.dirs[0], node.shared_cg.dirs[0]
    assert node.held(ctr) == node.held(trainer) == [8 * GiB, 8 * GiB]
    assert node.held(shared) == [6 * GiB, 6 * GiB]
    assert set(node.limiter.held()) == {
        (p.uid, c, g.uuid) for p, c in ((node.trainer, "main"), (node.trainer, None), (node.shared, None))
        for g in node.devices
    }  # fmt: skip


def test_a_container_found_running_without_its_limit_is_late(node: Node) -> None:
    node.trainer_ctr.spawn(["sleep", "60"])
    outcomes = node.update(node.targets(node.trainer), now=0)
    late = [o for o in outcomes if o[0] == "late"]
    assert [o[1:3] for o in late] == [("main", 0), ("main", 1)]
    assert "the container was already running" in late[0][3]


def test_idempotent_then_reapplied_when_the_quota_changes_then_cleared(node: Node) -> None:
    node.update(node.targets(node.trainer), now=0)
    sets = len(node.driver.sets())
    assert node.update(node.targets(node.trainer), now=1) == []  # unchanged targets: only usage is refreshed
    assert node.update(node.targets(node.trainer), now=31) == []  # the resync compares and finds it held
    assert len(node.driver.sets()) == sets
    bigger = replace(node.trainer, containers=(replace(node.trainer.containers[0], limits={QUOTA: "10Gi"}),))
    outcomes = node.update(node.targets(bigger), now=32)
    assert sorted(results(outcomes), key=str) == sorted(
        [("applied", c, g) for c in (None, "main") for g in (0, 1)], key=str
    )
    assert "(was 8589934592 bytes)" in outcomes[0][3]
    assert node.held(node.trainer_ctr.dirs[0]) == [10 * GiB, 10 * GiB]
    # The quota is gone (the pod was re-created without one): the limit is cleared, never left behind.
    assert [o[0] for o in node.update((), now=33)] == ["cleared"] * 4
    assert node.driver.limits == {}
    assert node.driver.sets()[-1][2:] == (0, LIMIT_MAX)


def test_an_agent_restart_sets_nothing(node: Node) -> None:
    node.update(node.targets(node.trainer), now=0)
    sets = len(node.driver.sets())
    restarted = node.make_limiter()
    restarted.update(node.targets(node.trainer), [0, 1], 0)
    assert [o.result for o in restarted.collect()] == ["unchanged"] * 4
    assert len(node.driver.sets()) == sets


def test_a_cgroup_that_is_not_there_yet_is_retried(node: Node, v2: KubeletCgroups) -> None:
    late = pod("late", "ml", containers={"main": {QUOTA: "2Gi"}})
    assert node.update(node.targets(late), now=0) == []
    assert node.update(node.targets(late), now=1) == []  # within retry_s
    late_cg = v2.pod(uid=late.uid, qos="besteffort").container(container_id=late.containers[0].container_id)
    assert [o[0] for o in node.update(node.targets(late), now=3)] == ["applied"] * 4
    assert node.held(late_cg.dirs[0]) == [2 * GiB, 2 * GiB]


def test_with_the_watcher_a_missing_cgroup_is_not_looked_for_again(node: Node, v2: KubeletCgroups) -> None:
    """A container's cgroup that is gone for good (an init container that completed) costs nothing: the watcher
    reports a new cgroup when it comes."""
    node.limiter.watched()
    late = pod("late", "ml", containers={"main": {QUOTA: "2Gi"}})
    node.update(node.targets(late), now=0)
    calls = len(node.driver.calls)
    for now in range(1, 29):
        node.update(node.targets(late), now=now)
    assert len(node.driver.calls) == calls, "no reconcile before the resync"


def test_an_older_driver_falls_back_once(node: Node) -> None:
    node.driver.older_driver = True
    assert node.update(node.targets(node.trainer), now=0) == []
    assert node.limiter.unavailable == "the driver has no nvmlDeviceGetMemoryLimits_v1"
    calls = len(node.driver.calls)
    node.update(node.targets(node.trainer), now=100)
    assert len(node.driver.calls) == calls, "never asked again"


def test_a_gpu_without_support_falls_back_alone(node: Node) -> None:
    node.driver.unsupported_gpus = {1}
    outcomes = node.update(node.targets(node.trainer), now=0)
    assert sorted(results(outcomes), key=str) == [("applied", "main", 0), ("applied", None, 0)]
    assert node.limiter.unsupported_gpus() == {1: "GPU 1 does not support memory limits"}


def test_failures_back_off_per_target_and_are_reported_once_per_run(node: Node) -> None:
    ctr = node.trainer_ctr.dirs[0]
    node.driver.failing = {ctr}
    targets = node.targets(node.trainer)
    assert sorted(results(node.update(targets, now=0)), key=str) == [
        ("applied", None, 0), ("applied", None, 1), ("failed", "main", 0), ("failed", "main", 1)
    ]  # fmt: skip
    assert node.limiter.failing() == 2

    def tries() -> int:
        return len([c for c in node.driver.calls if c[1:3] == (0, ctr)])

    attempts = []
    for now in range(1, 400):  # every scan for 400 s: the failing limits are tried ever more rarely
        before = tries()
        assert node.update(targets, now=now) == [], "a failure is reported once per run of failures"
        if tries() > before:
            attempts.append(now)
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert 5 <= len(attempts) <= 9, attempts  # 2 s doubling, with jitter, up to 300 s
    assert all(b >= a - 1 for a, b in itertools.pairwise(gaps)) and gaps[-1] >= 64, gaps  # scans are 1 s apart
    assert len([c for c in node.driver.calls if c[2] != ctr and c[0] == "set"]) == 2, "the pod's: set once"
    node.driver.failing = set()
    now, outcomes = 400, []
    while node.limiter.failing():
        outcomes += node.update(targets, now=now)
        now += 1
    assert sorted(results(outcomes)) == [("applied", "main", 0), ("applied", "main", 1)]
    assert outcomes[0][3].endswith("failed attempts)")
    node.driver.failing = {ctr}
    changed = replace(node.trainer, containers=(replace(node.trainer.containers[0], limits={QUOTA: "9Gi"}),))
    assert ("failed", "main", 0) in results(node.update(node.targets(changed), now=now + 1)), "a new run: reported"


# -- limits at cgroup creation --------------------------------------------------------------------------------------


def test_a_pods_cgroup_gets_its_limit_when_it_appears(node: Node, v2: KubeletCgroups) -> None:
    """The pod is known to the sources (it is bound before the kubelet makes its cgroup), its containers are
    not started: the pod's limit goes on at once, and the container's own when the runtime makes its cgroup."""
    fresh = pod("fresh", "ml", containers={"main": {QUOTA: "3Gi"}})
    fresh = replace(fresh, containers=(replace(fresh.containers[0], container_id=None),))
    node.known[fresh.uid] = fresh
    pod_cg = v2.pod(uid=fresh.uid, qos="besteffort")
    node.limiter.appeared(pod_cg.dirs[0], pod_cg.identity)
    assert results(node.collect()) == [("applied", None, 0), ("applied", None, 1)]
    assert node.held(pod_cg.dirs[0]) == [3 * GiB, 3 * GiB]
    ctr = pod_cg.container()
    identity = ctr.identity
    assert identity is not None
    node.limiter.appeared(ctr.dirs[0], identity)
    assert results(node.collect()) == [("applied", "main", 0), ("applied", "main", 1)], "before it started: not late"
    assert node.held(ctr.dirs[0]) == [3 * GiB, 3 * GiB]
    # The pod's status names the container now: the reconcile finds everything held and says nothing.
    started = replace(fresh, containers=(replace(fresh.containers[0], container_id=ctr.container_id),))
    sets = len(node.driver.sets())
    assert node.update(node.targets(started), now=1) == []
    assert len(node.driver.sets()) == sets


def test_a_cgroup_whose_pod_is_not_known_waits_for_it(node: Node, v2: KubeletCgroups) -> None:
    fresh = pod("fresh", "ml", containers={"main": {QUOTA: "3Gi"}})
    pod_cg = v2.pod(uid=fresh.uid, qos="besteffort")
    node.limiter.appeared(pod_cg.dirs[0], pod_cg.identity)
    assert node.collect() == [] and node.limiter.retry_parked()
    node.known[fresh.uid] = fresh
    node.at(0.1)  # its next lookup is due
    assert not node.limiter.retry_parked()  # the lookup ran inline: nothing left parked
    assert results(node.collect()) == [("applied", None, 0), ("applied", None, 1)]


def test_the_watcher_keeps_ticking_while_a_cgroup_waits(node: Node, v2: KubeletCgroups) -> None:
    """Handed over but not yet taken by the busy worker, or parked until its pod is known: either way the
    watcher is told to call again, so no new cgroup waits for the next event or scan."""
    queued = Queued()
    clock = FakeClock(0.0)
    limiter = DriverLimiter(node.driver, runner=queued, clock=clock, plan=node.plan)
    fresh = pod("fresh", "ml", containers={"main": {QUOTA: "3Gi"}})
    pod_cg = v2.pod(uid=fresh.uid, qos="besteffort")
    limiter.appeared(pod_cg.dirs[0], pod_cg.identity)
    assert limiter.retry_parked(), "handed over, not taken yet"
    queued.run()
    assert limiter.retry_parked(), "parked: its pod is not known"
    node.known[fresh.uid] = fresh
    clock.step(0.1)  # its next lookup is due
    queued.run()
    assert not limiter.retry_parked()
    assert node.held(pod_cg.dirs[0]) == [3 * GiB, 3 * GiB]


def test_a_new_container_of_a_pod_with_different_quotas_waits_for_the_status(node: Node, v2: KubeletCgroups) -> None:
    """Two not-started containers with different quotas: a new container cgroup could be either, so it gets
    no limit of its own until the status names it (the pod's limit holds meanwhile)."""
    pair = replace(PAIR, uid=v2.pod(qos="besteffort").uid)
    pair = replace(pair, containers=tuple(replace(c, container_id=None) for c in pair.containers))
    node.known[pair.uid] = pair
    pod_cg = v2.pod(uid=pair.uid, qos="besteffort")
    ctr = pod_cg.container()
    identity = ctr.identity
    assert identity is not None
    node.limiter.appeared(ctr.dirs[0], identity)
    assert node.collect() == [] and node.held(ctr.dirs[0]) == []


def test_a_limit_set_from_a_fresher_plan_is_not_cleared_by_an_older_reconcile(node: Node, v2: KubeletCgroups) -> None:
    fresh = pod("fresh", "ml", containers={"main": {QUOTA: "3Gi"}})
    node.known[fresh.uid] = fresh
    pod_cg = v2.pod(uid=fresh.uid, qos="besteffort")
    node.at(5)
    node.limiter.appeared(pod_cg.dirs[0], pod_cg.identity)
    node.collect()
    node.at(6)
    node.limiter.update((), [0, 1], 4)  # targets computed at 4, before the cgroup appeared
    assert node.held(pod_cg.dirs[0]) == [3 * GiB, 3 * GiB]


def test_a_cgroup_v1_host_has_no_driver_limits(node: Node, tmp_path: Path) -> None:
    (tmp_path / "pids").mkdir()  # a v1 layout: no cgroup.controllers at the root nor under unified/
    limiter = DriverLimiter(node.driver, str(tmp_path), runner=Inline())
    limiter.update(node.targets(node.trainer), [0, 1], 0)
    assert limiter.unavailable is not None and "no cgroup v2 hierarchy" in limiter.unavailable
    assert node.driver.calls == []


def test_locate_finds_containers_and_pods_by_uid(node: Node) -> None:
    root = v2_root("/sys/fs/cgroup")
    assert root is not None
    found = locate_cgroups(root, [node.trainer.uid, node.shared.uid])
    assert found[(node.trainer.uid, node.trainer_ctr.container_id)] == node.trainer_ctr.dirs[0]
    assert found[(node.shared.uid, None)] == node.shared_cg.dirs[0]
    assert locate_cgroups(root, []) == {}


# -- the driver's count of a limited container's memory ------------------------------------------------------------


def test_usage_counts_only_when_read_since_the_last_update(node: Node) -> None:
    targets = node.targets(node.trainer)
    node.update(targets, now=0)
    key = LimitKey(node.trainer.uid, "main", node.devices[0].uuid)
    node.driver.used[(0, node.trainer_ctr.dirs[0])] = 3 * GiB
    assert key not in node.limiter.fresh_usage()  # just set: nothing read back yet
    node.update(targets, now=1)  # a usage refresh
    assert node.limiter.fresh_usage()[key] == 3 * GiB
    busy = DriverLimiter(node.driver, runner=Queued(), resync_s=30)
    busy.update(targets, [0, 1], 0)
    assert busy.fresh_usage() == {}, "a task that has not run yet leaves no figure to use"


# -- the worker on its own thread: the queue wakes it ------------------------------------------------------------


def threaded(
    node: Node, *, lookup_retry_s: float = 0.1, retry_s: float = 2.0, max_retry_s: float = 300.0
) -> DriverLimiter:
    """The limiter as the agent runs it: its own worker thread, the system clock, short waits; every lookup of
    a pod's limits counted in `node.lookups`."""

    def plan(uid: str) -> tuple[LimitTarget, ...] | None:
        node.lookups += 1
        return node.plan(uid)

    node.lookups = 0
    limiter = DriverLimiter(
        node.driver, plan=plan, lookup_retry_s=lookup_retry_s, retry_s=retry_s, max_retry_s=max_retry_s
    )
    limiter.start()
    return limiter


def test_the_worker_programs_a_parked_cgroup_once_its_pod_is_known_with_no_one_asking(
    node: Node, v2: KubeletCgroups
) -> None:
    """A cgroup whose pod the sources do not know yet is looked up again by the worker on its own: once the pod is
    known, its limit goes on, with no scan, no watcher tick and no other call."""
    limiter = threaded(node, lookup_retry_s=0.02)
    try:
        fresh = pod("fresh", "ml", containers={"main": {QUOTA: "3Gi"}})
        pod_cg = v2.pod(uid=fresh.uid, qos="besteffort")
        limiter.appeared(pod_cg.dirs[0], pod_cg.identity)
        wait_until(lambda: node.lookups >= 3, what="the parked cgroup looked up again, unasked")
        assert node.held(pod_cg.dirs[0]) == [] and limiter.collect() == []
        node.known[fresh.uid] = fresh
        wait_until(lambda: node.held(pod_cg.dirs[0]) == [3 * GiB, 3 * GiB], what="the pod's limit on both GPUs")
        wait_until(lambda: len(limiter.collect()) == 2, what="two outcomes")  # published as the pass ends
        assert not limiter.retry_parked()
    finally:
        limiter.stop(SYSTEM_CLOCK.now() + 2.0)


def test_the_worker_retries_a_failing_limit_on_its_back_off_with_no_scan(node: Node) -> None:
    """A failing limit is tried again when its back-off ends, whether or not a scan hands anything over; the worker
    thread ends at the stop."""
    limiter = threaded(node, retry_s=0.05, max_retry_s=0.2)
    ctr = node.trainer_ctr.dirs[0]
    node.driver.failing = {ctr}
    limiter.update(node.targets(node.trainer), [0, 1], SYSTEM_CLOCK.now())
    wait_until(lambda: limiter.failing() == 2, what="the container's limits failing")
    tries = len(node.driver.calls)
    wait_until(lambda: len(node.driver.calls) > tries, what="a retry, with no scan")
    node.driver.failing = set()
    wait_until(lambda: node.held(ctr) == [8 * GiB, 8 * GiB], what="the limits set once the driver takes them")
    assert limiter.failing() == 0
    limiter.stop(SYSTEM_CLOCK.now() + 2.0)
    assert "driver-limits" not in [t.name for t in threading.enumerate()], "the worker's thread ended at the stop"
