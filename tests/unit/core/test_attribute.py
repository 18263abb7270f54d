"""The attribute stage: the pure attribute() that sums GPU memory per container and device."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from vramguard.core.attribute import (
    NOT_IN_POD,
    ORPHANED,
    OUTSIDE_KUBELET,
    POD_NOT_IN_CACHE,
    PROCESS_GONE,
    Awaited,
    attribute,
    awaited,
)
from vramguard.core.pod import ContainerInfo, PodInfo
from vramguard.core.process import LOOK_ALIKE, UNKNOWN_START_TIME, CgroupIdentity, Identity, ProcessRef
from vramguard.core.sample import GpuDevice, GpuProcess, GpuSample, ProcessKind
from vramguard.core.snapshot import ContainerUsage, Snapshot, UnattributedProcess, UnattributedReason

UID_A = "11111111-2222-3333-4444-555555555555"
UID_B = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
CID_A1 = "a1" * 32
CID_A2 = "a2" * 32
CID_B1 = "b1" * 32


# ----------------------------------------------------------------------------------------------------------
# attribute(): pure


GPU0 = GpuDevice(index=0, uuid="GPU-0", name="H100", total_bytes=80 << 30, used_bytes=0, free_bytes=80 << 30)
GPU1 = GpuDevice(index=1, uuid="GPU-1", name="H100", total_bytes=80 << 30, used_bytes=0, free_bytes=80 << 30)

POD_A = PodInfo(
    uid=UID_A,
    namespace="ml",
    name="trainer",
    containers=(ContainerInfo("main", CID_A1), ContainerInfo("sidecar", CID_A2)),
)
POD_B = PodInfo(uid=UID_B, namespace="ml", name="infer", containers=(ContainerInfo("server", CID_B1),))
PODS = {UID_A: POD_A, UID_B: POD_B}


def ids(*rows: tuple[int, int, str | None, str | None]) -> dict[int, Identity]:
    """(pid, start, pod uid, container id) rows → identities; a None uid means outside any pod."""
    out: dict[int, Identity] = {}
    for pid, start, uid, cid in rows:
        cg = CgroupIdentity(uid, cid, "containerd", "burstable") if uid is not None else None
        out[pid] = (ProcessRef(pid, start), cg)
    return out


def gp(pid: int, used: int | None, device: str = "GPU-0", kind: ProcessKind = ProcessKind.COMPUTE) -> GpuProcess:
    return GpuProcess(pid=pid, device_uuid=device, used_bytes=used, kind=kind)


def usage(pod: PodInfo, name: str, cid: str | None, device: str, used: int, *refs: tuple[int, int]) -> ContainerUsage:
    return ContainerUsage(pod, name, cid, device, used, tuple(ProcessRef(p, s) for p, s in refs))


UID_GONE = "99999999-9999-9999-9999-999999999999"
CGROUP_GONE = CgroupIdentity(UID_GONE, CID_A1, "containerd", "burstable")

ATTRIBUTE_CASES = [
    pytest.param(
        [gp(10, 3 << 30), gp(11, 2 << 30)],
        ids((10, 1, UID_A, CID_A1), (11, 2, UID_A, CID_A1)),
        PODS,
        [usage(POD_A, "main", CID_A1, "GPU-0", 5 << 30, (10, 1), (11, 2))],
        [],
        id="two-processes-of-one-container-are-summed",
    ),
    pytest.param(
        [gp(10, 3 << 30, "GPU-0"), gp(10, 1 << 30, "GPU-1")],
        ids((10, 1, UID_A, CID_A1)),
        PODS,
        [
            usage(POD_A, "main", CID_A1, "GPU-0", 3 << 30, (10, 1)),
            usage(POD_A, "main", CID_A1, "GPU-1", 1 << 30, (10, 1)),
        ],
        [],
        id="one-process-on-two-gpus-gives-a-row-per-device",
    ),
    pytest.param(
        [gp(10, 3 << 30), gp(20, 1 << 30), gp(12, 1 << 20)],
        ids((10, 1, UID_A, CID_A1), (20, 2, UID_B, CID_B1), (12, 3, UID_A, CID_A2)),
        PODS,
        [
            usage(POD_A, "main", CID_A1, "GPU-0", 3 << 30, (10, 1)),
            usage(POD_B, "server", CID_B1, "GPU-0", 1 << 30, (20, 2)),
            usage(POD_A, "sidecar", CID_A2, "GPU-0", 1 << 20, (12, 3)),
        ],
        [],
        id="containers-and-pods-are-kept-apart-in-nvml-order",
    ),
    pytest.param(
        [gp(10, None), gp(11, 2 << 30)],
        ids((10, 1, UID_A, CID_A1), (11, 2, UID_A, CID_A1)),
        PODS,
        [usage(POD_A, "main", CID_A1, "GPU-0", 2 << 30, (10, 1), (11, 2))],
        [],
        id="unknown-used-bytes-counts-zero-but-keeps-the-process",
    ),
    pytest.param(
        [gp(13, 1 << 30)],
        ids((13, 4, UID_A, "cc" * 32)),
        PODS,
        [usage(POD_A, "", "cc" * 32, "GPU-0", 1 << 30, (13, 4))],
        [],
        id="container-id-not-in-pod-status-gets-empty-name",
    ),
    pytest.param(
        [gp(14, 1 << 30)],
        ids((14, 5, UID_A, None)),
        PODS,
        [usage(POD_A, "", None, "GPU-0", 1 << 30, (14, 5))],
        [],
        id="process-in-pod-cgroup-itself-belongs-to-the-pod",
    ),
    pytest.param(
        [gp(30, 1 << 30)],
        ids((30, 9, None, None)),
        PODS,
        [],
        [UnattributedProcess(ProcessRef(30, 9), "GPU-0", 1 << 30, NOT_IN_POD)],
        id="host-process-is-unattributed",
    ),
    pytest.param(
        [gp(31, 1 << 30)],
        ids((31, 9, UID_GONE, CID_A1)),
        PODS,
        [],
        [UnattributedProcess(ProcessRef(31, 9), "GPU-0", 1 << 30, POD_NOT_IN_CACHE, CGROUP_GONE)],
        id="pod-missing-from-cache-is-unattributed-with-its-cgroup",
    ),
    pytest.param(
        [gp(32, 1 << 30, "GPU-1"), gp(32, None, "GPU-0")],
        {},
        PODS,
        [],
        [
            UnattributedProcess(ProcessRef(32, UNKNOWN_START_TIME), "GPU-0", 0, PROCESS_GONE),
            UnattributedProcess(ProcessRef(32, UNKNOWN_START_TIME), "GPU-1", 1 << 30, PROCESS_GONE),
        ],
        id="gone-process-is-unattributed-per-device",
    ),
    pytest.param(
        [gp(33, 40 << 30), gp(34, 1 << 30)],
        {33: (ProcessRef(33, 9), LOOK_ALIKE), **ids((34, 5, UID_A, CID_A1))},
        PODS,
        [usage(POD_A, "main", CID_A1, "GPU-0", 1 << 30, (34, 5))],
        [UnattributedProcess(ProcessRef(33, 9), "GPU-0", 40 << 30, OUTSIDE_KUBELET)],
        id="look-alike-outside-the-kubelet-is-a-host-process-never-the-pod-it-names",
    ),
    pytest.param([], {}, PODS, [], [], id="no-gpu-processes-empty-snapshot"),
]


@pytest.mark.parametrize(("processes", "identities", "pods", "containers", "unattributed"), ATTRIBUTE_CASES)
def test_attribute(
    processes: list[GpuProcess],
    identities: Mapping[int, Identity],
    pods: Mapping[str, PodInfo],
    containers: list[ContainerUsage],
    unattributed: list[UnattributedProcess],
) -> None:
    """Usage is summed per (pod, container, device); everything else is unattributed with its reason."""
    sample = GpuSample(devices=(GPU0, GPU1), processes=tuple(processes))
    snapshot = attribute(sample, identities, pods, agent_pod_uid=UID_B, agent_pid=4321)
    assert snapshot.containers == tuple(containers)
    assert snapshot.unattributed == tuple(unattributed)
    assert snapshot.devices == (GPU0, GPU1)
    assert (snapshot.agent_pod_uid, snapshot.agent_pid) == (UID_B, 4321)


def test_attribute_is_independent_of_input_order() -> None:
    """Shuffling the NVML rows changes at most the order of the rows, never what they say."""
    rows = [gp(10, 1 << 30), gp(20, 2 << 30), gp(11, 3 << 30, "GPU-1"), gp(30, 5), gp(11, 4 << 30)]
    identities = ids((10, 1, UID_A, CID_A1), (11, 2, UID_A, CID_A1), (20, 3, UID_B, CID_B1), (30, 4, None, None))
    forward = attribute(GpuSample((GPU0, GPU1), tuple(rows)), identities, PODS)
    backward = attribute(GpuSample((GPU0, GPU1), tuple(reversed(rows))), identities, PODS)

    def content(snapshot: Snapshot) -> list[ContainerUsage]:
        return sorted(snapshot.containers, key=lambda c: (c.pod.uid, c.container_id or "", c.device_uuid))

    assert content(forward) == content(backward)
    assert forward.unattributed == backward.unattributed
    assert [c.used_bytes for c in content(forward)] == [5 << 30, 3 << 30, 2 << 30]


# ----------------------------------------------------------------------------------------------------------
# awaited(): what a pod update may name

UID_C = "cccccccc-0000-4000-8000-000000000000"
CID_C1 = "c1" * 32
CID_A3 = "a3" * 32  # a container of POD_A its status does not list yet


@pytest.mark.parametrize(
    ("processes", "identities", "expected"),
    [
        pytest.param([gp(10, 1 << 30)], ids((10, 1, UID_A, CID_A1)), Awaited(), id="all-attributed-nothing-awaited"),
        pytest.param(
            [gp(10, 1 << 30)], ids((10, 1, UID_C, CID_C1)), Awaited(pods=frozenset({UID_C})), id="a-pod-not-in-cache"
        ),
        pytest.param(
            [gp(10, 1 << 30), gp(11, 0)],
            ids((10, 1, UID_A, CID_A3), (11, 2, UID_A, CID_A1)),
            Awaited(containers={UID_A: frozenset({CID_A3})}),
            id="a-container-its-pods-status-does-not-name",
        ),
        pytest.param([gp(10, 1 << 30)], ids((10, 1, UID_A, None)), Awaited(), id="the-pods-own-cgroup-is-not"),
        pytest.param([gp(10, 1 << 30)], ids((10, 1, None, None)), Awaited(), id="outside-any-pod-is-not"),
        pytest.param([gp(10, 1 << 30)], {}, Awaited(), id="a-process-gone-is-not"),
    ],
)
def test_awaited_is_what_the_pod_cache_lacked(
    processes: list[GpuProcess], identities: Mapping[int, Identity], expected: Awaited
) -> None:
    """A scan awaits the pods the cache does not hold and the containers a held pod's status does not name; a
    process outside any pod, in the pod's own cgroup or gone is named by no pod update."""
    snapshot = attribute(GpuSample((GPU0, GPU1), tuple(processes)), identities, PODS)
    found = awaited(snapshot)
    assert (found.pods, dict(found.containers)) == (expected.pods, dict(expected.containers))
    assert bool(found) is bool(expected.pods or expected.containers)


