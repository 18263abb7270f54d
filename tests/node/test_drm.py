"""The DRM readers over stand-in /sys and /proc trees written around real processes, and over the real /proc: GPU
discovery (render nodes mapped by their own link, partitions, a BMC), which fds are read, and the bounds a process
with a fat fd table meets."""

from __future__ import annotations

import errno
import os
import resource
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from real_parts import need
from vramguard.node.drm import DrmFdReader, DrmNode, FdScanLimits, discover, fdinfo_text
from vramguard_testbed.fakes import FakeClock

# amdgpu's fdinfo in the 7.x format (the drm- header, then drm_print_memory_stats, then the legacy KiB lines).
AMDGPU_FDINFO = (
    "pos:\t0\nflags:\t02100002\nmnt_id:\t26\nino:\t1090\n"
    "drm-driver:\tamdgpu\ndrm-client-id:\t41\ndrm-pdev:\t0000:03:00.0\npasid:\t32770\n"
    "drm-resident-vram:\t4194304 KiB\ndrm-memory-vram:\t4194304 KiB\ndrm-memory-gtt: \t2048 KiB\n"
)

# A child that opens the files named on its command line (read-only; a char device with O_PATH), optionally after
# `pad` fds of /dev/null, prints its fd numbers and waits for its stdin to close.
CHILD = """
import os, resource, stat, sys
pad = int(sys.argv[1])
if pad:
    resource.setrlimit(resource.RLIMIT_NOFILE, (pad + 64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    null = os.open("/dev/null", os.O_RDONLY)
    for _ in range(pad):
        os.dup(null)
fds = []
for path in sys.argv[2:]:
    flags = os.O_PATH if stat.S_ISCHR(os.stat(path).st_mode) else os.O_RDONLY
    fds.append(os.open(path, flags))
print(" ".join(map(str, fds)), flush=True)
sys.stdin.read()
"""


class Child:
    """A real process holding the given files open (after `pad` /dev/null fds); `fds` are their numbers."""

    def __init__(self, paths: list[Path], pad: int = 0) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(pad), *map(str, paths)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline()
        assert line, "the child did not start"
        self.fds = [int(f) for f in line.split()]
        self.pid = self.popen.pid

    def close(self) -> None:
        if self.popen.stdin is not None:
            self.popen.stdin.close()
        self.popen.wait(timeout=10)


@pytest.fixture
def children() -> Iterator[list[Child]]:
    made: list[Child] = []
    yield made
    for child in made:
        child.close()


@pytest.fixture
def dri(tmp_path: Path) -> Path:
    """A directory of plain files standing in for /dev/dri."""
    path = tmp_path / "dev" / "dri"
    path.mkdir(parents=True)
    for name in ("card0", "renderD128", "renderD129", "renderD130"):
        (path / name).write_bytes(b"")
    return path


def stand_in_proc(root: Path, pid: int, fdinfo: dict[str, str]) -> None:
    """`root/<pid>` mirroring the real process's fd table: every `fd/<n>` links where the real one does, and
    `fdinfo/<n>` is the text given for that target, else the kernel's own."""
    (root / str(pid) / "fd").mkdir(parents=True)
    (root / str(pid) / "fdinfo").mkdir()
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
            real = Path(f"/proc/{pid}/fdinfo/{name}").read_text()
        except FileNotFoundError:
            continue
        os.symlink(target, root / str(pid) / "fd" / name)
        (root / str(pid) / "fdinfo" / name).write_text(fdinfo.get(target, real))


# ----------------------------------------------------------------------------------------------------------
# Discovery


def _pci_device(sys_root: Path, slot: str, vendor: str, driver: str, attrs: dict[str, str]) -> Path:
    device = sys_root / "devices" / "pci0000:00" / slot
    device.mkdir(parents=True)
    (device / "uevent").write_text(f"DRIVER={driver}\nPCI_SLOT_NAME={slot.upper()}\n")
    (device / "vendor").write_text(f"{vendor}\n")
    drivers = sys_root / "bus" / "pci" / "drivers" / driver
    drivers.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(drivers, device), device / "driver")
    for name, value in attrs.items():
        (device / name).write_text(value)
    return device


