"""The enforcer with its real eviction worker thread: a hanging or late API server never holds up the scan, and a
late answer to a sent eviction is still the pod's. The same rules without a thread are in
tests/unit/agent/test_act.py."""

from __future__ import annotations

import threading
import time

import pytest

from vramguard.agent.act import Enforcer, Outcome
from vramguard.base.worker import Worker
from vramguard.core.decide import find_violations
from vramguard.core.model import Action, EvictionRefused, GiB, Mode, PodInfo, PodQuota, Policy, Quota, Reason
from vramguard.core.ports import EvictResult
from vramguard.testing.fakes import (
    FakeClock,
    GatedEvictor,
    RecordingEventRecorder,
    RecordingKiller,
    SnapshotBuilder,
    gpu,
    pod,
)

GPU0 = gpu(0, total_bytes=16 * GiB)
EVICTED = EvictResult(evicted=True, refused=False)


def _evict_action(name: str = "victim") -> Action:
    p = pod(name, "ml")
    quotas = {p.uid: PodQuota(containers={"main": Quota(limit_bytes=1 * GiB)})}
    (violation,) = find_violations(SnapshotBuilder().use(p, "main", GPU0, 2 * GiB).build(), quotas)
    return Action(kind=Mode.EVICT, reason=Reason.HARD_LIMIT, violation=violation)


def _drain(worker: Worker) -> None:
    """Return once every task submitted so far has run (the worker runs them in order)."""
    done = threading.Event()
    assert worker.submit(done.set)
    assert done.wait(10)


@pytest.mark.parametrize(
    ("answer", "results", "reasons"),
    [
        pytest.param(
            EVICTED, ["failed", "ok"], ["VRAMEvictionFailed", "VRAMEvictionFailed", "VRAMEvicted"],
            id="late-acceptance-is-reported",
        ),
        pytest.param(
            EvictResult(evicted=False, refused=True, message="budget"), ["failed"],
            ["VRAMEvictionFailed", "VRAMEvictionFailed"], id="late-refusal-is-only-logged",
        ),
    ],
)  # fmt: skip
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
    action = _evict_action()
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
            o = enforcer.execute(_evict_action(f"victim-{i}"))
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
