"""Driver-level limits end to end: `vramguard run` over the test NVML (an R615 driver, or an older one), real
processes in real cgroup v2 directories that allocate through the driver, and the pods file.

On an R615 node the agent programs each container's hard limit; an allocation beyond it fails in the offender,
its neighbour keeps its memory, and nobody is killed. On an older driver the same scene ends with the reactive
kill. Never in warn mode or with --dry-run; `driver_limits: require` fails readiness where limits cannot apply.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cgroup_fixtures import need_cgroups
from vramguard.core.quantity import GiB
from vramguard_testbed.demo import run_demo
from vramguard_testbed.fakenvml import driver_limits, limit_calls
from vramguard_testbed.simnode import SimPod, SimulatedNode, metric_value
from vramguard_testbed.waiting import wait_until

QUOTA = {"main": {"vramguard.io/vram": "8Gi"}}


def simulated(tmp_path: Path, driver_limits: bool | None) -> Iterator[SimulatedNode]:
    need_cgroups(2)
    with SimulatedNode(tmp_path / "node", driver_limits=driver_limits, driver="cgroupfs") as node:
        yield node


@pytest.fixture
def r615(tmp_path: Path) -> Iterator[SimulatedNode]:
    yield from simulated(tmp_path, True)


@pytest.fixture
def older(tmp_path: Path) -> Iterator[SimulatedNode]:
    yield from simulated(tmp_path, False)


def held_for(node: SimulatedNode, pod: SimPod) -> list[int]:
    directory = pod.containers["main"].dirs[0]
    return [d.hard_bytes for d in driver_limits(node.state_path) if d.cgroup == directory]


def metric(node: SimulatedNode, name: str, **labels: str) -> float | None:
    return metric_value(node.http_get("/metrics")[1], name, labels)


def test_the_driver_stops_the_offender_and_the_neighbour_keeps_its_memory(r615: SimulatedNode) -> None:
    trainer_pod = r615.add_pod("trainer", "ml", containers=QUOTA)
    notebook_pod = r615.add_pod("notebook", "ml", containers=QUOTA)
    trainer, notebook = r615.spawn_allocator(trainer_pod, "main"), r615.spawn_allocator(notebook_pod, "main")
    r615.start_agent("--mode", "kill", "--poll-interval", "0.1")
    r615.wait_ready()
    wait_until(lambda: held_for(r615, trainer_pod) == [8 * GiB] and held_for(r615, notebook_pod) == [8 * GiB],
               what="both containers' limits in the driver")  # fmt: skip

    assert trainer.allocate(0, 6 * GiB)
    assert not trainer.allocate(0, 4 * GiB), "6 + 4 GiB is over the trainer's 8 GiB: the driver refuses it"
    assert notebook.allocate(0, 8 * GiB), "the neighbour gets all of its quota"
    wait_until(
        lambda: (metric(r615, "vramguard_container_gpu_memory_used_bytes", pod="trainer") or 0) == 6 * GiB,
        what="a scan that counts the trainer's 6 GiB",
    )
    assert trainer.process.poll() is None and notebook.process.poll() is None, "nobody was killed"
    assert metric(r615, "vramguard_actions_total", action="kill") == 0
    assert metric(r615, "vramguard_driver_limit_bytes", pod="trainer", container="main") == 8 * GiB
    assert metric(r615, "vramguard_driver_limits_total", outcome="applied") == 2
    # `top` says who holds each quota, and so does the agent's /status (from the limits it programmed).
    top = json.loads(r615.run_vramguard("top", "--once", "--json").stdout)
    status = json.loads(r615.http_get("/status")[1])
    for doc in (top, status):
        assert {r["pod"]: r["held_by"] for r in doc["containers"]} == {"trainer": "driver", "notebook": "driver"}
        assert [g["limits"] for g in doc["gpus"]] == ["driver"]


def test_a_new_pods_limits_are_set_as_its_cgroups_appear_not_at_the_next_scan(r615: SimulatedNode) -> None:
    """With scans 60 s apart, only the cgroup watcher can set a new pod's limits within seconds: the pod's on
    its cgroup and the container's on its own, before any process runs there, so nothing is late."""
    r615.start_agent("--mode", "kill", "--poll-interval", "60")
    r615.wait_ready()
    trainer_pod = r615.add_pod("trainer", "ml", containers=QUOTA)
    pod_dir = trainer_pod.cgroup.dirs[0]
    wait_until(
        lambda: (
            held_for(r615, trainer_pod) == [8 * GiB]
            and [d.hard_bytes for d in driver_limits(r615.state_path) if d.cgroup == pod_dir] == [8 * GiB]
        ),
        what="the pod's and the container's limits, long before the next scan",
    )
    assert metric(r615, "vramguard_scan_duration_seconds_count") == 1, "no scan since the first"
    trainer = r615.spawn_allocator(trainer_pod, "main")
    assert not trainer.allocate(0, 9 * GiB), "held from its first allocation"