def _drm_node(sys_root: Path, device: Path, name: str, minor: int) -> None:
    """`class/drm/<name>` linking to `<device>/drm/<name>`, whose `device` links back up, as sysfs lays them out."""
    node = device / "drm" / name
    node.mkdir(parents=True)
    (node / "dev").write_text(f"226:{minor}\n")
    os.symlink("../..", node / "device")
    (sys_root / "class" / "drm").mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(node, sys_root / "class" / "drm"), sys_root / "class" / "drm" / name)


@pytest.fixture
def sys_root(tmp_path: Path) -> Path:
    """Two GPUs whose render minors do not follow their card indexes, an MI300 partition node, a BMC."""
    root = tmp_path / "sys"
    mi300x = _pci_device(
        root,
        "0000:c1:00.0",
        "0x1002",
        "amdgpu",
        {
            "mem_info_vram_total": "206141652992\n",
            "mem_info_vram_used": "4563402752\n",
            "unique_id": "2a5c3e8f0b1d4e67\n",
        },
    )
    _drm_node(root, mi300x, "card1", 1)
    _drm_node(root, mi300x, "renderD129", 129)
    _drm_node(root, mi300x, "card1-DP-1", 0)  # a connector: not a node
    xe = _pci_device(root, "0000:03:00.0", "0x8086", "xe", {})
    _drm_node(root, xe, "card2", 2)
    _drm_node(root, xe, "renderD128", 128)
    bmc = _pci_device(root, "0000:02:00.0", "0x1a03", "ast", {"unique_id": "\n"})
    _drm_node(root, bmc, "card0", 0)
    xcp = root / "devices" / "platform" / "amdgpu_xcp_1"
    xcp.mkdir(parents=True)
    (xcp / "uevent").write_text("DRIVER=amdgpu_xcp_drv\nMODALIAS=platform:amdgpu_xcp_1\n")
    _drm_node(root, xcp, "renderD130", 130)
    (root / "class" / "drm" / "version").write_text("drm 1.1.0 20060810\n")
    return root


def test_discover_maps_nodes_to_their_pci_device(sys_root: Path) -> None:
    """Each GPU is named by its PCI slot with its own nodes (by link, not index), driver, vendor and memory."""
    topo = discover(str(sys_root))
    assert [g.pci_slot for g in topo.gpus] == ["0000:02:00.0", "0000:03:00.0", "0000:c1:00.0"]
    bmc, xe, mi300x = topo.gpus
    assert (mi300x.driver, mi300x.vendor) == ("amdgpu", 0x1002)
    assert (mi300x.vram_total_bytes, mi300x.vram_used_bytes) == (206141652992, 4563402752)
    assert mi300x.unique_id == "2a5c3e8f0b1d4e67"
    assert mi300x.card == DrmNode("card1", 226, 1, "0000:c1:00.0")
    assert mi300x.render == DrmNode("renderD129", 226, 129, "0000:c1:00.0")
    assert (xe.driver, xe.vendor, xe.vram_total_bytes, xe.unique_id) == ("xe", 0x8086, None, None)
    assert [n.name for n in xe.nodes] == ["card2", "renderD128"]
    assert (bmc.driver, bmc.render, bmc.unique_id) == ("ast", None, None)


def test_discover_keeps_partition_nodes_without_a_pci_address(sys_root: Path) -> None:
    """An XCP partition's render node is a DRM node with no PCI parent: listed by minor, in no GPU."""
    topo = discover(str(sys_root))
    assert topo.node(130) == DrmNode("renderD130", 226, 130, None)
    assert [n.minor for n in topo.nodes] == [0, 1, 2, 128, 129, 130]
    assert all(130 not in [n.minor for n in g.nodes] for g in topo.gpus)


def test_discover_without_drm_is_empty(tmp_path: Path) -> None:
    """A node with no DRM driver loaded has no class/drm: no GPUs, not an error."""
    topo = discover(str(tmp_path))
    assert (topo.gpus, topo.nodes) == ((), ())


# ----------------------------------------------------------------------------------------------------------
# The processes, over a stand-in /proc


