"""What the GPU backends tell the agent: the GPUs (whole, or MIG instances), their memory counters and the processes
using them. NVML's (`nvml/sampler.py`) and the kernel's DRM memory stats (`node/drm_sampler.py`: AMD Instinct and
every DRM GPU that prints them) give the same data, so everything after the sampler is the same for both.

Plain frozen data, built by the samplers at the edge; no I/O, no clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple


class GpuBackend(str, enum.Enum):
    """Where a GPU's figures come from, and so who holds a limit on it: NVIDIA's driver (NVML, R615 limits) or the
    kernel (a DRM driver's fdinfo memory stats, the `dmem` cgroup controller's limits)."""

    NVML = "nvml"
    DRM = "drm"

    @property
    def holder(self) -> str:
        """Who holds a per-cgroup limit on such a GPU, as `top` and /status say it."""
        return "driver" if self is GpuBackend.NVML else "kernel"


# A DRM GPU's `GpuDevice.index`: this plus its place in PCI slot order. NVML's indices are below it (NVML counts
# at most 64 GPUs), so one number names one GPU on a node with both; a DRM GPU is shown by its PCI slot, never by it.
DRM_INDEX_BASE = 1000


class ProcessKind(str, enum.Enum):
    """Which NVML process list a process came from."""

    COMPUTE = "compute"
    GRAPHICS = "graphics"
    MPS = "mps"


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One schedulable GPU memory domain: a whole GPU, or one MIG instance of it."""

    index: int  # the parent GPU's NVML index
    uuid: str  # the GPU's UUID, or the MIG instance's UUID
    name: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    mig_index: int | None = None  # None for a whole GPU
    parent_uuid: str | None = None  # set for a MIG instance
    healthy: bool = True
    error: str | None = None  # why it is unhealthy
    backend: GpuBackend = GpuBackend.NVML
    pci_slot: str | None = None  # a DRM GPU's PCI address ("0000:c1:00.0"), its label

    @property
    def label(self) -> str:
        """Short human/metric label: "0" for GPU 0, "0/mig1" for its MIG instance 1, the PCI slot for a DRM GPU."""
        if self.pci_slot is not None and self.backend is GpuBackend.DRM:
            return self.pci_slot
        return str(self.index) if self.mig_index is None else f"{self.index}/mig{self.mig_index}"


@dataclass(frozen=True, slots=True)
class GpuMemory:
    """One whole GPU's memory counters, as the watch between scans reads them (`GpuSampler.memory`)."""

    index: int
    total_bytes: int
    used_bytes: int
    free_bytes: int


class GpuProcess(NamedTuple):
    """One row of an NVML process list: a host PID using memory on one device.

    A NamedTuple rather than a frozen dataclass, like `ContainerUsage`: both are rebuilt for every GPU process
    on every scan, and a tuple is built about three times faster (the scan budget is 2 ms for 512 processes).
    """

    pid: int
    device_uuid: str
    used_bytes: int | None  # None: NVML reported NVML_VALUE_NOT_AVAILABLE
    kind: ProcessKind = ProcessKind.COMPUTE


@dataclass(frozen=True, slots=True)
class GpuSample:
    """Everything one NVML pass saw. Processes of unhealthy devices are absent.

    At most one row per (pid, device): a process NVML lists on several of a device's lists (compute, graphics,
    MPS) is one address space, merged by the sampler, which knows the lists.
    """

    devices: tuple[GpuDevice, ...]
    processes: tuple[GpuProcess, ...]
    # NVML errors met while taking this sample, as (kind, count): vramguard_nvml_errors_total{kind} adds them up.
    errors: tuple[tuple[str, int], ...] = ()
    # Rows whose PID has no process under the proc root (left out of `processes`, counted as dead-pid errors):
    # memory the driver still holds for a process that exited, torn down in a moment or stuck (`core/exited.py`).
    exited: tuple[GpuProcess, ...] = ()

    def device(self, uuid: str) -> GpuDevice | None:
        return next((d for d in self.devices if d.uuid == uuid), None)


def merged(samples: tuple[GpuSample, ...]) -> GpuSample:
    """One sample of several backends' (a node with NVIDIA and AMD GPUs): their devices, processes, errors and
    exited rows side by side. Their GPUs never overlap (`DRM_INDEX_BASE`, and the DRM backend leaves NVIDIA's
    GPUs to NVML), so nothing is merged within a device."""
    if len(samples) == 1:
        return samples[0]
    return GpuSample(
        devices=tuple(d for s in samples for d in s.devices),
        processes=tuple(p for s in samples for p in s.processes),
        errors=tuple(e for s in samples for e in s.errors),
        exited=tuple(p for s in samples for p in s.exited),
    )
