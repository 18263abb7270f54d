"""Memory held by exited processes: a teardown raises nothing, memory held past the threshold makes the GPU need a
reset, once per onset."""

from __future__ import annotations

import pytest

from vramguard.core.exited import EXITED_HOLD_S, ExitedTracker, HeldByExited
from vramguard.core.process import ProcessRef
from vramguard.core.quantity import GiB
from vramguard.core.snapshot import UnattributedProcess, UnattributedReason

EXITED = UnattributedReason.PROCESS_EXITED
GPU0 = "GPU-0"
GPU1 = "GPU-1"

Row = tuple[int, str, int, UnattributedReason]  # pid, device, bytes, reason


def rows(*spec: Row) -> list[UnattributedProcess]:
    return [UnattributedProcess(ProcessRef(pid, -1), device, used, reason) for pid, device, used, reason in spec]


def test_the_threshold_outlasts_a_teardown_by_far() -> None:
    """60 s: a teardown measured at 79-141 ms (a few seconds at most) never reaches it."""
    assert EXITED_HOLD_S == 60.0


# Each case: the scans as (seconds since the first, rows), and the GPUs that need a reset after the last one.
CASES = {
    "a-teardown-within-the-threshold-raises-nothing": (
        [(0.0, [(7, GPU0, GiB, EXITED)]), (0.5, [(7, GPU0, GiB, EXITED)]), (1.0, [])],
        {},
    ),
    "held-just-short-of-the-threshold-raises-nothing": (
        [(0.0, [(7, GPU0, GiB, EXITED)]), (59.9, [(7, GPU0, GiB, EXITED)])],
        {},
    ),
    "held-for-the-threshold-needs-a-reset": (
        [(0.0, [(7, GPU0, GiB, EXITED)]), (60.0, [(7, GPU0, GiB, EXITED)])],
        {GPU0: HeldByExited(GPU0, GiB, (7,), 0.0)},
    ),
    "only-the-pids-past-the-threshold-count": (
        [(0.0, [(7, GPU0, GiB, EXITED)]), (30.0, [(7, GPU0, GiB, EXITED), (8, GPU0, 2 * GiB, EXITED)]),
         (61.0, [(7, GPU0, GiB, EXITED), (8, GPU0, 2 * GiB, EXITED)])],
        {GPU0: HeldByExited(GPU0, GiB, (7,), 0.0)},
    ),
    "several-pids-on-a-gpu-add-up": (
        [(0.0, [(7, GPU0, GiB, EXITED), (8, GPU0, 2 * GiB, EXITED)]),
         (90.0, [(8, GPU0, 2 * GiB, EXITED), (7, GPU0, GiB, EXITED)])],
        {GPU0: HeldByExited(GPU0, 3 * GiB, (7, 8), 0.0)},
    ),
    "each-gpu-on-its-own": (
        [(0.0, [(7, GPU0, GiB, EXITED), (7, GPU1, 4 * GiB, EXITED)]), (60.0, [(7, GPU1, 4 * GiB, EXITED)])],
        {GPU1: HeldByExited(GPU1, 4 * GiB, (7,), 0.0)},
    ),
    "a-gap-restarts-the-clock": (
        [(0.0, [(7, GPU0, GiB, EXITED)]), (30.0, []), (31.0, [(7, GPU0, GiB, EXITED)]),
         (70.0, [(7, GPU0, GiB, EXITED)])],
        {},
    ),
    "a-pid-alive-again-is-not-exited": (
        [(0.0, [(7, GPU0, GiB, EXITED)]), (30.0, [(7, GPU0, GiB, UnattributedReason.NOT_IN_POD)]),
         (61.0, [(7, GPU0, GiB, UnattributedReason.NOT_IN_POD)])],
        {},
    ),
    "host-and-uncached-processes-are-not-exited": (
        [(0.0, [(7, GPU0, GiB, UnattributedReason.NOT_IN_POD), (8, GPU0, GiB, UnattributedReason.POD_NOT_IN_CACHE)]),
         (600.0, [(7, GPU0, GiB, UnattributedReason.NOT_IN_POD), (8, GPU0, GiB, UnattributedReason.POD_NOT_IN_CACHE)])],
        {},
    ),
    "a-row-without-bytes-holds-nothing": (
        [(0.0, [(7, GPU0, 0, EXITED)]), (120.0, [(7, GPU0, 0, EXITED)])],
        {},
    ),
}  # fmt: skip


@pytest.mark.parametrize(("scans", "held"), list(CASES.values()), ids=list(CASES))
def test_which_gpus_need_a_reset(scans: list[tuple[float, list[Row]]], held: dict[str, HeldByExited]) -> None:
    """A GPU needs a reset when an exited PID's bytes stayed on it, scan after scan, for the threshold."""
    tracker = ExitedTracker()
    result = None
    for at, spec in scans:
        result = tracker.observe(rows(*spec), at)
    assert result is not None and dict(result.held) == held


def test_an_onset_is_told_once_and_again_only_after_the_gpu_was_free() -> None:
    """Onsets name a GPU the first scan it needs a reset, not the scans after; clearing it and a new fault start
    a new episode."""
    tracker = ExitedTracker(hold_s=10.0)
    held = rows((7, GPU0, GiB, EXITED))
    assert tracker.observe(held, 0.0).onsets == ()
    first = tracker.observe(held, 10.0)
    assert [h.device_uuid for h in first.onsets] == [GPU0] and first.cleared == ()
    assert [tracker.observe(held, t).onsets for t in (11.0, 12.0, 500.0)] == [(), (), ()]
    reset = tracker.observe([], 501.0)
    assert (reset.onsets, reset.cleared, dict(reset.held)) == ((), (GPU0,), {})
    tracker.observe(held, 600.0)
    assert [h.device_uuid for h in tracker.observe(held, 610.0).onsets] == [GPU0]


def test_the_tracker_is_bounded_and_keeps_what_it_followed_first() -> None:
    """Past `max_tracked` pairs the new ones wait; the ones followed already keep their first sighting."""
    tracker = ExitedTracker(hold_s=10.0, max_tracked=2)
    tracker.observe(rows((1, GPU0, GiB, EXITED), (2, GPU0, GiB, EXITED)), 0.0)
    more = rows(*((pid, GPU0, GiB, EXITED) for pid in range(1, 100)))
    tracker.observe(more, 5.0)
    assert tracker.tracked() == 2
    assert tracker.observe(more, 10.0).held[GPU0].pids == (1, 2)


def test_a_zero_threshold_is_allowed_and_a_negative_one_is_not() -> None:
    """hold_s 0 (tests: at the first sighting) is a threshold; a negative one or no room is refused."""
    assert ExitedTracker(hold_s=0.0).observe(rows((7, GPU0, GiB, EXITED)), 3.0).held[GPU0].since == 3.0
    with pytest.raises(ValueError):
        ExitedTracker(hold_s=-1.0)
    with pytest.raises(ValueError):
        ExitedTracker(max_tracked=0)
