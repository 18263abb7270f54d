"""The Event correlator: one Event in, one answer out — create it, patch the count of the same Event said before, or
drop it — by the repeat window and the spam budget per (pod, reason), on an injected clock."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from vramguard.kube.correlator import (
    SPAM_KEYS,
    Answer,
    Create,
    Drop,
    DropReason,
    Event,
    EventCorrelator,
    Patch,
)
from vramguard_testbed.fakes import FakeClock

BURST = 3
REFILL_S = 300.0
WINDOW_S = 600.0
NS = "ml"
SPAM = Drop(DropReason.SPAM)


class Say(NamedTuple):
    """One Event put to the correlator at `at`; its name, if it is new, is `e<its index in the case>`."""

    at: float = 0.0
    pod: str = "a"
    reason: str = "VRAMQuotaExceeded"
    message: str = "uses 5GiB"
    owed: bool = False


def create(i: int, count: int = 1) -> Create:
    return Create(NS, f"e{i}", count)


def patch(i: int, count: int) -> Patch:
    return Patch(NS, f"e{i}", count)


def _correlator(clock: FakeClock) -> EventCorrelator:
    return EventCorrelator(spam_burst=BURST, spam_refill_s=REFILL_S, repeat_window_s=WINDOW_S, clock=clock)


def _event(i: int, say: Say) -> Event:
    return Event(say.pod, NS, say.reason, say.message, f"e{i}")


@pytest.mark.parametrize(
    ("said", "answers"),
    [
        pytest.param([Say()], [create(0)], id="first-time-writes-new"),
        pytest.param([Say(0), Say(10)], [create(0), patch(0, 2)], id="same-reason-within-window-bumps-count"),
        pytest.param(
            [Say(0), Say(1), Say(2)], [create(0), patch(0, 2), patch(0, 3)], id="each-repeat-bumps-the-last-count"
        ),
        pytest.param([Say(0), Say(WINDOW_S)], [create(0), create(1)], id="repeat-after-window-writes-new"),
        pytest.param(
            [Say(0), Say(500), Say(1000)], [create(0), patch(0, 2), patch(0, 3)], id="window-runs-from-the-last-repeat"
        ),
        pytest.param([Say(pod="a"), Say(pod="b")], [create(0), create(1)], id="other-pod-writes-new"),
        pytest.param([Say(message="x"), Say(message="y")], [create(0), create(1)], id="other-message-writes-new"),
        pytest.param([Say(reason="A"), Say(reason="B")], [create(0), create(1)], id="other-reason-writes-new"),
        pytest.param(
            [Say(message=m) for m in "wxyz"], [create(0), create(1), create(2), SPAM], id="past-the-burst-drops-as-spam"
        ),
        pytest.param(
            [Say(), Say(), Say(), Say()], [create(0), patch(0, 2), patch(0, 3), SPAM], id="repeats-spend-the-budget"
        ),
        pytest.param(
            [*(Say(message=m) for m in "wxyz"), Say(reason="VRAMKilled"), Say(pod="b")],
            [create(0), create(1), create(2), SPAM, create(4), create(5)],
            id="budget-is-per-pod-and-reason",
        ),
        pytest.param(
            [*(Say(message=m) for m in "wxy"), Say(REFILL_S - 1, message="z"), Say(REFILL_S, message="z")],
            [create(0), create(1), create(2), SPAM, create(4)],
            id="budget-refills-one-per-refill-interval",
        ),
        pytest.param(
            [Say(), Say(), Say(), Say(), Say(REFILL_S)],
            [create(0), patch(0, 2), patch(0, 3), SPAM, patch(0, 4)],
            id="a-dropped-repeat-is-not-counted",
        ),
        pytest.param(
            [Say(), *[Say(owed=True)] * 4],
            [create(0), create(0, 2), create(0, 3), create(0, 4), create(0, 5)],
            id="owed-repeat-joins-the-held-create-at-no-cost",
        ),
        pytest.param(
            [Say(0), Say(10), Say(11, owed=True)],
            [create(0), patch(0, 2), patch(0, 3)],
            id="owed-repeat-joins-the-held-patch",
        ),
    ],
)
def test_one_event_in_one_answer_out(said: list[Say], answers: list[Answer]) -> None:
    """Each Event said gets the answer the repeat window and the (pod, reason) spam budget call for."""
    clock = FakeClock(0.0)
    correlator = _correlator(clock)
    got = []
    for i, say in enumerate(said):
        clock.step(say.at - clock.now())
        got.append(correlator.correlate(_event(i, say), owed=say.owed))
    assert got == answers


def test_a_gone_events_replacement_is_what_a_repeat_patches() -> None:
    """Told that the Event a patch was for is gone and which one replaced it, the next repeat patches the
    replacement."""
    correlator = _correlator(FakeClock(0.0))
    first = _event(0, Say())
    assert correlator.correlate(first) == create(0)
    assert correlator.correlate(_event(1, Say())) == patch(0, 2)
    correlator.gone(first.key, Create(NS, "fresh", 1))
    assert correlator.correlate(_event(2, Say())) == Patch(NS, "fresh", 2)


def test_the_least_recently_used_budget_is_forgotten() -> None:
    """Past SPAM_KEYS (pod, reason) pairs, the one used least recently starts again with a full burst."""
    correlator = EventCorrelator(spam_burst=1, clock=FakeClock(0.0))
    first = Event("p0", NS, "R", "m", "e0")
    assert correlator.correlate(first) == Create(NS, "e0", 1)
    assert correlator.correlate(Event("p0", NS, "R", "other", "e1")) == SPAM
    for i in range(1, SPAM_KEYS + 1):
        correlator.correlate(Event(f"p{i}", NS, "R", "m", f"x{i}"))
    assert correlator.correlate(Event("p0", NS, "R", "other", "e2")) == Create(NS, "e2", 1)
