"""The identify stage: ProcIdentifier's cache over a fake /proc tree, its PID cursor, and the one /proc/<pid>/stat
parser it shares with the killer. Over real processes: tests/node/test_identify.py."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from vramguard.core.process import CgroupIdentity, ProcessRef
from vramguard.node.identify import PidWindow, ProcIdentifier, device_holders, in_pid_window, new_pid_window
from vramguard.node.procfs import PidCursor, parse_stat, read_pid_cursor, read_stat

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

    def set_cursor(self, last_pid: int, forks: int, pid_max: int = 32768, tasks: int = 400) -> None:
        """Write the three files the PID cursor is read from, as the kernel formats them."""
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "loadavg").write_text(f"0.10 0.20 0.30 1/{tasks} {last_pid}\n")
        cpu = "cpu  1 2 3 4 5 6 7 0 0 0\n"
        (self.root / "stat").write_text(f"{cpu}intr 1 2 3\nctxt 99\nbtime 1700000000\nprocesses {forks}\n")
        (self.root / "sys" / "kernel").mkdir(parents=True, exist_ok=True)
        (self.root / "sys" / "kernel" / "pid_max").write_text(f"{pid_max}\n")


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path / "proc")


def test_identify_reads_start_time_and_cgroup(proc: FakeProc) -> None:
    """A new process is read from stat and cgroup: its ref carries the start time, its identity the pod."""
    proc.add(100, 5000, cgroup_text(UID_A, CID_A1))
    attributor = ProcIdentifier(str(proc.root))
    assert attributor.identify(100) == (
        ProcessRef(100, 5000),
        CgroupIdentity(UID_A, CID_A1, "containerd", "burstable"),
    )
    assert (attributor.hits, attributor.misses) == (0, 1)


def test_warm_identify_does_not_reread_cgroup(proc: FakeProc) -> None:
    """While the start time is unchanged the cached identity is returned, whatever the cgroup file says now."""
    proc.add(100, 5000, cgroup_text(UID_A, CID_A1))
    attributor = ProcIdentifier(str(proc.root))
    first = attributor.identify(100)
    proc.set_cgroup(100, cgroup_text(UID_B, CID_B1))
    assert attributor.identify(100) == first
    assert (attributor.hits, attributor.misses) == (1, 1)


def test_recycled_pid_is_read_again(proc: FakeProc) -> None:
    """Same PID with a new start time is a new process: its cgroup is read and parsed afresh."""
    proc.add(100, 5000, cgroup_text(UID_A, CID_A1))
    attributor = ProcIdentifier(str(proc.root))
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
    attributor = ProcIdentifier(str(proc.root))
    attributor.identify(100)
    proc.remove(100)
    assert attributor.identify(100) is None
    assert attributor.identify(4242) is None
    assert attributor.cache_size == 0


def test_host_process_is_cached_with_no_identity(proc: FakeProc) -> None:
    """A process outside any pod is identified (ref, None), and that answer is cached like any other."""
    proc.add(7, 30, "0::/system.slice/Xorg.service\n", comm="Xorg")
    attributor = ProcIdentifier(str(proc.root))
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
    found = ProcIdentifier(str(proc.root)).identify(100)
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
    assert ProcIdentifier(str(proc.root)).identify(100) is None


def test_scan_forgets_processes_not_seen(proc: FakeProc) -> None:
    """scan() keeps only the PIDs of the latest scan, so the cache is bounded by the GPU process count."""
    for pid in (100, 101, 102):
        proc.add(pid, 5000 + pid, cgroup_text(UID_A, CID_A1))
    attributor = ProcIdentifier(str(proc.root))
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
    attributor = ProcIdentifier(str(proc.root))
    for pid in (100, 101, 102):
        attributor.identify(pid)
    attributor.forget_except(keep([101, 555]))
    assert attributor.cache_size == 1
    attributor.identify(101)
    assert attributor.hits == 1


def test_scan_leaves_out_gone_processes(proc: FakeProc) -> None:
    """scan() omits processes that no longer exist; attribute() then reports them as gone."""
    proc.add(100, 5000, cgroup_text(UID_A, CID_A1))
    attributor = ProcIdentifier(str(proc.root))
    assert set(attributor.scan([100, 999])) == {100}


def test_warm_scan_reads_no_cgroup_file(proc: FakeProc) -> None:
    """A warm scan of unchanged processes is all hits: deleting every cgroup file changes nothing."""
    for pid in range(200, 264):
        proc.add(pid, pid * 10, cgroup_text(UID_A, CID_A1))
    attributor = ProcIdentifier(str(proc.root))
    cold = attributor.scan(range(200, 264))
    for pid in range(200, 264):
        (proc.root / str(pid) / "cgroup").unlink()
    assert attributor.scan(range(200, 264)) == cold
    assert (attributor.hits, attributor.misses) == (64, 64)


def test_identify_alone_is_bounded_by_max_entries(proc: FakeProc) -> None:
    """Without scan(), the cache still never grows past max_entries."""
    for pid in range(300, 310):
        proc.add(pid, pid, cgroup_text(UID_A, CID_A1))
    attributor = ProcIdentifier(str(proc.root), max_entries=4)
    for pid in range(300, 310):
        attributor.identify(pid)
    assert attributor.cache_size == 4


# ----------------------------------------------------------------------------------------------------------
# The PID cursor: which cached entries the kernel may have handed to another process since the last scan


def cursor(last_pid: int, forks: int, pid_max: int = 32768, tasks: int = 400) -> PidCursor:
    return PidCursor(last_pid=last_pid, forks=forks, pid_max=pid_max, tasks=tasks)


WINDOW_CASES = [
    pytest.param(None, cursor(5000, 100), None, id="first-scan-checks-everything"),
    pytest.param(cursor(5000, 100), None, None, id="unreadable-cursor-checks-everything"),
    pytest.param(cursor(5000, 100), cursor(5000, 100), (5000, 5000), id="no-forks-empty-window"),
    pytest.param(cursor(5000, 100), cursor(5010, 110), (5000, 5010), id="ten-forks-window-behind-them"),
    pytest.param(cursor(32700, 100), cursor(350, 120), (32700, 350), id="cursor-wrapped-window-wraps"),
    pytest.param(cursor(5000, 100), cursor(5000, 101), None, id="forks-but-cursor-back-in-place-may-be-a-lap"),
    pytest.param(cursor(5000, 100), cursor(5010, 100 + 7520), None, id="lap-possible-by-fork-count"),
    pytest.param(cursor(5000, 100), cursor(5010, 100 + 7000), (5000, 5010), id="many-forks-but-no-lap"),
    pytest.param(
        cursor(5000, 100, tasks=5500),
        cursor(5010, 110, tasks=5500),
        None,
        id="pid-space-crowded-lap-possible-by-skipping",
    ),
    pytest.param(cursor(5000, 100), cursor(5010, 90), None, id="fork-count-went-back"),
    pytest.param(cursor(5000, 100), cursor(5010, 110, pid_max=4194304), None, id="pid-max-changed"),
    pytest.param(
        cursor(5000, 100, pid_max=4194304),
        cursor(9000, 1_000_100, pid_max=4194304),
        (5000, 9000),
        id="large-pid-max-tolerates-a-million-forks",
    ),
]


@pytest.mark.parametrize(("before", "after", "window"), WINDOW_CASES)
def test_new_pid_window(before: PidCursor | None, after: PidCursor | None, window: PidWindow | None) -> None:
    """Every PID handed out between two readings is in (A, B]; None whenever a lap cannot be ruled out."""
    assert new_pid_window(before, after) == window


@pytest.mark.parametrize(
    ("pid", "window", "inside"),
    [
        pytest.param(5005, (5000, 5010), True, id="inside"),
        pytest.param(5010, (5000, 5010), True, id="upper-end-is-inside"),
        pytest.param(5000, (5000, 5010), False, id="lower-end-is-outside"),
        pytest.param(4000, (5000, 5010), False, id="below"),
        pytest.param(6000, (5000, 5010), False, id="above"),
        pytest.param(32767, (32700, 350), True, id="wrapped-top"),
        pytest.param(320, (32700, 350), True, id="wrapped-bottom"),
        pytest.param(5000, (32700, 350), False, id="wrapped-middle-is-outside"),
        pytest.param(5000, (5000, 5000), False, id="empty-window"),
    ],
)
def test_in_pid_window(pid: int, window: PidWindow, inside: bool) -> None:
    """The cyclic interval (A, B]: A excluded, B included, wrapping past pid_max when B < A."""
    assert in_pid_window(pid, window) is inside


def reuse(proc: FakeProc, pid: int, start_time: int, uid: str = UID_B, cid: str = CID_B1) -> None:
    """The process at `pid` exits and another one (another pod's) gets the number."""
    proc.remove(pid)
    proc.add(pid, start_time, cgroup_text(uid, cid))


def test_scan_checks_only_the_pids_the_kernel_handed_out_again(proc: FakeProc) -> None:
    """With the cursor, a warm scan stat-checks only cached PIDs inside (A, B]; those are re-read when reused."""
    for pid in (1000, 2000, 3000):
        proc.add(pid, pid, cgroup_text(UID_A, CID_A1))
    proc.set_cursor(last_pid=3000, forks=50)
    attributor = ProcIdentifier(str(proc.root), use_pid_cursor=True, audit_per_scan=0)
    attributor.scan([1000, 2000, 3000])  # first scan: every entry read
    assert (attributor.misses, attributor.full_checks) == (3, 1)

    proc.set_cursor(last_pid=3000, forks=50)  # nothing forked: nothing to check
    attributor.scan([1000, 2000, 3000])
    assert (attributor.hits, attributor.stat_checks, attributor.full_checks) == (3, 0, 1)

    # The cursor went on around the ring, 3001..32767 then 300..2500: any number in (3000, 2500] may have been
    # handed out again, 1000 and 2000 included (2000 was); 3000 cannot have been.
    reuse(proc, 2000, 9_000, UID_B, CID_B1)
    proc.set_cursor(last_pid=2500, forks=50 + 6000)
    found = attributor.scan([1000, 2000, 3000])
    assert found[2000] == (ProcessRef(2000, 9_000), CgroupIdentity(UID_B, CID_B1, "containerd", "burstable"))
    assert found[1000][0] == ProcessRef(1000, 1000)
    assert (attributor.stat_checks, attributor.misses) == (2, 4)  # 1000 and 2000 checked, 2000 re-read


def boot_ticks() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK") // 1_000_000_000


@pytest.mark.parametrize(
    ("check", "cursor_moves"),
    [
        pytest.param("scan", True, id="in-the-cursor-window"),
        pytest.param("scan", False, id="scan-without-cursor"),
        pytest.param("identify", False, id="identify"),
    ],
)
def test_entry_read_in_its_start_tick_is_reread_not_stat_checked(
    proc: FakeProc, check: str, cursor_moves: bool
) -> None:
    """A process read within the clock tick it started in could be replaced, same start time, by one handed its
    PID later in that tick: a start time cannot vouch for it, so it is read again, cgroup included."""
    # The start tick is "now" for the whole test: a second ahead, as a tick boundary may pass while it runs.
    start_now = boot_ticks() + 100
    proc.add(1000, start_now, cgroup_text(UID_A, CID_A1))
    proc.set_cursor(last_pid=900, forks=50)
    attributor = ProcIdentifier(str(proc.root), use_pid_cursor=cursor_moves, audit_per_scan=0)
    attributor.scan([1000])
    reuse(proc, 1000, start_now, UID_B, CID_B1)  # same start time, another pod
    proc.set_cursor(last_pid=1001, forks=52)
    found = attributor.scan([1000])[1000] if check == "scan" else attributor.identify(1000)
    assert found is not None and found[1] == CgroupIdentity(UID_B, CID_B1, "containerd", "burstable")
    assert attributor.stat_checks == 0


def test_scan_trusts_pids_outside_the_window(proc: FakeProc) -> None:
    """A PID outside (A, B] cannot have been handed out again, so its stat is not even read.

    The fake tree is changed behind the kernel's back (a new start time without the cursor moving), which no
    real kernel does: the cached identity is returned, proving that no stat was read.
    """
    proc.add(1000, 1000, cgroup_text(UID_A, CID_A1))
    proc.set_cursor(last_pid=3000, forks=50)
    attributor = ProcIdentifier(str(proc.root), use_pid_cursor=True, audit_per_scan=0)
    first = attributor.scan([1000])
    reuse(proc, 1000, 7777)
    proc.set_cursor(last_pid=3100, forks=150)
    assert attributor.scan([1000]) == first
    assert attributor.stat_checks == 0


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda root: (root / "loadavg").unlink(), id="loadavg-unreadable"),
        pytest.param(lambda root: (root / "stat").write_text("cpu 1 2 3\n"), id="no-processes-line"),
        pytest.param(lambda root: (root / "sys" / "kernel" / "pid_max").write_text("lots\n"), id="pid-max-garbage"),
    ],
)
def test_unreadable_cursor_checks_every_entry(proc: FakeProc, damage: Callable[[Path], object]) -> None:
    """When the cursor cannot be read, every cached entry is checked through stat: a reused PID is seen."""
    proc.add(1000, 1000, cgroup_text(UID_A, CID_A1))
    proc.set_cursor(last_pid=3000, forks=50)
    attributor = ProcIdentifier(str(proc.root), use_pid_cursor=True, audit_per_scan=0)
    attributor.scan([1000])
    reuse(proc, 1000, 7777)
    damage(proc.root)
    assert attributor.scan([1000])[1000][0] == ProcessRef(1000, 7777)
    assert attributor.full_checks == 2


