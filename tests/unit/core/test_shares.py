"""DRA claims as quotas: per-GPU shares from ResourceSlices and ResourceClaims (`core/shares.py`), the `claim:` quota
source (`core/quota.py`), per-GPU judging (`core/decide.py`) and per-share driver limits (`core/limit_plan.py`).
The objects are shaped as the API server serialises resource.k8s.io/v1 (read by `kube/claim_manifest.py`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from vramguard.core.actions import Violation
from vramguard.core.decide import find_violations, quota_rows
from vramguard.core.limit_plan import wanted_limits
from vramguard.core.pod import ClaimUse, ContainerInfo, PodInfo
from vramguard.core.policy import Mode, NamespacePolicy, Policy
from vramguard.core.quantity import GiB
from vramguard.core.quota import NO_SHARE, PodQuota, QuotaBook, resolve_pod_quota
from vramguard.core.shares import (
    Claim,
    ClaimKey,
    DeviceKey,
    SliceDevice,
    claim_keys,
    pod_shares,
)
from vramguard.core.snapshot import Snapshot
from vramguard.kube.claim_manifest import claim_from_manifest, slice_devices
from vramguard_testbed.fakes import SnapshotBuilder, gpu

DRIVER = "gpu.nvidia.com"
CLASS = "gpu.nvidia.com"
SHARE_CLASS = "vram-share.example.com"
GPU_UUID = [gpu(i, 24 * GiB).uuid for i in range(4)]


def violations_under(snapshot: Snapshot, quotas: Mapping[str, PodQuota]) -> tuple[Violation, ...]:
    """The snapshot's violations under `quotas`, each row's owner found first (`decide`'s step 1)."""
    return find_violations(snapshot, quota_rows(snapshot, quotas))


def device(name: str, uuid: str | None, memory: str | None = "24Gi", qualified: bool = False) -> dict[str, Any]:
    attributes: dict[str, Any] = {"index": {"int": int(name[-1])}, "productName": {"string": "NVIDIA L4"}}
    if uuid is not None:
        attributes[f"{DRIVER}/uuid" if qualified else "uuid"] = {"string": uuid}
    d: dict[str, Any] = {"name": name, "attributes": attributes, "allowMultipleAllocations": True}
    if memory is not None:
        d["capacity"] = {"memory": {"value": memory, "requestPolicy": {"default": "1Gi"}}}
    return d


def resource_slice(*devices: dict[str, Any], pool: str = "node-a") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{pool}-{DRIVER}"},
        "spec": {"driver": DRIVER, "nodeName": "node-a", "pool": {"name": pool}, "devices": list(devices)},
    }


def result(
    request: str, device: str, memory: str | None = "10Gi", share: str | None = "5f0e2a1c-aaaa"
) -> dict[str, Any]:
    r: dict[str, Any] = {"request": request, "driver": DRIVER, "pool": "node-a", "device": device}
    if memory is not None:
        r["consumedCapacity"] = {"memory": memory}
    if share is not None:
        r["shareID"] = share
    return r


def claim_manifest(name: str, *results: dict[str, Any], allocated: bool = True, cls: str = CLASS) -> dict[str, Any]:
    requests = {r["request"].partition("/")[0] for r in results} or {"gpu"}
    obj: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": r, "exactly": {"deviceClassName": cls}} for r in sorted(requests)]}},
        "status": {},
    }
    if allocated:
        obj["status"]["allocation"] = {"devices": {"results": list(results)}}
    return obj


SLICE = slice_devices(resource_slice(*(device(f"gpu-{i}", GPU_UUID[i]) for i in range(4))))


def claim(name: str, *results: dict[str, Any], **kw: Any) -> Claim:
    return claim_from_manifest(claim_manifest(name, *results, **kw))


def trainer(*uses: tuple[str, str], claims: Mapping[str, str | None] | None = None, containers: int = 1) -> PodInfo:
    """A pod in namespace ml whose containers (main, then side) use `uses` (claim ref, request)."""
    names = ["main", "side"][:containers]
    return PodInfo(
        uid="uid-trainer",
        namespace="ml",
        name="trainer",
        containers=tuple(
            ContainerInfo(name=n, container_id=f"{i:064x}", claims=tuple(ClaimUse(r, q) for r, q in uses))
            for i, n in enumerate(names, start=1)
        ),
        claims=dict(claims if claims is not None else {"gpu": "trainer-gpu"}),
    )


# --------------------------------------------------------------------------------------------------------------
# Shares: which container holds what on which GPU


KEY: ClaimKey = ("ml", "trainer-gpu")
ONE_SHARE = {KEY: claim("trainer-gpu", result("gpu", "gpu-2"))}


