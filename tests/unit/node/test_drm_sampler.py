"""The DRM sampler over stand-in trees in tmp_path: a /sys with amdgpu GPUs (the testbed's `DrmStandIn`), an xe GPU
sized by the dmem controller and GPUs it does not watch, a cgroup v2 root with the kubelet's pod cgroups listing
fictitious PIDs, and their fd/fdinfo. No real process, GPU or cgroup: which GPUs are watched, how each is sized
and labelled, whose memory is read (pod processes only, each client once) and what an unreadable counter does are
all decided from these files, so they are tested here rather than only end to end."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vramguard.core.quantity import GiB, MiB
from vramguard.core.sample import DRM_INDEX_BASE, GpuBackend, GpuMemory, GpuProcess
from vramguard.node.drm_sampler import DrmSampler, DrmUnavailable, ParseMemo
from vramguard_testbed.drmnode import MI300X_NAME, MI300X_VRAM_BYTES, DrmStandIn, amdgpu_fdinfo

AMD0 = "0000:c1:00.0"  # DrmStandIn's first GPU
AMD1 = "0000:d1:00.0"  # and its second
XE = "0000:03:00.0"  # sorts before both: the first DRM index
I915 = "0000:04:00.0"
NOUVEAU = "0000:05:00.0"
BASELINE = 256 * MiB  # what DrmStandIn's GPUs hold with no process

POD_A = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
POD_B = "11111111-2222-3333-4444-555555555555"
CONTAINER_A = "a" * 64
CONTAINER_B = "b" * 64


# -- the stand-in trees ----------------------------------------------------------------------------------------------


def write_gpu(
    sys_root: Path, slot: str, driver: str, nodes: dict[str, int], files: dict[str, str] | None = None
) -> Path:
    """A PCI GPU under `sys_root` bound to `driver`, with DRM nodes (name -> minor) and sysfs `files`."""
    device = sys_root / "devices" / "pci0000:00" / slot
    device.mkdir(parents=True, exist_ok=True)
    (device / "uevent").write_text(f"DRIVER={driver}\nPCI_SLOT_NAME={slot}\n")
    for name, text in (files or {}).items():
        (device / name).write_text(text)
    drivers = sys_root / "bus" / "pci" / "drivers" / driver
    drivers.mkdir(parents=True, exist_ok=True)
    (device / "driver").symlink_to(os.path.relpath(drivers, device))
    for name, minor in nodes.items():
        entry = sys_root / "class" / "drm" / name
        entry.mkdir(parents=True)
        (entry / "dev").write_text(f"226:{minor}\n")
        (entry / "device").symlink_to(os.path.relpath(device, entry))
    return device


def write_xe(sys_root: Path) -> None:
    """An Intel GPU on xe: no mem_info_* files, its size only in dmem.capacity."""
    write_gpu(sys_root, XE, "xe", {"card3": 3, "renderD130": 130}, {"vendor": "0x8086\n"})


def write_unwatched(sys_root: Path) -> None:
    """An i915 GPU (memory stats, but neither sysfs nor dmem give its size) and one on nouveau (no memory stats)."""
    write_gpu(sys_root, I915, "i915", {"card4": 4, "renderD131": 131}, {"vendor": "0x8086\n"})
    write_gpu(sys_root, NOUVEAU, "nouveau", {"card5": 5, "renderD132": 132}, {"vendor": "0x10de\n"})


def systemd_pod(uid: str, qos: str = "burstable") -> str:
    """A pod's cgroup under the kubelet's systemd layout, from the hierarchy's root."""
    escaped = uid.replace("-", "_")
    if qos == "guaranteed":
        return f"kubepods.slice/kubepods-pod{escaped}.slice"
    return f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{escaped}.slice"


