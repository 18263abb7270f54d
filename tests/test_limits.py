"""Driver-level memory limits: which limits the quotas call for (pure, a table), and how the limiter programs
them into the driver (a fake driver, real cgroup v2 directories to find)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cgroup_fixtures import CgroupsFactory
from vramguard.limiter import DriverLimiter, locate_cgroups, v2_root
from vramguard.limits import LimitKey, LimitTarget, limits_enabled, wanted_limits, with_driver_usage
from vramguard.model import DriverLimits, GiB, GpuDevice, Mode, NamespacePolicy, PodInfo, Policy
from vramguard.ports import LIMIT_MAX
from vramguard.quota import QuotaBook
from vramguard.testing.fakes import FakeMemoryLimiter, SnapshotBuilder, gpu, pod
from vramguard.worker import Inline
from vramguard_testbed.cgroups import KubeletCgroups

QUOTA = "vramguard.io/vram"
KILL = Policy(mode=Mode.KILL)
MIG_PARENT = gpu(2, 80 * GiB)
MIG_SLICE = replace(gpu(3, 10 * GiB), uuid="MIG-aaaa", mig_index=0, parent_uuid=MIG_PARENT.uuid)


def targets_for(
    pods: list[PodInfo], devices: list[GpuDevice], policy: Policy = KILL, agent_pod_uid: str | None = None
) -> list[tuple[str, str | None, int, int]]:
    by_uid = {p.uid: p for p in pods}
    quotas, _ = QuotaBook(policy).resolve(by_uid, {})
    found = wanted_limits(by_uid, quotas, devices, policy, agent_pod_uid=agent_pod_uid)
    return [(t.pod.name, t.container, t.gpu_index, t.hard_bytes) for t in found]


TRAINER = pod("trainer", "ml", containers={"main": {QUOTA: "8Gi"}, "sidecar": {}})


@pytest.mark.parametrize(
    ("case", "pods", "devices", "policy", "expected"),
    [
        ("a container quota on every GPU", [TRAINER], [gpu(0), gpu(1)], KILL,
         [("trainer", "main", 0, 8 * GiB), ("trainer", "main", 1, 8 * GiB)]),
        ("evict mode too", [TRAINER], [gpu(0)], Policy(mode=Mode.EVICT), [("trainer", "main", 0, 8 * GiB)]),
        ("never in warn mode", [TRAINER], [gpu(0)], Policy(mode=Mode.WARN), []),
        ("a namespace in warn mode", [TRAINER], [gpu(0)],
         replace(KILL, namespaces={"ml": NamespacePolicy(mode=Mode.WARN)}), []),
        ("a namespace in kill mode under a warn policy", [TRAINER], [gpu(0)],
         Policy(mode=Mode.WARN, namespaces={"ml": NamespacePolicy(mode=Mode.KILL)}), [("trainer", "main", 0, 8 * GiB)]),
        ("an exempt namespace", [pod("agent", "kube-system", containers={"main": {QUOTA: "1Gi"}})], [gpu(0)], KILL, []),
        ("the burst is the hard limit",
         [pod("b", "ml", containers={"main": {QUOTA: "4Gi"}}, annotations={"vramguard.io/vram-burst": "6Gi"})],
         [gpu(0)], KILL, [("b", "main", 0, 6 * GiB)]),
        ("capped at the GPU's memory", [pod("big", "ml", containers={"main": {QUOTA: "40Gi"}})], [gpu(0, 16 * GiB)],
         KILL, [("big", "main", 0, 16 * GiB)]),
        ("a pod-wide quota goes on the pod's cgroup",
         [pod("p", "ml", annotations={"vramguard.io/vram-limit": "6Gi"})], [gpu(0)], KILL, [("p", None, 0, 6 * GiB)]),
        ("no MIG instance, nor its parent", [TRAINER], [MIG_PARENT, MIG_SLICE], KILL, []),
        ("no unhealthy GPU", [TRAINER], [gpu(0, healthy=False), gpu(1)], KILL, [("trainer", "main", 1, 8 * GiB)]),
        ("no container without a quota", [pod("free", "ml")], [gpu(0)], KILL, []),
    ],
)  # fmt: skip
def test_wanted_limits(
    case: str, pods: list[PodInfo], devices: list[GpuDevice], policy: Policy, expected: list[object]
) -> None:
    assert targets_for(pods, devices, policy) == expected, case


def test_not_the_agents_own_pod_and_not_before_the_container_runs() -> None:
    assert targets_for([TRAINER], [gpu(0)], agent_pod_uid=TRAINER.uid) == []
    not_started = replace(TRAINER, containers=tuple(replace(c, container_id=None) for c in TRAINER.containers))
    assert targets_for([not_started], [gpu(0)]) == []


@pytest.mark.parametrize(
    ("policy", "dry_run", "enabled"),
    [
        (KILL, False, True),
        (KILL, True, False),
        (replace(KILL, driver_limits=DriverLimits.OFF), False, False),
        (replace(KILL, driver_limits=DriverLimits.REQUIRE), False, True),
    ],
)
def test_limits_enabled(policy: Policy, dry_run: bool, enabled: bool) -> None:
    assert limits_enabled(policy, dry_run) is enabled


# -- the limiter, on real cgroup directories ---------------------------------------------------------------------


@pytest.fixture
def v2(make_cgroups: CgroupsFactory) -> KubeletCgroups:
    return make_cgroups(driver="cgroupfs", version=2)


class Node:
    """Two pods in real kubelet-shaped v2 cgroups, the limits their quotas call for, a fake driver."""

    def __init__(self, v2: KubeletCgroups) -> None:
        self.trainer_cg = v2.pod(qos="burstable")
        self.trainer_ctr = self.trainer_cg.container()
        self.shared_cg = v2.pod(qos="besteffort")
        self.trainer = pod("trainer", "ml", containers={"main": {QUOTA: "8Gi"}}, uid=self.trainer_cg.uid)
        self.trainer = replace(
            self.trainer, containers=(replace(self.trainer.containers[0], container_id=self.trainer_ctr.container_id),)
        )
        self.shared = pod("shared", "ml", annotations={"vramguard.io/vram-limit": "6Gi"}, uid=self.shared_cg.uid)
        self.driver = FakeMemoryLimiter()
        self.limiter = DriverLimiter(self.driver, runner=Inline(), resync_s=30, retry_s=2)
        self.devices = [gpu(0, 24 * GiB), gpu(1, 24 * GiB)]
        self.policy = KILL

    def targets(self, *pods: PodInfo) -> tuple[LimitTarget, ...]:
        by_uid = {p.uid: p for p in pods}
        quotas, _ = QuotaBook(self.policy).resolve(by_uid, {})
        return wanted_limits(by_uid, quotas, self.devices, self.policy)

    def update(self, targets: tuple[LimitTarget, ...], now: float) -> list[tuple[str, str | None, int, str]]:
        self.limiter.update(targets, [0, 1], now)
        return [(o.result, o.target.container, o.target.gpu_index, o.detail) for o in self.limiter.collect()]


@pytest.fixture
def node(v2: KubeletCgroups) -> Node:
    return Node(v2)


def test_limits_go_on_the_containers_and_the_pods_own_cgroups(node: Node) -> None:
    outcomes = node.update(node.targets(node.trainer, node.shared), now=0)
    assert [o[:3] for o in outcomes] == [
        ("applied", "main", 0), ("applied", "main", 1), ("applied", None, 0), ("applied", None, 1)
    ]  # fmt: skip
    ctr, shared = node.trainer_ctr.dirs[0], node.shared_cg.dirs[0]
    assert node.driver.limits == {
        (0, ctr): (0, 8 * GiB), (1, ctr): (0, 8 * GiB), (0, shared): (0, 6 * GiB), (1, shared): (0, 6 * GiB)
    }  # fmt: skip
    assert set(node.limiter.held()) == {(p.uid, c, g.uuid) for p, c in ((node.trainer, "main"), (node.shared, None))
                                        for g in node.devices}  # fmt: skip


def test_idempotent_then_reapplied_when_the_quota_changes_then_cleared(node: Node) -> None:
    node.update(node.targets(node.trainer), now=0)
    sets = len(node.driver.sets())
    assert node.update(node.targets(node.trainer), now=1) == []  # unchanged targets: only usage is refreshed
    assert node.update(node.targets(node.trainer), now=31) == []  # the resync compares and finds it held
    assert len(node.driver.sets()) == sets
    bigger = replace(node.trainer, containers=(replace(node.trainer.containers[0], limits={QUOTA: "10Gi"}),))
    outcomes = node.update(node.targets(bigger), now=32)
    assert [(o[0], o[2]) for o in outcomes] == [("applied", 0), ("applied", 1)]
    assert "(was 8589934592 bytes)" in outcomes[0][3]
    assert node.driver.limits[(0, node.trainer_ctr.dirs[0])] == (0, 10 * GiB)
    # The quota is gone (the pod was re-created without one): the limit is cleared, never left behind.
    assert [o[0] for o in node.update((), now=33)] == ["cleared", "cleared"]
    assert node.driver.limits == {}
    assert node.driver.sets()[-1] == (1, node.trainer_ctr.dirs[0], 0, LIMIT_MAX)


def test_an_agent_restart_sets_nothing(node: Node) -> None:
    node.update(node.targets(node.trainer), now=0)
    sets = len(node.driver.sets())
    restarted = DriverLimiter(node.driver, runner=Inline())
    restarted.update(node.targets(node.trainer), [0, 1], 0)
    assert [o.result for o in restarted.collect()] == ["unchanged", "unchanged"]
    assert len(node.driver.sets()) == sets


def test_a_cgroup_that_is_not_there_yet_is_retried(node: Node, v2: KubeletCgroups) -> None:
    late = pod("late", "ml", containers={"main": {QUOTA: "2Gi"}})
    assert node.update(node.targets(late), now=0) == []
    assert node.update(node.targets(late), now=1) == []  # within retry_s
    late_cg = v2.pod(uid=late.uid, qos="besteffort").container(container_id=late.containers[0].container_id)
    assert [o[0] for o in node.update(node.targets(late), now=3)] == ["applied", "applied"]
    assert node.driver.limits[(0, late_cg.dirs[0])] == (0, 2 * GiB)


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
    assert [o[:3] for o in outcomes] == [("applied", "main", 0)]
    assert node.limiter.unsupported_gpus() == {1: "GPU 1 does not support memory limits"}


def test_a_failure_is_reported_and_retried(node: Node) -> None:
    node.driver.failing = {node.trainer_ctr.dirs[0]}
    assert [o[0] for o in node.update(node.targets(node.trainer), now=0)] == ["failed", "failed"]
    node.driver.failing = set()
    assert [o[0] for o in node.update(node.targets(node.trainer), now=3)] == ["applied", "applied"]


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


def test_the_driver_count_replaces_the_rows_and_disagreements_are_reported() -> None:
    gpu0 = gpu(0, 24 * GiB)
    other = pod("other", "ml", containers={"main": {QUOTA: "8Gi"}})
    quiet = pod("quiet", "ml", containers={"main": {QUOTA: "8Gi"}})
    snapshot = SnapshotBuilder().use(TRAINER, "main", gpu0, 3 * GiB).use(other, "main", gpu0, 2 * GiB).build()
    by_uid = {p.uid: p for p in (TRAINER, other, quiet)}
    quotas, _ = QuotaBook(KILL).resolve(by_uid, {})
    held = {t.key: t for t in wanted_limits(by_uid, quotas, [gpu0], KILL)}
    usage: dict[LimitKey, int] = {
        (TRAINER.uid, "main", gpu0.uuid): 5 * GiB,  # a context the process rows miss
        (other.uid, "main", gpu0.uuid): 2 * GiB,  # the same: no disagreement
        (quiet.uid, "main", gpu0.uuid): 1 * GiB,  # no process row at all
    }
    merged, disagreements = with_driver_usage(snapshot, held, usage)
    used = {(u.pod.name, u.container): (u.used_bytes, len(u.processes)) for u in merged.containers}
    assert used == {("trainer", "main"): (5 * GiB, 1), ("other", "main"): (2 * GiB, 1), ("quiet", "main"): (1 * GiB, 0)}
    assert [(d.target.pod.name, d.rows_bytes, d.driver_bytes) for d in disagreements] == [
        ("trainer", 3 * GiB, 5 * GiB), ("quiet", 0, 1 * GiB)
    ]  # fmt: skip
    assert with_driver_usage(snapshot, held, {}) == (snapshot, ())


def test_usage_counts_only_when_read_since_the_last_update(node: Node) -> None:
    targets = node.targets(node.trainer)
    node.update(targets, now=0)
    key = (node.trainer.uid, "main", node.devices[0].uuid)
    node.driver.used[(0, node.trainer_ctr.dirs[0])] = 3 * GiB
    assert key not in node.limiter.fresh_usage()  # just set: nothing read back yet
    node.update(targets, now=1)  # a usage refresh
    assert node.limiter.fresh_usage()[key] == 3 * GiB
    busy = DriverLimiter(node.driver, runner=_Busy(), resync_s=30)
    busy.update(targets, [0, 1], 0)
    assert busy.fresh_usage() == {}, "a task that has not run yet leaves no figure to use"


class _Busy(Inline):
    """A worker that accepts tasks and never gets to them."""

    def submit(self, task: object) -> bool:
        return True
