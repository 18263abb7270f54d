"""The DRM sampler: the GPUs a DRM driver with memory stats drives (AMD Instinct and Radeon on amdgpu, Intel on xe
and i915), their memory, and what each pod process holds on them, read from the kernel alone: no vendor library.

`DrmSampler.sample()` returns the same `GpuSample` as NVML's sampler, so attribution, quotas, decisions, kills,
Events, metrics, `top`, orphans and recommend are the same for both; a GPU is named by its PCI slot (its `label`),
and identified by its `unique_id` where it has one (else the slot too).

- **The GPUs** come from `<sys-root>/class/drm` (`drm.discover`), found once at `start`: those bound to a driver
  in `MEMORY_STATS_DRIVERS` whose VRAM size is known: amdgpu's `mem_info_vram_total`, or the size of its
  regions in the dmem controller's `dmem.capacity` (xe's `vram0` and `vram1`). NVIDIA's GPUs (nvidia-drm
  prints no memory stats) stay NVML's. Their used memory is re-read on every sample and every watch tick:
  amdgpu's `mem_info_vram_used` (one small sysfs read), else the regions' `dmem.current` at the cgroup root.
- **The processes** are the members of the kubelet's pod cgroups (`cgroup.pod_members`), never every process on
  the node; for each, the fds whose link names a DRM node, and their fdinfo (`drm.DrmFdReader`, bounded per
  process and per scan: the fd table is tenant input), parsed by `drm_usage.parse_fdinfo`; each client counted
  once (`drm_usage.usage_by_process`). A process's usage is the resident bytes in the GPU's own memory regions
  (`drm-resident-vram`, amdgpu's legacy `drm-memory-vram` where that is missing). ROCm's allocations (KFD) are
  in the VM of the render-node fd the runtime hands to KFD, so they count there once mapped (`drm_usage`).

A process outside any pod cgroup is not read: its memory is in the GPU's used bytes, not attributed to anyone, as
NVML's host processes are. A process that exited holds nothing here: the kernel frees a DRM file's buffers when the
last reference to it closes (so `GpuSample.exited` stays empty).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

import structlog

from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.core.drm_usage import DrmFdinfo, FdReading, parse_fdinfo, usage_by_process
from vramguard.core.sample import DRM_INDEX_BASE, GpuBackend, GpuDevice, GpuMemory, GpuProcess, GpuSample
from vramguard.node.cgroup import HOST_KUBELET, KubeletTree, pod_members, v2_root
from vramguard.node.dmem import gpu_regions, read_dmem
from vramguard.node.drm import DrmFdReader, DrmGpu, FdScanLimits, discover, parse_int, read_attr

# The drivers that print per-client memory in fdinfo (Documentation/gpu/drm-usage-stats.rst): amdgpu since 5.x
# (drm-memory-vram), xe since it was merged, i915 since 6.8 (drm-*-local0). Others (nouveau, nvidia-drm, the
# embedded GPUs without memory of their own) are not GPUs whose memory a quota holds.
MEMORY_STATS_DRIVERS: Final = frozenset({"amdgpu", "xe", "i915"})
MAX_POD_PROCESSES: Final = 65_536  # pod members whose fds one sample looks at (a node's pid_max is 4M)


class DrmUnavailable(Exception):
    """No GPU here has a DRM driver with memory stats (or `<sys-root>` cannot be read); the message says what was
    found. `drivers`: the drivers of the DRM GPUs found, NVIDIA's left out (an NVIDIA node's is no news)."""

    def __init__(self, message: str, drivers: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.drivers = drivers


@dataclass(frozen=True, slots=True)
class DrmDevice:
    """One GPU this sampler watches: what sysfs said at start, and where its used memory is re-read."""

    gpu: DrmGpu
    index: int  # DRM_INDEX_BASE + its place in PCI slot order
    uuid: str  # the GPU's unique_id where it has one, else its PCI slot
    name: str
    total_bytes: int
    dmem_regions: tuple[str, ...]  # its VRAM regions in the dmem controller, where the kernel registered them

    def used_bytes(self, dmem_current: Mapping[str, int | None]) -> int | None:
        """Used memory now: amdgpu's counter, else its regions' charge at the cgroup root; None when neither reads."""
        if self.gpu.vram_total_bytes is not None:
            return parse_int(read_attr(os.path.join(self.gpu.sysfs_dir, "mem_info_vram_used")) or b"")
        charged = [dmem_current.get(r) for r in self.dmem_regions]
        return sum(c for c in charged if c is not None) if charged and None not in charged else None


class DrmSampler:
    """A `GpuSampler` over the kernel's DRM memory stats. Constructed idle; `start()` finds the GPUs and raises
    `DrmUnavailable` when there is none. `sample()` runs on the scan's thread, `memory()` on the watch's."""

    def __init__(
        self,
        proc_root: str = "/proc",
        sys_root: str = "/sys",
        cgroup_root: str = "/sys/fs/cgroup",
        kubelet: KubeletTree = HOST_KUBELET,
        limits: FdScanLimits | None = None,
        clock: Clock = SYSTEM_CLOCK,
        fdinfo_root: str | None = None,
    ) -> None:
        """`fdinfo_root`: where the processes' `fd/` and `fdinfo/` are read, `proc_root` unless given (tests stand a
        tree in for them around real processes, whose other files are the real /proc's)."""
        self._sys_root = sys_root
        self._cgroup_root = cgroup_root
        self._kubelet = kubelet
        self._parse = ParseMemo()
        self._reader: DrmFdReader[DrmFdinfo] = DrmFdReader(
            self._parse, fdinfo_root if fdinfo_root is not None else proc_root, limits, clock
        )
        self._devices: tuple[DrmDevice, ...] = ()
        self._by_slot: Mapping[str, DrmDevice] = MappingProxyType({})
        self._lock = threading.Lock()  # the reader's rotation: one sample at a time
        self._cut: tuple[str, ...] = ()  # what the last sample could not read, as said in the log
        self.log = structlog.get_logger(__name__)

    # -- lifecycle ----------------------------------------------------------------------------------------

    def start(self) -> None:
        try:
            topology = discover(self._sys_root)
        except OSError as e:
            raise DrmUnavailable(f"cannot read {self._sys_root}/class/drm: {e.strerror or e}") from None
        capacity = self._read_dmem("dmem.capacity")
        devices: list[DrmDevice] = []
        passed: list[str] = []
        for gpu in topology.gpus:
            if gpu.driver not in MEMORY_STATS_DRIVERS:
                continue
            regions = gpu_regions(capacity, gpu.pci_slot)
            sizes = [capacity.get(r) for r in regions]
            total = gpu.vram_total_bytes if gpu.vram_total_bytes is not None else sum(c or 0 for c in sizes)
            if not total:
                passed.append(f"{gpu.pci_slot} ({gpu.driver}: its VRAM size is not in sysfs nor in dmem.capacity)")
                continue
            devices.append(
                DrmDevice(
                    gpu=gpu,
                    index=DRM_INDEX_BASE + len(devices),
                    uuid=gpu.unique_id or gpu.pci_slot,
                    name=gpu.product_name or f"{gpu.driver} GPU {gpu.pci_slot}",
                    total_bytes=total,
                    dmem_regions=regions,
                )
            )
        if passed:
            self.log.info("drm_gpus_not_watched", gpus=passed)
        if not devices:
            drivers = sorted({g.driver or "unbound" for g in topology.gpus})
            found = f"GPUs with drivers {', '.join(drivers)}" if drivers else "no DRM GPU"
            raise DrmUnavailable(
                f"no GPU with a DRM driver that prints memory stats ({', '.join(sorted(MEMORY_STATS_DRIVERS))}) "
                f"under {self._sys_root}/class/drm: {found}",
                tuple(d for d in drivers if d != "nvidia"),
            )
        self._devices = tuple(devices)
        self._by_slot = MappingProxyType({d.gpu.pci_slot: d for d in devices})
        self.log.info(
            "drm_gpus",
            gpus=[
                {"gpu": d.gpu.pci_slot, "uuid": d.uuid, "driver": d.gpu.driver, "name": d.name,
                 "total_bytes": d.total_bytes, "dmem_regions": list(d.dmem_regions)}
                for d in devices
            ],
        )  # fmt: skip

    def stop(self, deadline: float) -> None:
        """Nothing to release: every file is opened and closed within a call."""

    # -- what the agent asks --------------------------------------------------------------------------------

    @property
    def devices(self) -> tuple[DrmDevice, ...]:
        return self._devices

    def slot_of(self, index: int) -> str | None:
        """The PCI slot of the GPU with this `GpuDevice.index`; None for one that is not this sampler's."""
        at = index - DRM_INDEX_BASE
        return self._devices[at].gpu.pci_slot if 0 <= at < len(self._devices) else None

    def memory(self) -> tuple[GpuMemory, ...]:
        """Each GPU's memory counters now, as the watch between scans reads them; a GPU whose counter cannot be
        read is left out (the next scan says why)."""
        current = self._dmem_current()
        found = []
        for d in self._devices:
            used = d.used_bytes(current)
            if used is not None:
                found.append(GpuMemory(d.index, d.total_bytes, used, max(d.total_bytes - used, 0)))
        return tuple(found)

    def sample(self) -> GpuSample:
        with self._lock:
            processes, cut = self._processes()
        current = self._dmem_current()
        devices = []
        for d in self._devices:
            used = d.used_bytes(current)
            error = None if used is not None else f"cannot read the memory used on {d.gpu.pci_slot}"
            if used is None:  # the sum of what the pods hold there: a lower bound, never more than the GPU's
                used = min(sum(p.used_bytes or 0 for p in processes if p.device_uuid == d.uuid), d.total_bytes)
            devices.append(
                GpuDevice(
                    index=d.index,
                    uuid=d.uuid,
                    name=d.name,
                    total_bytes=d.total_bytes,
                    used_bytes=used,
                    free_bytes=max(d.total_bytes - used, 0),
                    healthy=error is None,
                    error=error,
                    backend=GpuBackend.DRM,
                    pci_slot=d.gpu.pci_slot,
                )
            )
        unhealthy = {d.uuid for d in devices if not d.healthy}
        self._say(cut)
        return GpuSample(tuple(devices), tuple(p for p in processes if p.device_uuid not in unhealthy))

    def _processes(self) -> tuple[list[GpuProcess], tuple[str, ...]]:
        """Every pod process's memory on each GPU, and what was cut short (said once per change, `_say`)."""
        cut: list[str] = []
        root = v2_root(self._cgroup_root) or _v1_root(self._cgroup_root)
        if root is None:
            return [], (f"no cgroup hierarchy under {self._cgroup_root} to find the pods' processes in",)
        pids, complete = pod_members(root, self._kubelet, MAX_POD_PROCESSES)
        if not complete:
            cut.append(f"more than {MAX_POD_PROCESSES} pod processes: the rest are not read")
        scan = self._reader.read(pids)
        self._parse.turn()
        if scan.skipped:
            cut.append(f"{len(scan.skipped)} pod processes not reached within the scan's fd budget (read first next)")
        if any(not p.complete for p in scan.processes):
            cut.append("fd tables longer than the per-process bound: DRM fds after it are not counted")
        readings = [FdReading(p.pid, fd.fd, fd.fdinfo) for p in scan.processes for fd in p.fds]
        usage = usage_by_process(readings)
        found = []
        for u in usage.processes:
            device = self._by_slot.get(u.pdev)
            used = u.device_resident_bytes
            if device is not None and used is not None:
                found.append(GpuProcess(u.pid, device.uuid, used))
        return found, tuple(cut)

    def _say(self, cut: tuple[str, ...]) -> None:
        if cut != self._cut:
            self._cut = cut
            if cut:
                self.log.warning("drm_scan_cut", problems=list(cut))
            else:
                self.log.info("drm_scan_complete")

    def _read_dmem(self, name: str) -> Mapping[str, int | None]:
        """A dmem file of the cgroup v2 root; empty where there is none (no controller)."""
        root = v2_root(self._cgroup_root)
        return read_dmem(os.path.join(root, name)) if root is not None else {}

    def _dmem_current(self) -> Mapping[str, int | None]:
        if all(d.gpu.vram_total_bytes is not None or not d.dmem_regions for d in self._devices):
            return {}
        return self._read_dmem("dmem.current")


class ParseMemo:
    """`parse_fdinfo` remembering the last sample's texts: a text the kernel prints the same as last time (an idle
    process: no buffer and no engine time changed) is not parsed again. A busy process's engine times change with
    every read, so its text is parsed each time; it costs one lookup more (bench/drm_scan.py has both rows). It holds
    at most two samples' texts, which the reader bounds (`FdScanLimits.bytes_per_scan`)."""

    def __init__(self) -> None:
        self._last: dict[bytes, DrmFdinfo] = {}
        self._now: dict[bytes, DrmFdinfo] = {}

    def __call__(self, data: bytes) -> DrmFdinfo:
        found = self._now.get(data) or self._last.get(data)
        if found is None:
            found = parse_fdinfo(data)
        self._now[data] = found
        return found

    def turn(self) -> None:
        """A sample is done: what it read is what the next one remembers."""
        self._last, self._now = self._now, {}


def _v1_root(cgroup_root: str) -> str | None:
    """A cgroup v1 hierarchy every process is in, to list the pods' processes from."""
    for name in ("pids", "memory", "cpu,cpuacct", "freezer"):
        path = os.path.join(cgroup_root, name)
        if os.path.exists(os.path.join(path, "cgroup.procs")):
            return path
    return None
