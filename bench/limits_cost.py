"""Benchmark: what failing driver-limit calls cost the agent (issue 17, part 2). Run as root.

    sudo .venv/bin/python bench/limits_cost.py                    # 256 pods x 8 processes, 2 rounds of 60 s
    sudo .venv/bin/python bench/limits_cost.py --quick            # a smoke run: 16 pods, 1 round of 5 s
    sudo .venv/bin/python bench/limits_cost.py --agent-rev HEAD   # the agent as committed (git archive of src/)

One simulated node, as the end-to-end tests build it (testbed's SimulatedNode): the test NVML as an R615 driver
(per-cgroup limits), --gpus GPUs, --pods pods in real kubelet-shaped cgroup v2 directories, each with one
container with a VRAM quota and --per-pod real processes (sleeping; NVML lists each on a GPU, round robin, well
under the quota: nothing to kill), and a pods file. On that node the real agent (`vramguard run --mode kill`, driver
limits allowed, JSON logs) runs three times per round, each a fresh agent on the same processes, for the same
window after a warm-up, against three drivers:

- works: the limit calls work (the agent sets its limits, then reads them back); at this scale most of its cost
  is the test NVML's Get, which reads /proc for every process listed on the GPU to count the cgroup's usage (a
  few milliseconds a call with 256 processes per GPU), not a real driver's cost; its window starts once the
  agent has set its limits (no more set for 3 s after the warm-up; at most --settle s);
- unsupported: they answer NVML_ERROR_NOT_SUPPORTED (the state's memory_limits 0);
- failing: they answer NVML_ERROR_UNKNOWN, or --failure-code (the test NVML's fault injection on both
  nvmlDeviceSetMemoryLimits_v1 and nvmlDeviceGetMemoryLimits_v1; --fail set or get: only that one): the agent's
  LimitFailed, retried.

Rounds alternate the order (works, unsupported, failing; then the reverse), so a drift of the machine's load
weighs on each driver alike. For each run it prints, over the window:

- agent CPU: utime + stime of the agent process (all threads; /proc/<pid>/stat), as % of one core;
- scan p50: the median scan, interpolated within the buckets of vramguard_scan_duration_seconds as Prometheus'
  histogram_quantile does (coarse: bounds at 5, 10, 25, 50, 100, 250 ms); scan mean: exact, from the histogram's
  sum and count;
- calls/s: limit calls (Get and Set) the agent made, counted at its NVML binding (see below);
  logged/s: the same calls from the test NVML's call log (`fakenvml.limit_calls`), which does not record calls
  answered by an injected fault: 0 for `failing` is expected, a check of the count, not a figure;
- failed/s: `driver_limit` log lines with result failed; LimFail/s: VRAMLimitFailed Event lines (with a pods
  file the agent logs its Events);
- node busy: how busy the whole machine was (/proc/stat, all cores), the agent included: the noise.

Then the ratio of the failing driver's CPU to the unsupported one's (medians over rounds, and round by round).
Figures are printed, never judged: run it before and after a change on the same machine, and compare.

Counting calls: the agent runs from a small launcher that wraps pynvml's two limit functions with a counter in a
shared file (an increment per call; the agent's code is unchanged and runs as `vramguard run`), because the test
NVML's fault injection answers before the call is logged.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from vramguard.core.quantity import GiB, MiB
from vramguard_testbed.cgroups import cgroups_unavailable, device_holder_argv
from vramguard_testbed.fakenvml import NVML_ERROR_UNKNOWN, clear_driver_state
from vramguard_testbed.simnode import SimProcess, SimulatedNode, free_port
from vramguard_testbed.waiting import WaitTimeout

REPO = Path(__file__).resolve().parents[1]
CLOCK_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
COUNTS_ENV = "VRAMGUARD_BENCH_LIMIT_COUNTS"
COUNTERS = ("get", "get_errors", "set", "set_errors")
LIMIT_FUNCTIONS = ("nvmlDeviceGetMemoryLimits_v1", "nvmlDeviceSetMemoryLimits_v1")
DRIVERS = ("works", "unsupported", "failing")

# Runs `vramguard run` as `python -m vramguard run` would, with pynvml's two limit functions counted into the
# file named by COUNTS_ENV (4 little-endian uint64: get calls, get errors, set calls, set errors). NOT_FOUND (6,
# no limit held) is an answer, not an error. Only the limiter's worker thread makes these calls.
LAUNCHER = f"""\
import ctypes, mmap, os, sys

