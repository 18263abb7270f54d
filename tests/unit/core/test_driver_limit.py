"""Driver limits: a limit's target and what programming it came to."""

from __future__ import annotations

import pytest

from vramguard.core.driver_limit import LimitResult, LimitTarget
from vramguard.core.pod import PodInfo
from vramguard.core.quantity import GiB

POD = PodInfo("5f3c2b1a-0000-4000-8000-000000000002", "ml", "trainer")


@pytest.mark.parametrize(
    ("container", "container_id", "pending", "subject"),
    [
        pytest.param("main", "c0ffee", False, "container main", id="a-running-container"),
        pytest.param("main", None, True, "container main", id="a-container-not-started-is-pending"),
        pytest.param(None, None, False, "pod trainer", id="the-pods-own-cgroup-is-never-pending"),
    ],
)
def test_a_target_is_pending_until_its_container_has_an_id(
    container: str | None, container_id: str | None, pending: bool, subject: str
) -> None:
    target = LimitTarget(POD, container, container_id, 0, "GPU-0", 8 * GiB, "limits[vramguard.io/vram]")
    assert (target.pending, target.subject) == (pending, subject)
    assert target.key.pod_uid == POD.uid and target.key.container == container and target.key.gpu_uuid == "GPU-0"
    assert target.describe() == "hard limit 8.0GiB on GPU 0 (GPU-0) (limits[vramguard.io/vram])"


@pytest.mark.parametrize("result", list(LimitResult))
def test_only_a_limit_not_held_as_it_should_be_warns(result: LimitResult) -> None:
    assert result.warns is (result in (LimitResult.LATE, LimitResult.FAILED))
