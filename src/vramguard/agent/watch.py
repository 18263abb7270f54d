"""The watch between scans: when to scan before the next poll.

A thread of its own (`MemoryWatch`) reads each GPU's memory counters (`GpuSampler.memory`: one NVML call a GPU,
microseconds) every `Policy.watch_interval_s`; the process lists a scan needs cost a thousand times more, so they
stay in scans. An allocation shows in the counter as soon as it returns, so an offender is scanned, and acted on,
within a watch interval of crossing its quota instead of within a poll. Which readings call for a scan is decided
by `ScanTrigger` (no I/O): a change since the last scan in either direction, a rise since the lowest reading, or a
GPU entering pressure. A pod update that names what the last scan could not attribute for want of it in the pod
cache calls for one too. Every call goes through `ScanCalls`, held to `triggered_scans_per_second` so that a pod
churning allocations within its quota cannot make the agent a busy loop. The regular poll goes on as it is
(docs/architecture.md "The watch between scans").
"""

from __future__ import annotations

import enum
import math
import threading
from collections.abc import Callable, Iterable, Mapping

import structlog

from vramguard.base.background import BackgroundLoop
from vramguard.base.backoff import TokenBucket
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.logs import FailureRun
from vramguard.core.attribute import NOTHING_AWAITED, Awaited
from vramguard.core.pod import PodInfo
from vramguard.core.policy import Policy
from vramguard.core.sample import GpuDevice, GpuMemory

# A reading still not back after this long is stuck in the driver, not slow: 2.5 times the deadline the scans give
# one NVML call (`nvml.sampler.DEFAULT_CALL_TIMEOUT_S`, 2 s), while a reading is one call a GPU of microseconds.
WATCH_STUCK_S = 5.0


class Trigger(enum.Enum):
    MEMORY_RISE = "memory-rise"  # used memory rose by more than `Policy.watch_rise_for` since the lowest reading
    MEMORY_FALL = "memory-fall"  # used memory fell by as much since the last scan: a free may hide an allocation
    PRESSURE = "pressure"  # the GPU's free memory fell into its pressure band
    POD_LEARNED = "pod-learned"  # a pod update named a pod or container the last scan could not attribute


class _Baseline:
    """What the last scan saw of the whole, healthy GPUs, made whole by `ScanTrigger.scanned` and never changed."""

    __slots__ = ("pressured", "used")

    def __init__(self, used: dict[int, int], pressured: frozenset[int]) -> None:
        self.used = used  # GPU index → used bytes the scan saw
        self.pressured = pressured  # GPUs under pressure at the scan


class ScanTrigger:
    """Tells when a reading calls for a scan (`check`, on the watch's thread), given what the last scan saw
    (`scanned`, on the scan loop's).

    No lock: `scanned` publishes its baseline as one new object, and `check` reads that reference once a reading;
    the lowest readings since the scan are the watch thread's own, started afresh when it finds a new baseline.
    """

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._baseline = _Baseline({}, frozenset())
        # The watch thread's own, below: the baseline its lowest readings count from, and those readings.
        self._seen: _Baseline | None = None
        self._lowest: dict[int, int] = {}  # GPU index → the lowest used bytes read since the last scan
        self._rise: tuple[Policy, int, int] | None = None  # (policy, total bytes, its watch_rise), the last asked

    def scanned(self, devices: Iterable[GpuDevice]) -> None:
        """A scan sampled these devices: its readings are the baseline from now on (what rose after the sample
        still shows as a rise, and so does memory freed and taken again: churn within a quota costs at most the
        rate limit's scans)."""
        whole = [d for d in devices if d.mig_index is None and d.healthy]
        policy = self.policy
        self._baseline = _Baseline(
            {d.index: d.used_bytes for d in whole}, frozenset(d.index for d in whole if policy.under_pressure(d))
        )

    def check(self, readings: Iterable[GpuMemory]) -> Trigger | None:
        """Why these readings call for a scan now, or None."""
        baseline, policy = self._baseline, self.policy
        if baseline is not self._seen:
            self._seen, self._lowest = baseline, dict(baseline.used)
        lowest = self._lowest
        for reading in readings:
            used = reading.used_bytes
            scanned = baseline.used.get(reading.index)
            if scanned is None:
                continue  # no scan has seen this GPU healthy: the poll scans it
            # Memory freed since the scan (a process killed or gone): a rise is counted from the lowest reading, or
            # an allocation up to the freed amount would go unseen until the poll.
            low = lowest[reading.index]
            if used < low:
                lowest[reading.index] = low = used
            threshold = self._rise_for(policy, reading.total_bytes)
            if used - low > threshold:
                return Trigger.MEMORY_RISE
            # Freed and taken within one interval (one process exits as another allocates) shows only as the net
            # change: any change past the threshold scans, a fall as well as a rise.
            if scanned - used > threshold:
                return Trigger.MEMORY_FALL
            if reading.index not in baseline.pressured and policy.under_pressure(reading):
                return Trigger.PRESSURE
        return None

    def _rise_for(self, policy: Policy, total_bytes: int) -> int:
        """`policy.watch_rise_for(total_bytes)`, asked again only when the policy or the GPU's size changed."""
        rise = self._rise
        if rise is None or rise[0] is not policy or rise[1] != total_bytes:
            rise = self._rise = (policy, total_bytes, policy.watch_rise_for(total_bytes))
        return rise[2]


