"""End to end on a real node: the chart installed with the locally built image on a one-node cluster (a real
kubelet on containerd), enforcing on real workload containers.

The agent pod is started by the kubelet from the Helm chart: its probes, its ServiceAccount token and its restarts
are the kubelet's. The only test-only values are those a node without NVIDIA's runtime needs: the test NVML
library and its state directory mounted from the host (`extraEnv`, `extraVolumes`), and the API server's address,
since no kube-proxy makes the `kubernetes` Service routable here. The workload pods' processes live in the cgroups
that the kubelet and containerd made; the test only tells the test NVML how much GPU memory each host PID holds.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from helm_fixtures import CHART, need_helm
from real_parts import need
from vramguard import __version__
from vramguard.model import GiB
from vramguard_testbed.fakenvml import STATE_ENV, FakeNode, build_fake_nvml

from .containerd import IMAGES
from .controlplane import ControlPlane, binaries_dir, free_port
from .controlplane import unavailable_reason as control_plane_unavailable
from .node import NODE_CONTROLLERS, RealNode, raw
from .node import unavailable_reason as node_unavailable

pytestmark = pytest.mark.slow

AGENT_NS = "vramguard"
WORKLOAD_IMAGE = "localhost/vramguard-workload:1"
GPU_TOTAL = 24 * GiB
QUOTA = "vramguard.io/vram"


@dataclass
class Cluster:
    plane: ControlPlane
    node: RealNode
    api: client.ApiClient
    core: client.CoreV1Api
    helm: Path
    gpu_state: Path
    values: dict[str, Any]
    workdir: Path

    def gpu(self, used: dict[int, int]) -> None:
        """Make the test NVML report `used` (host PID -> bytes) on GPU 0."""
        state = FakeNode.gpus(1, total_bytes=GPU_TOTAL, name="NVIDIA L4 (test NVML)")
        state.drop_dead_pids = True  # a killed process leaves the driver's list, as on a real GPU
        for pid, used_bytes in used.items():
            state.gpu(0).add_process(pid, used_bytes)
        state.write(self.gpu_state)

    def helm_install(self, **policy: Any) -> None:
        """Install (or upgrade to) the chart with the test values and `policy`; wait for the agent to be Ready."""
        values = {**self.values, "policy": {**self.values["policy"], **policy}}
        path = self.workdir / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        subprocess.run(
            [str(self.helm), "upgrade", "--install", "vramguard", str(CHART), "--namespace", AGENT_NS,
             "--create-namespace", "--kubeconfig", str(self.plane.kubeconfig_path), "-f", str(path)],
            check=True, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        wait(lambda: self.agent_pod() is not None, 120, f"the agent pod with policy {values['policy']} Ready")

    def agent_pod(self) -> dict[str, Any] | None:
        """The agent's pod when it is Ready, alone and of the DaemonSet's current template (a rollout finished)."""
        apps = client.AppsV1Api(self.api)
        template = raw(self.api, apps.read_namespaced_daemon_set("vramguard", AGENT_NS))["spec"]["template"]
        pods: list[dict[str, Any]] = raw(self.api, self.core.list_namespaced_pod(AGENT_NS))["items"]
        if len(pods) != 1 or "deletionTimestamp" in pods[0]["metadata"] or not _ready(pods[0]):
            return None
        if pods[0]["metadata"]["annotations"] != template["metadata"]["annotations"]:
            return None
        return pods[0]

    def workload(self, namespace: str, name: str, quota: str) -> dict[str, Any]:
        """A running pod of the workload image with `quota` as its VRAM limit, placed by the scheduler."""
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, labels={"app": name}),
            spec=client.V1PodSpec(
                termination_grace_period_seconds=2,
                containers=[
                    client.V1Container(
                        name="main",
                        image=WORKLOAD_IMAGE,
                        image_pull_policy="Never",
                        resources=client.V1ResourceRequirements(limits={QUOTA: quota}),
                    )
                ],
            ),
        )
        self.core.create_namespaced_pod(namespace, pod)
        wait(lambda: self.phase(namespace, name) == "Running", 60, f"{namespace}/{name} Running")
        found = self.pod(namespace, name)
        assert found is not None
        return found

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return raw(self.api, self.core.read_namespaced_pod(name, namespace))
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise

    def phase(self, namespace: str, name: str) -> str | None:
        pod = self.pod(namespace, name)
        return None if pod is None else str(pod["status"]["phase"])

    def status(self, namespace: str, name: str) -> dict[str, Any]:
        """The status of the pod's one container."""
        pod = self.pod(namespace, name)
        assert pod is not None, f"{namespace}/{name} is gone"
        (status,) = pod["status"]["containerStatuses"]
        return dict(status)

    def pid(self, pod: dict[str, Any]) -> int:
        (status,) = pod["status"]["containerStatuses"]
        return self.node.container_pid(status["containerID"])

    def reasons(self, namespace: str, name: str) -> list[str]:
        events = self.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
        return sorted({e["reason"] for e in raw(self.api, events)["items"]})

    def namespace(self, name: str) -> str:
        self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        # Pods need the namespace's "default" ServiceAccount, which kube-controller-manager creates.
        wait(lambda: _exists(lambda: self.core.read_namespaced_service_account("default", name)), 30, "default SA")
        return name


