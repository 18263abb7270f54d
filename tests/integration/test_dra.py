"""The scheduler's half of per-GPU memory shares, on the real kube-scheduler and claim controller (Kubernetes
1.36+, where DRA's consumable capacity is on by default): a ResourceSlice shaped like NVIDIA's consumable shares
(four 24Gi GPUs, `allowMultipleAllocations`, a `memory` capacity with a `requestPolicy`), and pods whose
ResourceClaimTemplates ask 10Gi each. The scheduler puts two on each GPU and records the share in each claim
(`consumedCapacity`, `shareID`); a ninth pod, whose 10Gi fits the node's 16Gi left in all but no single GPU's 4Gi,
stays Pending with the scheduler's reason.

This is what vramguard's claim quota source will read (issue 10); the agent's half is not written yet.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, utils

from .controlplane import NEWEST, ControlPlane, binaries_dir
from .node import raw

DRIVER = "gpu.nvidia.com"
NODE = "dra-gpu-node"
GPUS = 4


def wait(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"not {what} after {timeout_s:.0f}s", pytrace=False)
        time.sleep(0.2)


@pytest.fixture(scope="module")
def dra_plane(kubernetes_version: str) -> Iterator[ControlPlane]:
    if kubernetes_version != NEWEST:
        pytest.skip(f"consumable DRA capacity is on by default from Kubernetes 1.36; this is {kubernetes_version}")
    plane = ControlPlane(binaries_dir(NEWEST)).start()
    try:
        plane.start_scheduler()
        plane.start_controller_manager(controllers="resourceclaim-controller")
        yield plane
    finally:
        plane.stop()


def create(api: client.ApiClient, doc: dict[str, Any], namespace: str | None = None) -> None:
    """Create an object from its manifest (any kind the client knows, resource.k8s.io/v1 included)."""
    utils.create_from_dict(api, doc, namespace=namespace)  # type: ignore[no-untyped-call]  # untyped in the client


def gpu_slice() -> dict[str, Any]:
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "uuid": {"string": f"GPU-{i:08x}-1111-2222-3333-444444444444"},
                "productName": {"string": "NVIDIA L4"},
                "index": {"int": i},
            },
            "capacity": {
                "memory": {
                    "value": "24Gi",
                    "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}},
                }
            },
            "allowMultipleAllocations": True,
        }
        for i in range(GPUS)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{NODE}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def share_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "share-10gi"}],
            "containers": [{"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }


def test_the_scheduler_places_memory_shares_per_gpu(dra_plane: ControlPlane) -> None:
    dra_plane.add_node(NODE, labels={"kubernetes.io/hostname": NODE})
    with dra_plane.api_client() as api:
        core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
        create(
            api,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "gpu.vramguard.test"},
                "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
            },
        )
        create(api, gpu_slice())
        ns = "dra"
        create(api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        create(
            api,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "share-10gi"},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [
                                {
                                    "name": "gpu",
                                    "exactly": {
                                        "deviceClassName": "gpu.vramguard.test",
                                        "capacity": {"requests": {"memory": "10Gi"}},
                                    },
                                }
                            ]
                        }
                    }
                },
            },
            ns,
        )
        for i in range(2 * GPUS):
            create(api, share_pod(f"share-{i}"), ns)

        def claims() -> list[dict[str, Any]]:
            items: list[dict[str, Any]] = raw(api, resource.list_namespaced_resource_claim(ns))["items"]
            return [c for c in items if c.get("status", {}).get("allocation")]

        wait(lambda: len(claims()) == 2 * GPUS, 60, "every claim allocated")
        results = [r for c in claims() for r in c["status"]["allocation"]["devices"]["results"]]
        assert {r["consumedCapacity"]["memory"] for r in results} == {"10Gi"}
        assert all(r.get("shareID") for r in results), "each allocation is a share of its device"
        per_gpu = sorted(sum(1 for r in results if r["device"] == f"gpu-{i}") for i in range(GPUS))
        assert per_gpu == [2] * GPUS, "two 10Gi shares on each 24Gi GPU"
        bound = [raw(api, core.read_namespaced_pod(f"share-{i}", ns))["spec"].get("nodeName") for i in range(2 * GPUS)]
        assert bound == [NODE] * (2 * GPUS)

        # 16Gi left on the node, 4Gi on each GPU: a 10Gi share fits the node's total but no single GPU.
        create(api, share_pod("one-too-many"), ns)

        def unschedulable() -> dict[str, Any] | None:
            status = raw(api, core.read_namespaced_pod("one-too-many", ns)).get("status", {})
            found = [c for c in status.get("conditions", []) if c["type"] == "PodScheduled"]
            return found[0] if found and found[0]["status"] == "False" else None

        wait(lambda: unschedulable() is not None, 60, "the pod reported unschedulable")
        condition = unschedulable()
        assert condition is not None and condition["reason"] == "Unschedulable"
        print(f"\nPending: {condition['message']}")
        assert "cannot allocate all claims" in condition["message"], condition["message"]
