"""What the NVIDIA side is, as `vramguard version` asks it and /status tells it: the binding's, the driver's and
NVML's versions, and whether the driver can hold memory limits."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from vramguard.base.lifecycle import Services
from vramguard.cli.signals import SHUTDOWN_BUDGET_S
from vramguard.core.limit_plan import whole_gpus
from vramguard.core.ports import LimitsSupport, MemoryLimiter
from vramguard.core.sample import GpuDevice
from vramguard.http.status import DriverFacts
from vramguard.node.cgroup_tree import CgroupfsTree
from vramguard.node.limiter import probe_limits
from vramguard.nvml import (
    LOADER_SEARCH,
    NvmlLocation,
    NvmlMemoryLimiter,
    NvmlSampler,
    NvmlUnavailable,
    binding_version,
    binds_limits,
)

# An agent that does not use the driver's limits does not ask the driver about them either.
LIMITS_UNASKED = (
    "not asked: the agent uses the driver's limits in evict and kill modes only, not with --dry-run or "
    "driver_limits: off (`vramguard version` on the node asks)"
)


def nvidia_side(sampler: NvmlSampler | None) -> DriverFacts:
    """nvidia-ml-py's version and whether it binds the limits; with NVML up (`sampler` started), the driver's and
    NVML's versions. `with_limits` adds whether the driver can hold limits."""
    facts = DriverFacts(binding_version(), binds_limits())
    if sampler is None:
        return facts
    return replace(
        facts,
        driver_version=sampler.driver_version,
        nvml_version=sampler.nvml_version,
        nvml_library=sampler.library_path,
    )


def with_limits(facts: DriverFacts, support: LimitsSupport | None, unknown: str) -> DriverFacts:
    """`facts` saying whether the driver can hold limits, as `support` found; where it is None, not known, and why
    (`unknown`)."""
    if support is None:
        return replace(facts, limits_possible=None, limits_reason=unknown)
    return replace(facts, limits_possible=support.possible, limits_reason=support.reason)


def ask_limits(memory: MemoryLimiter, cgroup_root: str, devices: Iterable[GpuDevice]) -> LimitsSupport:
    """Whether the driver can hold limits on these GPUs (the whole ones) now. Blocks on NVML: for the commands."""
    return probe_limits(memory, CgroupfsTree(cgroup_root), [d.index for d in whole_gpus(devices)])


def ask_driver(proc_root: str, cgroup_root: str, location: NvmlLocation = LOADER_SEARCH) -> DriverFacts:
    """The NVIDIA side, asked now (`vramguard version`): NVML started here and stopped, one sample for the GPUs, and
    the limits of the cgroup v2 root asked for on each whole one. Where NVML cannot start, says why (`problem`).
    Blocks on NVML (each call of the sample under its deadline, the limits not): never for the agent."""
    services = Services()
    try:
        try:
            sampler = services.start("nvml", NvmlSampler(proc_root=proc_root, location=location))
        except NvmlUnavailable as e:
            return replace(
                nvidia_side(None), limits_possible=False, limits_reason="NVML is not available", problem=str(e)
            )
        facts = nvidia_side(sampler)
        try:
            memory = services.start("nvml-limits", NvmlMemoryLimiter())
        except Exception as e:  # pynvml.NVMLError from a second nvmlInit: NVML came up for the sampler just now
            return with_limits(facts, None, f"nvmlInit: {e}")
        return with_limits(facts, ask_limits(memory, cgroup_root, sampler.sample().devices), "")
    finally:
        services.stop(SHUTDOWN_BUDGET_S)
