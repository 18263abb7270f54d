"""Benchmark: CPU time per scan, and reaction time (limit crossed → process dead). Run as root.

    sudo .venv/bin/python bench/scan.py            # the full run: 200 scans per shape, 50 trials per poll
    sudo .venv/bin/python bench/scan.py --quick    # a smoke run in a few seconds

Everything is real but the GPU: nvidia-ml-py's ctypes code over the test NVML library, real processes in real
kubelet-shaped cgroups, the agent's own loop. Part 1 runs the loop in this process and measures `scan()` CPU
time (all threads: the NVML worker thread counts) for 8 GPUs x 64 processes and 1 x 1, on the first scan of a
fresh agent (cold: NVML handles, cgroup cache empty) and on later scans (warm). It also reports how much of a
warm scan is the NVML sample (pynvml, the adapter's checks and the test library, which stats its state file on
every call where a real driver makes an ioctl). Part 2 starts `vramguard run --mode kill` and, trial after
trial, lets a process cross its quota at a random point of the poll cycle and times until the kernel reports it
dead (its pidfd turns readable); with the watch on, also where another process frees more in the same write, so
that the GPU's counter falls as the quota is crossed. Targets (issue 2): <= 2 ms per warm 8x64 scan; reaction p99
<= 1.5 x poll.
"""

from __future__ import annotations

import argparse
import os
import random
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from vramguard.agent.act import Enforcer
from vramguard.agent.loop import Agent, settle_heap
from vramguard.agent.metrics import Metrics
from vramguard.base.logs import configure_logging
from vramguard.base.worker import Inline
from vramguard.core.policy import Mode, Policy
from vramguard.core.quantity import GiB, MiB
from vramguard.kube.pods_file import FilePodSource
from vramguard.node.identify import ProcIdentifier
from vramguard.node.kill import PidfdKiller
from vramguard.node.limiter import DriverLimiter
from vramguard.nvml import NvmlSampler
from vramguard_testbed.cgroups import cgroups_unavailable
from vramguard_testbed.fakenvml import STATE_ENV, load_fake_nvml
from vramguard_testbed.fakes import FakeEvictor, FakeMemoryLimiter, RecordingEventRecorder
from vramguard_testbed.measure import cpu_seconds
from vramguard_testbed.simnode import SimProcess, SimulatedNode, metric_value


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def build_node(workdir: Path, gpus: int, per_gpu: int) -> SimulatedNode:
    """`gpus` GPUs with `per_gpu` processes each; pods of 8 processes, every process under its quota."""
    node = SimulatedNode(workdir, gpus=gpus, gpu_total_bytes=80 * GiB)
    # Nothing dies in the scan-cost runs, and the test library's /proc check of every row (how it imitates the
    # driver freeing a dead process' memory) would be measured as if it were the agent's cost.
    node.nvml.drop_dead_pids = False
    pod = None
    for i in range(gpus * per_gpu):
        if i % 8 == 0:
            pod = node.add_pod(f"job-{i // 8}", "bench", containers={"main": {"vramguard.io/vram": "1Gi"}})
        assert pod is not None
        popen = pod.containers["main"].spawn(["sleep", "3600"])
        node.processes.append(SimProcess(popen=popen, gpu=i % gpus, used_bytes=64 * MiB, pod=pod, container="main"))
    node.sync()
    return node


