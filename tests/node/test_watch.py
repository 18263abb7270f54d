"""The watch between scans in real time: its thread paces and stops, and on a simulated node (`vramguard run` over
the test NVML library, real processes in pod cgroups) an allocation past a quota is acted on without waiting for the
poll, also when a free in the same interval hides it, and so is a pod learned after its process crossed; a churn
within quotas costs at most the triggered-scan rate; a watch stuck in the driver is reported, and the poll goes on.
The sampler's reading for the watch (`NvmlSampler.memory`) over the test NVML library: each opened GPU, nothing
made at rest, a GPU stuck in a scan left out."""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cgroup_fixtures import need_cgroups
from vramguard.agent.watch import WATCH_STUCK_S, MemoryWatch, ScanTrigger, Trigger
from vramguard.base.clock import SYSTEM_CLOCK
from vramguard.core.policy import Policy
from vramguard.core.quantity import GiB
from vramguard.core.sample import GpuMemory
from vramguard.nvml import NvmlSampler
from vramguard_testbed.fakenvml import FakeNode
from vramguard_testbed.simnode import SimProcess, SimulatedNode, metric_value
from vramguard_testbed.waiting import wait_until

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]
pytest_plugins = ["nvml_fixtures"]
MakeSampler = Callable[..., NvmlSampler]

POLL_S = 30.0  # far longer than any wait below: whatever happens, the poll did not do it


def _metric(node: SimulatedNode, name: str, **labels: str) -> float:
    return metric_value(node.http_get("/metrics")[1], name, labels) or 0.0


def _triggered(node: SimulatedNode) -> float:
    """Scans triggered before the poll, whatever the reason."""
    return _metric(node, "vramguard_triggered_scans_total")


def _dead_after(proc: SimProcess, change: Callable[[], None], limit_s: float) -> float:
    """Seconds from just before `change()` to `proc`'s exit (its pidfd turning readable); fails past `limit_s`."""
    pidfd = os.pidfd_open(proc.pid)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        started = time.monotonic()
        change()
        assert poller.poll(limit_s * 1000), f"pid {proc.pid} still alive {limit_s} s later"
        return time.monotonic() - started
    finally:
        os.close(pidfd)


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

    triggered = _triggered(sim_node)  # rises and falls alike
    assert 1 <= triggered <= 2 * elapsed + 2 + 1  # the burst, the rate, and one in flight at the end
    assert _metric(sim_node, "vramguard_scan_triggers_held_total") >= 1
    assert proc.alive(), "within its quota: never killed"


def test_a_crossing_hidden_by_a_free_in_one_interval_is_killed_by_the_scan_the_fall_calls_for(
    sim_node: SimulatedNode,
) -> None:
    """At a 30 s poll, one process frees 6 GiB while another takes 2 GiB past its quota, both in one write of the
    test NVML's state: the GPU's counter falls, the watch calls for a scan (memory-fall, no memory-rise), and that
    scan kills the offender long before the poll; the process that freed is untouched. (How fast: bench/scan.py,
    the "hidden" row.)"""
    freeing_pod = sim_node.add_pod("trainer", "ml", containers={"main": {"vramguard.io/vram": "10Gi"}})
    offender_pod = sim_node.add_pod("notebook", "ml", containers={"main": {"vramguard.io/vram": "2Gi"}})
    freeing = sim_node.spawn(freeing_pod, "main", 8 * GiB)
    offender = sim_node.spawn(offender_pod, "main", GiB)
    sim_node.start_agent("--mode", "kill", "--poll-interval", str(POLL_S), stderr=subprocess.DEVNULL)
    sim_node.wait_ready()
    scans, triggered = sim_node.scans(), _triggered(sim_node)

    def free_and_allocate() -> None:
        freeing.used_bytes = 2 * GiB  # written with the offender's usage, in one replacement of the state file
        sim_node.set_usage(offender, 3 * GiB)

    reaction_s = _dead_after(offender, free_and_allocate, 10.0)
    print(f"free-and-allocate crossing at a 30 s poll: offender dead {reaction_s * 1000:.0f} ms after the write")
    fall = _metric(sim_node, "vramguard_triggered_scans_total", reason=Trigger.MEMORY_FALL.value)
    rise = _metric(sim_node, "vramguard_triggered_scans_total", reason=Trigger.MEMORY_RISE.value)
    assert (fall >= 1, rise) == (True, 0.0), "the fall called for the scan; the GPU's counter never rose"
    wait_until(lambda: sim_node.scans() > scans, 10.0, what="the scan that killed it counted")
    assert sim_node.scans() - scans <= _triggered(sim_node) - triggered, "triggered scans only: not the poll"
    assert freeing.alive()