def test_reads_only_drm_fds_of_a_real_process(tmp_path: Path, dri: Path, children: list[Child]) -> None:
    """Of a real process's fds, only those linking into /dev/dri have their fdinfo read, each fd on its own."""
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    child = Child([dri / "renderD129", other, dri / "renderD129"])
    children.append(child)
    proc = tmp_path / "proc"
    stand_in_proc(proc, child.pid, {str(dri / "renderD129"): AMDGPU_FDINFO})
    reader = DrmFdReader(fdinfo_text, proc_root=str(proc), dri_prefix=f"{dri}/")

    scan = reader.read([child.pid])

    assert (scan.gone, scan.skipped, scan.errors) == ((), (), ())
    [found] = scan.processes
    assert (found.pid, found.complete) == (child.pid, True)
    render_fds = [child.fds[0], child.fds[2]]
    assert [f.fd for f in found.fds] == render_fds
    assert {f.fdinfo for f in found.fds} == {AMDGPU_FDINFO}
    assert {f.target for f in found.fds} == {str(dri / "renderD129")}
    assert {f.minor for f in found.fds} == {None}  # a plain file stands in for the node: no device number


def test_a_process_not_in_the_tree_is_gone(tmp_path: Path, dri: Path, children: list[Child]) -> None:
    """A PID with no directory under the proc root is reported gone, beside the process that is read."""
    child = Child([dri / "renderD128"])
    children.append(child)
    proc = tmp_path / "proc"
    stand_in_proc(proc, child.pid, {str(dri / "renderD128"): AMDGPU_FDINFO})
    dead = subprocess.Popen(["true"])
    dead.wait()
    scan = DrmFdReader(fdinfo_text, proc_root=str(proc), dri_prefix=f"{dri}/").read([dead.pid, child.pid])
    assert scan.gone == (dead.pid,)
    assert [p.pid for p in scan.processes] == [child.pid]


def test_an_unlistable_fd_table_is_an_error_not_gone(tmp_path: Path, dri: Path, children: list[Child]) -> None:
    """An fd table that cannot be listed (here: not a directory) is an error for that PID; the scan goes on."""
    child = Child([dri / "renderD128"])
    children.append(child)
    proc = tmp_path / "proc"
    stand_in_proc(proc, child.pid, {})
    (proc / "1").mkdir()
    (proc / "1" / "fd").write_text("")
    scan = DrmFdReader(fdinfo_text, proc_root=str(proc), dri_prefix=f"{dri}/").read([1, child.pid])
    assert [pid for pid, _ in scan.errors] == [1]
    assert scan.errors[0][1] == os.strerror(errno.ENOTDIR)
    assert [p.pid for p in scan.processes] == [child.pid]


def test_a_full_fdinfo_buffer_is_flagged_truncated(tmp_path: Path, dri: Path, children: list[Child]) -> None:
    """An fdinfo text longer than the bound is read only up to it, and the fd says so."""
    child = Child([dri / "renderD128"])
    children.append(child)
    proc = tmp_path / "proc"
    stand_in_proc(proc, child.pid, {str(dri / "renderD128"): AMDGPU_FDINFO + "x" * 100_000})
    limits = FdScanLimits(fdinfo_bytes=1024)
    scan = DrmFdReader(fdinfo_text, proc_root=str(proc), limits=limits, dri_prefix=f"{dri}/").read([child.pid])
    [fd] = scan.processes[0].fds
    assert fd.truncated and len(fd.fdinfo) == 1024 and fd.fdinfo.startswith(AMDGPU_FDINFO)


# ----------------------------------------------------------------------------------------------------------
# The processes, over the real /proc


def test_real_proc_gives_the_kernels_fdinfo(dri: Path, children: list[Child]) -> None:
    """Over the real /proc, the fd found is the one the process opened, with the kernel's own fdinfo text."""
    child = Child([dri / "renderD128"])
    children.append(child)
    scan = DrmFdReader(fdinfo_text, dri_prefix=f"{dri}/").read([child.pid])
    [fd] = scan.processes[0].fds
    assert fd.fd == child.fds[0]
    assert fd.fdinfo.startswith("pos:\t0\nflags:\t")
    assert f"ino:\t{os.stat(dri / 'renderD128').st_ino}\n" in fd.fdinfo