import pynvml

_fd = os.open(os.environ[{COUNTS_ENV!r}], os.O_RDWR)
_counts = (ctypes.c_uint64 * 4).from_buffer(mmap.mmap(_fd, 32))


def _counted(name, slot):
    original = getattr(pynvml, name, None)
    if original is None:
        return

    # Counted once the call has answered, its error and itself in adjacent stores: a reading taken while a call
    # is in flight then sees neither, so a window's calls and errors agree where every call fails.
    def call(*args, **kwargs):
        try:
            result = original(*args, **kwargs)
        except pynvml.NVMLError as e:
            if e.value != 6:
                _counts[slot + 1] += 1
            _counts[slot] += 1
            raise
        _counts[slot] += 1
        return result

    setattr(pynvml, name, call)


_counted({LIMIT_FUNCTIONS[0]!r}, 0)
_counted({LIMIT_FUNCTIONS[1]!r}, 2)
sys.argv[0] = "vramguard"
from vramguard.cli.main import main

main()
"""


@dataclass(frozen=True)
class Reading:
    """What is read at each end of a window."""

    at: float  # time.monotonic()
    cpu_ticks: int  # the agent's utime + stime
    node_busy: int  # /proc/stat, every core: jiffies not idle
    node_total: int
    buckets: tuple[tuple[float, float], ...]  # vramguard_scan_duration_seconds: (le, cumulative count)
    scan_sum: float
    scan_count: float
    calls: tuple[int, ...]  # COUNTERS
    logged_calls: int  # lines of the test NVML's call log
    log_offset: int  # bytes of the agent's log


@dataclass(frozen=True)
class Result:
    driver: str
    round: int
    cpu_pct: float
    scan_p50_ms: float | None
    scan_mean_ms: float | None
    scans: int
    calls_per_s: float
    call_errors_per_s: float
    logged_per_s: float
    failed_lines_per_s: float
    limit_failed_events_per_s: float
    node_busy_pct: float
    outcomes: dict[str, float]  # vramguard_driver_limits_total by outcome, over the window
    note: str = ""


# -- the node ----------------------------------------------------------------------------------------------------


def build_node(workdir: Path, pods: int, per_pod: int, gpus: int) -> SimulatedNode:
    """`pods` pods of one container, each with a 1 GiB quota and `per_pod` sleeping GPU processes of 64 MiB."""
    node = SimulatedNode(workdir, gpus=gpus, gpu_total_bytes=80 * GiB, driver_limits=True)
    # Nothing dies here, and the test library's /proc check of every row (how it imitates the driver freeing a
    # dead process' memory) would be measured as if it were the agent's cost (as in bench/scan.py).
    node.nvml.drop_dead_pids = False
    sync = node.sync
    node.sync = lambda: None  # type: ignore[method-assign]  # one write at the end, not one per pod
    try:
        for p in range(pods):
            pod = node.add_pod(f"job-{p}", "bench", containers={"main": {"vramguard.io/vram": "1Gi"}})
            for i in range(per_pod):
                argv = device_holder_argv(str(node.device_path), seconds=86400)
                popen = pod.containers["main"].spawn(argv, stdout=subprocess.DEVNULL)
                gpu = (p * per_pod + i) % gpus
                node.processes.append(SimProcess(popen=popen, gpu=gpu, used_bytes=64 * MiB, pod=pod, container="main"))
        del node.sync
        sync()
    except BaseException:
        node.close()  # every process spawned so far, and the cgroups
        raise
    return node


def set_driver(node: SimulatedNode, driver: str, failure_code: int, failing: Sequence[str]) -> None:
    """The test NVML's state for `driver`, with no limit held and an empty call log."""
    node.nvml.clear_faults()
    node.nvml.memory_limits = driver != "unsupported"
    if driver == "failing":
        for function in failing:
            node.nvml.inject_error(function, failure_code)
    node.sync()
    clear_driver_state(node.state_path)


