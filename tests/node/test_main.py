"""`vramguard version` over the test NVML library: the real pynvml code path prints the driver's and NVML's versions
and whether the driver can hold per-cgroup limits, as that library reports, on the real cgroup v2 hierarchy."""

from __future__ import annotations

import ctypes.util
import json
import shutil
import subprocess
import sys
from importlib.metadata import version as installed
from pathlib import Path

import pytest

from cgroup_fixtures import need_cgroups
from vramguard import __version__
from vramguard.nvml.library import LIBRARY_DIRS, LIBRARY_NAME
from vramguard_testbed.fakenvml import NVML_ERROR_DRIVER_NOT_LOADED, FakeNode, build_fake_nvml, fake_nvml_env

BINDINGS = f"nvidia-ml-py {installed('nvidia-ml-py')} (binds the driver's per-cgroup memory limits)"
R550_NOT_SUPPORTED = "GPU {} does not support memory limits (nvmlDeviceGetMemoryLimits_v1)"


def run_version(lib_dir: Path | None, state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`vramguard version ARGS` in a process of its own whose pynvml loads the test library (`lib_dir`), or finds
    no library at all (None: an empty directory stands for a node without the driver)."""
    env = fake_nvml_env(lib_dir if lib_dir is not None else state.parent, state)
    return subprocess.run(
        [sys.executable, "-m", "vramguard", "version", *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.cgroups
@pytest.mark.parametrize(
    ("symbols", "memory_limits", "driver", "nvml", "limits", "possible", "reason"),
    [
        pytest.param(True, True, "615.40.02", "13.615.40.02", "driver limits: possible", True, "",
                     id="r615-driver-limits-possible"),
        pytest.param(True, False, "550.54.15", "12.550.54.15",
                     f"driver limits: not possible: {R550_NOT_SUPPORTED.format(0)}; {R550_NOT_SUPPORTED.format(1)}",
                     False, f"{R550_NOT_SUPPORTED.format(0)}; {R550_NOT_SUPPORTED.format(1)}",
                     id="gpus-answering-not-supported"),
        pytest.param(False, False, "550.54.15", "12.550.54.15",
                     "driver limits: not possible: the driver has no nvmlDeviceGetMemoryLimits_v1 (it needs R615 or "
                     "later)", False, "the driver has no nvmlDeviceGetMemoryLimits_v1 (it needs R615 or later)",
                     id="a-driver-before-r615-without-the-functions"),
    ],
)  # fmt: skip
def test_version_prints_the_driver_and_whether_it_can_hold_limits(
    tmp_path: Path,
    symbols: bool,
    memory_limits: bool,
    driver: str,
    nvml: str,
    limits: str,
    possible: bool,
    reason: str,
) -> None:
    """Over two GPUs of the test NVML, `version` prints the driver's and NVML's versions and whether per-cgroup
    limits are possible as the library answers for the cgroup v2 root; `--json` says the same; both exit 0."""
    need_cgroups(2)
    lib_dir = build_fake_nvml(memory_limits=symbols)
    node = FakeNode.gpus(2)
    node.memory_limits = memory_limits
    node.driver_version, node.nvml_version = driver, nvml
    state = tmp_path / "state"
    node.write(state)

    text = run_version(lib_dir, state)
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines() == [
        f"vramguard {__version__}",
        BINDINGS,
        f"NVIDIA driver {driver}, NVML {nvml} (loaded from {(lib_dir / LIBRARY_NAME).resolve()})",
        limits,
    ]

    answer = run_version(lib_dir, state, "--json")
    assert answer.returncode == 0, answer.stderr
    doc = json.loads(answer.stdout)
    assert (doc["driver_version"], doc["nvml_version"], doc["nvml_problem"]) == (driver, nvml, "")
    assert (doc["driver_limits_possible"], doc["driver_limits_reason"]) == (possible, reason)


def test_version_on_a_cgroup_v1_root_says_limits_need_cgroup_v2(tmp_path: Path) -> None:
    """Where `--cgroup-root` holds no cgroup v2 hierarchy, an R615 driver cannot hold limits either, and the line
    says why."""
    lib_dir = build_fake_nvml()
    node = FakeNode.gpus(1)
    node.memory_limits = True
    state = tmp_path / "state"
    node.write(state)
    v1_only = tmp_path / "cgroup"
    v1_only.mkdir()

    result = run_version(lib_dir, state, "--cgroup-root", str(v1_only))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[3] == (
        f"driver limits: not possible: no cgroup v2 hierarchy under {v1_only} (the driver's limits need cgroup v2)"
    )


def test_version_where_nvml_cannot_start_says_why_on_one_line_and_exits_0(tmp_path: Path) -> None:
    """A driver that is not loaded (nvmlInit fails): the versions line says why and what to do, on one line; the
    agent's and nvidia-ml-py's versions are still printed, and the command exits 0."""
    lib_dir = build_fake_nvml()
    node = FakeNode.gpus(1)
    node.init_error = NVML_ERROR_DRIVER_NOT_LOADED
    state = tmp_path / "state"
    node.write(state)

    result = run_version(lib_dir, state)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == [f"vramguard {__version__}", BINDINGS] and len(lines) == 4
    assert lines[2].startswith("NVIDIA driver: unknown (NVML is not available: nvmlInit: ")
    assert "the NVIDIA kernel driver is not loaded" in lines[2]
    assert lines[3] == "driver limits: not possible: NVML is not available"


def test_version_without_the_nvml_library_still_prints_and_exits_0(tmp_path: Path) -> None:
    """No libnvidia-ml.so.1 at all (a machine without the driver, as in the image's own test): `--json` is one
    object, exit 0, with null driver versions and why."""
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("a real libnvidia-ml is installed on this machine, so it cannot be missing")
    state = tmp_path / "state"
    FakeNode.gpus(1).write(state)

    result = run_version(None, state, "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert (doc["vramguard"], doc["driver_version"], doc["driver_limits_possible"]) == (__version__, None, False)
    assert "libnvidia-ml.so.1 was not found" in doc["nvml_problem"]


@pytest.mark.parametrize(
    ("layout", "how"),
    [
        pytest.param("usr/lib/x86_64-linux-gnu", "flag", id="ubuntu-layout-by-flag"),
        pytest.param("usr/lib64", "env", id="rhel-layout-by-the-charts-env"),
        pytest.param("lib64", "env", id="gke-layout-by-the-charts-env"),
    ],
)
def test_version_loads_nvml_from_a_driver_root_and_names_the_file(tmp_path: Path, layout: str, how: str) -> None:
    """With the library nowhere on the loader's search path, `--driver-root` (or VRAMGUARD_DRIVER_ROOT, as the
    chart sets it) finds it in the driver's layout under the root, loads that file, and `version` names it."""
    node = FakeNode.gpus(1)
    node.driver_version, node.nvml_version = "580.95.05", "13.580.95.05"
    state = tmp_path / "state"
    node.write(state)
    library = tmp_path / "driver" / layout / LIBRARY_NAME
    library.parent.mkdir(parents=True)
    shutil.copyfile(build_fake_nvml() / LIBRARY_NAME, library)
    env = fake_nvml_env(tmp_path / "nothing-here", state)
    args = ["--driver-root", str(tmp_path / "driver")] if how == "flag" else []
    if how == "env":
        env["VRAMGUARD_DRIVER_ROOT"] = str(tmp_path / "driver")

    result = subprocess.run(
        [sys.executable, "-m", "vramguard", "version", *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[2] == f"NVIDIA driver 580.95.05, NVML 13.580.95.05 (loaded from {library})"


def test_version_with_a_driver_root_without_nvml_says_each_place_it_looked(tmp_path: Path) -> None:
    """A driver root that holds no library: NVML is not up, and why names every layout tried and the chart value
    to set; still exit 0."""
    state = tmp_path / "state"
    FakeNode.gpus(1).write(state)
    root = tmp_path / "driver"
    root.mkdir()
    env = fake_nvml_env(tmp_path / "nothing-here", state)

    result = subprocess.run(
        [sys.executable, "-m", "vramguard", "version", "--json", "--driver-root", str(root)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    problem = json.loads(result.stdout)["nvml_problem"]
    assert f"{LIBRARY_NAME} was not found under the driver root {root}" in problem
    for layout in LIBRARY_DIRS:
        assert f"{root / layout / LIBRARY_NAME}: no such file" in problem
    assert "driver.root" in problem
