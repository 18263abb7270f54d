"""A supervisor that respawns GPU workers, as Ray's raylet, vLLM's engine or a torch.multiprocessing launcher do.

The supervisor itself holds no GPU: it forks workers, and each worker opens the device file (as a CUDA process
opens /dev/nvidia0), allocates its memory through the test NVML library (`vgFakeAllocate`, so NVML lists it and
the driver frees it when the worker exits), holds it for `hold_s` and exits. A worker is started whenever fewer
than `max_workers` are alive, at most one per `interval_s`, and not sooner than `respawn_delay_s` after a worker
died. Two shapes the tests use:

- a stream of short workers: ``Supervisor(interval_s=0.02, hold_s=0.1)``, about five alive at any time;
- one long worker, replaced after a pause when it dies: ``Supervisor(max_workers=1, respawn_delay_s=0.8)``.

Start it where the workload lives, e.g. in a container's cgroup::

    sup = Supervisor(lib_dir, device_path, worker_bytes=400 * MiB)
    proc = ctr.spawn(sup.argv(), env=fake_nvml_env(lib_dir, state_path))
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vramguard_testbed.fakenvml import LIBRARY_NAME


@dataclass(frozen=True)
class Supervisor:
    lib_dir: Path
    device_path: Path
    worker_bytes: int
    gpu: int = 0
    interval_s: float = 0.02
    hold_s: float = 0.1
    respawn_delay_s: float = 0.0
    max_workers: int = 1000

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "vramguard_testbed.supervisor",
            str(self.lib_dir / LIBRARY_NAME),
            str(self.device_path),
            str(self.gpu),
            str(self.worker_bytes),
            repr(self.interval_s),
            repr(self.hold_s),
            repr(self.respawn_delay_s),
            str(self.max_workers),
        ]


def _work(allocate: Callable[[int, int], int], device_path: str, gpu: int, nbytes: int, hold_s: float) -> None:
    """A worker (a forked child): hold the device, allocate, keep it for `hold_s`, exit."""
    try:
        os.open(device_path, os.O_RDONLY)  # kept open until exit, as CUDA keeps /dev/nvidia0
        allocate(gpu, nbytes)
        time.sleep(hold_s)
    finally:
        os._exit(0)


def supervise(
    library: str,
    device_path: str,
    gpu: int,
    nbytes: int,
    interval_s: float,
    hold_s: float,
    respawn_delay_s: float,
    max_workers: int,
) -> None:
    lib = ctypes.CDLL(library)
    if lib.nvmlInit_v2() != 0:
        sys.exit("supervisor: nvmlInit_v2 failed")
    allocate = lib.vgFakeAllocate
    allocate.argtypes = (ctypes.c_uint, ctypes.c_ulonglong)
    alive: set[int] = set()
    last_spawn = last_death = float("-inf")
    while True:
        while alive:  # reap, so that a dead worker is no zombie holding its PID
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            alive.discard(pid)
            last_death = time.monotonic()
        now = time.monotonic()
        if len(alive) < max_workers and now - last_spawn >= interval_s and now - last_death >= respawn_delay_s:
            pid = os.fork()
            if pid == 0:
                _work(allocate, device_path, gpu, nbytes, hold_s)
            alive.add(pid)
            last_spawn = now
        time.sleep(0.002)


if __name__ == "__main__":
    library, device, gpu, nbytes, interval, hold, delay, most = sys.argv[1:9]
    supervise(library, device, int(gpu), int(nbytes), float(interval), float(hold), float(delay), int(most))
