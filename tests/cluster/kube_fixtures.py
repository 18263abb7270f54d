"""Helpers for the agent's integration tests on a real API server (imported by the test modules).

`deploy_manifest` applies deploy/daemonset.yaml itself, so RBAC and the admission policy under test are the ones
operators install. `KubeNode` is a simulated GPU node (test NVML, real cgroups) registered as a real Node, whose
pods are real API objects: each pod's cgroups carry its real UID and its status carries the container IDs.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, utils

from vramguard.core.pod import PodInfo
from vramguard.kube.pod_manifest import pod_info_from_manifest
from vramguard_testbed.simnode import SimPod, SimulatedNode, metric_value
from vramguard_testbed.waiting import wait_until

from .controlplane import NEWEST, ControlPlane, write_kubeconfig

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "daemonset.yaml"
MERGE = "application/merge-patch+json"
AGENT_NAMESPACE = "vramguard"
POLL_S = 0.25

# For a test whose subject is the agent alone, the same whichever version of the API server is there (one frozen
# with SIGSTOP answers nothing, whatever its version): it runs on the newest only, not once per version.
on_the_newest_only = pytest.mark.parametrize("kubernetes_version", [NEWEST], indirect=True)


def deploy_manifest(api: client.ApiClient, manifest: Path = MANIFEST) -> None:
    """Create every object of the agent's manifest, deploy/daemonset.yaml of this or any checkout (already existing
    ones are left as they are), and wait until its admission policy is in force."""
    for doc in yaml.safe_load_all(manifest.read_text()):
        try:
            utils.create_from_dict(api, doc)  # type: ignore[no-untyped-call]  # untyped in the client
        except utils.FailToCreateError as e:
            if any(getattr(x, "status", None) != 409 for x in e.api_exceptions):
                raise
    wait_admission_policy(api)


def wait_admission_policy(api: client.ApiClient, timeout_s: float = 30.0) -> None:
    """Wait until the API server enforces the own-node admission policy (once its policy informer has seen the new
    ValidatingAdmissionPolicy): a dry-run status patch of a throwaway Node by the agent's ServiceAccount,
    impersonated as on another node, is refused by the policy."""
    core = client.CoreV1Api(api)
    probe = f"vramguard-policy-probe-{uuid.uuid4().hex[:8]}"
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=probe)))
    agent = client.ApiClient(api.configuration)
    user = f"system:serviceaccount:{AGENT_NAMESPACE}:vramguard"
    agent.set_default_header("Impersonate-User", user)  # type: ignore[no-untyped-call]  # untyped in the client
    # As a pod's token on another node: its node name in the user's extra (key percent-encoded, as headers need).
    node_name_header = "Impersonate-Extra-authentication.kubernetes.io%2Fnode-name"
    agent.set_default_header(node_name_header, "another-node")  # type: ignore[no-untyped-call]
    patch = {"status": {"capacity": {"vramguard.io/vram": "1Gi"}}}

    def refused() -> bool:
        try:
            client.CoreV1Api(agent).patch_node_status(probe, patch, dry_run="All", _content_type=MERGE)
        except client.ApiException as e:
            if e.status != 403:
                raise
            return "vramguard-own-node-only" in str(e.body)  # else RBAC's refusal: its binding not yet seen either
        return False

    try:
        wait_until(refused, timeout_s, what="the own-node admission policy enforced", interval_s=0.1)
    finally:
        agent.close()  # type: ignore[no-untyped-call]
        core.delete_node(probe)


def agent_kubeconfig(plane: ControlPlane, api: client.ApiClient, node_name: str, workdir: Path) -> Path:
    """Credentials as the DaemonSet's pod on `node_name` would have them: a token bound to that pod.

    The API server records the pod's node in such a token (user extra authentication.kubernetes.io/node-name),
    which the manifest's admission policy uses to confine the agent to its own node.
    """
    core = client.CoreV1Api(api)
    pod = core.create_namespaced_pod(
        AGENT_NAMESPACE,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name=f"vramguard-{node_name}"),
            spec=client.V1PodSpec(
                node_name=node_name,
                service_account_name="vramguard",
                containers=[client.V1Container(name="vramguard", image="vramguard:test")],
            ),
        ),
    )
    assert pod.metadata is not None
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(
            audiences=[],
            expiration_seconds=3600,
            bound_object_ref=client.V1BoundObjectReference(
                api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid
            ),
        )
    )
    granted = core.create_namespaced_service_account_token("vramguard", AGENT_NAMESPACE, request)
    assert granted.status is not None and granted.status.token
    return write_kubeconfig(
        workdir / f"agent-{node_name}.yaml", plane.host, plane.ca_path, "vramguard", {"token": granted.status.token}
    )


@dataclass(frozen=True)
class ApiPod:
    """A pod as created in the API server, with the agent's own view of it."""

    name: str
    namespace: str
    uid: str
    info: PodInfo


