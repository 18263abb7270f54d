"""Pods from Kubernetes objects: the one translation at the edge, bounded, and the parser of pods files."""

from __future__ import annotations

import json
import time
import tracemalloc
from typing import Any

import pytest
import yaml

from vramguard.core.model import GiB, NamespacePolicy, Policy
from vramguard.core.quota import resolve_pod_quota
from vramguard.kube.pods_file import (
    MAX_VALUE_CHARS,
    YAML_LOADERS,
    PodSourceError,
    parse_pod_list,
    pod_info_from_manifest,
)

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
# libyaml's parser, and the pure-Python one FilePodSource falls back to where PyYAML was built without it.
LOADERS = YAML_LOADERS
NODE: dict[str, Any] = {"kind": "Node", "metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.replicas": "4"}}}


def pod(uid: str, node: str = "gpu-1", **metadata: Any) -> dict[str, Any]:
    """POD with another UID (and node, and metadata fields)."""
    return {**POD, "metadata": {**POD["metadata"], "uid": uid, **metadata}, "spec": {**POD["spec"], "nodeName": node}}


def pod_list(*items: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "items": list(items), "kind": "List", "metadata": {"resourceVersion": ""}}


def as_yaml(doc: object) -> bytes:
    # Through JSON first: safe_dump writes an anchor and aliases for objects shared in the document, and
    # kubectl never does (nor would a pods file be accepted with them).
    return yaml.dump(json.loads(json.dumps(doc)), Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper)).encode()


def as_json(doc: object) -> bytes:
    return json.dumps(doc, indent=4).encode()  # as kubectl prints it


# --------------------------------------------------------------------------------------------------------------
# The translation


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


# --------------------------------------------------------------------------------------------------------------
# Parsing pods files


@pytest.mark.parametrize(
    ("data", "node_name", "uids", "labels"),
    [
        pytest.param(as_yaml(pod_list(POD, NODE)), "gpu-1", [UID], {"nvidia.com/gpu.replicas": "4"}, id="kubectl-yaml"),
        pytest.param(as_json(pod_list(POD, NODE)), "gpu-1", [UID], {"nvidia.com/gpu.replicas": "4"}, id="kubectl-json"),
        pytest.param(b"\xef\xbb\xbf" + as_json(pod_list(POD)), None, [UID], {}, id="json-with-byte-order-mark"),
        pytest.param(as_yaml({**pod_list(POD), "kind": "PodList"}), None, [UID], {}, id="api-server-podlist"),
        pytest.param(
            as_yaml(pod_list(POD, pod("other", node="gpu-2"))), "gpu-1", [UID], {}, id="other-nodes-pods-left-out"
        ),
        pytest.param(
            as_yaml(pod_list(POD, pod("other", node="gpu-2"))), None, [UID, "other"], {}, id="no-node-name-all-pods"
        ),
        pytest.param(
            as_yaml(pod_list(POD, {**NODE, "metadata": {**NODE["metadata"], "name": "gpu-2"}})),
            "gpu-1",
            [UID],
            {},
            id="another-nodes-labels-left-out",
        ),
        pytest.param(as_yaml(POD), "gpu-1", [UID], {}, id="a-single-pod"),
        pytest.param(as_json(NODE), "gpu-1", [], {"nvidia.com/gpu.replicas": "4"}, id="a-single-node"),
        pytest.param(b"apiVersion: v1\nitems: []\nkind: List\n", None, [], {}, id="no-pods"),
        pytest.param(b'{"items": [], "kind": "List"}', None, [], {}, id="json-no-pods"),
    ],
)
def test_pod_lists_parse(data: bytes, node_name: str | None, uids: list[str], labels: dict[str, str]) -> None:
    """kubectl's YAML and JSON, the API's PodList, one Pod or Node: the pods of this node and its labels."""
    parsed = parse_pod_list(data, node_name)
    assert sorted(parsed.pods) == sorted(uids)
    assert dict(parsed.node_labels) == labels


def test_yaml_scalars_are_typed_as_kubectl_means_them() -> None:
    """Plain true/false, null and integers are typed (the owner's `controller: true`); other scalars stay text."""
    text = f"""\
items:
- metadata:
    uid: {UID}
    ownerReferences: [{{kind: Job, name: j, controller: true}}]
    deletionTimestamp: null
  spec:
    priority: 2000
    containers: [{{name: main, resources: {{limits: {{vramguard.io/vram: 1.50, nvidia.com/gpumem: 0x10}}}}}}]
"""
    for loader in LOADERS:
        p = parse_pod_list(text.encode(), yaml_loader=loader).pods[UID]
        assert (p.owner, p.terminating, p.priority) == ("Job/j", False, 2000)
        assert dict(p.containers[0].limits) == {"vramguard.io/vram": "1.50", "nvidia.com/gpumem": "0x10"}


