"""The Kubernetes adapters' own logic, without a server: watch events, the Event bound, advertisable memory.

Everything that talks to the API server is tested against a real one in tests/integration/.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from vramguard.kube import KubeCapacityPublisher, KubePodSource, TokenBucket, _events, _Gone, advertisable_bytes
from vramguard.model import GiB, GpuDevice, GpuSample

POD = {
    "metadata": {"uid": "u1", "name": "p", "namespace": "ns", "resourceVersion": "10"},
    "spec": {"containers": [{"name": "main"}]},
}


def source() -> KubePodSource:
    return KubePodSource(client.ApiClient(), "node-1")


@pytest.mark.parametrize(
    ("events", "pods", "resource_version"),
    [
        pytest.param([("ADDED", POD)], {"u1"}, "10", id="added-pod-is-cached"),
        pytest.param([("ADDED", POD), ("DELETED", POD)], set(), "10", id="deleted-pod-is-forgotten"),
        pytest.param(
            [("BOOKMARK", {"metadata": {"resourceVersion": "42"}})], set(), "42", id="bookmark-advances-the-version"
        ),
        pytest.param(
            [("ADDED", {"metadata": {"name": "no-uid", "resourceVersion": "11"}})], set(), "11", id="bad-pod-skipped"
        ),
    ],
)
def test_watch_events_update_the_cache(
    events: list[tuple[str, dict[str, Any]]], pods: set[str], resource_version: str
) -> None:
    """ADDED/MODIFIED/DELETED change the cache, BOOKMARK only the resourceVersion; bad objects are skipped."""
    s = source()
    rv = "1"
    for kind, obj in events:
        rv = s._apply({"type": kind, "object": obj}, rv)
    assert set(s.pods()) == pods
    assert rv == resource_version


def test_watch_410_means_relist() -> None:
    """An ERROR event with code 410 (resourceVersion too old) asks for a relist; other errors are errors."""
    with pytest.raises(_Gone):
        source()._apply({"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}, "1")
    with pytest.raises(RuntimeError, match="500"):
        source()._apply({"type": "ERROR", "object": {"code": 500, "message": "boom"}}, "1")


def test_unchanged_pod_keeps_its_object() -> None:
    """A MODIFIED event that changes nothing the agent reads keeps the cached object (quotas stay resolved)."""
    s = source()
    s._apply({"type": "ADDED", "object": POD}, "1")
    first = s.pods()["u1"]
    s._apply({"type": "MODIFIED", "object": {**POD, "status": {"phase": "Running"}}}, "1")
    assert s.pods()["u1"] is first


class ChunkedResponse:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def stream(self, amt: int, decode_content: bool) -> list[bytes]:
        return self.chunks


def test_events_split_across_chunks() -> None:
    """Watch lines cut anywhere by the transport are reassembled into whole events."""
    body = b'{"type": "ADDED", "object": {}}\n{"type": "BOOKMARK", "object": {}}\n'
    chunks = [body[:7], body[7:40], body[40:]]
    assert [e["type"] for e in _events(ChunkedResponse(chunks))] == ["ADDED", "BOOKMARK"]


def test_token_bucket_bounds_bursts_and_rate() -> None:
    """`burst` at once, then `per_minute` spread over the minute."""
    t = [0.0]
    bucket = TokenBucket(burst=3, per_minute=6, now=lambda: t[0])
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    t[0] = 9.9
    assert not bucket.take()
    t[0] = 10.0
    assert bucket.take()
    t[0] = 1000.0
    assert sum(bucket.take() for _ in range(10)) == 3, "refills cap at the burst"


def _device(uuid: str, total_gib: int, parent: str | None = None, healthy: bool = True) -> GpuDevice:
    total = total_gib * GiB
    return GpuDevice(
        index=0, uuid=uuid, name="g", total_bytes=total, used_bytes=0, free_bytes=total,
        mig_index=0 if parent else None, parent_uuid=parent, healthy=healthy,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("devices", "reserve", "expected_gib"),
    [
        pytest.param([_device("GPU-a", 80), _device("GPU-b", 80)], 0, 160, id="whole-gpus-add-up"),
        pytest.param(
            [_device("GPU-a", 80), _device("MIG-1", 40, "GPU-a"), _device("MIG-2", 20, "GPU-a")],
            0,
            60,
            id="mig-instances-count-not-their-parent",
        ),
        pytest.param([_device("GPU-a", 80), _device("GPU-b", 80, healthy=False)], 0, 80, id="unhealthy-gpu-left-out"),
        pytest.param([_device("GPU-a", 24)], 4 * GiB, 20, id="reserve-is-kept-back"),
        pytest.param([_device("GPU-a", 2)], 4 * GiB, 0, id="never-below-zero"),
    ],
)
def test_advertisable_bytes(devices: list[GpuDevice], reserve: int, expected_gib: int) -> None:
    """Schedulable GPU memory: whole GPUs or MIG instances that answer NVML, minus the reserve."""
    assert advertisable_bytes(GpuSample(tuple(devices), ()), reserve) == expected_gib * GiB


class RefusingCore:
    """Stands in for CoreV1Api's one call the publisher makes, answering like an admission policy that denies."""

    def __init__(self) -> None:
        self.calls = 0

    def patch_node_status(self, name: str, body: object, _content_type: str) -> None:
        self.calls += 1
        raise client.ApiException(status=403, reason="Forbidden")


def test_capacity_publisher_backs_off_after_a_refusal() -> None:
    """A denied PATCH is not raised; it is retried after 10 s, then 20 s, ... — not once per scan."""
    t = [0.0]
    publisher = KubeCapacityPublisher(client.ApiClient(), "node-1", now=lambda: t[0])
    core = RefusingCore()
    publisher.core = core  # type: ignore[assignment]
    sample = GpuSample((_device("GPU-a", 24),), ())
    attempts = []
    for second in range(0, 40):
        t[0] = float(second)
        publisher.publish(sample)
        attempts.append(core.calls)
    assert core.calls == 3  # at 0 s, 10 s and 30 s
    assert attempts[9] == 1 and attempts[10] == 2 and attempts[29] == 2 and attempts[30] == 3
