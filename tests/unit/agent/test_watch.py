"""The watch between scans: which readings call for a scan, a pod learned late, the rate limit, how the loop waits
for the watch, and a watch stuck in the driver."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import NamedTuple

import pytest

from vramguard.agent.watch import WATCH_STUCK_S, MemoryWatch, ScanCalls, ScanTrigger, Trigger
from vramguard.core.attribute import Awaited
from vramguard.core.pod import ContainerInfo, PodInfo
from vramguard.core.policy import Policy
from vramguard.core.quantity import GiB, MiB
from vramguard.core.sample import GpuDevice, GpuMemory
from vramguard_testbed.fakes import FakeClock, gpu, pod

TOTAL = 80 * GiB  # 1 % of it is 819 MiB: the 256 MiB bound is the smaller


def scanned_gpu(used: int, *, index: int = 0, total: int = TOTAL, healthy: bool = True) -> GpuDevice:
    return replace(gpu(index), total_bytes=total, used_bytes=used, free_bytes=total - used, healthy=healthy)


def reading(used: int, *, index: int = 0, total: int = TOTAL) -> GpuMemory:
    return GpuMemory(index, total, used, total - used)


class Case(NamedTuple):
    scanned: list[GpuDevice]
    readings: list[list[GpuMemory]]  # one list a watch reading
    expected: list[Trigger | None]  # the answer to each reading
    policy: Policy = Policy()


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(Case([scanned_gpu(10 * GiB)], [[reading(10 * GiB)]], [None]), id="nothing-changed"),
        pytest.param(
            Case([scanned_gpu(10 * GiB)], [[reading(10 * GiB + 256 * MiB)]], [None]),
            id="a-rise-of-the-threshold-is-not",
        ),
        pytest.param(
            Case([scanned_gpu(10 * GiB)], [[reading(10 * GiB + 257 * MiB)]], [Trigger.MEMORY_RISE]),
            id="a-rise-past-256mi-scans",
        ),
        pytest.param(
            Case([scanned_gpu(GiB, total=8 * GiB)], [[reading(GiB + 90 * MiB, total=8 * GiB)]], [Trigger.MEMORY_RISE]),
            id="on-a-small-gpu-1-percent-is-the-smaller",
        ),
        pytest.param(
            Case(
                [scanned_gpu(10 * GiB)],
                [[reading(11 * GiB)]],
                [None],
                Policy(watch_rise_bytes=2 * GiB, watch_rise_ratio=None),
            ),
            id="the-policys-rise",
        ),
        pytest.param(
            Case([scanned_gpu(10 * GiB)], [[reading(10 * GiB - 256 * MiB)]], [None]),
            id="a-fall-of-the-threshold-is-not",
        ),
        pytest.param(
            Case([scanned_gpu(10 * GiB)], [[reading(10 * GiB - 257 * MiB)]], [Trigger.MEMORY_FALL]),
            id="a-fall-past-256mi-scans",
        ),
        pytest.param(
            # 4 GiB freed and 3 GiB taken between two readings: the counter shows only the net change.
            Case([scanned_gpu(10 * GiB)], [[reading(9 * GiB)]], [Trigger.MEMORY_FALL]),
            id="a-free-hiding-an-allocation-in-one-interval-scans",
        ),
        pytest.param(
            Case([scanned_gpu(10 * GiB)], [[reading(10 * GiB - 200 * MiB)]], [None]),
            id="a-swap-whose-net-change-is-within-the-threshold-is-left-to-the-poll",
        ),
        pytest.param(
            Case(
                [scanned_gpu(10 * GiB)],
                [[reading(8 * GiB)], [reading(10 * GiB)]],
                [Trigger.MEMORY_FALL, Trigger.MEMORY_RISE],
            ),
            id="freed-since-the-scan-then-taken-again-is-a-rise",
        ),
        pytest.param(
            Case(
                [scanned_gpu(10 * GiB)],
                [[reading(10 * GiB - 200 * MiB)], [reading(10 * GiB + 100 * MiB)]],
                [None, Trigger.MEMORY_RISE],
            ),
            id="a-rise-is-counted-from-the-lowest-reading",
        ),
        pytest.param(Case([], [[reading(40 * GiB)]], [None]), id="a-gpu-no-scan-has-seen-is-left-to-the-poll"),
        pytest.param(
            Case([scanned_gpu(10 * GiB, healthy=False)], [[reading(40 * GiB)]], [None]), id="an-unhealthy-gpu-is-not"
        ),
        pytest.param(
            Case(
                [scanned_gpu(10 * GiB), scanned_gpu(10 * GiB, index=1)],
                [[reading(10 * GiB), reading(12 * GiB, index=1)]],
                [Trigger.MEMORY_RISE],
            ),
            id="any-gpu-of-the-node",
        ),
        pytest.param(
            Case(
                [scanned_gpu(70 * GiB)],
                [[reading(TOTAL - 3 * GiB)]],
                [Trigger.PRESSURE],
                Policy(watch_rise_bytes=None, watch_rise_ratio=0.5),
            ),
            id="entering-the-pressure-band-scans",
        ),
        pytest.param(
            Case([scanned_gpu(TOTAL - 3 * GiB)], [[reading(TOTAL - 3 * GiB + 100 * MiB)]], [None]),
            id="already-under-pressure-at-the-scan-is-not-news",
        ),
        pytest.param(
            Case(
                [scanned_gpu(10 * GiB)],
                [[reading(10 * GiB + GiB)], [reading(10 * GiB + GiB)]],
                [Trigger.MEMORY_RISE] * 2,
            ),
            id="a-reason-stands-until-the-next-scan",
        ),
        pytest.param(
            Case(
                [scanned_gpu(GiB)],
                [[reading(GiB + 90 * MiB)], [reading(GiB + 90 * MiB, total=8 * GiB)]],
                [None, Trigger.MEMORY_RISE],
            ),
            id="the-threshold-follows-the-gpus-size-as-read",
        ),
    ],
)
def test_which_readings_call_for_a_scan(case: Case) -> None:
    """A change since the last scan past the smaller of 256 MiB and 1 % of the GPU, a rise or a fall, a rise
    counted from the lowest reading since; or a GPU entering its pressure band. Only GPUs the last scan saw
    healthy."""
    trigger = ScanTrigger(case.policy)
    trigger.scanned(case.scanned)
    assert [trigger.check(r) for r in case.readings] == case.expected


def test_a_scan_starts_the_lowest_reading_afresh() -> None:
    """Memory freed and taken again after a scan is a rise counted from the lowest reading since that scan, not
    from one before it."""
    trigger = ScanTrigger(Policy())
    trigger.scanned([scanned_gpu(10 * GiB)])
    assert trigger.check([reading(9 * GiB)]) is Trigger.MEMORY_FALL
    trigger.scanned([scanned_gpu(10 * GiB)])
    assert trigger.check([reading(10 * GiB + 200 * MiB)]) is None, "200 MiB over the new scan's 10 GiB"
    trigger.scanned([scanned_gpu(9 * GiB)])
    assert trigger.check([reading(9 * GiB + 300 * MiB)]) is Trigger.MEMORY_RISE


def test_a_policy_given_to_the_trigger_is_in_force_from_the_next_reading() -> None:
    """The rise threshold is the trigger's policy's at each reading: a reload that widens it quiets a reading that
    called for a scan, and narrowing it again brings the call back."""
    default, wide = Policy(), Policy(watch_rise_bytes=2 * GiB, watch_rise_ratio=None)
    trigger = ScanTrigger(default)
    trigger.scanned([scanned_gpu(10 * GiB)])
    assert trigger.check([reading(11 * GiB)]) is Trigger.MEMORY_RISE
    trigger.policy = wide
    assert trigger.check([reading(11 * GiB)]) is None
    trigger.policy = default
    assert trigger.check([reading(11 * GiB)]) is Trigger.MEMORY_RISE


def test_calls_are_held_to_the_rate_and_counted_once_a_wait() -> None:
    """A churn past the rate: its burst is answered, then one scan per 1/rate s, the waiter waking when the token
    is due rather than at the poll; each wait for the rate is counted once, however many calls it spans."""
    clock, held = FakeClock(), list[int]()
    calls = ScanCalls(Policy(triggered_scans_per_second=2), clock, count_held=lambda: held.append(1))
    stop = threading.Event()
    for _ in range(2):
        calls.post(Trigger.MEMORY_RISE, clock.now())
        assert calls.wait(stop, clock.now() + 60.0) is Trigger.MEMORY_RISE, "the burst"
    for _ in range(5):
        calls.post(Trigger.MEMORY_RISE, clock.now())
    assert held == [1] and calls.held == 1, "one wait, counted once"
    started = clock.now()
    assert calls.wait(stop, clock.now() + 60.0) is Trigger.MEMORY_RISE
    assert clock.now() - started == pytest.approx(0.5), "at the token, not at the poll"
    calls.scanned(clock.now())
    calls.post(Trigger.MEMORY_RISE, clock.now())
    assert held == [1, 1], "a new wait after the scan"


def test_a_call_seen_before_the_scans_sample_is_stale() -> None:
    """A scan answers the calls for what was seen before its sample, admitted or waiting for the rate; one seen
    since stands (the sample may have missed it)."""
    clock = FakeClock()
    calls = ScanCalls(Policy(triggered_scans_per_second=1), clock)
    stop = threading.Event()
    calls.post(Trigger.MEMORY_RISE, clock.now())  # takes the rate's one token
    calls.scanned(clock.now())
    assert calls.wait(stop, clock.now()) is None, "admitted, then answered by the scan"
    calls.post(Trigger.PRESSURE, clock.now())  # no token left: it waits for the next
    assert calls.held == 1
    calls.scanned(clock.now())
    assert calls.wait(stop, clock.now() + 5.0) is None, "waiting for the rate, then answered by the scan"
    sampled_at = clock.now()
    clock.step(0.01)
    calls.post(Trigger.MEMORY_FALL, clock.now())
    calls.scanned(sampled_at)
    assert calls.wait(stop, clock.now() + 5.0) is Trigger.MEMORY_FALL


POD = pod("trainer", "ml")
STARTED = replace(POD, containers=(*POD.containers, ContainerInfo("late", "c" * 64)))
OTHER = pod("notebook", "ml")


@pytest.mark.parametrize(
    ("awaited", "updates", "expected"),
    [
        pytest.param(Awaited(pods=frozenset({POD.uid})), [[OTHER], [POD]], [None, Trigger.POD_LEARNED], id="the-pod"),
        pytest.param(
            Awaited(containers={POD.uid: frozenset({"c" * 64})}),
            [[POD], [OTHER, STARTED]],
            [None, Trigger.POD_LEARNED],
            id="the-container-named-by-its-pods-status",
        ),
        pytest.param(
            Awaited(pods=frozenset({POD.uid})), [[POD], [POD]], [Trigger.POD_LEARNED, None], id="once-until-the-scan"
        ),
        pytest.param(Awaited(), [[POD, OTHER]], [None], id="nothing-awaited"),
    ],
)
def test_a_pod_update_naming_what_the_scan_awaited_calls_for_a_scan(
    awaited: Awaited, updates: list[list[PodInfo]], expected: list[Trigger | None]
) -> None:
    """A pod source's update that names a pod or container the last scan could not attribute for want of it
    calls for a scan, once: the scan it calls for publishes what is still awaited."""
    clock = FakeClock()
    calls = ScanCalls(Policy(), clock)
    stop = threading.Event()
    calls.awaiting(awaited, lambda: {})
    answers = []
    for update in updates:
        calls.pods_updated(update)
        answers.append(calls.wait(stop, clock.now()))
    assert answers == expected


def test_an_update_between_the_scans_read_and_its_record_is_not_missed() -> None:
    """The pod cache is read again once the scan's record is in: a pod that arrived in between, whose update came
    before the record, calls for a scan."""
    clock = FakeClock()
    calls = ScanCalls(Policy(), clock)
    stop = threading.Event()
    calls.pods_updated([POD])  # before the record: nothing awaited yet
    calls.awaiting(Awaited(pods=frozenset({POD.uid})), lambda: {POD.uid: POD})
    assert calls.wait(stop, clock.now()) is Trigger.POD_LEARNED


def test_a_pod_learned_waits_for_the_rate_like_any_call() -> None:
    """A pod learned while the rate is spent is answered when the next token is due."""
    clock = FakeClock()
    calls = ScanCalls(Policy(triggered_scans_per_second=1), clock)
    stop = threading.Event()
    calls.post(Trigger.MEMORY_RISE, clock.now())
    assert calls.wait(stop, clock.now() + 30.0) is Trigger.MEMORY_RISE
    calls.awaiting(Awaited(pods=frozenset({POD.uid})), lambda: {})
    calls.pods_updated([POD])
    started = clock.now()
    assert calls.wait(stop, clock.now() + 30.0) is Trigger.POD_LEARNED
    assert clock.now() - started == pytest.approx(1.0)


def _watch(readings: list[GpuMemory], clock: FakeClock, held: list[int]) -> MemoryWatch:
    policy = Policy(triggered_scans_per_second=1)
    calls = ScanCalls(policy, clock, count_held=lambda: held.append(1))
    return MemoryWatch(lambda: readings, ScanTrigger(policy), 0.02, clock, calls=calls)


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
    watch.calls._waiter_stop = stop
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

    watch = MemoryWatch(read, ScanTrigger(Policy()), 0.0, clock)
    watch.loop.run()
    assert watch.readings == 3 and clock.waits == []


def test_a_reading_stuck_in_the_driver_is_a_problem_after_a_while() -> None:
    """A reading that has not returned for WATCH_STUCK_S is the watch's problem, said with its age; a reading back,
    or none under way, is none."""
    clock, seen = FakeClock(), list[str | None]()

    def stuck() -> list[GpuMemory]:
        clock.step(WATCH_STUCK_S - 0.1)
        seen.append(watch.problem(clock.now()))
        clock.step(7.4)
        seen.append(watch.problem(clock.now()))
        return [reading(GiB)]

    watch = MemoryWatch(stuck, ScanTrigger(Policy()), 0.02, clock)
    assert watch.problem(clock.now()) is None, "no reading yet"
    watch.read_once()
    assert seen == [None, "memory watch: a reading has not returned for 12.3 s; scans at the poll only"]
    assert watch.problem(clock.now() + 3600.0) is None, "back: between readings"


def test_a_failed_reading_leaves_no_reading_under_way() -> None:
    """A reading whose driver call fails has returned: no problem later, however long the watch then waits."""
    clock = FakeClock()

    def broken() -> list[GpuMemory]:
        clock.step(1.0)
        raise RuntimeError("NVML went away")

    watch = MemoryWatch(broken, ScanTrigger(Policy()), 0.02, clock)
    watch.read_once()
    assert watch.problem(clock.now() + 3600.0) is None and watch.readings == 0


def test_a_reloaded_policy_retunes_the_watch_and_the_rate() -> None:
    """A reload's watch_interval, watch_rise and triggered_scans_per_second are in force from the next reading."""
    clock = FakeClock()
    calls = ScanCalls(Policy(triggered_scans_per_second=1), clock)
    watch = MemoryWatch(lambda: (), ScanTrigger(Policy()), 0.02, clock, calls=calls)
    new = Policy(watch_interval_s=0.1, watch_rise_bytes=GiB, watch_rise_ratio=None, triggered_scans_per_second=5)
    watch.retune(new)
    assert watch.interval_s == 0.1 and watch.trigger.policy is new
    for _ in range(5):
        calls.post(Trigger.MEMORY_RISE, clock.now())
        assert calls.wait(threading.Event(), clock.now() + 60.0) is Trigger.MEMORY_RISE, "the new burst of 5"
    calls.post(Trigger.MEMORY_RISE, clock.now())
    assert calls.held == 1
