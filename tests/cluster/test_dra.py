"""Per-GPU memory shares from DRA, both halves, on the real kube-scheduler and claim controller (Kubernetes
1.36+, where DRA's consumable capacity is on by default).

The scheduler's half: a ResourceSlice shaped like NVIDIA's consumable shares (four 24Gi GPUs,
`allowMultipleAllocations`, a `memory` capacity with a `requestPolicy`, each GPU's `uuid` attribute), and pods
whose ResourceClaimTemplates ask 10Gi each. The scheduler puts two on each GPU and records the share in each
claim (`consumedCapacity`, `shareID`); a ninth pod, whose 10Gi fits the node's 16Gi left in all but no single
GPU's 4Gi, stays Pending with the scheduler's reason.

vramguard's half: the agent, with `claim:gpu.nvidia.com` as its quota source and the manifest's RBAC, reads the
shares the scheduler allocated and holds each container to its share on that GPU, on real processes in real
cgroups over the test NVML (an R615 driver, so each share is also the driver's limit on that GPU only). And what
the claim source costs the API server, counted by the API server itself for 200 pods.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, utils

from cgroup_fixtures import need_cgroups
from vramguard.core.quantity import GiB
from vramguard.kube.claims import KubeClaimSource
from vramguard.kube.pods import KubePodSource
from vramguard_testbed.fakenvml import driver_limits
from vramguard_testbed.waiting import wait_until

from .controlplane import NEWEST, ControlPlane, binaries_dir
from .kube_fixtures import KubeNode, deploy_manifest, metric
from .node import raw

DRIVER = "gpu.nvidia.com"
NODE = "dra-gpu-node"
GPUS = 4
CLASS = "gpu.vramguard.test"


@pytest.fixture(scope="module")
def dra_plane(kubernetes_version: str) -> Iterator[ControlPlane]:
    if kubernetes_version != NEWEST:
        pytest.skip(f"consumable DRA capacity is on by default from Kubernetes 1.36; this is {kubernetes_version}")
    plane = ControlPlane(binaries_dir(NEWEST)).start()
    try:
        plane.start_scheduler()
        plane.start_controller_manager(controllers="resourceclaim-controller")
        with plane.api_client() as api:
            deploy_manifest(api)  # the agent's namespace, ServiceAccount, RBAC and admission policy
            create(api, {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": CLASS},
                "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
            })  # fmt: skip
        yield plane
    finally:
        plane.stop()


def create(api: client.ApiClient, doc: dict[str, Any], namespace: str | None = None) -> None:
    """Create an object from its manifest (any kind the client knows, resource.k8s.io/v1 included)."""
    utils.create_from_dict(api, doc, namespace=namespace)  # type: ignore[no-untyped-call]  # untyped in the client


def gpu_uuid(index: int) -> str:
    """The UUID the test NVML gives GPU `index`: the slice publishes the same, as NVIDIA's driver publishes NVML's."""
    return f"GPU-{index:08x}-0000-0000-0000-000000000000"


def gpu_slice(node: str) -> dict[str, Any]:
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "uuid": {"string": gpu_uuid(i)},
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
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def share_template(name: str, memory: str) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": CLASS, "capacity": {"requests": {"memory": memory}}}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def share_pod(name: str, node: str = NODE, *templates: str) -> dict[str, Any]:
    """A pod pinned to `node` whose one container uses a claim from each template (default: share-10gi)."""
    templates = templates or ("share-10gi",)
    claims = [{"name": f"gpu{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": claims,
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"claims": [{"name": c["name"]} for c in claims]}}
            ],
        },
    }


def allocated_claims(api: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = raw(api, client.ResourceV1Api(api).list_namespaced_resource_claim(namespace))["items"]
    return [c for c in items if c.get("status", {}).get("allocation")]


def test_the_scheduler_places_memory_shares_per_gpu(dra_plane: ControlPlane) -> None:
    dra_plane.add_node(NODE, labels={"kubernetes.io/hostname": NODE})
    with dra_plane.api_client() as api:
        core = client.CoreV1Api(api)
        create(api, gpu_slice(NODE))
        ns = "dra"
        create(api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        create(api, share_template("share-10gi", "10Gi"), ns)
        for i in range(2 * GPUS):
            create(api, share_pod(f"share-{i}"), ns)

        wait_until(lambda: len(allocated_claims(api, ns)) == 2 * GPUS, 60, "every claim allocated")
        results = [r for c in allocated_claims(api, ns) for r in c["status"]["allocation"]["devices"]["results"]]
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

        wait_until(lambda: unschedulable() is not None, 60, "the pod reported unschedulable")
        condition = unschedulable()
        assert condition is not None and condition["reason"] == "Unschedulable"
        print(f"\nPending: {condition['message']}")
        assert "cannot allocate all claims" in condition["message"], condition["message"]


def test_the_agent_enforces_each_share_on_its_gpu(dra_plane: ControlPlane, tmp_path: Path) -> None:
    """The scheduler allocates a 10Gi share (small), a 12Gi one (large) and two 20Gi ones on two GPUs for one
    container (wide); the agent holds each to its share on that GPU. 11Gi is over small's share and within
    large's; wide's 19Gi + 21Gi fit its 40Gi in all, but not its 20Gi on the second GPU: wide is killed for that
    GPU alone."""
    need_cgroups(2)
    with dra_plane.api_client() as api:
        node = KubeNode(dra_plane, api, tmp_path, gpus=GPUS, driver_limits=True)
        try:
            enforce_shares(api, node, tmp_path)
        finally:
            node.close()


def enforce_shares(api: client.ApiClient, node: KubeNode, tmp_path: Path) -> None:
    create(api, gpu_slice(node.name))
    ns = "dra-agent"
    create(api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    for gi in (10, 12, 20):
        create(api, share_template(f"share-{gi}gi", f"{gi}Gi"), ns)
    create(api, share_pod("small", node.name, "share-10gi"), ns)
    create(api, share_pod("large", node.name, "share-12gi"), ns)
    create(api, share_pod("wide", node.name, "share-20gi", "share-20gi"), ns)
    wait_until(lambda: len(allocated_claims(api, ns)) == 4, 60, "every claim allocated")
    core = client.CoreV1Api(api)
    wait_until(
        lambda: all(
            raw(api, core.read_namespaced_pod(p, ns))["spec"].get("nodeName") for p in ("small", "large", "wide")
        ),
        30,
        "bound",
    )

    def gpus_of(pod: str) -> list[int]:
        """The GPUs the scheduler gave the pod's claims, in the pod's claim order."""
        named = {s["name"]: s["resourceClaimName"] for s in raw(api, core.read_namespaced_pod(pod, ns))["status"]
                 ["resourceClaimStatuses"]}  # fmt: skip
        claims = {c["metadata"]["name"]: c for c in allocated_claims(api, ns)}
        return [
            int(r["device"].removeprefix("gpu-"))
            for ref in sorted(named)
            for r in claims[named[ref]]["status"]["allocation"]["devices"]["results"]
        ]

    (small_gpu,), (large_gpu,), wide_gpus = gpus_of("small"), gpus_of("large"), gpus_of("wide")
    assert len(set(wide_gpus)) == 2, "two 20Gi shares cannot share a 24Gi GPU"
    (_, small), (_, large), (_, wide) = (node.adopt(p, ns) for p in ("small", "large", "wide"))
    over = node.sim.spawn(small, "main", 11 * GiB, gpu=small_gpu)
    within = node.sim.spawn(large, "main", 11 * GiB, gpu=large_gpu)
    wide_ok = node.sim.spawn(wide, "main", 19 * GiB, gpu=wide_gpus[0])
    wide_over = node.sim.spawn(wide, "main", 21 * GiB, gpu=wide_gpus[1])
    allocator = node.sim.spawn_allocator(large, "main")

    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"mode": "kill", "quota_sources": [f"claim:{DRIVER}"], "cooldown": "1s"}))
    log = tmp_path / "agent.log"
    with log.open("w") as out:
        node.sim.start_agent("--policy", str(policy), "--poll-interval", "0.25", stdout=out, stderr=subprocess.STDOUT)
        node.sim.wait_ready()
        try:
            wait_until(lambda: not over.alive() and not wide_over.alive(), 20, "the over-share processes killed")
        except AssertionError as e:
            raise AssertionError(log.read_text()[-3000:]) from e
        # The driver holds each share on its own GPU only (R615): large's 12Gi on its GPU, nowhere else.
        large_dir = large.containers["main"].dirs[0]

        def large_limits() -> list[tuple[int, int]]:
            return [(d.gpu, d.hard_bytes) for d in driver_limits(node.sim.state_path) if d.cgroup == large_dir]

        wait_until(lambda: large_limits() == [(large_gpu, 12 * GiB)], 10, "large's share as its driver limit")
        assert allocator.allocate(large_gpu, 0), "a process of large on its GPU"
        assert not allocator.allocate(large_gpu, 2 * GiB), "11Gi + 2Gi is over large's 12Gi share on that GPU"
        scans = metric(node, "vramguard_scan_duration_seconds_count") or 0
        wait_until(lambda: (metric(node, "vramguard_scan_duration_seconds_count") or 0) >= scans + 3, 10, "3 scans")
        assert within.alive(), "large's 11Gi is within its 12Gi share"
        # Judged per GPU, acted on per container: a kill takes all of the container's GPU processes (kill.py).
        assert not wide_ok.alive()

    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    kills = [x for x in lines if x.get("event") == "action" and x.get("action") == "kill"]
    print("\nper-GPU enforcement:\n" + "\n".join(f"  {x['message']}" for x in kills))
    assert {(x["pod"], x["gpu"]) for x in kills} == {(f"{ns}/small", str(small_gpu)), (f"{ns}/wide", str(wide_gpus[1]))}
    small_kill = next(x for x in kills if x["pod"] == f"{ns}/small")
    assert (
        "uses 11.0GiB" in small_kill["message"]
        and "quota 10.0GiB (claim dra-agent/small-gpu0-" in small_kill["message"]
    )
    wide_kill = next(x for x in kills if x["pod"] == f"{ns}/wide")
    assert "quota 20.0GiB (claim dra-agent/wide-gpu1-" in wide_kill["message"], wide_kill["message"]

    events = [e for e in core.list_namespaced_event(ns).items if e.reason == "VRAMKilled"]
    assert sorted(str(e.involved_object.name) for e in events) == ["small", "wide"]
    assert all(gpu_uuid(small_gpu) in (e.message or "") for e in events if e.involved_object.name == "small")
    assert metric(node, "vramguard_claim_share_bytes", pod="large", gpu=str(large_gpu)) == 12 * GiB


def test_what_the_claim_source_costs_the_api_server(dra_plane: ControlPlane) -> None:
    """200 pods with a claim each on one node: the claim source reads each claim once by name, lists the node's
    slices once and opens one watch of them; then nothing while nothing changes, however often the agent reads
    its shares; a pod's change costs nothing (its claim is allocated); a new pod costs one GET. Counted by the API
    server itself (apiserver_request_total, and apiserver_longrunning_requests for open watches)."""
    node, ns, pods = "count-node", "dra-count", 200
    dra_plane.add_node(node, labels={"kubernetes.io/hostname": node})
    with dra_plane.api_client() as api:
        create(api, gpu_slice(node))
        create(api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for i in range(pods):
            make_claimed_pod(api, ns, node, i)

        def counts() -> tuple[int, int, int]:
            return (
                dra_plane.request_count("resourceclaims", "GET", "resource.k8s.io"),
                dra_plane.request_count("resourceslices", "LIST", "resource.k8s.io"),
                dra_plane.request_count(
                    "resourceslices", "WATCH", "resource.k8s.io", metric="apiserver_longrunning_requests"
                ),
            )

        before = counts()
        pod_source = KubePodSource(api, node)
        source = KubeClaimSource(api, node, pod_source)
        pod_source.start()
        source.start()
        try:
            assert pod_source.wait_synced(30) and source.wait_synced(60)
            wait_until(lambda: len(source.shares()) == pods, 30, "every pod's share published")
            assert {s.bytes for held in source.shares().values() for s in held["main"]} == {6 * GiB}
            synced = counts()
            assert (synced[0] - before[0], synced[1] - before[1], synced[2] - before[2]) == (pods, 1, 1)
            assert source.claim_gets == pods

            shares = source.shares()
            for _ in range(10_000):  # the agent's scans: memory only
                assert source.shares() is shares
            cycles = source.cycles
            wait_until(lambda: source.cycles >= cycles + 6, 30, "six cycles of the claim reader (counted: no request)")
            # The pod's container starts: a new PodInfo (its container ID), and its claim is allocated already.
            running = {"name": "main", "containerID": "containerd://" + "ab" * 32, "image": "busybox",
                       "imageID": "", "ready": True, "restartCount": 0, "state": {"running": {}}}  # fmt: skip
            before_change = pod_source.pods()
            client.CoreV1Api(api).patch_namespaced_pod_status(
                "p-0", ns, {"status": {"phase": "Running", "containerStatuses": [running]}},
                _content_type="application/merge-patch+json",
            )  # fmt: skip
            wait_until(lambda: pod_source.pods() is not before_change, 10, "the changed pod seen")
            make_claimed_pod(api, ns, node, pods)
            wait_until(lambda: len(source.shares()) == pods + 1, 30, "the new pod's share published")
            cycles = source.cycles  # a GET too many (the changed pod's claim read again) would be made in these:
            wait_until(lambda: source.cycles >= cycles + 4, 30, "four more cycles of the claim reader")
            after = counts()
            print(f"\nAPI requests for {pods} pods with claims: {synced[0] - before[0]} claim GETs, "
                  f"{synced[1] - before[1]} slice LIST, {synced[2] - before[2]} slice WATCH; then "
                  f"{after[0] - synced[0]} GET for one new pod and none for a changed one")  # fmt: skip
            assert after[0] - synced[0] == 1 and after[1:] == synced[1:]

            # A frozen API server: the shares stay as read (the scan never waits), and the source stops at once.
            with dra_plane.frozen_apiserver():
                held = source.shares()
                cycles = source.cycles  # the reflectors' reads block on the server meanwhile
                wait_until(lambda: source.cycles >= cycles + 4, 30, "four cycles of the claim reader, server frozen")
                assert source.shares() is held
                started = time.monotonic()
                deadline = source.clock.now() + 1.0
                source.stop(deadline)
                pod_source.stop(deadline)
                assert time.monotonic() - started < 1.5
        finally:
            source.stop(source.clock.now() + 1.0)
            pod_source.stop(pod_source.clock.now() + 1.0)


def make_claimed_pod(api: client.ApiClient, ns: str, node: str, i: int, *, allocate_it: bool = True) -> None:
    """Pod p-<i> bound to `node`, using claim c-<i>; the claim allocated as the scheduler would (a 6Gi share of
    one GPU, reserved for the pod), unless not `allocate_it`."""
    name = f"p-{i}"
    create(api, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": f"c-{i}"}],
            "containers": [{"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }, ns)  # fmt: skip
    request = {"name": "gpu", "exactly": {"deviceClassName": CLASS, "capacity": {"requests": {"memory": "6Gi"}}}}
    create(api, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": f"c-{i}"},
        "spec": {"devices": {"requests": [request]}},
    }, ns)  # fmt: skip
    if allocate_it:
        allocate(api, ns, node, i)


def allocate(api: client.ApiClient, ns: str, node: str, i: int) -> None:
    """Write claim c-<i>'s allocation as the scheduler would: a 6Gi share of GPU i % 4, reserved for pod p-<i>."""
    uid = raw(api, client.CoreV1Api(api).read_namespaced_pod(f"p-{i}", ns))["metadata"]["uid"]
    result = {
        "request": "gpu", "driver": DRIVER, "pool": node, "device": f"gpu-{i % GPUS}",
        "consumedCapacity": {"memory": "6Gi"}, "shareID": f"00000000-0000-0000-0000-{i:012d}",
    }  # fmt: skip
    status = {
        "allocation": {"devices": {"results": [result]}},
        "reservedFor": [{"resource": "pods", "name": f"p-{i}", "uid": uid}],
    }
    client.ResourceV1Api(api).patch_namespaced_resource_claim_status(
        f"c-{i}", ns, {"status": status}, _content_type="application/merge-patch+json"
    )