def test_a_pod_learned_after_its_process_crossed_is_scanned_at_once(sim_node: SimulatedNode) -> None:
    """At a 30 s poll, a process crosses its quota while its pod is not yet in the pods file (unattributed: no
    quota); the pods file then names the pod, and the offender is killed within a second, by a scan the pod
    update called for (pod-learned)."""
    late = sim_node.add_pod("late", "ml", containers={"main": {"vramguard.io/vram": "2Gi"}})
    offender = sim_node.spawn(late, "main", GiB)
    sim_node.pods.remove(late)  # its cgroup and process are there; the pod list does not name it yet
    sim_node.sync()
    sim_node.start_agent("--mode", "kill", "--poll-interval", str(POLL_S), stderr=subprocess.DEVNULL)
    sim_node.wait_ready()

    sim_node.set_usage(offender, 3 * GiB)  # a rise: the scan it triggers finds no pod for it
    unattributed = "vramguard_unattributed_gpu_memory_bytes"
    wait_until(lambda: _metric(sim_node, unattributed) == 3 * GiB, 10.0, what="a scan seeing the offender unattributed")
    assert offender.alive(), "no pod, no quota"

    def learn() -> None:
        sim_node.pods.append(late)
        sim_node.sync()

    reaction_s = _dead_after(offender, learn, 10.0)
    print(f"pod learned late at a 30 s poll: offender dead {reaction_s * 1000:.0f} ms after the pods file was written")
    assert reaction_s < 1.0, "the pods file is looked at every 100 ms; the scan it calls for kills"
    assert _metric(sim_node, "vramguard_triggered_scans_total", reason=Trigger.POD_LEARNED.value) == 1


def test_a_watch_stuck_in_the_driver_is_reported_and_the_poll_goes_on(tmp_path: Path) -> None:
    """GPU 0's memory-info call hangs in the driver: the watch's thread, which reads GPU 0 first, is stuck.
    /readyz names it after WATCH_STUCK_S, vramguard_watch_stuck is 1, the log says watch_stuck; an offender on
    GPU 1 is still killed, at the poll (no triggered scan). Once the call returns, ready again (watch_recovered)."""
    need_cgroups(2)
    with SimulatedNode(tmp_path / "node", gpus=2) as node:
        offender = node.spawn(
            node.add_pod("trainer", "ml", containers={"main": {"vramguard.io/vram": "2Gi"}}), "main", GiB, gpu=1
        )
        log = tmp_path / "agent.log"
        with log.open("w") as out:
            node.start_agent("--mode", "kill", stdout=out, stderr=out)  # the default poll, 1 s
        node.wait_ready()
        node.nvml.hang("nvmlDeviceGetMemoryInfo_v2", 600.0, device=0)
        node.sync()
        started = time.monotonic()
        wait_until(
            lambda: "memory watch" in node.http_get("/readyz")[1], WATCH_STUCK_S + 10.0, what="/readyz naming the watch"
        )
        print(f"/readyz named the stuck watch {time.monotonic() - started:.1f} s after the hang")
        status, body = node.http_get("/readyz")
        assert status == 503 and "a reading has not returned for" in body
        assert _metric(node, "vramguard_watch_stuck") == 1.0
        triggered = _triggered(node)

        reaction_s = _dead_after(offender, lambda: node.set_usage(offender, 3 * GiB), 10.0)
        print(f"watch stuck: offender on GPU 1 dead {reaction_s * 1000:.0f} ms after crossing (poll 1 s)")
        assert _triggered(node) == triggered, "killed by the poll: the watch read nothing"

        node.nvml.clear_faults()
        node.sync()
        node.wait_ready()
        node.wait_scans(1)
        assert _metric(node, "vramguard_watch_stuck") == 0.0
        events = [line for line in log.read_text().splitlines() if '"watch_' in line]
        assert ['"watch_stuck"' in events[0], '"watch_recovered"' in events[1], len(events)] == [True, True, 2]


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


@pytest.mark.parametrize("memory_v2", [True, False], ids=["memory-info-v2", "v1-on-a-driver-before-r510"])
def test_the_reading_is_each_opened_gpu_and_makes_nothing_at_rest(
    memory_v2: bool, nvml_state: Path, make_sampler: MakeSampler
) -> None:
    """The watch's reading has each GPU a scan opened, in the memory-info version the scan settled on; while no
    figure moves it is the same tuple (nothing made), and a GPU whose figures moved is read anew, the other kept."""
    node = FakeNode.gpus(2, total_bytes=80 * GiB)
    node.memory_v2 = memory_v2
    node.gpu(0).used_bytes = GiB
    node.write(nvml_state)
    sampler = make_sampler()
    assert sampler.memory() == (), "no scan has opened a GPU yet"
    sampler.sample()

    first = sampler.memory()
    assert [(m.index, m.total_bytes, m.used_bytes, m.free_bytes) for m in first] == [
        (0, 80 * GiB, GiB, 79 * GiB),
        (1, 80 * GiB, 0, 80 * GiB),
    ]
    assert sampler.memory() is first, "at rest: the last reading again"
    node.gpu(1).used_bytes = 3 * GiB
    node.write(nvml_state)
    moved = sampler.memory()
    assert [m.used_bytes for m in moved] == [GiB, 3 * GiB] and moved[0] is first[0]


def test_a_gpu_stuck_in_a_scan_is_left_out_of_the_reading_until_its_call_returns(
    nvml_state: Path, make_sampler: MakeSampler
) -> None:
    """The watch never calls into a GPU whose scan call hung past the deadline (its own call would hang too); once
    that call returns, the GPU is read again."""
    node = FakeNode.gpus(2)
    node.write(nvml_state)
    sampler = make_sampler(call_timeout_s=0.3)
    sampler.sample()
    node.hang("nvmlDeviceGetComputeRunningProcesses_v3", 60, device=0).write(nvml_state)
    assert not sampler.sample().devices[0].healthy

    assert [m.index for m in sampler.memory()] == [1]
    node.clear_faults().write(nvml_state)
    wait_until(lambda: [m.index for m in sampler.memory()] == [0, 1], what="GPU 0 in the reading again")
