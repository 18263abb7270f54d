"""The NVML adapter over the real pynvml ctypes code and a fake libnvidia-ml.so.1 built from NVIDIA's nvml.h."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pynvml
import pytest

from vramguard.core.quantity import GiB, MiB
from vramguard.core.sample import GpuProcess, GpuSample, ProcessKind
from vramguard.nvml import (
    STRIDE_R535_BYTES,
    STRIDE_V1_BYTES,
    STRIDE_V2_BYTES,
    NvmlErrorKind,
    NvmlSampler,
    NvmlUnavailable,
    ProcessApi,
    probe_process_api,
)
from vramguard_testbed.fakenvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNKNOWN,
    STATE_ENV,
    FakeNode,
    MigMode,
    fake_nvml_env,
    write_state,
)
from vramguard_testbed.waiting import wait_until

pytest_plugins = ["nvml_fixtures"]

MakeSampler = Callable[..., NvmlSampler]
SpawnPids = Callable[[int], list[int]]
ME = os.getpid()
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25


def rows(sample: GpuSample, uuid: str | None = None) -> set[tuple[int, int | None, ProcessKind]]:
    return {(p.pid, p.used_bytes, p.kind) for p in sample.processes if uuid is None or p.device_uuid == uuid}


# --------------------------------------------------------------------------------------------------------------
# Devices and processes


def test_lists_every_gpu_with_identity_and_memory(nvml_state: Path, make_sampler: MakeSampler) -> None:
    """Every GPU is a healthy device with the UUID, name and v2 memory figures the driver reports."""
    node = FakeNode.gpus(3, total_bytes=40 * GiB, name="NVIDIA A100-SXM4-40GB")
    node.gpu(1).used_bytes = 10 * GiB
    node.gpu(1).reserved_bytes = 1 * GiB
    node.write(nvml_state)

    sample = make_sampler().sample()

    assert [(d.index, d.uuid, d.name, d.mig_index, d.healthy) for d in sample.devices] == [
        (g.index, g.uuid, "NVIDIA A100-SXM4-40GB", None, True) for g in node.gpu_list
    ]
    gpu1 = sample.devices[1]
    assert (gpu1.total_bytes, gpu1.used_bytes, gpu1.free_bytes) == (40 * GiB, 10 * GiB, 29 * GiB)
    assert sample.processes == ()


def test_reads_the_node_again_on_every_sample(nvml_state: Path, make_sampler: MakeSampler) -> None:
    """A rewritten state file shows in the next sample: nothing per-scan is cached."""
    node = FakeNode.gpus(1)
    node.gpu(0).add_process(ME, 1 * GiB)
    node.write(nvml_state)
    sampler = make_sampler()
    assert rows(sampler.sample()) == {(ME, 1 * GiB, ProcessKind.COMPUTE)}

    node.gpu(0).processes.clear()
    node.gpu(0).add_process(ME, 3 * GiB)
    node.write(nvml_state)
    sample = sampler.sample()

    assert rows(sample) == {(ME, 3 * GiB, ProcessKind.COMPUTE)}
    assert sample.devices[0].used_bytes == 3 * GiB


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param(ProcessKind.COMPUTE, id="compute-list"),
        pytest.param(ProcessKind.GRAPHICS, id="graphics-list"),
        pytest.param(ProcessKind.MPS, id="mps-list"),
    ],
)
def test_reports_processes_from_each_list(
    kind: ProcessKind, nvml_state: Path, make_sampler: MakeSampler, spawn_pids: SpawnPids
) -> None:
    """Processes on the compute, graphics and MPS lists are reported with their kind and device."""
    pids = spawn_pids(3)
    node = FakeNode.gpus(2)
    for i, pid in enumerate(pids):
        node.gpu(1).add_process(pid, (i + 1) * 100 * MiB, kind)
    node.write(nvml_state)

    sample = make_sampler().sample()

    assert rows(sample, node.gpu(1).uuid) == {(pid, (i + 1) * 100 * MiB, kind) for i, pid in enumerate(pids)}
    assert rows(sample, node.gpu(0).uuid) == set()


def test_a_process_on_two_lists_of_one_device_counts_once(nvml_state: Path, make_sampler: MakeSampler) -> None:
    """The same PID on two lists of one device is one row (GpuSample's contract): the first list's kind, the
    larger usage, and a known usage wins over an unknown one."""
    node = FakeNode.gpus(3)
    node.gpu(0).add_process(ME, 2 * GiB, ProcessKind.COMPUTE).add_process(ME, 3 * GiB, ProcessKind.GRAPHICS)
    node.gpu(1).add_process(ME, 1 * GiB, ProcessKind.GRAPHICS)
    node.gpu(2).add_process(ME, None, ProcessKind.COMPUTE).add_process(ME, 4 * GiB, ProcessKind.MPS)
    node.write(nvml_state)

    sample = make_sampler().sample()

    assert sorted(sample.processes, key=lambda p: p.device_uuid) == [
        GpuProcess(ME, node.gpu(0).uuid, 3 * GiB, ProcessKind.COMPUTE),
        GpuProcess(ME, node.gpu(1).uuid, 1 * GiB, ProcessKind.GRAPHICS),
        GpuProcess(ME, node.gpu(2).uuid, 4 * GiB, ProcessKind.COMPUTE),
    ]


def test_usage_not_available_stays_none(nvml_state: Path, make_sampler: MakeSampler) -> None:
    """NVML_VALUE_NOT_AVAILABLE usage is reported as None, not as 2**64 - 1, and is not dropped."""
    node = FakeNode.gpus(1)
    node.gpu(0).add_process(ME, None)
    node.write(nvml_state)

    sampler = make_sampler()

    assert rows(sampler.sample()) == {(ME, None, ProcessKind.COMPUTE)}
    assert sampler.dropped_rows == ()


def test_mig_instances_are_devices_with_their_own_memory_and_processes(
    nvml_state: Path, make_sampler: MakeSampler, spawn_pids: SpawnPids
) -> None:
    """Each MIG instance is a device of its own; the MIG-enabled GPU itself carries no processes."""
    a, b = spawn_pids(2)
    node = FakeNode.gpus(2, mig_mode=MigMode.OFF)
    node.gpu(0).add_process(ME, 1 * GiB)
    small, large = node.gpu(1).enable_mig(10 * GiB, 40 * GiB)
    small.add_process(a, 2 * GiB)
    large.add_process(b, 30 * GiB, ProcessKind.GRAPHICS)
    node.write(nvml_state)

    sample = make_sampler().sample()

    parent = node.gpu(1).uuid
    assert [(d.label, d.uuid, d.parent_uuid, d.total_bytes, d.used_bytes) for d in sample.devices] == [
        ("0", node.gpu(0).uuid, None, 80 * GiB, 1 * GiB),
        ("1", parent, None, 80 * GiB, 32 * GiB),
        ("1/mig0", small.uuid, parent, 10 * GiB, 2 * GiB),
        ("1/mig1", large.uuid, parent, 40 * GiB, 30 * GiB),
    ]
    assert sample.devices[2].name == small.name
    assert rows(sample, parent) == set()
    assert rows(sample, small.uuid) == {(a, 2 * GiB, ProcessKind.COMPUTE)}
    assert rows(sample, large.uuid) == {(b, 30 * GiB, ProcessKind.GRAPHICS)}


def test_mig_instances_follow_reconfiguration(nvml_state: Path, make_sampler: MakeSampler) -> None:
    """MIG instances created after the first scan, or MIG turned off, show in the next sample."""
    node = FakeNode.gpus(1, mig_mode=MigMode.OFF)
    node.write(nvml_state)
    sampler = make_sampler()
    assert [d.label for d in sampler.sample().devices] == ["0"]

    node.gpu(0).enable_mig(20 * GiB, 20 * GiB, 20 * GiB)
    node.write(nvml_state)
    assert [d.label for d in sampler.sample().devices] == ["0", "0/mig0", "0/mig1", "0/mig2"]

    node.gpu(0).mig_mode = MigMode.OFF
    node.gpu(0).migs.clear()
    node.write(nvml_state)
    assert [d.label for d in sampler.sample().devices] == ["0"]


# --------------------------------------------------------------------------------------------------------------
# Memory info versions and unsupported lists


@pytest.mark.parametrize(
    ("memory_v2", "v2_error", "used_bytes"),
    [
        pytest.param(True, None, 10 * GiB, id="v2-excludes-reserved"),
        pytest.param(False, None, 12 * GiB, id="v2-function-not-found-falls-back-to-v1"),
        pytest.param(True, NVML_ERROR_NOT_SUPPORTED, 12 * GiB, id="v2-not-supported-falls-back-to-v1"),
        pytest.param(True, NVML_ERROR_ARGUMENT_VERSION_MISMATCH, 12 * GiB, id="v2-version-mismatch-falls-back"),
    ],
)
def test_memory_info_prefers_v2_and_falls_back_to_v1(
    memory_v2: bool, v2_error: int | None, used_bytes: int, nvml_state: Path, make_sampler: MakeSampler
) -> None:
    """Memory comes from nvmlDeviceGetMemoryInfo_v2; a driver without it gets v1, reservation counted as used."""
    node = FakeNode.gpus(1)
    node.gpu(0).used_bytes = 10 * GiB
    node.gpu(0).reserved_bytes = 2 * GiB
    node.memory_v2 = memory_v2
    if v2_error is not None:
        node.inject_error("nvmlDeviceGetMemoryInfo_v2", v2_error)
    node.write(nvml_state)

    device = make_sampler().sample().devices[0]

    assert device.healthy, device.error
    assert (device.total_bytes, device.used_bytes, device.free_bytes) == (80 * GiB, used_bytes, 68 * GiB)


def test_memory_info_v1_fallback_is_remembered(nvml_state: Path, make_sampler: MakeSampler) -> None:
    """Once v2 proved missing, later scans call only v1: a v2 that now fails does not matter."""
    node = FakeNode.gpus(2)
    node.memory_v2 = False
    node.write(nvml_state)
    sampler = make_sampler()
    assert all(d.healthy for d in sampler.sample().devices)

    node.memory_v2 = True
    node.inject_error("nvmlDeviceGetMemoryInfo_v2", NVML_ERROR_GPU_IS_LOST)
    node.write(nvml_state)

    assert all(d.healthy for d in sampler.sample().devices)


@pytest.mark.parametrize(
    "function",
    [
        pytest.param("nvmlDeviceGetComputeRunningProcesses_v3", id="compute"),
        pytest.param("nvmlDeviceGetGraphicsRunningProcesses_v3", id="graphics"),
        pytest.param("nvmlDeviceGetMPSComputeRunningProcesses_v3", id="mps"),
    ],
)
def test_not_supported_process_list_means_no_processes(
    function: str, nvml_state: Path, make_sampler: MakeSampler
) -> None:
    """NVML_ERROR_NOT_SUPPORTED from a process list means none on it; the GPU stays healthy."""
    node = FakeNode.gpus(1)
    for kind in ProcessKind:
        node.gpu(0).add_process(ME, 1 * GiB, kind)
    node.inject_error(function, NVML_ERROR_NOT_SUPPORTED)
    node.write(nvml_state)

    sampler = make_sampler()
    sample = sampler.sample()

    assert sample.devices[0].healthy
    assert len(sample.processes) == 1  # the lists still supported name the process
    assert sampler.errors[NvmlErrorKind.CALL_FAILED] == 0


# --------------------------------------------------------------------------------------------------------------
# Errors, hangs and recovery


@pytest.mark.parametrize(
    ("function", "device"),
    [
        pytest.param("nvmlDeviceGetMemoryInfo_v2", 1, id="memory-info"),
        pytest.param("nvmlDeviceGetComputeRunningProcesses_v3", 1, id="compute-processes"),
        pytest.param("nvmlDeviceGetMPSComputeRunningProcesses_v3", 1, id="mps-processes"),
        pytest.param("*", 1, id="every-call-gpu-lost"),
        pytest.param("nvmlDeviceGetUUID", 1, id="identity-on-first-scan"),
    ],
)
def test_an_error_marks_only_that_gpu_unhealthy(
    function: str, device: int, nvml_state: Path, make_sampler: MakeSampler
) -> None:
    """A failing call makes its GPU unhealthy with the reason and no processes; other GPUs are unaffected."""
    node = FakeNode.gpus(3)
    for gpu in node.gpu_list:
        gpu.add_process(ME, 1 * GiB)
    node.inject_error(function, NVML_ERROR_GPU_IS_LOST, device=device)
    node.write(nvml_state)

    sampler = make_sampler()
    sample = sampler.sample()

    health = {d.index: d.healthy for d in sample.devices}
    assert health == {0: True, 1: False, 2: True}
    bad = sample.devices[1]
    assert bad.error is not None
    assert "NVML_ERROR_GPU_IS_LOST" in bad.error
    assert function in bad.error or function == "*"
    assert {p.device_uuid for p in sample.processes} == {node.gpu(0).uuid, node.gpu(2).uuid}
    assert sampler.errors[NvmlErrorKind.CALL_FAILED] == 1


def test_an_unhealthy_gpu_recovers(nvml_state: Path, make_sampler: MakeSampler) -> None:
    """A GPU whose calls fail is read normally again, processes included, once they succeed."""
    node = FakeNode.gpus(2)
    node.gpu(1).add_process(ME, 5 * GiB)
    node.write(nvml_state)
    sampler = make_sampler()
    first = sampler.sample().devices[1]

    node.inject_error("nvmlDeviceGetComputeRunningProcesses_v3", NVML_ERROR_UNKNOWN, device=1).write(nvml_state)
    failed = sampler.sample()
    node.clear_faults().write(nvml_state)
    recovered = sampler.sample()

    # While unhealthy, the GPU keeps its last good figures and reports no processes.
    assert failed.devices[1] == replace(first, healthy=False, error=failed.devices[1].error)
    assert failed.devices[1].error is not None
    assert rows(failed, first.uuid) == set()
    assert recovered.devices[1] == first
    assert rows(recovered, first.uuid) == {(ME, 5 * GiB, ProcessKind.COMPUTE)}


def test_an_error_in_one_mig_instance_marks_only_that_instance(nvml_state: Path, make_sampler: MakeSampler) -> None:
    """A failing call on one MIG instance leaves its GPU and sibling instances healthy."""
    node = FakeNode.gpus(1, mig_mode=MigMode.OFF)
    first, second = node.gpu(0).enable_mig(10 * GiB, 10 * GiB)
    first.add_process(ME, 1 * GiB)
    second.add_process(ME, 2 * GiB)
    node.inject_error("nvmlDeviceGetComputeRunningProcesses_v3", NVML_ERROR_UNKNOWN, device=(0, 1))
    node.write(nvml_state)

    sample = make_sampler().sample()

    assert [(d.label, d.healthy) for d in sample.devices] == [("0", True), ("0/mig0", True), ("0/mig1", False)]
    assert {p.device_uuid for p in sample.processes} == {first.uuid}


def test_a_hung_call_is_cut_at_the_deadline_and_its_gpu_skipped_until_it_returns(
    nvml_state: Path, make_sampler: MakeSampler
) -> None:
    """A hang costs one deadline, marks only its GPU unhealthy, is not called again while stuck, then recovers."""
    timeout_s = 0.3
    node = FakeNode.gpus(3)
    for gpu in node.gpu_list:
        gpu.add_process(ME, 1 * GiB)
    node.write(nvml_state)
    sampler = make_sampler(call_timeout_s=timeout_s)
    sampler.sample()
    node.hang("nvmlDeviceGetComputeRunningProcesses_v3", 60, device=1).write(nvml_state)

    started = time.monotonic()
    hung = sampler.sample()
    hung_s = time.monotonic() - started
    started = time.monotonic()
    skipped = sampler.sample()
    skipped_s = time.monotonic() - started

    assert timeout_s * 0.9 <= hung_s < timeout_s + 1.5
    assert [d.healthy for d in hung.devices] == [True, False, True]
    assert hung.devices[1].error == "nvmlDeviceGetComputeRunningProcesses_v3 did not return within 0.3s"
    assert {p.device_uuid for p in hung.processes} == {node.gpu(0).uuid, node.gpu(2).uuid}
    # The stuck GPU is skipped, not queued behind its hung call: no wait, no new thread.
    assert skipped_s < timeout_s
    assert [d.healthy for d in skipped.devices] == [True, False, True]
    assert (skipped.devices[1].error or "").startswith("skipped: nvmlDeviceGetComputeRunningProcesses_v3")
    assert sampler.threads_started == 2
    assert (sampler.errors[NvmlErrorKind.TIMEOUT], sampler.errors[NvmlErrorKind.STUCK]) == (1, 1)

    node.clear_faults().write(nvml_state)  # the fake's hung call returns
    wait_until(lambda: all(d.healthy for d in sampler.sample().devices), what="every device healthy again")
    assert len(sampler.sample().processes) == 3


def test_hangs_on_several_gpus_cost_one_deadline_each_at_most(nvml_state: Path, make_sampler: MakeSampler) -> None:
    """Two hung GPUs in one scan are both cut; the healthy ones after them are still read."""
    timeout_s = 0.2
    node = FakeNode.gpus(4)
    for gpu in node.gpu_list:
        gpu.add_process(ME, 1 * GiB)
    node.hang("nvmlDeviceGetMemoryInfo_v2", 60, device=0).hang("nvmlDeviceGetMemoryInfo_v2", 60, device=2)
    node.write(nvml_state)
    sampler = make_sampler(call_timeout_s=timeout_s)

    started = time.monotonic()
    sample = sampler.sample()
    elapsed_s = time.monotonic() - started

    assert elapsed_s < 2 * timeout_s + 1.5
    assert [d.healthy for d in sample.devices] == [False, True, False, True]
    assert {p.device_uuid for p in sample.processes} == {node.gpu(1).uuid, node.gpu(3).uuid}


# --------------------------------------------------------------------------------------------------------------
# The R535 struct layout


@pytest.mark.parametrize(
    ("symbols", "expected"),
    [
        pytest.param({"_v3"}, ProcessApi("_v3", STRIDE_V2_BYTES), id="r510-r530-v3-with-v2-rows"),
        pytest.param({"_v3", "conf"}, ProcessApi("_v3", STRIDE_R535_BYTES), id="r535-v3-with-32-byte-rows"),
        pytest.param({"_v3", "conf", "detail"}, ProcessApi("_v3", STRIDE_V2_BYTES), id="r545-and-later"),
        pytest.param({"_v2"}, ProcessApi("_v2", STRIDE_V2_BYTES), id="r470-v2-only"),
        pytest.param(set(), ProcessApi("", STRIDE_V1_BYTES), id="old-driver-v1-only"),
    ],
)
def test_probe_guesses_row_size_from_driver_symbols(symbols: set[str], expected: ProcessApi) -> None:
    """The driver's exported symbols choose the process functions and the row size to expect first."""
    names = {
        "_v3": "nvmlDeviceGetComputeRunningProcesses_v3",
        "_v2": "nvmlDeviceGetComputeRunningProcesses_v2",
        "conf": "nvmlDeviceGetConfComputeMemSizeInfo",
        "detail": "nvmlDeviceGetRunningProcessDetailList",
    }
    exported = {names[s] for s in symbols}
    assert probe_process_api(exported.__contains__) == expected


@pytest.mark.parametrize(
    ("r535_layout", "stride"),
    [
        pytest.param(False, STRIDE_V2_BYTES, id="current-driver"),
        pytest.param(True, STRIDE_R535_BYTES, id="r535-driver"),
    ],
)
def test_r535_layout_is_detected_and_decoded(
    r535_layout: bool, stride: int, nvml_state: Path, make_sampler: MakeSampler, spawn_pids: SpawnPids
) -> None:
    """With 32-byte rows, pynvml's own decode is garbage from the second row on; the adapter's rows are right."""
    pids = spawn_pids(3)
    node = FakeNode.gpus(1)
    for i, pid in enumerate(pids):
        node.gpu(0).add_process(pid, (i + 1) * GiB)
        node.gpu(0).add_process(pid, (i + 1) * MiB, ProcessKind.MPS)
    node.r535_layout = r535_layout
    node.write(nvml_state)
    expected = [(pid, (i + 1) * GiB) for i, pid in enumerate(pids)]
    sampler = make_sampler()

    naive = [
        (p.pid, p.usedGpuMemory)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(0))
    ]
    sample = sampler.sample()

    assert (naive == expected) is not r535_layout
    if r535_layout:
        # The second row starts inside the first one's 32 bytes: its "pid" is the protected-memory field.
        assert naive[1][0] == 0
    assert sorted((p.pid, p.used_bytes) for p in sample.processes) == sorted(expected)
    assert {p.kind for p in sample.processes} == {ProcessKind.COMPUTE}  # MPS rows of the same PIDs merged
    assert sampler.dropped_rows == ()
    assert sampler.process_info_stride_bytes == stride
    assert sampler.errors[NvmlErrorKind.LAYOUT_MISMATCH] == int(r535_layout)
    sampler.sample()
    assert sampler.errors[NvmlErrorKind.LAYOUT_MISMATCH] == int(r535_layout)  # learnt once