def test_an_older_driver_ends_with_the_reactive_kill(older: SimulatedNode) -> None:
    trainer_pod = older.add_pod("trainer", "ml", containers=QUOTA)
    trainer = older.spawn_allocator(trainer_pod, "main")
    older.start_agent("--mode", "kill", "--poll-interval", "0.1")
    older.wait_ready()
    assert trainer.allocate(0, 6 * GiB)
    assert trainer.allocate(0, 4 * GiB), "no driver limit: the allocation succeeds"
    wait_until(lambda: trainer.process.poll() is not None, timeout_s=10, what="the reactive kill")
    wait_until(
        lambda: metric(older, "vramguard_actions_total", action="kill", result="ok") == 1, what="one kill counted"
    )
    assert driver_limits(older.state_path) == [] and limit_calls(older.state_path) == []


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("--mode", "warn"), id="warn-mode"),
        pytest.param(("--mode", "kill", "--dry-run"), id="dry-run"),
        pytest.param(("--mode", "kill", "--driver-limits", "off"), id="driver-limits-off"),
    ],
)
def test_no_limits_in_warn_mode_dry_run_or_when_off(r615: SimulatedNode, args: tuple[str, ...]) -> None:
    trainer_pod = r615.add_pod("trainer", "ml", containers=QUOTA)
    r615.spawn_allocator(trainer_pod, "main")
    r615.start_agent(*args, "--poll-interval", "0.1")
    r615.wait_ready()
    r615.wait_scans(10)
    assert limit_calls(r615.state_path) == []


def test_an_agent_restart_sets_nothing_again(r615: SimulatedNode) -> None:
    trainer_pod = r615.add_pod("trainer", "ml", containers=QUOTA)
    r615.spawn_allocator(trainer_pod, "main")
    r615.start_agent("--mode", "kill", "--poll-interval", "0.1")
    r615.wait_ready()
    wait_until(lambda: held_for(r615, trainer_pod) == [8 * GiB], what="the trainer's limit in the driver")
    r615.stop_agents()
    sets = [c for c in limit_calls(r615.state_path) if c.verb == "set"]
    r615.start_agent("--mode", "kill", "--poll-interval", "0.1")
    r615.wait_ready()
    wait_until(
        lambda: metric(r615, "vramguard_driver_limits_total", outcome="unchanged") == 2,
        what="the pod's and the container's limits found unchanged",
    )
    assert [c for c in limit_calls(r615.state_path) if c.verb == "set"] == sets
    assert held_for(r615, trainer_pod) == [8 * GiB], "the limit outlived the agent, protecting the neighbours"


def test_require_fails_readiness_on_an_older_driver(older: SimulatedNode) -> None:
    older.start_agent("--mode", "kill", "--driver-limits", "require", "--poll-interval", "0.1")
    wait_until(lambda: "driver limits required" in older.http_get("/readyz")[1], 15, what="/readyz to say why")
    status, body = older.http_get("/readyz")
    assert status == 503
    assert "driver limits required: the driver has no nvmlDeviceGetMemoryLimits_v1 (it needs R615 or later)" in body
    agent = json.loads(older.http_get("/status")[1])["agent"]
    assert (agent["driver_version"], agent["driver_limits_possible"]) == ("550.54.15", False)
    assert agent["driver_limits_reason"] == "the driver has no nvmlDeviceGetMemoryLimits_v1 (it needs R615 or later)"


def test_require_is_ready_where_the_driver_holds_limits(r615: SimulatedNode) -> None:
    r615.start_agent("--mode", "kill", "--driver-limits", "require", "--poll-interval", "0.1")
    r615.wait_ready()

    def agent() -> dict[str, object]:
        found: dict[str, object] = json.loads(r615.http_get("/status")[1])["agent"]
        return found

    # The limiter asks the driver at its first scan, on its own thread: /status says so once it has the answer.
    wait_until(lambda: agent()["driver_limits_possible"] is not None, what="/status to know about the limits")
    assert (agent()["driver_version"], agent()["nvml_version"]) == ("615.40.02", "13.615.40.02")
    assert (agent()["driver_limits_possible"], agent()["driver_limits_reason"]) == (True, ""), "/status says so too"


def test_the_demo_scene_passes_its_checks(capsys: pytest.CaptureFixture[str]) -> None:
    need_cgroups(2)
    assert run_demo(poll_interval_s=0.2, scene="driver-limits") == 0
    out = capsys.readouterr().out
    assert "trainer allocates 4GiB more, 10GiB in all: OUT OF MEMORY" in out
    assert "trainer allocates 4GiB more, 10GiB in all: granted" in out
    assert "FAILED" not in out


