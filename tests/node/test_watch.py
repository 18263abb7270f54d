"""The watch between scans in real time: its thread paces and stops, and on a simulated node (`vramguard run` over
the test NVML library, real processes in pod cgroups) an allocation past a quota is acted on without waiting for the
poll, and a churn within quotas costs at most the triggered-scan rate."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from vramguard.agent.watch import MemoryWatch, ScanTrigger
from vramguard.base.clock import SYSTEM_CLOCK
from vramguard.core.model import GiB, GpuMemory, Policy
from vramguard_testbed.simnode import SimulatedNode, metric_value
from vramguard_testbed.waiting import wait_until

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]

POLL_S = 30.0  # far longer than any wait below: whatever happens, the poll did not do it


def _metric(node: SimulatedNode, name: str, **labels: str) -> float:
    return metric_value(node.http_get("/metrics")[1], name, labels) or 0.0


def test_an_allocation_past_the_quota_is_killed_without_waiting_for_the_poll(sim_node: SimulatedNode) -> None:
    """At a 30 s poll, a process that crosses its quota is killed within seconds, by a scan the watch triggered;
    its neighbour on the same GPU is untouched."""
    offender_pod = sim_node.add_pod("trainer", "ml", containers={"main": {"vramguard.io/vram": "2Gi"}})
    neighbour_pod = sim_node.add_pod("notebook", "ml", containers={"main": {"vramguard.io/vram": "4Gi"}})
    offender = sim_node.spawn(offender_pod, "main", GiB)
    neighbour = sim_node.spawn(neighbour_pod, "main", 3 * GiB)
    sim_node.start_agent("--mode", "kill", "--poll-interval", str(POLL_S), stderr=subprocess.DEVNULL)
    sim_node.wait_ready()
    scans = sim_node.scans()

    sim_node.set_usage(offender, 3 * GiB)
    wait_until(lambda: not offender.alive(), 10.0, what="the offender killed before the 30 s poll")

    assert _metric(sim_node, "vramguard_triggered_scans_total", reason="memory-rise") >= 1
    assert sim_node.scans() - scans >= 1 and neighbour.alive()


def test_a_churn_within_quota_costs_at_most_the_triggered_scan_rate(sim_node: SimulatedNode, tmp_path: Path) -> None:
    """A container taking and freeing 1 GiB within its quota every 50 ms for 3 s: the watch triggers no more scans
    than triggered_scans_per_second allows (2 here, and a burst of 2), counts the triggers it held, kills nothing."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("triggered_scans_per_second: 2\n")
    pod = sim_node.add_pod("churner", "ml", containers={"main": {"vramguard.io/vram": "4Gi"}})
    proc = sim_node.spawn(pod, "main", GiB)
    sim_node.start_agent(
        "--mode", "kill", "--policy", str(policy), "--poll-interval", str(POLL_S), stderr=subprocess.DEVNULL
    )
    sim_node.wait_ready()

    started = time.monotonic()
    for i in range(60):
        sim_node.set_usage(proc, 2 * GiB if i % 2 == 0 else GiB)
        time.sleep(0.05)
    elapsed = time.monotonic() - started

    triggered = _metric(sim_node, "vramguard_triggered_scans_total", reason="memory-rise")
    assert 1 <= triggered <= 2 * elapsed + 2 + 1  # the burst, the rate, and one in flight at the end
    assert _metric(sim_node, "vramguard_scan_triggers_held_total") >= 1
    assert proc.alive(), "within its quota: never killed"


def test_the_stop_ends_the_pause_between_readings() -> None:
    """The watch's thread reads every `interval_s` of real time; a stop in the middle of an hour's pause ends the
    thread at once, not at the next reading."""
    read = threading.Event()

    def readings() -> tuple[GpuMemory, ...]:
        read.set()
        return ()

    fast = MemoryWatch(readings, ScanTrigger(Policy()), 0.01)
    fast.start()
    assert read.wait(5), "a reading after the first pause"
    fast.stop(SYSTEM_CLOCK.now() + 5)
    slow = MemoryWatch(readings, ScanTrigger(Policy()), 3600.0)
    slow.start()
    started = time.monotonic()
    slow.stop(SYSTEM_CLOCK.now() + 5)
    assert time.monotonic() - started < 1.0 and not slow.loop.running and not fast.loop.running
