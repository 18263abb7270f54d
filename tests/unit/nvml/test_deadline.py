"""The deadline runner without NVML: a job's result or error handed back, and a closed runner refusing work. A hung
call abandoned in real time is tested in tests/node/test_deadline.py."""

from __future__ import annotations

import pytest

from vramguard.nvml.deadline import DeadlineRunner, Job


def test_a_job_returns_its_result() -> None:
    """A job that returns hands its result back, with the last call it made."""
    runner = DeadlineRunner(1.0, "test")
    job = Job("gpu0", lambda j: j.call("answer", lambda: 42))
    runner.run([job])
    assert (job.done, job.timed_out, job.result, job.error, job.current_call) == (True, False, 42, None, "answer")
    runner.close()


def test_a_job_that_raises_hands_the_error_back() -> None:
    """A job that raises hands the error back to the caller instead of killing the worker thread."""
    runner = DeadlineRunner(1.0, "test")

    def fail(job: Job) -> None:
        job.call("boom", lambda: 1 / 0)

    job = Job("gpu0", fail)
    runner.run([job])
    assert job.done and isinstance(job.error, ZeroDivisionError) and job.current_call == "boom"
    runner.close()


def test_a_closed_runner_refuses_work() -> None:
    """Work handed to a closed runner is refused at once, never queued."""
    runner = DeadlineRunner(1.0, "test")
    runner.close()
    with pytest.raises(RuntimeError, match="closed"):
        runner.run([Job("x", lambda j: None)])
