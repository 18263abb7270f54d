"""`MemoryLimiter` over NVML: nvmlDeviceSetMemoryLimits_v1 / nvmlDeviceGetMemoryLimits_v1 (driver R615+).

Drivers before R615 lack both symbols (pynvml reports NVML_ERROR_FUNCTION_NOT_FOUND), and nvidia-ml-py before
13.615.71 lacks the bindings (the package requires that version; an install without its dependencies may not have
it): either way the driver cannot hold limits and the agent enforces reactively.
"""

from __future__ import annotations

import contextlib
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import pynvml

from vramguard.core.ports import DriverLimit, LimitFailed, LimitsUnavailable

_NOT_FOUND = getattr(pynvml, "NVML_ERROR_NOT_FOUND", 6)
_NOT_SUPPORTED = getattr(pynvml, "NVML_ERROR_NOT_SUPPORTED", 3)
_FUNCTION_NOT_FOUND = getattr(pynvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)
BINDINGS_SINCE = "13.615.71"  # the first nvidia-ml-py with nvmlDeviceSetMemoryLimits_v1 (pyproject.toml requires it)


class NvmlMemoryLimiter:
    """Holds its own NVML initialisation (NVML counts them), so it outlives nothing it depends on: `start()` takes
    it (raising `pynvml.NVMLError` where NVML cannot start), `stop(deadline)` gives it back."""

    def __init__(self) -> None:
        if not binds_limits():
            self._missing = (
                f"nvidia-ml-py {binding_version()} has no memory-limit bindings ({BINDINGS_SINCE} or later has)"
            )
        else:
            self._missing = ""
        self._handles: dict[int, Any] = {}
        self._initialised = False

    def start(self) -> None:
        pynvml.nvmlInit()
        self._initialised = True

    def stop(self, deadline: float) -> None:
        """Give the initialisation back (nvmlShutdown); the limits set stay with the driver."""
        if not self._initialised:
            return
        self._initialised = False
        self._handles.clear()
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()

    def get(self, gpu_index: int, cgroup: str) -> DriverLimit | None:
        self._check_binding()
        limits = pynvml.c_nvmlGetMemoryLimits_v1_t()
        path = cgroup.encode()
        limits.nameSpace = path
        try:
            pynvml.nvmlDeviceGetMemoryLimits_v1(self._handle(gpu_index), limits)
        except pynvml.NVMLError as e:
            if e.value == _NOT_FOUND:
                return None
            raise _translate(e, "nvmlDeviceGetMemoryLimits_v1", gpu_index) from None
        return DriverLimit(int(limits.softLimit), int(limits.hardLimit), int(limits.currentUsed))

    def set(self, gpu_index: int, cgroup: str, soft_bytes: int, hard_bytes: int) -> None:
        self._check_binding()
        limits = pynvml.c_nvmlSetMemoryLimits_v1_t()
        path = cgroup.encode()
        limits.nameSpace = path
        limits.softLimit = soft_bytes
        limits.hardLimit = hard_bytes
        try:
            pynvml.nvmlDeviceSetMemoryLimits_v1(self._handle(gpu_index), limits)
        except pynvml.NVMLError as e:
            raise _translate(e, "nvmlDeviceSetMemoryLimits_v1", gpu_index) from None

    def _check_binding(self) -> None:
        if self._missing:
            raise LimitsUnavailable(self._missing, whole_driver=True)

    def _handle(self, gpu_index: int) -> Any:
        handle = self._handles.get(gpu_index)
        if handle is None:
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(gpu_index)
            except pynvml.NVMLError as e:
                raise LimitFailed(f"GPU {gpu_index}: nvmlDeviceGetHandleByIndex: {e}") from None
            self._handles[gpu_index] = handle
        return handle


def _translate(error: pynvml.NVMLError, function: str, gpu_index: int) -> Exception:
    if error.value == _FUNCTION_NOT_FOUND:
        return LimitsUnavailable(f"the driver has no {function} (it needs R615 or later)", whole_driver=True)
    if error.value == _NOT_SUPPORTED:
        return LimitsUnavailable(f"GPU {gpu_index} does not support memory limits ({function})", whole_driver=False)
    return LimitFailed(f"{function} on GPU {gpu_index}: {error}")


def binds_limits() -> bool:
    """Whether this nvidia-ml-py binds the driver's per-cgroup memory limits (the driver may still lack them)."""
    return hasattr(pynvml, "nvmlDeviceSetMemoryLimits_v1") and hasattr(pynvml, "nvmlDeviceGetMemoryLimits_v1")


def binding_version() -> str:
    """The installed nvidia-ml-py's version, as its package metadata says."""
    try:
        return version("nvidia-ml-py")
    except PackageNotFoundError:
        return "(unknown version)"
