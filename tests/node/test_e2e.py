"""The agent end to end: `vramguard run` as a subprocess, the test NVML library, real processes in real cgroups."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from cgroup_fixtures import need_cgroups
from vramguard.core.quantity import GiB
from vramguard_testbed.demo import run_demo
from vramguard_testbed.fakenvml import NVML_ERROR_GPU_IS_LOST
from vramguard_testbed.simnode import SimProcess, SimulatedNode, free_port, json_logs, metric_value
from vramguard_testbed.waiting import wait_until

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]

POLL_S = 0.25


def test_offender_killed_within_two_polls_neighbours_survive(sim_node: SimulatedNode) -> None:
    """Over quota → killed (with its forked child) within two poll intervals; a neighbour and a host process live."""
    trainer = sim_node.add_pod("trainer", "ml", containers={"main": {"vramguard.io/vram": "8Gi"}})
    neighbour = sim_node.add_pod("notebook", "ml", annotations={"vramguard.io/vram-limit": "4Gi"})
    t = sim_node.spawn(trainer, "main", 6 * GiB, children=1)
    n = sim_node.spawn(neighbour, "main", 3 * GiB)
    h = sim_node.spawn_host(9 * GiB)  # above everyone's quota, but in no pod
    agent = sim_node.start_agent("--mode", "kill", "--poll-interval", str(POLL_S), stderr=subprocess.PIPE, text=True)
    sim_node.wait_ready()
    sim_node.wait_scans(2)
    assert t.alive(), "nothing is killed while within quota"

    crossed = time.monotonic()
    sim_node.set_usage(t, 9 * GiB)
    wait_until(lambda: not t.alive(), 2 * POLL_S, what="the trainer killed within two polls")
    reaction_s = time.monotonic() - crossed
    assert reaction_s <= 2 * POLL_S
    wait_until(
        lambda: not any(Path(f"/proc/{c}").exists() for c in t.children), 2, what="the trainer's forked child gone"
    )

    sim_node.wait_scans(3)
    assert n.alive() and h.alive()
    metrics = sim_node.http_get("/metrics")[1]
    assert metric_value(metrics, "vramguard_actions_total", {"action": "kill", "result": "ok"}) == 1.0
    assert metric_value(metrics, "vramguard_violations_total", {"namespace": "ml", "severity": "hard"}) == 1.0
    assert metric_value(metrics, "vramguard_unattributed_gpu_memory_bytes", {"gpu": "0"}) == 9 * GiB
    assert metric_value(metrics, "vramguard_container_gpu_memory_used_bytes", {"pod": "notebook"}) == 3 * GiB
    assert metric_value(metrics, "vramguard_container_gpu_memory_quota_bytes", {"pod": "notebook"}) == 4 * GiB

    sim_node.stop_agents()
    logs = json_logs(agent)
    kills = [e for e in logs if e.get("event") == "action" and e.get("action") == "kill"]
    assert len(kills) == 1 and kills[0]["pod"] == "ml/trainer"
    assert sorted(kills[0]["pids"]) == sorted([t.pid, *t.children])
    reasons = [e.get("reason") for e in logs if e.get("event") == "event"]
    assert reasons == ["VRAMQuotaExceeded", "VRAMKilled"]


def _spawn_with_pid(sim_node: SimulatedNode, pid: int, used_bytes: int) -> SimProcess | None:
    """A host process that gets exactly `pid`, by setting the kernel's last-allocated PID (root only)."""
    for _ in range(20):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        popen = subprocess.Popen(["sleep", "600"])
        if popen.pid == pid:
            proc = SimProcess(popen=popen, gpu=0, used_bytes=used_bytes)
            sim_node.processes.append(proc)
            sim_node.sync()
            return proc
        popen.kill()
        popen.wait()
    return None


