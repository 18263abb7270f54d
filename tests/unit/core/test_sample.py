"""What NVML tells the agent: the GPUs, their labels, and the processes on them."""

from __future__ import annotations

import pytest

from vramguard.core.quantity import GiB
from vramguard.core.sample import GpuDevice, GpuProcess, GpuSample, ProcessKind


@pytest.mark.parametrize(
    ("mig_index", "label"),
    [pytest.param(None, "3", id="whole-gpu"), pytest.param(1, "3/mig1", id="mig-instance")],
)
def test_a_device_label_names_its_gpu_and_mig_instance(mig_index: int | None, label: str) -> None:
    """A GPU's label is its NVML index; a MIG instance's adds the instance."""
    gpu = GpuDevice(index=3, uuid="GPU-3", name="A100", total_bytes=1, used_bytes=0, free_bytes=1, mig_index=mig_index)
    assert gpu.label == label


def test_a_sample_finds_its_devices_by_uuid() -> None:
    gpu = GpuDevice(index=0, uuid="GPU-0", name="H100", total_bytes=80 * GiB, used_bytes=GiB, free_bytes=79 * GiB)
    sample = GpuSample(devices=(gpu,), processes=(GpuProcess(7, "GPU-0", GiB, ProcessKind.COMPUTE),))
    assert sample.device("GPU-0") is gpu and sample.device("GPU-1") is None
