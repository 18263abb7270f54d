"""Benchmark on a real NVIDIA GPU: what a scan costs, how fast an offender dies, how long a teardown takes. Root.

    sudo python3 bench/gpu.py                       # the full run: a few minutes
    sudo python3 bench/gpu.py --quick               # a smoke run: few scans, 3 trials
    sudo python3 bench/gpu.py --json figures.json   # every figure (and every trial) as JSON too
    sudo .venv/bin/python bench/gpu.py --fake-nvml --quick   # no GPU: the same code over the test NVML library

No framework is needed: the GPU processes are small Python programs that make a CUDA context and allocate through
the driver API (ctypes over libcuda.so.1: cuInit, cuDevicePrimaryCtxRetain, cuMemAlloc_v2), each in its own
kubelet-shaped pod cgroup; the pods come from a pods file, as `vramguard run --pods-file` reads it. A context costs
about 0.5 GiB on an H100, which NVML counts in the process's usage. It prints, in one run:

(a) CPU per scan at 32 and 96 GPU processes: the raw NVML calls a scan needs (pynvml, called directly), the
    sampler's `NvmlSampler.sample()`, `Agent.scan()` in this process, and the whole agent process per scan (`vramguard
    run` polling at 20 Hz: its utime+stime from /proc/<pid>/stat over a window, divided by the scans its /metrics
    counted), with the ratio whole/scan; and the agent at rest at the default 1 s poll, in millicores.
(b) At the default 1 s poll with `vramguard run --mode kill`: a process in a pod with a quota allocates past it at
    a random moment of the poll cycle; crossing -> dead (its pidfd turns readable) and crossing -> released (the
    GPU's used memory, read every millisecond, back down), median, p95 and max.
(c) SIGKILL -> dead and -> released for a process holding 1 GiB and 20 GiB: the driver's teardown, which no agent
    can shorten.

With --fake-nvml the GPU is the test NVML library (testbed: fake_nvml.c) and each GPU process is the same program
allocating through the library instead of CUDA, holding 512 MiB for its "context": every code path but CUDA runs,
so CI keeps this benchmark working; its figures say nothing about a real driver.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from scan import percentile
from vramguard.agent.act import Enforcer
from vramguard.agent.loop import Agent, settle_heap
from vramguard.agent.metrics import Metrics
from vramguard.base.logs import configure_logging
from vramguard.core.policy import Policy
from vramguard.core.quantity import GiB, MiB
from vramguard.kube.pods_file import FilePodSource
from vramguard.node.identify import ProcIdentifier
from vramguard.node.kill import PidfdKiller
from vramguard.nvml import NvmlSampler
from vramguard_testbed.cgroups import cgroups_unavailable
from vramguard_testbed.fakenvml import STATE_ENV, MigMode, load_fake_nvml
from vramguard_testbed.fakes import FakeEvictor, RecordingEventRecorder
from vramguard_testbed.measure import cpu_seconds
from vramguard_testbed.simnode import SimPod, SimProcess, SimulatedNode, metric_value

FAKE_CONTEXT_BYTES = 512 * MiB  # what a --fake-nvml process holds from its start, as a CUDA context does
CROSSING_BYTES = 2 * GiB  # what an offender allocates to cross its quota (its context + 1 GiB)
POD_PROCESSES = 8  # GPU processes per pod in the scan-cost node (one container each), as bench/scan.py
MARGIN_BYTES = 2 * GiB  # GPU memory left free when deciding how many processes fit
START_TIMEOUT_S = 120.0  # for a batch of GPU processes to have their contexts (96 at once on one GPU)

# The GPU process: allocates what it is told on stdin (bytes, one request a line) and answers
# "ready <bytes held besides its context> <CLOCK_MONOTONIC seconds when the allocation returned>".
# argv: cuda <first bytes> | fake <library> <context bytes> <device file> <first bytes>
CHILD = r"""
import ctypes, sys, time

def cuda_allocator():
    # The only CUDA in the benchmark: GPU 0's primary context through the driver API, and allocations in it.
    cuda = ctypes.CDLL("libcuda.so.1")
    def check(call, result):
        if result != 0:
            sys.exit(f"{call} failed: CUresult {result}")
    check("cuInit", cuda.cuInit(0))
    device, context = ctypes.c_int(), ctypes.c_void_p()
    check("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(device), 0))
    check("cuDevicePrimaryCtxRetain", cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device))
    check("cuCtxSetCurrent", cuda.cuCtxSetCurrent(context))
    cuda.cuMemAlloc_v2.argtypes = (ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t)
    def allocate(nbytes):
        pointer = ctypes.c_uint64()
        check("cuMemAlloc_v2", cuda.cuMemAlloc_v2(ctypes.byref(pointer), nbytes))
    return allocate

def fake_allocator(library, context_bytes, device_file):
    # The test NVML library's allocations: counted for this process, in NVML's lists too, until it exits.
    global device
    device = open(device_file)  # held, as a CUDA process holds /dev/nvidia*
    nvml = ctypes.CDLL(library)
    if nvml.nvmlInit_v2() != 0:
        sys.exit("nvmlInit_v2 failed")
    nvml.vgFakeAllocate.argtypes = (ctypes.c_uint, ctypes.c_ulonglong)
    def allocate(nbytes):
        code = nvml.vgFakeAllocate(0, nbytes)
        if code != 0:
            sys.exit(f"vgFakeAllocate failed: {code}")
    allocate(context_bytes)
    return allocate

allocate = cuda_allocator() if sys.argv[1] == "cuda" else fake_allocator(sys.argv[2], int(sys.argv[3]), sys.argv[4])
held = 0
def serve(nbytes):
    global held
    if nbytes:
        allocate(nbytes)
        held += nbytes
    print("ready", held, time.monotonic(), flush=True)
serve(int(sys.argv[-1]))
for line in sys.stdin:
    serve(int(line))
"""


def child_argv(node: SimulatedNode, first_bytes: int) -> list[str]:
    """The GPU process's command: CUDA on a real GPU, the test library's allocations on a simulated one."""
    if node.lib_dir is None:
        return [sys.executable, "-c", CHILD, "cuda", str(first_bytes)]
    library = str(node.lib_dir / "libnvidia-ml.so.1")
    return [
        sys.executable,
        "-c",
        CHILD,
        "fake",
        library,
        str(FAKE_CONTEXT_BYTES),
        str(node.device_path),
        str(first_bytes),
    ]


@dataclass(eq=False)
class GpuProc:
    """One GPU process in a pod's container, talking the CHILD protocol."""

    proc: SimProcess

    @property
    def pid(self) -> int:
        return self.proc.pid

    def request(self, nbytes: int) -> None:
        assert self.proc.popen.stdin is not None
        self.proc.popen.stdin.write(f"{nbytes}\n")
        self.proc.popen.stdin.flush()

    def answer(self, timeout_s: float) -> float | None:
        """When its last allocation returned (CLOCK_MONOTONIC), or None if it exited (or said nothing in time)."""
        stdout = self.proc.popen.stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], timeout_s)
        line = stdout.readline() if ready else ""
        words = line.split()
        if len(words) != 3 or words[0] != "ready":
            return None
        return float(words[2])

    def kill(self) -> None:
        kill_all([self])


def kill_all(procs: Sequence[GpuProc]) -> None:
    """SIGKILL every one first, then reap them: their teardowns overlap rather than queue."""
    for p in procs:
        if p.proc.alive():
            p.proc.popen.kill()
    for p in procs:
        p.proc.popen.wait()


def spawn(node: SimulatedNode, pods: Sequence[SimPod], first_bytes: int = 0) -> list[GpuProc]:
    """One GPU process in the "main" container of each pod, all started at once; returns when every one holds its
    context and `first_bytes` more (raises, killing them, if one could not)."""
    io: dict[str, Any] = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True, "env": node.env}
    started = [GpuProc(node.spawn_command(pod, "main", child_argv(node, first_bytes), **io)) for pod in pods]
    deadline = time.monotonic() + START_TIMEOUT_S
    for p in started:
        if p.answer(max(0.0, deadline - time.monotonic())) is None:
            kill_all(started)
            raise RuntimeError(f"a GPU process (pid {p.pid}) did not start; its error is on stderr above")
    return started


