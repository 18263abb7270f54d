"""What the kubelet runs, from its pod logs directory: entries parsed strictly, the listing bounded, a change heard."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from vramguard.core.process import KubeletPod
from vramguard.node import kubelet_pods
from vramguard.node.kubelet_pods import KubeletPods, parse_entry

STATIC = "6f0c2c0b1b6e4b3f8e1d2a3b4c5d6e7f"
UUID = "1b2c3d4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e"


@pytest.mark.parametrize(
    ("entry", "found"),
    [
        pytest.param(f"kube-system_etcd-gpu-1_{STATIC}", (STATIC, KubeletPod("kube-system", "etcd-gpu-1")), id="hash"),
        pytest.param(f"ml_trainer-0_{UUID}", (UUID, KubeletPod("ml", "trainer-0")), id="uuid"),
        pytest.param(f"ml_web.v2-abc_{UUID}", (UUID, KubeletPod("ml", "web.v2-abc")), id="dotted-pod-name"),
        pytest.param(f"ml_a_b_{UUID}", None, id="four-parts-no-pod"),
        pytest.param(f"ML_trainer_{UUID}", None, id="upper-case-no-namespace"),
        pytest.param(f"ml_trainer_{UUID.upper()}", None, id="upper-case-uid"),
        pytest.param(f"_trainer_{UUID}", None, id="empty-namespace"),
        pytest.param("ml_trainer", None, id="no-uid"),
        pytest.param(f"ml_trainer_{UUID}.tmp", None, id="suffix"),
        pytest.param(f"{'n' * 64}_trainer_{UUID}", None, id="namespace-longer-than-a-label"),
    ],
)
def test_an_entry_names_a_namespace_a_name_and_a_uid(entry: str, found: tuple[str, KubeletPod] | None) -> None:
    """`<namespace>_<name>_<uid>`, as the kubelet names it; anything else names no pod."""
    assert parse_entry(entry) == found


def test_the_listing_is_read_on_refresh_and_a_change_is_heard(tmp_path: Path) -> None:
    """`runs` answers from the last listing (no disk read); `refresh` reads it, and a different one is heard."""
    changes: list[int] = []
    pods = KubeletPods(str(tmp_path), on_change=lambda: changes.append(1))
    (tmp_path / f"ml_job-gpu-1_{STATIC}").mkdir()
    assert pods.runs(STATIC) is None
    assert pods.refresh() and pods.runs(STATIC) == KubeletPod("ml", "job-gpu-1") and changes == [1]
    assert not pods.refresh() and changes == [1]
    (tmp_path / f"ml_job-gpu-1_{STATIC}").rmdir()
    assert pods.refresh() and pods.runs(STATIC) is None and changes == [1, 1]


def test_a_missing_directory_is_said_once_and_nothing_is_backed(tmp_path: Path) -> None:
    """Without the directory no claim can be backed: one warning for the run of failures, then a recovery line."""
    pods = KubeletPods(str(tmp_path / "absent"))
    with capture_logs() as logs:
        pods.refresh()
        pods.refresh()
        (tmp_path / "absent").mkdir()
        pods.refresh()
    assert [e["event"] for e in logs] == ["kubelet_pod_logs_unreadable", "kubelet_pod_logs_readable"]


def test_a_listing_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_ENTRIES entries the rest of the directory is not read."""
    monkeypatch.setattr(kubelet_pods, "MAX_ENTRIES", 3)
    for i in range(10):
        os.mkdir(tmp_path / f"ml_p{i}_{i:08x}-0000-4000-8000-000000000000")
    pods = KubeletPods(str(tmp_path))
    pods.refresh()
    assert sum(pods.runs(f"{i:08x}-0000-4000-8000-000000000000") is not None for i in range(10)) == 3
