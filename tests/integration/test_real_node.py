"""End to end on a real node: the chart installed with the locally built image on a one-node cluster (a real
kubelet on containerd, tests/integration/real_cluster.py), enforcing on real workload containers: the agent pod's
probes, ServiceAccount token and restarts are the kubelet's, and so are the workloads' cgroups.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from helm_fixtures import need_helm
from real_parts import need
from vramguard.limiter import v2_root
from vramguard.model import GiB
from vramguard_testbed.fakenvml import DriverLimit, driver_limits

from .node import raw
from .real_cluster import AGENT_NS, GPU_TOTAL, QUOTA, Cluster, real_cluster, unavailable_reason, wait

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    need(unavailable_reason(), skip="no real node", ci="build the real node's parts first (scripts/test.sh does)")
    with real_cluster(need_helm()) as found:
        yield found


def test_the_chart_runs_the_agent_on_a_real_kubelet(cluster: Cluster) -> None:
    started = time.monotonic()
    cluster.helm_install(mode="kill")
    pod = cluster.agent_pod()
    assert pod is not None
    print(f"agent Ready {time.monotonic() - started:.1f}s after helm install")
    # Ready through its real probes; its ServiceAccount token came from the kubelet's projected volume.
    (container,) = pod["spec"]["containers"]
    assert "readinessProbe" in container and "livenessProbe" in container
    assert any("projected" in v for v in pod["spec"]["volumes"]), "the token volume the kubelet mounts"

    # It talked to the API server as itself: the node's capacity is its PATCH, allowed by RBAC and the own-node
    # admission policy.
    def published() -> bool:
        node = raw(cluster.api, cluster.core.read_node(cluster.node.name))
        return bool(node["status"]["allocatable"].get(QUOTA) == str(GPU_TOTAL))

    wait(published, 60, "the node's VRAM capacity published by the agent")


def test_kill_mode_on_real_containers(cluster: Cluster) -> None:
    cluster.helm_install(mode="kill")
    ns = cluster.namespace("ml-kill")
    trainer = cluster.workload(ns, "trainer", "4Gi")
    notebook = cluster.workload(ns, "notebook", "4Gi")
    trainer_pid, notebook_pid = cluster.pid(trainer), cluster.pid(notebook)
    # Attribution goes through the cgroups the kubelet and containerd made for these containers.
    cgroup = Path(f"/proc/{trainer_pid}/cgroup").read_text()
    assert f"/kubepods/besteffort/pod{trainer['metadata']['uid']}/" in cgroup
    assert trainer["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://") in cgroup

    cluster.gpu({trainer_pid: 9 * GiB, notebook_pid: 3 * GiB})

    def restarted() -> bool:
        status = cluster.status(ns, "trainer")
        return bool(status["restartCount"] >= 1 and "running" in status["state"])

    wait(restarted, 60, "the trainer killed and restarted by the kubelet")
    assert cluster.status(ns, "trainer")["lastState"]["terminated"]["exitCode"] == 137  # SIGKILL
    assert not Path(f"/proc/{trainer_pid}").exists()
    wait(lambda: "VRAMKilled" in cluster.reasons(ns, "trainer"), 30, "the VRAMKilled Event on the trainer")
    assert cluster.status(ns, "notebook")["restartCount"] == 0
    assert Path(f"/proc/{notebook_pid}").exists()

    described = cluster.node.kubectl("describe", "pod", "trainer", "--namespace", ns).stdout
    assert "VRAMKilled" in described and "uses 9.0GiB" in described, described

    # A user's view: `vramguard top` from inside the agent's pod.
    agent = cluster.agent_pod()
    assert agent is not None
    top = cluster.node.kubectl(
        "exec",
        "--namespace",
        AGENT_NS,
        agent["metadata"]["name"],
        "--",
        "vramguard",
        "top",
        "--once",
        "--policy=/etc/vramguard/policy.yaml",
    )
    assert "notebook" in top.stdout and "3.0GiB" in top.stdout, top.stdout + top.stderr


def test_evict_mode_on_real_containers(cluster: Cluster) -> None:
    cluster.helm_install(mode="evict")
    ns = cluster.namespace("ml-evict")
    evictee = cluster.workload(ns, "evictee", "2Gi")
    guarded = cluster.workload(ns, "guarded", "2Gi")
    budget = client.V1PodDisruptionBudget(
        metadata=client.V1ObjectMeta(name="guarded"),
        spec=client.V1PodDisruptionBudgetSpec(
            min_available=1, selector=client.V1LabelSelector(match_labels={"app": "guarded"})
        ),
    )
    policy = client.PolicyV1Api(cluster.api)
    policy.create_namespaced_pod_disruption_budget(ns, budget)
    wait(
        lambda: raw(cluster.api, policy.read_namespaced_pod_disruption_budget("guarded", ns))["status"].get(
            "observedGeneration"
        ),
        30,
        "the PodDisruptionBudget's status computed",
    )

    cluster.gpu({cluster.pid(evictee): 5 * GiB, cluster.pid(guarded): 5 * GiB})

    wait(lambda: cluster.phase(ns, "evictee") is None, 90, "the evictee evicted and removed by the kubelet")
    assert "VRAMEvicted" in cluster.reasons(ns, "evictee")
    wait(lambda: "VRAMEvictionRefused" in cluster.reasons(ns, "guarded"), 30, "the refusal Event on the guarded pod")
    assert cluster.phase(ns, "guarded") == "Running"
    assert cluster.status(ns, "guarded")["restartCount"] == 0


def test_driver_limits_on_the_cgroups_the_kubelet_made(cluster: Cluster) -> None:
    """On an R615 driver the agent, in its pod, programs each container's limit on the cgroup v2 directory the
    kubelet and containerd made, through the host's cgroup filesystem the chart mounts."""
    cluster.gpu({}, memory_limits=True)
    cluster.helm_install(mode="kill")
    ns = cluster.namespace("ml-limits")
    trainer = cluster.workload(ns, "trainer", "6Gi")
    container_id = trainer["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    leaf = f"/kubepods/besteffort/pod{trainer['metadata']['uid']}/{container_id}"

    def held() -> list[DriverLimit]:
        return [d for d in driver_limits(cluster.gpu_state) if d.cgroup.endswith(leaf)]

    wait(lambda: held(), 60, "the trainer's limit in the driver")
    (limit,) = held()
    assert (limit.soft_bytes, limit.hard_bytes) == (0, 6 * GiB)
    assert limit.cgroup == f"/host{v2_root('/sys/fs/cgroup')}{leaf}", "the agent's view of the host's v2 hierarchy"
    wait(lambda: "VRAMLimitApplied" in cluster.reasons(ns, "trainer"), 30, "the VRAMLimitApplied Event")
    described = cluster.node.kubectl("describe", "pod", "trainer", "--namespace", ns).stdout
    assert "the driver now holds container main to 6.0GiB on GPU 0" in described, described
