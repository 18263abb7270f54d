"""A one-node cluster with the agent installed from its Helm chart, for the end-to-end tests and the benchmarks
(bench/agent_pod.py, bench/limits_window.py): a `ControlPlane(kubelets=True)` with the scheduler and the
controllers a node needs, a `RealNode` (kubelet + containerd) labelled as a GPU node, the project's images
imported, and the test NVML library on the host for the agent's pod to mount.

    with real_cluster(HELM) as cluster:
        cluster.helm_install(mode="kill")                 # waits until the agent's pod is Ready
        pod = cluster.workload("ml", "trainer", "4Gi")     # a running pod with a 4Gi VRAM limit
        cluster.gpu({cluster.pid(pod): 9 * GiB})           # the test NVML now reports 9GiB for its process

The test NVML library lies on the host in a driver's layout (`<workdir>/driver/usr/lib64/libnvidia-ml.so.1`), and
the agent finds it through the chart's `driver.root`, as on a node without NVIDIA's runtime (it opens no device
nodes, so `driver.devicesFromRuntime` keeps the narrow security context). The only test-only chart values are its
state directory mounted from the host (`extraEnv`, `extraVolumes`) and the API server's address, since no
kube-proxy makes the `kubernetes` Service routable here. The workload pods' processes live in the cgroups that the
kubelet and containerd made; the test only tells the test NVML how much GPU memory each host PID holds.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from helm_fixtures import CHART
from vramguard import __version__
from vramguard.core.quantity import GiB
from vramguard.nvml.library import LIBRARY_NAME
from vramguard_testbed.fakenvml import STATE_ENV, FakeNode, build_fake_nvml
from vramguard_testbed.waiting import WaitTimeout, wait_until

from .containerd import IMAGES
from .controlplane import ControlPlane, binaries_dir, free_port
from .controlplane import unavailable_reason as control_plane_unavailable
from .node import NODE_CONTROLLERS, RealNode, raw
from .node import unavailable_reason as node_unavailable

AGENT_NS = "vramguard"
WORKLOAD_IMAGE = "localhost/vramguard-workload:1"
GPU_TOTAL = 24 * GiB
QUOTA = "vramguard.io/vram"
# Held while a real node runs (`one_node_at_a_time`).
NODE_LOCK = Path("/run/lock/vramguard-real-node.lock")
DRIVER_LAYOUT = "usr/lib64"  # where the test NVML lies under the driver root, as a RHEL-family driver's does
IMAGE_ARCHIVES = (IMAGES / "pause-1.tar", IMAGES / "workload-1.tar", IMAGES / f"vramguard-{__version__}.tar")


def unavailable_reason() -> str | None:
    """Why the cluster cannot start here (what is missing, and which script makes it), or None."""
    reason = control_plane_unavailable() or node_unavailable()
    if reason is None:
        absent = [str(p) for p in IMAGE_ARCHIVES if not p.exists()]
        reason = f"images missing: {', '.join(absent)} (scripts/node.sh, scripts/image.sh)" if absent else None
    return reason


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

    def gpu(self, used: dict[int, int], *, memory_limits: bool = False) -> None:
        """Make the test NVML report `used` (host PID -> bytes) on GPU 0; with `memory_limits`, as an R615 driver
        that holds per-cgroup limits."""
        state = FakeNode.gpus(1, total_bytes=GPU_TOTAL, name="NVIDIA L4 (test NVML)")
        state.drop_dead_pids = True  # a killed process leaves the driver's list, as on a real GPU
        state.memory_limits = memory_limits
        for pid, used_bytes in used.items():
            state.gpu(0).add_process(pid, used_bytes)
        state.write(self.gpu_state)

    def helm_install(self, *, chart_values: dict[str, Any] | None = None, **policy: Any) -> None:
        """Install (or upgrade to) the chart with the test values, `chart_values` over them (each top-level key
        replaced) and `policy`; wait for the agent to be Ready."""
        values = {**self.values, **(chart_values or {})}
        values["policy"] = {**self.values["policy"], **policy}
        path = self.workdir / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        subprocess.run(
            [str(self.helm), "upgrade", "--install", "vramguard", str(CHART), "--namespace", AGENT_NS,
             "--create-namespace", "--kubeconfig", str(self.plane.kubeconfig_path), "-f", str(path)],
            check=True, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        try:
            wait_until(
                lambda: self.agent_pod() is not None,
                120,
                what=f"the agent pod with policy {values['policy']} Ready",
                interval_s=0.25,
            )
        except WaitTimeout as e:
            raise WaitTimeout(f"{e}\n{self.agent_state()}") from None

    def agent_state(self) -> str:
        """What the agent's pods are doing, and the end of each one's log: why none is Ready."""
        said = []
        for pod in raw(self.api, self.core.list_namespaced_pod(AGENT_NS))["items"]:
            name = pod["metadata"]["name"]
            said.append(f"{name}: {json.dumps(pod.get('status', {}).get('containerStatuses'))}")
            said.append(self.node.kubectl("logs", "--namespace", AGENT_NS, name, "--tail=30", check=False).stdout)
        return "\n".join(said)

    def person(self, name: str, *cluster_roles: str) -> Path:
        """A kubeconfig for ServiceAccount people/`name`, bound to `cluster_roles` (the chart's people roles) and
        nothing else."""
        kubeconfig = self.plane.service_account_kubeconfig("people", name)
        rbac = client.RbacAuthorizationV1Api(self.api)
        for role in cluster_roles:
            rbac.create_cluster_role_binding(
                client.V1ClusterRoleBinding(
                    metadata=client.V1ObjectMeta(name=f"{name}-{role}"),
                    role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role),
                    subjects=[client.RbacV1Subject(kind="ServiceAccount", name=name, namespace="people")],
                )
            )
        return kubeconfig

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

    def workload(
        self,
        namespace: str,
        name: str,
        quota: str | None,
        *,
        annotations: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """A running pod of the workload image with `quota` as its VRAM limit (None: none) and `env` in its
        container's env[], placed by the scheduler."""
        self.create_workload(namespace, name, quota, annotations=annotations, env=env)
        wait_until(
            lambda: self.phase(namespace, name) == "Running", 60, what=f"{namespace}/{name} Running", interval_s=0.25
        )
        found = self.pod(namespace, name)
        assert found is not None
        return found

    def create_workload(
        self,
        namespace: str,
        name: str,
        quota: str | None,
        *,
        command: list[str] | None = None,
        annotations: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """Create the pod `workload` makes (its container "main" runs `command` if given, else the image's sleep)
        and return at once, without waiting for it to run: for creating many pods together."""
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, labels={"app": name}, annotations=annotations),
            spec=client.V1PodSpec(
                termination_grace_period_seconds=2,
                containers=[
                    client.V1Container(
                        name="main",
                        image=WORKLOAD_IMAGE,
                        image_pull_policy="Never",
                        command=command,
                        env=[client.V1EnvVar(name=k, value=v) for k, v in env.items()] if env else None,
                        resources=client.V1ResourceRequirements(limits={QUOTA: quota} if quota else None),
                    )
                ],
            ),
        )
        self.core.create_namespaced_pod(namespace, pod)

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

    def metrics(self) -> str:
        """The agent's /metrics (Prometheus text), from its port on the node's network."""
        port = self.values["metrics"]["port"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text: str = response.read().decode()
        return text

    def node_events(self, reason: str) -> list[dict[str, Any]]:
        """The Events with `reason` about this node's Node object (which live in the "default" namespace)."""
        selector = f"involvedObject.kind=Node,involvedObject.name={self.node.name},reason={reason}"
        found: list[dict[str, Any]] = raw(
            self.api, self.core.list_namespaced_event("default", field_selector=selector)
        )["items"]
        return found

    def agent_log(self) -> str:
        """Everything every agent pod's container wrote, from containerd's files on the node (readable with the
        kubelet stopped)."""
        return self.node.container_log(AGENT_NS, "vramguard-*", "vramguard")

    def api_values(self, port: int) -> dict[str, Any]:
        """Chart values (for `helm_install`'s `chart_values`) that point the agent at 127.0.0.1:`port` instead of
        the API server: a proxy in front of it (tests/cluster/delaying_proxy.py)."""
        env = [
            {**e, "value": str(port)} if e["name"] == "KUBERNETES_SERVICE_PORT" else e for e in self.values["extraEnv"]
        ]
        return {"extraEnv": env}

    def namespace(self, name: str) -> str:
        self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        # Pods need the namespace's "default" ServiceAccount, which kube-controller-manager creates.
        wait_until(
            lambda: _exists(lambda: self.core.read_namespaced_service_account("default", name)),
            30,
            what="default SA",
            interval_s=0.25,
        )
        return name


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


@contextlib.contextmanager
def one_node_at_a_time(timeout_s: float = 900.0) -> Iterator[None]:
    """Hold the host's real-node lock: a node takes what is the host's, not its work directory's (its address on
    `lo`, the bridge, /var/lib/kubelet, the kubelet's /kubepods cgroups, /run/containerd), so two at once, from
    two test runs or a test and a benchmark, break each other. Waits up to `timeout_s` for the holder to finish."""
    with open(NODE_LOCK, "a") as lock:

        def locked() -> bool:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        try:
            wait_until(locked, timeout_s, what=f"the real-node lock {NODE_LOCK}", interval_s=1.0)
        except WaitTimeout:
            raise TimeoutError(f"another real node held {NODE_LOCK} for {timeout_s:.0f}s") from None
        yield  # closing the file releases the lock, also when this process dies


@contextlib.contextmanager
def real_cluster(helm: Path, *, poll_interval_s: float = 0.5) -> Iterator[Cluster]:
    """The cluster, ready for `helm_install`; everything stopped and the host restored on leaving. One real node
    runs on a host at a time (`one_node_at_a_time`): a second waits for the first to finish."""
    with one_node_at_a_time():
        yield from _real_cluster(helm, poll_interval_s)


def _real_cluster(helm: Path, poll_interval_s: float) -> Iterator[Cluster]:
    workdir = Path(f"/tmp/vg-node-{os.getpid()}")
    plane = ControlPlane(binaries_dir(), kubelets=True).start()
    try:
        plane.start_controller_manager(controllers=NODE_CONTROLLERS)
        plane.start_scheduler()
        with RealNode(plane, workdir / "node", labels={"nvidia.com/gpu.present": "true"}) as node:
            node.import_images(*IMAGE_ARCHIVES)
            gpu_dir = workdir / "gpu"
            gpu_dir.mkdir(parents=True)
            driver_root = workdir / "driver"
            (driver_root / DRIVER_LAYOUT).mkdir(parents=True)
            shutil.copyfile(build_fake_nvml() / LIBRARY_NAME, driver_root / DRIVER_LAYOUT / LIBRARY_NAME)
            values = _test_values(plane, driver_root, gpu_dir, poll_interval_s, node.pod_logs)
            with plane.api_client() as api:
                cluster = Cluster(plane, node, api, client.CoreV1Api(api), helm, gpu_dir / "state", values, workdir)
                cluster.gpu({})
                yield cluster
    finally:
        plane.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _test_values(
    plane: ControlPlane, driver_root: Path, gpu_dir: Path, poll_interval_s: float, pod_logs: Path
) -> dict[str, Any]:
    return {
        "kubelet": {"podLogsDir": str(pod_logs)},
        # The test NVML opens no /dev/nvidia*: nothing for the runtime to give, so the narrow context stays.
        "driver": {"root": str(driver_root), "devicesFromRuntime": True},
        "image": {"repository": "localhost/vramguard", "tag": __version__, "pullPolicy": "Never"},
        "hostNetwork": True,
        "metrics": {"port": free_port()},
        "advertiseCapacity": True,
        "extraArgs": [f"--poll-interval={poll_interval_s}"],
        "policy": {"mode": "kill", "cooldown": "1s"},
        "extraEnv": [
            {"name": STATE_ENV, "value": "/run/test-nvml/state"},
            # No kube-proxy here: point in-cluster config at the API server itself (on the host's loopback).
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": plane.host.rsplit(":", 1)[1]},
        ],
        "extraVolumes": [
            {"name": "test-nvml-state", "hostPath": {"path": str(gpu_dir), "type": "Directory"}},
        ],
        "extraVolumeMounts": [
            # Writable: the test driver keeps the limits it is given in files beside its state.
            {"name": "test-nvml-state", "mountPath": "/run/test-nvml"},
        ],
    }


def kubectl_as(kubeconfig: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """The built kubectl as the user of `kubeconfig`, with this environment's bin directory (where pip put
    kubectl-vramguard) first on its PATH, colour off."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "KUBECONFIG": str(kubeconfig),  # the plugin's too: kubectl passes no flags of its own to a plugin
        "NO_COLOR": "1",
    }
    done = subprocess.run(
        [str(binaries_dir() / "kubectl"), *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} exited {done.returncode}: {done.stdout}{done.stderr}")
    return done