def failing_functions(which: str) -> tuple[str, ...]:
    """The limit functions the `failing` driver answers with an error: both, or only Get or Set."""
    return LIMIT_FUNCTIONS if which == "both" else tuple(f for f in LIMIT_FUNCTIONS if which.title() in f)


# -- the agent ---------------------------------------------------------------------------------------------------


def agent_env(node: SimulatedNode, counts: Path, agent_src: Path | None) -> dict[str, str]:
    env = node.env
    env[COUNTS_ENV] = str(counts)
    if agent_src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(agent_src), *filter(None, [env.get("PYTHONPATH")])])
    return env


def start_agent(
    node: SimulatedNode, launcher: Path, env: dict[str, str], log: Path, poll_s: float
) -> subprocess.Popen[bytes]:
    node.metrics_port = free_port()
    argv = node.vramguard_argv(
        "run", "--metrics-port", str(node.metrics_port), "--log-format", "json",
        "--mode", "kill", "--driver-limits", "auto", "--poll-interval", str(poll_s),
    )  # fmt: skip
    if argv[1:3] != ["-m", "vramguard"]:
        raise RuntimeError(f"unexpected agent command line: {argv}")
    argv[1:3] = [str(launcher)]
    with log.open("wb") as out:
        return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=out)


def stop_agent(agent: subprocess.Popen[bytes]) -> None:
    if agent.poll() is None:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=15)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()


def read_counts(path: Path) -> tuple[int, ...]:
    return struct.unpack("<4Q", path.read_bytes()[:32])


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat(5)


def node_jiffies() -> tuple[int, int]:
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


def count_lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


def metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


def read_state(node: SimulatedNode, agent: subprocess.Popen[bytes], counts: Path, log: Path) -> Reading:
    status, metrics = node.http_get("/metrics")
    if status != 200:
        raise RuntimeError(f"the agent's /metrics answered {status}: {metrics[:300]}")
    bucket_samples = metric_samples(metrics, "vramguard_scan_duration_seconds_bucket")
    buckets = tuple(sorted((float(labels["le"]), value) for labels, value in bucket_samples))
    scan_sum = sum(v for _, v in metric_samples(metrics, "vramguard_scan_duration_seconds_sum"))
    scan_count = sum(v for _, v in metric_samples(metrics, "vramguard_scan_duration_seconds_count"))
    busy, total = node_jiffies()
    return Reading(
        at=time.monotonic(),
        cpu_ticks=cpu_ticks(agent.pid),
        node_busy=busy,
        node_total=total,
        buckets=buckets,
        scan_sum=scan_sum,
        scan_count=scan_count,
        calls=read_counts(counts),
        logged_calls=count_lines(Path(f"{node.state_path}.calls")),
        log_offset=log.stat().st_size,
    )


def outcome_counts(node: SimulatedNode) -> dict[str, float]:
    _, metrics = node.http_get("/metrics")
    return {labels["outcome"]: v for labels, v in metric_samples(metrics, "vramguard_driver_limits_total")}


SETTLED = ("applied", "late", "unchanged")


