"""Fixtures for tests that run the real pynvml over the fake NVML library (vramguard_testbed.fakenvml).

A test module opts in with `pytest_plugins = ["nvml_fixtures"]`. The library is built once per session and
loaded into this process; each test gets its own state file.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from vramguard.nvml import NvmlSampler
from vramguard_testbed.fakenvml import (
    STATE_ENV,
    FakeNvmlBuildError,
    build_fake_nvml,
    load_fake_nvml,
    write_state,
)


@pytest.fixture(scope="session")
def fake_nvml_dir() -> Path:
    """The directory holding the fake libnvidia-ml.so.1, already loaded into this process's pynvml."""
    try:
        lib_dir = build_fake_nvml()
    except FakeNvmlBuildError as e:
        pytest.fail(f"cannot build the fake NVML library: {e}")
    load_fake_nvml(lib_dir)
    return lib_dir


@pytest.fixture
def nvml_state(fake_nvml_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This test's state file: write a FakeNode to it. The fake library reads it on every call."""
    path = tmp_path / "nvml-state"
    monkeypatch.setenv(STATE_ENV, str(path))
    yield path
    # A state without faults releases any call a test left hanging in the fake, so its thread ends.
    write_state(path, "")


@pytest.fixture
def make_sampler(nvml_state: Path) -> Iterator[Callable[..., NvmlSampler]]:
    """Builds NvmlSamplers over this test's state, started, and stops them afterwards."""
    made: list[NvmlSampler] = []

    def make(*, proc_root: str | Path = "/proc", call_timeout_s: float = 2.0) -> NvmlSampler:
        sampler = NvmlSampler(proc_root=proc_root, call_timeout_s=call_timeout_s)
        made.append(sampler)
        sampler.start()
        return sampler

    yield make
    for sampler in made:
        sampler.stop(sampler.clock.now() + 2.0)


@pytest.fixture
def spawn_pids() -> Iterator[Callable[[int], list[int]]]:
    """Starts `n` live processes (sleep) for rows that must pass the adapter's /proc check; kills them after."""
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(n: int) -> list[int]:
        started = [subprocess.Popen(["sleep", "300"]) for _ in range(n)]
        procs.extend(started)
        return [p.pid for p in started]

    yield spawn
    for p in procs:
        p.kill()
        p.wait()


@pytest.fixture
def dead_pid() -> int:
    """The PID of a process that has exited and been reaped."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid
