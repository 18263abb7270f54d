"""Benchmark: what the memory watch costs an agent at rest, today's reading path and the new one side by side. Root.

    sudo .venv/bin/python bench/watch_idle.py             # one 20 s window (about 70 s in all)
    sudo .venv/bin/python bench/watch_idle.py --quick     # a 5 s window: a smoke run

Three `vramguard run` agents at once, each over a simulated node of its own (the test NVML library, one 80 GiB GPU,
64 GPU processes at rest in 8 pods, every one under its quota), in kill mode at the default 1 s poll and 20 ms watch,
measured over the same window so that the machine's load falls on all three alike:
- "today": the watch's reading path as it was at commit 1cc036d (the issue's "today's code"), kept in this file as
  a faithful copy (`TodayWatch`, `TodayTrigger`, `today_memory`: the pause, `read_once` with its locks, the locked
  trigger, and `NvmlSampler.memory` through pynvml's wrapper), put in place of `MemoryWatch` in that agent's
  process before the agent is built; everything else is the code as it is;
- "new": the code as it is;
- "floor": the code as it is with a watch whose reading reads nothing (no GPU): the wake-up every 20 ms by itself,
  the floor under any reading path on this machine.
Each agent's process is started through this file (`--agent`), which gives every thread its name in the kernel
(prctl), so that the watch's thread is found among `/proc/<pid>/task/*`. Printed per agent: the `vramguard-watch`
thread's CPU and the whole process' (utime + stime from `/proc/<pid>/task/<tid>/stat` and `/proc/<pid>/stat`) as a
share of a core, the readings a second (the watch thread's voluntary context switches: one pause a reading) and
the CPU per reading (the thread's time on a CPU from its `schedstat`, in nanoseconds, over those readings); then
each thread's time on a CPU by its name; then new ÷ today for the watch thread (goal: at most 0.25) and for the
whole agent (at most 0.5), and floor ÷ today a reading. The figures are for people: nothing here asserts a timing.

The window starts `--settle` seconds (32) after the agents are ready: the three nodes share this host's kubelet
cgroup tree, so each agent's limiter sees the others' pod cgroups, whose pods it does not know, and looks them up
again every 0.1 s for its first 30 s (a real node's tree holds its own pods only). Measured from the start, that
costs each agent about 0.7 % of a core, the same for all three, and hides what the watch changes.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import structlog

from scan import build_node
from vramguard.agent import watch
from vramguard.agent.watch import MemoryWatch, ScanCalls, Trigger
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.core.policy import Policy
from vramguard.core.sample import GpuDevice, GpuMemory
from vramguard.nvml.errors import ARGUMENT_VERSION_MISMATCH, FUNCTION_NOT_FOUND, NOT_SUPPORTED
from vramguard.nvml.sampler import NvmlSampler
from vramguard_testbed.cgroups import cgroups_unavailable
from vramguard_testbed.measure import cpu_seconds
from vramguard_testbed.simnode import SimulatedNode, free_port

VARIANTS = ("today", "new", "floor")
WATCH_THREAD = "vramguard-watch"  # 15 characters: the kernel keeps 15 of a thread's name

# -- today's reading path (commit 1cc036d), copied: what "new" is measured against --------------------------------

_V2_MISSING = frozenset({NOT_SUPPORTED, FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH})


def _call(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


def _today_counters(sampler: NvmlSampler, handle: Any) -> tuple[int, int, int]:
    """`NvmlSampler._memory(_call, handle)` at 1cc036d: pynvml's wrapper, a new structure a call."""
    nv = sampler._nv
    if sampler._memory_v2 is not False:
        try:
            m = _call("nvmlDeviceGetMemoryInfo_v2", nv.nvmlDeviceGetMemoryInfo, handle, version=nv.nvmlMemory_v2)
        except nv.NVMLError as e:
            if e.value not in _V2_MISSING:
                raise
            sampler._memory_v2 = False
        else:
            sampler._memory_v2 = True
            return int(m.total), int(m.used), int(m.free)
    m = _call("nvmlDeviceGetMemoryInfo", nv.nvmlDeviceGetMemoryInfo, handle)
    return int(m.total), int(m.used), int(m.free)