# KAI Scheduler's per-container declaration; its NRI plugin hands it to NVIDIA's container toolkit as
# NVIDIA_GPU_MEMORY_REQUEST=2048 / _LIMIT=8192, which the toolkit's hook programs on the container's cgroup.
KAI_2G_8G = {
    "nvidia.com/container.main.gpu-memory.request": "2Gi",
    "nvidia.com/container.main.gpu-memory.limit": "8Gi",
}
# `apply-cuda-memory-limits`, as far as the driver sees it: nvmlDeviceSetMemoryLimits_v1 on the container's cgroup
# v2 path, the request soft, the limit hard, from a process of its own (pynvml over the test NVML).
HOOK = """
import sys, pynvml
pynvml.nvmlInit()
limits = pynvml.c_nvmlSetMemoryLimits_v1_t()
limits.nameSpace, limits.softLimit, limits.hardLimit = sys.argv[1].encode(), int(sys.argv[2]), int(sys.argv[3])
pynvml.nvmlDeviceSetMemoryLimits_v1(pynvml.nvmlDeviceGetHandleByIndex(0), limits)
"""


def test_the_toolkits_limit_is_left_alone_shown_and_the_soft_quota_still_enforced(
    r615: SimulatedNode, tmp_path: Path
) -> None:
    """A container whose limit NVIDIA's toolkit hook set before the agent ran: the agent writes nothing on its
    cgroup, says the toolkit holds it (`top`, /status, the metrics), the driver refuses an allocation over the hook's
    hard limit, and over the soft quota, which no driver limit stops, the agent still kills after the grace."""
    trainer_pod = r615.add_pod("trainer", "ml", annotations=KAI_2G_8G)
    ctr = trainer_pod.containers["main"].dirs[0]
    subprocess.run([sys.executable, "-c", HOOK, ctr, str(2 * GiB), str(8 * GiB)], env=r615.env, check=True)
    trainer = r615.spawn_allocator(trainer_pod, "main")
    policy = tmp_path / "policy.yaml"
    policy.write_text("soft_grace: 2s\n")
    r615.start_agent("--mode", "kill", "--poll-interval", "0.1", "--policy", str(policy))
    r615.wait_ready()
    wait_until(
        lambda: metric(r615, "vramguard_driver_limits_total", outcome="toolkit") == 1,
        what="the agent finding the toolkit's limit",
    )
    assert metric(r615, "vramguard_driver_limits_total", outcome="applied") == 1, "the pod's own cgroup: the sum"
    assert [(d.soft_bytes, d.hard_bytes) for d in driver_limits(r615.state_path) if d.cgroup == ctr] == [
        (2 * GiB, 8 * GiB)
    ]
    assert hook_only(r615, ctr), "the hook's one write, none by the agent"
    assert trainer.allocate(0, GiB), "within the request"
    wait_until(lambda: metric(r615, "vramguard_driver_limit_bytes", pod="trainer", container="main") == 8 * GiB,
               what="the toolkit's limit in the metrics")  # fmt: skip
    wait_until(lambda: (metric(r615, "vramguard_container_gpu_memory_used_bytes", pod="trainer") or 0) == GiB,
               what="a scan that counts the trainer's 1 GiB")  # fmt: skip
    top = json.loads(r615.run_vramguard("top", "--once", "--json").stdout)
    status = json.loads(r615.http_get("/status")[1])
    for doc in (top, status):
        assert [(r["pod"], r["held_by"]) for r in doc["containers"]] == [("trainer", "driver:toolkit")]

    assert trainer.allocate(0, 2 * GiB), "3 GiB, over the 2 GiB request, under the hook's 8 GiB: granted"
    assert not trainer.allocate(0, 6 * GiB), "3 + 6 GiB is over the hook's 8 GiB: the driver refuses it"
    wait_until(lambda: trainer.process.poll() is not None, timeout_s=15, what="the kill over the soft quota")
    wait_until(
        lambda: metric(r615, "vramguard_actions_total", action="kill", result="ok") == 1, what="one kill counted"
    )
    assert hook_only(r615, ctr)


def hook_only(node: SimulatedNode, cgroup: str) -> bool:
    """Whether the one limit written on `cgroup` is the toolkit hook's (2 GiB soft, 8 GiB hard)."""
    sets = [
        (c.soft_bytes, c.hard_bytes) for c in limit_calls(node.state_path) if c.verb == "set" and c.cgroup == cgroup
    ]
    return sets == [(2 * GiB, 8 * GiB)]
