"""`MemoryLimiter` over the kernel's dmem cgroup controller: per-cgroup GPU memory limits for DRM GPUs (Linux 6.14+,
`CONFIG_CGROUP_DMEM`), held in `<cgroup>/dmem.max` instead of a driver's own table.

Sources: `kernel/cgroup/dmem.c` and `drivers/gpu/drm/ttm/ttm_resource.c` of Linux 7.2.13; where
`Documentation/admin-guide/cgroup-v2.rst` says otherwise, this module follows the code (noted below).

Which GPUs have a region. A driver registers one region per memory pool, named ``drm/<pci-slot>/<name>``
(`drm_drv.c`: ``dev->unique`` is the PCI slot, the name `drm.discover` reads): xe registers ``vram0`` (and
``vram1`` on a two-tile GPU) since 6.14; amdgpu registers ``vram`` (no digit), which missed 6.14 and is in 7.2 (the
first release is not confirmed); i915, nouveau and the others register none. The kernel lists every region in
``<root>/dmem.capacity`` (root only) and in each cgroup's ``dmem.max``/``dmem.current``, one ``<region> <bytes>``
line each, ``max`` for no limit. ``dmem.current`` exists on the root too, though the doc says it does not.

A limit covers every ``drm/<slot>/vram*`` region of the GPU, each with the whole hard limit. A one-tile GPU (all
amdgpu ones, xe's discrete cards) has one region, so the limit is exact. A two-tile xe GPU has two counters and a
quota is one number: halving it would fail allocations the quota allows on one tile, and limiting ``vram0`` alone
would leave the second tile open. Each tile is therefore held to the quota, so the cgroup can hold up to twice it
across both, and the agent's own reactive enforcement (which sums the regions) catches the rest. `get` reports
the loosest region's limit and the usage summed over the regions.

What a limit does (`ttm_resource.c` `ttm_resource_alloc`): a buffer is charged when it is placed, to the dmem
cgroup of the task allocating it then (`dmem.c` `get_current_dmemcs`). The charge stays with that cgroup until the
buffer is freed: moving a task to another cgroup does not move what it holds. A charge over ``dmem.max`` fails
(-EAGAIN, which TTM turns into -ENOSPC). TTM then tries the buffer's next allowed placement: graphics buffers may
go to GTT and so spill to system memory (amdgpu retries a VRAM-only GEM_CREATE as VRAM|GTT). Only after that does
it evict, and only the limited cgroup's own buffers (or those below it). KFD's (ROCm's) buffers are VRAM-only, so
once the cgroup's own evictable VRAM is gone the allocation fails: `hipMalloc` returns an error in the offender
alone.

The trap: in Linux 7.2, a ``dmem.max`` below what the cgroup already holds is silently ignored.
`set_resource_max` drops the -EBUSY of `page_counter_set_max`, so the write succeeds and the old limit stays. The
doc says the controller follows the memory controller, which reclaims; the code does not. `set` therefore reads
``dmem.max`` back after every write and fails when the kernel kept the old value. A limit holds from the start
only if it is written before the cgroup's first allocation, as the limiter does for new cgroups.

Enabling: a cgroup has ``dmem.*`` files only where its parent lists ``dmem`` in ``cgroup.subtree_control``. runc
enables every controller down to the pod, but systemd-managed slices may lack it, so `set` enables it down from
the v2 root first, as runc does.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping

from vramguard.core.ports import LIMIT_MAX, DriverLimit, LimitFailed, LimitsUnavailable
from vramguard.core.text import format_bytes
from vramguard.node.procfs import read_head

# dmem.capacity, dmem.max and dmem.current hold one line per region of every GPU (about 45 bytes each): 16 KiB
# holds over 300 regions, where a page might not on a large node.
_MAX_READ_BYTES = 16 * 1024
# The lowest PAGE_COUNTER_MAX of 64-bit kernels (64 KiB pages): a dmem.max at or above it reads back as "max".
_SHOWN_AS_MAX_FROM = (2**63 - 1) // (64 * 1024)
_VRAM = re.compile(r"vram[0-9]*")

NO_CONTROLLER = (
    "the kernel has no dmem cgroup controller (Linux 6.14+ with CONFIG_CGROUP_DMEM): nothing can stop a GPU "
    "allocation over its quota, so vramguard enforces quotas reactively, killing or evicting once a container is over"
)

Writer = Callable[[str, str], None]
"""Writes text to a cgroup file (path, text) in one write, raising OSError: `write_cgroup_file`, or in tests a fake
kernel."""


class DmemMemoryLimiter:
    """Holds the limiter's hard limits in ``dmem.max`` of the cgroup v2 hierarchy at `v2_root` (as this process sees
    it: ``/sys/fs/cgroup``, or ``/host/sys/fs/cgroup`` under --host-root). `slot_of` maps the limiter's GPU index
    to that GPU's PCI slot (the DRM backend's numbering), None where the index is no DRM GPU. `write`: how a
    cgroup file is written (`write_cgroup_file`).

    Soft limits are not held: the kernel has none (``dmem.low`` and ``dmem.min`` protect against eviction, which is
    another thing), and the agent never sets one. `get` therefore always reports soft 0, the agent's own mark
    (`driver_limit.LimitSetter`). Only the limiter's worker calls it; it blocks on the file system."""

    def __init__(self, v2_root: str, slot_of: Callable[[int], str | None], *, write: Writer | None = None) -> None:
        self.v2_root = os.path.abspath(v2_root)
        self._slot_of = slot_of
        self._write = write if write is not None else write_cgroup_file
        self._has_controller = False  # once seen, kept: a controller is never taken out of a running kernel

    def get(self, gpu_index: int, cgroup: str) -> DriverLimit | None:
        """The hard limit on the GPU's regions, with their usage; None at the root (which holds no limits), where
        the controller is not enabled for the cgroup, or where every region is ``max``."""
        regions, path = self._resolve(gpu_index, cgroup)
        if path == self.v2_root:
            return None
        _need_dir(path)
        held = self._read(os.path.join(path, "dmem.max"))
        if held is None:
            return None
        limits = [held.get(r) for r in regions]
        if all(limit is None for limit in limits):
            return None
        hard = LIMIT_MAX if None in limits else max(limit for limit in limits if limit is not None)
        return DriverLimit(soft_bytes=0, hard_bytes=hard, used_bytes=self._used(path, regions))

    def set(self, gpu_index: int, cgroup: str, soft_bytes: int, hard_bytes: int) -> None:
        """Write `hard_bytes` (``max`` for `LIMIT_MAX`) to each of the GPU's regions in ``<cgroup>/dmem.max``,
        enabling the controller down to the cgroup first, and read it back. `soft_bytes` is ignored (see the
        class). Raises `LimitFailed` where the kernel kept the old limit."""
        regions, path = self._resolve(gpu_index, cgroup)
        if path == self.v2_root:
            raise LimitFailed(f"{path} is the cgroup v2 root, which holds no dmem.max")
        _need_dir(path)
        max_file = os.path.join(path, "dmem.max")
        if hard_bytes == LIMIT_MAX and not os.path.exists(max_file):
            return  # the controller is off for this cgroup: it holds no limit to clear
        self._enable_down_to(path)
        self._write_file(max_file, dmem_max_text(regions, hard_bytes))
        held = self._read(max_file) or {}
        for region in regions:
            found = held.get(region)
            if not _reads_as(found, hard_bytes):
                raise self._kept(path, region, found, hard_bytes)

    def _resolve(self, gpu_index: int, cgroup: str) -> tuple[tuple[str, ...], str]:
        """The GPU's regions and the cgroup's normalised path, or why there are none."""
        self._check_controller()
        slot = self._slot_of(gpu_index)
        if slot is None:
            raise LimitsUnavailable(
                f"GPU {gpu_index} is not a DRM GPU with a known PCI slot: dmem cannot limit it", whole_driver=False
            )
        if not within_root(self.v2_root, cgroup):
            raise LimitFailed(f"{cgroup} is not a cgroup under {self.v2_root}: refused")
        capacity = self._read(os.path.join(self.v2_root, "dmem.capacity")) or {}
        regions = gpu_regions(capacity, slot)
        if not regions:
            raise LimitsUnavailable(
                f"the {slot} driver registers no dmem region (xe registers vram0 from Linux 6.14; amdgpu registers "
                "vram in later releases, 7.2 at the latest; i915 and nouveau none), so the kernel cannot limit its "
                "memory",
                whole_driver=False,
            )
        return regions, os.path.normpath(cgroup)

    def _check_controller(self) -> None:
        if self._has_controller:
            return
        listed = self._read_text(os.path.join(self.v2_root, "cgroup.controllers"))
        if listed is None or "dmem" not in listed.split():
            raise LimitsUnavailable(
                f"{NO_CONTROLLER} ({self.v2_root}/cgroup.controllers has no dmem)", whole_driver=True
            )
        self._has_controller = True

    def _enable_down_to(self, path: str) -> None:
        """Add dmem to ``cgroup.subtree_control`` of each cgroup from the v2 root down to `path`'s parent that
        lacks it: a controller can be enabled in a cgroup only where its parent has it, so top down."""
        parts = os.path.relpath(path, self.v2_root).split(os.sep)
        for depth in range(len(parts)):
            ancestor = os.path.join(self.v2_root, *parts[:depth])
            control = os.path.join(ancestor, "cgroup.subtree_control")
            enabled = self._read_text(control)
            if enabled is None or "dmem" not in enabled.split():
                self._write_file(control, "+dmem")

    def _used(self, path: str, regions: tuple[str, ...]) -> int:
        current = self._read(os.path.join(path, "dmem.current")) or {}
        return sum(current.get(r) or 0 for r in regions)

    def _kept(self, path: str, region: str, found: int | None, hard_bytes: int) -> LimitFailed:
        """The error for a write the kernel did not take: the trap where the cgroup holds more than the limit."""
        shown = "max" if found is None else str(found)
        used = (self._read(os.path.join(path, "dmem.current")) or {}).get(region) or 0
        if hard_bytes != LIMIT_MAX and used > hard_bytes:
            return LimitFailed(
                f"the kernel kept the old limit ({shown}) on {region} for {path}: the cgroup already holds "
                f"{format_bytes(used)} there (dmem.current), more than the {format_bytes(hard_bytes)} written, and "
                "Linux ignores a dmem.max below the usage"
            )
        return LimitFailed(f"{path}/dmem.max reads {shown} for {region} after {_value(hard_bytes)} was written")

    def _read(self, path: str) -> dict[str, int | None] | None:
        text = self._read_text(path)
        return None if text is None else parse_dmem(text)

    def _read_text(self, path: str) -> str | None:
        try:
            return read_cgroup_text(path)
        except OSError as e:
            raise LimitFailed(f"reading {path}: {e.strerror}") from None

    def _write_file(self, path: str, text: str) -> None:
        try:
            self._write(path, text)
        except OSError as e:
            raise LimitFailed(f"writing {text.strip()!r} to {path}: {e.strerror}") from None


