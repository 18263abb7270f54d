"""ResourceSlices and ResourceClaims as the API server serialises them (resource.k8s.io/v1), read into the core's
`SliceDevice` and `Claim`: bounded, junk skipped."""

from __future__ import annotations

from typing import Any

import pytest

from unit.core.test_shares import CLASS, DRIVER, SHARE_CLASS, claim_manifest, device, resource_slice, result
from vramguard.core.shares import SliceDevice
from vramguard.kube.claim_manifest import claim_from_manifest, slice_devices


@pytest.mark.parametrize(
    ("dev", "expected"),
    [
        (device("gpu-0", "GPU-a"), SliceDevice("GPU-a", "24Gi")),
        (device("gpu-0", "GPU-a", qualified=True), SliceDevice("GPU-a", "24Gi")),
        (device("gpu-0", None), SliceDevice(None, "24Gi")),
        (device("gpu-0", "GPU-a", memory=None), SliceDevice("GPU-a", None)),
        ({"name": "gpu-0", "attributes": {"uuid": {"int": 7}}}, SliceDevice(None, None)),  # not a string
        ({"name": "gpu-0", "attributes": "junk", "capacity": ["junk"]}, SliceDevice(None, None)),
    ],
    ids=["unqualified", "qualified", "no-uuid", "no-memory", "uuid-not-a-string", "junk"],
)
def test_slice_devices(dev: dict[str, Any], expected: SliceDevice) -> None:
    """A slice device's UUID, qualified or not, and its memory are read where present; anything else reads as None."""
    assert slice_devices(resource_slice(dev)) == {(DRIVER, "node-a", "gpu-0"): expected}


def test_slice_devices_are_bounded_and_junk_is_skipped() -> None:
    """At most 128 entries of one slice are read, junk skipped, and a slice with a junk spec holds no devices."""
    many = resource_slice(*(device(f"gpu-{i % 10}{i}", f"GPU-{i}") for i in range(500)))
    many["spec"]["devices"].insert(0, "not a device")
    assert len(slice_devices(many)) == 127  # 128 entries read, one of them junk
    assert slice_devices({"spec": "junk"}) == {}


def test_claim_from_manifest_reads_results_and_device_classes() -> None:
    """A claim reads its allocation, each request's device class (firstAvailable too) and at most 32 results."""
    obj = claim_manifest("c", result("gpu", "gpu-1"), result("big/large", "gpu-2", None, None))
    obj["spec"]["devices"]["requests"] = [
        {"name": "gpu", "exactly": {"deviceClassName": SHARE_CLASS}},
        {"name": "big", "firstAvailable": [{"name": "large", "deviceClassName": CLASS}]},
    ]
    c = claim_from_manifest(obj)
    assert (c.namespace, c.name, c.uid, c.allocated) == ("ml", "c", "uid-c", True)
    assert [(r.request, r.device_key, r.consumed_memory, r.share_id) for r in c.results] == [
        ("gpu", (DRIVER, "node-a", "gpu-1"), "10Gi", "5f0e2a1c-aaaa"),
        ("big/large", (DRIVER, "node-a", "gpu-2"), None, None),
    ]
    assert dict(c.classes) == {"gpu": SHARE_CLASS, "big/large": CLASS}
    assert not claim_from_manifest(claim_manifest("c", allocated=False)).allocated
    flood = claim_manifest("c", *(result("gpu", "gpu-1") for _ in range(100)))
    assert len(claim_from_manifest(flood).results) == 32
