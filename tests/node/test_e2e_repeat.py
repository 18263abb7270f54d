"""No way around a kill: supervisors that respawn GPU workers, on real processes in real pod cgroups.

`vramguard run` as a subprocess over the test NVML library; each worker allocates through the test driver, which
frees its memory when it exits, as the real driver does. Usage over time is read from the driver's allocations
and the container's cgroup, every 10 ms.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from vramguard.core.quantity import GiB, MiB
from vramguard.node.procfs import boot_ticks, read_stat
from vramguard.node.repeats import OLD_FORMAT, OLDER_THAN_CONTAINER, STARTS_LATER, STILL_RUNNING
from vramguard_testbed.simnode import SimPod, SimulatedNode, json_logs, metric_value
from vramguard_testbed.waiting import wait_until

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]

POLL_S = 0.5
QUOTA = {"vramguard.io/vram": "1Gi"}


def _metric(node: SimulatedNode, name: str, **labels: str) -> float | None:
    return metric_value(node.http_get("/metrics")[1], name, labels)


def _start(node: SimulatedNode, tmp_path: Path, policy: str = "", **popen_kwargs: Any) -> subprocess.Popen[Any]:
    path = tmp_path / "policy.yaml"
    path.write_text(policy)
    agent = node.start_agent("--mode", "kill", "--poll-interval", str(POLL_S), "--policy", str(path), **popen_kwargs)
    node.wait_ready()
    return agent


def _over_quota_fraction(node: SimulatedNode, pod: SimPod, seconds: float) -> float:
    """The share of 10 ms samples, over `seconds`, in which the container held more than its 1 GiB quota."""
    over = total = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        over += node.container_used_bytes(pod, "main") > 1 * GiB
        total += 1
        time.sleep(0.01)
    return over / total


def _neighbour(node: SimulatedNode) -> subprocess.Popen[str]:
    """A pod on the same GPU, within its quota: never to be touched."""
    notebook = node.add_pod("notebook", "ml", containers={"main": {"vramguard.io/vram": "4Gi"}})
    return node.spawn(notebook, "main", 3 * GiB).popen


@pytest.mark.parametrize(
    ("policy", "most", "least", "escalated"),
    [
        pytest.param("", 0.10, 0.0, True, id="default-policy-bounds-the-pod"),
        pytest.param("cooldown: 0s\n", 0.10, 0.0, True, id="cooldown-0s-bounds-the-pod-too"),
        pytest.param("on_repeat: wait\n", 1.0, 0.5, False, id="on-repeat-wait-leaves-it-over-as-before"),
    ],
)
def test_respawning_supervisor_is_bounded(
    sim_node: SimulatedNode, tmp_path: Path, policy: str, most: float, least: float, escalated: bool
) -> None:
    """A supervisor forking a 400 MiB worker every 20 ms (each lives 100 ms: about 2 GiB against 1 GiB) is over
    its quota at most 10 % of 20 s: its first kill takes the workers, the repeat the whole container, whatever
    the cooldown (0s included: a repeat has a window of its own). With on_repeat: wait, the cooldown leaves it
    over its quota for most of the time, as before."""
    ray = sim_node.add_pod("ray", "ml", containers={"main": QUOTA})
    neighbour = _neighbour(sim_node)
    _start(sim_node, tmp_path, policy)
    supervisor = sim_node.spawn_supervisor(ray, "main", 400 * MiB, interval_s=0.02, hold_s=0.1)

    fraction = _over_quota_fraction(sim_node, ray, 20.0)
    print(f"over quota in {fraction:.1%} of 20 s of 10 ms samples ({policy.strip() or 'default policy'})")

    assert least <= fraction <= most
    assert neighbour.poll() is None, "the neighbour on the same GPU is never touched"
    escalations = _metric(sim_node, "vramguard_escalations_total", namespace="ml", step="kill-container")
    if not escalated:
        assert supervisor.poll() is None and escalations is None
    else:
        assert supervisor.poll() is not None, "the supervisor went with its container"
        assert ray.containers["main"].pids() == [], "every process of the container is gone"
        assert escalations == 1.0


def test_supervisor_respawning_after_longer_than_a_poll(sim_node: SimulatedNode, tmp_path: Path) -> None:
    """A supervisor that waits 0.8 s (longer than the 0.5 s poll) before replacing its killed 2 GiB worker: the
    replacement is a repeat all the same, and the whole container goes."""
    ray = sim_node.add_pod("ray", "ml", containers={"main": QUOTA})
    neighbour = _neighbour(sim_node)
    _start(sim_node, tmp_path)
    supervisor = sim_node.spawn_supervisor(ray, "main", 2 * GiB, max_workers=1, hold_s=3600, respawn_delay_s=0.8)

    wait_until(lambda: supervisor.poll() is not None, 10, what="the repeat to take the supervisor too")
    sim_node.wait_scans(1)
    assert _metric(sim_node, "vramguard_actions_total", action="kill", result="ok") == 2.0
    assert _metric(sim_node, "vramguard_escalations_total", namespace="ml", step="kill-container") == 1.0
    assert ray.containers["main"].pids() == []
    assert neighbour.poll() is None


def test_over_once_then_within_quota_is_not_escalated(sim_node: SimulatedNode) -> None:
    """A container over its quota once loses its GPU process; a new one within the quota, and the container's
    other processes, live on: no escalation."""
    trainer = sim_node.add_pod("trainer", "ml", containers={"main": QUOTA})
    neighbour = _neighbour(sim_node)
    shell = trainer.containers["main"].spawn(["sleep", "600"])  # holds no GPU: not the killer's business
    greedy = sim_node.spawn(trainer, "main", 2 * GiB)
    sim_node.start_agent("--mode", "kill", "--poll-interval", str(POLL_S))
    sim_node.wait_ready()
    wait_until(lambda: not greedy.alive(), 3 * POLL_S, what="the over-quota process killed")

    modest = sim_node.spawn(trainer, "main", 512 * MiB)
    sim_node.wait_scans(4)
    assert modest.alive() and shell.poll() is None and neighbour.poll() is None
    assert _metric(sim_node, "vramguard_actions_total", action="kill", result="ok") == 1.0
    assert _metric(sim_node, "vramguard_escalations_total", namespace="ml", step="kill-container") is None


def test_restarted_container_over_its_quota_is_killed_within_one_scan(sim_node: SimulatedNode, tmp_path: Path) -> None:
    """After a kill, the restarted container (a new runtime ID) over its quota again is killed at the next scan,
    the 60 s cooldown notwithstanding (the kubelet's back-off spaces restarts), and like any offender: its GPU
    process only, not as a repeat."""
    trainer = sim_node.add_pod("trainer", "ml", containers={"main": QUOTA})
    first = sim_node.spawn(trainer, "main", 2 * GiB)
    _start(sim_node, tmp_path, "cooldown: 60s\n")
    wait_until(lambda: not first.alive(), 3 * POLL_S, what="the first process killed")

    sim_node.restart_container(trainer, "main")
    shell = trainer.containers["main"].spawn(["sleep", "600"])
    scans_before = sim_node.scans()
    again = sim_node.spawn(trainer, "main", 2 * GiB)
    wait_until(lambda: not again.alive(), 10 * POLL_S, what="the restarted container's process killed")
    scans = sim_node.scans() - scans_before
    print(f"the restarted container's process was killed {scans:g} scans after it started")
    assert scans <= 2, "killed by the scan running when it appeared or the next one"
    assert shell.poll() is None, "a plain kill: the container's other processes live"
    # The process dies inside the kill call, before the action is counted: wait for the count, not the death.
    wait_until(
        lambda: _metric(sim_node, "vramguard_actions_total", action="kill", result="ok") == 2.0,
        10 * POLL_S,
        what="the second kill counted",
    )
    assert _metric(sim_node, "vramguard_escalations_total", namespace="ml", step="kill-container") is None


def test_the_repeat_memory_survives_an_agent_restart(sim_node: SimulatedNode, tmp_path: Path) -> None:
    """The agent kills a container's over-quota process and is restarted (same --state-dir); the same container
    instance over its quota again is a repeat for the new agent: the whole container goes."""
    trainer = sim_node.add_pod("trainer", "ml", containers={"main": QUOTA})
    shell = trainer.containers["main"].spawn(["sleep", "600"])  # holds no GPU: only a repeat takes it
    first = sim_node.spawn(trainer, "main", 2 * GiB)
    _start(sim_node, tmp_path)
    wait_until(lambda: not first.alive(), 3 * POLL_S, what="the first process killed")
    assert shell.poll() is None, "the first kill is a plain one"
    sim_node.stop_agents()

    again = sim_node.spawn(trainer, "main", 2 * GiB)
    _start(sim_node, tmp_path)
    wait_until(lambda: shell.poll() is not None, 3 * POLL_S, what="the repeat to take the whole container")
    assert not again.alive()
    assert _metric(sim_node, "vramguard_escalations_total", namespace="ml", step="kill-container") == 1.0
    assert (sim_node.state_dir / "kills.json").is_file(), "where the memory was kept"


def test_the_repeat_after_a_restart_says_the_kill_was_restored(sim_node: SimulatedNode, tmp_path: Path) -> None:
    """The agent restarted after a kill logs what it restored from kills.json (the container, short), and its
    escalation of the real repeat says, in its log line and its Event, that the kill was an earlier agent's."""
    trainer = sim_node.add_pod("trainer", "ml", containers={"main": QUOTA})
    container_id = trainer.containers["main"].container_id
    shell = trainer.containers["main"].spawn(["sleep", "600"])
    first = sim_node.spawn(trainer, "main", 2 * GiB)
    _start(sim_node, tmp_path)
    wait_until(lambda: not first.alive(), 3 * POLL_S, what="the first process killed")
    sim_node.stop_agents()

    again = sim_node.spawn(trainer, "main", 2 * GiB)
    agent = _start(sim_node, tmp_path, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: shell.poll() is not None, 3 * POLL_S, what="the repeat to take the whole container")
    assert not again.alive()
    sim_node.stop_agents()
    logs = json_logs(agent)
    (restored,) = [e for e in logs if e.get("event") == "kill_memory_restored"]
    assert (restored["restored"], restored["containers"]) == (1, [container_id[:12]])
    assert not [e for e in logs if e.get("event") == "kill_memory_refused"]
    said = "of the last kill (a kill recorded by an earlier agent, restored from kills.json)"
    (kill,) = [e for e in logs if e.get("event") == "action" and e.get("action") == "kill"]
    assert said in kill["escalation"]
    (event,) = [e for e in logs if e.get("event") == "event" and e.get("reason") == "VRAMKilled"]
    assert f"{said}: stopped the whole container" in event["message"]


def _free_pid() -> int:
    """A PID no process holds now."""
    return next(pid for pid in range(4_000_000, 0, -1) if not os.path.exists(f"/proc/{pid}"))


def _start_time(pid: int) -> int:
    found = read_stat(pid)
    assert found is not None
    return found[1]


# What someone other than the agent writes for the container (this boot, its ID, a kill 5 s ago), and why the agent
# refuses it: each entry names the processes "killed" through a function of the container's shell.
FORGED = [
    pytest.param(None, OLD_FORMAT, id="no-killed-processes-as-before-format-2"),
    pytest.param(
        lambda shell: [[_free_pid(), 1]], OLDER_THAN_CONTAINER, id="a-made-up-process-older-than-the-container"
    ),
    pytest.param(
        lambda shell: [[shell, _start_time(shell)]], STILL_RUNNING, id="the-containers-running-shell-as-killed"
    ),
    pytest.param(
        lambda shell: [[_free_pid(), boot_ticks() + 100_000]], STARTS_LATER, id="a-made-up-process-from-the-future"
    ),
]


@pytest.mark.parametrize(("killed", "problem"), FORGED)
def test_a_forged_kill_memory_does_not_escalate(
    sim_node: SimulatedNode, tmp_path: Path, killed: Callable[[int], list[list[int]]] | None, problem: str
) -> None:
    """A kills.json entry the agent never wrote, written before it starts, is refused and reported (the container,
    and why); the container's first offence is a plain kill: its GPU process goes, its other process lives."""
    trainer = sim_node.add_pod("trainer", "ml", containers={"main": QUOTA})
    container_id = trainer.containers["main"].container_id
    shell = trainer.containers["main"].spawn(["sleep", "600"])  # holds no GPU: only an escalation would take it
    greedy = sim_node.spawn(trainer, "main", 1536 * MiB)  # a small offence: 1.5 GiB against 1 GiB
    at = time.monotonic() - 5  # the agent's clock (CLOCK_MONOTONIC)
    entry: object = at if killed is None else {"at": at, "killed": killed(shell.pid)}
    document: dict[str, object] = {"boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip()}
    document |= {"kills": {container_id: entry}} if killed is None else {"version": 2, "kills": {container_id: entry}}
    sim_node.state_dir.mkdir(parents=True, exist_ok=True)
    (sim_node.state_dir / "kills.json").write_text(json.dumps(document))

    agent = _start(sim_node, tmp_path, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: not greedy.alive(), 3 * POLL_S, what="the over-quota process killed")
    sim_node.wait_scans(2)
    assert shell.poll() is None, "a plain kill: the container's other process lives"
    assert _metric(sim_node, "vramguard_actions_total", action="kill", result="ok") == 1.0
    assert _metric(sim_node, "vramguard_escalations_total", namespace="ml", step="kill-container") is None
    sim_node.stop_agents()
    logs = json_logs(agent)
    (refused,) = [e for e in logs if e.get("event") == "kill_memory_refused"]
    assert (refused["refused"], refused["containers"], refused["problems"]) == (1, [container_id[:12]], [problem])
    assert not [e for e in logs if e.get("event") == "kill_memory_restored"]
    (kill,) = [e for e in logs if e.get("event") == "action" and e.get("action") == "kill"]
    assert kill["escalation"] is None and kill["pids"] == [greedy.pid]
