"""Blocking calls under a deadline, on a persistent worker thread that can be abandoned.

`DeadlineRunner.run(jobs)` returns once every job finished or ran past the deadline (on its `Clock`). A late
job's thread cannot be stopped (Python cannot interrupt a thread blocked in C): it is abandoned, a fresh thread
takes the jobs still queued, and the job's key stays `stuck(key)` until the late call returns. Nothing here
knows NVML.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from vramguard.base.clock import SYSTEM_CLOCK, Clock


class Job:
    """One unit of work under a deadline (the sampler makes one per GPU per scan: all of its calls)."""

    __slots__ = ("current_call", "done", "error", "fn", "key", "result", "started_at", "timed_out", "worker")

    def __init__(self, key: Hashable, fn: Callable[[Job], Any]) -> None:
        self.key = key
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None
        self.started_at: float | None = None
        self.current_call = ""  # the call running now, for the message when it runs late
        self.done = False
        self.timed_out = False
        self.worker: _Worker | None = None

    def begin(self, name: str) -> None:
        """Notes the call about to run; stops an abandoned job at its next call once a late one returned."""
        if self.timed_out:
            raise Abandoned
        self.current_call = name

    def call(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.begin(name)
        return fn(*args, **kwargs)


class Abandoned(Exception):
    """Raised inside a job whose caller gave up on it: its results would be stale, its calls wasted."""


class _Worker:
    __slots__ = ("abandoned", "thread")

    def __init__(self) -> None:
        self.abandoned = False
        self.thread: threading.Thread | None = None


class DeadlineRunner:
    """Runs jobs one after another on a persistent worker thread, each under a deadline.

    One thread rather than a thread per call, and one job per GPU rather than one per call, keep a warm scan to
    a single hand-off. A job past its deadline is abandoned together with its thread (Python cannot stop a
    thread blocked in C); a fresh thread takes the jobs still queued, and the job's key stays in `stuck` until
    the abandoned call returns, so that the caller does not queue more work behind a hung device.
    """

    def __init__(self, timeout_s: float, name: str, clock: Clock = SYSTEM_CLOCK) -> None:
        self._timeout_s = timeout_s
        self.clock = clock
        self._name = name
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # workers wait here for jobs
        self._done = threading.Condition(self._lock)  # the caller waits here for results
        self._queue: deque[Job] = deque()
        self._worker: _Worker | None = None
        self._stuck: dict[Hashable, Job] = {}
        # The keys of `_stuck`, published whole on each change: what a reader that takes no lock looks at (the
        # memory watch, a hundred times a second, `NvmlSampler.memory`).
        self.stuck_keys: frozenset[Hashable] = frozenset()
        self._closed = False
        self._threads_started = 0

    def stuck(self, key: Hashable) -> Job | None:
        with self._lock:
            return self._stuck.get(key)

    @property
    def threads_started(self) -> int:
        return self._threads_started

    def run(self, jobs: Sequence[Job]) -> None:
        """Returns once every job finished or was abandoned (`timed_out`)."""
        if not jobs:
            return
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self._name}: the deadline runner is closed")
            self._queue.extend(jobs)
            self._ensure_worker()
            self._work.notify()
            while True:
                now = self.clock.now()
                wait_s = self._timeout_s
                for job in jobs:
                    if job.done or job.started_at is None:
                        continue
                    left_s = job.started_at + self._timeout_s - now
                    if left_s <= 0:
                        self._abandon(job)
                    else:
                        wait_s = min(wait_s, left_s)
                if all(job.done for job in jobs):
                    return
                self._done.wait(wait_s)  # at most `timeout_s` of real time: the clock is read again then

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._queue.clear()
            self._work.notify_all()

    def _ensure_worker(self) -> None:
        if self._worker is None:
            worker = _Worker()
            self._threads_started += 1
            worker.thread = threading.Thread(
                target=self._loop, args=(worker,), name=f"{self._name}-{self._threads_started}", daemon=True
            )
            self._worker = worker
            worker.thread.start()

    def _abandon(self, job: Job) -> None:
        job.done = job.timed_out = True
        self._stuck[job.key] = job
        self.stuck_keys = frozenset(self._stuck)
        worker = job.worker
        if worker is not None:
            worker.abandoned = True
            if self._worker is worker:
                self._worker = None
        if self._queue:
            self._ensure_worker()
            self._work.notify()

    def _loop(self, me: _Worker) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed and not me.abandoned:
                    self._work.wait()
                if self._closed or me.abandoned:
                    return
                job = self._queue.popleft()
                job.worker = me
                job.started_at = self.clock.now()
            try:
                job.result = job.fn(job)
            except Exception as e:  # handed to the caller (the sampler reports the GPU unhealthy)
                job.error = e
            with self._lock:
                if me.abandoned:
                    # The late call returned: the device may be tried again. Its result is stale; a fresh thread
                    # already serves the queue.
                    self._stuck.pop(job.key, None)
                    self.stuck_keys = frozenset(self._stuck)
                    return
                job.done = True
                if not self._queue:
                    self._done.notify_all()
