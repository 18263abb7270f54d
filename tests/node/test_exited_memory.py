"""Memory with no process, end to end: `vramguard run` over the test NVML listing a PID that has no process.

A dead PID is a PID number with no process: the test NVML lists it as the driver would list a process whose memory
it still holds. The agent's threshold is cut to 2 s (`--exited-hold-seconds`, hidden) so that no test waits a minute.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from vramguard.core.quantity import GiB
from vramguard_testbed.simnode import SimulatedNode, json_logs, metric_value
from vramguard_testbed.waiting import wait_until

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]

POLL_S = 0.25
HOLD_S = 2.0
HELD = "vramguard_gpu_memory_held_by_exited_processes_bytes"


def dead_pid() -> int:
    """A PID number no process has: one that just exited and was reaped (the kernel hands it out again only after
    a lap of the PID space)."""
    done = subprocess.run(["true"], check=True)
    pid = subprocess.Popen(["true"])
    pid.wait()
    assert done.returncode == 0 and not Path(f"/proc/{pid.pid}").exists()
    return pid.pid


def list_ghost(sim_node: SimulatedNode, pid: int | None, used_bytes: int = 0) -> None:
    """What NVML lists now: the node's real processes, and `pid` holding `used_bytes` on GPU 0 (None: no ghost)."""
    sim_node.nvml.drop_dead_pids = False  # the driver keeps listing the exited process
    sim_node.sync()
    if pid is not None:
        sim_node.nvml.gpu(0).add_process(pid, used_bytes)
        sim_node.nvml.write(sim_node.state_path)


def status(sim_node: SimulatedNode) -> dict[str, Any]:
    code, body = sim_node.http_get("/status")
    assert code == 200
    doc: dict[str, Any] = json.loads(body)
    return doc


def start(sim_node: SimulatedNode) -> subprocess.Popen[str]:
    agent = sim_node.start_agent(
        "--mode",
        "kill",
        "--poll-interval",
        str(POLL_S),
        "--exited-hold-seconds",
        str(HOLD_S),
        stderr=subprocess.PIPE,
        text=True,
    )
    sim_node.wait_ready()
    return agent


def test_memory_a_dead_pid_holds_past_the_threshold_needs_a_reset(sim_node: SimulatedNode) -> None:
    """A dead PID's 3 GiB held past the threshold: the metric and /status say the GPU needs a reset, the Node is
    told once however many scans follow, the unattributed memory says why, and nothing is signalled."""
    trainer = sim_node.add_pod("trainer", "ml", containers={"main": {"vramguard.io/vram": "8Gi"}})
    live = sim_node.spawn(trainer, "main", GiB)
    ghost = dead_pid()
    list_ghost(sim_node, ghost, 3 * GiB)
    agent = start(sim_node)

    wait_until(
        lambda: metric_value(sim_node.http_get("/metrics")[1], HELD, {"gpu": "0"}) == 3 * GiB,
        HOLD_S + 10,
        what="the held-by-exited gauge at 3 GiB",
    )
    sim_node.wait_scans(8)  # the onset is past: these scans must not tell the Node again
    metrics = sim_node.http_get("/metrics")[1]
    assert metric_value(metrics, "vramguard_unattributed_gpu_memory_bytes", {"reason": "process-exited"}) == 3 * GiB
    assert metric_value(metrics, "vramguard_unattributed_gpu_memory_bytes", {"reason": "not-in-pod"}) == 0
    assert metric_value(metrics, "vramguard_actions_total", {"action": "kill"}) == 0
    doc = status(sim_node)
    (gpu,) = doc["gpus"]
    assert (gpu["needs_reset"], gpu["held_by_exited_bytes"], gpu["held_by_exited_pids"]) == (True, 3 * GiB, [ghost])
    (row,) = [r for r in doc["containers"] if r["pids"] == [ghost]]
    assert (row["reason"], row["state"]) == ("process-exited", "unattributed: held by an exited process")
    assert live.alive()

    sim_node.stop_agents()
    logs = json_logs(agent)
    onsets = [e for e in logs if e.get("event") == "gpu_needs_reset"]
    assert [(e["gpu"], e["held_bytes"], e["pids"]) for e in onsets] == [("0", 3 * GiB, [ghost])]
    # --pods-file: the Event goes to the log, as it would to the Node through the API server.
    events = [e for e in logs if e.get("event") == "event" and e.get("reason") == "VRAMGPUNeedsReset"]
    assert [e["pod"] for e in events] == [f"node/{sim_node.node_name}"]
    assert "needs a reset: 3.0GiB held by exited processes" in events[0]["message"]
    assert not [e for e in logs if e.get("event") == "action"], "no PID that does not exist is ever signalled"


def test_memory_a_dead_pid_lets_go_of_quickly_raises_nothing(sim_node: SimulatedNode) -> None:
    """A dead PID whose memory leaves NVML's list within the threshold is a teardown: after many more scans than
    the threshold lasts, nothing needs a reset and the Node was told nothing."""
    ghost = dead_pid()
    list_ghost(sim_node, None)
    agent = start(sim_node)
    list_ghost(sim_node, ghost, 3 * GiB)
    wait_until(
        lambda: (
            metric_value(
                sim_node.http_get("/metrics")[1],
                "vramguard_unattributed_gpu_memory_bytes",
                {"reason": "process-exited"},
            )
            == 3 * GiB
        ),
        10,
        what="the agent seeing the dead PID",
    )
    list_ghost(sim_node, None)  # torn down within the threshold
    sim_node.wait_scans(int(3 * HOLD_S / POLL_S))  # three thresholds' worth of scans
    metrics = sim_node.http_get("/metrics")[1]
    assert metric_value(metrics, HELD, {"gpu": "0"}) == 0
    assert metric_value(metrics, "vramguard_unattributed_gpu_memory_bytes", {"gpu": "0"}) == 0
    (gpu,) = status(sim_node)["gpus"]
    assert (gpu["needs_reset"], gpu["held_by_exited_bytes"]) == (False, 0)

    sim_node.stop_agents()
    logs = json_logs(agent)
    assert not [e for e in logs if e.get("event") == "gpu_needs_reset"]
    assert not [e for e in logs if e.get("reason") == "VRAMGPUNeedsReset"]
