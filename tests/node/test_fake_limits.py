"""The test NVML's per-cgroup memory limits (nvmlDeviceSetMemoryLimits_v1 / GetMemoryLimits_v1) against what
nvml.h documents, through pynvml's own bindings, on the real cgroup v2 hierarchy; and its simulated allocator,
which a limit stops in the offender only."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from cgroup_fixtures import CgroupsFactory
from vramguard.core.quantity import GiB
from vramguard_testbed.cgroups import KubeletCgroups
from vramguard_testbed.fakenvml import (
    NVML_ERROR_MEMORY,
    Allocator,
    FakeNode,
    MigMode,
    build_fake_nvml,
    driver_limits,
    fake_nvml_env,
    limit_calls,
)

pytest_plugins = ["nvml_fixtures"]

MAX = pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX
TOTAL = 24 * GiB


@pytest.fixture
def v2(make_cgroups: CgroupsFactory) -> KubeletCgroups:
    return make_cgroups(driver="cgroupfs", version=2)


@pytest.fixture
def node(nvml_state: Path) -> Iterator[FakeNode]:
    state = FakeNode.gpus(2, total_bytes=TOTAL, mig_mode=MigMode.ON)
    state.gpu(1).enable_mig(9)
    state.memory_limits = True
    state.allocations = True
    state.write(nvml_state)
    pynvml.nvmlInit()
    yield state
    pynvml.nvmlShutdown()


def set_limit(index: int, path: str | None, soft: int, hard: int, mig: bool = False) -> int:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    if mig:
        handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
    limits = pynvml.c_nvmlSetMemoryLimits_v1_t()
    limits.nameSpace = path.encode() if path is not None else None
    limits.softLimit, limits.hardLimit = soft, hard
    try:
        pynvml.nvmlDeviceSetMemoryLimits_v1(handle, limits)
    except pynvml.NVMLError as e:
        return int(e.value)
    return 0


def get_limit(index: int, path: str) -> tuple[int, int, int] | int:
    limits = pynvml.c_nvmlGetMemoryLimits_v1_t()
    limits.nameSpace = path.encode()
    try:
        pynvml.nvmlDeviceGetMemoryLimits_v1(pynvml.nvmlDeviceGetHandleByIndex(index), limits)
    except pynvml.NVMLError as e:
        return int(e.value)
    return limits.softLimit, limits.hardLimit, limits.currentUsed


@pytest.mark.parametrize(
    ("gpu", "path", "soft", "hard", "mig", "expected"),
    [
        pytest.param(0, "{ctr}", 0, 8 * GiB, False, pynvml.NVML_SUCCESS, id="a container's v2 cgroup"),
        pytest.param(0, "{ctr}", 2 * GiB, 8 * GiB, False, pynvml.NVML_SUCCESS, id="soft and hard"),
        pytest.param(0, "{ctr}", 0, TOTAL, False, pynvml.NVML_SUCCESS, id="hard up to the total"),
        pytest.param(0, "{ctr}", 0, MAX, False, pynvml.NVML_SUCCESS, id="clearing"),
        pytest.param(0, "{ctr}", 9 * GiB, 8 * GiB, False, pynvml.NVML_ERROR_INVALID_ARGUMENT, id="soft above hard"),
        pytest.param(0, "{ctr}", 0, TOTAL + 1, False, pynvml.NVML_ERROR_INVALID_ARGUMENT, id="hard above the total"),
        pytest.param(0, None, 0, 8 * GiB, False, pynvml.NVML_ERROR_INVALID_ARGUMENT, id="no path"),
        pytest.param(
            0, "{ctr}/gone", 0, 8 * GiB, False, pynvml.NVML_ERROR_OPERATING_SYSTEM, id="a path that does not exist"
        ),
        pytest.param(
            0, "/sys/fs/cgroup/pids", 0, 8 * GiB, False, pynvml.NVML_ERROR_OPERATING_SYSTEM, id="a cgroup v1 directory"
        ),
        pytest.param(1, "{ctr}", 0, 1 * GiB, True, pynvml.NVML_ERROR_NOT_SUPPORTED, id="a MIG handle"),
    ],
)
def test_set_checks_what_the_header_documents(
    node: FakeNode,
    nvml_state: Path,
    v2: KubeletCgroups,
    gpu: int,
    path: str | None,
    soft: int,
    hard: int,
    mig: bool,
    expected: int,
) -> None:
    ctr = v2.pod().container()
    target = path.format(ctr=ctr.dirs[0]) if path is not None else None
    assert set_limit(gpu, target, soft, hard, mig) == expected
    (call,) = limit_calls(nvml_state)
    assert (call.verb, call.gpu, call.result) == ("set", gpu, expected)
    held = [(d.soft_bytes, d.hard_bytes) for d in driver_limits(nvml_state)]
    assert held == ([(soft, hard)] if expected == 0 and hard != MAX else [])


def test_get_after_set_and_after_clear(node: FakeNode, nvml_state: Path, v2: KubeletCgroups) -> None:
    path = v2.pod().container().dirs[0]
    assert get_limit(0, path) == pynvml.NVML_ERROR_NOT_FOUND
    assert set_limit(0, path, 0, 8 * GiB) == 0
    assert get_limit(0, path) == (0, 8 * GiB, 0)
    assert get_limit(1, path) == pynvml.NVML_ERROR_NOT_FOUND  # per GPU
    assert set_limit(0, path, 0, 6 * GiB) == 0  # a second Set replaces the first
    assert [d.hard_bytes for d in driver_limits(nvml_state)] == [6 * GiB]
    assert set_limit(0, path, 0, MAX) == 0
    assert get_limit(0, path) == pynvml.NVML_ERROR_NOT_FOUND
    assert [c.verb for c in limit_calls(nvml_state)] == ["get", "set", "get", "get", "set", "set", "get"]


def test_a_driver_without_support_says_not_supported(node: FakeNode, nvml_state: Path, v2: KubeletCgroups) -> None:
    node.memory_limits = False
    node.write(nvml_state)
    path = v2.pod().container().dirs[0]
    assert set_limit(0, path, 0, 8 * GiB) == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert get_limit(0, path) == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_the_offender_runs_out_and_its_neighbour_keeps_its_memory(
    node: FakeNode, nvml_state: Path, fake_nvml_dir: Path, v2: KubeletCgroups
) -> None:
    pod = v2.pod()
    trainer_cg, notebook_cg = pod.container(), v2.pod().container()
    env = fake_nvml_env(fake_nvml_dir, nvml_state)
    io = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True, "env": env}
    trainer = Allocator(trainer_cg.spawn(Allocator.argv(fake_nvml_dir), **io))
    notebook = Allocator(notebook_cg.spawn(Allocator.argv(fake_nvml_dir), **io))
    assert set_limit(0, trainer_cg.dirs[0], 0, 8 * GiB) == 0

    assert notebook.allocate(0, 6 * GiB)
    assert trainer.allocate(0, 5 * GiB)
    assert not trainer.allocate(0, 4 * GiB), "5 + 4 GiB is over the trainer's 8 GiB hard limit"
    assert trainer.allocate(0, 3 * GiB), "up to the limit is fine"
    assert notebook.allocate(0, 6 * GiB), "the neighbour still gets its memory: 12 of 24 GiB"
    # The limit's own accounting counts the trainer's cgroup; the pod above it includes it.
    assert get_limit(0, trainer_cg.dirs[0]) == (0, 8 * GiB, 8 * GiB)
    assert set_limit(0, pod.dirs[0], 0, 7 * GiB) == 0
    assert get_limit(0, pod.dirs[0]) == (0, 7 * GiB, 8 * GiB)
    assert not trainer.allocate(0, 1), "the pod's tighter limit applies too"
    # NVML's process list and memory info count allocations.
    used = {
        p.pid: p.usedGpuMemory
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(0))
    }
    assert used == {trainer.pid: 8 * GiB, notebook.pid: 12 * GiB}


def test_a_pods_limit_bounds_its_containers_and_only_the_leaf_limit_is_reported_inside(
    node: FakeNode, nvml_state: Path, fake_nvml_dir: Path, v2: KubeletCgroups
) -> None:
    """NVIDIA: a limit on a parent cgroup is enforced for everything below it; cuMemGetInfo inside a container
    reports the limit only where the container's own (leaf) cgroup holds it."""
    pod = v2.pod()
    limited, bare = pod.container(), pod.container()
    env = fake_nvml_env(fake_nvml_dir, nvml_state)
    io = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True, "env": env}
    a = Allocator(limited.spawn(Allocator.argv(fake_nvml_dir), **io))
    b = Allocator(bare.spawn(Allocator.argv(fake_nvml_dir), **io))
    assert set_limit(0, pod.dirs[0], 0, 10 * GiB) == 0
    assert set_limit(0, limited.dirs[0], 0, 8 * GiB) == 0

    assert a.memory_info(0) == (8 * GiB, 8 * GiB), "its own cgroup's limit"
    assert b.memory_info(0) == (TOTAL, TOTAL), "a parent's limit is not what cuMemGetInfo shows"
    assert a.allocate(0, 6 * GiB)
    assert a.memory_info(0) == (8 * GiB, 2 * GiB)
    assert not b.allocate(0, 5 * GiB), "6 + 5 GiB is over the pod's 10 GiB: the pod's limit counts both"
    assert b.allocate(0, 4 * GiB)
    assert not a.allocate(0, 1), "the pod is full, though the container's own limit has 2 GiB left"
    assert get_limit(0, pod.dirs[0]) == (0, 10 * GiB, 10 * GiB)
    assert get_limit(0, limited.dirs[0]) == (0, 8 * GiB, 6 * GiB)