class KubeNode:
    """A simulated GPU node that is also a Node of the control plane, with the agent's credentials for it."""

    def __init__(
        self,
        plane: ControlPlane,
        api: client.ApiClient,
        workdir: Path,
        *,
        labels: Mapping[str, str] | None = None,
        gpu_total_bytes: int = 24 * 2**30,
        gpus: int = 1,
        driver_limits: bool | None = None,
    ) -> None:
        self.plane = plane
        self.api = api
        self.core = client.CoreV1Api(api)
        self.name = f"gpu-{uuid.uuid4().hex[:8]}"
        plane.add_node(self.name, labels={"kubernetes.io/hostname": self.name, **(labels or {})})
        self.kubeconfig = agent_kubeconfig(plane, api, self.name, workdir)
        self.sim = SimulatedNode(
            workdir / "node",
            node_name=self.name,
            gpu_total_bytes=gpu_total_bytes,
            gpus=gpus,
            driver_limits=driver_limits,
        )
        self.sim.kubeconfig = self.kubeconfig

    def pod(
        self,
        name: str,
        namespace: str,
        *,
        limits: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        containers: tuple[str, ...] = ("main",),
    ) -> tuple[ApiPod, SimPod]:
        """A pod bound to this node in the API, and its cgroups here; its status names the container IDs."""
        spec = client.V1PodSpec(
            node_name=self.name,
            containers=[
                client.V1Container(
                    name=c, image="busybox", resources=client.V1ResourceRequirements(limits=dict(limits or {}))
                )
                for c in containers
            ],
        )
        meta = client.V1ObjectMeta(name=name, annotations=dict(annotations or {}))
        self.core.create_namespaced_pod(namespace, client.V1Pod(metadata=meta, spec=spec))
        return self.adopt(name, namespace)

    def adopt(self, name: str, namespace: str) -> tuple[ApiPod, SimPod]:
        """Run a pod bound to this node (as created, or as the scheduler bound it): make its containers' cgroups
        here and write their IDs into its status, as the kubelet would."""
        created = self.core.read_namespaced_pod(name, namespace)
        assert created.metadata is not None and created.metadata.uid is not None and created.spec is not None
        containers = tuple(c.name for c in created.spec.containers)
        sim_pod = self.sim.add_pod(name, namespace, containers={c: {} for c in containers}, uid=created.metadata.uid)
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        statuses: list[dict[str, Any]] = [
            {
                "name": c,
                "containerID": f"containerd://{sim_pod.containers[c].container_id}",
                "image": "busybox",
                "imageID": "docker.io/library/busybox@sha256:" + "0" * 64,
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            }
            for c in containers
        ]
        patched = self.core.patch_namespaced_pod_status(
            name, namespace, {"status": {"phase": "Running", "containerStatuses": statuses}}, _content_type=MERGE
        )
        api_pod = ApiPod(name, namespace, created.metadata.uid, pod_info(patched))
        return api_pod, sim_pod

    def events(self, pod: ApiPod) -> list[client.CoreV1Event]:
        listed = self.core.list_namespaced_event(pod.namespace, field_selector=f"involvedObject.uid={pod.uid}")
        return list(listed.items)

    def reasons(self, pod: ApiPod) -> list[str]:
        """The reasons of the pod's Events, sorted (the API lists Events by name, not by time)."""
        return sorted(e.reason or "" for e in self.events(pod))

    def close(self) -> None:
        self.sim.close()


def pod_info(pod: client.V1Pod) -> PodInfo:
    """The agent's view of a pod object, through the same conversion its pod cache uses."""
    serialized = client.ApiClient().sanitize_for_serialization(pod)  # type: ignore[no-untyped-call]
    return pod_info_from_manifest(serialized)


def wait_scans(kube_node: KubeNode, n: int) -> None:
    """Wait until the node's agent has finished `n` more scans (10 s more than a simulated node waits: the agent
    here also talks to an API server)."""
    kube_node.sim.wait_scans(n, timeout_s=n * POLL_S * 10 + 10)


def metric(kube_node: KubeNode, name: str, **labels: str) -> float | None:
    """One sample from the node's agent's /metrics, or None when absent."""
    return metric_value(kube_node.sim.http_get("/metrics")[1], name, labels)
