"""The NVML sampler's contract before NVML is touched: built idle, started once, sampled only while running.

What it reads from a driver is tested over the test NVML library in tests/node/test_nvml.py."""

from __future__ import annotations

import pytest

from vramguard.nvml.errors import NvmlErrorKind
from vramguard.nvml.rows import STRIDE_V2_BYTES
from vramguard.nvml.sampler import NvmlSampler


@pytest.mark.parametrize("timeout_s", [pytest.param(0.0, id="zero"), pytest.param(-1.0, id="negative")])
def test_a_call_timeout_must_be_positive(timeout_s: float) -> None:
    """Every NVML call runs under the deadline: one that cannot pass is refused at construction."""
    with pytest.raises(ValueError, match="call_timeout_s"):
        NvmlSampler(call_timeout_s=timeout_s)


def test_constructed_idle() -> None:
    """No thread, no NVML, no errors counted and the current row layout assumed until start()."""
    sampler = NvmlSampler(proc_root="/nonexistent")
    assert sampler.threads_started == 0
    assert dict(sampler.errors) == dict.fromkeys(NvmlErrorKind, 0)
    assert sampler.dropped_rows == ()
    assert sampler.process_info_stride_bytes == STRIDE_V2_BYTES
    assert (sampler.gpu_count, sampler.driver_version, sampler.library_path) == (0, "", "")


def test_samples_only_while_running() -> None:
    """sample() before start() is a bug and says so; the watch's memory() reads nothing."""
    sampler = NvmlSampler()
    with pytest.raises(RuntimeError, match="between start"):
        sampler.sample()
    assert sampler.memory() == ()


def test_a_sampler_stopped_before_it_started_is_not_started_again() -> None:
    """stop() without start() ends it for good: a new sampler is made instead, and no thread was started."""
    sampler = NvmlSampler()
    sampler.stop(0.0)
    with pytest.raises(RuntimeError, match="started once"):
        sampler.start()
    assert sampler.memory() == ()
    assert sampler.threads_started == 0