def shares_of(
    pod: PodInfo, claims: Mapping[ClaimKey, Claim | None], devices: Mapping[DeviceKey, SliceDevice] = SLICE
) -> list[tuple[str, str, int, str]]:
    """(container, GPU UUID, bytes, error text) for each share."""
    return [
        (name, s.gpu_uuid, s.bytes, f"{s.error.field}: {s.error.message}" if s.error else "")
        for name, held in pod_shares(pod, claims, devices).items()
        for s in held
    ]


def row(case: str, *values: object) -> Any:
    """A row of a table whose first column names the case: the test reads it, and pytest names the row by it."""
    return pytest.param(case, *values, id=case)


@pytest.mark.parametrize(
    ("case", "pod", "claims", "expected"),
    [
        row("a 10Gi share on gpu-2", trainer(("gpu", "")), ONE_SHARE, [("main", GPU_UUID[2], 10 * GiB, "")]),
        row("two containers hold the same share", trainer(("gpu", ""), containers=2), ONE_SHARE,
            [("main", GPU_UUID[2], 10 * GiB, ""), ("side", GPU_UUID[2], 10 * GiB, "")]),
        row("a whole-device allocation is the device's memory",
            trainer(("gpu", "")), {KEY: claim("trainer-gpu", result("gpu", "gpu-1", memory=None, share=None))},
            [("main", GPU_UUID[1], 24 * GiB, "")]),
        row("only the request the container names, and its subrequests",
            trainer(("gpu", "b")),
            {KEY: claim("trainer-gpu", result("a", "gpu-0"), result("b/small", "gpu-1"), result("bb", "gpu-3"))},
            [("main", GPU_UUID[1], 10 * GiB, "")]),
        row("admin access to a device is no share of it", trainer(("gpu", "")),
            {KEY: claim("trainer-gpu", {**result("gpu", "gpu-1", memory=None, share=None), "adminAccess": True},
                        result("gpu", "gpu-2"))},
            [("main", GPU_UUID[2], 10 * GiB, "")]),
        row("not read yet: nothing", trainer(("gpu", "")), {}, []),
        row("the claim controller has not named it yet: nothing", trainer(("gpu", ""), claims={"gpu": None}),
            ONE_SHARE, []),
        row("not allocated: nothing", trainer(("gpu", "")), {KEY: claim("trainer-gpu", allocated=False)}, []),
        row("a container without claims holds nothing", trainer(), ONE_SHARE, []),
        row("the claim does not exist", trainer(("gpu", "")), {KEY: None},
            [("main", "", 0, "resourceclaims[ml/trainer-gpu]: does not exist")]),
        row("a claim the pod does not list", trainer(("other", "")), ONE_SHARE,
            [("main", "", 0, "spec.containers[main].resources.claims[other]: names no entry of spec.resourceClaims")]),
        row("a device in no slice of this node", trainer(("gpu", "")),
            {KEY: claim("trainer-gpu", result("gpu", "gpu-9"))},
            [("main", "", 0, "resourceclaims[ml/trainer-gpu].status.allocation.devices.results[0].device: "
                             "is in no ResourceSlice of this node")]),
        row("a device without a uuid attribute", trainer(("gpu", "")), ONE_SHARE,
            [("main", "", 0, "resourceclaims[ml/trainer-gpu].status.allocation.devices.results[0].device: "
                             "has no 'uuid' attribute naming its GPU")]),
        row("a consumed capacity that does not parse", trainer(("gpu", "")),
            {KEY: claim("trainer-gpu", result("gpu", "gpu-2", memory="10GB"))},
            [("main", "", 0, "resourceclaims[ml/trainer-gpu].status.allocation.devices.results[0]"
                             ".consumedCapacity[memory]: is not a valid quantity (GB is not a Kubernetes suffix; "
                             "did you mean 10G (10^9) or 10Gi (2^30)?)")]),
    ],
)  # fmt: skip
def test_pod_shares(
    case: str, pod: PodInfo, claims: Mapping[ClaimKey, Claim | None], expected: list[tuple[str, str, int, str]]
) -> None:
    """A container holds the shares allocated to the claim requests it names; a claim it cannot read is an error."""
    devices = SLICE
    if "uuid attribute" in case:
        devices = {**SLICE, (DRIVER, "node-a", "gpu-2"): SliceDevice(None, "24Gi")}
    got = shares_of(pod, claims, devices)
    if "does not parse" in case:  # the quantity parser's own wording is tested in test_quantity.py
        assert [(c, u, b, e.split(": is not")[0]) for c, u, b, e in got] == [
            (c, u, b, e.split(": is not")[0]) for c, u, b, e in expected
        ], case
        assert all("is not a valid" in e for _, _, _, e in got), got
        return
    assert got == expected, case


