"""AMD Instinct GPUs enforced end to end through the kernel's DRM stats: `vramguard run` with no NVML at all, a
stand-in /sys and fdinfo (`drmnode.DrmStandIn`, amdgpu's Linux 7.x format) around real processes in real cgroups, the
pods file naming `amd.com/gpu`. The same quota, decision, kill, metrics, Events and `top` as NVIDIA's; the GPU named
by its PCI slot. This machine's kernel has no dmem controller: the agent says so once and enforces reactively."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cgroup_fixtures import need_cgroups
from vramguard.core.quantity import GiB
from vramguard_testbed.demo import run_demo
from vramguard_testbed.simnode import SimulatedNode, json_logs, metric_value
from vramguard_testbed.waiting import wait_until

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]

POLL_S = 0.25


@pytest.fixture
def amd_node(tmp_path: Path) -> Iterator[SimulatedNode]:
    need_cgroups(2)
    with SimulatedNode(tmp_path / "node", amd_gpus=1) as node:
        yield node


def test_two_pods_on_one_mi300x_the_one_over_its_quota_is_killed_the_other_untouched(amd_node: SimulatedNode) -> None:
    node = amd_node
    assert node.drm is not None
    slot = node.drm.gpus[0].slot
    trainer = node.add_pod("trainer", "ml", containers={"main": {"amd.com/gpu": "1", "vramguard.io/vram": "8Gi"}})
    notebook = node.add_pod("notebook", "ml", containers={"main": {"amd.com/gpu": "1", "vramguard.io/vram": "24Gi"}})
    t = node.spawn(trainer, "main", 6 * GiB)
    n = node.spawn(notebook, "main", 12 * GiB)

    table = node.run_vramguard("top", "--once")
    assert table.returncode == 0, table.stderr
    rows = [line.split() for line in table.stdout.splitlines()]
    assert [r[:3] for r in rows if r and r[0] == slot] == [[slot, "ml", "notebook"], [slot, "ml", "trainer"]], table

    agent = node.start_agent("--mode", "kill", "--poll-interval", str(POLL_S), stderr=subprocess.PIPE, text=True)
    node.wait_ready()
    node.wait_scans(2)
    assert t.alive() and n.alive(), "nothing is killed while within its quota"
    metrics = node.http_get("/metrics")[1]
    used = "vramguard_container_gpu_memory_used_bytes"
    assert metric_value(metrics, used, {"pod": "trainer", "gpu": slot}) == 6 * GiB
    assert metric_value(metrics, used, {"pod": "notebook", "gpu": slot}) == 12 * GiB
    assert metric_value(metrics, "vramguard_gpu_memory_total_bytes", {"gpu": slot}) == 192 * GiB
    uuid = node.drm.gpus[0].unique_id
    assert (
        metric_value(
            metrics, "vramguard_gpu_memory_total_bytes", {"gpu": slot, "gpu_uuid": uuid, "name": "AMD Instinct MI300X"}
        )
        == 192 * GiB
    )
    status = json.loads(node.http_get("/status")[1])
    held = {c["pod"]: c["held_by"] for c in status["containers"]}
    assert held == {"trainer": "agent", "notebook": "agent"}, "no dmem controller here: the agent holds the quotas"

    node.set_usage(t, 10 * GiB)
    wait_until(lambda: not t.alive(), 10 * POLL_S + 5, what="the trainer killed over its 8Gi quota")
    node.wait_scans(3)
    assert n.alive(), "the notebook, within its own quota, is untouched"

    node.stop_agents()
    logs = json_logs(agent)
    kills = [e for e in logs if e.get("event") == "action" and e.get("action") == "kill"]
    assert [k["pod"] for k in kills] == ["ml/trainer"]
    assert f"on GPU {slot} ({node.drm.gpus[0].unique_id})" in str(kills[0]["message"]), kills[0]["message"]
    reasons = [(e.get("pod"), e.get("reason")) for e in logs if e.get("event") == "event"]
    assert reasons == [("ml/trainer", "VRAMQuotaExceeded"), ("ml/trainer", "VRAMKilled")]
    unavailable = [e for e in logs if e.get("event") == "driver_limits_unavailable"]
    assert len(unavailable) == 1 and "dmem" in unavailable[0]["reason"], unavailable


def test_the_amd_demo_scene_passes_its_checks(capsys: pytest.CaptureFixture[str]) -> None:
    """`vramguard-demo --scene amd` (README's first command shows it): its own checks hold, and its tables name the
    GPU by its PCI slot."""
    need_cgroups(2)
    assert run_demo(poll_interval_s=0.2, scene="amd") == 0
    out = capsys.readouterr().out
    assert "[FAILED]" not in out and "0000:c1:00.0  ml         notebook" in out, out


def test_a_deleted_pods_processes_on_an_amd_gpu_are_reclaimed_after_the_grace(
    amd_node: SimulatedNode, tmp_path: Path
) -> None:
    """Orphan reclaim on a DRM GPU: a pod removed from the pod list while its process holds VRAM (its cgroup, and
    so its fdinfo, still read) is killed once `orphan_grace` has passed, by the same kill path; a neighbour lives."""
    node = amd_node
    assert node.drm is not None
    slot = node.drm.gpus[0].slot
    trainer = node.add_pod("trainer", "ml", containers={"main": {"amd.com/gpu": "1", "vramguard.io/vram": "8Gi"}})
    notebook = node.add_pod("notebook", "ml", containers={"main": {"amd.com/gpu": "1", "vramguard.io/vram": "8Gi"}})
    t = node.spawn(trainer, "main", 3 * GiB)
    n = node.spawn(notebook, "main", GiB)
    policy = tmp_path / "policy.yaml"
    policy.write_text("mode: kill\norphan_grace: 10s\n")
    agent = node.start_agent("--policy", str(policy), "--poll-interval", str(POLL_S), stderr=subprocess.PIPE, text=True)
    node.wait_ready()
    node.wait_scans(2)

    node.pods.remove(trainer)
    node.sync()
    deleted = time.monotonic()
    wait_until(lambda: not t.alive(), 20.0, what="the trainer's orphaned process killed")
    assert time.monotonic() - deleted >= 10.0, "never before the grace"
    node.wait_scans(3)
    assert n.alive()
    metrics = node.http_get("/metrics")[1]
    assert metric_value(metrics, "vramguard_orphan_reclaims_total", {"result": "ok"}) == 1.0
    assert metric_value(metrics, "vramguard_orphaned_gpu_memory_bytes", {"gpu": slot}) == 0.0
    node.stop_agents()
    [reclaimed] = [e for e in json_logs(agent) if e.get("event") == "orphan_reclaimed"]
    assert (reclaimed["pod"], reclaimed["pids"], reclaimed["result"]) == ("ml/trainer", [t.pid], "ok")