# --------------------------------------------------------------------------------------------------------------
# Sanity checks


@pytest.mark.parametrize(
    ("bad_row", "reason"),
    [
        pytest.param("dead", NvmlErrorKind.DEAD_PID, id="pid-not-in-proc"),
        pytest.param("zero", NvmlErrorKind.INVALID_PID, id="pid-zero"),
        pytest.param("huge", NvmlErrorKind.INVALID_PID, id="pid-above-pid-max"),
        pytest.param("too-much", NvmlErrorKind.USED_EXCEEDS_TOTAL, id="used-above-device-total"),
    ],
)
def test_insane_rows_are_dropped_and_counted(
    bad_row: str, reason: NvmlErrorKind, nvml_state: Path, make_sampler: MakeSampler, dead_pid: int
) -> None:
    """A row with an impossible PID or usage is dropped, listed with its reason and counted; the rest stay."""
    pid, used = {
        "dead": (dead_pid, 1 * GiB),
        "zero": (0, 1 * GiB),
        "huge": (4_194_305, 1 * GiB),
        "too-much": (ME, 81 * GiB),
    }[bad_row]
    node = FakeNode.gpus(1)
    node.gpu(0).add_process(os.getppid(), 2 * GiB).add_process(pid, used, ProcessKind.GRAPHICS)
    node.gpu(0).used_bytes = 3 * GiB
    node.write(nvml_state)
    sampler = make_sampler()

    sample = sampler.sample()

    assert rows(sample) == {(os.getppid(), 2 * GiB, ProcessKind.COMPUTE)}
    assert [(r.pid, r.used_bytes, r.kind, r.reason) for r in sampler.dropped_rows] == [
        (pid, used, ProcessKind.GRAPHICS, reason)
    ]
    assert sampler.errors[reason] == 1
    assert sample.devices[0].healthy
    assert sample.errors == ((reason.value, 1),)
    assert sampler.sample().errors == ((reason.value, 1),)  # counted again: the row is still there
    assert sampler.errors[reason] == 2


