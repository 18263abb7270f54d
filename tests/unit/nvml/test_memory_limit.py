"""The driver's per-cgroup limits over NVML: which failures mean "no limits here" and which one call failed."""

from __future__ import annotations

import pynvml
import pytest

from vramguard.core.ports import LimitFailed, LimitsUnavailable
from vramguard.nvml.memory_limit import (
    BINDINGS_SINCE,
    NvmlMemoryLimiter,
    _translate,
    binding_version,
    binds_limits,
)


@pytest.mark.parametrize(
    ("code", "raised", "whole_driver", "says"),
    [
        pytest.param(
            pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, LimitsUnavailable, True, "it needs R615 or later", id="old-driver"
        ),
        pytest.param(
            pynvml.NVML_ERROR_NOT_SUPPORTED, LimitsUnavailable, False, "GPU 2 does not support", id="this-gpu-cannot"
        ),
        pytest.param(pynvml.NVML_ERROR_NO_PERMISSION, LimitFailed, None, "on GPU 2", id="one-call-failed"),
        pytest.param(pynvml.NVML_ERROR_INVALID_ARGUMENT, LimitFailed, None, "on GPU 2", id="bad-cgroup-path"),
    ],
)
def test_nvml_errors_become_the_ports_errors(
    code: int, raised: type[Exception], whole_driver: bool | None, says: str
) -> None:
    """A missing symbol ends limits on the whole driver, NOT_SUPPORTED on that GPU; anything else fails one call,
    and the limiter retries it."""
    error = _translate(pynvml.NVMLError(code), "nvmlDeviceSetMemoryLimits_v1", 2)
    assert type(error) is raised
    assert says in str(error)
    if isinstance(error, LimitsUnavailable):
        assert error.whole_driver is whole_driver


def test_the_installed_bindings_hold_limits() -> None:
    """pyproject.toml requires the first nvidia-ml-py that binds the limits: the installed one does."""
    assert binds_limits()
    version = binding_version()
    assert tuple(int(p) for p in version.split(".")[:3]) >= tuple(int(p) for p in BINDINGS_SINCE.split("."))


def test_a_limiter_never_started_gives_back_nothing() -> None:
    """Constructed idle: stop() before start() calls no nvmlShutdown (it would undo someone else's nvmlInit)."""
    limiter = NvmlMemoryLimiter()
    limiter.stop(0.0)
    limiter.stop(0.0)
