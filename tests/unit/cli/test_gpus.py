"""The node's GPU backends side by side: `BackendLimits` sends each GPU's limits to the backend that holds them
(NVIDIA's driver below `DRM_INDEX_BASE`, the dmem controller from it) and keeps one backend's "no limits at all" to
that backend's GPUs; `Gpus` names the device files the killer looks for and merges the backends' samples. The fakes
are the testbed's `FakeMemoryLimiter` (it records every call) and DRM samplers over stand-in trees in tmp_path."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from vramguard.cli.config import ScanSetup
from vramguard.cli.gpus import KFD_DEVICE, BackendLimits, Gpus
from vramguard.core.policy import Mode, Policy
from vramguard.core.ports import DriverLimit, LimitFailed, LimitsUnavailable
from vramguard.core.sample import DRM_INDEX_BASE
from vramguard.node.drm_sampler import DrmSampler
from vramguard.nvml import NvmlSampler
from vramguard_testbed.drmnode import DrmStandIn
from vramguard_testbed.fakes import FakeMemoryLimiter

CGROUP = "/sys/fs/cgroup/kubepods.slice/kubepods-pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0.slice"


def setup(**fields: object) -> ScanSetup:
    given: dict[str, object] = {
        "node_name": "node-1",
        "policy": Policy(mode=Mode.KILL),
        "dry_run": False,
        "proc_root": "/proc",
        "cgroup_root": "/sys/fs/cgroup",
        "pods_file": None,
        "kubeconfig": None,
    }
    return ScanSetup(**{**given, **fields})  # type: ignore[arg-type]


# -- BackendLimits ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("index", "to_dmem"),
    [
        pytest.param(0, False, id="first-nvml-gpu"),
        pytest.param(DRM_INDEX_BASE - 1, False, id="below-the-base-is-nvml"),
        pytest.param(DRM_INDEX_BASE, True, id="first-drm-gpu"),
        pytest.param(DRM_INDEX_BASE + 3, True, id="fourth-drm-gpu"),
    ],
)
def test_each_gpus_limits_go_to_its_backend(index: int, to_dmem: bool) -> None:
    """An index below DRM_INDEX_BASE is NVIDIA's driver's, one at or above it the dmem controller's: get and set
    reach that backend alone, with the same arguments, and get returns what it said."""
    nvml, dmem = FakeMemoryLimiter(), FakeMemoryLimiter()
    limits = BackendLimits(nvml, dmem)
    limits.set(index, CGROUP, 0, 8 << 30)
    assert limits.get(index, CGROUP) == DriverLimit(0, 8 << 30, 0)
    called, idle = (dmem, nvml) if to_dmem else (nvml, dmem)
    assert called.calls == [("set", index, CGROUP, 0, 8 << 30), ("get", index, CGROUP, 0, 0)]
    assert idle.calls == []


@pytest.mark.parametrize(
    ("index", "old_driver"),
    [
        pytest.param(0, "nvml", id="nvidia-driver-before-r615"),
        pytest.param(DRM_INDEX_BASE, "dmem", id="kernel-without-dmem"),
    ],
)
@pytest.mark.parametrize("verb", ["get", "set"])
def test_one_backends_no_limits_at_all_is_only_its_own_gpus(index: int, old_driver: str, verb: str) -> None:
    """LimitsUnavailable(whole_driver=True) from one backend comes out as whole_driver=False, its message kept:
    the other backend's GPUs may still hold limits."""
    nvml, dmem = FakeMemoryLimiter(), FakeMemoryLimiter()
    (nvml if old_driver == "nvml" else dmem).older_driver = True
    limits = BackendLimits(nvml, dmem)
    with pytest.raises(LimitsUnavailable) as raised:
        if verb == "get":
            limits.get(index, CGROUP)
        else:
            limits.set(index, CGROUP, 0, 1 << 30)
    assert raised.value.whole_driver is False
    assert str(raised.value) == "the driver has no nvmlDeviceGetMemoryLimits_v1"
    other = DRM_INDEX_BASE if index == 0 else 0
    limits.set(other, CGROUP, 0, 1 << 30)  # the other backend still holds its GPUs' limits
    assert limits.get(other, CGROUP) == DriverLimit(0, 1 << 30, 0)


