"""Benchmark: what one DRM sample costs (`DrmSampler.sample()`: the pod cgroups' members, each one's fd table, the
fdinfo of its render-node fd, parsed and counted), and what a tenant's fd table can add to it. Run as root.

    sudo .venv/bin/python bench/drm_scan.py            # 100 samples per row
    sudo .venv/bin/python bench/drm_scan.py --quick    # a smoke run: 8 GPUs x 16 processes, 10 samples a row

Real processes in real kubelet-shaped cgroups (8 GPUs x 64 processes, 8 to a pod, as bench/scan.py's 8x64), with
the stand-in /sys and fdinfo of `drmnode.DrmStandIn` (amdgpu's Linux 7.x text); each process's stand-in fd table
holds `--fds` entries besides its render node (sockets, pipes, files: what a PyTorch process has open). Rows:

- `8x64`: the warm sample, wall and CPU time, median and p99, every text as the last sample read it (idle processes:
  nothing parsed again);
- `8x64 busy`: every process's text changed before each sample (a busy process's engine times do): all parsed;
- `8x64 + fat`: the same with one more pod process whose fd table has 100,000 entries (RLIMIT_NOFILE is often 2^20
  in a container): the per-process and per-scan bounds (`drm.FdScanLimits`) cap what it adds;
- `1x1`: one process, for the fixed cost.

Figures and ratios are printed side by side from one run; nothing is asserted (tests/node/test_bench.py runs it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from vramguard.core.quantity import MiB
from vramguard.node.cgroup import HOST_KUBELET
from vramguard.node.drm_sampler import DrmSampler
from vramguard_testbed.cgroups import cgroups_unavailable
from vramguard_testbed.simnode import SimProcess, SimulatedNode

FAT_FDS = 100_000


def build(workdir: Path, gpus: int, per_gpu: int, fds: int) -> SimulatedNode:
    """`gpus` AMD GPUs with `per_gpu` pod processes each (pods of 8), every one with `fds` other fds in its stand-in
    fd table and its render-node fd."""
    node = SimulatedNode(workdir, amd_gpus=gpus)
    assert node.drm is not None
    pod = None
    for i in range(gpus * per_gpu):
        if i % 8 == 0:
            pod = node.add_pod(f"job-{i // 8}", "bench", containers={"main": {"vramguard.io/vram": "1Gi"}})
        assert pod is not None
        popen = pod.containers["main"].spawn(["sleep", "3600"])
        node.processes.append(SimProcess(popen=popen, gpu=i % gpus, used_bytes=64 * MiB, pod=pod, container="main"))
    node.sync()
    for proc in node.processes:
        other_fds(node.drm.fdinfo_root / str(proc.pid) / "fd", fds)
    return node


def other_fds(fd_dir: Path, count: int) -> None:
    """`count` fd links that are not DRM nodes, numbered after the stand-in's render fd (5)."""
    targets = ("socket:[40961]", "pipe:[40962]", "anon_inode:[eventfd]", "/usr/lib/python3/dist-packages/x.so")
    for n in range(count):
        os.symlink(targets[n % len(targets)], fd_dir / str(10 + n))


def add_fat(node: SimulatedNode) -> None:
    """One more pod process whose fd table has FAT_FDS entries and its render node at the end of it."""
    assert node.drm is not None
    pod = node.add_pod("fat", "bench", containers={"main": {"vramguard.io/vram": "1Gi"}})
    proc = node.spawn(pod, "main", 64 * MiB)
    other_fds(node.drm.fdinfo_root / str(proc.pid) / "fd", FAT_FDS)


def sampler(node: SimulatedNode) -> DrmSampler:
    assert node.drm is not None
    found = DrmSampler(sys_root=str(node.drm.sys_root), fdinfo_root=str(node.drm.fdinfo_root), kubelet=HOST_KUBELET)
    found.start()
    return found


def timed(s: DrmSampler, samples: int, between: Callable[[int], None] = lambda i: None) -> dict[str, float]:
    """Wall and CPU milliseconds of warm samples (the first one, cold, left out), median and p99; `between` runs
    before each, outside the timing."""
    s.sample()
    wall, cpu = [], []
    for i in range(samples):
        between(i)
        w0, c0 = time.perf_counter(), time.thread_time()
        sample = s.sample()
        cpu.append((time.thread_time() - c0) * 1000)
        wall.append((time.perf_counter() - w0) * 1000)
    ordered = sorted(wall)
    return {
        "processes": float(len(sample.processes)),
        "wall_median": statistics.median(wall),
        "wall_p99": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
        "cpu_median": statistics.median(cpu),
    }


def busy(node: SimulatedNode) -> Callable[[int], None]:
    """Every process's fdinfo text changed before each sample, as a busy process's engine times change: nothing
    is parsed from memory (`drm_sampler.ParseMemo`)."""
    drm = node.drm
    assert drm is not None

    def change(i: int) -> None:
        for proc in node.processes:
            drm.rewrite(proc.pid, proc.used_bytes + (i + 1) * 4096)

    return change


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="8x16, 10 samples per row")
    parser.add_argument("--fds", type=int, default=64, help="other fds per process (default 64)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0 or (reason := cgroups_unavailable(version=2)) is not None:
        print(f"bench/drm_scan.py needs root and cgroup v2: {reason or 'not root'}", file=sys.stderr)
        return 2
    samples = 10 if args.quick else 100
    with tempfile.TemporaryDirectory(prefix="vramguard-drm-bench-") as tmp:
        work = Path(tmp)
        # One node at a time: the sampler reads every pod cgroup of the machine, and both nodes' are real.
        with build(work / "1x1", 1, 1, args.fds) as small:
            rows = {"1x1": timed(sampler(small), samples)}
        per_gpu = 16 if args.quick else 64
        shape = f"8x{per_gpu}"
        with build(work / shape, 8, per_gpu, args.fds) as big:
            rows[shape] = timed(sampler(big), samples)
            rows[f"{shape} busy"] = timed(sampler(big), samples, busy(big))
            add_fat(big)
            rows[f"{shape} + fat"] = timed(sampler(big), samples)
    print(f"DRM sample cost ({samples} warm samples a row, {args.fds} other fds a process; ms)")
    print(f"{'shape':<12} {'processes':>9} {'wall p50':>9} {'wall p99':>9} {'cpu p50':>8}")
    for name, r in rows.items():
        print(
            f"{name:<12} {r['processes']:>9.0f} {r['wall_median']:>9.2f} {r['wall_p99']:>9.2f} {r['cpu_median']:>8.2f}"
        )
    base, fat, one, changing = rows[shape], rows[f"{shape} + fat"], rows["1x1"], rows[f"{shape} busy"]
    print(
        f"{shape} / 1x1 (wall p50): {base['wall_median'] / one['wall_median']:.1f}x   "
        f"a {FAT_FDS:,}-fd process adds {fat['wall_median'] - base['wall_median']:.2f} ms "
        f"({fat['wall_median'] / base['wall_median']:.2f}x; the scan's bound: 250 ms)"
    )
    print(
        f"per process ({shape}, wall p50): {base['wall_median'] / base['processes'] * 1000:.0f} µs idle, "
        f"{changing['wall_median'] / changing['processes'] * 1000:.0f} µs busy (every text changed: all parsed)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