def test_recycled_pid_is_never_signalled(sim_node: SimulatedNode) -> None:
    """A PID the agent knew in a pod, recycled by a process outside any pod, is re-identified and left alone."""
    victim = sim_node.add_pod("victim", "ml", containers={"main": {"vramguard.io/vram": "4Gi"}})
    old = sim_node.spawn(victim, "main", 2 * GiB)
    sim_node.start_agent("--mode", "kill", "--poll-interval", str(POLL_S))
    sim_node.wait_ready()
    sim_node.wait_scans(2)  # the agent has cached old.pid → ml/victim

    pid = old.pid
    old.popen.kill()
    old.popen.wait()
    sim_node.processes.remove(old)
    # NVML is slow to notice too: it now reports the recycled PID with more than the victim's quota.
    recycled = _spawn_with_pid(sim_node, pid, used_bytes=10 * GiB)
    if recycled is None:
        pytest.skip(f"could not get the kernel to hand out PID {pid} again (another process took it)")

    sim_node.wait_scans(4)
    assert recycled.alive()
    metrics = sim_node.http_get("/metrics")[1]
    assert metric_value(metrics, "vramguard_actions_total", {"action": "kill", "result": "ok"}) == 0
    assert metric_value(metrics, "vramguard_unattributed_gpu_memory_bytes", {"gpu": "0"}) == 10 * GiB
    recycled.popen.kill()
    recycled.popen.wait()


def test_dry_run_changes_nothing(sim_node: SimulatedNode) -> None:
    """--dry-run decides the kill and reports it, and the process lives."""
    p = sim_node.add_pod("big", "ml", containers={"main": {"nvidia.com/gpumem": "1024"}})  # HAMi: MiB
    proc = sim_node.spawn(p, "main", 2 * GiB)
    agent = sim_node.start_agent(
        "--mode", "kill", "--dry-run", "--poll-interval", str(POLL_S), stderr=subprocess.PIPE, text=True
    )
    sim_node.wait_ready()
    sim_node.wait_scans(3)
    assert proc.alive()
    metrics = sim_node.http_get("/metrics")[1]
    assert metric_value(metrics, "vramguard_actions_total", {"action": "kill", "result": "dry-run"}) == 1.0
    sim_node.stop_agents()
    assert not [e for e in json_logs(agent) if e.get("event") == "event"], "dry-run writes no Events"


def test_warn_mode_warns_once_per_episode(sim_node: SimulatedNode) -> None:
    """In warn mode the offender lives and gets one VRAMQuotaExceeded per episode, not one per scan."""
    p = sim_node.add_pod("chatty", "ml", containers={"main": {"aliyun.com/gpu-mem": "2"}})  # GiB
    proc = sim_node.spawn(p, "main", 3 * GiB)
    agent = sim_node.start_agent("--mode", "warn", "--poll-interval", str(POLL_S), stderr=subprocess.PIPE, text=True)
    sim_node.wait_ready()
    sim_node.wait_scans(3)
    sim_node.set_usage(proc, 1 * GiB)  # episode over
    sim_node.wait_scans(2)
    sim_node.set_usage(proc, 3 * GiB)  # a new episode
    sim_node.wait_scans(3)
    assert proc.alive()
    sim_node.stop_agents()
    reasons = [e.get("reason") for e in json_logs(agent) if e.get("event") == "event"]
    assert reasons == ["VRAMQuotaExceeded", "VRAMQuotaExceeded"]


