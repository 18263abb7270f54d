"""Pods from Kubernetes objects: the one translation at the edge, bounded."""

from __future__ import annotations

from typing import Any

import pytest

from vramguard.core.pod import ClaimUse
from vramguard.core.policy import NamespacePolicy, Policy
from vramguard.core.quantity import GiB
from vramguard.core.quota import resolve_pod_quota
from vramguard.kube.pod_manifest import (
    MAX_CLAIMS,
    MAX_VALUE_CHARS,
    MIRROR_ANNOTATION,
    PodSourceError,
    index_pods,
    pod_info_from_manifest,
)
from vramguard_testbed.fakes import FakeKubeletPods

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


def test_nvidias_declarations_are_kept_for_the_pods_own_containers() -> None:
    """KAI's per-container annotations are kept for the containers the pod has (another name's, or a different key,
    costs nothing); of `env[]`, only the toolkit's two variables, the first entry of each name (as the toolkit takes
    it), a `valueFrom` as None; an `envFrom` is noted, unread, on a container given NVIDIA GPUs (the toolkit's)."""
    annotations = {
        "nvidia.com/container.main.gpu-memory.request": "4Gi",
        "nvidia.com/container.main.gpu-memory.limit": "8Gi",
        "nvidia.com/container.ghost.gpu-memory.limit": "8Gi",
        "nvidia.com/container.main.gpus.devices": "GPU-0",
    }
    env = [
        {"name": "NVIDIA_GPU_MEMORY_LIMIT", "value": "4096"},
        {"name": "NVIDIA_GPU_MEMORY_LIMIT", "value": "1"},
        {"name": "NVIDIA_GPU_MEMORY_REQUEST", "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}},
        {"name": "NVIDIA_GPU_MEMORY_LIMITS", "value": "2048"},
        {"name": "PATH", "value": "/bin"},
    ]
    manifest = {
        **POD,
        "metadata": {**POD["metadata"], "annotations": annotations},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "env": env,
                    "envFrom": [{"configMapRef": {"name": "cfg"}}],
                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                },
                {"name": "side", "env": "not a list", "envFrom": [{"configMapRef": {"name": "cfg"}}]},
            ]
        },
    }
    p = pod_info_from_manifest(manifest)
    assert dict(p.annotations) == {
        "nvidia.com/container.main.gpu-memory.request": "4Gi",
        "nvidia.com/container.main.gpu-memory.limit": "8Gi",
    }
    main, side = p.containers
    assert dict(main.env) == {"NVIDIA_GPU_MEMORY_LIMIT": "4096", "NVIDIA_GPU_MEMORY_REQUEST": None} and main.env_from
    assert dict(side.env) == {} and not side.env_from


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


# A static pod's UID as the kubelet makes it (a 32-hex hash of its manifest), and two API pods' UIDs.
STATIC = "6f0c2c0b1b6e4b3f8e1d2a3b4c5d6e7f"
MIRROR = "8a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
VICTIM = "1b2c3d4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e"


def manifest(name: str, uid: str, mirror: object = None, namespace: str = "ml") -> dict[str, Any]:
    """A pod `namespace/name` of metadata.uid `uid`, with `mirror` as its mirror annotation unless None."""
    annotations = {"vramguard.io/vram-limit": "1Gi"} | ({} if mirror is None else {MIRROR_ANNOTATION: mirror})
    return {
        "metadata": {"uid": uid, "name": name, "namespace": namespace, "annotations": annotations},
        "spec": {"nodeName": "gpu-1", "containers": [{"name": "main"}]},
    }