def test_cursor_of_a_scan_that_raised_is_not_kept(proc: FakeProc) -> None:
    """A scan interrupted half way keeps the older reading, so the next window still covers what it skipped."""
    for pid in (1000, 2000):
        proc.add(pid, pid, cgroup_text(UID_A, CID_A1))
    proc.set_cursor(last_pid=3000, forks=50)
    attributor = ProcIdentifier(str(proc.root), use_pid_cursor=True, audit_per_scan=0)
    attributor.scan([1000, 2000])
    reuse(proc, 2000, 9_000)
    proc.set_cursor(last_pid=2500, forks=2000)  # wrapped: 2000 is in the window

    def interrupted() -> Iterable[int]:
        yield 1000
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        attributor.scan(interrupted())
    proc.set_cursor(last_pid=2600, forks=2100)  # on its own, (2500, 2600] would not cover 2000
    assert attributor.scan([1000, 2000])[2000][0] == ProcessRef(2000, 9_000)


def test_audit_rechecks_every_entry_round_robin(proc: FakeProc) -> None:
    """Besides the window, each scan stat-checks the `audit_per_scan` least recently checked entries: in
    cache_size / audit_per_scan scans every entry has been checked, whatever the cursor says."""
    pids = list(range(1000, 1010))
    for pid in pids:
        proc.add(pid, pid, cgroup_text(UID_A, CID_A1))
    proc.set_cursor(last_pid=3000, forks=50)
    attributor = ProcIdentifier(str(proc.root), use_pid_cursor=True, audit_per_scan=3)
    attributor.scan(pids)
    # Reused behind the cursor's back (only host root can do that: see the class docstring).
    for pid in pids:
        reuse(proc, pid, pid + 50_000)
    for scan_no in range(1, 5):
        found = attributor.scan(pids)
        fresh = sum(found[pid][0].start_time == pid + 50_000 for pid in pids)
        assert fresh == min(10, 3 * scan_no)