def test_a_gpu_entering_pressure_tells_its_pods_who_holds_it(sim_node: SimulatedNode) -> None:
    """The trainer fills the 24 GiB GPU: the notebook beside it (and the trainer) each get one VRAMPressure Event
    naming the trainer and how far over its quota it is, and no second one while the pressure lasts."""
    trainer = sim_node.add_pod("trainer", "ml", containers={"main": {"vramguard.io/vram": "8Gi"}})
    neighbour = sim_node.add_pod("notebook", "ml", annotations={"vramguard.io/vram-limit": "4Gi"})
    t = sim_node.spawn(trainer, "main", 6 * GiB)
    n = sim_node.spawn(neighbour, "main", 3 * GiB)
    agent = sim_node.start_agent("--mode", "warn", "--poll-interval", str(POLL_S), stderr=subprocess.PIPE, text=True)
    sim_node.wait_ready()
    sim_node.wait_scans(2)
    sim_node.set_usage(t, 20 * GiB)  # 1 GiB of 24 free: under the default 5 % threshold
    sim_node.wait_scans(4)
    assert t.alive() and n.alive()
    sim_node.stop_agents()
    told = [
        (e["pod"], e["message"])
        for e in json_logs(agent)
        if e.get("event") == "event" and e.get("reason") == "VRAMPressure"
    ]
    said = (
        "GPU 0 is 95 % full (23.0GiB of 24.0GiB); "
        "ml/trainer container main holds 20.0GiB, 12.0GiB over its 8.0GiB quota"
    )
    assert told == [("ml/notebook", said), ("ml/trainer", said)]


def test_unhealthy_gpu_is_reported_and_never_acted_on(sim_node: SimulatedNode) -> None:
    """A GPU whose process query fails is marked unhealthy and its over-quota process is not killed."""
    p = sim_node.add_pod("lost", "ml", containers={"main": {"vramguard.io/vram": "1Gi"}})
    proc = sim_node.spawn(p, "main", 512 * 1024**2)
    sim_node.start_agent("--mode", "kill", "--poll-interval", str(POLL_S))
    sim_node.wait_ready()
    sim_node.nvml.inject_error("nvmlDeviceGetComputeRunningProcesses_v3", NVML_ERROR_GPU_IS_LOST, device=0)
    sim_node.set_usage(proc, 4 * GiB)
    sim_node.wait_scans(3)
    assert proc.alive()
    metrics = sim_node.http_get("/metrics")[1]
    assert metric_value(metrics, "vramguard_gpu_healthy", {"gpu": "0"}) == 0.0
    assert (metric_value(metrics, "vramguard_nvml_errors_total") or 0) >= 1

    sim_node.nvml.clear_faults()
    sim_node.sync()
    wait_until(lambda: not proc.alive(), 10 * POLL_S, what="the kill, once the GPU answers again")


def test_policy_file_sets_mode_per_namespace(sim_node: SimulatedNode, tmp_path: Path) -> None:
    """A namespace's mode in the policy file overrides the default: kill in team-a, only warn elsewhere."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("mode: warn\nnamespaces:\n  team-a: {mode: kill}\n")
    strict = sim_node.add_pod("a", "team-a", containers={"main": {"vramguard.io/vram": "1Gi"}})
    lenient = sim_node.add_pod("b", "team-b", containers={"main": {"vramguard.io/vram": "1Gi"}})
    a = sim_node.spawn(strict, "main", 2 * GiB)
    b = sim_node.spawn(lenient, "main", 2 * GiB)
    sim_node.start_agent("--policy", str(policy), "--poll-interval", str(POLL_S))
    sim_node.wait_ready()
    wait_until(lambda: not a.alive(), 10 * POLL_S, what="the team-a pod (kill mode) killed")
    sim_node.wait_scans(2)
    assert b.alive()


def test_invalid_quota_is_reported_and_the_default_applies(sim_node: SimulatedNode, tmp_path: Path) -> None:
    """`12GB` never crashes the agent: the pod gets VRAMQuotaInvalid naming field and value, the default applies."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("default: {kind: fixed, bytes: 1Gi}\n")
    p = sim_node.add_pod("typo", "ml", containers={"main": {"vramguard.io/vram": "12GB"}})
    proc = sim_node.spawn(p, "main", 2 * GiB)
    agent = sim_node.start_agent(
        "--policy", str(policy), "--mode", "kill", "--poll-interval", str(POLL_S), stderr=subprocess.PIPE, text=True
    )
    sim_node.wait_ready()
    wait_until(lambda: not proc.alive(), 10 * POLL_S, what="the pod over the policy's default quota killed")
    sim_node.stop_agents()
    invalid = [e for e in json_logs(agent) if e.get("event") == "event" and e.get("reason") == "VRAMQuotaInvalid"]
    assert len(invalid) == 1
    assert "resources.limits[vramguard.io/vram]" in str(invalid[0]["message"]) and "12GB" in str(invalid[0]["message"])