@pytest.mark.parametrize(
    ("mirror", "uid", "mirror_uid"),
    [
        pytest.param(None, MIRROR, None, id="no-annotation-an-ordinary-pod"),
        pytest.param(STATIC, STATIC, MIRROR, id="kubelet-hash-is-the-static-pods-uid"),
        pytest.param(VICTIM, VICTIM, MIRROR, id="uuid-a-manifest-set-itself"),
        pytest.param(MIRROR, MIRROR, None, id="own-uid-is-no-claim"),
        pytest.param(STATIC.upper(), MIRROR, None, id="upper-case-names-no-cgroup-ignored"),
        pytest.param(STATIC + "0", MIRROR, None, id="33-hex-too-long-ignored"),
        pytest.param(STATIC[:31], MIRROR, None, id="31-hex-too-short-ignored"),
        pytest.param(VICTIM.replace("-", "_"), MIRROR, None, id="systemd-underscores-ignored"),
        pytest.param(STATIC + "\n", MIRROR, None, id="trailing-newline-ignored"),
        pytest.param("../" + STATIC, MIRROR, None, id="path-characters-ignored"),
        pytest.param(STATIC * 100_000, MIRROR, None, id="huge-value-ignored"),
        pytest.param(0x6F0C, MIRROR, None, id="number-ignored"),
        pytest.param([STATIC], MIRROR, None, id="list-ignored"),
        pytest.param("", MIRROR, None, id="empty-ignored"),
    ],
)
def test_a_mirror_pod_becomes_its_static_pod(mirror: object, uid: str, mirror_uid: str | None) -> None:
    """A mirror pod's annotation names the UID the kubelet runs its static pod under: that is the PodInfo's `uid`
    (its cgroup's), and the mirror pod's own UID is kept for Events and evictions. A value that is no pod cgroup's
    UID form (32 lower-case hex digits, or a dashed UUID) names nothing the agent could find: it is ignored."""
    info = pod_info_from_manifest(manifest("etcd-gpu-1", MIRROR, mirror))
    assert (info.uid, info.mirror_uid, info.static) == (uid, mirror_uid, mirror_uid is not None)
    assert info.object_uid == MIRROR
    assert info.annotations == {"vramguard.io/vram-limit": "1Gi"}  # the annotation itself is not kept


FORGED = "2c3d4e5f-6a7b-4c8d-9e0f-1a2b3c4d5e6f"
GONE = "3d4e5f6a-7b8c-4d9e-8f0a-1b2c3d4e5f6a"
OTHER_STATIC = "f" * 32
# What this node's kubelet runs (its pod logs directory): the static pods, under their namespaces and names.
KUBELET = FakeKubeletPods({STATIC: ("ml", "job-gpu-1"), OTHER_STATIC: ("ml", "other"), VICTIM: ("ml", "victim")})
GENUINE = manifest("job-gpu-1", MIRROR, STATIC)


