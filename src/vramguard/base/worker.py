"""A bounded background worker: where the agent's slow calls go, so the scan loop never waits on the network.

One daemon thread runs submitted tasks in order; `submit` never blocks (a full queue says so, and the caller
counts the drop or tries again next scan). `Inline` runs each task on the caller's thread, for unit tests.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Protocol

import structlog

from vramguard.base.background import BackgroundLoop
from vramguard.base.clock import SYSTEM_CLOCK, Clock

Task = Callable[[], None]


class Runner(Protocol):
    """Where background work goes: a `Worker` thread, or `Inline` in tests. A `lifecycle.Service`."""

    def start(self) -> None: ...

    def submit(self, task: Task) -> bool: ...

    def pending(self) -> int: ...

    def stop(self, deadline: float) -> None: ...


class Worker:
    """Tasks submitted before `start()` wait in the queue; `stop(deadline)` drops the queued ones."""

    def __init__(
        self,
        name: str,
        max_queue: int,
        log: structlog.typing.FilteringBoundLogger | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.name = name
        self.clock = clock
        self.log = log if log is not None else structlog.get_logger(__name__)
        self._queue: queue.Queue[Task | None] = queue.Queue(maxsize=max_queue)
        self.loop = BackgroundLoop(name, self._step, clock=clock, wake=self._wake, log=self.log)

    def start(self) -> None:
        self.loop.start()

    def submit(self, task: Task) -> bool:
        """Queue `task`; False (and nothing queued) when the queue is full or the worker is stopping."""
        if self.loop.stopping.is_set():
            return False
        try:
            self._queue.put_nowait(task)
        except queue.Full:
            return False
        return True

    def pending(self) -> int:
        return self._queue.qsize()

    def stop(self, deadline: float) -> None:
        """Stop after the current task, waiting for it until `deadline` at most. A task stuck in a socket read on a
        frozen API server is abandoned there: the thread is a daemon, and every API call has its own request
        timeout, so it ends by itself soon after."""
        self.loop.stop(deadline)

    def _wake(self) -> None:
        # Ends the thread's wait for work; if the queue is full it is busy, and sees the stop after its task.
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)

    def _step(self) -> float:
        """Run the next task, waiting for one."""
        task = self._queue.get()
        if task is None or self.loop.stopping.is_set():
            return 0.0
        try:
            task()
        except Exception as e:  # a task reports its own failures; this is the last line of defence
            self.log.exception("worker_task_failed", worker=self.name, error=repr(e))
        return 0.0


class Inline:
    """Runs each task at once on the caller's thread: the deterministic stand-in for a `Worker` in unit tests."""

    def __init__(self) -> None:
        self._stopping = threading.Event()

    def start(self) -> None:
        pass

    def submit(self, task: Task) -> bool:
        if self._stopping.is_set():
            return False
        task()
        return True

    def pending(self) -> int:
        return 0

    def stop(self, deadline: float) -> None:
        self._stopping.set()