def today_memory(sampler: NvmlSampler) -> tuple[GpuMemory, ...]:
    """`NvmlSampler.memory` and `_read_memory` at 1cc036d: the GPUs copied, each one's stuck state asked under the
    deadline runner's lock, a `GpuMemory` a GPU and a tuple every reading."""
    if not sampler._started or sampler._stopped:
        return ()
    gpus = [(i, gpu) for i, gpu in list(sampler._gpus.items()) if sampler._runner.stuck(i) is None]
    readings = []
    for index, gpu in gpus:
        try:
            total, used, free = _today_counters(sampler, gpu.handle)
        except sampler._nv.NVMLError:
            continue
        readings.append(GpuMemory(index, total, used, free))
    return tuple(readings)


class TodayTrigger:
    """`ScanTrigger` at 1cc036d: both threads under one lock."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._scanned: dict[int, int] = {}
        self._lowest: dict[int, int] = {}
        self._pressured: set[int] = set()
        self._lock = threading.Lock()

    def scanned(self, devices: Iterable[GpuDevice]) -> None:
        whole = [d for d in devices if d.mig_index is None and d.healthy]
        with self._lock:
            self._scanned = {d.index: d.used_bytes for d in whole}
            self._lowest = dict(self._scanned)
            self._pressured = {d.index for d in whole if self.policy.under_pressure(d)}

    def check(self, readings: Iterable[GpuMemory]) -> Trigger | None:
        with self._lock:
            for reading in readings:
                reason = self._reason(reading)
                if reason is not None:
                    return reason
            return None

    def _reason(self, reading: GpuMemory) -> Trigger | None:
        scanned = self._scanned.get(reading.index)
        if scanned is None:
            return None
        lowest = self._lowest[reading.index] = min(self._lowest[reading.index], reading.used_bytes)
        threshold = self.policy.watch_rise_for(reading.total_bytes)
        if reading.used_bytes - lowest > threshold:
            return Trigger.MEMORY_RISE
        if scanned - reading.used_bytes > threshold:
            return Trigger.MEMORY_FALL
        if reading.index not in self._pressured and self.policy.under_pressure(reading):
            return Trigger.PRESSURE
        return None


def _today_waiter_stopped(calls: ScanCalls) -> bool:
    """`ScanCalls.waiter_stopped` at 1cc036d: the waiter's stop read under the calls' lock."""
    with calls._lock:
        stop = calls._waiter_stop
    if stop is not None and stop.is_set():
        calls._posted.set()
        return True
    return False


class TodayWatch(MemoryWatch):
    """`MemoryWatch` with its reading as at 1cc036d: the sampler's reading, the trigger, `read_once` and `problem`
    (the start of a reading kept under a lock of its own); the pause between readings is the same."""

    def __init__(
        self,
        read: Callable[[], Iterable[GpuMemory]],
        trigger: Any,
        interval_s: float,
        clock: Clock = SYSTEM_CLOCK,
        log: structlog.typing.FilteringBoundLogger | None = None,
        calls: ScanCalls | None = None,
    ) -> None:
        sampler = getattr(read, "__self__", None)
        if isinstance(sampler, NvmlSampler):
            read = functools.partial(today_memory, sampler)
        super().__init__(read, TodayTrigger(trigger.policy), interval_s, clock, log, calls)  # type: ignore[arg-type]
        self._reading = threading.Lock()

    def problem(self, now: float) -> str | None:
        with self._reading:
            since = self._reading_since
        if since is None or now - since < watch.WATCH_STUCK_S:
            return None
        return f"memory watch: a reading has not returned for {now - since:.1f} s; scans at the poll only"

    def _step(self) -> float:
        if not self._paused.acquire(True, self.interval_s):
            self.read_once()
        return 0.0

    def read_once(self) -> None:
        if _today_waiter_stopped(self.calls):
            return
        read_at = self.clock.now()
        with self._reading:
            self._reading_since = read_at
        try:
            readings = tuple(self.read())
        except Exception as e:
            if self._failures.failed(type(e).__name__):
                self.log.warning("watch_read_failed", error=repr(e))
            return
        finally:
            with self._reading:
                self._reading_since = None
        self._failures.ok()
        self.readings += 1
        reason = self.trigger.check(readings)
        if reason is not None:
            self.calls.post(reason, read_at)


class FloorWatch(MemoryWatch):
    """The watch as it is, reading no GPU: what its wake-up every interval costs by itself."""

    def __init__(self, read: Callable[[], Iterable[GpuMemory]], *args: Any, **kwargs: Any) -> None:
        super().__init__(lambda: (), *args, **kwargs)


# -- the agents' processes --------------------------------------------------------------------------------------


def run_agent(variant: str, argv: Sequence[str]) -> None:
    """`vramguard run argv` in this process, as `variant`, each thread named in the kernel."""
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_name = 15
    thread_run = threading.Thread.run

    def named_run(self: threading.Thread) -> None:
        libc.prctl(pr_set_name, self.name[:15].encode(), 0, 0, 0)
        thread_run(self)

    threading.Thread.run = named_run  # type: ignore[method-assign]
    if variant == "today":
        watch.MemoryWatch = TodayWatch  # type: ignore[misc]
    elif variant == "floor":
        watch.MemoryWatch = FloorWatch  # type: ignore[misc]
    from vramguard.cli.main import main  # after the swap: the composition root takes the watch from there

    sys.argv = ["vramguard", *argv]
    main()


def start(node: SimulatedNode, variant: str) -> subprocess.Popen[bytes]:
    node.metrics_port = free_port()
    argv = node.vramguard_argv(
        "run", "--metrics-port", str(node.metrics_port), "--log-format", "json", "--mode", "kill"
    )
    assert argv[1:4] == ["-m", "vramguard", "run"], argv
    return subprocess.Popen(
        [sys.executable, __file__, "--agent", variant, *argv[3:]], env=node.env, stderr=subprocess.DEVNULL
    )


def watch_thread(pid: int) -> int:
    for task in os.listdir(f"/proc/{pid}/task"):
        if Path(f"/proc/{pid}/task/{task}/comm").read_text().strip() == WATCH_THREAD:
            return int(task)
    raise RuntimeError(f"no {WATCH_THREAD} thread in process {pid}")


def switches(pid: int, tid: int) -> int:
    """The thread's voluntary context switches: one each pause between readings."""
    for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise RuntimeError("no voluntary_ctxt_switches")