def scan_cost(node: SimulatedNode, scans: int, *, driver_limits: bool = False) -> dict[str, float]:
    """CPU and wall time of a cold scan and of warm scans, in milliseconds, and the NVML share of a warm one.

    With `driver_limits`, in kill mode with a `DriverLimiter` over an in-memory driver (`FakeMemoryLimiter`) run
    inline: what the agent itself adds per scan for a limit on every container and GPU (computing the wanted
    limits, handing them over, reading back each limited cgroup's usage), without the test library's cost of
    answering, which says nothing about a real driver's."""
    os.environ[STATE_ENV] = str(node.state_path)
    policy = Policy(mode=Mode.KILL) if driver_limits else Policy()
    events = RecordingEventRecorder()

    pods = FilePodSource(str(node.pods_path), node.node_name)
    pods.start()
    assert pods.wait_synced(30), pods.problem()

    driver = FakeMemoryLimiter()

    def fresh_agent() -> tuple[Agent, NvmlSampler]:
        sampler = NvmlSampler()
        sampler.start()
        agent = Agent(
            sampler=sampler,
            identifier=ProcIdentifier(),
            pods=pods,
            policy=policy,
            enforcer=Enforcer(killer=PidfdKiller(), evictor=FakeEvictor(), events=events, policy=policy),
            metrics=Metrics(),
            limiter=DriverLimiter(driver, runner=Inline()) if driver_limits else None,
        )
        return agent, sampler

    agent, sampler = fresh_agent()
    c0, w0 = time.process_time(), time.perf_counter()
    report = agent.scan()
    cold_cpu, cold_wall = time.process_time() - c0, time.perf_counter() - w0
    if driver_limits:  # the in-memory driver counts what NVML's rows say: no disagreement to report
        # A limit on each container's cgroup and on each pod's, on every GPU.
        assert len(driver.limits) >= len(report.snapshot.containers)
        for key in driver.limits:
            driver.used[key] = 64 * MiB
    settle_heap()  # as Agent.run does after its first scan
    attributed = sum(len(u.processes) for u in report.snapshot.containers)
    assert attributed == len(node.processes), f"attributed {attributed} of {len(node.processes)} processes"
    assert not report.decision.actions, "the benchmark node has no violations"

    cpu, wall, nvml_cpu = [], [], []
    for _ in range(scans):
        c0, w0 = time.process_time(), time.perf_counter()
        agent.scan()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    for _ in range(scans):
        c0 = time.process_time()
        sampler.sample()
        nvml_cpu.append(time.process_time() - c0)
    sampler.stop(time.monotonic() + 1)
    pods.stop(time.monotonic() + 1)
    ms = 1000.0
    return {
        "cold_cpu": cold_cpu * ms,
        "cold_wall": cold_wall * ms,
        "warm_cpu_median": statistics.median(cpu) * ms,
        "warm_cpu_p99": percentile(cpu, 99) * ms,
        "warm_wall_median": statistics.median(wall) * ms,
        "warm_nvml_cpu_median": statistics.median(nvml_cpu) * ms,
        "processes": float(len(node.processes)),
    }


def reaction_times(
    workdir: Path, poll_s: float, trials: int, watch: str, hidden: bool = False
) -> tuple[list[float], int]:
    """Seconds from the moment a process crosses its quota to the moment it is dead, per trial, with the agent's
    watch between scans at `watch` (`--watch-interval`; 0s: scans on the poll alone); and how many trials the agent
    missed (the process was still alive `10 x poll + 5 s` later: killed by the benchmark, counted, and the run
    goes on). `hidden`: in the same write of the test NVML's state another pod's process frees 8 GiB, so that the
    GPU's counter falls as the offender crosses (the watch's memory-fall)."""
    policy = workdir / "policy.yaml"
    workdir.mkdir(parents=True, exist_ok=True)
    policy.write_text("cooldown: 0s\nmax_actions_per_scan: 1\n")
    out: list[float] = []
    missed = 0
    patience_s = 10 * poll_s + 5
    with SimulatedNode(workdir / "node") as node:
        pod = node.add_pod("trainer", "bench", containers={"main": {"vramguard.io/vram": "4Gi"}})
        freer = None
        if hidden:
            freer_pod = node.add_pod("freer", "bench", containers={"main": {"vramguard.io/vram": "12Gi"}})
            freer = node.spawn(freer_pod, "main", 10 * GiB)
        node.start_agent(
            "--mode",
            "kill",
            "--policy",
            str(policy),
            "--poll-interval",
            str(poll_s),
            "--watch-interval",
            watch,
            stderr=subprocess.DEVNULL,
        )
        node.wait_ready()
        for _ in range(trials):
            if freer is not None:
                freer.used_bytes = 10 * GiB  # taken back after the last trial's free, in the spawn's write
            proc = node.spawn(pod, "main", 2 * GiB)
            node.wait_scans(1, timeout_s=patience_s)  # the agent has seen the new process
            time.sleep(random.uniform(0, poll_s))  # cross at a random point of the poll cycle
            pidfd = os.pidfd_open(proc.pid)
            try:
                crossed = time.perf_counter()
                if freer is not None:
                    freer.used_bytes = 2 * GiB  # written with the offender's usage, in one replacement of the state
                node.set_usage(proc, 6 * GiB)
                ready, _, _ = select.select([pidfd], [], [], patience_s)
                died = time.perf_counter()
            finally:
                os.close(pidfd)
            if ready:
                out.append(died - crossed)
            else:
                missed += 1
                print(f"  missed: PID {proc.pid} alive {patience_s:.1f}s after crossing its quota", file=sys.stderr)
                proc.popen.kill()
            proc.popen.wait()
            node.processes.remove(proc)
            node.sync()
            # The scan that killed it may still be sweeping the container (a repeat kills the container whole): the
            # next trial's process is spawned into it once that scan has ended.
            node.wait_scans(1, timeout_s=patience_s)
    return out, missed