def test_a_drm_device_under_another_path_is_found_by_its_device_number(tmp_path: Path, children: list[Child]) -> None:
    """A DRM character device whose path is not under /dev/dri (a plugin mounting it elsewhere) is recognised by
    a stat of the open file: major 226, and its minor is reported; a plain file of the same name is not."""
    node = tmp_path / "elsewhere" / "renderD200"
    node.parent.mkdir()
    try:
        os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(226, 200))
    except OSError as e:
        need(f"mknod: {e.strerror}", skip="cannot make a DRM device node", ci="run as root with mknod allowed")
    fake = tmp_path / "plain" / "renderD201"
    fake.parent.mkdir()
    fake.write_bytes(b"")
    child = Child([node, fake])
    children.append(child)
    scan = DrmFdReader(fdinfo_text).read([child.pid])
    [fd] = scan.processes[0].fds
    assert (fd.fd, fd.minor, fd.target) == (child.fds[0], 200, str(node))


def test_a_process_with_many_fds_costs_at_most_the_per_process_bound(dri: Path, children: list[Child]) -> None:
    """A process with 15,000 fds is looked at up to `fds_per_process` entries and marked incomplete (a DRM fd
    past that point is not seen); a process after it in the same scan is still read in full."""
    limits = FdScanLimits(fds_per_process=4096)
    pad = min(15_000, resource.getrlimit(resource.RLIMIT_NOFILE)[1] - 128)
    if pad <= 2 * limits.fds_per_process:
        need(f"RLIMIT_NOFILE hard limit {pad + 128}", skip="cannot open enough fds", ci="allow 15,000 open files")
    fat = Child([dri / "renderD128"], pad=pad)
    thin = Child([dri / "renderD129"])
    children.extend([fat, thin])
    scan = DrmFdReader(fdinfo_text, limits=limits, dri_prefix=f"{dri}/").read([fat.pid, thin.pid])
    fat_read, thin_read = scan.processes
    assert (fat_read.pid, fat_read.complete, fat_read.fds) == (fat.pid, False, ())
    assert (thin_read.pid, thin_read.complete, [f.fd for f in thin_read.fds]) == (thin.pid, True, thin.fds)


def test_drm_fds_per_process_bound(dri: Path, children: list[Child]) -> None:
    """A process that opens a DRM node many times has at most `drm_fds_per_process` fdinfo texts read."""
    child = Child([dri / "renderD128"] * 10)
    children.append(child)
    limits = FdScanLimits(drm_fds_per_process=4)
    [found] = DrmFdReader(fdinfo_text, limits=limits, dri_prefix=f"{dri}/").read([child.pid]).processes
    assert ([f.fd for f in found.fds], found.complete) == (child.fds[:4], False)


def test_the_scan_budget_skips_the_rest_and_reads_it_first_next_time(dri: Path, children: list[Child]) -> None:
    """When the scan's fd budget runs out, the PIDs not reached are reported skipped and read first next scan; a
    process listed in full before costs the next scan its DRM fd alone."""
    first, second, third = (Child([dri / "renderD128"]) for _ in range(3))
    children.extend([first, second, third])
    per_child = len(os.listdir(f"/proc/{first.pid}/fd"))
    limits = FdScanLimits(fds_per_scan=per_child + 1)  # the first in full, one entry of the second
    reader = DrmFdReader(fdinfo_text, limits=limits, dri_prefix=f"{dri}/")
    pids = [first.pid, second.pid, third.pid]

    scan = reader.read(pids)
    assert [(p.pid, p.complete) for p in scan.processes] == [(first.pid, True), (second.pid, False)]
    assert scan.skipped == (third.pid,)

    scan = reader.read(pids)
    assert [(p.pid, p.complete) for p in scan.processes] == [(third.pid, True), (first.pid, True)]
    assert [len(p.fds) for p in scan.processes] == [1, 1]
    assert scan.skipped == (second.pid,)


class TickingClock(FakeClock):
    """A clock that moves `tick_s` every time it is read: time passes as the scan works."""

    def __init__(self, tick_s: float) -> None:
        super().__init__()
        self.tick_s = tick_s

    def now(self) -> float:
        return self.step(self.tick_s)


