"""What the GPU backends tell the agent: the GPUs, their labels (an NVML index, a MIG instance, a DRM GPU's PCI slot),
the processes on them, and one sample of several backends' (`merged`)."""

from __future__ import annotations

import pytest

from vramguard.core.quantity import GiB
from vramguard.core.sample import DRM_INDEX_BASE, GpuBackend, GpuDevice, GpuProcess, GpuSample, ProcessKind, merged


@pytest.mark.parametrize(
    ("mig_index", "label"),
    [pytest.param(None, "3", id="whole-gpu"), pytest.param(1, "3/mig1", id="mig-instance")],
)
def test_a_device_label_names_its_gpu_and_mig_instance(mig_index: int | None, label: str) -> None:
    """A GPU's label is its NVML index; a MIG instance's adds the instance."""
    gpu = GpuDevice(index=3, uuid="GPU-3", name="A100", total_bytes=1, used_bytes=0, free_bytes=1, mig_index=mig_index)
    assert gpu.label == label


def test_a_sample_finds_its_devices_by_uuid() -> None:
    """`device(uuid)` is the sample's device with that UUID, None for one it does not have."""
    gpu = GpuDevice(index=0, uuid="GPU-0", name="H100", total_bytes=80 * GiB, used_bytes=GiB, free_bytes=79 * GiB)
    sample = GpuSample(devices=(gpu,), processes=(GpuProcess(7, "GPU-0", GiB, ProcessKind.COMPUTE),))
    assert sample.device("GPU-0") is gpu and sample.device("GPU-1") is None


@pytest.mark.parametrize(
    ("index", "backend", "pci_slot", "mig_index", "label"),
    [
        pytest.param(DRM_INDEX_BASE, GpuBackend.DRM, "0000:c1:00.0", None, "0000:c1:00.0", id="drm-gpu-its-slot"),
        pytest.param(DRM_INDEX_BASE + 2, GpuBackend.DRM, None, None, str(DRM_INDEX_BASE + 2), id="drm-without-slot"),
        pytest.param(0, GpuBackend.NVML, None, None, "0", id="nvml-whole-gpu"),
        pytest.param(0, GpuBackend.NVML, "0000:3b:00.0", None, "0", id="nvml-gpu-with-a-slot-keeps-its-index"),
        pytest.param(2, GpuBackend.NVML, "0000:3b:00.0", 4, "2/mig4", id="nvml-mig-instance"),
    ],
)
def test_a_drm_gpu_is_labelled_by_its_pci_slot(
    index: int, backend: GpuBackend, pci_slot: str | None, mig_index: int | None, label: str
) -> None:
    """A DRM GPU's label is its PCI slot; an NVML GPU's is its index (and MIG instance) even where a slot is known."""
    gpu = GpuDevice(
        index=index,
        uuid="GPU-x",
        name="gpu",
        total_bytes=1,
        used_bytes=0,
        free_bytes=1,
        mig_index=mig_index,
        backend=backend,
        pci_slot=pci_slot,
    )
    assert gpu.label == label


def device(index: int, uuid: str, backend: GpuBackend = GpuBackend.NVML) -> GpuDevice:
    return GpuDevice(
        index=index, uuid=uuid, name=uuid, total_bytes=8 * GiB, used_bytes=GiB, free_bytes=7 * GiB, backend=backend
    )


NVML_SAMPLE = GpuSample(
    devices=(device(0, "GPU-0"), device(1, "GPU-1")),
    processes=(GpuProcess(10, "GPU-0", GiB), GpuProcess(11, "GPU-1", None, ProcessKind.GRAPHICS)),
    errors=(("timeout", 1),),
    exited=(GpuProcess(12, "GPU-1", GiB),),
)
DRM_SAMPLE = GpuSample(
    devices=(device(DRM_INDEX_BASE, "5a1f00d15ea5e000", GpuBackend.DRM),),
    processes=(GpuProcess(20, "5a1f00d15ea5e000", 2 * GiB),),
)


def test_one_sample_is_merged_as_it_is() -> None:
    """A node with one backend: its sample is returned itself, untouched."""
    assert merged((NVML_SAMPLE,)) is NVML_SAMPLE


def test_two_samples_are_merged_side_by_side_in_order() -> None:
    """Devices, processes, errors and exited rows of each sample follow one another in the samples' order."""
    assert merged((NVML_SAMPLE, DRM_SAMPLE)) == GpuSample(
        devices=(*NVML_SAMPLE.devices, *DRM_SAMPLE.devices),
        processes=(*NVML_SAMPLE.processes, *DRM_SAMPLE.processes),
        errors=NVML_SAMPLE.errors,
        exited=NVML_SAMPLE.exited,
    )
    swapped = merged((DRM_SAMPLE, NVML_SAMPLE))
    assert [d.uuid for d in swapped.devices] == ["5a1f00d15ea5e000", "GPU-0", "GPU-1"]
    assert [p.pid for p in swapped.processes] == [20, 10, 11]


def test_no_sample_merges_to_an_empty_one() -> None:
    """No backend at all: an empty sample."""
    assert merged(()) == GpuSample(devices=(), processes=())
