"""What NVML tells the agent: the GPUs (whole, or MIG instances), their memory counters and the processes using them.

Plain frozen data, built by the sampler (`nvml/sampler.py`) at the edge; no I/O, no clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple


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

    @property
    def label(self) -> str:
        """Short human/metric label: "0" for GPU 0, "0/mig1" for its MIG instance 1."""
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
