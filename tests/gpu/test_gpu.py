"""On a real GPU: real CUDA processes (PyTorch) in real pod cgroups, and the agent killing the one over quota.

Runs where a GPU, PyTorch and root are present; everywhere else each test skips and says which is missing.
Set VRAMGUARD_GPU_REPORT=path to get the measured reaction time as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from real_parts import why_no_cuda
from vramguard_testbed.simnode import SimProcess, SimulatedNode, metric_value
from vramguard_testbed.waiting import wait_until

pytestmark = pytest.mark.gpu

# A CUDA program that allocates what it is told on stdin (GiB) and says so on stdout ("ready <bytes>"); "free"
# hands everything it holds back to the driver ("freed <bytes>").
ALLOCATOR = r"""
import sys, torch
held = []
def alloc(gib):
    held.append(torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda:0"))
    torch.cuda.synchronize()
    print("ready", torch.cuda.memory_allocated(0), flush=True)
alloc(float(sys.argv[1]))
for line in sys.stdin:
    if line.strip() == "free":
        held.clear()
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        print("freed", torch.cuda.memory_allocated(0), flush=True)
    else:
        alloc(float(line))
"""


@pytest.fixture
def gpu_node(tmp_path: Path) -> Iterator[SimulatedNode]:
    reason = why_no_cuda()
    if reason is not None:
        pytest.skip(f"GPU test: {reason}")
    with SimulatedNode(tmp_path / "node", real_gpu=True) as node:
        yield node


def _allocator(node: SimulatedNode, pod_name: str, quota: str, gib: float) -> SimProcess:
    pod = node.add_pod(pod_name, "ml", containers={"main": {"vramguard.io/vram": quota}})
    proc = node.spawn_command(
        pod,
        "main",
        [sys.executable, "-c", ALLOCATOR, str(gib)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.popen.stdout is not None
    line = proc.popen.stdout.readline()
    assert line.startswith("ready"), f"the CUDA program did not start: {line!r}"
    return proc


def test_cuda_process_over_quota_is_killed_and_neighbour_survives(gpu_node: SimulatedNode) -> None:
    """A PyTorch process that grows past its quota is killed within two polls; its neighbour keeps running."""
    poll_s = 0.1
    neighbour = _allocator(gpu_node, "neighbour", "3Gi", 1.0)
    offender = _allocator(gpu_node, "offender", "3Gi", 1.0)
    gpu_node.start_agent("--mode", "kill", "--poll-interval", str(poll_s), stderr=subprocess.DEVNULL)
    gpu_node.wait_ready()
    metrics = gpu_node.http_get("/metrics")[1]
    assert (metric_value(metrics, "vramguard_container_gpu_memory_used_bytes", {"pod": "offender"}) or 0) > 1 * 2**30

    assert offender.popen.stdin is not None and offender.popen.stdout is not None
    offender.popen.stdin.write("4\n")
    offender.popen.stdin.flush()
    offender.popen.stdout.readline()  # returns once the 4 GiB are allocated — or at EOF if it was killed first
    crossed = time.monotonic()
    wait_until(lambda: not offender.alive(), 10, what="the offender killed")
    reaction_s = time.monotonic() - crossed
    assert reaction_s <= 2 * poll_s + 0.5  # the CUDA teardown of a killed process takes a moment too
    assert neighbour.alive()

    def freed() -> bool:
        m = gpu_node.http_get("/metrics")[1]
        return metric_value(m, "vramguard_container_gpu_memory_used_bytes", {"pod": "offender"}) is None

    wait_until(freed, 10, what="the GPU memory released")
    _report(poll_s=poll_s, reaction_s=reaction_s)
    print(f"reaction time on a real GPU: {reaction_s * 1000:.0f} ms at a {poll_s * 1000:.0f} ms poll")


def _report(**figures: float) -> None:
    """Add `figures` to the JSON report at VRAMGUARD_GPU_REPORT, where it is set."""
    path = os.environ.get("VRAMGUARD_GPU_REPORT")
    if path:
        report = json.loads(Path(path).read_text()) if Path(path).exists() else {}
        Path(path).write_text(json.dumps({**report, **figures}))


def _send(proc: SimProcess, line: str) -> None:
    assert proc.popen.stdin is not None
    proc.popen.stdin.write(line + "\n")
    proc.popen.stdin.flush()


def test_a_free_that_hides_a_crossing_is_caught_between_polls(gpu_node: SimulatedNode) -> None:
    """One CUDA process hands 6 GiB back as another crosses its 3Gi quota by allocating 4 GiB, so the GPU's used
    memory falls: at a 30 s poll the offender is still killed within a second, by a scan the watch called for,
    and the process that freed is untouched."""
    freer = _allocator(gpu_node, "freer", "20Gi", 6.0)
    offender = _allocator(gpu_node, "offender", "3Gi", 1.0)
    gpu_node.start_agent("--mode", "kill", "--poll-interval", "30", stderr=subprocess.DEVNULL)
    gpu_node.wait_ready()
    gpu_node.wait_scans(1)

    _send(freer, "free")
    _send(offender, "4")
    assert offender.popen.stdout is not None and freer.popen.stdout is not None
    offender.popen.stdout.readline()  # once the 4 GiB are allocated, or at EOF if it was killed first
    crossed = time.monotonic()
    wait_until(lambda: not offender.alive(), 10, what="the offender killed before the 30 s poll", interval_s=0.005)
    reaction_s = time.monotonic() - crossed
    assert freer.popen.stdout.readline().startswith("freed") and freer.alive()
    metrics = gpu_node.http_get("/metrics")[1]
    reasons = {
        r: metric_value(metrics, "vramguard_triggered_scans_total", {"reason": r}) or 0.0
        for r in ("memory-rise", "memory-fall")
    }
    assert reaction_s < 1.0 and sum(reasons.values()) >= 1, reasons
    _report(free_and_cross_reaction_s=reaction_s)
    print(
        f"free and crossing on a real GPU: killed {reaction_s * 1000:.0f} ms after the allocation; triggers {reasons}"
    )


def test_a_cuda_process_left_in_a_deleted_pods_cgroup_is_reclaimed_and_its_memory_released(
    gpu_node: SimulatedNode, tmp_path: Path
) -> None:
    """A PyTorch process holding 2 GiB in the cgroup of a pod that leaves the pod list is killed once the orphan
    grace (10 s, the least) has passed, and the driver gives its memory back; a neighbour keeps running."""
    grace_s = 10.0
    neighbour = _allocator(gpu_node, "neighbour", "8Gi", 1.0)
    orphan = _allocator(gpu_node, "leftover", "8Gi", 2.0)
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"mode: kill\norphan_grace: {grace_s:g}s\n")
    gpu_node.start_agent("--policy", str(policy), "--poll-interval", "0.25", stderr=subprocess.DEVNULL)
    gpu_node.wait_ready()
    gpu_node.wait_scans(2)

    gpu_node.pods.remove(orphan.pod)  # type: ignore[arg-type]  # spawned in a pod
    gpu_node.sync()
    deleted = time.monotonic()
    wait_until(lambda: not orphan.alive(), grace_s + 15, what="the orphaned CUDA process killed")
    reclaim_s = time.monotonic() - deleted
    assert reclaim_s >= grace_s and neighbour.alive()

    def released() -> bool:
        m = gpu_node.http_get("/metrics")[1]
        return (
            metric_value(m, "vramguard_orphaned_gpu_memory_bytes", {"gpu": "0"}) == 0.0
            and metric_value(m, "vramguard_orphan_reclaims_total", {"result": "ok"}) == 1.0
            and (metric_value(m, "vramguard_unattributed_gpu_memory_bytes", {"gpu": "0", "reason": "orphaned"}) or 0)
            == 0.0
        )

    wait_until(released, 10, what="the orphan's GPU memory released")
    _report(orphan_grace_s=grace_s, orphan_reclaim_s=reclaim_s)
    print(f"orphan on a real GPU: killed {reclaim_s:.2f} s after its pod left the list (grace {grace_s:g} s)")