def test_the_scan_time_budget_ends_the_scan(dri: Path, children: list[Child]) -> None:
    """Once the scan's time is spent, it looks at no more fds: the process it was in is incomplete, the rest
    skipped."""
    first, second = Child([dri / "renderD128"]), Child([dri / "renderD128"])
    children.extend([first, second])
    limits = FdScanLimits(time_per_scan_s=3.0)
    reader = DrmFdReader(fdinfo_text, limits=limits, clock=TickingClock(1.0), dri_prefix=f"{dri}/")
    scan = reader.read([first.pid, second.pid])
    # The clock is read at the start (t, deadline t+3), before `first` (t+1), its 1st entry (t+2), its 2nd (t+3).
    assert [(p.pid, p.complete, len(p.fds)) for p in scan.processes] == [(first.pid, False, 0)]
    assert scan.skipped == (second.pid,)


OPENER = """
import os, sys
for line in sys.stdin:
    print(os.open(line.strip(), os.O_RDONLY), flush=True)
"""


def test_a_drm_file_opened_later_is_seen_at_the_next_read_by_the_fd_count(dri: Path) -> None:
    """Between full listings only a process's known DRM fds are read again; a file it opens since changes its fd
    count (the size of /proc/<pid>/fd, Linux 6.2+), which makes the next read list it in full and find it."""
    opener = subprocess.Popen([sys.executable, "-c", OPENER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert opener.stdin is not None and opener.stdout is not None
    try:
        if os.stat(f"/proc/{opener.pid}/fd").st_size == 0:
            pytest.skip("this kernel reports no fd count for /proc/<pid>/fd (before Linux 6.2)")
        clock = FakeClock()
        reader = DrmFdReader(fdinfo_text, clock=clock, dri_prefix=f"{dri}/")
        opener.stdin.write(f"{dri / 'renderD128'}\n")
        opener.stdin.flush()
        first = int(opener.stdout.readline())
        assert [f.fd for f in reader.read([opener.pid]).processes[0].fds] == [first]
        opener.stdin.write(f"{dri / 'renderD129'}\n")
        opener.stdin.flush()
        second = int(opener.stdout.readline())
        assert [f.fd for f in reader.read([opener.pid]).processes[0].fds] == [first, second]
    finally:
        opener.stdin.close()
        opener.wait(timeout=10)


def test_a_listing_is_trusted_for_relist_s_while_the_fd_count_stays(tmp_path: Path, dri: Path) -> None:
    """A stand-in fd table whose directory size does not change (as on a kernel before 6.2) is listed again only
    once `relist_s` has passed: a DRM file added meanwhile is found then, not before."""
    proc = tmp_path / "proc"
    fd_dir = proc / "4242" / "fd"
    fd_dir.mkdir(parents=True)
    (proc / "4242" / "fdinfo").mkdir()
    for n in (3, 4):
        (proc / "4242" / "fdinfo" / str(n)).write_text(AMDGPU_FDINFO)
    (fd_dir / "3").symlink_to("/dev/dri/renderD128")
    clock = FakeClock()
    reader = DrmFdReader(fdinfo_text, proc_root=str(proc), limits=FdScanLimits(relist_s=10.0), clock=clock)
    assert [f.fd for f in reader.read([4242]).processes[0].fds] == [3]
    size = os.stat(fd_dir).st_size
    (fd_dir / "4").symlink_to("/dev/dri/renderD129")
    if os.stat(fd_dir).st_size != size:
        pytest.skip("this filesystem's directory size counts entries: the fd count alone finds the new fd")
    clock.step(9.0)
    assert [f.fd for f in reader.read([4242]).processes[0].fds] == [3]
    clock.step(1.0)
    assert [f.fd for f in reader.read([4242]).processes[0].fds] == [3, 4]


def test_a_drm_fd_hidden_behind_thousands_of_fds_is_found_by_the_sweep_going_on(
    dri: Path, children: list[Child]
) -> None:
    """A tenant puts its render node after 5,000 other fds: the first read stops at the per-process bound without
    it, the next goes on from there (not from the start) and finds it, and from then on it alone is read."""
    child = Child([dri / "renderD128"], pad=5000)
    children.append(child)
    reader = DrmFdReader(fdinfo_text, limits=FdScanLimits(fds_per_process=4096), dri_prefix=f"{dri}/")

    first = reader.read([child.pid]).processes[0]
    assert (first.complete, first.fds) == (False, ())
    second = reader.read([child.pid]).processes[0]
    assert (second.complete, [f.fd for f in second.fds]) == (True, child.fds)
    third = reader.read([child.pid]).processes[0]
    assert (third.complete, [f.fd for f in third.fds]) == (True, child.fds)
