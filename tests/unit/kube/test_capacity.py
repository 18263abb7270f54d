"""The capacity publisher: what memory it advertises, and its back-off after a refusal."""

from __future__ import annotations

import pytest
from kubernetes import client
from structlog.testing import capture_logs

from vramguard.base.backoff import Backoff
from vramguard.base.worker import Inline
from vramguard.core.quantity import GiB
from vramguard.core.sample import GpuDevice, GpuSample
from vramguard.kube.capacity import KubeCapacityPublisher, advertisable_bytes
from vramguard_testbed.fakes import FakeClock


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

    def patch_node_status(self, name: str, body: object, _content_type: str, _request_timeout: object) -> None:
        self.calls += 1
        raise client.ApiException(status=403, reason="Forbidden")


def test_capacity_publisher_backs_off_after_a_refusal() -> None:
    """A denied PATCH is not raised; it is retried after 10 s, then 20 s, ... — not once per scan."""
    clock = FakeClock(0.0)
    publisher = KubeCapacityPublisher(
        client.ApiClient(), "node-1", clock=clock, runner=Inline(), backoff=Backoff(10.0, 600.0, jitter=0.0)
    )
    core = RefusingCore()
    publisher.core = core  # type: ignore[assignment]
    sample = GpuSample((_device("GPU-a", 24),), ())
    publisher.start()
    attempts = []
    with capture_logs() as logs:
        for _ in range(0, 40):
            publisher.publish(sample)
            attempts.append(core.calls)
            clock.step(1.0)
    publisher.stop(clock.now())
    assert core.calls == 3  # at 0 s, 10 s and 30 s
    assert attempts[9] == 1 and attempts[10] == 2 and attempts[29] == 2 and attempts[30] == 3
    assert [e["event"] for e in logs] == ["capacity_publish_failed"], "one line for a run of the same refusal"
