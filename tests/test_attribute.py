"""ProcessAttributor's cache over a fake /proc tree, and the pure attribute() that sums usage per container."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import pytest

from vramguard.attribute import (
    NOT_IN_POD,
    POD_NOT_IN_CACHE,
    PROCESS_GONE,
    UNKNOWN_START_TIME,
    Identity,
    ProcessAttributor,
    attribute,
)
from vramguard.model import (
    CgroupIdentity,
    ContainerInfo,
    ContainerUsage,
    GpuDevice,
    GpuProcess,
    GpuSample,
    PodInfo,
    ProcessKind,
    ProcessRef,
    Snapshot,
    UnattributedProcess,
)
from vramguard.procfs import read_start_time, read_state_and_start_time

UID_A = "11111111-2222-3333-4444-555555555555"
UID_B = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
CID_A1 = "a1" * 32
CID_A2 = "a2" * 32
CID_B1 = "b1" * 32


def cgroup_text(uid: str, container_id: str | None) -> str:
    leaf = f"/cri-containerd-{container_id}.scope" if container_id else ""
    slug = uid.replace("-", "_")
    return f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{slug}.slice{leaf}\n"


class FakeProc:
    """A directory shaped like /proc with just the files the attributor reads: <pid>/stat and <pid>/cgroup."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def add(self, pid: int, start_time: int, cgroup: str, comm: str = "python3") -> None:
        d = self.root / str(pid)
        d.mkdir(parents=True, exist_ok=True)
        # After "pid (comm) " come fields 3..52: the state, 18 more, then the start time (field 22), then more.
        fields = ["S", *(["0"] * 18), str(start_time), *(["0"] * 30)]
        (d / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
        (d / "cgroup").write_text(cgroup)

    def set_cgroup(self, pid: int, cgroup: str) -> None:
        (self.root / str(pid) / "cgroup").write_text(cgroup)

    def remove(self, pid: int) -> None:
        shutil.rmtree(self.root / str(pid))


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path / "proc")


def test_identify_reads_start_time_and_cgroup(proc: FakeProc) -> None:
    """A new process is read from stat and cgroup: its ref carries the start time, its identity the pod."""
    proc.add(100, 5000, cgroup_text(UID_A, CID_A1))
    attributor = ProcessAttributor(str(proc.root))
    assert attributor.identify(100) == (
        ProcessRef(100, 5000),
        CgroupIdentity(UID_A, CID_A1, "containerd", "burstable"),
    )
    assert (attributor.hits, attributor.misses) == (0, 1)


def test_warm_identify_does_not_reread_cgroup(proc: FakeProc) -> None:
    """While the start time is unchanged the cached identity is returned, whatever the cgroup file says now."""
    proc.add(100, 5000, cgroup_text(UID_A, CID_A1))
    attributor = ProcessAttributor(str(proc.root))
    first = attributor.identify(100)
    proc.set_cgroup(100, cgroup_text(UID_B, CID_B1))
    assert attributor.identify(100) == first
    assert (attributor.hits, attributor.misses) == (1, 1)


def test_recycled_pid_is_read_again(proc: FakeProc) -> None:
    """Same PID with a new start time is a new process: its cgroup is read and parsed afresh."""
    proc.add(100, 5000, cgroup_text(UID_A, CID_A1))
    attributor = ProcessAttributor(str(proc.root))
    attributor.identify(100)
    proc.remove(100)
    proc.add(100, 7777, cgroup_text(UID_B, CID_B1))
    assert attributor.identify(100) == (
        ProcessRef(100, 7777),
        CgroupIdentity(UID_B, CID_B1, "containerd", "burstable"),
    )
    assert (attributor.hits, attributor.misses) == (0, 2)


def test_gone_process_is_none_and_forgotten(proc: FakeProc) -> None:
    """A process whose /proc entry vanished gives None and leaves the cache."""
    proc.add(100, 5000, cgroup_text(UID_A, CID_A1))
    attributor = ProcessAttributor(str(proc.root))
    attributor.identify(100)
    proc.remove(100)
    assert attributor.identify(100) is None
    assert attributor.identify(4242) is None
    assert attributor.cache_size == 0