def test_a_gpus_own_errors_pass_through_as_they_are() -> None:
    """A GPU that cannot hold limits (whole_driver=False) and a cgroup that cannot be opened (LimitFailed) reach the
    caller unchanged."""
    nvml, dmem = FakeMemoryLimiter(), FakeMemoryLimiter()
    dmem.unsupported_gpus.add(DRM_INDEX_BASE)
    nvml.failing.add(CGROUP)
    limits = BackendLimits(nvml, dmem)
    with pytest.raises(LimitsUnavailable) as raised:
        limits.get(DRM_INDEX_BASE, CGROUP)
    assert (
        raised.value.whole_driver is False
        and str(raised.value) == f"GPU {DRM_INDEX_BASE} does not support memory limits"
    )
    with pytest.raises(LimitFailed):
        limits.set(0, CGROUP, 0, 1 << 30)


@pytest.mark.parametrize(
    ("index", "up"),
    [
        pytest.param(0, "dmem", id="nvml-gpu-without-nvml"),
        pytest.param(DRM_INDEX_BASE, "nvml", id="drm-gpu-without-dmem"),
    ],
)
@pytest.mark.parametrize("verb", ["get", "set"])
def test_a_gpu_whose_backend_is_not_up_has_no_limits(index: int, up: str, verb: str) -> None:
    """A GPU whose backend is missing raises LimitsUnavailable(whole_driver=False) naming it; the other backend is
    not asked."""
    present = FakeMemoryLimiter()
    limits = BackendLimits(present, None) if up == "nvml" else BackendLimits(None, present)
    with pytest.raises(LimitsUnavailable) as raised:
        if verb == "get":
            limits.get(index, CGROUP)
        else:
            limits.set(index, CGROUP, 0, 1 << 30)
    assert raised.value.whole_driver is False
    assert str(raised.value) == f"no limits on GPU {index}: its backend is not up"
    assert present.calls == []


# -- Gpus ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nvml", "drm", "prefixes"),
    [
        pytest.param(True, False, ("/host/dev/nvidia",), id="nvml-only"),
        pytest.param(False, True, ("/host/dev/dri/", KFD_DEVICE), id="drm-only-with-kfd"),
        pytest.param(True, True, ("/host/dev/nvidia", "/host/dev/dri/", KFD_DEVICE), id="both"),
        pytest.param(False, False, (), id="neither"),
    ],
)
def test_device_prefixes_are_each_backends_device_files(nvml: bool, drm: bool, prefixes: tuple[str, ...]) -> None:
    """The killer looks for NVIDIA's device files where NVML is up, and the DRM nodes and /dev/kfd where the DRM
    backend is, each from the setup's prefixes."""
    gpus = Gpus(
        nvml=NvmlSampler(proc_root="/proc") if nvml else None,  # constructed idle: no library loaded, no thread
        drm=DrmSampler() if drm else None,
    )
    scan = setup(device_prefix="/host/dev/nvidia", drm_device_prefix="/host/dev/dri/")
    assert gpus.device_prefixes(scan) == prefixes


def started_drm(root: Path, gpus: int) -> DrmSampler:
    stand_in = DrmStandIn(root, gpus=gpus)
    (root / "cgroup").mkdir()
    drm = DrmSampler(sys_root=str(stand_in.sys_root), cgroup_root=str(root / "cgroup"), fdinfo_root=str(root / "proc"))
    drm.start()
    return drm


def test_sample_and_memory_are_every_backends_side_by_side(tmp_path: Path) -> None:
    """Gpus.sample() is the backends' samples merged, NVML's first, and memory() their counters in the same order.
    A second DRM sampler stands in for NVML (Gpus takes any sampler at runtime; the cast is for the type checker)."""
    first, second = started_drm(tmp_path / "a", gpus=1), started_drm(tmp_path / "b", gpus=2)
    gpus = Gpus(nvml=cast(NvmlSampler, first), drm=second)
    sample = gpus.sample()
    assert sample.devices == first.sample().devices + second.sample().devices
    assert gpus.memory() == first.memory() + second.memory()
    assert len(gpus.memory()) == 3


def test_a_single_backend_is_sampled_alone(tmp_path: Path) -> None:
    """With the DRM backend alone, Gpus' sample and memory are that backend's."""
    drm = started_drm(tmp_path / "a", gpus=2)
    gpus = Gpus(drm=drm)
    assert gpus.sample() == drm.sample()
    assert gpus.memory() == drm.memory()