def write_cgroups(root: Path, procs: dict[str, list[int]], dmem: dict[str, str] | None = None) -> Path:
    """A cgroup v2 root: `procs` maps a cgroup (from the root) to the PIDs its cgroup.procs lists; `dmem` the
    root's dmem files (name -> text). Every cgroup above one has its cgroup.procs too, empty, as in cgroupfs."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpu memory pids dmem\n")
    for name, text in (dmem or {}).items():
        (root / name).write_text(text)
    for cgroup, pids in procs.items():
        directory = root / cgroup
        directory.mkdir(parents=True, exist_ok=True)
        for above in directory.relative_to(root).parents:
            (root / above / "cgroup.procs").touch()
        (directory / "cgroup.procs").write_text("".join(f"{pid}\n" for pid in pids))
    return root


def open_drm_file(fdinfo_root: Path, pid: int, fd: int, render: str, fdinfo: str) -> None:
    """`pid` holds a DRM file open on `fd` (a link to /dev/dri/`render`) whose fdinfo is `fdinfo`."""
    (fdinfo_root / str(pid) / "fd").mkdir(parents=True, exist_ok=True)
    (fdinfo_root / str(pid) / "fdinfo").mkdir(parents=True, exist_ok=True)
    (fdinfo_root / str(pid) / "fd" / str(fd)).symlink_to(f"/dev/dri/{render}")
    (fdinfo_root / str(pid) / "fdinfo" / str(fd)).write_text(fdinfo)


def xe_fdinfo(slot: str, client_id: int, vram0: int, vram1: int) -> str:
    """An xe render-node fd's fdinfo: resident bytes per tile."""
    return (
        f"pos:\t0\nflags:\t02100002\ndrm-driver:\txe\ndrm-client-id:\t{client_id}\ndrm-pdev:\t{slot}\n"
        f"drm-total-system:\t0\ndrm-resident-system:\t0\n"
        f"drm-total-vram0:\t{vram0}\ndrm-resident-vram0:\t{vram0}\ndrm-total-vram1:\t{vram1}\ndrm-resident-vram1:\t{vram1}\n"
    )


def pod_container(uid: str, container: str, qos: str = "burstable") -> str:
    return f"{systemd_pod(uid, qos)}/cri-containerd-{container}.scope"


def sampler(stand_in: DrmStandIn, cgroup_root: Path) -> DrmSampler:
    return DrmSampler(
        proc_root="/proc",
        sys_root=str(stand_in.sys_root),
        cgroup_root=str(cgroup_root),
        fdinfo_root=str(stand_in.fdinfo_root),
    )


def started(stand_in: DrmStandIn, cgroup_root: Path) -> DrmSampler:
    found = sampler(stand_in, cgroup_root)
    found.start()
    return found


XE_DMEM = {
    "dmem.capacity": f"drm/{XE}/vram0 {8 * GiB}\ndrm/{XE}/vram1 {8 * GiB}\ndrm/{XE}/stolen {64 * MiB}\n",
    "dmem.current": f"drm/{XE}/vram0 {3 * GiB}\ndrm/{XE}/vram1 {GiB}\ndrm/{XE}/stolen {MiB}\n",
}


# -- which GPUs are watched -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "said"),
    [
        pytest.param({}, "no DRM GPU", id="no-drm-gpu"),
        pytest.param({NOUVEAU: "nouveau"}, "GPUs with drivers nouveau", id="driver-without-memory-stats"),
        pytest.param({I915: "i915"}, "GPUs with drivers i915", id="memory-stats-but-no-size"),
        pytest.param(
            {I915: "i915", NOUVEAU: "nouveau"}, "GPUs with drivers i915, nouveau", id="every-driver-named-sorted"
        ),
    ],
)
def test_start_with_no_drm_gpu_to_watch_says_what_it_found(tmp_path: Path, gpus: dict[str, str], said: str) -> None:
    """start() raises DrmUnavailable naming the drivers it found (or that there is no DRM GPU) and where it looked."""
    sys_root = tmp_path / "sys"
    sys_root.mkdir()
    for minor, (slot, driver) in enumerate(gpus.items()):
        write_gpu(sys_root, slot, driver, {f"card{minor}": minor})
    drm = DrmSampler(sys_root=str(sys_root), cgroup_root=str(write_cgroups(tmp_path / "cgroup", {})))
    with pytest.raises(DrmUnavailable) as raised:
        drm.start()
    assert said in str(raised.value)
    assert f"{sys_root}/class/drm" in str(raised.value)
    assert drm.devices == ()


def test_gpus_whose_driver_prints_no_memory_stats_or_no_size_are_not_watched(tmp_path: Path) -> None:
    """Next to amdgpu GPUs, an i915 GPU with no known size and a nouveau GPU are left out of the devices."""
    stand_in = DrmStandIn(tmp_path / "drm", gpus=2)
    write_unwatched(stand_in.sys_root)
    drm = started(stand_in, write_cgroups(tmp_path / "cgroup", {}))
    assert [d.gpu.pci_slot for d in drm.devices] == [AMD0, AMD1]
    assert [d.label for d in drm.sample().devices] == [AMD0, AMD1]


