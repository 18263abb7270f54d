"""The node's GPU backends, found without a flag: NVML where it loads, the kernel's DRM memory stats where a DRM
driver that prints them is bound (`node/drm_sampler.py`), both on a node with both. One `GpuSampler` over them for the
scan, the device files a GPU process holds open for the killer, and one `MemoryLimiter` that sends each GPU's
limits to who holds them: NVIDIA's driver (R615) or the kernel's dmem controller."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import structlog

from vramguard.base.backoff import Backoff
from vramguard.base.clock import Clock
from vramguard.base.lifecycle import Services
from vramguard.base.logs import FailureRun
from vramguard.cli.config import ScanSetup
from vramguard.core.ports import DriverLimit, LimitsUnavailable, MemoryLimiter
from vramguard.core.sample import DRM_INDEX_BASE, GpuMemory, GpuSample, merged
from vramguard.node.cgroup import v2_root
from vramguard.node.dmem import DmemMemoryLimiter
from vramguard.node.drm_sampler import DrmSampler, DrmUnavailable
from vramguard.nvml import NvmlMemoryLimiter, NvmlSampler, NvmlUnavailable

KFD_DEVICE = "/dev/kfd"  # ROCm's compute device: a HIP process holds it and a render node


@dataclass(frozen=True)
class Gpus:
    """The backends that found GPUs here, started: a `GpuSampler` over them all."""

    nvml: NvmlSampler | None = None
    drm: DrmSampler | None = None

    def sample(self) -> GpuSample:
        return merged(tuple(s.sample() for s in self._samplers()))

    def memory(self) -> tuple[GpuMemory, ...]:
        return tuple(m for s in self._samplers() for m in s.memory())

    def _samplers(self) -> tuple[NvmlSampler | DrmSampler, ...]:
        return tuple(s for s in (self.nvml, self.drm) if s is not None)

    def device_prefixes(self, setup: ScanSetup) -> tuple[str, ...]:
        """The device files whose holders the killer signals: NVIDIA's, and the DRM nodes and /dev/kfd."""
        found = (setup.device_prefix,) if self.nvml is not None else ()
        return found + ((setup.drm_device_prefix, KFD_DEVICE) if self.drm is not None else ())


def open_nvml(setup: ScanSetup, services: Services) -> NvmlSampler:
    """NVML started in `services`, or NvmlUnavailable saying why not."""
    return services.start("nvml", NvmlSampler(proc_root=setup.proc_root, location=setup.nvml_location))


def open_drm(setup: ScanSetup, services: Services) -> DrmSampler | None:
    """The DRM backend started in `services`, or None where no GPU here has a DRM driver with memory stats."""
    sampler = DrmSampler(
        proc_root=setup.proc_root,
        sys_root=setup.sys_root,
        cgroup_root=setup.cgroup_root,
        kubelet=setup.kubelet,
        fdinfo_root=setup.fdinfo_root,
    )
    try:
        return services.start("drm", sampler)
    except DrmUnavailable as e:
        log = structlog.get_logger(__name__)
        # Said where a GPU of another kind is here; on an NVIDIA node (nvidia-drm's GPUs, or none) it is no news.
        (log.info if e.drivers else log.debug)("drm_gpus_none", reason=str(e))
        return None


def open_gpus(
    setup: ScanSetup,
    services: Services,
    stop: threading.Event,
    clock: Clock,
    problem: Callable[[str | None], None],
) -> Gpus | None:
    """The node's GPUs: the DRM backend where it finds GPUs, and NVML. Where there are DRM GPUs, NVML is tried once
    (a node without NVIDIA GPUs has no NVML; one with both whose NVIDIA driver comes up after the agent is
    enforced on its DRM GPUs until the agent restarts). Where there are none, NVML is waited for with back-off until
    `stop` (a driver container still installing): `problem` hears why it failed, and None once it is up; the log
    hears once per run of the same failure. None once stopped before any GPU was found."""
    log = structlog.get_logger(__name__)
    drm = open_drm(setup, services)
    if drm is not None:
        try:
            nvml = open_nvml(setup, services)
        except NvmlUnavailable as e:
            log.info("nvml_not_used", reason=str(e), gpus="drm")
            nvml = None
        problem(None)
        return Gpus(nvml, drm)
    backoff = Backoff(1.0, 60.0)
    failures = FailureRun()
    while not stop.is_set():
        try:
            nvml = open_nvml(setup, services)
        except NvmlUnavailable as e:
            if failures.failed(str(e)):
                log.error("nvml_unavailable", error=str(e))
            problem(str(e))
            clock.wait(stop, backoff.next())
            continue
        problem(None)
        return Gpus(nvml, None)
    return None


def open_gpus_once(setup: ScanSetup, services: Services) -> Gpus:
    """The node's GPUs as the commands find them (`top`): both backends tried once; NvmlUnavailable, saying why NVML
    did not load, when neither found a GPU."""
    drm = open_drm(setup, services)
    try:
        nvml = open_nvml(setup, services)
    except NvmlUnavailable:
        if drm is None:
            raise
        nvml = None
    return Gpus(nvml, drm)


class BackendLimits:
    """A `MemoryLimiter` for every GPU of the node: an NVML GPU's limits to NVIDIA's driver, a DRM GPU's to the
    kernel's dmem controller. A GPU whose backend holds no limits raises `LimitsUnavailable` for that GPU alone."""

    def __init__(self, nvml: MemoryLimiter | None, dmem: MemoryLimiter | None) -> None:
        self._nvml = nvml
        self._dmem = dmem

    def _for(self, gpu_index: int) -> MemoryLimiter:
        backend = self._dmem if gpu_index >= DRM_INDEX_BASE else self._nvml
        if backend is None:
            raise LimitsUnavailable(f"no limits on GPU {gpu_index}: its backend is not up", whole_driver=False)
        return backend

    def get(self, gpu_index: int, cgroup: str) -> DriverLimit | None:
        with _one_backend():
            return self._for(gpu_index).get(gpu_index, cgroup)

    def set(self, gpu_index: int, cgroup: str, soft_bytes: int, hard_bytes: int) -> None:
        with _one_backend():
            self._for(gpu_index).set(gpu_index, cgroup, soft_bytes, hard_bytes)


@contextlib.contextmanager
def _one_backend() -> Iterator[None]:
    """One backend's "none at all" (an old NVIDIA driver, a kernel without dmem) is only its own GPUs' here: the
    other backend's may hold limits."""
    try:
        yield
    except LimitsUnavailable as e:
        if not e.whole_driver:
            raise
        raise LimitsUnavailable(str(e), whole_driver=False) from e


def memory_limiter(gpus: Gpus, cgroup_root: str, services: Services) -> MemoryLimiter:
    """The limits of every GPU here: NVIDIA's (its NVML initialisation started in `services`) where NVML is up,
    the dmem controller's for the DRM GPUs. On a node with one kind, that kind's alone: the NVIDIA path is as it
    was."""
    nvml = services.start("nvml-limits", NvmlMemoryLimiter()) if gpus.nvml is not None else None
    if gpus.drm is None:
        assert nvml is not None
        return nvml
    dmem = DmemMemoryLimiter(v2_root(cgroup_root) or cgroup_root, gpus.drm.slot_of)
    return dmem if nvml is None else BackendLimits(nvml, dmem)