def test_each_call_is_logged_with_its_boot_time(node: FakeNode, nvml_state: Path, v2: KubeletCgroups) -> None:
    """The call log places each call on CLOCK_BOOTTIME, the clock of /proc/<pid>/stat's start times."""
    path = v2.pod().container().dirs[0]
    before = time.clock_gettime(time.CLOCK_BOOTTIME)
    assert set_limit(0, path, 0, 8 * GiB) == 0
    after = time.clock_gettime(time.CLOCK_BOOTTIME)
    (call,) = limit_calls(nvml_state)
    assert before <= call.at_s <= after
    assert call.cgroup == path


def test_without_a_limit_the_neighbour_runs_short(
    node: FakeNode, nvml_state: Path, fake_nvml_dir: Path, v2: KubeletCgroups
) -> None:
    env = fake_nvml_env(fake_nvml_dir, nvml_state)
    io = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True, "env": env}
    trainer = Allocator(v2.pod().container().spawn(Allocator.argv(fake_nvml_dir), **io))
    notebook = Allocator(v2.pod().container().spawn(Allocator.argv(fake_nvml_dir), **io))
    assert trainer.allocate(0, 20 * GiB)
    assert not notebook.allocate(0, 6 * GiB), "only 4 GiB left on the GPU"
    assert NVML_ERROR_MEMORY == 20


def test_an_older_driver_has_no_limit_functions(tmp_path: Path) -> None:
    lib_dir = build_fake_nvml(memory_limits=False)
    state = tmp_path / "state"
    FakeNode.gpus(1).write(state)
    script = (
        "import pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
        "try:\n"
        "    pynvml.nvmlDeviceSetMemoryLimits_v1(h, pynvml.c_nvmlSetMemoryLimits_v1_t())\n"
        "except pynvml.NVMLError as e:\n"
        "    print(e.value)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], env=fake_nvml_env(lib_dir, state), capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == str(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
