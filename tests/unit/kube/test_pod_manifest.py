"""Pods from Kubernetes objects: the one translation at the edge, bounded."""

from __future__ import annotations

from typing import Any

import pytest

from vramguard.core.model import ClaimUse, GiB, NamespacePolicy, Policy
from vramguard.core.quota import resolve_pod_quota
from vramguard.kube.pod_manifest import MAX_CLAIMS, MAX_VALUE_CHARS, PodSourceError, pod_info_from_manifest

UID = "3f1c2a9e-0b7d-4c55-9d1e-2b3c4d5e6f70"
POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "trainer-0",
        "namespace": "ml",
        "uid": UID,
        "annotations": {"vramguard.io/vram-limit": "12Gi"},
        "ownerReferences": [{"kind": "StatefulSet", "name": "trainer", "controller": True}],
    },
    "spec": {
        "nodeName": "gpu-1",
        "priority": 1000,
        "initContainers": [{"name": "fetch", "resources": {}}],
        "containers": [
            {"name": "main", "resources": {"limits": {"vramguard.io/vram": "8Gi", "nvidia.com/gpumem": 1024}}},
            {"name": "sidecar"},
        ],
    },
    "status": {
        "qosClass": "Burstable",
        "containerStatuses": [
            {"name": "main", "containerID": "containerd://" + "a" * 64},
            {"name": "sidecar", "containerID": "cri-o://" + "b" * 64},
        ],
        "initContainerStatuses": [{"name": "fetch", "containerID": "containerd://" + "c" * 64}],
    },
}


def test_manifest_becomes_pod_info() -> None:
    """Every field the agent needs is read, with the runtime scheme stripped from container IDs."""
    p = pod_info_from_manifest(POD)
    assert (p.uid, p.namespace, p.name, p.priority, p.qos, p.owner) == (
        UID,
        "ml",
        "trainer-0",
        1000,
        "Burstable",
        "StatefulSet/trainer",
    )
    assert [(c.name, c.container_id) for c in p.containers] == [
        ("fetch", "c" * 64),
        ("main", "a" * 64),
        ("sidecar", "b" * 64),
    ]
    assert dict(p.containers[1].limits) == {"vramguard.io/vram": "8Gi", "nvidia.com/gpumem": "1024"}
    assert p.container_by_id("b" * 64) is p.containers[2]
    assert p.annotations["vramguard.io/vram-limit"] == "12Gi"
    assert not p.terminating


def test_ephemeral_container_is_a_container_and_falls_under_the_namespace_cap() -> None:
    """A `kubectl debug` container is listed with its runtime ID, so its GPU use is its own container's, and in a
    namespace with max_quota it is held to the cap like any container without a quota."""
    info = pod_info_from_manifest(
        {
            "metadata": {"uid": "u1", "name": "p", "namespace": "team"},
            "spec": {"containers": [{"name": "main"}], "ephemeralContainers": [{"name": "debugger"}]},
            "status": {
                "containerStatuses": [{"name": "main", "containerID": "containerd://" + "a" * 64}],
                "ephemeralContainerStatuses": [{"name": "debugger", "containerID": "containerd://" + "b" * 64}],
            },
        }
    )
    debugger = info.container_by_id("b" * 64)
    assert debugger is not None and debugger.name == "debugger"
    policy = Policy(namespaces={"team": NamespacePolicy(max_quota_bytes=8 * GiB)})
    quota = resolve_pod_quota(info, policy, {}).containers["debugger"]
    assert quota.limit_bytes == 8 * GiB


def test_pending_and_terminating_pods() -> None:
    """A container not started yet has no ID; a deletionTimestamp marks the pod terminating."""
    manifest = {**POD, "status": {}, "metadata": {**POD["metadata"], "deletionTimestamp": "2026-11-22T10:00:00Z"}}
    p = pod_info_from_manifest(manifest)
    assert all(c.container_id is None for c in p.containers)
    assert p.terminating and p.qos == "BestEffort"


def test_pod_without_uid_is_an_error() -> None:
    """A pod object with no UID cannot be matched to a cgroup: a clear error, not a silent skip."""
    with pytest.raises(PodSourceError, match=r"metadata\.uid"):
        pod_info_from_manifest({"metadata": {"name": "x", "namespace": "y"}})


