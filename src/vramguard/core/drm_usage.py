"""What a DRM GPU's fdinfo tells: one open DRM file's driver, PCI device, client and memory per region
(`parse_fdinfo`), and the memory each process holds on each GPU once clients are counted once (`usage_by_process`).

Every DRM driver that follows the kernel's `Documentation/gpu/drm-usage-stats.rst` (amdgpu, xe, i915, ...) prints
these in `/proc/<pid>/fdinfo/<fd>`. The format is `key: value`, one pair a line, split on the first colon, any
whitespace after it; memory values are bytes, or a number with ` KiB` or ` MiB` (`drm_fdinfo_print_size` picks the
largest of the three that divides the value). Lines that are not standard keys (`pos:`, `flags:`, amdgpu's `pasid:`,
`amd-*`, engine times) are skipped.

amdgpu prints three forms, all read here: after 6.12 (7.2 has it), `drm-total-<r>`, `drm-resident-<r>` and
friends, with the legacy `drm-memory-<r>` (resident, truncated to KiB) after them; 6.12, `drm-memory-<r>` and
`drm-shared-<r>` only, in KiB; 6.1 and the ROCm DKMS driver, its own `drm-pdev`/`drm-client-id` header (the id is the
VM's fence context, also one per open file) and `drm-memory-<r>` in KiB. So a region's resident bytes are
`drm-resident-<r>`, exact, and `drm-memory-<r>` only where that is missing. ROCm's allocations (KFD) are in the VM
of the render-node fd the runtime hands to KFD, so they show there once mapped to the GPU.

The text is bounded before it is read (`MAX_FDINFO_BYTES`, `MAX_FDINFO_LINES`, `MAX_REGIONS`): the node reads at most
`MAX_FDINFO_BYTES` of a file, and a longer text, from a stand-in tree or a driver printing far more than any does
today, costs no more than that; what was left unread is marked `truncated`. No I/O, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, NamedTuple

# The longest honest fdinfo is amdgpu's: ~60 lines, ~1.6 KiB (8 regions of 4 keys, the legacy and amd- keys, 8
# engines); xe's and i915's are shorter. 16 KiB is ten times that, and bounds the read, the decode and the split.
MAX_FDINFO_BYTES: Final = 16 * 1024
MAX_FDINFO_LINES: Final = 512  # ~8 times amdgpu's count; a 16 KiB text of empty lines stops here
# amdgpu has 8 regions, xe 5, i915 one per memory type and instance; the rest of a text with more is not read.
MAX_REGIONS: Final = 32
MAX_NAME_CHARS: Final = 64  # a driver or region name (drm_driver.name is a short C identifier)
MAX_BYTES: Final = 2**63 - 1  # as `core.quantity`: a larger value is no memory any GPU has

# The regions that are the GPU's own memory, which a VRAM quota counts: amdgpu's `vram`, xe's `vram0`/`vram1`,
# i915's `local0` (its `stolen-local0` is not; intel_memory_region.c names regions by type and instance).
_DEVICE_REGION = re.compile(r"vram[0-9]*|local[0-9]+")

_UNIT_BYTES: Final[Mapping[str, int]] = MappingProxyType({"": 1, "KiB": 1024, "MiB": 1024**2})
_CLIENT_ID = re.compile(r"[0-9]{1,20}")
# `%04x:%02x:%02x.%d` of domain, bus, slot and function; a domain can pass 16 bits (VMD's start at 0x10000).
_PDEV = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
# Printable ASCII without blanks, as the kernel's keys and names are.
_NAME = re.compile(rf"[!-~]{{1,{MAX_NAME_CHARS}}}")

_MEMORY_STATS: Final = ("total", "shared", "resident", "memory")
_MEMORY_KEY = re.compile(r"drm-(?:total|shared|resident|memory)-")
# One memory line: the key (a region name is printable ASCII without blanks or a colon), any blanks after the colon
# (a tab, and the stray space amdgpu prints before it: `drm-memory-gtt: \t0 KiB`), and the size: a u64 has at most
# 20 digits (the bound keeps int() off a 16 KiB run of them), and the unit follows one space in the kernel's output
# (a tab is tolerated too). No other unit: the document allows none, so `1 GiB` is a bad line, not 1 byte.
_MEMORY_LINE = re.compile(
    rf"drm-(total|shared|resident|memory)-([!-9;-~]{{1,{MAX_NAME_CHARS}}}):\s*([0-9]{{1,20}})(?:[ \t]+(KiB|MiB))?\s*"
)
# `drm-total-cycles-<engine>` is an engine's cycle count, not a region named `cycles-<engine>`.
_TOTAL_CYCLES: Final = "drm-total-cycles-"


@dataclass(frozen=True, slots=True)
class RegionMemory:
    """One memory region's counters in one fdinfo, in bytes; None where the driver does not print that counter."""

    resident_bytes: int | None = None  # backed now: `drm-resident-<r>`, else the legacy `drm-memory-<r>`
    total_bytes: int | None = None  # all buffers asked for, backed or not: `drm-total-<r>`
    shared_bytes: int | None = None  # buffers with a handle in another client too: `drm-shared-<r>`