def test_a_dead_pids_rows_are_its_exited_memory(nvml_state: Path, make_sampler: MakeSampler, dead_pid: int) -> None:
    """A PID with no process, listed on two lists, is dropped from the processes and given as one exited row with
    its larger usage (memory the driver holds for an exited process); insane rows of other kinds are not."""
    node = FakeNode.gpus(1)
    node.gpu(0).add_process(ME, GiB).add_process(dead_pid, 2 * GiB).add_process(dead_pid, 3 * GiB, ProcessKind.GRAPHICS)
    node.gpu(0).add_process(0, GiB)
    node.gpu(0).used_bytes = 7 * GiB
    node.write(nvml_state)

    sample = make_sampler().sample()

    assert rows(sample) == {(ME, GiB, ProcessKind.COMPUTE)}
    assert [(p.pid, p.used_bytes, p.kind) for p in sample.exited] == [(dead_pid, 3 * GiB, ProcessKind.COMPUTE)]
    assert dict(sample.errors) == {"dead-pid": 2, "invalid-pid": 1}


def test_proc_root_is_where_pids_are_checked(nvml_state: Path, make_sampler: MakeSampler, tmp_path: Path) -> None:
    """PIDs are checked under proc_root (e.g. /host/proc), not the agent's own /proc."""
    proc_root = tmp_path / "proc"
    (proc_root / "4242").mkdir(parents=True)
    node = FakeNode.gpus(1)
    node.gpu(0).add_process(4242, 1 * GiB).add_process(ME, 1 * GiB)
    node.write(nvml_state)
    sampler = make_sampler(proc_root=proc_root)

    assert rows(sampler.sample()) == {(4242, 1 * GiB, ProcessKind.COMPUTE)}
    assert [r.pid for r in sampler.dropped_rows] == [ME]


