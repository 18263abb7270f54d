"""The Event writer on its own thread, in real time: `record` from another thread wakes it, `flush` waits for it,
and `stop` ends it whether it waits for an Event or holds one for a retry."""

from __future__ import annotations

import time

from kubernetes.client.exceptions import ApiException
from structlog.testing import capture_logs

from vramguard.base.backoff import TokenBucket
from vramguard.kube.events import EventRecord, KubeEventRecorder
from vramguard_testbed.fakes import SteppedClock, pod
from vramguard_testbed.waiting import wait_until


class Sink:
    """An `EventSink` that keeps what it is given; while `failing`, every request answers 503."""

    def __init__(self, failing: bool = False) -> None:
        self.created: list[EventRecord] = []
        self.requests = 0
        self.failing = failing

    def create(self, event: EventRecord) -> bool:
        self.requests += 1
        if self.failing:
            raise ApiException(status=503)
        self.created.append(event)
        return True

    def bump(self, namespace: str, name: str, count: int, last: object) -> bool:
        self.requests += 1
        return True


def _recorder(sink: Sink, **kwargs: object) -> tuple[KubeEventRecorder, dict[str, int]]:
    counts: dict[str, int] = {}
    recorder = KubeEventRecorder(
        sink,
        count=lambda r: counts.__setitem__(r, counts.get(r, 0) + 1),
        bucket=TokenBucket(burst=100, per_minute=6000),
        **kwargs,  # type: ignore[arg-type]
    )
    return recorder, counts


def test_the_thread_writes_what_another_thread_records() -> None:
    """Started with nothing queued, the writer waits; Events recorded later are written, and `flush` returns once
    they are."""
    sink = Sink()
    recorder, counts = _recorder(sink)
    recorder.start()
    try:
        for i in range(3):
            recorder.record(pod(f"p{i}", "ml"), "VRAMQuotaExceeded", "over")
        assert recorder.flush(10)
    finally:
        recorder.stop(recorder.clock.now() + 10)
    assert [e.pod.name for e in sink.created] == ["p0", "p1", "p2"]
    assert counts == {"written": 3}
    assert not recorder.loop.running


def test_stop_ends_a_writer_waiting_for_an_event_at_once() -> None:
    """A writer with nothing to write is woken by the stop: its thread ends well within the deadline."""
    recorder, _ = _recorder(Sink())
    recorder.start()
    started = time.monotonic()
    recorder.stop(recorder.clock.now() + 10)
    assert not recorder.loop.running
    assert time.monotonic() - started < 5


def test_stop_ends_a_writer_holding_an_event_for_a_retry() -> None:
    """Stopped while it waits out a retry's back-off, the writer ends without another request; the held Event is
    let go, so `flush` and `queued` see nothing left."""
    sink = Sink(failing=True)
    clock = SteppedClock()
    recorder, _ = _recorder(sink, clock=clock)
    recorder.record(pod("p", "ml"), "VRAMQuotaExceeded", "over")
    with capture_logs():
        recorder.start()
        wait_until(lambda: clock.waiting, 10, "the writer waiting out a retry")
        recorder.stop(clock.now() + 10)
    assert not recorder.loop.running
    assert sink.requests == 1
    assert recorder.queued() == 0 and recorder.flush(0)