@dataclass(frozen=True, slots=True)
class DrmFdinfo:
    """What one DRM file's fdinfo says. `driver` None: no `drm-driver` line, so no DRM stats (not a DRM file, a
    device unplugged, or amdgpu 6.1 interrupted while it locked the VM): nothing to count."""

    driver: str | None = None
    pdev: str | None = None  # the PCI slot, `0000:c1:00.0`; None on a GPU that is not a PCI device
    client_id: int | None = None  # one per open of the device: fds that share it share one file
    regions: Mapping[str, RegionMemory] = field(default_factory=lambda: MappingProxyType({}))
    truncated: bool = False  # a bound was hit: the rest of the text was not read, so regions may be missing
    bad_lines: int = 0  # lines not `key: value`, or a standard key with a value that does not parse (ignored)

    @property
    def device_resident_bytes(self) -> int | None:
        """What a VRAM quota counts (`device_resident_bytes`)."""
        return device_resident_bytes(self.regions)


def device_resident_bytes(regions: Mapping[str, RegionMemory]) -> int | None:
    """Resident bytes in the GPU's own memory (`vram`, `vramN`, `localN`); None where no such region prints them
    (a GPU that has no memory of its own, or a driver that prints no resident counter)."""
    found = [
        m.resident_bytes for r, m in regions.items() if _DEVICE_REGION.fullmatch(r) and m.resident_bytes is not None
    ]
    return sum(found) if found else None


def _bounded_lines(text: str | bytes) -> tuple[list[str], bool]:
    """The complete lines within the bounds, and whether anything was left unread. A line cut by the byte bound is
    dropped rather than read: `1572868 KiB` cut to `15728` would be a wrong value, not a missing one."""
    truncated = len(text) > MAX_FDINFO_BYTES
    if isinstance(text, bytes):
        head = text[:MAX_FDINFO_BYTES]
        if truncated:
            head = head[: head.rfind(b"\n") + 1]
        # The kernel prints ASCII; a byte that is not can only make a line unreadable, never a value.
        decoded = head.decode("ascii", errors="replace")
    else:
        decoded = text[:MAX_FDINFO_BYTES]
        if truncated:
            decoded = decoded[: decoded.rfind("\n") + 1]
    lines = decoded.split("\n", MAX_FDINFO_LINES)
    if len(lines) > MAX_FDINFO_LINES:
        truncated = truncated or lines[MAX_FDINFO_LINES].strip() != ""
        del lines[MAX_FDINFO_LINES:]
    return lines, truncated