def test_an_xe_gpu_is_sized_from_dmem_capacity_and_used_from_dmem_current(tmp_path: Path) -> None:
    """xe prints no mem_info_*: its size is its vram0 and vram1 regions summed from dmem.capacity (not the stolen
    one), its used memory theirs from the root's dmem.current, and it is named after its driver and slot."""
    stand_in = DrmStandIn(tmp_path / "drm", gpus=1)
    write_xe(stand_in.sys_root)
    drm = started(stand_in, write_cgroups(tmp_path / "cgroup", {}, XE_DMEM))
    xe = drm.devices[0]
    assert (xe.gpu.pci_slot, xe.total_bytes, xe.dmem_regions) == (
        XE,
        16 * GiB,
        (f"drm/{XE}/vram0", f"drm/{XE}/vram1"),
    )
    device = drm.sample().devices[0]
    assert (device.label, device.uuid, device.name) == (XE, XE, f"xe GPU {XE}")
    assert (device.total_bytes, device.used_bytes, device.free_bytes) == (16 * GiB, 4 * GiB, 12 * GiB)
    assert device.healthy
    assert drm.memory()[0] == GpuMemory(DRM_INDEX_BASE, 16 * GiB, 4 * GiB, 12 * GiB)


def test_an_xe_gpu_whose_region_is_missing_from_dmem_current_is_unhealthy(tmp_path: Path) -> None:
    """One region's charge missing from dmem.current: the used memory is not known, so the GPU is unhealthy and
    left out of memory()."""
    stand_in = DrmStandIn(tmp_path / "drm", gpus=1)
    write_xe(stand_in.sys_root)
    dmem = {**XE_DMEM, "dmem.current": f"drm/{XE}/vram0 {3 * GiB}\n"}
    drm = started(stand_in, write_cgroups(tmp_path / "cgroup", {}, dmem))
    xe = drm.sample().devices[0]
    assert not xe.healthy and xe.error == f"cannot read the memory used on {XE}"
    assert [m.index for m in drm.memory()] == [DRM_INDEX_BASE + 1]


# -- sample(): the devices --------------------------------------------------------------------------------------------


def test_sample_labels_each_gpu_by_its_pci_slot(tmp_path: Path) -> None:
    """Each watched GPU is a DRM GpuDevice labelled by its PCI slot, its uuid the unique_id where it has one (else
    the slot), its index DRM_INDEX_BASE plus its place in slot order, used bytes from mem_info_vram_used."""
    stand_in = DrmStandIn(tmp_path / "drm", gpus=2)
    write_xe(stand_in.sys_root)
    write_unwatched(stand_in.sys_root)
    drm = started(stand_in, write_cgroups(tmp_path / "cgroup", {}, XE_DMEM))
    stand_in.set_usage(4001, 3 * GiB, gpu=1)  # not in a pod: only the GPU's counter moves
    devices = drm.sample().devices
    assert [(d.label, d.uuid, d.index, d.backend, d.pci_slot) for d in devices] == [
        (XE, XE, DRM_INDEX_BASE, GpuBackend.DRM, XE),
        (AMD0, stand_in.gpus[0].unique_id, DRM_INDEX_BASE + 1, GpuBackend.DRM, AMD0),
        (AMD1, stand_in.gpus[1].unique_id, DRM_INDEX_BASE + 2, GpuBackend.DRM, AMD1),
    ]
    amd0, amd1 = devices[1:]
    assert (amd0.name, amd0.total_bytes, amd0.used_bytes) == (MI300X_NAME, MI300X_VRAM_BYTES, BASELINE)
    assert (amd1.used_bytes, amd1.free_bytes) == (BASELINE + 3 * GiB, MI300X_VRAM_BYTES - BASELINE - 3 * GiB)
    assert all(d.healthy and d.error is None and d.mig_index is None for d in devices)


