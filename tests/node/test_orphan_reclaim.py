"""Orphans end to end: `vramguard run` over the test NVML, real processes in real kubelet-shaped cgroups, a pods file
as the pod source (the file is then what the API server is elsewhere: its fresh re-read confirms an orphan).

A pod removed from the pods file while its processes hold GPU memory is reclaimed once `orphan_grace` has passed,
by the real kill path; a static pod's processes (a pod cgroup named by the kubelet's 32-hex hash), a neighbour and
a host process are never touched.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from vramguard.core.quantity import GiB
from vramguard_testbed.simnode import SimulatedNode, json_logs, metric_value
from vramguard_testbed.waiting import wait_until

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]

POLL_S = 0.25
GRACE_S = 10.0  # the policy's least
STATIC_UID = "7c4e1f0a9b8d6c5e4f3a2b1c0d9e8f7a"  # what the kubelet derives for a static pod: no dashes


def test_a_deleted_pods_processes_are_reclaimed_after_the_grace_and_nothing_else_is(
    sim_node: SimulatedNode, tmp_path: Path
) -> None:
    trainer = sim_node.add_pod("trainer", "ml", annotations={"vramguard.io/vram-limit": "8Gi"})
    static = sim_node.add_pod("etcd-gpu-node-1", "kube-system", uid=STATIC_UID)
    neighbour = sim_node.add_pod("notebook", "ml", annotations={"vramguard.io/vram-limit": "8Gi"})
    t = sim_node.spawn(trainer, "main", 3 * GiB)
    s = sim_node.spawn(static, "main", 2 * GiB)
    n = sim_node.spawn(neighbour, "main", 1 * GiB)
    h = sim_node.spawn_host(4 * GiB)
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"mode: kill\norphan_grace: {GRACE_S:g}s\nexempt_namespaces: []\n")
    agent = sim_node.start_agent(
        "--policy", str(policy), "--poll-interval", str(POLL_S), stderr=subprocess.PIPE, text=True
    )
    sim_node.wait_ready()
    sim_node.wait_scans(2)

    # The trainer and the static pod leave the pod list; their processes stay, holding 5 GiB.
    sim_node.pods.remove(trainer)
    sim_node.pods.remove(static)
    sim_node.sync()
    deleted = time.monotonic()
    wait_until(lambda: not t.alive(), GRACE_S + 10.0, what="the trainer's orphaned process killed")
    reclaim_s = time.monotonic() - deleted
    print(f"\ngrace {GRACE_S:g} s, poll {POLL_S} s: deletion to kill {reclaim_s:.2f} s")
    assert reclaim_s >= GRACE_S, "never before the grace"

    wait_until(
        lambda: (
            metric_value(sim_node.http_get("/metrics")[1], "vramguard_orphaned_gpu_memory_bytes", {"gpu": "0"}) == 0.0
        ),
        5,
        what="the reclaimed memory no longer orphaned",
    )
    sim_node.wait_scans(8)
    assert s.alive() and n.alive() and h.alive(), "a static pod, a neighbour and a host process are never orphans"
    metrics = sim_node.http_get("/metrics")[1]
    assert metric_value(metrics, "vramguard_orphan_reclaims_total", {"result": "ok"}) == 1.0
    assert metric_value(metrics, "vramguard_actions_total", {"action": "kill", "result": "ok"}) in (None, 0.0)
    reasons = {
        r: metric_value(metrics, "vramguard_unattributed_gpu_memory_bytes", {"gpu": "0", "reason": r})
        for r in ("pod-not-in-cache", "orphaned", "not-in-pod")
    }
    # The static pod, its mirror gone from the list, is the kubelet's still (its pod logs directory): governed as a
    # static pod without a mirror, not an unattributed row.
    assert reasons == {"pod-not-in-cache": 0.0, "orphaned": 0.0, "not-in-pod": 4.0 * GiB}

    agent.terminate()
    logs = json_logs(agent)
    [reclaimed] = [e for e in logs if e.get("event") == "orphan_reclaimed"]
    assert (reclaimed["pod"], reclaimed["pids"], reclaimed["result"]) == ("ml/trainer", [t.pid], "ok")
    [told] = [e for e in logs if e.get("event") == "event" and e.get("reason") == "VRAMOrphanReclaimed"]
    assert f"pod ml/trainer (UID {trainer.uid}) is gone" in told["message"]
    assert f"PIDs {t.pid}" in told["message"] and "3.0GiB on GPU 0" in told["message"]


def test_a_restarted_agent_reclaims_what_an_earlier_one_saw_and_nothing_the_api_server_never_had(
    sim_node: SimulatedNode, tmp_path: Path
) -> None:
    """The UIDs an agent saw the API server give pods outlive it in the state directory: its successor reclaims the
    leftovers of a pod deleted in between. A static pod whose manifest sets a UUID of its own and whose mirror is
    missing, and a pod made and deleted while no agent ran, are reported past the grace and never reclaimed."""
    trainer = sim_node.add_pod("trainer", "ml", annotations={"vramguard.io/vram-limit": "8Gi"})
    static = sim_node.add_pod("etcd-gpu-node-1", "infra", uid="0e0e0e0e-0000-4000-8000-00000000e7cd")
    unseen = sim_node.add_pod("before-any-agent", "ml")
    t = sim_node.spawn(trainer, "main", 3 * GiB)
    s = sim_node.spawn(static, "main", 2 * GiB)
    u = sim_node.spawn(unseen, "main", 1 * GiB)
    sim_node.pods.remove(static)  # no mirror: the API server never had it
    sim_node.pods.remove(unseen)  # made and deleted before any agent ran
    sim_node.sync()
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"mode: kill\norphan_grace: {GRACE_S:g}s\nexempt_namespaces: []\n")
    argv = ("--policy", str(policy), "--poll-interval", str(POLL_S))
    sim_node.start_agent(*argv, stderr=subprocess.DEVNULL)
    sim_node.wait_ready()
    sim_node.wait_scans(2)
    sim_node.stop_agents()

    sim_node.pods.remove(trainer)  # deleted while no agent runs
    sim_node.sync()
    agent = sim_node.start_agent(*argv, stderr=subprocess.PIPE, text=True)
    sim_node.wait_ready()
    wait_until(lambda: not t.alive(), GRACE_S + 10.0, what="the trainer's leftover reclaimed by the next agent")
    sim_node.wait_scans(int(GRACE_S / POLL_S) + 4)  # past the grace for the others too, counted in scans
    assert s.alive() and u.alive(), "what the API server never had is never an orphan"
    metrics = sim_node.http_get("/metrics")[1]
    assert metric_value(metrics, "vramguard_orphan_reclaims_total", {"result": "ok"}) == 1.0
    assert metric_value(metrics, "vramguard_unattributed_gpu_memory_bytes", {"gpu": "0", "reason": "orphaned"}) == 0
    not_in_cache = {"gpu": "0", "reason": "pod-not-in-cache"}
    assert metric_value(metrics, "vramguard_unattributed_gpu_memory_bytes", not_in_cache) == 3.0 * GiB
    agent.terminate()
    reclaimed = [e for e in json_logs(agent) if e.get("event") == "orphan_reclaimed"]
    assert [r["pids"] for r in reclaimed] == [[t.pid]]