def test_a_claim_allocated_after_its_pod_appeared_is_read_again(dra_plane: ControlPlane) -> None:
    """A pod names a claim that is not allocated yet (or does not exist yet): the source reads it again
    `retry_s` later, and the share appears once the claim is allocated; a claim that never appears is reported
    as missing (VRAMQuotaInvalid through the quota walk), not taken for a share."""
    node, ns = "late-node", "dra-late"
    dra_plane.add_node(node, labels={"kubernetes.io/hostname": node})
    with dra_plane.api_client() as api:
        create(api, gpu_slice(node))
        create(api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        make_claimed_pod(api, ns, node, 0, allocate_it=False)
        create(api, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "orphan"},
            "spec": {
                "nodeName": node,
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "never-made"}],
                "containers": [{"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
            },
        }, ns)  # fmt: skip
        pod_source = KubePodSource(api, node)
        source = KubeClaimSource(api, node, pod_source, retry_s=1.0)
        pod_source.start()
        source.start()
        try:
            assert pod_source.wait_synced(30) and source.wait_synced(30)
            orphan = next(uid for uid, p in pod_source.pods().items() if p.name == "orphan")
            late = next(uid for uid, p in pod_source.pods().items() if p.name == "p-0")
            wait_until(lambda: orphan in source.shares(), 10, "the missing claim reported")
            (missing,) = source.shares()[orphan]["main"]
            assert missing.error is not None and missing.error.message == "does not exist"
            assert late not in source.shares(), "an unallocated claim is no share yet"
            allocate(api, ns, node, 0)
            wait_until(lambda: late in source.shares(), 10, "the share once allocated")
            (share,) = source.shares()[late]["main"]
            assert (share.gpu_uuid, share.bytes, share.error) == (gpu_uuid(0), 6 * GiB, None)
        finally:
            source.stop(source.clock.now() + 1.0)
            pod_source.stop(pod_source.clock.now() + 1.0)
