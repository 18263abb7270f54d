"""Pods from Kubernetes objects: the one translation at the edge, and the file-backed pod source."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from vramguard.pods import FilePodSource, PodSourceError, pod_info_from_manifest

POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "trainer-0",
        "namespace": "ml",
        "uid": "3f1c2a9e-0b7d-4c55-9d1e-2b3c4d5e6f70",
        "annotations": {"vramguard.io/vram-limit": "12Gi"},
        "ownerReferences": [{"kind": "StatefulSet", "name": "trainer", "controller": True}],
    },
    "spec": {
        "nodeName": "gpu-1",
        "priority": 1000,
        "initContainers": [{"name": "fetch", "resources": {}}],
        "containers": [
            {"name": "main", "resources": {"limits": {"vramguard.io/vram": "8Gi", "nvidia.com/gpu": 1}}},
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
        "3f1c2a9e-0b7d-4c55-9d1e-2b3c4d5e6f70",
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
    assert dict(p.containers[1].limits) == {"vramguard.io/vram": "8Gi", "nvidia.com/gpu": "1"}
    assert p.container_by_id("b" * 64) is p.containers[2]
    assert p.annotations["vramguard.io/vram-limit"] == "12Gi"
    assert not p.terminating


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


def _write(path: Path, items: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    os.replace(tmp, path)


def test_file_source_filters_by_node_and_reads_node_labels(tmp_path: Path) -> None:
    """Only pods bound to this node are served; the Node item's labels become node_labels."""
    other = {**POD, "metadata": {**POD["metadata"], "uid": "other"}, "spec": {**POD["spec"], "nodeName": "gpu-2"}}
    node = {"kind": "Node", "metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.replicas": "4"}}}
    path = tmp_path / "pods.yaml"
    _write(path, [POD, other, node])
    source = FilePodSource(str(path), node_name="gpu-1")
    assert source.synced()
    assert list(source.pods()) == ["3f1c2a9e-0b7d-4c55-9d1e-2b3c4d5e6f70"]
    assert source.node_labels() == {"nvidia.com/gpu.replicas": "4"}


def test_file_source_follows_changes_and_keeps_last_good(tmp_path: Path) -> None:
    """A rewritten file is picked up; a broken one keeps the last good pods and says why."""
    path = tmp_path / "pods.yaml"
    _write(path, [POD])
    source = FilePodSource(str(path))
    assert len(source.pods()) == 1
    _write(path, [])
    assert source.pods() == {}
    _write(path, [POD])
    assert len(source.pods()) == 1
    path.write_text("items: [ {unclosed")
    assert len(source.pods()) == 1
    assert source.error is not None and "pods.yaml" in source.error


def test_missing_file_is_not_synced(tmp_path: Path) -> None:
    """No file yet: not synced (so /readyz says so), no pods, and the reason is kept."""
    source = FilePodSource(str(tmp_path / "absent.yaml"))
    assert not source.synced() and source.pods() == {}
    assert source.error is not None and "absent.yaml" in source.error
