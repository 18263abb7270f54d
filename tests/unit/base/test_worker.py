"""The background worker: tasks run in order on its loop, a full queue refuses at once, a crashing task does not
stop the ones after it, and nothing is taken after the stop."""

from __future__ import annotations

from structlog.testing import capture_logs

from vramguard.base.worker import Inline, Worker
from vramguard_testbed.fakes import FakeClock


def test_tasks_run_in_order_and_a_crash_does_not_stop_the_next() -> None:
    """Each task runs once, in the order submitted; a task that raises is logged and the next one runs."""
    clock = FakeClock()
    worker = Worker("test", max_queue=4, clock=clock)
    ran: list[str] = []

    def crash() -> None:
        ran.append("crash")
        raise RuntimeError("boom")

    assert worker.submit(lambda: ran.append("first"))
    assert worker.submit(crash)
    assert worker.submit(lambda: ran.append("last"))
    assert worker.submit(lambda: worker.stop(clock.now()))
    with capture_logs() as logs:
        worker.loop.run()
    assert ran == ["first", "crash", "last"]
    assert [e["event"] for e in logs] == ["worker_task_failed"]
    assert clock.waits == []  # tasks follow each other at once


def test_a_full_queue_refuses_and_a_stopped_worker_takes_nothing() -> None:
    """`submit` never blocks: False when the queue is full, and False for good once the worker is stopping."""
    clock = FakeClock()
    worker = Worker("test", max_queue=1, clock=clock)
    assert worker.submit(lambda: None)
    assert not worker.submit(lambda: None)
    assert worker.pending() == 1
    worker.stop(clock.now())
    assert not worker.submit(lambda: None)


def test_a_task_queued_behind_the_stop_is_dropped() -> None:
    """The stop ends the loop after the current task: what is still queued never runs."""
    clock = FakeClock()
    worker = Worker("test", max_queue=4, clock=clock)
    ran: list[str] = []
    worker.submit(lambda: worker.stop(clock.now()))
    worker.submit(lambda: ran.append("late"))
    worker.loop.run()
    assert ran == []


def test_inline_runs_at_once_until_stopped() -> None:
    """The unit tests' stand-in runs each task on the caller's thread, and refuses after its stop."""
    inline, ran = Inline(), list[int]()
    assert inline.submit(lambda: ran.append(1))
    inline.stop(0.0)
    assert not inline.submit(lambda: ran.append(2))
    assert ran == [1]
