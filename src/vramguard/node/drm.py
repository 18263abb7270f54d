"""The node side of the DRM backend: the GPUs under `<sys-root>/class/drm`, and the fdinfo of the processes' open
DRM files under `<proc-root>`.

Two readers, both with their roots as parameters (tests write stand-in trees; an agent in a pod reads the host's
`/host/sys` and `/host/proc`):

- `discover(sys_root)`: every card, render and accel node, its device number (major 226, minor) and the PCI
  device it belongs to (slot from the device's `uevent`, `vendor`, the bound driver, amdgpu's
  `mem_info_vram_total`/`_used` in bytes and `unique_id` where the GPU has one). Render nodes are mapped to their
  PCI device through their own `device` link, never by their index: renderD<128+N> need not be card<N>.
- `DrmFdReader.read(pids)`: for each PID, the fds whose `fd/<n>` link names a DRM node, and the text of their
  `fdinfo/<n>`, read under per-process and per-scan bounds (`FdScanLimits`), because the fd table is tenant
  input: a process with 100,000 fds must cost a scan no more than the bounds say.

What an fdinfo text means (driver, pdev, client id, memory per region) is not read here: the reader hands each
text to a parser it is given (`fdinfo_text` keeps it as text), so the parsing module plugs in without touching
the I/O.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.node.procfs import is_gone_error, read_head

DRM_MAJOR = 226  # include/drm/drm_ioctl.h: every card, render and accel node has this major
DRI_PREFIX = "/dev/dri/"
_SYSFS_MAX_BYTES = 4096  # one sysfs attribute is at most a page
# card0, renderD128, accel0 — and not card0-DP-1 (a connector) or "version".
_NODE_NAME = re.compile(r"(card|renderD|accel)([0-9]+)")

_T = TypeVar("_T")


# ----------------------------------------------------------------------------------------------------------
# The devices: <sys-root>/class/drm


@dataclass(frozen=True, slots=True)
class DrmNode:
    """One DRM device node (`/dev/dri/<name>`) as sysfs lists it."""

    name: str  # "card0", "renderD128", "accel0"
    major: int
    minor: int
    pci_slot: str | None  # the PCI device it belongs to; None for a non-PCI parent (an amdgpu XCP partition)

    @property
    def kind(self) -> str:
        """The node kind from its name: card, renderD or accel."""
        match = _NODE_NAME.fullmatch(self.name)
        return match.group(1) if match else ""


@dataclass(frozen=True, slots=True)
class DrmGpu:
    """One PCI device with a DRM driver bound: its nodes and what sysfs says of its memory.

    Whether its driver prints memory stats in fdinfo is not in sysfs; the caller decides from `driver`.
    """

    pci_slot: str  # "0000:03:00.0": the name `drm-pdev` gives it in fdinfo and dmem gives its regions
    vendor: int | None  # PCI vendor id (0x1002 AMD, 0x8086 Intel, 0x10de NVIDIA)
    driver: str | None  # the bound driver's name ("amdgpu", "xe", "i915"), None when unbound or unreadable
    vram_total_bytes: int | None  # amdgpu's mem_info_vram_total; None where the driver has none
    vram_used_bytes: int | None  # amdgpu's mem_info_vram_used
    unique_id: str | None  # amdgpu's unique_id (16 hex digits); None where absent or empty
    nodes: tuple[DrmNode, ...]  # sorted by minor
    product_name: str | None = None  # amdgpu's product_name ("AMD Instinct MI300X"); None where absent or empty
    sysfs_dir: str = ""  # the PCI device's directory under the sys root, where its memory counters are re-read

    @property
    def card(self) -> DrmNode | None:
        return next((n for n in self.nodes if n.kind == "card"), None)

    @property
    def render(self) -> DrmNode | None:
        return next((n for n in self.nodes if n.kind == "renderD"), None)


@dataclass(frozen=True, slots=True)
class DrmTopology:
    """What `discover` found: the PCI GPUs, and every node by minor (partition nodes with no PCI parent too)."""

    gpus: tuple[DrmGpu, ...]  # sorted by PCI slot
    nodes: tuple[DrmNode, ...]  # sorted by minor

    def node(self, minor: int) -> DrmNode | None:
        return next((n for n in self.nodes if n.minor == minor), None)

    def gpu(self, pci_slot: str) -> DrmGpu | None:
        return next((g for g in self.gpus if g.pci_slot == pci_slot), None)


def parse_dev(text: bytes) -> tuple[int, int] | None:
    """(major, minor) from a sysfs `dev` file ("226:128\\n"); None when it does not parse."""
    major, sep, minor = text.strip().partition(b":")
    if not sep or not major.isdigit() or not minor.isdigit():
        return None
    return int(major), int(minor)


def parse_pci_slot(uevent: bytes) -> str | None:
    """PCI_SLOT_NAME from a device's `uevent` ("0000:03:00.0"); None for a device that is not PCI."""
    for line in uevent.splitlines():
        key, sep, value = line.partition(b"=")
        if sep and key == b"PCI_SLOT_NAME" and value.strip():
            return value.strip().decode("ascii", "replace").lower()
    return None


