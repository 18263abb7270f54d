"""The enforcer with its real eviction worker thread: a hanging or late API server never holds up the scan, and a
late answer to a sent eviction is still the pod's. The same rules without a thread are in
tests/unit/agent/test_act.py."""

from __future__ import annotations

import threading
import time

import pytest

from unit.agent.test_act import EVICTED, LATE_ANSWERS, over_quota_action
from vramguard.agent.act import Enforcer, Outcome
from vramguard.base.worker import Worker
from vramguard.core.pod import PodInfo
from vramguard.core.policy import EvictionRefused, Policy
from vramguard.core.ports import EvictResult
from vramguard_testbed.fakes import FakeClock, GatedEvictor, RecordingEventRecorder, RecordingKiller


def _drain(worker: Worker) -> None:
    """Return once every task submitted so far has run (the worker runs them in order)."""
    done = threading.Event()
    assert worker.submit(done.set)
    assert done.wait(10)


@pytest.mark.parametrize(("answer", "results", "reasons"), LATE_ANSWERS)
def test_a_late_answer_to_a_sent_eviction(answer: EvictResult, results: list[str], reasons: list[str]) -> None:
    """An eviction sent before it was abandoned is still the pod's eviction: no other of the pod is sent before its
    answer (a new one fails at once), and when the API server accepts it after all, that is reported."""
    evictor = GatedEvictor(answer)
    clock = FakeClock()
    worker = Worker("test-evict", max_queue=16, clock=clock)
    events = RecordingEventRecorder()
    enforcer = Enforcer(
        killer=RecordingKiller(),
        evictor=evictor,
        events=events,
        policy=Policy(eviction_timeout_s=15.0),
        clock=clock,
        evictions=worker,
    )
    action = over_quota_action()
    enforcer.start()
    try:
        assert enforcer.execute(action) is None
        assert evictor.entered.wait(10)
        clock.step(15.0)
        outcomes = enforcer.collect()
        again = enforcer.execute(action)
        assert again is not None and again.result == "failed" and "still unanswered" in again.detail
        evictor.gate.set()
        _drain(worker)
        outcomes += enforcer.collect()
    finally:
        evictor.gate.set()
        enforcer.stop(clock.now() + 1.0)
    assert [o.result for o in outcomes] == results
    assert evictor.calls == ["ml/victim"], "one request for the pod, never a second behind it"
    assert events.reasons() == reasons


class HangingEvictor:
    """An evictor stuck in a socket read (a frozen API server) until released."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def evict(self, pod: PodInfo, message: str) -> EvictResult:
        self.release.wait(30)
        return EVICTED


def test_a_hanging_evictor_never_holds_up_the_caller() -> None:
    """With the real worker thread, execute() and collect() return at once while the evictor hangs."""
    evictor = HangingEvictor()
    clock = FakeClock()
    enforcer = Enforcer(
        killer=RecordingKiller(),
        evictor=evictor,
        events=RecordingEventRecorder(),
        policy=Policy(on_eviction_refused=EvictionRefused.KILL),
        clock=clock,
        evictions=Worker("test-evict", max_queue=4, clock=clock),
    )
    enforcer.start()
    try:
        started = time.perf_counter()
        outcomes: list[Outcome] = []
        for i in range(5):
            o = enforcer.execute(over_quota_action(name=f"victim-{i}"))
            if o is not None:  # past the queue bound: reported at once, never waited for
                outcomes.append(o)
            outcomes += enforcer.collect()
        clock.step(Policy().eviction_timeout_s)
        outcomes += enforcer.collect()
        assert time.perf_counter() - started < 0.5
        assert [o.result for o in outcomes] == ["failed-then-killed"] * 5
    finally:
        evictor.release.set()
        enforcer.stop(clock.now() + 1.0)