def settle(node: SimulatedNode, limit_s: float, step_s: float = 3.0) -> float:
    """With working limits, wait until the agent has programmed them: some limits set (applied, late or unchanged
    in vramguard_driver_limits_total) and no more for `step_s`; at most `limit_s`. The seconds it waited."""
    started = time.monotonic()
    done = -1.0
    while time.monotonic() - started < limit_s:
        now = sum(outcome_counts(node).get(k, 0.0) for k in SETTLED)
        if now > 0 and now == done:
            break
        done = now
        time.sleep(step_s)
    return time.monotonic() - started


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The q-quantile of a cumulative histogram, interpolated linearly within its bucket (as Prometheus does)."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound  # beyond the last finite bound: say that bound, as Prometheus does
            inside = count - lower_count
            return lower_bound + (bound - lower_bound) * ((rank - lower_count) / inside if inside else 0.0)
        lower_bound, lower_count = bound, count
    return None


def log_lines(log: Path, start: int, end: int) -> Iterator[dict[str, Any]]:
    with log.open("rb") as f:
        f.seek(start)
        for line in f.read(end - start).splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict):
                    yield entry


def measure(
    node: SimulatedNode,
    driver: str,
    round_: int,
    args: argparse.Namespace,
    launcher: Path,
    env: dict[str, str],
    counts: Path,
    workdir: Path,
) -> Result:
    set_driver(node, driver, args.failure_code, failing_functions(args.fail))
    counts.write_bytes(bytes(32))
    log = (args.logs or workdir) / f"agent-{driver}-{round_}.log"
    agent = start_agent(node, launcher, env, log, args.poll_interval)
    try:
        try:
            node.wait_ready(timeout_s=args.ready_timeout)
        except WaitTimeout:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the agent ({driver}) was not ready; its log ends:\n{tail}") from None
        time.sleep(args.warmup)
        settled_s = settle(node, args.settle) if driver == "works" else None
        outcomes_before = outcome_counts(node)
        first = read_state(node, agent, counts, log)
        time.sleep(args.window)
        if agent.poll() is not None:
            raise RuntimeError(f"the agent ({driver}) exited with {agent.returncode} during the window")
        # The CPU is read before the scrape (the first reading scraped before it), so neither scrape is counted.
        last = read_state(node, agent, counts, log)
        outcomes_after = outcome_counts(node)
    finally:
        stop_agent(agent)
    seconds = last.at - first.at
    buckets = [(le, c - dict(first.buckets).get(le, 0.0)) for le, c in last.buckets]
    scans = last.scan_count - first.scan_count
    p50 = histogram_quantile(0.5, buckets)
    calls = [b - a for a, b in zip(first.calls, last.calls, strict=True)]
    failed = limit_failed = 0
    for entry in log_lines(log, first.log_offset, last.log_offset):
        if entry.get("event") == "driver_limit" and entry.get("result") == "failed":
            failed += 1
        elif entry.get("event") == "event" and entry.get("reason") == "VRAMLimitFailed":
            limit_failed += 1
    busy = last.node_busy - first.node_busy
    outcomes = {k: v - outcomes_before.get(k, 0.0) for k, v in outcomes_after.items()}
    total = last.node_total - first.node_total
    notes = [] if settled_s is None else [f"waited {settled_s:.0f}s after the warm-up until no more limits were set"]
    if settled_s is not None and settled_s >= args.settle:
        notes = [f"limits still being programmed {args.settle:.0f}s after the warm-up"]
    if agent.returncode not in (0, -signal.SIGTERM):
        notes.append(f"agent exited with {agent.returncode} on SIGTERM")
    note = "; ".join(notes)
    return Result(
        driver=driver,
        round=round_,
        cpu_pct=100.0 * (last.cpu_ticks - first.cpu_ticks) * CLOCK_TICK_S / seconds,
        scan_p50_ms=None if p50 is None else p50 * 1000,
        scan_mean_ms=(last.scan_sum - first.scan_sum) / scans * 1000 if scans else None,
        scans=round(scans),
        calls_per_s=(calls[0] + calls[2]) / seconds,
        call_errors_per_s=(calls[1] + calls[3]) / seconds,
        logged_per_s=(last.logged_calls - first.logged_calls) / seconds,
        failed_lines_per_s=failed / seconds,
        limit_failed_events_per_s=limit_failed / seconds,
        node_busy_pct=100.0 * busy / total if total else 0.0,
        outcomes=outcomes,
        note=note,
    )  # fmt: skip


