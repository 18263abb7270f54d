"""Calls made off the scan: each ends once (answered, or given up at its timeout), a call given up on before the
worker began it is never made, one given up on after still reports its answer as late, and nothing waits."""

from __future__ import annotations

import pytest

from vramguard.base.offscan import Fate, OffScanCalls
from vramguard.base.worker import Inline, Runner
from vramguard_testbed.fakes import HeldRunner

ANSWERED, GIVEN_UP, LATE, NOT_MADE = Fate.ANSWERED, Fate.GIVEN_UP, Fate.LATE, Fate.NOT_MADE
TIMEOUT_S = 15.0

# A step of a scenario: a float sets the clock; "run" lets the worker run what is queued; "collect" records the
# fates that collect returns.
Step = float | str


class Scenario:
    """One call submitted at 0 on a held runner, and the steps played around it; `during` is played while the call
    is being made (on the worker, before it answers)."""

    def __init__(self, during: list[Step]) -> None:
        self.now = 0.0
        self.runner = HeldRunner()
        self.calls: OffScanCalls[str, str] = OffScanCalls(self.runner, TIMEOUT_S)
        self.fates: list[list[Fate]] = []
        self.made = 0
        self.during = during

    def call(self) -> str:
        self.made += 1
        self.play(self.during)
        return "answer"

    def play(self, steps: list[Step]) -> None:
        for step in steps:
            if isinstance(step, float):
                self.now = step
            elif step == "run":
                self.runner.run_all()
            else:
                assert step == "collect"
                self.fates.append([e.fate for e in self.calls.collect(self.now)])


@pytest.mark.parametrize(
    ("steps", "during", "fates", "made"),
    [
        pytest.param(["run", "collect"], [], [[ANSWERED]], 1, id="answered-at-the-next-collect"),
        pytest.param(
            ["collect", 14.9, "collect", "run", "collect", "collect"], [], [[], [], [ANSWERED], []], 1,
            id="waited-for-until-just-before-its-timeout",
        ),
        pytest.param(
            [15.0, "collect", "run", "collect"], [], [[GIVEN_UP], [NOT_MADE]], 0,
            id="given-up-before-it-began-is-never-made",
        ),
        pytest.param(
            ["run", "collect"], [15.0, "collect"], [[GIVEN_UP], [LATE]], 1,
            id="given-up-while-made-answers-late",
        ),
        pytest.param(
            ["run", "collect"], [20.0], [[ANSWERED]], 1, id="an-answer-that-came-wins-over-the-timeout",
        ),
        pytest.param(
            [30.0, "collect", "collect", "run", "collect", "collect"], [], [[GIVEN_UP], [], [NOT_MADE], []], 0,
            id="each-call-ends-once-and-once-more-after-a-give-up",
        ),
    ],
)  # fmt: skip
def test_how_a_call_ends(steps: list[Step], during: list[Step], fates: list[list[Fate]], made: int) -> None:
    """What collect reports, scan by scan, for one call whose worker answers (or not) at the steps given."""
    s = Scenario(during)
    assert s.calls.submit("pod", "about", s.call, 0.0) is not None
    s.play(steps)
    assert s.fates == fates
    assert s.made == made


def test_an_ending_carries_the_call_its_value_or_its_error() -> None:
    """An answer brings its value; a call that raised brings its exception as its answer; both name their call."""
    calls: OffScanCalls[str, int] = OffScanCalls(Inline(), TIMEOUT_S)

    def fails() -> int:
        raise OSError("connection refused")

    first = calls.submit("a", "first", lambda: 7, 1.0)
    second = calls.submit("b", "second", fails, 2.0)
    ok, failed = calls.collect(3.0)
    assert (ok.call, ok.fate, ok.value, ok.error) == (first, ANSWERED, 7, None)
    assert failed.call == second and failed.value is None and isinstance(failed.error, OSError)
    assert (second.key, second.about, second.submitted_at) == ("b", "second", 2.0)
    assert first is not None and second is not None and second.ticket > first.ticket


def test_answers_come_in_their_order_then_the_calls_given_up_in_theirs() -> None:
    """collect lists the answers as they came, then the calls given up at this collect, oldest first."""
    runner = HeldRunner()
    calls: OffScanCalls[str, str] = OffScanCalls(runner, TIMEOUT_S)
    calls.submit("a", "a", lambda: "a", 0.0)
    calls.submit("b", "b", lambda: "b", 1.0)
    runner.run_all()
    calls.submit("c", "c", lambda: "c", 2.0)
    calls.submit("d", "d", lambda: "d", 3.0)
    ended = calls.collect(17.5)
    assert [(e.call.about, e.fate) for e in ended] == [("a", ANSWERED), ("b", ANSWERED), ("c", GIVEN_UP)]
    assert [(e.call.about, e.fate) for e in calls.collect(18.0)] == [("d", GIVEN_UP)]
    assert calls.given_up == 2


def test_waiting_and_unfinished_by_key() -> None:
    """A call is waited for until it ends; one given up on stays unfinished until its task ends, and frees its key
    for `waiting` at once."""
    runner = HeldRunner()
    calls: OffScanCalls[None, str] = OffScanCalls(runner, TIMEOUT_S)
    calls.submit("pod-a", None, lambda: "", 0.0)
    calls.submit("pod-b", None, lambda: "", 10.0)
    assert (calls.waiting(), calls.waiting("pod-a"), calls.waiting("pod-c")) == (2, 1, 0)
    calls.collect(TIMEOUT_S)
    assert calls.waiting() == 1 and calls.waiting("pod-a") == 0
    assert calls.unfinished("pod-a") and not calls.unfinished("pod-b")
    runner.run_all()
    calls.collect(TIMEOUT_S)
    assert (calls.waiting(), calls.unfinished("pod-a")) == (0, False)


def _stopped() -> Inline:
    inline = Inline()
    inline.stop(0.0)
    return inline


@pytest.mark.parametrize(
    "runner",
    [
        pytest.param(HeldRunner(max_queue=0), id="a-full-queue-refuses"),
        pytest.param(_stopped(), id="a-stopped-runner-refuses"),
    ],
)
def test_a_refused_call_is_not_waited_for(runner: Runner) -> None:
    """The runner's refusal comes back at once as None, and leaves nothing waited for or to collect."""
    calls: OffScanCalls[None, str] = OffScanCalls(runner, TIMEOUT_S)
    assert calls.submit("k", None, lambda: "", 0.0) is None
    assert calls.waiting() == 0 and calls.collect(TIMEOUT_S) == [] and calls.given_up == 0


def test_the_timeout_is_read_at_each_collect() -> None:
    """A timeout given as a function applies its value of the moment to the calls already in flight (a reload)."""
    timeout = [TIMEOUT_S]

    def current() -> float:
        return timeout[0]

    calls: OffScanCalls[None, str] = OffScanCalls(HeldRunner(), current)
    calls.submit("k", None, lambda: "", 0.0)
    assert calls.collect(5.0) == []
    timeout[0] = 5.0
    assert [e.fate for e in calls.collect(5.0)] == [GIVEN_UP]
    assert calls.timeout_s == 5.0
