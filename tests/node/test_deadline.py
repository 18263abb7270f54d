"""The deadline runner in real time: a call that hangs is abandoned at its deadline, with its thread, and the GPU
it was for is tried again once the late call returns."""

from __future__ import annotations

import threading
import time

from vramguard.nvml.deadline import DeadlineRunner, Job
from vramguard_testbed.waiting import wait_until


def test_a_hung_job_is_abandoned_and_the_next_run_gets_a_fresh_thread() -> None:
    """Past the deadline: the job is timed out and its key stuck (also in `stuck_keys`, what a reader without the
    lock sees) until the late call returns; the other jobs run on a new thread meanwhile."""
    release = threading.Event()
    runner = DeadlineRunner(0.2, "test")
    hung = Job("gpu0", lambda j: j.call("nvmlHang", release.wait, 10))
    other = Job("gpu1", lambda j: j.call("fine", lambda: "ok"))
    started = time.monotonic()
    runner.run([hung, other])
    assert time.monotonic() - started < 2.0
    assert hung.timed_out and hung.current_call == "nvmlHang"
    assert other.done and not other.timed_out and other.result == "ok"
    assert runner.stuck("gpu0") is hung and runner.stuck("gpu1") is None and runner.stuck_keys == {"gpu0"}
    assert runner.threads_started == 2
    release.set()
    # Once the late call returned, the device may be tried again.
    wait_until(lambda: runner.stuck("gpu0") is None, what="the late call to return and free the device")
    assert runner.stuck_keys == frozenset()
    again = Job("gpu0", lambda j: j.call("fine", lambda: "back"))
    runner.run([again])
    assert again.result == "back"
    runner.close()