def scan_cpu_s(node: SimulatedNode) -> float:
    """What the running agent counted as its scans' CPU (vramguard_scan_cpu_seconds_total)."""
    return metric_value(node.http_get("/metrics")[1], "vramguard_scan_cpu_seconds_total") or 0.0


def agent_costs(workdir: Path, seconds: float) -> dict[str, float]:
    """`vramguard run` over 1 GPU with 64 GPU processes (8 pods of 8, each under its quota), at the default poll
    and watch: its CPU (share of a core) at rest, and while one container allocates and frees 1 GiB every 50 ms
    within its quota (with the triggered scans per second that costs); then with the watch off and a 50 ms poll, its
    CPU per scan, to compare with the CPU it counted in its own scans (vramguard_scan_cpu_seconds_total) and with
    the in-process `Agent.scan()` of the same node run back to back (`scan_cost`)."""
    out: dict[str, float] = {}
    node = build_node(workdir, 1, 64)
    try:
        churner = node.processes[0]
        node.add_pod("churn", "bench", containers={"main": {"vramguard.io/vram": "4Gi"}})
        churner = node.spawn(node.pods[-1], "main", 512 * MiB)
        agent = node.start_agent("--mode", "kill", stderr=subprocess.DEVNULL)
        node.wait_ready()
        node.wait_scans(2)

        def share(during: float, action: Callable[[], None] = lambda: None) -> tuple[float, float]:
            """(CPU share of a core, scans per second) over `during` seconds while `action` runs every 50 ms."""
            cpu0, scans0, t0 = cpu_seconds(agent.pid), node.scans(), time.monotonic()
            while time.monotonic() - t0 < during:
                action()
                time.sleep(0.05)
            elapsed = time.monotonic() - t0
            return (cpu_seconds(agent.pid) - cpu0) / elapsed, (node.scans() - scans0) / elapsed

        out["rest_share"], out["rest_scans_per_s"] = share(seconds)
        high = [False]

        def churn() -> None:
            high[0] = not high[0]
            node.set_usage(churner, 512 * MiB + (GiB if high[0] else 0))

        out["churn_share"], out["churn_scans_per_s"] = share(seconds, churn)
        node.set_usage(churner, 512 * MiB)
        node.stop_agents()

        fast = node.start_agent("--poll-interval", "0.05", "--watch-interval", "0s", stderr=subprocess.DEVNULL)
        node.wait_ready()
        node.wait_scans(5)
        own0, scans0 = scan_cpu_s(node), node.scans()
        cpu0 = cpu_seconds(fast.pid)
        time.sleep(seconds)
        cpu1 = cpu_seconds(fast.pid)
        scans, own = node.scans() - scans0, scan_cpu_s(node) - own0
        out["process_cpu_per_scan_ms"] = (cpu1 - cpu0) / max(scans, 1) * 1000
        out["own_scan_cpu_ms"] = own / max(scans, 1) * 1000
        node.stop_agents()
        out["scan_cpu_ms"] = scan_cost(node, 100)["warm_cpu_median"]
    finally:
        node.close()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="few scans and trials: a smoke run")
    parser.add_argument("--scans", type=int, default=200)
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--polls", default="1.0,0.1", help="poll intervals in seconds, comma-separated")
    args = parser.parse_args(argv)
    configure_logging("console", level="warning")  # the figures, not the agent's info lines
    if args.quick:
        args.scans, args.trials, args.polls = 20, 3, "1.0"
    if os.geteuid() != 0 or (reason := cgroups_unavailable(version=2)) is not None:
        print(f"bench/scan.py needs root and writable cgroups: {reason or 'not root'}", file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory(prefix="vramguard-bench-") as tmp:
        work = Path(tmp)
        nodes = {"8x64": build_node(work / "8x64", 8, 64), "1x1": build_node(work / "1x1", 1, 1)}
        lib_dir = nodes["1x1"].lib_dir
        assert lib_dir is not None
        load_fake_nvml(lib_dir)
        print(f"scan cost (CPU of all threads; {args.scans} warm scans each; milliseconds)")
        row = "{:<6} {:>5} {:>9} {:>13} {:>13} {:>14} {:>11}"
        print(row.format("shape", "procs", "cold cpu", "warm cpu p50", "warm cpu p99", "warm wall p50", "of it NVML"))
        costs = {}
        try:
            for shape, node in (*nodes.items(), ("8x64+L", nodes["8x64"])):
                c = costs[shape] = scan_cost(node, args.scans, driver_limits=shape.endswith("+L"))
                keys = ("cold_cpu", "warm_cpu_median", "warm_cpu_p99", "warm_wall_median", "warm_nvml_cpu_median")
                print(row.format(shape, f"{c['processes']:.0f}", *(f"{c[k]:.3f}" for k in keys)))
        finally:
            for node in nodes.values():
                node.close()
        big, small = costs["8x64"], costs["1x1"]
        verdict = "met" if big["warm_cpu_median"] <= 2.0 else "NOT met"
        print(
            f"warm/cold (8x64): {big['warm_cpu_median'] / big['cold_cpu']:.3f}   "
            f"8x64/1x1 (warm): {big['warm_cpu_median'] / small['warm_cpu_median']:.1f}x   "
            f"target <= 2 ms warm 8x64: {verdict}"
        )
        limited = costs["8x64+L"]
        print(
            f"8x64+L: in kill mode with a driver limit on each of its 64 containers on each of the 8 GPUs (512): "
            f"{limited['warm_cpu_median'] / big['warm_cpu_median']:.2f}x the warm scan without"
        )

        print(
            f"\nreaction time: quota crossed at a random point of the poll -> process dead ({args.trials} trials "
            "each; milliseconds). watch 0s: scans on the poll alone (as before the watch); 20ms: the default"
        )
        row = "{:>6} {:>6} {:>8} {:>8} {:>8} {:>8} {:>7}  {}"
        print(row.format("poll", "watch", "p50", "p95", "p99", "max", "missed", "target"))
        polls = [float(p) for p in args.polls.split(",")]
        # The watch off and on at the first poll (the default), and on where a free hides the crossing (the GPU's
        # counter falls); at the others, the poll alone (the issue-2 target).
        runs = [(polls[0], w, False) for w in ("0s", "20ms", "10ms")] + [(polls[0], "20ms", True)]
        for poll_s, watch, hidden in runs + [(p, "0s", False) for p in polls[1:]]:
            where = work / f"reaction-{poll_s}-{watch}{'-hidden' if hidden else ''}"
            rt, missed = reaction_times(where, poll_s, args.trials, watch, hidden)
            name = "p99 <= 1.5 x poll" if watch == "0s" else "p95 <= 50 ms"
            name = f"hidden by a free, {name}" if hidden else name
            if not rt:
                print(row.format(f"{poll_s * 1000:.0f}ms", watch, *["-"] * 4, f"{missed}/{args.trials}", name))
                continue
            p95, p99 = percentile(rt, 95), percentile(rt, 99)
            met = p99 <= 1.5 * poll_s if watch == "0s" else p95 <= 0.05
            figures = (f"{v * 1000:.1f}" for v in (percentile(rt, 50), p95, p99, max(rt)))
            verdict = f"{name}: {'met' if met and not missed else 'NOT met'}"
            print(row.format(f"{poll_s * 1000:.0f}ms", watch, *figures, f"{missed}/{args.trials}", verdict))

        seconds = 3.0 if args.quick else 10.0
        c = agent_costs(work / "costs", seconds)
        print(f"\nthe agent process (1 GPU, 64 GPU processes, default poll and watch; {seconds:g} s each)")
        print(
            f"  at rest: {c['rest_share']:.2%} of a core ({c['rest_scans_per_s']:.1f} scans/s)   target <= 2 %: "
            f"{'met' if c['rest_share'] <= 0.02 else 'NOT met'}"
        )
        print(
            f"  one container allocating and freeing 1 GiB every 50 ms within its quota: {c['churn_share']:.2%} of a "
            f"core ({c['churn_scans_per_s']:.1f} scans/s)   target <= 5 %: "
            f"{'met' if c['churn_share'] <= 0.05 else 'NOT met'}"
        )
        ratio = c["process_cpu_per_scan_ms"] / c["own_scan_cpu_ms"]
        print(
            f"  CPU per scan, watch off, 50 ms poll: the whole process {c['process_cpu_per_scan_ms']:.3f} ms, "
            f"its Agent.scan() {c['own_scan_cpu_ms']:.3f} ms: {ratio:.2f}x   target <= 1.3x: "
            f"{'met' if ratio <= 1.3 else 'NOT met'}"
        )
        print(
            f"  (Agent.scan() run back to back in this process: {c['scan_cpu_ms']:.3f} ms; a scan every 50 ms costs "
            f"{c['own_scan_cpu_ms'] / c['scan_cpu_ms']:.1f}x that, its caches cold)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