def parse_int(text: bytes, base: int = 10) -> int | None:
    """A sysfs number ("0x1002\\n" with `base` 16, "17163091968\\n" with 10); None when absent or not a number."""
    try:
        return int(text.strip(), base)
    except ValueError:
        return None


def parse_text_attr(text: bytes) -> str | None:
    """amdgpu's `unique_id` ("%016llx\\n") or `product_name`, which read empty on a GPU that has none; None then.
    At most 64 printable characters are kept: the text is the board's (FRU data), not the kernel's own."""
    value = "".join(c for c in text.strip().decode("ascii", "replace")[:64] if c.isprintable())
    return value or None


def discover(sys_root: str = "/sys") -> DrmTopology:
    """Every DRM node under `<sys_root>/class/drm` and the PCI devices they belong to.

    No `class/drm` (no DRM driver loaded) is an empty topology; a directory that exists but cannot be listed
    raises OSError. A node whose own files cannot be read is left out; a device attribute that cannot be read
    is None.
    """
    class_dir = os.path.join(sys_root, "class", "drm")
    try:
        names = os.listdir(class_dir)
    except FileNotFoundError:
        return DrmTopology(gpus=(), nodes=())
    nodes: list[DrmNode] = []
    by_device: dict[str, list[DrmNode]] = {}
    device_dirs: dict[str, str] = {}  # pci slot -> its sysfs directory
    for name in sorted(names):
        if not _NODE_NAME.fullmatch(name):
            continue
        entry = os.path.join(class_dir, name)
        dev = parse_dev(read_attr(os.path.join(entry, "dev")) or b"")
        if dev is None:
            continue
        device_dir = os.path.realpath(os.path.join(entry, "device"))
        slot = parse_pci_slot(read_attr(os.path.join(device_dir, "uevent")) or b"")
        node = DrmNode(name=name, major=dev[0], minor=dev[1], pci_slot=slot)
        nodes.append(node)
        if slot is not None:
            by_device.setdefault(slot, []).append(node)
            device_dirs[slot] = device_dir
    gpus = tuple(
        _read_gpu(slot, device_dirs[slot], tuple(sorted(members, key=lambda n: n.minor)))
        for slot, members in sorted(by_device.items())
    )
    return DrmTopology(gpus=gpus, nodes=tuple(sorted(nodes, key=lambda n: n.minor)))


def _read_gpu(slot: str, device_dir: str, nodes: tuple[DrmNode, ...]) -> DrmGpu:
    def attr(name: str) -> bytes:
        return read_attr(os.path.join(device_dir, name)) or b""

    driver_link = os.path.join(device_dir, "driver")
    try:
        driver: str | None = os.path.basename(os.readlink(driver_link))
    except OSError:
        driver = None
    return DrmGpu(
        pci_slot=slot,
        vendor=parse_int(attr("vendor"), 16),
        driver=driver,
        vram_total_bytes=parse_int(attr("mem_info_vram_total")),
        vram_used_bytes=parse_int(attr("mem_info_vram_used")),
        unique_id=parse_text_attr(attr("unique_id")),
        nodes=nodes,
        product_name=parse_text_attr(attr("product_name")),
        sysfs_dir=device_dir,
    )


def read_attr(path: str) -> bytes | None:
    """One sysfs attribute, at most a page; None when it is missing or unreadable (a driver without it)."""
    try:
        return read_head(path, _SYSFS_MAX_BYTES)
    except OSError:
        return None


# ----------------------------------------------------------------------------------------------------------
# The processes: <proc-root>/<pid>/fd and fdinfo


