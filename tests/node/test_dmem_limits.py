"""Limits at cgroup creation through the kernel's dmem controller: the same planner and limiter that program NVIDIA's
R615 limits (`limit_plan.wanted_limits`, `limiter.DriverLimiter`) program `dmem.max` for an AMD GPU's region in each
pod's and container's cgroup, keep them while the quota stays, rewrite them when it changes, clear them when it goes,
and `read_held_limits` (what `top` shows) reads them back. On a stand-in cgroup v2 tree laid out as the kubelet's, with
the fake kernel of `test_dmem` (a max below the cgroup's usage is dropped without an error, as Linux 7.2 does)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from node.test_dmem import FakeKernel, dmem_lines
from vramguard.agent.report import ScanReport, rows_from_report
from vramguard.base.worker import Inline
from vramguard.core.decide import DecisionState, decide
from vramguard.core.driver_limit import LimitTarget
from vramguard.core.limit_plan import wanted_limits
from vramguard.core.pod import PodInfo
from vramguard.core.policy import Mode, Policy
from vramguard.core.quantity import GiB
from vramguard.core.quota import QuotaBook
from vramguard.core.sample import DRM_INDEX_BASE, GpuBackend, GpuDevice
from vramguard.node.cgroup_tree import CgroupfsTree
from vramguard.node.describe import ProcessDetail
from vramguard.node.dmem import DmemMemoryLimiter, parse_dmem
from vramguard.node.limiter import DriverLimiter, read_held_limits
from vramguard_testbed.fakes import FakeClock, SnapshotBuilder, pod

SLOT = "0000:c1:00.0"
REGION = f"drm/{SLOT}/vram"
QUOTA = "vramguard.io/vram"
KILL = Policy(mode=Mode.KILL)
MI300X = GpuDevice(
    index=DRM_INDEX_BASE,
    uuid="5a1f00d15ea5e000",
    name="AMD Instinct MI300X",
    total_bytes=192 * GiB,
    used_bytes=0,
    free_bytes=192 * GiB,
    backend=GpuBackend.DRM,
    pci_slot=SLOT,
)


class Node:
    """One pod with one container in a stand-in kubelet cgroup tree with the dmem controller and an MI300X's region."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.trainer = pod("trainer", "ml", containers={"main": {QUOTA: "8Gi", "amd.com/gpu": "1"}})
        self.pod_dir = root / "kubepods" / "burstable" / f"pod{self.trainer.uid}"
        self.container_dir = self.pod_dir / str(self.trainer.containers[0].container_id)
        self.container_dir.mkdir(parents=True)
        (root / "cgroup.controllers").write_text("cpuset cpu io memory pids dmem\n")
        (root / "dmem.capacity").write_text(dmem_lines({REGION: 192 * GiB}))
        for directory in (root, root / "kubepods", root / "kubepods" / "burstable", self.pod_dir):
            (directory / "cgroup.subtree_control").write_text("cpu memory pids\n")
        for directory in (self.pod_dir, self.container_dir):
            (directory / "dmem.max").write_text(dmem_lines({REGION: None}))
            (directory / "dmem.current").write_text(dmem_lines({REGION: 0}))
        self.kernel = FakeKernel()
        self.memory = DmemMemoryLimiter(str(root), {DRM_INDEX_BASE: SLOT}.get, write=self.kernel)
        self.clock = FakeClock(0.0)
        self.limiter = DriverLimiter(
            self.memory, str(root), runner=Inline(), resync_s=30, clock=self.clock, tree=CgroupfsTree(str(root))
        )

    def targets(self, *pods: PodInfo) -> tuple[LimitTarget, ...]:
        by_uid = {p.uid: p for p in pods}
        quotas, _ = QuotaBook(KILL).resolve(by_uid, {})
        return wanted_limits(by_uid, quotas, [MI300X], KILL)

    def update(self, targets: tuple[LimitTarget, ...], now: float) -> list[tuple[str, str | None, str]]:
        self.clock.step(now - self.clock.now())
        self.limiter.update(targets, [DRM_INDEX_BASE], now)
        return sorted(
            ((o.result.value, o.target.container, o.detail) for o in self.limiter.collect()),
            key=lambda o: (o[0], o[1] or ""),
        )

    def held(self, directory: Path) -> int | None:
        return parse_dmem((directory / "dmem.max").read_text())[REGION]


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path / "cgroup")