def test_fake_proc_checks_every_entry(proc: FakeProc) -> None:
    """A tree whose "self" is not this process (a fake, another namespace) never uses the cursor."""
    proc.add(1000, 1000, cgroup_text(UID_A, CID_A1))
    proc.set_cursor(last_pid=3000, forks=50)
    attributor = ProcIdentifier(str(proc.root))
    assert not attributor.uses_pid_cursor
    attributor.scan([1000])
    reuse(proc, 1000, 7777)
    assert attributor.scan([1000])[1000][0] == ProcessRef(1000, 7777)


def test_pid_cursor_is_used_only_for_the_agents_own_proc(proc: FakeProc) -> None:
    """The real /proc gets the cursor check (and its cursor reads); a fake tree falls back to stat."""
    assert ProcIdentifier("/proc").uses_pid_cursor
    assert read_pid_cursor("/proc") is not None
    assert not ProcIdentifier(str(proc.root)).uses_pid_cursor


# ----------------------------------------------------------------------------------------------------------
# The one stat parser


@pytest.mark.parametrize(
    ("data", "parsed"),
    [
        pytest.param(b"42 (python3) S 1 " + b"0 " * 17 + b"5000 0 0\n", (b"S", b"5000"), id="plain"),
        pytest.param(b"42 (a b) c) R 1 " + b"0 " * 17 + b"77 0\n", (b"R", b"77"), id="spaces-and-paren-in-name"),
        pytest.param(b"42 ()) Z 1 " + b"0 " * 17 + b"9", (b"Z", b"9"), id="zombie-start-time-last"),
        pytest.param(b"42 (x) S 1 " + b"0 " * 17 + b"abc 0\n", None, id="non-numeric-start-time"),
        pytest.param(b"42 (x) S 1 0 0\n", None, id="truncated"),
        pytest.param(b"", None, id="empty"),
        pytest.param(b"42 no parenthesis S 1 " + b"0 " * 17 + b"5 0", None, id="no-command-name"),
    ],
)
def test_parse_stat(data: bytes, parsed: tuple[bytes, bytes] | None) -> None:
    """State and start time come after the last ')'; anything that does not parse is None, never a guess."""
    assert parse_stat(data) == parsed