@dataclass(frozen=True, slots=True)
class FdScanLimits:
    """How much of the fd tables one `read` may look at. The fd table is tenant input (RLIMIT_NOFILE is often
    2^20 in a container), so every dimension is capped, and what was cut is reported, never silently dropped.

    The defaults, with costs measured on this project's test machine (a /proc/<pid>/fd entry costs ~4 µs to
    list and readlink, a stat ~4 µs, reading a plain file's fdinfo ~5 µs; a DRM driver's does more work):
    - 4,096 fd entries per process: a ROCm process has a few hundred fds; 4,096 is ~16 ms of one scan, and a
      process with 100,000 fds costs no more (the listing is read lazily and abandoned there).
    - 64 DRM fds per process whose fdinfo is read: one render fd per GPU (8 on a node), a few more for graphics
      stacks; a process that opens a render node 10,000 times costs 64 reads.
    - 16 KiB per fdinfo text: amdgpu's and xe's are ~2 KiB (and only `drm-client-name`, 64 bytes at most, comes
      from the tenant), so a full buffer means something is wrong and the fd is flagged `truncated`.
    - 32,768 fd entries, 4 MiB of fdinfo text and 0.25 s per `read` over all its processes: the scan's own
      budget, so that 512 GPU processes with fat fd tables delay a scan by at most a quarter of a second.
    - A process's fd table is listed in full when it is first read, when its fd count changed (the size a stat of
      `/proc/<pid>/fd` gives, Linux 6.2+) and at least every 10 s (`relist_s`: on older kernels that size is 0, so
      a DRM file a process opens later is seen within that); in between, only the DRM fds found are read again.
      512 processes of 64 fds each cost a scan ~20 ms instead of ~250 (bench/drm_scan.py).
    """

    fds_per_process: int = 4096
    drm_fds_per_process: int = 64
    fdinfo_bytes: int = 16 * 1024
    fds_per_scan: int = 32_768
    bytes_per_scan: int = 4 * 1024 * 1024
    time_per_scan_s: float = 0.25
    relist_s: float = 10.0  # how long a process's fd listing is trusted while its fd count stays the same


class ScanBudget:
    """What is left of one `read`'s `FdScanLimits`: entries, bytes and time, spent as the scan goes."""

    def __init__(self, limits: FdScanLimits, clock: Clock) -> None:
        self._clock = clock
        self._deadline = clock.now() + limits.time_per_scan_s
        self.fds_left = limits.fds_per_scan
        self.bytes_left = limits.bytes_per_scan

    def spent(self) -> bool:
        """True once any dimension is used up: the scan looks at nothing more."""
        return self.fds_left <= 0 or self.bytes_left <= 0 or self._clock.now() >= self._deadline

    def spend_fd(self) -> None:
        self.fds_left -= 1

    def spend_bytes(self, n: int) -> None:
        self.bytes_left -= n


def fdinfo_text(data: bytes) -> str:
    """The default parser: the fdinfo text as the kernel wrote it (undecodable bytes escaped)."""
    return data.decode("utf-8", "surrogateescape")


def drm_candidate(target: str, dri_prefix: str = DRI_PREFIX) -> bool | None:
    """What an fd link's target says: True when it names a DRM node (under `dri_prefix`), None when it might be
    one under another path (a `dri/` directory or a node's name: a device plugin may mount the node elsewhere in
    the container, and the link shows the container's path), which only a stat can tell; False otherwise
    (sockets, pipes, anon inodes, ordinary files), never stat'd: a stat can block on a dead network filesystem.
    A True or None target is stat'd (`_drm_minor`); a process that can mount FUSE in its own namespace at such a
    path could make that stat wait on its server, which is why only these few paths are stat'd at all.
    """
    if target.startswith(dri_prefix):
        return True
    if not target.startswith("/"):
        return False
    if "/dri/" in target or _NODE_NAME.fullmatch(os.path.basename(target)):
        return None
    return False


@dataclass(frozen=True, slots=True)
class DrmFd(Generic[_T]):
    """One open DRM file of a process, and what its fdinfo said."""

    fd: int
    target: str  # the fd link as the kernel shows it (the process's own path)
    minor: int | None  # the node's minor, from a stat of the open file; None where the stat says nothing
    fdinfo: _T  # the parser's result for the fdinfo text
    truncated: bool = False  # the text filled `fdinfo_bytes`: its end was not read


@dataclass(frozen=True, slots=True)
class ProcessDrmFds(Generic[_T]):
    """One process's DRM fds. `complete` is False when a bound stopped the look before its fd table's end: a DRM
    fd after that point is not in `fds` (its memory reads as unattributed, never as another process's)."""

    pid: int
    fds: tuple[DrmFd[_T], ...]
    complete: bool = True