# -- the report --------------------------------------------------------------------------------------------------

ROW = "{:<12} {:>5} {:>9} {:>9} {:>9} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}"
HEADER = ROW.format(
    "driver", "round", "agent CPU", "scan p50", "scan mean", "scans", "calls/s", "errors/s", "logged/s",
    "failed/s", "LimFail/s", "node busy",
)  # fmt: skip


LEGEND = """\
(calls/s: limit calls, Get and Set, counted in the agent; errors/s: those answered with an error; logged/s: the
 test NVML's call log, which leaves out calls answered by an injected fault; failed/s: driver_limit log lines with
 result failed; LimFail/s: VRAMLimitFailed Event lines; node busy: all cores of the machine, the agent included)"""


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}ms"


def row(r: Result) -> str:
    return ROW.format(
        r.driver, r.round, f"{r.cpu_pct:.1f}%", ms(r.scan_p50_ms), ms(r.scan_mean_ms), r.scans,
        f"{r.calls_per_s:.1f}", f"{r.call_errors_per_s:.1f}", f"{r.logged_per_s:.1f}",
        f"{r.failed_lines_per_s:.1f}", f"{r.limit_failed_events_per_s:.1f}", f"{r.node_busy_pct:.0f}%",
    )  # fmt: skip


def summary(results: Sequence[Result]) -> list[str]:
    by = {d: [r for r in results if r.driver == d] for d in DRIVERS}
    lines = ["", "per driver (median over rounds; min-max):"]
    for d in DRIVERS:
        cpu = [r.cpu_pct for r in by[d]]
        scan = [r.scan_mean_ms for r in by[d] if r.scan_mean_ms is not None]
        lines.append(
            f"  {d:<12} agent CPU {statistics.median(cpu):.1f}% ({min(cpu):.1f}-{max(cpu):.1f})"
            + (f"   scan mean {statistics.median(scan):.1f}ms ({min(scan):.1f}-{max(scan):.1f})" if scan else "")
        )
    failing = statistics.median(r.cpu_pct for r in by["failing"])
    unsupported = statistics.median(r.cpu_pct for r in by["unsupported"])
    per_round = [
        f"{f.cpu_pct / u.cpu_pct:.2f}x" if u.cpu_pct > 0 else "-"
        for f, u in zip(by["failing"], by["unsupported"], strict=False)
    ]
    ratio = f"{failing / unsupported:.2f}x" if unsupported > 0 else "- (no CPU measured for unsupported)"
    lines += ["", f"failing/unsupported CPU: {ratio} (goal <= 1.5x); round by round: {', '.join(per_round)}"]
    return lines


def describe_agent(env: dict[str, str], agent_src: Path | None, rev: str | None) -> str:
    where = subprocess.run(
        [sys.executable, "-c", "import vramguard; print(vramguard.__file__)"],
        env=env, capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    if rev is not None:
        return f"{where} (git archive of {rev})"
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--", "src"], capture_output=True, text=True
    ).stdout.strip()
    state = f"HEAD {head.stdout.strip()}" + (" with uncommitted changes under src/" if dirty else "")
    return f"{where} ({state})" if agent_src is None else f"{where}"