def parse_fdinfo(text: str | bytes) -> DrmFdinfo:
    """One fdinfo text → its `DrmFdinfo`. A repeated key keeps its first value (the kernel prints each once, the
    header first; `drm-client-name`, the one value a process sets, is printable ASCII without blanks, so it cannot
    add a line)."""
    lines, truncated = _bounded_lines(text)
    header: dict[str, str] = {}
    stats: dict[str, dict[str, int]] = {stat: {} for stat in _MEMORY_STATS}
    regions: set[str] = set()
    bad = 0
    for line in lines:
        if not line.startswith("drm-"):  # the VFS's lines, amdgpu's `pasid:`, driver keys such as `amd-*`
            bad += ":" not in line and line.strip() != ""
            continue
        if line.startswith(_TOTAL_CYCLES):
            continue
        memory = _MEMORY_LINE.fullmatch(line)  # most of the lines, read in one match
        if memory is None:
            key, _, value = line.partition(":")
            if key in ("drm-driver", "drm-pdev", "drm-client-id"):
                header.setdefault(key, value.strip())
            elif _MEMORY_KEY.match(key):
                bad += 1  # a memory key whose value or region name does not parse
            continue  # else another standard key (engines, cycles, active, purgeable, the client's name)
        stat, region, digits, unit = memory.groups()
        size = int(digits) * _UNIT_BYTES[unit or ""]
        if size > MAX_BYTES:
            bad += 1
            continue
        if region not in regions:
            if len(regions) == MAX_REGIONS:
                truncated = True
                continue
            regions.add(region)
        stats[stat].setdefault(region, size)

    driver = header.get("drm-driver", "")
    pdev = header.get("drm-pdev", "")
    client = header.get("drm-client-id", "")
    bad += sum(
        1
        for value, pattern in ((driver, _NAME), (pdev, _PDEV), (client, _CLIENT_ID))
        if value and pattern.fullmatch(value) is None
    )
    resident, legacy = stats["resident"], stats["memory"]
    return DrmFdinfo(
        driver=driver if _NAME.fullmatch(driver) else None,
        pdev=pdev if _PDEV.fullmatch(pdev) else None,
        client_id=int(client) if _CLIENT_ID.fullmatch(client) and int(client) < 2**64 else None,
        regions=MappingProxyType(
            {
                region: RegionMemory(
                    # the kernel document calls drm-memory- an alias of drm-resident-; amdgpu prints it truncated to
                    # KiB, so the exact one wins where both are printed
                    resident_bytes=resident.get(region, legacy.get(region)),
                    total_bytes=stats["total"].get(region),
                    shared_bytes=stats["shared"].get(region),
                )
                for region in sorted(regions)
            }
        ),
        truncated=truncated,
        bad_lines=bad,
    )


class FdReading(NamedTuple):
    """One DRM fd of one process, as the node read it."""

    pid: int
    fd: int
    fdinfo: DrmFdinfo


@dataclass(frozen=True, slots=True)
class DrmProcessUsage:
    """The memory one process holds on one GPU: each client it is charged for, counted once."""

    pid: int
    pdev: str
    driver: str
    regions: Mapping[str, RegionMemory]  # the clients' counters summed per region (None where none printed it)
    client_ids: tuple[int, ...]  # the clients charged here, sorted (empty for fds that print no client id)
    shared_with: tuple[int, ...] = ()  # other PIDs holding one of those clients, not charged for it, sorted
    truncated: bool = False  # one of its fdinfo texts was cut at a bound: the counts may be short

    @property
    def device_resident_bytes(self) -> int | None:
        """What a VRAM quota counts (`device_resident_bytes`)."""
        return device_resident_bytes(self.regions)


@dataclass(frozen=True, slots=True)
class DrmUsage:
    """Every process's memory per GPU from one scan's fdinfo readings, and what could not be charged."""

    processes: tuple[DrmProcessUsage, ...] = ()  # sorted by (pid, pdev)
    without_pdev: int = 0  # DRM fds with no `drm-pdev` (a GPU that is not a PCI device): no GPU to charge