def test_claim_keys_are_the_named_claims_the_containers_use() -> None:
    """Claim keys are the claims a container uses that have a name; unused and unnamed claims are left out."""
    pod = trainer(("gpu", ""), claims={"gpu": "trainer-gpu", "unused": "x", "pending": None})
    assert claim_keys(pod) == [("ml", "trainer-gpu")]


# --------------------------------------------------------------------------------------------------------------
# The claim: quota source


def quota_of(pod: PodInfo, claims: Mapping[ClaimKey, Claim | None], *sources: str, **policy: Any) -> Any:
    return resolve_pod_quota(pod, Policy(quota_sources=sources, **policy), {}, pod_shares(pod, claims, SLICE))


def test_a_share_is_the_quota_on_its_gpu_and_nothing_elsewhere() -> None:
    """A share is the container's quota on its GPU, naming claim and share; on another GPU it holds no share."""
    pq = quota_of(trainer(("gpu", "")), ONE_SHARE, f"claim:{DRIVER}")
    on_gpu2 = pq.own("main", GPU_UUID[2])
    assert (on_gpu2.limit_bytes, on_gpu2.claim) == (10 * GiB, "trainer-gpu")
    assert on_gpu2.source == "claim ml/trainer-gpu (request gpu, share 5f0e2a1c)"
    assert pq.own("main", GPU_UUID[0]) is NO_SHARE and pq.containers == {} and pq.errors == ()


@pytest.mark.parametrize(
    ("source", "holds"),
    [
        pytest.param(f"claim:{DRIVER}", True, id="its-driver"),
        pytest.param(f"claim:{CLASS}", True, id="its-device-class"),
        pytest.param(f"claim:{SHARE_CLASS}", True, id="its-share-device-class"),
        pytest.param("claim:other.io", False, id="another-driver"),
    ],
)
def test_the_source_reads_the_shares_of_its_driver_or_device_class(source: str, holds: bool) -> None:
    """A `claim:` source reads the shares of its driver or device class, never another driver's."""
    claims = {KEY: claim("trainer-gpu", result("gpu", "gpu-2"), cls=SHARE_CLASS)}
    pq = quota_of(trainer(("gpu", "")), claims, source)
    assert ("main" in pq.shares) is holds


def test_two_claims_on_one_gpu_add_up_and_per_gpu_shares_stay_apart() -> None:
    """Two claims on one GPU add up into one quota; shares on different GPUs stay apart."""
    pod = trainer(("a", ""), ("b", ""), claims={"a": "ca", "b": "cb"})
    claims = {
        ("ml", "ca"): claim("ca", result("gpu", "gpu-1"), result("gpu", "gpu-2", "12Gi", "s2")),
        ("ml", "cb"): claim("cb", result("gpu", "gpu-1", "4Gi", "s3")),
    }
    pq = quota_of(pod, claims, f"claim:{DRIVER}")
    assert {uuid: q.limit_bytes for uuid, q in pq.shares["main"].items()} == {
        GPU_UUID[1]: 14 * GiB,
        GPU_UUID[2]: 12 * GiB,
    }
    assert pq.shares["main"][GPU_UUID[1]].claim == "ca+cb"


def test_an_unreadable_claim_is_reported_and_the_next_source_applies() -> None:
    """A claim that cannot be read is a QuotaError, and the next quota source applies."""
    pod = trainer(("gpu", ""))
    pod = PodInfo(
        uid=pod.uid, namespace="ml", name="trainer", claims=pod.claims,
        containers=(ContainerInfo("main", "a" * 64, {"vramguard.io/vram": "6Gi"}, pod.containers[0].claims),),
    )  # fmt: skip
    pq = quota_of(pod, {KEY: None}, f"claim:{DRIVER}", "resource:vramguard.io/vram")
    assert pq.shares == {} and pq.containers["main"].limit_bytes == 6 * GiB
    (error,) = pq.errors
    assert (error.field, error.message, error.applies) == (
        "resourceclaims[ml/trainer-gpu]",
        "does not exist",
        "limits[vramguard.io/vram] 6Gi",
    )


def test_namespace_cap_and_burst_apply_to_shares() -> None:
    """A namespace's max quota caps a share, and a burst annotation raises its hard limit."""
    claims = {KEY: claim("trainer-gpu", result("gpu", "gpu-2", "20Gi"))}
    capped = quota_of(trainer(("gpu", "")), claims, f"claim:{DRIVER}",
                      namespaces={"ml": NamespacePolicy(max_quota_bytes=16 * GiB)})  # fmt: skip
    assert capped.own("main", GPU_UUID[2]).limit_bytes == 16 * GiB
    pod = trainer(("gpu", ""))
    bursting = PodInfo(uid=pod.uid, namespace="ml", name="trainer", containers=pod.containers, claims=pod.claims,
                       annotations={"vramguard.io/vram-burst": "22Gi"})  # fmt: skip
    burst = quota_of(bursting, claims, f"claim:{DRIVER}")
    assert burst.own("main", GPU_UUID[2]).hard_for(24 * GiB) == 22 * GiB