def test_host_process_is_cached_with_no_identity(proc: FakeProc) -> None:
    """A process outside any pod is identified (ref, None), and that answer is cached like any other."""
    proc.add(7, 30, "0::/system.slice/Xorg.service\n", comm="Xorg")
    attributor = ProcessAttributor(str(proc.root))
    assert attributor.identify(7) == (ProcessRef(7, 30), None)
    assert attributor.identify(7) == (ProcessRef(7, 30), None)
    assert (attributor.hits, attributor.misses) == (1, 1)


@pytest.mark.parametrize(
    "comm",
    [
        pytest.param("python3", id="plain-comm"),
        pytest.param("my proc) S 1 2 3", id="comm-with-paren-and-spaces"),
        pytest.param("((", id="comm-with-open-parens"),
    ],
)
def test_start_time_survives_odd_command_names(proc: FakeProc, comm: str) -> None:
    """The start time is found after the last ")" so a command name cannot shift the fields."""
    proc.add(100, 5000, cgroup_text(UID_A, CID_A1), comm=comm)
    found = ProcessAttributor(str(proc.root)).identify(100)
    assert found is not None
    assert found[0] == ProcessRef(100, 5000)


@pytest.mark.parametrize(
    "stat",
    [
        pytest.param("", id="empty-stat"),
        pytest.param("100 (x) S 1 2\n", id="truncated-stat"),
        pytest.param("100 x S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22\n", id="no-paren"),
        pytest.param(f"100 (x) {' '.join(['S'] + ['0'] * 18 + ['abc'])}\n", id="non-numeric-start"),
    ],
)
def test_unreadable_stat_is_treated_as_gone(proc: FakeProc, stat: str) -> None:
    """A stat file that does not parse gives None instead of raising or inventing a start time."""
    proc.add(100, 5000, cgroup_text(UID_A, CID_A1))
    (proc.root / "100" / "stat").write_text(stat)
    assert ProcessAttributor(str(proc.root)).identify(100) is None


def test_scan_forgets_processes_not_seen(proc: FakeProc) -> None:
    """scan() keeps only the PIDs of the latest scan, so the cache is bounded by the GPU process count."""
    for pid in (100, 101, 102):
        proc.add(pid, 5000 + pid, cgroup_text(UID_A, CID_A1))
    attributor = ProcessAttributor(str(proc.root))
    assert set(attributor.scan([100, 101, 102])) == {100, 101, 102}
    assert set(attributor.scan([101, 101])) == {101}
    assert attributor.cache_size == 1
    attributor.scan([100])
    # 100 was forgotten by the second scan, so it is a miss again; 101 was a hit in the second scan.
    assert (attributor.hits, attributor.misses) == (1, 4)


@pytest.mark.parametrize(
    "keep",
    [
        pytest.param(lambda pids: set(pids), id="set"),
        pytest.param(lambda pids: dict.fromkeys(pids).keys(), id="dict-keys"),
        pytest.param(lambda pids: list(pids), id="list"),
        pytest.param(lambda pids: iter(pids), id="iterator"),
    ],
)
def test_forget_except_keeps_only_the_given_pids(proc: FakeProc, keep: Callable[[list[int]], Iterable[int]]) -> None:
    """forget_except() (what scan() bounds the cache with) drops every cached PID not passed in."""
    for pid in (100, 101, 102):
        proc.add(pid, pid, cgroup_text(UID_A, CID_A1))
    attributor = ProcessAttributor(str(proc.root))
    for pid in (100, 101, 102):
        attributor.identify(pid)
    attributor.forget_except(keep([101, 555]))
    assert attributor.cache_size == 1
    attributor.identify(101)
    assert attributor.hits == 1


def test_scan_leaves_out_gone_processes(proc: FakeProc) -> None:
    """scan() omits processes that no longer exist; attribute() then reports them as gone."""
    proc.add(100, 5000, cgroup_text(UID_A, CID_A1))
    attributor = ProcessAttributor(str(proc.root))
    assert set(attributor.scan([100, 999])) == {100}