def _add(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else a + b


def _summed(readings: Iterable[DrmFdinfo]) -> Mapping[str, RegionMemory]:
    summed: dict[str, RegionMemory] = {}
    for info in readings:
        for region, m in info.regions.items():
            s = summed.get(region, RegionMemory())
            summed[region] = RegionMemory(
                _add(s.resident_bytes, m.resident_bytes),
                _add(s.total_bytes, m.total_bytes),
                _add(s.shared_bytes, m.shared_bytes),
            )
    return MappingProxyType(dict(sorted(summed.items())))


def usage_by_process(readings: Iterable[FdReading]) -> DrmUsage:
    """Each process's memory per GPU (pdev), with every client counted once.

    A client (`drm-client-id`, on one `drm-pdev`) is one open of the device, and its counters are that file's, so
    the fds that share the file (dup, fork, SCM_RIGHTS) print the same bytes: they count once, in one fd of one
    process. Where several processes hold it, the lowest PID is charged and the others list it in `shared_with`:
    the choice does not depend on the order /proc is read in, stays put from scan to scan while the holders live,
    and is usually the process that opened the device (a child's PID follows its parent's unless PIDs wrapped).
    Of two readings of one client (its fds read a moment apart) the larger is kept, so the order does not matter.

    fds that print no client id cannot be told apart from dups of one file: a process's are counted as one (its
    largest), since counting each could charge a process several times for one buffer and kill it for that.
    Buffers shared between clients (a dma-buf imported by another process) are in each client's counters, as the
    kernel prints them; `shared_bytes` says how much that is. The work is linear in the readings, which the node
    bounds per process.
    """
    # The document lets a driver number its clients per device (with `drm-pdev` printed) or globally; the code
    # (drm_file.c, one static counter) numbers them globally, and amdgpu before 6.2 prints its VM's fence context
    # instead. Keyed by (pdev, id), a client is one client under all three.
    clients: dict[tuple[str, int], list[FdReading]] = {}
    anonymous: dict[tuple[int, str], FdReading] = {}
    without_pdev = 0
    for reading in readings:
        info = reading.fdinfo
        if info.driver is None:
            continue
        if info.pdev is None:
            without_pdev += 1
        elif info.client_id is None:
            key = (reading.pid, info.pdev)
            held = anonymous.get(key)
            if held is None or _weight(reading) > _weight(held):
                anonymous[key] = reading
        else:
            clients.setdefault((info.pdev, info.client_id), []).append(reading)

    charged: dict[tuple[int, str], list[tuple[int | None, DrmFdinfo]]] = {}
    sharers: dict[tuple[int, str], set[int]] = {}
    for (pdev, client_id), held_by in clients.items():
        owner = min(r.pid for r in held_by)
        best = max(held_by, key=_weight)
        charged.setdefault((owner, pdev), []).append((client_id, best.fdinfo))
        sharers.setdefault((owner, pdev), set()).update(r.pid for r in held_by if r.pid != owner)
    for (pid, pdev), reading in anonymous.items():
        charged.setdefault((pid, pdev), []).append((None, reading.fdinfo))

    return DrmUsage(
        processes=tuple(
            DrmProcessUsage(
                pid=pid,
                pdev=pdev,
                driver=min(info.driver or "" for _, info in held),
                regions=_summed(info for _, info in held),
                client_ids=tuple(sorted(c for c, _ in held if c is not None)),
                shared_with=tuple(sorted(sharers.get((pid, pdev), ()))),
                truncated=any(info.truncated for _, info in held),
            )
            for (pid, pdev), held in sorted(charged.items())
        ),
        without_pdev=without_pdev,
    )


def _weight(reading: FdReading) -> tuple[int, int, int, int]:
    """Which of two readings of one client to keep: the larger device memory, then the larger sum over regions,
    then the lower (pid, fd), so that no tie depends on the order of the readings."""
    info = reading.fdinfo
    return (
        info.device_resident_bytes or 0,
        sum((m.resident_bytes or 0) + (m.total_bytes or 0) for m in info.regions.values()),
        -reading.pid,
        -reading.fd,
    )