POD_C = PodInfo(uid=UID_C, namespace="ml", name="late", containers=(ContainerInfo("main", CID_C1),))
POD_A_STARTED = PodInfo(
    uid=UID_A, namespace="ml", name="trainer", containers=(*POD_A.containers, ContainerInfo("late", CID_A3))
)


@pytest.mark.parametrize(
    ("pod", "named"),
    [
        pytest.param(POD_C, True, id="the-pod-awaited"),
        pytest.param(POD_A_STARTED, True, id="its-status-names-the-container-awaited"),
        pytest.param(POD_A, False, id="the-same-pod-still-without-it"),
        pytest.param(POD_B, False, id="another-pod"),
    ],
)
def test_a_pod_version_names_what_is_awaited(pod: PodInfo, named: bool) -> None:
    """A pod update names what a scan awaited when it is the pod the cache lacked, or names the container."""
    waiting = Awaited(pods=frozenset({UID_C}), containers={UID_A: frozenset({CID_A3})})
    assert waiting.named_by(pod) is named
    assert waiting.named_in({pod.uid: pod, UID_B: POD_B}) is named


def test_every_reason_has_words() -> None:
    """A reason added to the enum cannot go without its words."""
    assert all(r.why for r in UnattributedReason)


def test_rows_of_pids_without_a_process_are_memory_held_by_exited_processes() -> None:
    """What the sampler found listed under PIDs with no process is unattributed as process-exited, per device,
    beside the live processes; a row without bytes counts 0."""
    sample = GpuSample(
        devices=(GPU0, GPU1),
        processes=(gp(30, 1 << 30),),
        exited=(gp(41, 2 << 30, "GPU-1"), gp(40, None)),
    )
    snapshot = attribute(sample, ids((30, 9, None, None)), PODS)
    assert list(snapshot.unattributed) == [
        UnattributedProcess(ProcessRef(30, 9), "GPU-0", 1 << 30, NOT_IN_POD),
        UnattributedProcess(ProcessRef(40, UNKNOWN_START_TIME), "GPU-0", 0, PROCESS_GONE),
        UnattributedProcess(ProcessRef(41, UNKNOWN_START_TIME), "GPU-1", 2 << 30, PROCESS_GONE),
    ]


def test_the_processes_of_an_orphaned_pod_are_orphaned_and_not_awaited() -> None:
    """A pod cgroup whose UID the orphan tracker confirmed gone: its rows say orphaned, and no pod update is awaited
    for it (the API server has no such pod to name)."""
    sample = GpuSample(devices=(GPU0, GPU1), processes=(gp(31, 1 << 30), gp(40, 1 << 20)))
    found = ids((31, 9, UID_GONE, CID_A1), (40, 3, UID_C, CID_C1))
    snapshot = attribute(sample, found, PODS, orphaned=frozenset({UID_GONE}))
    assert [(u.process.pid, u.reason) for u in snapshot.unattributed] == [(31, ORPHANED), (40, POD_NOT_IN_CACHE)]
    assert awaited(snapshot).pods == {UID_C}