def test_fake_drops_exited_processes_like_the_driver(
    nvml_state: Path, make_sampler: MakeSampler, spawn_pids: SpawnPids
) -> None:
    """With drop_dead_pids, a killed process leaves the process list (its memory freed), not a dropped row."""
    victim, survivor = spawn_pids(2)
    node = FakeNode.gpus(1)
    node.drop_dead_pids = True
    node.gpu(0).add_process(victim, 4 * GiB).add_process(survivor, 1 * GiB)
    node.write(nvml_state)
    sampler = make_sampler()
    assert {p.pid for p in sampler.sample().processes} == {victim, survivor}

    os.kill(victim, 9)
    wait_until(lambda: {p.pid for p in sampler.sample().processes} == {survivor}, what="only the survivor listed")
    assert sampler.dropped_rows == ()


# --------------------------------------------------------------------------------------------------------------
# NVML unavailable


def test_constructed_idle_started_and_stopped(nvml_state: Path) -> None:
    """The constructor calls nothing and starts no thread; `start()` initialises NVML on the deadline runner's
    thread; `stop(deadline)` shuts NVML down and ends that thread, after which it samples nothing."""
    FakeNode.gpus(1).write(nvml_state)

    def nvml_threads() -> set[threading.Thread]:
        """The live deadline-runner threads: the sets before and after tell this sampler's apart from one that
        another test's sampler left winding down."""
        return {t for t in threading.enumerate() if t.name.startswith("vramguard-nvml") and t.is_alive()}

    before = nvml_threads()
    sampler = NvmlSampler()
    assert (sampler.threads_started, sampler.gpu_count, nvml_threads() - before) == (0, 0, set())
    with pytest.raises(RuntimeError, match="not running"):
        sampler.sample()
    sampler.start()
    assert sampler.gpu_count == 1 and len(sampler.sample().devices) == 1
    (thread,) = nvml_threads() - before
    assert sampler.threads_started == 1
    sampler.stop(sampler.clock.now() + 2.0)
    wait_until(lambda: not thread.is_alive(), 5, "the deadline runner's thread to end")
    assert sampler.memory() == ()
    with pytest.raises(RuntimeError, match="not running"):
        sampler.sample()


