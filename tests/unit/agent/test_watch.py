"""The watch between scans: which readings call for a scan, the rate limit, and how the loop waits for the watch."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import NamedTuple

import pytest

from vramguard.agent.watch import MemoryWatch, ScanTrigger, Trigger
from vramguard.core.model import GiB, GpuDevice, GpuMemory, MiB, Policy
from vramguard.testing.fakes import FakeClock, gpu

TOTAL = 80 * GiB  # 1 % of it is 819 MiB: the 256 MiB bound is the smaller


def scanned_gpu(used: int, *, index: int = 0, total: int = TOTAL, healthy: bool = True) -> GpuDevice:
    return replace(gpu(index), total_bytes=total, used_bytes=used, free_bytes=total - used, healthy=healthy)


def reading(used: int, *, index: int = 0, total: int = TOTAL) -> GpuMemory:
    return GpuMemory(index, total, used, total - used)


class Case(NamedTuple):
    scanned: list[GpuDevice]
    readings: list[list[GpuMemory]]  # one list a watch reading; the last one's answer is the case's
    expected: Trigger | None
    policy: Policy = Policy()


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(Case([scanned_gpu(10 * GiB)], [[reading(10 * GiB)]], None), id="nothing-changed"),
        pytest.param(
            Case([scanned_gpu(10 * GiB)], [[reading(10 * GiB + 256 * MiB)]], None), id="a-rise-of-the-threshold-is-not"
        ),
        pytest.param(
            Case([scanned_gpu(10 * GiB)], [[reading(10 * GiB + 257 * MiB)]], Trigger.MEMORY_RISE),
            id="a-rise-past-256mi-scans",
        ),
        pytest.param(
            Case([scanned_gpu(GiB, total=8 * GiB)], [[reading(GiB + 90 * MiB, total=8 * GiB)]], Trigger.MEMORY_RISE),
            id="on-a-small-gpu-1-percent-is-the-smaller",
        ),
        pytest.param(
            Case(
                [scanned_gpu(10 * GiB)],
                [[reading(11 * GiB)]],
                None,
                Policy(watch_rise_bytes=2 * GiB, watch_rise_ratio=None),
            ),
            id="the-policys-rise",
        ),
        pytest.param(
            Case([scanned_gpu(10 * GiB)], [[reading(8 * GiB)], [reading(10 * GiB)]], Trigger.MEMORY_RISE),
            id="freed-since-the-scan-then-taken-again-is-a-rise",
        ),
        pytest.param(Case([], [[reading(40 * GiB)]], None), id="a-gpu-no-scan-has-seen-is-left-to-the-poll"),
        pytest.param(
            Case([scanned_gpu(10 * GiB, healthy=False)], [[reading(40 * GiB)]], None), id="an-unhealthy-gpu-is-not"
        ),
        pytest.param(
            Case(
                [scanned_gpu(10 * GiB), scanned_gpu(10 * GiB, index=1)],
                [[reading(10 * GiB), reading(12 * GiB, index=1)]],
                Trigger.MEMORY_RISE,
            ),
            id="any-gpu-of-the-node",
        ),
        pytest.param(
            Case(
                [scanned_gpu(70 * GiB)],
                [[reading(TOTAL - 3 * GiB)]],
                Trigger.PRESSURE,
                Policy(watch_rise_bytes=None, watch_rise_ratio=0.5),
            ),
            id="entering-the-pressure-band-scans",
        ),
        pytest.param(
            Case([scanned_gpu(TOTAL - 3 * GiB)], [[reading(TOTAL - 3 * GiB + 100 * MiB)]], None),
            id="already-under-pressure-at-the-scan-is-not-news",
        ),
    ],
)
def test_which_readings_call_for_a_scan(case: Case) -> None:
    """A rise since the last scan past the smaller of 256 MiB and 1 % of the GPU, counted from the lowest reading
    since; or a GPU entering its pressure band. Only GPUs the last scan saw healthy."""
    trigger = ScanTrigger(case.policy, FakeClock())
    trigger.scanned(case.scanned)
    answers = [trigger.check(r) for r in case.readings]
    assert answers[-1] is case.expected


def test_triggered_scans_are_held_to_the_rate_and_counted_once_a_wait() -> None:
    """A churn past the rate: its burst is answered, then one scan per 1/rate s; each wait for the rate is counted
    once, however many readings it spans."""
    clock = FakeClock()
    trigger = ScanTrigger(Policy(triggered_scans_per_second=2), clock)
    trigger.scanned([scanned_gpu(GiB)])
    rise = [reading(3 * GiB)]
    assert [trigger.check(rise) for _ in range(2)] == [Trigger.MEMORY_RISE] * 2, "the burst"
    assert [trigger.check(rise) for _ in range(5)] == [None] * 5 and trigger.held == 1
    clock.step(0.5)
    assert trigger.check(rise) is Trigger.MEMORY_RISE
    trigger.scanned([scanned_gpu(GiB)])
    assert trigger.check(rise) is None and trigger.held == 2, "a new wait after the scan"


def _watch(readings: list[GpuMemory], clock: FakeClock, held: list[int]) -> MemoryWatch:
    trigger = ScanTrigger(Policy(triggered_scans_per_second=1), clock)
    return MemoryWatch(lambda: readings, trigger, 0.02, clock, count_held=lambda: held.append(1))


def test_the_loop_waits_for_the_watch_or_the_poll() -> None:
    """The scan loop's wait ends with the reason a reading posted, or at the poll (None); a reason posted before a
    scan's sample is stale, and a reading that fails is a hint missed, not an error."""
    clock, held = FakeClock(), list[int]()
    readings = [reading(GiB)]
    watch = _watch(readings, clock, held)
    stop = threading.Event()
    watch.scanned([scanned_gpu(GiB)], clock.now())
    watch.read_once()
    assert watch.wait(stop, clock.now() + 1.0) is None, "nothing rose: the poll is due"

    readings[0] = reading(5 * GiB)
    watch.read_once()
    assert watch.wait(stop, clock.now() + 1.0) is Trigger.MEMORY_RISE
    watch.read_once()
    assert held == [1], "the rate's one token is spent: the next is held, and counted"
    sampled_at = clock.now()
    clock.step(1.0)  # a token again
    watch.read_once()
    watch.scanned([scanned_gpu(GiB)], sampled_at)
    assert watch.wait(stop, clock.now() + 1.0) is Trigger.MEMORY_RISE, "read after the scan's sample: it stands"
    clock.step(1.0)
    watch.read_once()
    watch.scanned([scanned_gpu(GiB)], clock.now())
    assert watch.wait(stop, clock.now() + 1.0) is None, "read before the scan's sample: stale"

    def broken() -> list[GpuMemory]:
        raise RuntimeError("NVML went away")

    watch.read = broken
    watch.read_once()
    assert watch.readings == 5 and watch.wait(stop, clock.now() + 1.0) is None


def test_a_stop_set_while_the_loop_waits_ends_the_wait() -> None:
    """The watch wakes a waiting loop whose stop was set (within a reading), whatever the poll."""
    clock = FakeClock()
    watch = _watch([reading(GiB)], clock, [])
    stop = threading.Event()
    stop.set()
    watch._waiter_stop = stop
    watch.read_once()
    assert watch.wait(stop, clock.now() + 3600.0) is None
    assert clock.now() < 1000.0 + 3600.0, "it did not wait for the poll"


def test_the_watch_reads_once_a_round_until_stopped() -> None:
    """The watch's loop reads once a round, with no wait on the clock (its pause is real time, its own); a stop
    ends it."""
    clock, readings = FakeClock(), [reading(GiB)]

    def read() -> list[GpuMemory]:
        if watch.readings == 2:
            watch.stop(clock.now())
        return readings

    watch = MemoryWatch(read, ScanTrigger(Policy(), clock), 0.0, clock)
    watch.loop.run()
    assert watch.readings == 3 and clock.waits == []