def read_cgroup_text(path: str) -> str | None:
    """A kernel-written cgroup file, bounded, without a line the bound cut; None when it does not exist. Raises
    OSError for any other failure."""
    data = read_head(path, _MAX_READ_BYTES)
    if data is None:
        return None
    if len(data) == _MAX_READ_BYTES:
        data = data[: data.rfind(b"\n") + 1]
    return data.decode("ascii", "replace")


def read_dmem(path: str) -> dict[str, int | None]:
    """A dmem file's regions (`parse_dmem`), read as `read_cgroup_text` reads; empty where it is absent or cannot
    be read (no controller: the caller reads nothing of it)."""
    try:
        text = read_cgroup_text(path)
    except OSError:
        return {}
    return parse_dmem(text) if text is not None else {}


def write_cgroup_file(path: str, text: str) -> None:
    """Write `text` to an existing cgroup file in one write() (the kernel parses each write on its own); never
    creates one."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)


def parse_dmem(text: str) -> dict[str, int | None]:
    """A dmem file's ``<region> <value>`` lines as region → bytes, None for ``max``; lines that do not parse are
    left out."""
    parsed: dict[str, int | None] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 2:
            continue
        region, value = fields
        if value == "max":
            parsed[region] = None
        elif value.isascii() and value.isdigit():
            parsed[region] = int(value)
    return parsed


def gpu_regions(capacity: Mapping[str, int | None], slot: str) -> tuple[str, ...]:
    """The VRAM regions of the GPU at PCI `slot` among those ``dmem.capacity`` lists (amdgpu's ``vram``, xe's
    ``vram0`` and ``vram1``), sorted; none for a GPU whose driver registers none."""
    prefix = f"drm/{slot}/"
    return tuple(
        sorted(r for r in capacity if r.startswith(prefix) and _VRAM.fullmatch(r.removeprefix(prefix)) is not None)
    )


def dmem_max_text(regions: tuple[str, ...], hard_bytes: int) -> str:
    """What `set` writes to ``dmem.max``: one line per region, ``max`` for `LIMIT_MAX`."""
    return "".join(f"{r} {_value(hard_bytes)}\n" for r in regions)


def within_root(root: str, path: str) -> bool:
    """Whether `path` is the cgroup v2 root or a cgroup below it, named without ``..`` (the limiter writes only
    there)."""
    if not os.path.isabs(path) or ".." in path.split("/"):
        return False
    root = os.path.normpath(root)
    return os.path.commonpath([root, os.path.normpath(path)]) == root


def _value(hard_bytes: int) -> str:
    return "max" if hard_bytes == LIMIT_MAX else str(hard_bytes)


def _reads_as(found: int | None, hard_bytes: int) -> bool:
    """Whether ``dmem.max`` read back as `found` holds `hard_bytes`."""
    if found is None:
        return hard_bytes == LIMIT_MAX or hard_bytes >= _SHOWN_AS_MAX_FROM
    return found == hard_bytes


def _need_dir(path: str) -> None:
    if not os.path.isdir(path):
        raise LimitFailed(f"no cgroup at {path}")
