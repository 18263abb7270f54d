"""NVIDIA's own limit declarations enforced end to end: `vramguard run` with its default quota sources, the test NVML
library, real processes in real cgroups, the pods file carrying the container toolkit's `NVIDIA_GPU_MEMORY_LIMIT` in
a container's `env[]` and KAI Scheduler's `nvidia.com/container.<name>.gpu-memory.limit` annotation."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from vramguard.core.quantity import GiB
from vramguard_testbed.simnode import SimPod, SimulatedNode, json_logs, metric_value
from vramguard_testbed.waiting import wait_until

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]

POLL_S = 0.25
KAI = "nvidia.com/container.{}.gpu-memory"


@dataclass(frozen=True)
class Declared:
    """What a pod writes down for its container `container`: variables in its env[] and pod annotations."""

    container: str = "main"
    env: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    def add_to(self, node: SimulatedNode, name: str) -> SimPod:
        return node.add_pod(
            name,
            "ml",
            containers={self.container: {"nvidia.com/gpu": "1"}},
            env={self.container: self.env},
            annotations=self.annotations,
        )


@pytest.mark.parametrize(
    ("offender", "neighbour", "source"),
    [
        pytest.param(
            Declared(env={"NVIDIA_GPU_MEMORY_LIMIT": "4096"}),
            Declared(env={"NVIDIA_GPU_MEMORY_REQUEST": "8192", "NVIDIA_GPU_MEMORY_LIMIT": "8192"}),
            "env NVIDIA_GPU_MEMORY_LIMIT",
            id="toolkit-env-limit-in-mib",
        ),
        pytest.param(
            Declared(container="trainer", annotations={KAI.format("trainer") + ".limit": "4Gi"}),
            Declared(annotations={KAI.format("main") + ".request": "8Gi", KAI.format("main") + ".limit": "8Gi"}),
            "annotation nvidia.com/container.trainer.gpu-memory.limit",
            id="kai-per-container-annotation-quantity",
        ),
    ],
)
def test_a_declared_limit_kills_its_offender_and_spares_a_neighbour_within_its_own(
    sim_node: SimulatedNode, offender: Declared, neighbour: Declared, source: str
) -> None:
    """Over its declared 4 GiB limit → killed; a neighbour holding 6 GiB, more than that but within its own 8 GiB
    declaration, lives; the quota, its source and the kill are reported as for vramguard's own resource."""
    offending = offender.add_to(sim_node, "trainer")
    beside = neighbour.add_to(sim_node, "notebook")
    t = sim_node.spawn(offending, offender.container, 3 * GiB)
    n = sim_node.spawn(beside, neighbour.container, 6 * GiB)
    agent = sim_node.start_agent("--mode", "kill", "--poll-interval", str(POLL_S), stderr=subprocess.PIPE, text=True)
    sim_node.wait_ready()
    sim_node.wait_scans(2)
    assert t.alive(), "nothing is killed while within its declaration"
    metrics = sim_node.http_get("/metrics")[1]
    assert metric_value(metrics, "vramguard_container_gpu_memory_quota_bytes", {"pod": "trainer"}) == 4 * GiB
    assert metric_value(metrics, "vramguard_container_gpu_memory_quota_bytes", {"pod": "notebook"}) == 8 * GiB

    sim_node.set_usage(t, 5 * GiB)
    wait_until(lambda: not t.alive(), 10 * POLL_S, what="the trainer killed over its declared limit")
    sim_node.wait_scans(3)
    assert n.alive()

    sim_node.stop_agents()
    logs = json_logs(agent)
    kills = [e for e in logs if e.get("event") == "action" and e.get("action") == "kill"]
    assert [k["pod"] for k in kills] == ["ml/trainer"]
    assert f"quota 4.0GiB ({source})" in str(kills[0]["message"]), kills[0]["message"]
    reasons = [(e.get("pod"), e.get("reason")) for e in logs if e.get("event") == "event"]
    assert reasons == [("ml/trainer", "VRAMQuotaExceeded"), ("ml/trainer", "VRAMKilled")]


