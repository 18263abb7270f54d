"""Benchmark: what the kubelet's exec probes and the health file cost. Root (the agent's part runs in pod cgroups).

    sudo .venv/bin/python bench/probes.py            # 50 probe starts each way, 3 rounds of the agent at rest
    sudo .venv/bin/python bench/probes.py --quick    # a smoke run in about a minute

It prints, measured side by side in one run:
(a) one probe as the kubelet runs it (a process: `vramguard-probe live`, the console script's own two lines) against
    an interpreter that only starts and exits, each started N times in turn: wall time and CPU (user + system of
    the child, from the kernel's accounting) per start, median and p95, and the ratio probe / bare;
(b) `vramguard run` at rest (the default 1 s poll and 20 ms watch, over the test NVML library with a few GPU
    processes) with its health file and with `--health-file ''`, alternating, R rounds of W seconds each: its CPU in
    millicores, and the difference, which is what writing the file every second costs.
At the chart's probes (liveness and readiness every 10 s) a node pays two probe starts each 10 s: the last line
multiplies (a) by that.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from scan import percentile
from vramguard.agent.health import write
from vramguard.base.healthfile import HealthDocument
from vramguard.core.quantity import GiB
from vramguard_testbed.cgroups import cgroups_unavailable
from vramguard_testbed.measure import cpu_seconds
from vramguard_testbed.simnode import SimulatedNode

# What pip's console script for `vramguard-probe` runs, as one command line: the same imports and the same call.
PROBE = "import sys; from vramguard.cli.probe import main; sys.exit(main())"
PROBES_PER_10_S = 2  # the chart's liveness and readiness, each every 10 s


def child_cost(argv: Sequence[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of `argv` to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall_s = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall_s, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def part_a(runs: int, workdir: Path) -> dict[str, dict[str, float]]:
    health = workdir / "health"
    write(str(health), HealthDocument(time.monotonic() + 3600, os.getpid(), (True, "last scan 0.3s ago"), (True, "ok")))
    commands = {
        "bare": [sys.executable, "-c", "pass"],
        "probe": [sys.executable, "-c", PROBE, "live", "--file", str(health)],
    }
    costs: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(runs):  # in turn, so that the machine's moods fall on both alike
        for name, argv in commands.items():
            costs[name].append(child_cost(argv))
    figures = {}
    for name, pairs in costs.items():
        walls, cpus = [w for w, _ in pairs], [c for _, c in pairs]
        figures[name] = {
            "wall_median_ms": statistics.median(walls) * 1000,
            "wall_p95_ms": percentile(walls, 95) * 1000,
            "cpu_median_ms": statistics.median(cpus) * 1000,
            "cpu_p95_ms": percentile(cpus, 95) * 1000,
        }
    print(f"(a) one start, milliseconds ({runs} each, in turn)")
    print(f"{'':8} {'wall median':>12} {'wall p95':>10} {'CPU median':>11} {'CPU p95':>9}")
    for name, f in figures.items():
        print(
            f"{name:8} {f['wall_median_ms']:12.1f} {f['wall_p95_ms']:10.1f} {f['cpu_median_ms']:11.1f} "
            f"{f['cpu_p95_ms']:9.1f}"
        )
    bare, probe = figures["bare"], figures["probe"]
    print(
        f"probe / bare: wall {probe['wall_median_ms'] / bare['wall_median_ms']:.2f}x, "
        f"CPU {probe['cpu_median_ms'] / max(bare['cpu_median_ms'], 1e-9):.2f}x"
    )
    return figures


def at_rest_millicores(node: SimulatedNode, seconds: float, *args: str) -> float:
    agent = node.start_agent(*args, stderr=subprocess.DEVNULL)
    try:
        node.wait_ready(60)
        node.wait_scans(2)
        cpu0 = cpu_seconds(agent.pid)
        time.sleep(seconds)
        return (cpu_seconds(agent.pid) - cpu0) / seconds * 1000
    finally:
        node.stop_agents()


def part_b(rounds: int, seconds: float, workdir: Path) -> dict[str, list[float]]:
    with SimulatedNode(workdir / "node") as node:
        for i in range(4):
            pod = node.add_pod(f"pod-{i}", "bench", containers={"main": {"vramguard.io/vram": "4Gi"}})
            node.spawn(pod, "main", GiB)
        shown = {"with the health file": (), "--health-file ''": ("--health-file", "")}
        rest: dict[str, list[float]] = {name: [] for name in shown}
        for _ in range(rounds):
            for name, args in shown.items():
                rest[name].append(at_rest_millicores(node, seconds, *args))
    print(f"\n(b) `vramguard run` at rest (1 s poll, 20 ms watch, 4 GPU processes), {rounds} rounds of {seconds:g} s")
    for name, values in rest.items():
        print(f"{name:22} {statistics.median(values):6.1f} millicores (median; each round: {values})")
    difference = statistics.median(rest["with the health file"]) - statistics.median(rest["--health-file ''"])
    print(f"the health file's writer: {difference:+.1f} millicores")
    return rest


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: fewer starts, shorter rounds")
    parser.add_argument("--runs", type=int, default=50, help="(a): starts of each command")
    parser.add_argument("--rounds", type=int, default=3, help="(b): rounds of each configuration")
    parser.add_argument("--seconds", type=float, default=20.0, help="(b): each round's window")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.rounds, args.seconds = 10, 1, 3.0
    reason = cgroups_unavailable(2)
    if reason is not None:
        print(f"bench/probes.py: {reason}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="vramguard-bench-probes-") as tmp:
        figures = part_a(args.runs, Path(tmp))
        part_b(args.rounds, args.seconds, Path(tmp))
    per_s = figures["probe"]["cpu_median_ms"] * PROBES_PER_10_S / 10
    print(f"\nthe chart's probes: {PROBES_PER_10_S} starts every 10 s = {per_s:.1f} millicores of the node's CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