class GpuView:
    """The benchmark's own NVML reads of GPU 0, through pynvml directly."""

    def __init__(self) -> None:
        pynvml.nvmlInit()
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)

    def close(self) -> None:
        pynvml.nvmlShutdown()

    def used_bytes(self) -> int:
        return int(pynvml.nvmlDeviceGetMemoryInfo(self.handle).used)

    def free_bytes(self) -> int:
        return int(pynvml.nvmlDeviceGetMemoryInfo(self.handle).free)

    def process_bytes(self) -> dict[int, int]:
        """Each compute process's usage (0 where NVML does not know it)."""
        return {p.pid: int(p.usedGpuMemory or 0) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(self.handle)}

    def describe(self) -> dict[str, Any]:
        def ask(fn: Callable[[], Any]) -> str:
            try:
                return str(fn())
            except pynvml.NVMLError as e:
                return f"unknown ({e})"

        cuda = ask(pynvml.nvmlSystemGetCudaDriverVersion)
        if cuda.isdigit():
            cuda = f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}"
        return {
            "name": ask(lambda: pynvml.nvmlDeviceGetName(self.handle)),
            "driver": ask(pynvml.nvmlSystemGetDriverVersion),
            "nvml": ask(pynvml.nvmlSystemGetNVMLVersion),
            "cuda_driver_api": cuda,
            "gpus": ask(pynvml.nvmlDeviceGetCount),
            "total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(self.handle).total),
            "free_bytes": self.free_bytes(),
            "kernel": os.uname().release,
        }


# -- (a) CPU per scan --------------------------------------------------------------------------------------------


def cpu_per_call(fn: Callable[[], object], reps: int, clock: Callable[[], float]) -> float:
    """Median CPU seconds of `fn()` over `reps` calls, read with `clock` around each."""
    times = []
    for _ in range(reps):
        c0 = clock()
        fn()
        times.append(clock() - c0)
    return statistics.median(times)


def raw_nvml_costs(view: GpuView, reps: int) -> dict[str, float]:
    """CPU seconds per call (this thread's) of each NVML call a scan of GPU 0 needs, through pynvml directly: the
    memory counter, the MIG mode (where the GPU has MIG), and the compute, graphics and MPS process lists."""
    h = view.handle
    calls: dict[str, Callable[[], object]] = {
        "memory_info": lambda: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2),
        "mig_mode": lambda: pynvml.nvmlDeviceGetMigMode(h),
        "compute_processes": lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h),
        "graphics_processes": lambda: pynvml.nvmlDeviceGetGraphicsRunningProcesses(h),
        "mps_processes": lambda: pynvml.nvmlDeviceGetMPSComputeRunningProcesses(h),
    }
    costs = {}
    for name, fn in calls.items():
        try:
            fn()
        except TypeError:  # bindings older than memory v2 (the sampler falls back to v1 likewise)
            if name != "memory_info":
                raise
            fn = lambda: pynvml.nvmlDeviceGetMemoryInfo(h)  # noqa: E731
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
            continue  # the sampler does not call it again (MIG) or gets nothing from it
        costs[name] = cpu_per_call(fn, reps, time.thread_time)
    return costs


def in_process_costs(node: SimulatedNode, processes: int, reps: int) -> dict[str, float]:
    """CPU seconds (all threads: the sampler's NVML worker counts) of a warm `NvmlSampler.sample()` and of a warm
    `Agent.scan()`, with real parts as bench/scan.py builds them; checks every GPU process is attributed."""
    policy = Policy()
    pods = FilePodSource(str(node.pods_path), node.node_name)
    pods.start()
    sampler = NvmlSampler()
    sampler.start()
    try:
        assert pods.wait_synced(30), pods.problem()
        agent = Agent(
            sampler=sampler,
            identifier=ProcIdentifier(),
            pods=pods,
            policy=policy,
            enforcer=Enforcer(
                killer=PidfdKiller(), evictor=FakeEvictor(), events=RecordingEventRecorder(), policy=policy
            ),
            metrics=Metrics(),
        )
        report = agent.scan()
        settle_heap()  # as Agent.run does after its first scan
        attributed = sum(len(u.processes) for u in report.snapshot.containers)
        if attributed != processes:
            raise RuntimeError(f"the agent attributed {attributed} of {processes} GPU processes to their pods")
        if report.decision.actions:
            raise RuntimeError("the scan-cost node has no violations, yet the agent decided to act")
        return {
            "sample": cpu_per_call(sampler.sample, reps, time.process_time),
            "scan": cpu_per_call(agent.scan, reps, time.process_time),
            "attributed": float(attributed),
        }
    finally:
        sampler.stop(time.monotonic() + 1)
        pods.stop(time.monotonic() + 1)