@pytest.mark.parametrize(
    ("state", "message"),
    [
        pytest.param(None, "kernel driver is not loaded", id="no-driver"),
        pytest.param(NVML_ERROR_DRIVER_NOT_LOADED, "NVML_ERROR_DRIVER_NOT_LOADED", id="driver-not-loaded"),
        pytest.param(NVML_ERROR_LIB_RM_VERSION_MISMATCH, "differ in version", id="library-driver-mismatch"),
        pytest.param(NVML_ERROR_UNKNOWN, "NVML_ERROR_UNKNOWN", id="unknown-error"),
    ],
)
def test_init_failure_raises_nvml_unavailable(
    state: int | None, message: str, nvml_state: Path, make_sampler: MakeSampler
) -> None:
    """nvmlInit failing raises NvmlUnavailable naming the error and what to check, not a pynvml error."""
    if state is not None:
        node = FakeNode.gpus(1)
        node.init_error = state
        node.write(nvml_state)

    with pytest.raises(NvmlUnavailable, match=message) as raised:
        make_sampler()

    assert raised.value.__cause__ is None
    assert str(raised.value).startswith("NVML is not available: ")


def test_a_hung_init_raises_nvml_unavailable(nvml_state: Path, make_sampler: MakeSampler) -> None:
    """nvmlInit that does not return within the deadline raises NvmlUnavailable instead of blocking the agent."""
    node = FakeNode.gpus(1)
    node.hang("nvmlInitWithFlags", 60)
    node.write(nvml_state)

    started = time.monotonic()
    with pytest.raises(NvmlUnavailable, match=r"did not return within 0\.2s"):
        make_sampler(call_timeout_s=0.2)
    assert time.monotonic() - started < 1.5


