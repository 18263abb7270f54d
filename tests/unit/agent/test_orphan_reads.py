"""Fresh reads of the API server for orphans: one in flight at most, spaced, backed off after a failure, and an answer
that came too late is not trusted."""

from __future__ import annotations

from vramguard.agent.orphan_reads import MAX_READ_BACKOFF_S, READ_SPACING_S, READ_TIMEOUT_S, OrphanReads
from vramguard.core.orphans import PodRead
from vramguard_testbed.fakes import HeldRunner


class Lister:
    def __init__(self) -> None:
        self.answer: frozenset[str] | Exception = frozenset({"a"})
        self.calls = 0

    def present(self) -> frozenset[str]:
        self.calls += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def reads() -> tuple[OrphanReads, Lister, HeldRunner]:
    lister, runner = Lister(), HeldRunner(max_queue=1)
    return OrphanReads(lister, runner=runner, rng=lambda: 0.0), lister, runner


def test_a_read_answers_at_a_later_collect_with_the_time_it_was_asked_for() -> None:
    r, lister, runner = reads()
    assert r.request(10.0)
    assert r.collect(11.0) is None, "not answered yet"
    runner.run_all()
    assert r.collect(12.0) == PodRead(10.0, frozenset({"a"}))
    assert r.collect(13.0) is None and lister.calls == 1


def test_one_read_in_flight_and_one_per_spacing() -> None:
    r, _, runner = reads()
    assert r.request(0.0)
    assert not r.request(1.0), "one in flight"
    runner.run_all()
    r.collect(2.0)
    assert not r.request(READ_SPACING_S - 0.1)
    assert r.request(READ_SPACING_S)
    assert r.reads == 2


def test_a_failed_read_backs_off_and_a_success_resets_it() -> None:
    r, lister, runner = reads()
    lister.answer = OSError("connection refused")
    at = 0.0
    delays = []
    assert r.request(at)
    for _ in range(8):
        runner.run_all()
        assert r.collect(at) is None
        nxt = at
        while not r.request(nxt):
            nxt += 1.0
        delays.append(nxt - at)
        at = nxt
    runner.run_all()
    r.collect(at)
    at += MAX_READ_BACKOFF_S  # past any back-off
    assert delays[:3] == [READ_SPACING_S, 2 * READ_SPACING_S, 4 * READ_SPACING_S]
    assert max(delays) == MAX_READ_BACKOFF_S
    lister.answer = frozenset()
    assert r.request(at)
    runner.run_all()
    assert r.collect(at) == PodRead(at, frozenset())
    assert r.request(at + READ_SPACING_S), "a success resets the back-off to the spacing"


def test_a_read_unanswered_too_long_is_given_up_and_its_late_answer_ignored() -> None:
    r, _, runner = reads()
    assert r.request(0.0)
    assert r.collect(READ_TIMEOUT_S) is None
    runner.run_all()  # the answer comes after all
    assert r.collect(READ_TIMEOUT_S + 1) is None, "an answer given up on is not trusted to be fresh"
    assert not r.request(READ_TIMEOUT_S + 1), "backed off"
    assert r.request(READ_TIMEOUT_S + READ_SPACING_S)


def test_a_full_worker_starts_nothing() -> None:
    r, _, runner = reads()
    runner.tasks.append(lambda: None)
    assert not r.request(0.0) and r.reads == 0


def test_a_read_given_up_before_the_worker_began_it_is_never_made() -> None:
    """A read still queued at its timeout (the worker stuck) is dropped when the worker reaches it: no request."""
    r, lister, runner = reads()
    assert r.request(0.0)
    assert r.collect(READ_TIMEOUT_S) is None
    runner.run_all()
    assert r.collect(READ_TIMEOUT_S + 1) is None and lister.calls == 0