@dataclass(frozen=True, slots=True)
class DrmFdScan(Generic[_T]):
    """What one `read` found, for every PID it was given: read, gone, not reached, or unreadable."""

    processes: tuple[ProcessDrmFds[_T], ...]
    gone: tuple[int, ...] = ()  # no such process under the proc root
    skipped: tuple[int, ...] = ()  # not looked at: the scan's budget ran out first (read first next time)
    errors: tuple[tuple[int, str], ...] = ()  # (pid, why): its fd table could not be listed (EACCES, EMFILE)


@dataclass(frozen=True, slots=True)
class _Listing:
    """Where the sweep of one process's fd table stands: the DRM fds found so far, and how far it has come."""

    fds: tuple[str, ...]  # the DRM fds' names, found by this sweep or kept from the last while they still are DRM
    fd_count: int  # the fd directory's size when the last complete sweep ended (its number of fds on Linux 6.2+)
    at: float  # when the last complete sweep ended
    after: int | None = None  # a sweep under way: the last fd number it looked at (None: the sweep is complete)


class DrmFdReader(Generic[_T]):
    """Reads the DRM fds of given processes under `<proc_root>`, bounded by `limits`.

    Stateful in its order (the PIDs a scan did not reach come first in the next, so a budget that runs out at the
    same place every time still reaches every process in turn) and in what each process's last full listing found
    (`FdScanLimits.relist_s`). One thread at a time.
    """

    def __init__(
        self,
        parse: Callable[[bytes], _T],
        proc_root: str = "/proc",
        limits: FdScanLimits | None = None,
        clock: Clock = SYSTEM_CLOCK,
        dri_prefix: str = DRI_PREFIX,
    ) -> None:
        self._parse = parse
        self._proc_root = proc_root
        self._limits = limits or FdScanLimits()
        self._clock = clock
        self._dri_prefix = dri_prefix  # tests stand a directory of plain files in for /dev/dri
        self._behind: tuple[int, ...] = ()
        self._listings: dict[int, _Listing] = {}

    def read(self, pids: Iterable[int]) -> DrmFdScan[_T]:
        """The DRM fds of each of `pids` (the pod cgroups' members: never the whole node)."""
        order = scan_order(pids, self._behind)
        wanted = set(order)
        for left in [p for p in self._listings if p not in wanted]:
            del self._listings[left]
        budget = ScanBudget(self._limits, self._clock)
        processes: list[ProcessDrmFds[_T]] = []
        gone: list[int] = []
        errors: list[tuple[int, str]] = []
        for at, pid in enumerate(order):
            if budget.spent():
                self._behind = order[at:]
                return DrmFdScan(tuple(processes), tuple(gone), order[at:], tuple(errors))
            try:
                found = self._read_process(pid, budget)
            except OSError as e:
                errors.append((pid, e.strerror or repr(e)))
                continue
            if found is None:
                gone.append(pid)
            else:
                processes.append(found)
        self._behind = ()
        return DrmFdScan(tuple(processes), tuple(gone), (), tuple(errors))

    def _read_process(self, pid: int, budget: ScanBudget) -> ProcessDrmFds[_T] | None:
        """None when the process is gone; raises OSError when its fd table cannot be listed for another reason.

        Its DRM fds alone while its last complete sweep holds (its fd count the same, younger than `relist_s`);
        else the DRM fds it had (those still DRM), and the sweep of its fd table goes on from where it stopped: an
        fd table longer than the bounds is swept over several reads, a bound's worth each, so a DRM fd put behind
        100,000 others is found within 25 reads, not never, and kept from then on."""
        fd_dir = f"{self._proc_root}/{pid}/fd"
        try:
            fd_count = os.stat(fd_dir).st_size
        except OSError as e:
            if is_gone_error(e):
                self._listings.pop(pid, None)
                return None
            raise
        listing = self._listings.get(pid)
        now = self._clock.now()
        kept: list[DrmFd[_T]] = []
        if listing is not None:
            for _ in listing.fds:
                budget.spend_fd()
            again = [self._read_fd(pid, name, budget) for name in listing.fds]
            kept = [f for f in again if f is not None]
            fresh = listing.after is None and listing.fd_count == fd_count and now - listing.at < self._limits.relist_s
            if fresh and len(kept) == len(again):
                return ProcessDrmFds(pid=pid, fds=tuple(kept))
        after = listing.after if listing is not None and listing.after is not None else -1
        swept = self._sweep(pid, fd_dir, after, budget, len(kept))
        if swept is None:
            self._listings.pop(pid, None)
            return None
        found, reached = swept
        fds = {f.fd: f for f in (*kept, *found)}  # an fd found by both once
        names = tuple(str(fd) for fd in sorted(fds))
        if reached is None:
            self._listings[pid] = _Listing(names, fd_count, now)
        else:
            at = listing.at if listing is not None else now
            self._listings[pid] = _Listing(names, listing.fd_count if listing is not None else -1, at, reached)
        return ProcessDrmFds(pid=pid, fds=tuple(fds[fd] for fd in sorted(fds)), complete=reached is None)

    def _sweep(
        self, pid: int, fd_dir: str, after: int, budget: ScanBudget, held: int
    ) -> tuple[list[DrmFd[_T]], int | None] | None:
        """The DRM fds among the process's fds numbered above `after`, within the bounds (`held` DRM fds are
        counted already), and the last fd number looked at when a bound stopped the sweep (None: it reached the
        end). None when the process is gone.

        /proc lists a process's fds in ascending order and seeks by fd number (position fd + 2), so the sweep
        starts where it stopped without reading the fds before; a directory that lists them in another order (a
        stand-in tree) is swept from its start every time."""
        limits = self._limits
        fds: list[DrmFd[_T]] = []
        looked = 0
        last = after
        ordered = True
        try:
            directory = os.open(fd_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            if is_gone_error(e):
                return None
            raise
        try:
            if after >= 0:
                os.lseek(directory, after + 3, os.SEEK_SET)
            # scandir reads the directory lazily, a buffer at a time: leaving the loop leaves the rest unlisted.
            with os.scandir(directory) as entries:
                for entry in entries:
                    if not entry.name.isdigit():
                        continue
                    number = int(entry.name)
                    ordered = ordered and number > last  # else not /proc's order: the next sweep starts over
                    if (
                        looked >= limits.fds_per_process
                        or held + len(fds) >= limits.drm_fds_per_process
                        or budget.spent()
                    ):
                        return fds, last if ordered else -1
                    looked += 1
                    budget.spend_fd()
                    found = self._read_fd(pid, entry.name, budget)
                    if found is not None:
                        fds.append(found)
                    last = max(last, number)
        except OSError as e:
            if is_gone_error(e):
                return None
            raise
        finally:
            os.close(directory)
        return fds, None

    def _read_fd(self, pid: int, name: str, budget: ScanBudget) -> DrmFd[_T] | None:
        """The fd `name` of `pid` when it is a DRM file whose fdinfo could be read; None otherwise (closed since
        it was listed, not DRM). An fd that vanishes mid-read is skipped, not an error: fds come and go."""
        if not name.isdigit():
            return None
        link = f"{self._proc_root}/{pid}/fd/{name}"
        try:
            target = os.readlink(link)
        except OSError:
            return None
        verdict = drm_candidate(target, self._dri_prefix)
        if verdict is False:
            return None
        minor = _drm_minor(link)
        if verdict is None and minor is None:
            return None  # a path that looked like a node but is not a DRM character device
        try:
            data = read_head(f"{self._proc_root}/{pid}/fdinfo/{name}", self._limits.fdinfo_bytes)
        except OSError:
            return None
        if data is None:
            return None
        budget.spend_bytes(len(data))
        return DrmFd(
            fd=int(name),
            target=target,
            minor=minor,
            fdinfo=self._parse(data),
            truncated=len(data) >= self._limits.fdinfo_bytes,
        )


def _drm_minor(link: str) -> int | None:
    """The minor of the DRM character device the fd `link` has open; None when it is not one or cannot be
    stat'd. The stat follows the open file, not its path, so it is right whatever the container calls it."""
    try:
        st = os.stat(link)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode) or os.major(st.st_rdev) != DRM_MAJOR:
        return None
    return os.minor(st.st_rdev)


def scan_order(pids: Iterable[int], behind: tuple[int, ...]) -> tuple[int, ...]:
    """`pids` in the order a scan reads them: those the previous scan did not reach (`behind`) first, in their
    order, then the rest in the order given; each once."""
    wanted = dict.fromkeys(pids)
    first = tuple(p for p in behind if p in wanted)
    seen = set(first)
    return first + tuple(p for p in wanted if p not in seen)
