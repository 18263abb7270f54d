"""The attributed snapshot: one scan's usage per container and GPU, and what is tied to no pod."""

from __future__ import annotations

from vramguard.core.quantity import GiB
from vramguard.core.sample import GpuDevice
from vramguard.core.snapshot import Snapshot, UnattributedReason


def test_a_snapshot_finds_its_devices_by_uuid() -> None:
    gpus = tuple(
        GpuDevice(index=i, uuid=f"GPU-{i}", name="H100", total_bytes=80 * GiB, used_bytes=0, free_bytes=80 * GiB)
        for i in range(2)
    )
    snapshot = Snapshot(devices=gpus, containers=())
    assert snapshot.device("GPU-1") is gpus[1]
    assert snapshot.device("GPU-9") is None


def test_every_unattributed_reason_has_its_words() -> None:
    """`vramguard top` and /status say why memory is tied to no pod: a reason added without words fails here."""
    said = {reason: reason.why for reason in UnattributedReason}
    assert all(said.values()) and len(set(said.values())) == len(said)