@pytest.mark.parametrize(
    ("pods", "served", "refused"),
    [
        pytest.param([GENUINE], {STATIC: "ml/job-gpu-1"}, {}, id="the-mirror-the-kubelet-backs-is-believed"),
        pytest.param(
            [GENUINE, manifest("forger", FORGED, STATIC, "tenant")],
            {STATIC: "ml/job-gpu-1"}, {FORGED: "kubelet runs that UID as ml/job-gpu-1"},
            id="a-forged-claim-voids-no-genuine-one",
        ),
        pytest.param(
            [manifest("forger", FORGED, STATIC, "tenant")],
            {}, {FORGED: "kubelet runs that UID as ml/job-gpu-1"},
            id="a-forged-claim-while-the-mirror-is-gone-lends-nothing",
        ),
        pytest.param(
            [manifest("job-gpu-1", FORGED, STATIC, "tenant")],
            {}, {FORGED: "kubelet runs that UID as ml/job-gpu-1"},
            id="the-static-pods-name-in-another-namespace-is-no-mirror",
        ),
        pytest.param(
            [manifest("victim", VICTIM), manifest("forger", FORGED, VICTIM, "tenant")],
            {VICTIM: "ml/victim"}, {FORGED: "the API server gave that UID to pod ml/victim"},
            id="a-claim-on-a-live-api-pods-uid-is-refused",
        ),
        pytest.param(
            [manifest("forger", FORGED, VICTIM, "tenant"), manifest("victim", VICTIM)],
            {VICTIM: "ml/victim"}, {FORGED: "the API server gave that UID to pod ml/victim"},
            id="a-claim-on-a-live-api-pods-uid-is-refused-whatever-the-order",
        ),
        pytest.param(
            [manifest("trainer", FORGED, GONE)],
            {}, {FORGED: "the API server gave that UID to a pod of this node"},
            id="a-claim-on-a-gone-api-pods-uid-shields-nothing",
        ),
        pytest.param(
            [manifest("job-gpu-2", MIRROR, "e" * 32)],
            {}, {MIRROR: "this node's kubelet runs no pod of that UID"},
            id="a-claim-the-kubelet-does-not-back-waits",
        ),
        pytest.param(
            [GENUINE] + [
                manifest(f"forged-{i}", f"{i:08x}-0000-4000-8000-000000000000", STATIC, "tenant") for i in range(7)
            ],
            {STATIC: "ml/job-gpu-1"},
            {f"{i:08x}-0000-4000-8000-000000000000": "runs that UID as ml/job-gpu-1" for i in range(7)},
            id="many-forged-claims-each-refused",
        ),
        pytest.param(
            [GENUINE, manifest("other", VICTIM, OTHER_STATIC)],
            {STATIC: "ml/job-gpu-1", OTHER_STATIC: "ml/other"}, {}, id="claims-on-different-uids-both-believed",
        ),
    ],
)  # fmt: skip
def test_which_mirror_claims_are_believed(
    pods: list[dict[str, Any]], served: dict[str, str], refused: dict[str, str]
) -> None:
    """A mirror annotation is tenant input: whoever may create a pod bound to the node may write one naming any UID.
    A claim is believed only where the node's kubelet runs that UID as the claimant's namespace and name; a claim
    on a UID the API server gave a pod (live, or gone: `api_uids`) is refused; a refused claim changes nothing.
    Each refusal, keyed by the claimant's own UID, says why."""
    index = index_pods((pod_info_from_manifest(p) for p in pods), kubelet=KUBELET, api_uids={GONE})
    assert {uid: p.key for uid, p in index.pods.items() if not p.mirrorless} == served
    assert set(index.refused) == set(refused)
    for uid, words in refused.items():
        assert words in index.refused[uid]


def test_a_static_pod_without_a_believed_mirror_is_governed_under_the_kubelets_namespace_and_name() -> None:
    """A static pod the kubelet runs under its hash, whose mirror is missing or forged, is served as the kubelet
    names it, mirrorless (its containers unknown), so its namespace's default and cap apply; a pod of a
    UUID the watch has not delivered is not served so (its own quota is not known), nor is one with a mirror."""
    forged = manifest("forger", FORGED, STATIC, "tenant")
    index = index_pods([pod_info_from_manifest(forged)], kubelet=KUBELET)
    served = {uid: (p.key, p.mirrorless, p.static, [c.name for c in p.containers]) for uid, p in index.pods.items()}
    assert served == {
        STATIC: ("ml/job-gpu-1", True, True, []),
        OTHER_STATIC: ("ml/other", True, True, []),
    }
    with_mirror = index_pods([pod_info_from_manifest(GENUINE)], kubelet=KUBELET).pods[STATIC]
    assert (with_mirror.mirrorless, with_mirror.mirror_uid) == (False, MIRROR)


def test_without_the_kubelets_word_no_claim_is_believed() -> None:
    """An agent that cannot read what the kubelet runs believes no mirror claim: a static pod is then governed as
    one without a mirror, never by a tenant's pod."""
    index = index_pods([pod_info_from_manifest(GENUINE)])
    assert index.pods == {} and "runs no pod of that UID" in index.refused[MIRROR]