def test_the_limiter_programs_dmem_max_holds_it_rewrites_it_and_clears_it(node: Node) -> None:
    """dmem.max of the container's and the pod's cgroups hold the quota; the same targets again write nothing; a
    larger quota is written over; no quota clears both to max. Every ancestor got +dmem on the way."""
    targets = node.targets(node.trainer)
    assert {(t.gpu, t.holder) for t in targets} == {(SLOT, "kernel")}
    assert [o[:2] for o in node.update(targets, now=0)] == [("applied", None), ("applied", "main")]
    assert node.held(node.container_dir) == node.held(node.pod_dir) == 8 * GiB
    enabled = [p for p, text in node.kernel.writes if p.endswith("cgroup.subtree_control")]
    assert enabled and all(text == "+dmem" for p, text in node.kernel.writes if p in enabled)

    writes = len(node.kernel.writes)
    assert node.update(node.targets(node.trainer), now=1) == []  # a reload with the same quota: held, not rewritten
    assert node.update(node.targets(node.trainer), now=31) == []  # the resync reads it back and finds it held
    assert len(node.kernel.writes) == writes

    main = node.trainer.containers[0]
    bigger = replace(node.trainer, containers=(replace(main, limits={**main.limits, QUOTA: "12Gi"}),))
    assert [o[:2] for o in node.update(node.targets(bigger), now=32)] == [("applied", None), ("applied", "main")]
    assert node.held(node.container_dir) == 12 * GiB

    assert [o[:2] for o in node.update((), now=33)] == [("cleared", None), ("cleared", "main")]
    assert node.held(node.container_dir) is None and node.held(node.pod_dir) is None


def test_a_limit_below_what_the_cgroup_holds_is_refused_and_said_not_believed(node: Node) -> None:
    """Linux 7.2 keeps the old dmem.max, with no error, when the cgroup already holds more: the limiter reads it back
    and reports the limit failed (the agent then holds the quota itself), never "applied"."""
    (node.container_dir / "dmem.current").write_text(dmem_lines({REGION: 10 * GiB}))
    outcomes = node.update(node.targets(node.trainer), now=0)
    assert [o[:2] for o in outcomes] == [("applied", None), ("failed", "main")]
    assert "kept the old limit" in outcomes[1][2] and "10.0GiB" in outcomes[1][2], outcomes[1][2]
    assert node.held(node.container_dir) is None


def test_top_says_the_kernel_holds_the_quota(node: Node) -> None:
    """What `top` reads back from dmem.max (`read_held_limits`) makes its HELD-BY column say "kernel"."""
    node.update(node.targets(node.trainer), now=0)
    snapshot = SnapshotBuilder().use(node.trainer, "main", MI300X, 4 * GiB, pid=10).build()
    quotas, _ = QuotaBook(KILL).resolve({node.trainer.uid: node.trainer}, {})
    decision, _ = decide(snapshot, quotas, KILL, DecisionState(), 0.0)
    report = ScanReport(snapshot, quotas, decision, (), 0.0)
    held = read_held_limits(node.memory, str(node.root), snapshot.containers, snapshot.devices,
                            tree=CgroupfsTree(str(node.root)))  # fmt: skip
    rows = rows_from_report(report, describe=lambda pid: ProcessDetail(pid, "u", "python"), driver_limits=held)
    assert [(r.gpu, r.held_by) for r in rows] == [(SLOT, "kernel")]
