"""A bounded background worker: where the agent's slow calls go, so the scan loop never waits on the network.

One daemon thread runs submitted tasks in order. `submit` never blocks: when the queue is full it says so, and
the caller counts the drop (an Event) or tries again next scan (a capacity patch). `stop` returns within its
timeout whatever a task is doing: a task stuck in a socket read on a frozen API server is abandoned (the thread is
a daemon; every API call has its own request timeout, so it ends by itself soon after).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Protocol

import structlog

Task = Callable[[], None]


class Runner(Protocol):
    """Where background work goes: a `Worker` thread, or `Inline` in tests."""

    stopping: threading.Event

    def submit(self, task: Task) -> bool: ...

    def pending(self) -> int: ...

    def stop(self, timeout_s: float = 1.0) -> bool: ...


class Worker:
    def __init__(self, name: str, max_queue: int, log: structlog.typing.FilteringBoundLogger | None = None) -> None:
        self.name = name
        self.stopping = threading.Event()  # tasks that retry wait on this, so stop() interrupts their back-off
        self.log = log if log is not None else structlog.get_logger("vramguard.worker")
        self._queue: queue.Queue[Task | None] = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, task: Task) -> bool:
        """Queue `task`; False (and nothing queued) when the queue is full or the worker is stopping."""
        if self.stopping.is_set():
            return False
        try:
            self._queue.put_nowait(task)
        except queue.Full:
            return False
        return True

    def pending(self) -> int:
        return self._queue.qsize()

    def stop(self, timeout_s: float = 1.0) -> bool:
        """Stop after the current task (queued ones are dropped); True when the thread ended within the timeout."""
        self.stopping.set()
        # Wakes the thread if it waits for work; if the queue is full it is busy, and sees `stopping` after its task.
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self.stopping.is_set():
            task = self._queue.get()
            if task is None or self.stopping.is_set():
                return
            try:
                task()
            except Exception as e:  # a task reports its own failures; this is the last line of defence
                self.log.exception("worker_task_failed", worker=self.name, error=repr(e))


class Inline:
    """Runs each task at once on the caller's thread: the deterministic stand-in for a `Worker` in unit tests."""

    def __init__(self) -> None:
        self.stopping = threading.Event()

    def submit(self, task: Task) -> bool:
        if self.stopping.is_set():
            return False
        task()
        return True

    def pending(self) -> int:
        return 0

    def stop(self, timeout_s: float = 1.0) -> bool:
        self.stopping.set()
        return True