def test_memory_gives_each_gpus_counters(tmp_path: Path) -> None:
    """memory() is one GpuMemory per watched GPU, re-read on each call."""
    stand_in = DrmStandIn(tmp_path / "drm", gpus=2)
    drm = started(stand_in, write_cgroups(tmp_path / "cgroup", {}))
    total = MI300X_VRAM_BYTES
    assert drm.memory() == (
        GpuMemory(DRM_INDEX_BASE, total, BASELINE, total - BASELINE),
        GpuMemory(DRM_INDEX_BASE + 1, total, BASELINE, total - BASELINE),
    )
    stand_in.set_usage(4001, GiB, gpu=0)
    assert drm.memory()[0] == GpuMemory(DRM_INDEX_BASE, total, BASELINE + GiB, total - BASELINE - GiB)


@pytest.mark.parametrize(
    ("index", "slot"),
    [
        pytest.param(DRM_INDEX_BASE, AMD0, id="first-drm-gpu"),
        pytest.param(DRM_INDEX_BASE + 1, AMD1, id="second-drm-gpu"),
        pytest.param(DRM_INDEX_BASE + 2, None, id="past-the-last"),
        pytest.param(0, None, id="nvml-index"),
        pytest.param(DRM_INDEX_BASE - 1, None, id="last-nvml-index"),
    ],
)
def test_slot_of_maps_a_drm_index_back_to_its_slot(tmp_path: Path, index: int, slot: str | None) -> None:
    """slot_of(index) is the PCI slot of this sampler's GPU with that index; None for any other index."""
    drm = started(DrmStandIn(tmp_path / "drm", gpus=2), write_cgroups(tmp_path / "cgroup", {}))
    assert drm.slot_of(index) == slot


def test_slot_of_before_start_is_none() -> None:
    """An idle sampler has no GPUs: no index is its."""
    assert DrmSampler().slot_of(DRM_INDEX_BASE) is None


# -- sample(): the processes ------------------------------------------------------------------------------------------


def test_sample_reads_the_pod_processes_memory_and_no_other_process(tmp_path: Path) -> None:
    """Processes in pod cgroups (burstable and guaranteed, in the container's and the pod's own cgroup) are
    charged their resident VRAM on each GPU; a PID outside any pod cgroup is not read though it has fdinfo."""
    stand_in = DrmStandIn(tmp_path / "drm", gpus=2)
    write_xe(stand_in.sys_root)
    procs = {
        pod_container(POD_A, CONTAINER_A): [4001, 4002],
        systemd_pod(POD_A): [4003],
        pod_container(POD_B, CONTAINER_B, "guaranteed"): [4004],
        "system.slice/containerd.service": [4100],
        "user.slice/user-0.slice": [4101],
    }
    drm = started(stand_in, write_cgroups(tmp_path / "cgroup", procs, XE_DMEM))
    stand_in.set_usage(4001, 2 * GiB, gpu=0)
    stand_in.set_usage(4002, 3 * GiB, gpu=1)
    stand_in.set_usage(4003, 5 * MiB, gpu=0)
    open_drm_file(stand_in.fdinfo_root, 4004, 7, "renderD130", xe_fdinfo(XE, 9, 2 * GiB, GiB))
    stand_in.set_usage(4100, 7 * GiB, gpu=0)
    open_drm_file(stand_in.fdinfo_root, 4101, 3, "renderD130", xe_fdinfo(XE, 10, GiB, 0))
    amd0, amd1 = (g.unique_id for g in stand_in.gpus)
    assert sorted(drm.sample().processes) == [
        GpuProcess(4001, amd0, 2 * GiB),
        GpuProcess(4002, amd1, 3 * GiB),
        GpuProcess(4003, amd0, 5 * MiB),
        GpuProcess(4004, XE, 3 * GiB),
    ]


def test_a_client_shared_by_two_pids_is_charged_once_to_the_lower(tmp_path: Path) -> None:
    """Two PIDs holding one DRM file (the same drm-client-id on the same pdev) are one client: its memory is
    charged once, to the lower PID, whichever order the cgroup lists them in."""
    stand_in = DrmStandIn(tmp_path / "drm", gpus=1)
    drm = started(stand_in, write_cgroups(tmp_path / "cgroup", {pod_container(POD_A, CONTAINER_A): [4020, 4010]}))
    for pid in (4010, 4020):
        open_drm_file(stand_in.fdinfo_root, pid, 5, "renderD128", amdgpu_fdinfo(AMD0, 300, 4 * GiB))
    open_drm_file(stand_in.fdinfo_root, 4020, 6, "renderD128", amdgpu_fdinfo(AMD0, 301, GiB))
    unique_id = stand_in.gpus[0].unique_id
    assert sorted(drm.sample().processes) == [GpuProcess(4010, unique_id, 4 * GiB), GpuProcess(4020, unique_id, GiB)]


