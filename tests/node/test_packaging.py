"""What the agent's wheel (and so its image) ships: the agent, not the test bench."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The bench lives in testbed/ and tests/cluster/: none of it may reach the wheel, by name or by content.
BENCH_MODULES = ("controlplane", "cgroups", "fakenvml", "simnode", "demo", "vramguard_testbed")
BENCH_CONTENT = (b"kube-apiserver", b"etcd", b"KubeletCgroups", b"nvmlDeviceGetCount_v2(unsigned")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    # From a copy of the tracked files: an in-tree build would reuse whatever an earlier one left in build/.
    source = tmp_path_factory.mktemp("source")
    for path in _tracked("pyproject.toml", "README.md", "src"):
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / path, source / path)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("vramguard-*.whl")
    return zipfile.ZipFile(built)


def test_wheel_ships_exactly_the_agent_sources(wheel: zipfile.ZipFile) -> None:
    shipped = {n for n in wheel.namelist() if not n.split("/")[0].endswith(".dist-info")}
    assert shipped == {path.removeprefix("src/") for path in _tracked("src/vramguard")}


def test_wheel_carries_no_bench(wheel: zipfile.ZipFile) -> None:
    for name in wheel.namelist():
        assert not name.endswith((".c", ".h", ".so")), name
        assert not any(part in name for part in BENCH_MODULES), name
        if not name.endswith(".py"):
            continue
        data = wheel.read(name)
        for needle in BENCH_CONTENT:
            assert needle not in data, f"{name} contains {needle!r}"


def test_wheel_carries_no_test_doubles(wheel: zipfile.ZipFile) -> None:
    """The fakes of the agent's Protocols and the builders of test data are the test bench's: no `testing`
    package and no `fakes` module ships, and no shipped module defines or imports them."""
    names = wheel.namelist()
    assert not [n for n in names if n.startswith("vramguard/testing/") or n.rsplit("/", 1)[-1] == "fakes.py"]
    for name in names:
        if name.endswith(".py"):
            data = wheel.read(name)
            assert b"class FakeClock" not in data and b".fakes import" not in data, name


def test_wheel_requires_the_nvidia_ml_py_that_binds_the_driver_limits(wheel: zipfile.ZipFile) -> None:
    """The agent asks for the first nvidia-ml-py with nvmlDeviceSetMemoryLimits_v1, so that an install gets the
    driver's limits where the driver has them; and for nothing it does not import (psutil)."""
    (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    requires = [
        line.removeprefix("Requires-Dist: ")
        for line in wheel.read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist: ") and "extra ==" not in line
    ]
    assert "nvidia-ml-py>=13.615.71" in requires, requires
    assert not [r for r in requires if r.startswith("psutil")], requires


def _tracked(*paths: str) -> list[str]:
    return subprocess.run(
        ["git", "ls-files", *paths], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.split()
