"""The peak a scrape cannot miss, on a simulated node: a spike shorter than any scrape interval shows in
vramguard_container_gpu_memory_peak_bytes for the minute after it, through the scans the watch calls for."""

from __future__ import annotations

import subprocess
import time

import pytest

from vramguard.core.quantity import GiB
from vramguard_testbed.simnode import SimulatedNode, metric_value
from vramguard_testbed.waiting import wait_until

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]

POLL_S = 30.0  # no poll falls within the spike: only the watch's scans see it


def test_a_spike_between_scrapes_is_the_exported_peak(sim_node: SimulatedNode) -> None:
    """A container at 1 GiB spikes to 5 GiB for 0.3 s and comes back: afterwards the usage gauge says 1 GiB, the
    peak gauge 5 GiB (a scan the watch called for saw it), and the neighbour's peak is its steady usage."""
    trainer = sim_node.add_pod("trainer", "ml", containers={"main": {"vramguard.io/vram": "8Gi"}})
    notebook = sim_node.add_pod("notebook", "ml", containers={"main": {"vramguard.io/vram": "8Gi"}})
    spiking = sim_node.spawn(trainer, "main", GiB)
    sim_node.spawn(notebook, "main", 2 * GiB)
    sim_node.start_agent("--mode", "kill", "--poll-interval", str(POLL_S), stderr=subprocess.DEVNULL)
    sim_node.wait_ready()

    sim_node.set_usage(spiking, 5 * GiB)
    time.sleep(0.3)
    sim_node.set_usage(spiking, GiB)

    def gauge(name: str, pod: str) -> float | None:
        return metric_value(sim_node.http_get("/metrics")[1], name, {"pod": pod})

    wait_until(
        lambda: gauge("vramguard_container_gpu_memory_used_bytes", "trainer") == GiB,
        10,
        what="a scan after the spike (the fall past watch_rise calls for one)",
    )
    assert gauge("vramguard_container_gpu_memory_peak_bytes", "trainer") == 5 * GiB
    assert gauge("vramguard_container_gpu_memory_peak_bytes", "notebook") == 2 * GiB
    assert spiking.alive(), "within its quota throughout"