def test_warm_scan_reads_no_cgroup_file(proc: FakeProc) -> None:
    """A warm scan of unchanged processes is all hits: deleting every cgroup file changes nothing."""
    for pid in range(200, 264):
        proc.add(pid, pid * 10, cgroup_text(UID_A, CID_A1))
    attributor = ProcessAttributor(str(proc.root))
    cold = attributor.scan(range(200, 264))
    for pid in range(200, 264):
        (proc.root / str(pid) / "cgroup").unlink()
    assert attributor.scan(range(200, 264)) == cold
    assert (attributor.hits, attributor.misses) == (64, 64)


def test_identify_alone_is_bounded_by_max_entries(proc: FakeProc) -> None:
    """Without scan(), the cache still never grows past max_entries."""
    for pid in range(300, 310):
        proc.add(pid, pid, cgroup_text(UID_A, CID_A1))
    attributor = ProcessAttributor(str(proc.root), max_entries=4)
    for pid in range(300, 310):
        attributor.identify(pid)
    assert attributor.cache_size == 4


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
        ids((31, 9, "99999999-9999-9999-9999-999999999999", CID_A1)),
        PODS,
        [],
        [UnattributedProcess(ProcessRef(31, 9), "GPU-0", 1 << 30, POD_NOT_IN_CACHE)],
        id="pod-missing-from-cache-is-unattributed",
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
# pidfd validation, against real processes (no cgroups needed)


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_pidfd_mode_is_chosen_only_for_the_agents_own_proc(proc: FakeProc) -> None:
    """The real /proc gets pidfd validation; a fake tree (no "self" naming us) falls back to stat."""
    assert ProcessAttributor("/proc").uses_pidfds
    assert not ProcessAttributor(str(proc.root)).uses_pidfds


@pytest.mark.parametrize("use_pidfd", [pytest.param(True, id="pidfd"), pytest.param(False, id="stat")])
def test_real_process_cache_lifecycle(use_pidfd: bool) -> None:
    """A live process is a hit; once it exits and is reaped its entry and pidfd are dropped and it reads as gone."""
    before = fd_count()
    child = subprocess.Popen(["sleep", "60"])
    try:
        attributor = ProcessAttributor("/proc", use_pidfd=use_pidfd)
        first = attributor.identify(child.pid)
        assert first is not None
        assert first[0] == ProcessRef(child.pid, read_start_time(child.pid) or -1)
        assert attributor.identify(child.pid) == first
        assert (attributor.hits, attributor.misses) == (1, 1)
        assert fd_count() == before + (1 if use_pidfd else 0)
    finally:
        child.kill()
        child.wait()
    assert attributor.identify(child.pid) is None
    assert attributor.cache_size == 0
    assert fd_count() == before


def test_zombie_is_still_the_same_process() -> None:
    """An exited but unreaped child keeps its PID, so its cached identity is still a hit."""
    child = subprocess.Popen(["sleep", "60"])
    try:
        with ProcessAttributor("/proc", use_pidfd=True) as attributor:
            first = attributor.identify(child.pid)
            child.send_signal(signal.SIGKILL)
            deadline = time.monotonic() + 5
            while (read_state_and_start_time(child.pid) or ("?",))[0] != "Z":
                assert time.monotonic() < deadline
                time.sleep(0.001)
            assert attributor.identify(child.pid) == first
            assert attributor.hits == 1
    finally:
        child.kill()
        child.wait()


def test_close_releases_every_pidfd() -> None:
    """close() (or leaving the with-block) forgets all entries and closes their pidfds."""
    before = fd_count()
    children = [subprocess.Popen(["sleep", "60"]) for _ in range(5)]
    try:
        with ProcessAttributor("/proc") as attributor:
            attributor.scan(c.pid for c in children)
            assert fd_count() == before + 5
            attributor.forget_except([children[0].pid])
            assert fd_count() == before + 1
        assert fd_count() == before
        assert attributor.cache_size == 0
    finally:
        for c in children:
            c.kill()
            c.wait()
