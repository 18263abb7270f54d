"""How NVML's failures are told: one line per failed call, and at start-up what the operator should do."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vramguard.nvml.errors import (
    DRIVER_NOT_LOADED,
    LIB_RM_VERSION_MISMATCH,
    LIBRARY_NOT_FOUND,
    NO_PERMISSION,
    NOT_SUPPORTED,
    NvmlErrorKind,
    describe,
    init_failure,
)


class FakeNvmlError(Exception):
    """pynvml's NVMLError as the helpers read it: an exception carrying the return code in `value`."""

    def __init__(self, value: int, text: str = "") -> None:
        super().__init__(text or f"error {value}")
        self.value = value


NV = SimpleNamespace(NVMLError=FakeNvmlError)  # the module the helpers are handed: only NVMLError is read
NAMES = {NOT_SUPPORTED: "NVML_ERROR_NOT_SUPPORTED", DRIVER_NOT_LOADED: "NVML_ERROR_DRIVER_NOT_LOADED"}


@pytest.mark.parametrize(
    ("call", "error", "line"),
    [
        pytest.param(
            "nvmlDeviceGetMemoryInfo",
            FakeNvmlError(NOT_SUPPORTED, "Not Supported"),
            "nvmlDeviceGetMemoryInfo: Not Supported (NVML_ERROR_NOT_SUPPORTED = 3)",
            id="nvml-error-named-with-its-code",
        ),
        pytest.param(
            "nvmlDeviceGetUUID",
            FakeNvmlError(999, "Unknown Error"),
            "nvmlDeviceGetUUID: Unknown Error (NVML error = 999)",
            id="unnamed-code",
        ),
        pytest.param(
            "nvmlDeviceGetUUID", ValueError("bad"), "nvmlDeviceGetUUID: ValueError: bad", id="any-other-exception"
        ),
        pytest.param("", OSError("gone"), "NVML: OSError: gone", id="no-call-known"),
    ],
)
def test_a_failed_call_is_one_line(call: str, error: BaseException, line: str) -> None:
    """The call, NVML's message, and the return code by name, so a log line can be looked up in nvml.h."""
    assert describe(NV, NAMES, call, error) == line


@pytest.mark.parametrize(
    ("code", "says"),
    [
        pytest.param(LIBRARY_NOT_FOUND, "libnvidia-ml.so.1 was not found", id="no-library"),
        pytest.param(DRIVER_NOT_LOADED, "the NVIDIA kernel driver is not loaded", id="no-kernel-driver"),
        pytest.param(NO_PERMISSION, "run the agent privileged", id="no-permission"),
        pytest.param(LIB_RM_VERSION_MISMATCH, "differ in version", id="library-and-driver-differ"),
        pytest.param(999, "see the NVIDIA driver's state on the node", id="anything-else"),
    ],
)
def test_a_failed_start_says_what_to_do(code: int, says: str) -> None:
    """Each way nvmlInit fails has its own advice; the message always starts the same way."""
    message = init_failure(NV, NAMES, "nvmlInit", FakeNvmlError(code))
    assert message.startswith("NVML is not available: ")
    assert says in message


def test_a_failed_start_names_the_call_and_code() -> None:
    """Past the library's absence the message carries the call and the code, nvmlInit where no call is known."""
    message = init_failure(NV, NAMES, "", FakeNvmlError(DRIVER_NOT_LOADED, "Driver Not Loaded"))
    assert "nvmlInit: Driver Not Loaded (NVML_ERROR_DRIVER_NOT_LOADED = 9)" in message


def test_error_kinds_are_metric_labels() -> None:
    """Each kind is the `kind` label of vramguard_nvml_errors_total: lower-case words joined by dashes."""
    assert all(k.value == k.value.lower() and " " not in k.value and "_" not in k.value for k in NvmlErrorKind)
    assert len({k.value for k in NvmlErrorKind}) == len(NvmlErrorKind)
