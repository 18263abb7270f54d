"""The policy reload in a real agent process on a simulated node: a ConfigMap-style swap of its policy file is in
force at a scan soon after, in the same process, through the same flags; a broken file keeps the last good
policy enforcing; a half-written file is never in force, and what is not a policy file (a FIFO, /dev/zero, a file
of 100 MB) neither blocks the reloader nor grows the agent."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from policy_fixtures import swap_in, write_atomically
from vramguard.agent.reload import CHECK_INTERVAL_S, digest_of
from vramguard.core.quantity import GiB, MiB
from vramguard_testbed.simnode import SimulatedNode, json_logs, metric_value
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


def looks(node: SimulatedNode) -> int:
    """The reloader's looks at the file completed so far: its cycles, counted."""
    return int(agent_part(node)["policy"]["checks"])


def after_swap(node: SimulatedNode, swap: Callable[[], None], holds: Callable[[Any], object], what: str) -> Any:
    """The policy part of /status once `holds` of it after `swap()`, which must come at the reloader's first look
    after the swap: within one interval, counted in looks. The swap follows a look at once (the next is an interval
    away), so that no look is under way across it."""
    wait_looks(node, 1)
    before = looks(node)
    swap()
    swapped_at = time.monotonic()

    def seen() -> Any:
        policy = agent_part(node)["policy"]
        return policy if holds(policy) else None

    policy = wait_until(seen, IN_FORCE_S, what=what)
    print(f"{what}: {time.monotonic() - swapped_at:.2f} s after the swap")
    assert policy["checks"] - before == 1, f"{what}: at the reloader's look {policy['checks'] - before} after the swap"
    return policy


def wait_looks(node: SimulatedNode, n: int) -> None:
    target = looks(node) + n
    wait_until(lambda: looks(node) >= target, n * CHECK_INTERVAL_S + IN_FORCE_S, what=f"{n} more looks at the file")


def peak_rss_bytes(pid: int) -> int:
    """The process's peak resident memory (VmHWM): a read that grew it for a moment shows."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


START = "mode: kill\nexempt_namespaces:\n  - kube-system\n  - research\n"
HALF = "mode: kill\nexempt_namespaces:\n  - kube-system\n  - ops\n"  # a policy too: research not exempt
REST = "  - research\n"


def test_a_policy_written_in_place_in_two_steps_is_never_in_force_halfway(
    sim_node: SimulatedNode, tmp_path: Path
) -> None:
    """A writer rewrites the file in place and stops after `exempt_namespaces:`'s next-to-last entry until the
    reloader has read it, then writes the last (a pause shorter than the interval from that look): the half is
    never put in force and the exempt namespace's pod over its quota is never killed; the whole is in force."""
    path = tmp_path / "policy.yaml"
    path.write_text(START)
    p = sim_node.add_pod("trainer", "research", containers={"main": {"vramguard.io/vram": "1Gi"}})
    proc = sim_node.spawn(p, "main", 2 * GiB)
    agent = sim_node.start_agent("--policy", str(path), "--poll-interval", str(POLL_S), "--watch-interval", "0s")
    sim_node.wait_ready()
    sim_node.wait_scans(3)
    assert proc.alive(), "exempt: over its quota, left alone"

    with path.open("r+") as f:  # one writer, the same inode
        f.truncate()
        f.write(HALF)
        f.flush()
        wait_looks(sim_node, 1)
        f.write(REST)
        f.flush()
    whole = digest_of((HALF + REST).encode())
    wait_until(lambda: agent_part(sim_node)["policy"]["sha256"] == whole, IN_FORCE_S, what="the whole policy in force")
    sim_node.wait_scans(3)
    assert proc.alive(), "the exempt namespace's pod never killed: the half was never in force"
    metrics = sim_node.http_get("/metrics")[1]
    assert metric_value(metrics, "vramguard_policy_reloads_total", {"result": "applied"}) == 1.0, "the whole only"
    assert agent.poll() is None


def test_a_fifo_at_the_path_is_refused_and_a_good_file_after_it_is_in_force_within_an_interval(
    sim_node: SimulatedNode, tmp_path: Path
) -> None:
    """A FIFO renamed over the policy file neither blocks the reloader nor the agent: refused with one log line
    naming the path and what is there, and a good file renamed over it afterwards is in force within one
    interval (at the reloader's first look after the swap)."""
    path = tmp_path / "policy.yaml"
    path.write_text("mode: kill\n")
    agent = sim_node.start_agent(
        "--policy", str(path), "--poll-interval", str(POLL_S), stderr=subprocess.PIPE, text=True
    )
    sim_node.wait_ready()
    os.mkfifo(tmp_path / "fifo")
    refused = after_swap(
        sim_node, lambda: os.rename(tmp_path / "fifo", path), lambda p: p["invalid"], what="the FIFO refused"
    )
    assert "is a FIFO" in refused["invalid"]
    wait_looks(sim_node, 2)  # the reloader goes on looking

    good = "mode: warn\n"
    in_force = after_swap(
        sim_node,
        lambda: write_atomically(path, good),
        lambda p: p["sha256"] == digest_of(good.encode()),
        what="the good file in force within an interval",
    )
    assert in_force["invalid"] is None
    sim_node.stop_agents()
    refusals = [e for e in json_logs(agent) if e.get("event") == "policy_refused"]
    assert [(e["path"], "FIFO" in e["error"]) for e in refusals] == [(str(path), True)], "one line, however many looks"


def make_big_file(path: Path) -> None:
    with path.open("wb") as f:
        f.truncate(100 * 10**6)  # sparse: 100 MB of zeros to whoever reads it


@pytest.mark.parametrize(
    ("make", "says"),
    [
        pytest.param(lambda path: path.symlink_to("/dev/zero"), "is a character device", id="dev-zero"),
        pytest.param(make_big_file, "over the 1.0MiB", id="100MB-file"),
    ],
)
def test_an_endless_or_huge_file_is_refused_at_once_and_the_agent_does_not_grow(
    sim_node: SimulatedNode, tmp_path: Path, make: Callable[[Path], None], says: str
) -> None:
    """/dev/zero or a 100 MB file swapped in as the policy is refused within an interval, and the agent's peak
    memory does not grow over the looks that follow: nothing past 1 MiB is ever read."""
    path = tmp_path / "policy.yaml"
    path.write_text("mode: warn\n")
    agent = sim_node.start_agent("--policy", str(path), "--poll-interval", str(POLL_S))
    sim_node.wait_ready()
    sim_node.wait_scans(3)
    before = peak_rss_bytes(agent.pid)
    make(tmp_path / "bad")
    refused = after_swap(
        sim_node, lambda: swap_in(path, tmp_path / "bad"), lambda p: p["invalid"], what="the file refused"
    )["invalid"]
    wait_looks(sim_node, 2)
    grown = peak_rss_bytes(agent.pid) - before
    assert grown < 16 * MiB, f"the agent's peak memory grew {grown / MiB:.1f} MiB"
    assert says in refused
