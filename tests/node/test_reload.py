"""The policy reload in a real agent process on a simulated node: a ConfigMap-style swap of its policy file is in
force at a scan soon after, in the same process, through the same flags; a broken file keeps the last good
policy enforcing."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from vramguard.core.model import GiB
from vramguard_testbed.simnode import SimulatedNode, metric_value
from vramguard_testbed.waiting import wait_until

POLL_S = 0.2
# The agent reads its file every 2 s; a scan follows within a poll.
IN_FORCE_S = 10.0


def swap(volume: Path, content: str, version: int) -> None:
    """Update the volume as the kubelet updates a ConfigMap's: a new directory, `..data` renamed onto it."""
    stamp = volume / f"..2026_11_28_{version:02d}"
    stamp.mkdir()
    (stamp / "policy.yaml").write_text(content)
    (volume / "..data_tmp").symlink_to(stamp.name)
    os.rename(volume / "..data_tmp", volume / "..data")


def agent_part(node: SimulatedNode) -> dict[str, Any]:
    code, body = node.http_get("/status")
    assert code == 200, body
    part: dict[str, Any] = json.loads(body)["agent"]
    return part


def test_a_swapped_policy_file_is_enforced_by_the_same_process(sim_node: SimulatedNode, tmp_path: Path) -> None:
    volume = tmp_path / "policy"
    volume.mkdir()
    swap(volume, "mode: warn\n", 1)
    (volume / "policy.yaml").symlink_to("..data/policy.yaml")
    p = sim_node.add_pod("trainer", "ml", containers={"main": {"vramguard.io/vram": "1Gi"}})
    proc = sim_node.spawn(p, "main", 2 * GiB)
    agent = sim_node.start_agent(
        "--policy", str(volume / "policy.yaml"), "--poll-interval", str(POLL_S), "--watch-interval", "0s"
    )
    sim_node.wait_ready()
    sim_node.wait_scans(3)
    assert proc.alive(), "warn mode: over its quota, only warned"

    # The file turns kill mode on, and the watch on too: the flag's 0s wins, as at start. Driver limits, which a
    # warn-only agent built no limiter for, wait for a restart; the kills do not.
    swap(volume, "mode: kill\nwatch_interval: 50ms\n", 2)
    wait_until(lambda: not proc.alive(), IN_FORCE_S, what="the offender killed under the reloaded policy")
    status = agent_part(sim_node)
    assert status["mode"] == "kill" and status["policy"]["restart_needed"] == ["driver_limits"]
    assert agent.poll() is None, "the same agent process"

    swap(volume, "mode: kil\n", 3)
    refused = wait_until(
        lambda: (a := agent_part(sim_node))["policy"]["invalid"] and a, IN_FORCE_S, what="the broken file refused"
    )
    assert refused["mode"] == "kill" and '"kil"' in refused["policy"]["invalid"]
    metrics = sim_node.http_get("/metrics")[1]
    assert metric_value(metrics, "vramguard_policy_invalid") == 1.0
    assert metric_value(metrics, "vramguard_policy_reloads_total", {"result": "invalid"}) == 1.0
    again = sim_node.spawn(p, "main", 2 * GiB)
    wait_until(lambda: not again.alive(), IN_FORCE_S, what="the last good policy still killing")
    assert agent.poll() is None