def test_read_stat_raises_for_unparsable_contents(tmp_path: Path) -> None:
    """Contents that do not parse say nothing about the process: an error, not "gone"."""
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "stat").write_bytes(b"7 (x) S 1 0\n")
    with pytest.raises(OSError, match="unparsable"):
        read_stat(7, str(tmp_path))


def test_device_holders_of_a_pods_containers(proc: FakeProc) -> None:
    """The processes of the given containers holding the device, in PID order, with their start times; a process
    holding none, another container's, another pod's, and one whose fds cannot be listed are left out."""
    for pid, uid, cid, device in [
        (12, UID_A, CID_A1, "/dev/nvidia0"),
        (11, UID_A, CID_A1, "/dev/nvidia-uvm"),
        (13, UID_A, CID_A1, "/dev/null"),
        (14, UID_A, CID_A2, "/dev/nvidia0"),
        (15, UID_B, CID_B1, "/dev/nvidia0"),
    ]:
        proc.add(pid, 100 + pid, cgroup_text(uid, cid))
        (proc.root / str(pid) / "fd").mkdir()
        (proc.root / str(pid) / "fd" / "3").symlink_to(device)
    proc.add(16, 116, cgroup_text(UID_A, CID_A1))
    (proc.root / "16" / "fd").write_text("")  # not a directory: its fds cannot be listed

    assert device_holders(str(proc.root), UID_A, {CID_A1}) == [ProcessRef(11, 111), ProcessRef(12, 112)]
    assert device_holders(str(proc.root / "missing"), UID_A, {CID_A1}) == []