class ScanCalls:
    """The scans called for before the poll, from any thread, and taken by the scan loop (`wait`).

    The watch's readings post them (`post`); so does a pod source whose update names what the last scan could not
    attribute for want of it in the pod cache (`pods_updated`, against what the agent published: `awaiting`). Each
    call takes a token of `triggered_scans_per_second` (a burst of as many); one the rate holds is answered when
    the next token is due, and each such wait is counted once (`count_held`). Built before the pod sources and the
    watch, and handed to each.
    """

    def __init__(
        self, policy: Policy, clock: Clock = SYSTEM_CLOCK, count_held: Callable[[], None] = lambda: None
    ) -> None:
        rate = policy.triggered_scans_per_second
        self.bucket = TokenBucket(max(1, int(rate)), rate * 60.0, clock)
        self.clock = clock
        self.count_held = count_held
        self.held = 0  # calls held back by the rate limit (once per wait), for tests and the metric
        self._lock = threading.Lock()  # everything below is read and written under it
        self._posted = threading.Event()  # a call is waiting, or the waiter's stop was set: the waiter looks
        self._call: tuple[Trigger, float] | None = None  # admitted, with when what it saw was seen (on the clock)
        self._queued: tuple[Trigger, float] | None = None  # waiting for a token
        self._counted = False  # the wait for a token since the last scan was counted
        self._awaited = NOTHING_AWAITED
        self._waiter_stop: threading.Event | None = None

    def retune(self, policy: Policy) -> None:
        """Take a reloaded policy's `triggered_scans_per_second` (a full bucket of the new burst)."""
        rate = policy.triggered_scans_per_second
        with self._lock:
            self.bucket = TokenBucket(max(1, int(rate)), rate * 60.0, self.clock)

    def post(self, reason: Trigger, at: float) -> None:
        """Call for a scan for `reason`, seen at `at`: at once when the rate allows, else when it next does. A call
        posted while another waits rides along with it."""
        with self._lock:
            if self._call is not None:
                self._call = (self._call[0], max(self._call[1], at))
                return
            if self._queued is None and self.bucket.take():
                self._call = (reason, at)
                self._posted.set()
                return
            if self._queued is None:
                self._posted.set()  # the waiter times its wait to the next token
            self._queued = (self._queued[0] if self._queued is not None else reason, at)
            counted, self._counted = self._counted, True
        if not counted:
            self.held += 1
            self.count_held()

    def awaiting(self, awaited: Awaited, pods: Callable[[], Mapping[str, PodInfo]]) -> None:
        """After a scan: what it could not attribute for want of the pod cache, and the pod cache now (`pods`, read
        after the record, so that an update between the scan's read and this one is not missed)."""
        with self._lock:
            self._awaited = awaited
        if awaited and awaited.named_in(pods()):
            self._learned(awaited)

    def pods_updated(self, pods: Iterable[PodInfo]) -> None:
        """A pod source took these pod versions in (after it serves them): a scan when one names something the
        last scan awaited."""
        with self._lock:
            awaited = self._awaited
        if awaited and any(awaited.named_by(p) for p in pods):
            self._learned(awaited)

    def _learned(self, awaited: Awaited) -> None:
        with self._lock:
            if self._awaited is awaited:  # once: the scan called for publishes what is still awaited
                self._awaited = NOTHING_AWAITED
        self.post(Trigger.POD_LEARNED, self.clock.now())

    def wait(self, stop: threading.Event, until: float) -> Trigger | None:
        """Block until a call's reason, `until` (on the clock), or `stop` (then None, once someone wakes the
        waiter: `waiter_stopped`)."""
        with self._lock:
            self._waiter_stop = stop
        while not stop.is_set():
            with self._lock:
                self._posted.clear()
                reason = self._take()
                token_s = self._token_due_s()
            if reason is not None:
                return reason
            left_s = until - self.clock.now()
            if left_s <= 0:
                return None
            self.clock.wait(self._posted, min(left_s, token_s))
        return None

    def _take(self) -> Trigger | None:
        if self._call is not None:
            reason, self._call = self._call[0], None
            return reason
        if self._queued is not None and self.bucket.take():
            reason, self._queued = self._queued[0], None
            return reason
        return None

    def _token_due_s(self) -> float:
        """How long until the queued call's token is due (`_take` has just refilled the bucket)."""
        if self._queued is None:
            return math.inf
        return max(0.0, 1 - self.bucket.tokens) / self.bucket.rate_per_s

    def scanned(self, sampled_at: float) -> None:
        """A scan sampled from `sampled_at` on: calls for what was seen before are stale (one seen since stands:
        the sample may have missed it), and a new wait for the rate is counted again."""
        with self._lock:
            if self._call is not None and self._call[1] <= sampled_at:
                self._call = None
            if self._queued is not None and self._queued[1] <= sampled_at:
                self._queued = None
            self._counted = False

    def waiter_stopped(self) -> bool:
        """Wake the waiter when its stop was set (a stop set by a signal handler wakes nothing); True then. Asked
        at every reading, so without the lock: `_waiter_stop` is one reference, set once by the waiter."""
        stop = self._waiter_stop
        if stop is not None and stop.is_set():
            self._posted.set()
            return True
        return False


