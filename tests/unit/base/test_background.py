"""The background loop: rounds paced by what the step asks for, a crash retried after a back-off and logged once per
run, the stop honoured between rounds and through `wake`, `on_exit` after the last round."""

from __future__ import annotations

import threading

import pytest
from structlog.testing import capture_logs

from vramguard.base.background import BackgroundLoop
from vramguard.base.backoff import Backoff
from vramguard_testbed.fakes import FakeClock


class Script:
    """A step that plays a list of answers (a float to wait, or an exception to raise), then stops its loop."""

    def __init__(self, answers: list[float | Exception]) -> None:
        self.answers = list(answers)
        self.rounds = 0
        self.loop: BackgroundLoop | None = None

    def __call__(self) -> float:
        self.rounds += 1
        answer = self.answers.pop(0)
        if not self.answers and self.loop is not None:
            self.loop.stopping.set()
        if isinstance(answer, Exception):
            raise answer
        return answer


def scripted(answers: list[float | Exception], clock: FakeClock, **kwargs: object) -> tuple[BackgroundLoop, Script]:
    script = Script(answers)
    loop = BackgroundLoop("test", script, clock=clock, backoff=Backoff(1.0, 4.0, jitter=0.0), **kwargs)  # type: ignore[arg-type]
    script.loop = loop
    return loop, script


@pytest.mark.parametrize(
    ("answers", "waits"),
    [
        pytest.param([2.0, 3.0, 1.0], [2.0, 3.0], id="waits-what-each-round-asks"),
        pytest.param([0.0, 0.0, 5.0], [], id="zero-runs-the-next-round-at-once"),
        pytest.param(
            [RuntimeError("a"), RuntimeError("a"), RuntimeError("a"), 1.0], [1.0, 2.0, 4.0], id="crash-backs-off"
        ),
        pytest.param(
            [RuntimeError("a"), 2.0, RuntimeError("a"), 1.0], [1.0, 2.0, 1.0], id="a-good-round-resets-back-off"
        ),
        pytest.param([RuntimeError("a")] * 5 + [1.0], [1.0, 2.0, 4.0, 4.0, 4.0], id="back-off-is-capped"),
    ],
)
def test_rounds_are_paced_by_the_step_and_the_back_off(answers: list[float | Exception], waits: list[float]) -> None:
    """Each round waits what its step returned; a crash waits the back-off, which a good round resets."""
    clock = FakeClock()
    loop, script = scripted(answers, clock)
    with capture_logs():  # the lines are the next test's subject; captured, no traceback is rendered
        loop.run()
    assert script.rounds == len(answers)
    assert clock.waits == waits


def test_a_crash_is_logged_once_per_run_of_the_same_error() -> None:
    """Three crashes in a row with one error give one line, a new error another, recovery one more."""
    loop, _ = scripted([RuntimeError("a"), RuntimeError("a"), RuntimeError("b"), 1.0, 1.0], FakeClock())
    with capture_logs() as logs:
        loop.run()
    assert [(e["event"], e.get("error")) for e in logs] == [
        ("loop_step_failed", "RuntimeError('a')"),
        ("loop_step_failed", "RuntimeError('b')"),
        ("loop_step_recovered", None),
    ]


def test_a_stop_during_a_wait_ends_the_loop_before_another_round() -> None:
    """The stop ends the wait between rounds, and no round runs after it; on_exit runs once."""
    clock = FakeClock()
    exits: list[int] = []
    script = Script([5.0] * 10)
    loop = BackgroundLoop("test", script, clock=clock, on_exit=lambda: exits.append(script.rounds))
    clock.on_wait = lambda: loop.stopping.set() if script.rounds == 3 else None
    loop.run()
    assert (script.rounds, clock.waits, exits) == (3, [5.0, 5.0, 5.0], [3])


def test_on_exit_runs_after_a_step_that_raises_on_the_way_out() -> None:
    """What the thread owned is released even when its last round crashed."""
    exits: list[bool] = []
    loop, _ = scripted([RuntimeError("x")], FakeClock(), on_exit=lambda: exits.append(True))
    with capture_logs():
        loop.run()
    assert exits == [True]


class BlockedStep:
    """A step blocked on its own wait until `gate` is set; `entered` is set once it runs."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()

    def __call__(self) -> float:
        self.entered.set()
        self.gate.wait()
        return 0.0


def test_stop_wakes_a_blocked_step_and_joins_the_thread() -> None:
    """A step blocked on its own wait is ended by `wake`; stop returns True once the thread has ended."""
    step = BlockedStep()
    loop = BackgroundLoop("blocked", step, wake=step.gate.set)
    loop.start()
    assert step.entered.wait(10)
    assert loop.running
    assert loop.stop(deadline=loop.clock.now() + 10)
    assert not loop.running


def test_a_stuck_step_is_abandoned_at_the_deadline() -> None:
    """A step that ignores its wake is left behind at the deadline: stop returns False instead of waiting."""
    step = BlockedStep()
    loop = BackgroundLoop("stuck", step)
    loop.start()
    assert step.entered.wait(10)
    assert loop.stop(deadline=loop.clock.now()) is False
    assert loop.running
    step.gate.set()
    assert loop.stop(deadline=loop.clock.now() + 10)


def test_a_loop_never_started_stops_at_once_and_starts_once() -> None:
    """Stopping an idle loop is a no-op; starting one twice is a bug, said at once."""
    loop = BackgroundLoop("idle", lambda: 1.0)
    assert loop.stop(deadline=0.0)
    loop2 = BackgroundLoop("twice", lambda: 1.0)
    loop2.start()
    with pytest.raises(RuntimeError, match="twice"):
        loop2.start()
    assert loop2.stop(deadline=loop2.clock.now() + 10)