def test_only_the_annotations_and_limits_vramguard_reads_are_kept() -> None:
    """Annotations and limits no quota source reads are dropped at the edge: they cost nothing per scan."""
    annotations = {
        "vramguard.io/vram-limit": "4Gi",
        "vramguard.io/vram-burst": "6Gi",
        "gpu-memory": "2000",
        "kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 5000 + "}",
        "prometheus.io/scrape": "true",
    }
    limits = {
        "vramguard.io/vram": "8Gi",
        "tencent.com/vcuda-memory": 4,
        "cpu": "4",
        "memory": "16Gi",
        "nvidia.com/gpu": 1,
    }
    manifest = {
        **POD,
        "metadata": {**POD["metadata"], "annotations": annotations},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
    }
    p = pod_info_from_manifest(manifest)
    assert dict(p.annotations) == {
        "vramguard.io/vram-limit": "4Gi",
        "vramguard.io/vram-burst": "6Gi",
        "gpu-memory": "2000",
    }
    assert dict(p.containers[0].limits) == {"vramguard.io/vram": "8Gi", "tencent.com/vcuda-memory": "4"}


def test_huge_values_are_cut_and_still_reported_invalid() -> None:
    """A 10 MB quota annotation or limit is kept as 1024 characters, marked cut, and is still an invalid quota."""
    huge = "9" * 10_000_000
    manifest = {
        **POD,
        "metadata": {**POD["metadata"], "name": "n" * 100_000, "annotations": {"vramguard.io/vram-limit": huge}},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {"vramguard.io/vram": huge}}}]},
    }
    p = pod_info_from_manifest(manifest)
    kept = [p.annotations["vramguard.io/vram-limit"], p.containers[0].limits["vramguard.io/vram"], p.name]
    assert [len(v) for v in kept] == [MAX_VALUE_CHARS] * 3
    assert all(v.endswith("[cut: 10000000 characters]") for v in kept[:2]) and kept[2].endswith(
        "[cut: 100000 characters]"
    )
    assert len(repr(p)) < 5 * MAX_VALUE_CHARS  # what a log line holding the pod can cost

    quota = resolve_pod_quota(p, Policy(), {})
    assert quota.pod is None and not quota.containers
    fields = {e.field: e.message for e in quota.errors}
    assert set(fields) == {
        "metadata.annotations[vramguard.io/vram-limit]",
        "spec.containers[main].resources.limits[vramguard.io/vram]",
    }
    assert all("longer than 64 characters" in m and len(m) < 300 for m in fields.values())


def test_pod_manifest_claims_are_read_and_bounded() -> None:
    """A pod's claims name their claim (None until generated), its containers' uses are read, both up to MAX_CLAIMS."""
    manifest: dict[str, Any] = {
        "metadata": {"uid": "u", "namespace": "ml", "name": "p"},
        "spec": {
            "resourceClaims": [
                {"name": "gpu", "resourceClaimTemplateName": "share-10gi"},
                {"name": "shared", "resourceClaimName": "team-gpu"},
                {"name": "later", "resourceClaimTemplateName": "t"},
            ],
            "containers": [
                {"name": "main", "resources": {"claims": [{"name": "gpu"}, {"name": "shared", "request": "r"}]}}
            ],
        },
        "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x7k2"}]},
    }
    info = pod_info_from_manifest(manifest)
    assert dict(info.claims) == {"gpu": "p-gpu-x7k2", "shared": "team-gpu", "later": None}
    assert info.containers[0].claims == (ClaimUse("gpu"), ClaimUse("shared", "r"))
    manifest["spec"]["resourceClaims"] = [{"name": f"c{i}", "resourceClaimName": f"c{i}"} for i in range(1000)]
    manifest["spec"]["containers"][0]["resources"]["claims"] = [{"name": f"c{i}"} for i in range(1000)] + ["junk"]
    flooded = pod_info_from_manifest(manifest)
    assert len(flooded.claims) == MAX_CLAIMS and len(flooded.containers[0].claims) == MAX_CLAIMS
