"""bench/gpu.py stays runnable without a GPU: over the test NVML library a quick run prints and writes every figure
(the values are for people, not asserted), and its CUDA path runs over a stand-in libcuda.so.1."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cgroup_fixtures import need_cgroups
from vramguard.core.quantity import GiB
from vramguard_testbed.fakenvml import STATE_ENV, FakeNode, MigMode, build_fake_nvml

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu.py"


def _figures(section: dict[str, float | None]) -> list[float | None]:
    return [section["median"], section["p95"], section["max"]]


def test_fake_nvml_quick_run_prints_and_writes_every_figure(tmp_path: Path) -> None:
    """--fake-nvml --quick: the scan-cost rows at 32 and 96 processes, both reaction rows and both teardown rows
    are printed with numbers, and the JSON holds each of them."""
    need_cgroups(2)
    figures = tmp_path / "gpu.json"
    result = subprocess.run(
        [sys.executable, str(BENCH), "--fake-nvml", "--quick", "--json", str(figures)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = [line.split() for line in result.stdout.splitlines() if line.strip()]
    first_line = result.stdout.splitlines()[0]
    assert "driver 550.54.15" in first_line and "NVML 12.550.54.15" in first_line, first_line

    scan_rows = {row[0]: row for row in rows if row[0] in ("32", "96")}
    assert set(scan_rows) == {"32", "96"}, result.stdout
    for n, row in scan_rows.items():
        assert len(row) == 15 and "-" not in row, row  # every NVML call the fake GPU has, and each figure
        assert row[13] == f"{n}/{n}", row  # every GPU process attributed to its pod
        assert row[10].endswith("x") and row[12].endswith("x"), row
    reaction = {" ".join(row[:3]): row[3:] for row in rows if row[0] == "crossing"}
    assert set(reaction) == {"crossing -> dead", "crossing -> released"}, result.stdout
    assert all("-" not in cells and cells[-1] == "3/3" for cells in reaction.values()), reaction
    teardown = {row[0]: row[2:] for row in rows if row[1:2] == ["GiB"]}
    assert set(teardown) == {"1", "20"}, result.stdout
    assert all(len(cells) == 4 and "-" not in cells for cells in teardown.values()), teardown

    data = json.loads(figures.read_text())
    assert data["mode"] == "fake-nvml" and not data["failed"] and not data["notes"]
    assert [c["processes"] for c in data["scan_cost"]] == [32, 96]
    for c in data["scan_cost"]:
        numbers = [c["raw_nvml_ms"], c["sample_ms"], c["scan_ms"], c["agent_ms_per_scan"], c["agent_scan_ms"]]
        assert all(v > 0 for v in numbers) and c["rest_millicores"] >= 0, c  # at rest, 2 s may be under a tick
    assert all(v is not None for v in _figures(data["reaction"]["dead_ms"]) + _figures(data["reaction"]["released_ms"]))
    assert [t["held_bytes"] for t in data["teardown"]] == [2**30, 20 * 2**30]
    assert all(v is not None for t in data["teardown"] for v in _figures(t["dead_ms"]) + _figures(t["released_ms"]))


# libcuda.so.1's five functions the benchmark's GPU process calls, over the test NVML library: a context holds
# 512 MiB and an allocation is the library's vgFakeAllocate, so NVML lists the process with what it holds.
STAND_IN_CUDA = r"""
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
static int (*fake_alloc)(unsigned int, unsigned long long);
int cuInit(unsigned int flags) {
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    int (*init)(void) = nvml ? (int (*)(void))dlsym(nvml, "nvmlInit_v2") : 0;
    fake_alloc = nvml ? (int (*)(unsigned int, unsigned long long))dlsym(nvml, "vgFakeAllocate") : 0;
    return init && fake_alloc && flags == 0 ? init() : 3;
}
int cuDeviceGet(int *device, int ordinal) { *device = ordinal; return 0; }
int cuDevicePrimaryCtxRetain(void **ctx, int device) {
    *ctx = (void *)1;
    return fake_alloc(device, 512ull << 20) ? 2 : 0;
}
int cuCtxSetCurrent(void *ctx) { return ctx == (void *)1 ? 0 : 201; }
int cuMemAlloc_v2(uint64_t *pointer, size_t bytes) { *pointer = 1; return fake_alloc(0, bytes) ? 2 : 0; }
"""


def test_cuda_path_runs_over_a_stand_in_driver(tmp_path: Path) -> None:
    """Without --fake-nvml, the GPU processes go through libcuda.so.1's driver API and the agent and the benchmark
    read the machine's NVML: over a stand-in libcuda and the test NVML library, each part prints its figures."""
    need_cgroups(2)
    compiler = shutil.which(os.environ.get("CC", "cc"))
    assert compiler is not None, "the test NVML library's build needs a C compiler too"
    library = str(tmp_path / "libcuda.so.1")
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-o", library, "-x", "c", "-", "-ldl"],
        input=STAND_IN_CUDA,
        text=True,
        check=True,
    )
    node = FakeNode.gpus(1, total_bytes=80 * GiB, name="Stand-in GPU", mig_mode=MigMode.OFF)
    node.allocations = node.drop_dead_pids = True
    node.write(tmp_path / "nvml-state")
    env = dict(os.environ, LD_LIBRARY_PATH=f"{tmp_path}:{build_fake_nvml()}")
    env[STATE_ENV] = str(tmp_path / "nvml-state")
    args = ["--quick", "--processes", "4,8", "--trials", "2", "--held", "1", "--json", str(tmp_path / "gpu.json")]
    result = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "GPU processes: CUDA driver API (ctypes)" in result.stdout.splitlines()[0], result.stdout
    data = json.loads((tmp_path / "gpu.json").read_text())
    assert data["mode"] == "cuda" and data["context_bytes"] == 512 * 2**20 and not data["failed"]
    assert [(c["processes"], c["attributed"]) for c in data["scan_cost"]] == [(4, 4), (8, 8)]
    assert all(v is not None for v in _figures(data["reaction"]["dead_ms"]) + _figures(data["reaction"]["released_ms"]))
    assert [t["held_bytes"] for t in data["teardown"]] == [2**30]