def export_rev(rev: str, into: Path) -> Path:
    """`src/` of the commit `rev`, unpacked under `into` (the repository is not touched)."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "src"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 16 pods, 1 round, 3 s warm-up, 5 s window")
    parser.add_argument("--pods", type=int, default=256)
    parser.add_argument("--per-pod", type=int, default=8, help="GPU processes per pod")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--window", type=float, default=60.0, help="seconds measured per run")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds after the agent is ready, not measured")
    parser.add_argument("--repeat", type=int, default=2, help="rounds (each runs every driver once)")
    parser.add_argument(
        "--settle",
        type=float,
        default=180.0,
        help="at most this long after the warm-up, wait for `works` to set its limits",
    )
    parser.add_argument("--poll-interval", type=float, default=1.0, help="the agent's --poll-interval")
    parser.add_argument("--failure-code", type=int, default=NVML_ERROR_UNKNOWN, help="nvmlReturn_t of `failing`")
    parser.add_argument(
        "--fail",
        choices=("both", "get", "set"),
        default="both",
        help="which limit calls of `failing` answer --failure-code (with set, Get answers NOT_FOUND: no limit held)",
    )
    parser.add_argument("--ready-timeout", type=float, default=120.0)
    parser.add_argument("--logs", type=Path, help="keep each agent's log (JSON lines) in this directory")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--agent-src", type=Path, help="run the agent from this src/ directory")
    source.add_argument("--agent-rev", help="run the agent from this commit's src/ (git archive)")
    args = parser.parse_args(argv)
    if args.quick:
        args.pods, args.window, args.warmup, args.repeat, args.settle = 16, 5.0, 3.0, 1, 30.0
    if os.geteuid() != 0 or (reason := cgroups_unavailable(version=2)) is not None:
        print(f"bench/limits_cost.py needs root and writable cgroup v2: {reason or 'not root'}", file=sys.stderr)
        return 2

    # SIGTERM (and SIGINT, which a shell's background job ignores) ends the run through its clean-up: the agent
    # stopped, every process killed, the cgroups removed.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _interrupted)
    try:
        return run(args)
    except KeyboardInterrupt as e:
        print(f"\ninterrupted ({e or 'SIGINT'}); the agent, the processes and the cgroups are gone", file=sys.stderr)
        return 130


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vramguard-limits-cost-") as tmp:
        work = Path(tmp)
        agent_src = args.agent_src.resolve() if args.agent_src else None
        if args.agent_rev:
            agent_src = export_rev(args.agent_rev, work / "agent")
        launcher, counts = work / "launch_agent.py", work / "limit-calls.counts"
        launcher.write_text(LAUNCHER)
        counts.write_bytes(bytes(32))
        t0 = time.monotonic()
        node = build_node(work / "node", args.pods, args.per_pod, args.gpus)
        try:
            env = agent_env(node, counts, agent_src)
            built_s = time.monotonic() - t0
            print(
                f"node: {args.gpus} GPUs, {args.pods} pods x {args.per_pod} GPU processes = "
                f"{len(node.processes)} processes, one container with a 1 GiB quota per pod "
                f"(built in {built_s:.0f}s)"
            )
            print(f"agent: {describe_agent(env, agent_src, args.agent_rev)}")
            print(
                f"       vramguard run --mode kill --driver-limits auto --poll-interval {args.poll_interval:g}; "
                f"a fresh agent per run; {args.warmup:g}s warm-up after ready, then a {args.window:g}s window"
            )
            print(
                f"failing: the test NVML answers {args.failure_code} to {' and '.join(failing_functions(args.fail))}; "
                f"machine: {os.cpu_count()} cores, load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}"
            )
            print()
            print(HEADER, flush=True)
            results: list[Result] = []
            for round_ in range(1, args.repeat + 1):
                order = DRIVERS if round_ % 2 else tuple(reversed(DRIVERS))
                for driver in order:
                    r = measure(node, driver, round_, args, launcher, env, counts, work)
                    results.append(r)
                    print(row(r), flush=True)
            print(LEGEND)
            print("\ndriver limit outcomes in each window (vramguard_driver_limits_total):")
            for r in results:
                shown = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r.outcomes.items()) if v) or "none"
                print(f"  {r.driver:<12} round {r.round}: {shown}" + (f"   ({r.note})" if r.note else ""))
            for line in summary(results):
                print(line)
        finally:
            node.close()
    print(f"\n(the whole run took {time.monotonic() - started:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