BOMB = b"""\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(BOMB, r"^line 1: YAML anchors and aliases are not allowed", id="billion-laughs"),
        pytest.param(b"items:\n- &p {metadata: {uid: x}}\n", r"^line 2: YAML anchors", id="anchor"),
        pytest.param(b"kind: List\nitems:\n- *p\n", r"^line 3: YAML aliases are not allowed", id="alias"),
        pytest.param(
            b"items:\n- metadata: {uid: x}\n  metadata: {uid: y}\n",
            r"^line 3: duplicate key 'metadata'",
            id="duplicate-key",
        ),
        pytest.param(
            b'{"items": [{"metadata": {"uid": "x", "uid": "y"}}]}',
            r"^line 1: duplicate key 'uid'",
            id="json-duplicate-key",
        ),
        pytest.param(
            b'{"kind": "List",\n "kind": "List"}', r"^line 2: duplicate key 'kind'", id="json-duplicate-top-level-key"
        ),
        pytest.param(
            b"items:\n- !!python/object:os.system {}\n", r"^line 2: YAML tag .* is not supported", id="yaml-tag"
        ),
        pytest.param(b"items: " + b"[" * 100 + b"]" * 100, r"^line 1: nested deeper than 64 levels", id="deep-yaml"),
        pytest.param(b'{"items": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", r"nested too deeply", id="deep-json"),
        pytest.param(b"items:\n- metadata: {uid: x\n", r"^line 3, column 1: ", id="half-written-yaml"),
        pytest.param(as_json(pod_list(POD))[:300], r"^line \d+, column \d+: Expecting", id="half-written-json"),
        pytest.param(b"a: 1\n---\nb: 2\n", r"^line 2: more than one YAML document", id="two-documents"),
        pytest.param(b"", r"^expected a List of Pods .* got nothing", id="empty"),
        pytest.param(b"- a\n- b\n", r"^expected a List of Pods .* got a list", id="not-a-mapping"),
        pytest.param(b"items: {a: 1}\n", r"^items: expected a list of Pods, got a mapping", id="items-not-a-list"),
        pytest.param(b"kind: List\nitems:", r"^items: has no value .*items: \[\]", id="cut-right-after-items"),
        pytest.param(b"items:\nkind: List\n", r"^items: has no value", id="items-without-a-value"),
        pytest.param(b'{"items": null, "kind": "List"}', r"^items: has no value", id="json-items-null"),
        pytest.param(
            b"items:\n- pod\n", r"^line 2: items\[0\]: expected a Pod or Node object, got text", id="item-not-an-object"
        ),
        pytest.param(
            as_yaml(pod_list(POD, {"metadata": {"name": "x", "namespace": "ml"}})),
            r"^line \d+: items\[1\]: pod ml/x: metadata\.uid is missing",
            id="pod-without-uid",
        ),
        pytest.param(
            b'{"items": [{"metadata": {"uid": "u"}, "spec": {"priority": 1e400}}]}',
            r"^items\[0\]: OverflowError",
            id="unexpected-error-in-an-item",
        ),
        pytest.param(b"items:\n- metadata: {uid: \xff}\n", r"invalid|utf-8|special characters", id="not-utf8"),
    ],
)
def test_bad_files_are_refused_naming_the_line(data: bytes, message: str) -> None:
    """Invalid files, anchors and aliases, duplicate keys, deep nesting: one PodSourceError naming the line."""
    for loader in LOADERS:
        with pytest.raises(PodSourceError, match=message):
            parse_pod_list(data, yaml_loader=loader)


def test_alias_bomb_is_refused_before_anything_is_expanded() -> None:
    """The 'billion laughs' (a billion strings once expanded) is refused in well under a second."""
    started = time.monotonic()
    with pytest.raises(PodSourceError, match="line 1"):
        parse_pod_list(BOMB)
    assert time.monotonic() - started < 0.1


def test_yaml_items_are_converted_one_at_a_time() -> None:
    """A YAML list's items are converted as each is read, and their nodes let go (a node costs tens of times its
    text): an item's fault is reported before a syntax error further down, and many pods parse in bounded
    memory."""
    for loader in LOADERS:
        with pytest.raises(PodSourceError, match=r"^line 2: items\[0\]: expected a Pod or Node object"):
            parse_pod_list(b"items:\n- pod\n- {unclosed\n", yaml_loader=loader)
    data = as_yaml(pod_list(*[pod(f"uid-{i}") for i in range(200)]))
    tracemalloc.start()
    try:
        assert len(parse_pod_list(data).pods) == 200
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * len(data), f"{peak} bytes to parse {len(data)}"
