"""The peak window: each (pod, container, GPU)'s highest usage over the scans of the last minute, kept after the
container stops using the GPU, forgotten once out of the window, and bounded in series."""

from __future__ import annotations

import pytest

from vramguard.core.peaks import PeakWindow
from vramguard.core.quantity import GiB, MiB
from vramguard_testbed.fakes import SnapshotBuilder, gpu, pod

TRAINER = pod("trainer", "ml")
GPU0 = gpu(0)
DEVICES = {GPU0.uuid: GPU0}


def _scan(window: PeakWindow, at: float, *used: int) -> list[int]:
    """One scan at `at` with the trainer's row at each of `used` bytes (none: no row); the trainer's peaks."""
    builder = SnapshotBuilder()
    for used_bytes in used:
        builder.use(TRAINER, "main", GPU0, used_bytes)
    peaks = window.observe(builder.build().containers, DEVICES, at)
    return [p.peak_bytes for p in peaks if p.pod is TRAINER]


@pytest.mark.parametrize(
    ("scans", "peak"),
    [
        pytest.param([(0.0, 2 * GiB)], 2 * GiB, id="one-scan-is-its-own-peak"),
        pytest.param([(0.0, 2 * GiB), (1.0, 9 * GiB), (3.0, 2 * GiB)], 9 * GiB, id="a-spike-between-scrapes-stays"),
        pytest.param([(0.0, 9 * GiB), (59.0, 2 * GiB)], 9 * GiB, id="kept-for-the-whole-window"),
        pytest.param([(0.0, 9 * GiB), (61.0, 2 * GiB)], 2 * GiB, id="forgotten-past-the-window"),
        pytest.param(
            [(0.0, 9 * GiB), (30.0, 5 * GiB), (61.0, 2 * GiB)], 5 * GiB, id="the-next-highest-once-the-peak-is-out"
        ),
        pytest.param([(0.0, 3 * GiB), (1.0, 3 * GiB), (61.0, MiB)], 3 * GiB, id="an-equal-later-value-keeps-it-in"),
    ],
)
def test_the_peak_is_the_highest_usage_of_the_window(scans: list[tuple[float, int]], peak: int) -> None:
    """After scans at these times with these usages, the trainer's peak is the highest of the last 60 s."""
    window = PeakWindow()
    for at, used in scans:
        found = _scan(window, at, used)
    assert found == [peak]


def test_a_container_gone_from_the_gpu_keeps_its_peak_for_the_window() -> None:
    """A container that used the GPU for one scan is exported with that peak for 60 s after, then not at all."""
    window = PeakWindow()
    assert _scan(window, 0.0, 4 * GiB) == [4 * GiB]
    assert _scan(window, 59.0) == [4 * GiB]
    assert _scan(window, 60.5) == []


def test_the_series_are_bounded_and_the_longest_gone_dropped_first() -> None:
    """Past `max_series`, the subjects whose last row is oldest go first; those in this scan stay."""
    window = PeakWindow(max_series=2)
    pods = [pod(f"job-{i}", "ml") for i in range(3)]
    for at, p in enumerate(pods):
        window.observe(SnapshotBuilder().use(p, "main", GPU0, GiB).build().containers, DEVICES, float(at))
    names = [x.pod.name for x in window.observe((), DEVICES, 3.0)]
    assert names == ["job-1", "job-2"]


def test_a_peak_names_its_gpu_as_the_usage_metric_does() -> None:
    """The peak carries the device's label (its index) and UUID, and the container's name as the row has it."""
    (found,) = PeakWindow().observe(SnapshotBuilder().use(TRAINER, "main", GPU0, GiB).build().containers, DEVICES, 0)
    assert (found.container, found.gpu, found.device_uuid) == ("main", GPU0.label, GPU0.uuid)


def test_the_highest_since_the_first_scan_outlives_the_window() -> None:
    """`highest` keeps each subject's highest usage since the first scan, past the 60 s window, and says how long
    that covers; it is bounded like the window, the longest gone first."""
    window = PeakWindow(max_series=2)
    _scan(window, 10.0, 9 * GiB)
    _scan(window, 100.0, 2 * GiB)
    assert _scan(window, 100.0, 2 * GiB) == [2 * GiB], "the window forgot the spike"
    highest = window.highest(130.0)
    assert [(p.pod.name, p.peak_bytes) for p in highest.peaks] == [("trainer", 9 * GiB)]
    assert highest.covers_s == 120.0
    others = [pod(f"job-{i}", "ml") for i in range(2)]
    for at, p in enumerate(others, start=200):
        window.observe(SnapshotBuilder().use(p, "main", GPU0, GiB).build().containers, DEVICES, float(at))
    assert sorted(p.pod.name for p in window.highest(300.0).peaks) == ["job-0", "job-1"]


def test_before_any_scan_the_highest_covers_nothing() -> None:
    highest = PeakWindow().highest(5.0)
    assert (highest.peaks, highest.covers_s) == ((), 0.0)
