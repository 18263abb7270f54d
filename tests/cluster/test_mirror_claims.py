"""A tenant's mirror claim decides nothing, against a real kube-apiserver (which accepts the annotation from anyone
who may create a pod): real processes in kubelet-shaped cgroups, the agent in kill mode, and the simulated node's
pod logs directory as the kubelet's word on what it runs (`node/kubelet_pods.py`). No kubelet runs here, so no
forged mirror is deleted by kubelet housekeeping: each forgery lives as long as the test."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from vramguard.core.quantity import GiB
from vramguard_testbed.simnode import SimPod, json_logs
from vramguard_testbed.waiting import wait_until

from .kube_fixtures import MERGE, POLL_S, KubeNode, metric, wait_scans

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]

MIRROR = "kubernetes.io/config.mirror"
LIMIT = "vramguard.io/vram-limit"
STATIC_UID = "5d41402abc4b2a76b9719d911017c592"  # the kubelet's hash of a manifest
GRACE_S = 10.0  # the policy's least orphan_grace


def start_agent(node: KubeNode, tmp_path: Path) -> subprocess.Popen[str]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"mode: kill\norphan_grace: {GRACE_S:g}s\nexempt_namespaces: []\ncooldown: 1s\n")
    agent = node.sim.start_agent(
        "--policy", str(policy), "--poll-interval", str(POLL_S), stderr=subprocess.PIPE, text=True
    )
    node.sim.wait_ready()
    return agent


def bound_pod(node: KubeNode, namespace: str, name: str, annotations: dict[str, str], sim: SimPod | None = None) -> Any:
    """A pod created by the admin, bound to the node by nodeName; with `sim`, its status names that pod's container
    as the kubelet would write it (what a genuine mirror pod's status carries)."""
    meta = client.V1ObjectMeta(name=name, annotations=annotations)
    spec = client.V1PodSpec(node_name=node.name, containers=[client.V1Container(name="main", image="busybox")])
    created = node.core.create_namespaced_pod(namespace, client.V1Pod(metadata=meta, spec=spec))
    if sim is not None:
        status = {"name": "main", "containerID": f"containerd://{sim.containers['main'].container_id}"}
        node.core.patch_namespaced_pod_status(
            name, namespace, {"status": {"phase": "Running", "containerStatuses": [status]}}, _content_type=MERGE
        )
    return created


def refusals(node: KubeNode) -> float:
    return metric(node, "vramguard_pod_mirror_claims_refused") or 0.0


def test_a_forged_mirror_lends_a_static_pod_nothing_and_voids_no_genuine_one(
    node: KubeNode, namespace: str, admin_api: client.ApiClient, tmp_path: Path
) -> None:
    """A static pod (3 GiB, no mirror yet, no policy default) and a tenant's pod bound to the node claiming its UID
    with a 1Mi quota: the static pod is not killed. Then its genuine mirror (the static pod's namespace and name,
    a 4Gi quota) with the forgery still there: the static pod over 4Gi is killed, and the Event is on the genuine
    mirror. Each forgery is refused once and counted."""
    static_ns = f"{namespace}-static"
    client.CoreV1Api(admin_api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=static_ns)))
    static = node.sim.add_pod(f"trainer-{node.name}", static_ns, uid=STATIC_UID)  # its pod logs directory too
    process = node.sim.spawn(static, "main", 3 * GiB)
    agent = start_agent(node, tmp_path)

    bound_pod(node, namespace, "forger", {MIRROR: STATIC_UID, LIMIT: "1Mi"})
    wait_until(lambda: refusals(node) == 1.0, 10 + 10 * POLL_S, what="the forged claim refused")
    wait_scans(node, 6)
    assert process.alive(), "killed on a forged mirror's quota"

    mirror = bound_pod(node, static_ns, f"trainer-{node.name}", {MIRROR: STATIC_UID, LIMIT: "4Gi"}, static)
    bound_pod(node, namespace, "forger-2", {MIRROR: STATIC_UID, LIMIT: "100Gi"})  # a second claim voids nothing
    wait_until(lambda: refusals(node) == 2.0, 10 + 10 * POLL_S, what="the second forgery refused")
    wait_scans(node, 3)
    assert process.alive(), "3 GiB is within the genuine mirror's 4Gi"
    node.sim.set_usage(process, 6 * GiB)
    wait_until(lambda: not process.alive(), 10 * POLL_S + 5, what="the static pod killed over its own 4Gi")
    wait_until(
        lambda: any(
            e.reason == "VRAMKilled"
            for e in node.core.list_namespaced_event(static_ns, field_selector=f"involvedObject.uid={STATIC_UID}").items
        ),
        15,
        what="VRAMKilled on the genuine mirror",
    )
    assert not [e for e in node.core.list_namespaced_event(namespace).items if e.reason == "VRAMKilled"]
    assert mirror.metadata.uid != STATIC_UID
    agent.terminate()
    refused = [e for e in json_logs(agent) if e.get("event") == "pod_mirror_claim_refused"]
    assert len(refused) == 2, refused
    assert all(f"runs that UID as {static_ns}/trainer-{node.name}" in e["why"] for e in refused), refused


def test_a_forged_claim_on_a_deleted_pods_uid_shields_none_of_its_leftovers(
    node: KubeNode, namespace: str, tmp_path: Path
) -> None:
    """A pod deleted with its process still on the GPU, and a tenant's pod claiming its UID with an 80Gi quota:
    the leftover, grown to 20 GiB, is reclaimed `orphan_grace` after the deletion. A static pod whose manifest sets
    a UUID of its own, with no mirror, is never taken for an orphan."""
    trainer, sim_trainer = node.pod("trainer", namespace, annotations={LIMIT: "8Gi"})
    left = node.sim.spawn(sim_trainer, "main", 2 * GiB)
    static = node.sim.add_pod("etcd-gpu", "infra", uid="9b1deb4d-3b7d-4bad-9bdd-2b0d7b3dcb6d")  # no mirror
    kept = node.sim.spawn(static, "main", 1 * GiB)
    agent = start_agent(node, tmp_path)
    wait_scans(node, 2)

    node.core.delete_namespaced_pod("trainer", namespace, grace_period_seconds=0)
    bound_pod(node, namespace, "shield", {MIRROR: trainer.uid, LIMIT: "80Gi"})
    node.sim.set_usage(left, 20 * GiB)
    wait_until(lambda: refusals(node) == 1.0, 10 + 10 * POLL_S, what="the forged claim on a gone pod refused")
    wait_until(lambda: not left.alive(), GRACE_S + 30, what="the deleted pod's leftover reclaimed")
    wait_scans(node, int(GRACE_S / POLL_S) + 4)
    assert kept.alive(), "a static pod without a mirror is no orphan"
    assert metric(node, "vramguard_orphan_reclaims_total", result="ok") == 1.0
    agent.terminate()
    logs = json_logs(agent)
    assert [e["pids"] for e in logs if e.get("event") == "orphan_reclaimed"] == [[left.pid]]