def wait(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"not {what} after {timeout_s:.0f}s", pytrace=False)
        time.sleep(0.25)


def _ready(pod: dict[str, Any]) -> bool:
    conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
    return conditions.get("Ready") == "True"


def _exists(read: Callable[[], object]) -> bool:
    try:
        read()
    except client.ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    images = [IMAGES / "pause-1.tar", IMAGES / "workload-1.tar", IMAGES / f"vramguard-{__version__}.tar"]
    reason = control_plane_unavailable() or node_unavailable()
    if reason is None:
        absent = [str(p) for p in images if not p.exists()]
        reason = f"images missing: {', '.join(absent)} (scripts/node.sh, scripts/image.sh)" if absent else None
    need(reason, skip="no real node", ci="build the real node's parts first (scripts/test.sh does)")
    helm = need_helm()
    workdir = Path(f"/tmp/vg-node-{os.getpid()}")
    plane = ControlPlane(binaries_dir(), kubelets=True).start()
    try:
        plane.start_controller_manager(controllers=NODE_CONTROLLERS)
        plane.start_scheduler()
        with RealNode(plane, workdir / "node", labels={"nvidia.com/gpu.present": "true"}) as node:
            node.import_images(*images)
            gpu_dir = workdir / "gpu"
            gpu_dir.mkdir(parents=True)
            lib_dir = build_fake_nvml()
            values: dict[str, Any] = {
                "image": {"repository": "localhost/vramguard", "tag": __version__, "pullPolicy": "Never"},
                "hostNetwork": True,
                "metrics": {"port": free_port()},
                "advertiseCapacity": True,
                "extraArgs": ["--poll-interval=0.5"],
                "policy": {"mode": "kill", "cooldown": "1s"},
                "extraEnv": [
                    {"name": "LD_LIBRARY_PATH", "value": "/opt/test-nvml"},
                    {"name": STATE_ENV, "value": "/run/test-nvml/state"},
                    # No kube-proxy here: point in-cluster config at the API server itself (on the host's loopback).
                    {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                    {"name": "KUBERNETES_SERVICE_PORT", "value": plane.host.rsplit(":", 1)[1]},
                ],
                "extraVolumes": [
                    {"name": "test-nvml", "hostPath": {"path": str(lib_dir), "type": "Directory"}},
                    {"name": "test-nvml-state", "hostPath": {"path": str(gpu_dir), "type": "Directory"}},
                ],
                "extraVolumeMounts": [
                    {"name": "test-nvml", "mountPath": "/opt/test-nvml", "readOnly": True},
                    {"name": "test-nvml-state", "mountPath": "/run/test-nvml", "readOnly": True},
                ],
            }
            with plane.api_client() as api:
                found = Cluster(plane, node, api, client.CoreV1Api(api), helm, gpu_dir / "state", values, workdir)
                found.gpu({})
                yield found
    finally:
        plane.stop()
        subprocess.run(["rm", "-rf", str(workdir)], check=False)


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
        "exec", "--namespace", AGENT_NS, agent["metadata"]["name"], "--", "vramguard", "top", "--once"
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