class MemoryWatch:
    """`read()` (the GPUs' memory counters) every `interval_s` on a thread of its own, from `start()` to
    `stop(deadline)`, posting to `calls` what the readings call for; the scan loop waits on them (`wait`).

    The reads run on this thread alone, never on the scan loop's: a hung driver leaves one stuck thread here (the
    sampler's deadline marks the GPU unhealthy in the next scan, `problem` says the watch is stuck), and the poll
    goes on. Each reading costs one wake-up of this thread and no more than the counters' read and the comparison:
    no hand-off, no lock (what another thread reads of it, `_reading_since`, is one reference published whole);
    the scan loop wakes only when a scan is called for.
    """

    def __init__(
        self,
        read: Callable[[], Iterable[GpuMemory]],
        trigger: ScanTrigger,
        interval_s: float,
        clock: Clock = SYSTEM_CLOCK,
        log: structlog.typing.FilteringBoundLogger | None = None,
        calls: ScanCalls | None = None,
    ) -> None:
        """`calls`: where scans are called for (shared with the pod sources); by default one of the watch's own."""
        self.read = read
        self.trigger = trigger
        self.interval_s = interval_s
        self.clock = clock
        self.log = log if log is not None else structlog.get_logger(__name__)
        self.calls = calls if calls is not None else ScanCalls(trigger.policy, clock)
        self.readings = 0  # for tests and the benchmark: how often the counters were read
        self._failures = FailureRun()
        # When the reading under way started, None between readings: written by this thread alone, read by the
        # probes and the scan loop (`problem`), each a single reference.
        self._reading_since: float | None = None
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
        """Block until a scan is called for (its reason), `until` (on the clock), or `stop` (then None, within an
        interval of it being set)."""
        return self.calls.wait(stop, until)

    def scanned(self, devices: Iterable[GpuDevice], sampled_at: float) -> None:
        """A scan read the GPUs (`devices`) from `sampled_at` on: the readings are compared with these from now on,
        and a call for what was seen before the sample is stale."""
        self.trigger.scanned(devices)
        self.calls.scanned(sampled_at)

    def awaiting(self, awaited: Awaited, pods: Callable[[], Mapping[str, PodInfo]]) -> None:
        """What the last scan could not attribute for want of the pod cache: a pod update naming it calls for a
        scan (`ScanCalls.awaiting`)."""
        self.calls.awaiting(awaited, pods)

    def retune(self, policy: Policy) -> None:
        """Take a reloaded policy (its `watch_interval_s` > 0): the interval from the next pause on, the thresholds
        from the next reading, the rate from the next call."""
        self.trigger.policy = policy
        self.interval_s = policy.watch_interval_s
        self.calls.retune(policy)

    def problem(self, now: float) -> str | None:
        """Why the watch no longer calls for scans (a reading stuck in the driver for `WATCH_STUCK_S`), or None."""
        since = self._reading_since
        if since is None or now - since < WATCH_STUCK_S:
            return None
        return f"memory watch: a reading has not returned for {now - since:.1f} s; scans at the poll only"

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
        if self.calls.waiter_stopped():
            return
        self._reading_since = read_at = self.clock.now()
        try:
            readings = self.read()
        except Exception as e:  # a reading is a hint: the next scan says what is wrong with the GPU
            self._reading_since = None
            if self._failures.failed(type(e).__name__):
                self.log.warning("watch_read_failed", error=repr(e))
            return
        self._reading_since = None
        if self._failures.error is not None:
            self._failures.ok()
        self.readings += 1
        reason = self.trigger.check(readings)
        if reason is not None:
            self.calls.post(reason, read_at)