@contextmanager
def running_agent(node: SimulatedNode, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """`vramguard run` on the node, ready; its log goes to a file whose end is shown if it never becomes ready."""
    log_path = node.workdir / "agent.log"
    with log_path.open("wb") as log:
        agent = node.start_agent(*args, stderr=log)
    try:
        try:
            node.wait_ready(60)
        except Exception:
            tail = log_path.read_text(errors="replace").splitlines()[-20:]
            print("the agent's log ends:\n  " + "\n  ".join(tail), file=sys.stderr)
            raise
        yield agent
    finally:
        node.stop_agents()


def scan_cpu_seconds(node: SimulatedNode) -> float:
    """What the agent counted as its scans' CPU (vramguard_scan_cpu_seconds_total)."""
    return metric_value(node.http_get("/metrics")[1], "vramguard_scan_cpu_seconds_total") or 0.0


def agent_process_cost(node: SimulatedNode, poll_s: float, seconds: float, watch: str) -> tuple[float, float, float]:
    """(CPU seconds, scans, CPU seconds the agent counted in its scans) of the whole `vramguard run` process over
    `seconds` at a `poll_s` poll, its watch between scans at `watch`. The window opens after the /metrics read that
    gives the first scan count and closes before the one that gives the last, so neither read's own cost is
    counted."""
    with running_agent(node, "--poll-interval", str(poll_s), "--watch-interval", watch) as agent:
        node.wait_scans(2)  # past start-up: the heap settled after the first scan
        scans0, scan_cpu0 = node.scans(), scan_cpu_seconds(node)
        cpu0 = cpu_seconds(agent.pid)
        time.sleep(seconds)
        cpu1 = cpu_seconds(agent.pid)
        scans1, scan_cpu1 = node.scans(), scan_cpu_seconds(node)
    return cpu1 - cpu0, scans1 - scans0, scan_cpu1 - scan_cpu0


def scan_costs(node: SimulatedNode, view: GpuView, processes: int, args: argparse.Namespace) -> dict[str, Any]:
    """Part (a) for the node as it is now, with `processes` GPU processes in pods."""
    calls = raw_nvml_costs(view, args.scans)
    inproc = in_process_costs(node, processes, args.scans)
    # The watch apart at 20 Hz (its own cost is the rest figure's, at the default poll and watch).
    cpu, scans, own_scan_cpu = agent_process_cost(node, 1 / args.agent_hz, args.seconds, "0s")
    rest_cpu, rest_scans, _ = agent_process_cost(node, 1.0, args.rest_seconds, "20ms")
    whole = cpu / scans if scans else float("nan")
    return {
        "processes": processes,
        "nvml_call_ms": {k: v * 1000 for k, v in calls.items()},
        "raw_nvml_ms": sum(calls.values()) * 1000,
        "sample_ms": inproc["sample"] * 1000,
        "scan_ms": inproc["scan"] * 1000,
        "attributed": int(inproc["attributed"]),
        "agent_hz": args.agent_hz,
        "agent_seconds": args.seconds,
        "agent_scans": scans,
        "agent_cpu_s": cpu,
        "agent_ms_per_scan": whole * 1000,
        "whole_over_scan": whole / inproc["scan"],
        "agent_scan_ms": own_scan_cpu / scans * 1000 if scans else float("nan"),
        "whole_over_own_scans": cpu / own_scan_cpu if own_scan_cpu else float("nan"),
        "rest_seconds": args.rest_seconds,
        "rest_scans": rest_scans,
        "rest_millicores": rest_cpu / args.rest_seconds * 1000,
    }


def fit(view: GpuView, each_bytes: int, wanted: int, what: str, notes: list[str]) -> int:
    """How many of `wanted` processes of `each_bytes` fit in the GPU's free memory (with a margin); a note if not
    all of them."""
    room = max(0, (view.free_bytes() - MARGIN_BYTES) // max(each_bytes, 1))
    if room >= wanted:
        return wanted
    note = (
        f"{what}: {wanted} processes of {each_bytes / GiB:.2f} GiB do not fit in the GPU's "
        f"{view.free_bytes() / GiB:.1f} GiB free; measured with {room}"
    )
    print(f"note: {note}")
    notes.append(note)
    return room


def part_a(node: SimulatedNode, view: GpuView, args: argparse.Namespace, out: dict[str, Any]) -> None:
    """(a) CPU per scan at each process count; every GPU process it started is gone when it returns."""
    procs: list[GpuProc] = []
    try:
        scan_cost_table(node, view, args, out, procs)
    finally:
        kill_all(procs)


def scan_cost_table(
    node: SimulatedNode, view: GpuView, args: argparse.Namespace, out: dict[str, Any], procs: list[GpuProc]
) -> None:
    """Part (a): the GPU processes grow to each shape in turn (`procs`: those started, for the caller to end)."""
    shapes = sorted(int(n) for n in args.processes.split(","))
    notes: list[str] = out["notes"]
    pods: list[SimPod] = []

    def grow(to: int) -> None:
        new_pods = []
        for i in range(len(procs), to):
            if i % POD_PROCESSES == 0:  # a pod of 8 GPU processes, far under its quota: the agent only watches
                quota = {"main": {"vramguard.io/vram": "64Gi"}}
                pods.append(node.add_pod(f"job-{i // POD_PROCESSES}", "bench", containers=quota))
            new_pods.append(pods[-1])
        procs.extend(spawn(node, new_pods))

    grow(1)  # the first process says what a context costs
    context = view.process_bytes().get(procs[0].pid, 0)
    if context <= 0:
        raise RuntimeError(f"NVML does not list the first GPU process (pid {procs[0].pid}) with its memory")
    out["context_bytes"] = context
    print(f"a GPU process's context: {context / MiB:.0f} MiB as NVML counts it\n")
    row = "{:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}  {:>9} {:>9} {:>9} {:>11} {:>9} {:>9} {:>10}  {:>9}"
    header = (
        "procs", "mem info", "MIG mode", "compute", "graphics", "MPS", "raw NVML",
        "sample()", "scan()", "agent", "agent/scan", "its scans", "agent/its", "attributed", "rest mcpu",
    )  # fmt: skip
    print(
        "(a) CPU per scan, milliseconds: each NVML call (pynvml, this thread) and their sum; NvmlSampler.sample() "
        f"and Agent.scan() in this process (median of {args.scans}); the whole `vramguard run` process per scan at "
        f"{args.agent_hz:g} Hz over {args.seconds:g} s, watch off, and what it counted in its own scans "
        "(vramguard_scan_cpu_seconds_total); and at rest at the default 1 s poll and 20 ms watch over "
        f"{args.rest_seconds:g} s (millicores)"
    )
    print(row.format(*header))
    for wanted in shapes:
        n = len(procs) + fit(view, context, max(0, wanted - len(procs)), "scan cost", notes)
        if n < wanted and out["scan_cost"] and out["scan_cost"][-1]["processes"] == n:
            continue  # no room for more than the last shape had
        grow(n)
        listed = sum(1 for pid in view.process_bytes() if pid in {p.pid for p in procs})
        if listed != n:
            raise RuntimeError(f"NVML lists {listed} of the {n} GPU processes")
        c = scan_costs(node, view, n, args)
        out["scan_cost"].append(c)
        call = c["nvml_call_ms"]
        cells = [
            call.get(k) for k in ("memory_info", "mig_mode", "compute_processes", "graphics_processes", "mps_processes")
        ]
        print(
            row.format(
                n,
                *("-" if v is None else f"{v:.3f}" for v in cells),
                f"{c['raw_nvml_ms']:.3f}",
                f"{c['sample_ms']:.3f}",
                f"{c['scan_ms']:.3f}",
                f"{c['agent_ms_per_scan']:.3f}",
                f"{c['whole_over_scan']:.2f}x",
                f"{c['agent_scan_ms']:.3f}",
                f"{c['whole_over_own_scans']:.2f}x",
                f"{c['attributed']}/{n}",
                f"{c['rest_millicores']:.1f}",
            )
        )


# -- (b) reaction, (c) teardown --------------------------------------------------------------------------------------


@dataclass
class Timeline:
    """What the benchmark saw after an event at `start` (CLOCK_MONOTONIC seconds)."""

    start: float
    rise: float | None = None  # the GPU's used memory first up by half the allocation
    dead: float | None = None  # the process's pidfd readable
    released: float | None = None  # the GPU's used memory first below the threshold


def watch(pidfd: int, view: GpuView, start: float, rise_bytes: int, release_bytes: int, patience_s: float) -> Timeline:
    """Wait, reading the GPU's used memory about every millisecond, until the process is dead and the memory is
    back below `release_bytes` (or `patience_s` has passed)."""
    seen = Timeline(start)
    deadline = start + patience_s
    while seen.dead is None or seen.released is None:
        ready, _, _ = select.select([pidfd] if seen.dead is None else [], [], [], 0.001)
        if ready:
            seen.dead = time.monotonic()
        used = view.used_bytes()
        now = time.monotonic()
        if seen.rise is None and used >= rise_bytes:
            seen.rise = now
        if seen.released is None and used <= release_bytes:
            seen.released = now
        if now > deadline:
            break
    return seen


def summary(values_s: Sequence[float]) -> dict[str, float | None]:
    """Median, p95 and max in milliseconds (None where there are no values)."""
    if not values_s:
        return {"median": None, "p95": None, "max": None}
    ms = [v * 1000 for v in values_s]
    return {"median": statistics.median(ms), "p95": percentile(ms, 95), "max": max(ms)}


def shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def part_b(node: SimulatedNode, view: GpuView, args: argparse.Namespace, out: dict[str, Any]) -> None:
    """(b) Offenders, started a batch at a time in pods of their own, each crossing its quota in turn at a random
    moment of the poll cycle; a trial counts when the process died of the agent's SIGKILL."""
    context = int(out.get("context_bytes") or view_context(node, view))
    quota_bytes = -(-(context + GiB) // MiB) * MiB
    poll_s = args.poll
    patience_s = 10 * poll_s + 5
    policy = node.workdir / "reaction-policy.yaml"
    policy.write_text("cooldown: 0s\nmax_actions_per_scan: 1\n")
    dead_s: list[float] = []
    released_s: list[float] = []
    trials: list[dict[str, Any]] = []
    missed = 0
    pool: list[GpuProc] = []
    made = 0
    with running_agent(node, "--mode", "kill", "--policy", str(policy), "--poll-interval", str(poll_s)):
        for trial in range(args.trials):
            if not pool:  # offenders in pods of their own, each holding its context, under its quota
                room = (view.free_bytes() - MARGIN_BYTES - CROSSING_BYTES) // context
                n = max(1, min(args.trials - trial, room))
                quota = {"main": {"vramguard.io/vram": f"{quota_bytes // MiB}Mi"}}
                pods = [node.add_pod(f"offender-{made + i}", "bench", containers=quota) for i in range(n)]
                made += n
                pool = spawn(node, pods)
                node.wait_scans(1)  # the agent has seen them (under quota)
            offender = pool.pop(0)
            time.sleep(random.uniform(0, poll_s))  # cross at a random point of the poll cycle
            pidfd = os.pidfd_open(offender.pid)
            try:
                before = view.used_bytes()
                sent = time.monotonic()
                offender.request(CROSSING_BYTES)
                seen = watch(pidfd, view, sent, before + CROSSING_BYTES // 2, before - context // 2, patience_s)
            finally:
                os.close(pidfd)
            stamp = offender.answer(0.0)  # None when it was killed before it could say so
            crossed = stamp if stamp is not None else seen.rise if seen.rise is not None else sent
            if seen.dead is None:
                missed += 1
                print(f"  missed: pid {offender.pid} alive {patience_s:.0f}s after crossing its quota", file=sys.stderr)
            offender.kill()
            dead = None if seen.dead is None else seen.dead - crossed
            released = None if seen.released is None else seen.released - crossed
            trials.append({
                "dead_s": dead,
                "released_s": released,
                "crossing_from": "process" if stamp is not None else "nvml" if seen.rise is not None else "request",
                "exit": offender.proc.popen.returncode,
            })  # fmt: skip
            if dead is not None and offender.proc.popen.returncode == -signal.SIGKILL:  # the agent's kill
                dead_s.append(dead)
                if released is not None:
                    released_s.append(released)
        kill_all(pool)
    out["reaction"] = {
        "poll_s": poll_s,
        "trials": args.trials,
        "missed": missed,
        "quota_bytes": quota_bytes,
        "crossing_bytes": CROSSING_BYTES,
        "dead_ms": summary(dead_s),
        "released_ms": summary(released_s),
        "trial_records": trials,
    }
    print(
        f"\n(b) reaction at a {poll_s:g} s poll, `vramguard run --mode kill`: a process crosses its quota "
        f"({quota_bytes / GiB:.2f} GiB) by allocating {CROSSING_BYTES // GiB} GiB at a random moment; "
        f"{args.trials} trials, milliseconds"
    )
    row = "{:<22} {:>8} {:>8} {:>8} {:>8}"
    print(row.format("", "median", "p95", "max", "trials"))
    for name, values in (("crossing -> dead", dead_s), ("crossing -> released", released_s)):
        s = summary(values)
        print(row.format(name, shown(s["median"]), shown(s["p95"]), shown(s["max"]), f"{len(values)}/{args.trials}"))
    if missed:
        print(f"missed: {missed} of {args.trials} offenders were alive {patience_s:.0f} s after crossing")


def view_context(node: SimulatedNode, view: GpuView) -> int:
    """What one GPU process's context costs, from a process started for the purpose."""
    pod = node.add_pod("context-probe", "bench")
    (probe,) = spawn(node, [pod])
    try:
        return view.process_bytes().get(probe.pid, 0) or FAKE_CONTEXT_BYTES
    finally:
        probe.kill()


def part_c(node: SimulatedNode, view: GpuView, args: argparse.Namespace, out: dict[str, Any]) -> None:
    """(c) The benchmark's own SIGKILL of a process holding each size: no agent runs."""
    context = int(out.get("context_bytes") or view_context(node, view))
    sizes = [int(float(s) * GiB) for s in args.held.split(",")]
    pod = node.add_pod("teardown", "bench")
    trials = f"{args.teardown_trials} trial{'s' if args.teardown_trials != 1 else ''}"
    print(
        f"\n(c) SIGKILL -> dead (pidfd readable) and -> released (used memory back down); {trials} each, milliseconds"
    )
    row = "{:<8} {:>12} {:>9} {:>16} {:>13}"
    print(row.format("held", "dead median", "dead max", "released median", "released max"))
    for wanted in sizes:
        held = wanted
        if view.free_bytes() - MARGIN_BYTES < held + context:
            held = max(GiB // 4, (view.free_bytes() - MARGIN_BYTES - context) // GiB * GiB)
            note = f"teardown: {wanted / GiB:g} GiB do not fit in the GPU's free memory; measured {held / GiB:g} GiB"
            print(f"note: {note}")
            out["notes"].append(note)
        dead_s: list[float] = []
        released_s: list[float] = []
        for _ in range(args.teardown_trials):
            (proc,) = spawn(node, [pod], held)
            pidfd = os.pidfd_open(proc.pid)
            try:
                before = view.used_bytes()
                start = time.monotonic()
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                seen = watch(pidfd, view, start, before + 1, before - (held + context) // 2, 30.0)
            finally:
                os.close(pidfd)
            proc.kill()
            if seen.dead is not None:
                dead_s.append(seen.dead - start)
            if seen.released is not None:
                released_s.append(seen.released - start)
        d, r = summary(dead_s), summary(released_s)
        out["teardown"].append(
            {"held_bytes": held, "dead_ms": d, "released_ms": r, "dead_s": dead_s, "released_s": released_s}
        )
        print(
            row.format(f"{held / GiB:g} GiB", shown(d["median"]), shown(d["max"]), shown(r["median"]), shown(r["max"]))
        )


# -- the run ----------------------------------------------------------------------------------------------------------


def why_not(fake: bool) -> str | None:
    """Why this machine cannot run the benchmark, or None."""
    if os.geteuid() != 0:
        return "needs root (pod cgroups, the agent's kills)"
    if (reason := cgroups_unavailable(version=2)) is not None:
        return reason
    if not fake:
        import ctypes

        try:
            ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            return f"no CUDA driver (libcuda.so.1: {e}); --fake-nvml runs the benchmark over the test NVML library"
    return None


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run: few scans, short windows, 3 trials")
    parser.add_argument("--fake-nvml", action="store_true", help="the test NVML library instead of a GPU (no CUDA)")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    parser.add_argument("--processes", default="32,96", help="GPU process counts for (a), comma-separated")
    parser.add_argument("--scans", type=int, default=200, help="(a): in-process calls and scans measured per figure")
    parser.add_argument("--agent-hz", type=float, default=20.0, help="(a): the agent process's poll rate")
    parser.add_argument("--seconds", type=float, default=10.0, help="(a): the agent process's window at --agent-hz")
    parser.add_argument("--rest-seconds", type=float, default=10.0, help="(a): the agent's window at the 1 s poll")
    parser.add_argument("--trials", type=int, default=20, help="(b): offenders, each at a random phase")
    parser.add_argument("--poll", type=float, default=1.0, help="(b): the agent's poll interval (default: its own)")
    parser.add_argument("--held", default="1,20", help="(c): GiB held by the killed process, comma-separated")
    parser.add_argument("--teardown-trials", type=int, default=3, help="(c): kills per size")
    if parser.parse_known_args(argv)[0].quick:  # smaller defaults; an option given still wins
        parser.set_defaults(scans=20, seconds=2.0, rest_seconds=2.0, trials=3, teardown_trials=1)
    args = parser.parse_args(argv)
    if (reason := why_not(args.fake_nvml)) is not None:
        print(f"bench/gpu.py: {reason}", file=sys.stderr)
        return 2
    configure_logging("console", level="warning")  # the figures, not the agent's info lines
    signal.signal(signal.SIGTERM, _terminated)  # `timeout` stops it: still write the JSON and end every process
    began = time.monotonic()
    out: dict[str, Any] = {"mode": "fake-nvml" if args.fake_nvml else "cuda", "args": vars(args) | {"json": None}}
    out.update(notes=[], scan_cost=[], teardown=[], failed=[])
    failed = 0
    with tempfile.TemporaryDirectory(prefix="vramguard-gpu-bench-") as tmp:
        node = SimulatedNode(Path(tmp) / "node", real_gpu=not args.fake_nvml, gpu_total_bytes=80 * GiB,
                             gpu_name="NVIDIA H100 80GB HBM3 (test NVML)")  # fmt: skip
        view: GpuView | None = None
        try:
            if node.lib_dir is not None:  # this process's pynvml, and the sampler in it, over the test library
                node.nvml.allocations = True  # GPU processes hold what they allocate, as on a real driver
                node.nvml.gpu(0).mig_mode = MigMode.OFF  # MIG-capable, MIG off: an H100 as shipped
                node.sync()
                load_fake_nvml(node.lib_dir)
                os.environ[STATE_ENV] = str(node.state_path)
            view = GpuView()
            gpu = out["gpu"] = view.describe()
            print(
                f"bench/gpu.py on {gpu['name']} ({gpu['total_bytes'] / GiB:.1f} GiB, {gpu['free_bytes'] / GiB:.1f} GiB "
                f"free), driver {gpu['driver']}, NVML {gpu['nvml']}, CUDA driver API {gpu['cuda_driver_api']}, "
                f"kernel {gpu['kernel']}; GPU processes: "
                + (
                    "the test NVML library's allocations (--fake-nvml)"
                    if args.fake_nvml
                    else "CUDA driver API (ctypes)"
                )
            )
            for name, part in (("a", part_a), ("b", part_b), ("c", part_c)):
                try:  # a part that fails is reported, and the next one still runs
                    part(node, view, args, out)
                except Exception:
                    failed += 1
                    out["failed"].append(name)
                    print(f"\n({name}) failed:", file=sys.stderr)
                    traceback.print_exc()
        finally:
            out["elapsed_s"] = time.monotonic() - began
            if args.json is not None:
                args.json.write_text(json.dumps(out, indent=2) + "\n")
            if view is not None:
                view.close()
            node.close()
    print(f"\nran in {out['elapsed_s']:.0f} s" + (f"; parts failed: {', '.join(out['failed'])}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