@pytest.mark.parametrize(
    ("declared", "field_name", "value", "said"),
    [
        pytest.param(
            Declared(env={"NVIDIA_GPU_MEMORY_LIMIT": "2048MiB"}),
            "spec.containers[main].env[NVIDIA_GPU_MEMORY_LIMIT]",
            "2048MiB",
            "write 2048 for 2048MiB",
            id="toolkit-env-with-a-unit",
        ),
        pytest.param(
            Declared(annotations={KAI.format("main") + ".limit": "12GB"}),
            "metadata.annotations[nvidia.com/container.main.gpu-memory.limit]",
            "12GB",
            "12GB",
            id="kai-annotation-decimal-suffix",
        ),
    ],
)
def test_a_bad_declared_value_is_reported_and_the_default_applies(
    sim_node: SimulatedNode, tmp_path: Path, declared: Declared, field_name: str, value: str, said: str
) -> None:
    """`2048MiB` in the toolkit's variable (whole MiB in digits alone) or `12GB` in KAI's annotation never crashes the
    agent: the pod gets one VRAMQuotaInvalid naming the field and value, and the policy's default holds it."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("default: {kind: fixed, bytes: 1Gi}\n")
    pod = declared.add_to(sim_node, "typo")
    proc = sim_node.spawn(pod, declared.container, 2 * GiB)
    agent = sim_node.start_agent(
        "--policy", str(policy), "--mode", "kill", "--poll-interval", str(POLL_S), stderr=subprocess.PIPE, text=True
    )
    sim_node.wait_ready()
    wait_until(lambda: not proc.alive(), 10 * POLL_S, what="the pod over the policy's default quota killed")
    sim_node.stop_agents()
    invalid = [e for e in json_logs(agent) if e.get("event") == "event" and e.get("reason") == "VRAMQuotaInvalid"]
    assert len(invalid) == 1
    message = str(invalid[0]["message"])
    assert field_name in message and value in message and said in message, message


@pytest.mark.parametrize(
    "declared",
    [
        pytest.param(
            Declared(env={"NVIDIA_GPU_MEMORY_REQUEST": "2048", "NVIDIA_GPU_MEMORY_LIMIT": "4096"}),
            id="toolkit-env-request-and-limit",
        ),
        pytest.param(
            Declared(annotations={KAI.format("main") + ".request": "2Gi", KAI.format("main") + ".limit": "4Gi"}),
            id="kai-annotations-request-and-limit",
        ),
    ],
)
def test_the_request_is_the_soft_limit_and_the_limit_the_hard_one(
    sim_node: SimulatedNode, tmp_path: Path, declared: Declared
) -> None:
    """Between its 2 GiB request and its 4 GiB limit the pod is warned and lives (soft_grace not over); over the
    limit it is killed at once."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("soft_grace: 10m\n")
    pod = declared.add_to(sim_node, "bursty")
    proc = sim_node.spawn(pod, declared.container, 3 * GiB)
    agent = sim_node.start_agent(
        "--policy", str(policy), "--mode", "kill", "--poll-interval", str(POLL_S), stderr=subprocess.PIPE, text=True
    )
    sim_node.wait_ready()
    sim_node.wait_scans(4)
    assert proc.alive(), "above the request alone: warned, not acted on before soft_grace"
    metrics = sim_node.http_get("/metrics")[1]
    assert metric_value(metrics, "vramguard_violations_total", {"namespace": "ml", "severity": "soft"}) == 1.0

    sim_node.set_usage(proc, 5 * GiB)
    wait_until(lambda: not proc.alive(), 10 * POLL_S, what="the pod killed over its declared limit")
    sim_node.stop_agents()
    logs = json_logs(agent)
    (kill,) = [e for e in logs if e.get("event") == "action" and e.get("action") == "kill"]
    assert "quota 2.0GiB, burst 4.0GiB" in str(kill["message"]), kill["message"]
    reasons = [e.get("reason") for e in logs if e.get("event") == "event"]
    assert reasons == ["VRAMQuotaExceeded", "VRAMKilled"], reasons