def run_ns(pid: int, tid: int) -> int:
    """The thread's time on a CPU in nanoseconds (`schedstat`): the same account as `stat`, without its ticks."""
    return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])


def by_thread(pid: int) -> dict[str, int]:
    """Each thread's time on a CPU in nanoseconds (`schedstat`), summed by its name."""
    found: dict[str, int] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{task}/comm").read_text().strip()
            found[name] = found.get(name, 0) + run_ns(pid, int(task))
        except OSError:
            continue  # a thread that ended meanwhile
    return found


def measure(agents: dict[str, subprocess.Popen[bytes]], seconds: float) -> dict[str, dict[str, float]]:
    """Each agent's watch thread and whole process over the same `seconds`."""
    tids = {v: watch_thread(p.pid) for v, p in agents.items()}

    def look() -> dict[str, tuple[float, float, int, int]]:
        return {
            v: (cpu_seconds(p.pid, tids[v]), cpu_seconds(p.pid), switches(p.pid, tids[v]), run_ns(p.pid, tids[v]))
            for v, p in agents.items()
        }

    threads_before = {v: by_thread(p.pid) for v, p in agents.items()}
    before, t0 = look(), time.monotonic()
    time.sleep(seconds)
    after, elapsed = look(), time.monotonic() - t0
    threads_after = {v: by_thread(p.pid) for v, p in agents.items()}
    out = {}
    for v in agents:
        watch_s, whole_s, n, ns = (a - b for a, b in zip(after[v], before[v], strict=True))
        out[v] = {
            "watch": watch_s / elapsed,
            "whole": whole_s / elapsed,
            "readings_per_s": n / elapsed,
            "us_per_reading": ns / max(n, 1) / 1000,
        }
        for name, ns in threads_after[v].items():
            out[v][f"thread:{name}"] = (ns - threads_before[v].get(name, 0)) / 1e9 / elapsed
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--agent"]:
        run_agent(args[1], args[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a 5 s window without settling: a smoke run")
    parser.add_argument("--seconds", type=float, default=20.0, help="the window the three agents are measured over")
    parser.add_argument("--settle", type=float, default=32.0, help="seconds at rest before the window")
    parser.add_argument("--processes", type=int, default=64, help="GPU processes at rest on each node's GPU")
    opts = parser.parse_args(args)
    if opts.quick:
        opts.seconds, opts.settle = 5.0, 0.0
    if os.geteuid() != 0 or (reason := cgroups_unavailable(version=2)) is not None:
        print(f"bench/watch_idle.py needs root and writable cgroups: {reason or 'not root'}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="vramguard-bench-") as tmp:
        nodes = {v: build_node(Path(tmp) / v, 1, opts.processes) for v in VARIANTS}
        agents: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for v in VARIANTS:
                agents[v] = start(nodes[v], v)
            for v in VARIANTS:
                nodes[v].wait_ready()
                nodes[v].wait_scans(2)
            time.sleep(opts.settle)
            got = measure(agents, opts.seconds)
        finally:
            for agent in agents.values():
                agent.terminate()
                agent.wait(10)
            for node in nodes.values():
                node.close()
    print(
        f"agents at rest, side by side over {opts.seconds:g} s (1 GPU, {opts.processes} GPU processes each; 1 s poll, "
        "20 ms watch; CPU as a share of one core)"
    )
    row = "{:<7} {:>13} {:>13} {:>12} {:>15}"
    print(row.format("agent", "watch thread", "whole agent", "readings/s", "CPU a reading"))
    for v in VARIANTS:
        g = got[v]
        print(
            row.format(
                v,
                f"{g['watch']:.2%}",
                f"{g['whole']:.2%}",
                f"{g['readings_per_s']:.1f}",
                f"{g['us_per_reading']:.0f} us",
            )
        )
    names = sorted({k for g in got.values() for k in g if k.startswith("thread:")})
    print("\nby thread (time on a CPU from schedstat, as a share of one core):")
    print(("{:<18}" + " {:>9}" * len(VARIANTS)).format("thread", *VARIANTS))
    for k in names:
        print(("{:<18}" + " {:>9}" * len(VARIANTS)).format(k[7:], *(f"{got[v].get(k, 0.0):.2%}" for v in VARIANTS)))
    print()
    today, new = got["today"], got["new"]
    for what, goal in (("watch", 0.25), ("whole", 0.5)):
        ratio = new[what] / today[what] if today[what] > 0 else float("nan")
        name = "watch thread" if what == "watch" else "whole agent"
        print(f"new / today, {name}: {ratio:.2f}   goal <= {goal:g}: {'met' if ratio <= goal else 'NOT met'}")
    floor = got["floor"]["us_per_reading"] / today["us_per_reading"]
    print(f"floor / today, CPU a reading: {floor:.2f} (the wake-up every 20 ms alone, which no reading path avoids)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
