"""The watch between scans: when to scan before the next poll.

A thread of its own (`MemoryWatch`) reads each GPU's memory counters (`GpuSampler.memory`: one NVML call a GPU,
microseconds) every `Policy.watch_interval_s`; the process lists a scan needs cost a thousand times more, so they
stay in scans. An allocation shows in the counter as soon as it returns, so an offender is scanned, and acted on,
within a watch interval of crossing its quota instead of within a poll. Which readings call for a scan is decided
by `ScanTrigger` (no I/O, the clock injected): a rise since the last scan, or a GPU entering pressure, held to
`triggered_scans_per_second` so that a pod churning allocations within its quota cannot make the agent a busy loop.
The regular poll goes on as it is (docs/design.md "The watch between scans").
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterable

import structlog

from vramguard.base.background import BackgroundLoop
from vramguard.base.backoff import TokenBucket
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.logs import FailureRun
from vramguard.core.model import GpuDevice, GpuMemory, Policy


class Trigger(enum.Enum):
    MEMORY_RISE = "memory-rise"  # used memory rose by more than `Policy.watch_rise_for` since the last scan
    PRESSURE = "pressure"  # the GPU's free memory fell into its pressure band


class ScanTrigger:
    """Tells when a reading calls for a scan (`check`, on the watch's thread), given what the last scan saw
    (`scanned`, on the scan loop's)."""

    def __init__(self, policy: Policy, clock: Clock = SYSTEM_CLOCK) -> None:
        self.policy = policy
        rate = policy.triggered_scans_per_second
        self.bucket = TokenBucket(max(1, int(rate)), rate * 60.0, clock)
        self._baseline: dict[int, int] = {}  # GPU index → used bytes the last scan saw, or less read since
        self._pressured: set[int] = set()  # GPUs under pressure at the last scan
        self._held = False  # a trigger is waiting for the rate limit since the last scan
        self.held = 0  # triggers held back by the rate limit (once per wait), for the metric
        self._lock = threading.Lock()  # `scanned` and `check` run on two threads

    def scanned(self, devices: Iterable[GpuDevice]) -> None:
        """A scan sampled these devices: its readings are the baseline from now on (what rose after the sample
        still shows as a rise, and so does memory freed and taken again: churn within a quota costs at most the
        rate limit's scans)."""
        whole = [d for d in devices if d.mig_index is None and d.healthy]
        with self._lock:
            self._baseline = {d.index: d.used_bytes for d in whole}
            self._pressured = {d.index for d in whole if self.policy.under_pressure(d)}
            self._held = False

    def check(self, readings: Iterable[GpuMemory]) -> Trigger | None:
        """Why these readings call for a scan now, or None: not (or not yet, when the rate limit holds it)."""
        with self._lock:
            return self._check(readings)

    def _check(self, readings: Iterable[GpuMemory]) -> Trigger | None:
        for reading in readings:
            reason = self._reason(reading)
            if reason is None:
                continue
            if not self.bucket.take():
                self.held += not self._held
                self._held = True
                return None
            return reason
        return None

    def _reason(self, reading: GpuMemory) -> Trigger | None:
        baseline = self._baseline.get(reading.index)
        if baseline is None:
            return None  # no scan has seen this GPU healthy: the poll scans it
        if reading.used_bytes < baseline:
            # Memory freed since the scan (a process killed or gone): a rise is counted from the lowest reading,
            # or an allocation up to the freed amount would go unseen until the poll.
            self._baseline[reading.index] = baseline = reading.used_bytes
        if reading.used_bytes - baseline > self.policy.watch_rise_for(reading.total_bytes):
            return Trigger.MEMORY_RISE
        if reading.index not in self._pressured and self.policy.under_pressure(reading):
            return Trigger.PRESSURE
        return None


class MemoryWatch:
    """`read()` (the GPUs' memory counters) every `interval_s` on a thread of its own, from `start()` to
    `stop(deadline)`; the scan loop waits for it (`wait`).

    The reads run on this thread alone, never on the scan loop's: a hung driver leaves one stuck thread here (the
    sampler's deadline marks the GPU unhealthy in the next scan), and the poll goes on. Each reading costs one
    wake-up of this thread; the scan loop wakes only when a scan is called for.
    """

    def __init__(
        self,
        read: Callable[[], Iterable[GpuMemory]],
        trigger: ScanTrigger,
        interval_s: float,
        clock: Clock = SYSTEM_CLOCK,
        log: structlog.typing.FilteringBoundLogger | None = None,
        count_held: Callable[[], None] = lambda: None,
    ) -> None:
        """`count_held` hears each time a scan called for waits for the rate limit."""
        self.read = read
        self.trigger = trigger
        self.interval_s = interval_s
        self.clock = clock
        self.log = log if log is not None else structlog.get_logger("vramguard.agent.watch")
        self.count_held = count_held
        self.readings = 0  # for tests and the benchmark: how often the counters were read
        self._posted = threading.Event()  # a reason is waiting, or the waiter's stop was set
        self._post = threading.Lock()  # the reason and its reading's time, posted and taken whole
        self._reason: Trigger | None = None
        self._read_at = float("-inf")  # when the reading behind the posted reason was taken
        self._waiter_stop: threading.Event | None = None
        self._failures = FailureRun()
        # Held until the stop: the pause between readings is a timed acquire of it, real time (the readings poll
        # hardware), and at a hundred a second the cheapest stoppable wait there is (a third of an Event's).
        self._paused = threading.Lock()
        self._paused.acquire()
        self.loop = BackgroundLoop("vramguard-watch", self._step, clock=clock, wake=self._wake, log=self.log)

    def start(self) -> None:
        self.loop.start()

    def stop(self, deadline: float) -> None:
        """Stop reading; a read stuck in the driver is abandoned (the thread is a daemon)."""
        self.loop.stop(deadline)

    def wait(self, stop: threading.Event, until: float) -> Trigger | None:
        """Block until a reading calls for a scan (its reason), `until` (on the clock), or `stop` (then None, within
        an interval of it being set)."""
        self._waiter_stop = stop
        while not stop.is_set() and (left_s := until - self.clock.now()) > 0:
            if self.clock.wait(self._posted, left_s):
                with self._post:
                    self._posted.clear()
                    reason, self._reason = self._reason, None
                if reason is not None:
                    return reason
        return None

    def scanned(self, devices: Iterable[GpuDevice], sampled_at: float) -> None:
        """A scan read the GPUs (`devices`) from `sampled_at` on: the readings are compared with these from now on,
        and a reason posted from a reading before the sample is stale (one read since stands: the sample may have
        missed what it saw)."""
        self.trigger.scanned(devices)
        with self._post:
            if self._read_at <= sampled_at:
                self._posted.clear()
                self._reason = None

    def _wake(self) -> None:
        if self._paused.locked():
            self._paused.release()

    def _step(self) -> float:
        """Pause `interval_s`, then read; the stop ends the pause."""
        if not self._paused.acquire(True, self.interval_s):
            self.read_once()
        return 0.0

    def read_once(self) -> None:
        """One reading: read the counters and post the reason when they call for a scan (and wake the waiter
        whose stop was set)."""
        waiter_stop = self._waiter_stop
        if waiter_stop is not None and waiter_stop.is_set():
            self._posted.set()
            return
        read_at = self.clock.now()
        try:
            readings = tuple(self.read())
        except Exception as e:  # a reading is a hint: the next scan says what is wrong with the GPU
            if self._failures.failed(type(e).__name__):
                self.log.warning("watch_read_failed", error=repr(e))
            return
        self._failures.ok()
        self.readings += 1
        held = self.trigger.held
        reason = self.trigger.check(readings)
        if self.trigger.held != held:
            self.count_held()
        if reason is not None:
            with self._post:
                self._reason, self._read_at = reason, read_at
                self._posted.set()