def test_memory_on_a_gpu_that_is_not_watched_is_not_charged(tmp_path: Path) -> None:
    """A pod process's fd on the i915 GPU (not watched) is charged to no device; its amdgpu fd still is."""
    stand_in = DrmStandIn(tmp_path / "drm", gpus=1)
    write_unwatched(stand_in.sys_root)
    drm = started(stand_in, write_cgroups(tmp_path / "cgroup", {pod_container(POD_A, CONTAINER_A): [4001]}))
    stand_in.set_usage(4001, GiB, gpu=0)
    i915 = f"drm-driver:\ti915\ndrm-client-id:\t4\ndrm-pdev:\t{I915}\ndrm-resident-local0:\t{GiB}\n"
    open_drm_file(stand_in.fdinfo_root, 4001, 9, "renderD131", i915)
    assert drm.sample().processes == (GpuProcess(4001, stand_in.gpus[0].unique_id, GiB),)


def test_without_a_cgroup_hierarchy_the_devices_are_sampled_with_no_process(tmp_path: Path) -> None:
    """A cgroup root with neither a v2 nor a v1 hierarchy: no pod process is found, the GPUs are still sampled."""
    stand_in = DrmStandIn(tmp_path / "drm", gpus=1)
    stand_in.set_usage(4001, GiB, gpu=0)
    (tmp_path / "empty").mkdir()
    sample = started(stand_in, tmp_path / "empty").sample()
    assert sample.processes == ()
    assert [(d.healthy, d.used_bytes) for d in sample.devices] == [(True, BASELINE + GiB)]


@pytest.mark.parametrize(
    "unreadable",
    [
        pytest.param("missing", id="file-gone"),
        pytest.param("not a number\n", id="not-a-number"),
        pytest.param("", id="empty"),
    ],
)
def test_an_unreadable_used_counter_makes_the_gpu_unhealthy(tmp_path: Path, unreadable: str) -> None:
    """mem_info_vram_used that does not read: that GPU is unhealthy with an error saying so, its used bytes the
    pods' sum, its processes left out of the sample and itself out of memory(); the other GPU is as before."""
    stand_in = DrmStandIn(tmp_path / "drm", gpus=2)
    procs = {pod_container(POD_A, CONTAINER_A): [4001, 4002]}
    drm = started(stand_in, write_cgroups(tmp_path / "cgroup", procs))
    stand_in.set_usage(4001, 2 * GiB, gpu=0)
    stand_in.set_usage(4002, 3 * GiB, gpu=1)
    used = stand_in.sys_root / "devices" / "pci0000:00" / AMD0 / "mem_info_vram_used"
    if unreadable == "missing":
        used.unlink()
    else:
        used.write_text(unreadable)
    sample = drm.sample()
    broken, fine = sample.devices
    assert (broken.healthy, broken.error) == (False, f"cannot read the memory used on {AMD0}")
    assert (broken.used_bytes, broken.free_bytes) == (2 * GiB, MI300X_VRAM_BYTES - 2 * GiB)
    assert (fine.healthy, fine.used_bytes) == (True, BASELINE + 3 * GiB)
    assert sample.processes == (GpuProcess(4002, stand_in.gpus[1].unique_id, 3 * GiB),)
    assert [m.index for m in drm.memory()] == [DRM_INDEX_BASE + 1]


def test_the_parse_memo_parses_a_text_once_while_it_stays_the_same() -> None:
    """A text read the same as in the sample before is not parsed again (its result is the very object); a changed
    text is parsed; a text no sample has read for two samples is forgotten."""
    memo = ParseMemo()
    idle = amdgpu_fdinfo("0000:c1:00.0", 7, GiB).encode()
    first = memo(idle)
    memo.turn()
    assert memo(idle) is first
    busy = amdgpu_fdinfo("0000:c1:00.0", 7, GiB + 4096).encode()
    assert memo(busy) is not first and memo(busy).device_resident_bytes == GiB + 4096
    memo.turn()
    memo.turn()
    assert memo(idle) is not first and memo(idle) == first
