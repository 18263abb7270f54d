"""What can go wrong with NVML, and how the agent says it: the error kinds it counts, the rows it drops, and the
messages that tell an operator what to do.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vramguard.core.sample import ProcessKind

# NVML return codes (nvml.h); the ones the adapter branches on.
SUCCESS = 0
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
DRIVER_NOT_LOADED = 9
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
LIB_RM_VERSION_MISMATCH = 18
ARGUMENT_VERSION_MISMATCH = 25


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this node at all (no library, or nvmlInit failed). The message says what to do."""


class NvmlErrorKind(str, enum.Enum):
    """What went wrong, for `NvmlSampler.errors` (the agent's `vramguard_nvml_errors_total{kind}`)."""

    CALL_FAILED = "call-failed"  # an NVML call on a device returned an error: the device is unhealthy
    TIMEOUT = "timeout"  # a device's calls ran past call_timeout_s: the device is unhealthy
    STUCK = "stuck"  # a device was skipped because an earlier call on it has not returned
    INVALID_PID = "invalid-pid"  # row dropped: PID 0 or above the kernel's limit
    DEAD_PID = "dead-pid"  # row dropped: no such process under proc_root
    USED_EXCEEDS_TOTAL = "used-exceeds-total"  # row dropped: more memory than the device has
    LAYOUT_MISMATCH = "layout-mismatch"  # process rows came with another row size than expected (R535)


@dataclass(frozen=True, slots=True)
class DroppedRow:
    """A process row that failed the sanity checks, with why."""

    device_uuid: str
    pid: int
    used_bytes: int | None
    kind: ProcessKind
    reason: NvmlErrorKind


def describe(nv: Any, error_names: Mapping[int, str], call: str, error: BaseException) -> str:
    """`call: message (NVML_ERROR_NAME = code)` for an NVMLError; the exception's type and text otherwise."""
    code = getattr(error, "value", None)
    if isinstance(error, nv.NVMLError) and isinstance(code, int):
        return f"{call}: {error} ({error_names.get(code, 'NVML error')} = {code})"
    return f"{call or 'NVML'}: {type(error).__name__}: {error}"


def init_failure(nv: Any, error_names: Mapping[int, str], call: str, error: BaseException) -> str:
    """Why NVML could not start, with what to do about it."""
    code = getattr(error, "value", None)
    if code == LIBRARY_NOT_FOUND:
        return (
            "NVML is not available: libnvidia-ml.so.1 was not found. Install the NVIDIA driver on the node and "
            "give the agent its libraries: in a pod, the NVIDIA container toolkit mounts them (runtimeClassName: "
            "nvidia, or NVIDIA_VISIBLE_DEVICES=all with NVIDIA_DRIVER_CAPABILITIES=utility), or the chart's "
            "driver.root names the host directory the driver is installed in (--driver-root); elsewhere, put "
            "the library's directory on LD_LIBRARY_PATH."
        )
    hint = {
        DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded; check `nvidia-smi` on the node",
        NO_PERMISSION: "no permission to use the GPU devices; run the agent privileged (or as root with "
        "/dev/nvidiactl and /dev/nvidia* available)",
        LIB_RM_VERSION_MISMATCH: "the NVML library and the kernel driver differ in version (the driver was "
        "upgraded without a reboot, or the container carries other libraries than the host)",
    }.get(code if isinstance(code, int) else -1, "see the NVIDIA driver's state on the node (`nvidia-smi`)")
    return f"NVML is not available: {describe(nv, error_names, call or 'nvmlInit', error)}: {hint}"