def test_a_state_file_that_does_not_parse_fails_init(nvml_state: Path, make_sampler: MakeSampler) -> None:
    """A malformed state makes the fake answer NVML_ERROR_UNKNOWN, so a broken test fixture cannot pass quietly."""
    write_state(nvml_state, "gpu zero\n")

    with pytest.raises(NvmlUnavailable, match="NVML_ERROR_UNKNOWN"):
        make_sampler()


_IN_SUBPROCESS = """
import sys
from vramguard.nvml import NvmlSampler, NvmlUnavailable
sampler = NvmlSampler()
try:
    sampler.start()
except NvmlUnavailable as e:
    print(e)
    sys.exit(3)
print(len(sampler.sample().devices), sampler.driver_version)
sampler.stop(sampler.clock.now() + 2)
"""


def test_missing_library_raises_nvml_unavailable_with_what_to_do(tmp_path: Path) -> None:
    """Without libnvidia-ml.so.1 the sampler raises NvmlUnavailable saying how to provide it, no traceback."""
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("a real libnvidia-ml is installed on this machine, so it cannot be missing")
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path)}
    env.pop(STATE_ENV, None)

    result = subprocess.run(
        [sys.executable, "-c", _IN_SUBPROCESS], env=env, capture_output=True, text=True, timeout=60, check=False
    )

    assert result.returncode == 3, result.stderr
    assert "libnvidia-ml.so.1 was not found" in result.stdout
    assert "LD_LIBRARY_PATH" in result.stdout
    assert "Traceback" not in result.stderr


def test_a_subprocess_loads_the_fake_through_ld_library_path(fake_nvml_dir: Path, tmp_path: Path) -> None:
    """fake_nvml_env() makes a child process's pynvml load the fake, as the demo and end-to-end tests do."""
    state = tmp_path / "state"
    node = FakeNode.gpus(4)
    node.driver_version = "535.54.03"
    node.write(state)

    result = subprocess.run(
        [sys.executable, "-c", _IN_SUBPROCESS],
        env=fake_nvml_env(fake_nvml_dir, state),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == ["4", "535.54.03"]