def test_quota_book_resolves_again_only_when_the_shares_change() -> None:
    """The QuotaBook keeps a pod's quota while its shares are the same, and resolves it again when they change."""
    pod = trainer(("gpu", ""))
    book = QuotaBook(Policy(quota_sources=(f"claim:{DRIVER}",)))
    held = pod_shares(pod, ONE_SHARE, SLICE)
    first, _ = book.resolve({pod.uid: pod}, {}, {pod.uid: held})
    again, _ = book.resolve({pod.uid: pod}, {}, {pod.uid: held})
    assert again[pod.uid] is first[pod.uid]
    bigger = pod_shares(pod, {KEY: claim("trainer-gpu", result("gpu", "gpu-2", "12Gi"))}, SLICE)
    changed, _ = book.resolve({pod.uid: pod}, {}, {pod.uid: bigger})
    assert changed[pod.uid].shares["main"][GPU_UUID[2]].limit_bytes == 12 * GiB


# --------------------------------------------------------------------------------------------------------------
# Judged per GPU; limits per share


TWO_GPUS = {KEY: claim("trainer-gpu", result("gpu", "gpu-1", "12Gi", "s1"), result("gpu", "gpu-2", "10Gi", "s2"))}


@pytest.mark.parametrize(
    ("usage", "violations"),
    [
        pytest.param({1: 11, 2: 11}, [(2, 11, 10)], id="11Gi on each: over its 10Gi share on GPU 2 only"),
        pytest.param({1: 12, 2: 10}, [], id="within both shares"),
        pytest.param({1: 1, 2: 11}, [(2, 11, 10)], id="its total fits, GPU 2 does not"),
        pytest.param({1: 1, 3: 1}, [(3, 1, 0)], id="any memory on a GPU it holds no share of"),
    ],
)
def test_a_container_with_shares_on_two_gpus_is_judged_per_gpu(
    usage: dict[int, int], violations: list[tuple[int, int, int]]
) -> None:
    """A container with shares on two GPUs is judged on each GPU against its share there, not against its total."""
    pod = trainer(("gpu", ""))
    quotas = {pod.uid: quota_of(pod, TWO_GPUS, f"claim:{DRIVER}")}
    devices = [gpu(i, 24 * GiB) for i in range(4)]
    snap = SnapshotBuilder(devices)
    for index, gib in usage.items():
        snap.use(pod, "main", devices[index], gib * GiB, pid=100 + index)
    found = violations_under(snap.build(), quotas)
    assert [(v.device.index, v.used_bytes // GiB, v.limit_bytes // GiB) for v in found] == violations
    for v in found:
        if v.limit_bytes:
            assert "claim ml/trainer-gpu" in v.quota_source


def test_containers_holding_one_share_are_judged_together() -> None:
    """Containers holding one share are judged together: one violation of their summed usage against it."""
    pod = trainer(("gpu", ""), containers=2)
    quotas = {pod.uid: quota_of(pod, ONE_SHARE, f"claim:{DRIVER}")}
    devices = [gpu(i, 24 * GiB) for i in range(4)]
    snap = (
        SnapshotBuilder(devices).use(pod, "main", devices[2], 6 * GiB, 101).use(pod, "side", devices[2], 6 * GiB, 102)
    )
    (v,) = violations_under(snap.build(), quotas)
    assert (v.container, v.used_bytes, v.limit_bytes) == ("main, side", 12 * GiB, 10 * GiB)
    assert len(v.container_ids) == 2


def test_driver_limits_hold_each_share_on_its_own_gpu_only() -> None:
    """Driver limits hold each share on its own GPU only, for the container and for its pod."""
    pod = trainer(("gpu", ""))
    policy = Policy(mode=Mode.KILL, quota_sources=(f"claim:{DRIVER}",))
    quotas = {pod.uid: quota_of(pod, TWO_GPUS, f"claim:{DRIVER}")}
    devices = [gpu(i, 24 * GiB) for i in range(4)]
    found = wanted_limits({pod.uid: pod}, quotas, devices, policy)
    assert [(t.container, t.gpu_index, t.hard_bytes) for t in found] == [
        (None, 1, 12 * GiB), (None, 2, 10 * GiB), ("main", 1, 12 * GiB), ("main", 2, 10 * GiB)
    ]  # fmt: skip