def test_probes_and_nvml_missing(sim_node: SimulatedNode) -> None:
    """Without NVML the agent stays up and unready, saying why; `top` prints a clear message, not a traceback."""
    env = {k: v for k, v in sim_node.env.items() if k != "LD_LIBRARY_PATH"}
    if Path("/dev/nvidiactl").exists():
        pytest.skip("a real NVIDIA driver is installed here: NVML is not missing")
    top = subprocess.run(sim_node.vramguard_argv("top", "--once"), env=env, capture_output=True, text=True, timeout=60)
    assert top.returncode == 1
    assert "libnvidia-ml.so.1" in top.stderr and "Traceback" not in top.stderr

    sim_node.metrics_port = port = free_port()
    agent = subprocess.Popen(
        sim_node.vramguard_argv("run", "--metrics-port", str(port), "--log-format", "json"),
        env=env,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: "libnvidia-ml.so.1" in sim_node.http_get("/readyz")[1],
            30,
            what="/readyz to name the missing libnvidia-ml.so.1",
        )
        assert sim_node.http_get("/readyz")[0] == 503
        assert sim_node.http_get("/healthz")[0] == 200
        assert agent.poll() is None
    finally:
        agent.terminate()
        agent.wait(timeout=10)


def test_dra_shares_in_the_pods_file_are_quotas_per_gpu(tmp_path: Path) -> None:
    """`claim:` with --pods-file: the file's claims and this node's slices. 11Gi is over a 10Gi share on GPU 1
    (killed), within a 12Gi one on GPU 0; the small pod's memory on GPU 0, where it holds no share, is over too."""
    need_cgroups(2)
    with SimulatedNode(tmp_path / "node", gpus=2) as node:
        node.publish_shares({"small-gpu": ("ml", 1, "10Gi"), "large-gpu": ("ml", 0, "12Gi")})
        small = node.add_pod("small", "ml", claims={"main": "small-gpu"})
        large = node.add_pod("large", "ml", claims={"main": "large-gpu"})
        over = node.spawn(small, "main", 11 * GiB, gpu=1)
        within = node.spawn(large, "main", 11 * GiB, gpu=0)
        policy = tmp_path / "policy.yaml"
        policy.write_text('mode: kill\nquota_sources: ["claim:gpu.nvidia.com"]\n')
        agent = node.start_agent(
            "--policy", str(policy), "--poll-interval", str(POLL_S), stderr=subprocess.PIPE, text=True
        )
        node.wait_ready()
        wait_until(lambda: not over.alive(), 10 * POLL_S, what="the pod over its 10Gi share on GPU 1 killed")
        node.wait_scans(2)
        assert within.alive()
        elsewhere = node.spawn(node.add_pod("small-2", "ml", claims={"main": "small-gpu"}), "main", GiB, gpu=0)
        wait_until(lambda: not elsewhere.alive(), 10 * POLL_S, what="the pod with no share on GPU 0 killed at once")
        assert within.alive()
        node.stop_agents()
        kills = [e for e in json_logs(agent) if e.get("event") == "action" and e.get("action") == "kill"]
        assert [(k["pod"], k["gpu"]) for k in kills] == [("ml/small", "1"), ("ml/small-2", "0")]
        assert "quota 10.0GiB (claim ml/small-gpu (request gpu, share " in str(kills[0]["message"])
        assert "quota 0B (no DRA claim share on this GPU)" in str(kills[1]["message"])


def test_the_dra_demo_scene_passes_its_checks(capsys: pytest.CaptureFixture[str]) -> None:
    need_cgroups(2)
    assert run_demo(poll_interval_s=0.2, scene="dra") == 0
    assert "CLAIM" in capsys.readouterr().out
