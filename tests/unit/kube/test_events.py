"""The Event writer: repeats folded, the queue bounded and fair, important Events first, text bounded and escaped."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from structlog.testing import capture_logs

from vramguard.base.backoff import TokenBucket
from vramguard.kube.client import FORBIDDEN_GRACE_S, forbidden_for_now
from vramguard.kube.correlator import REPEAT_WINDOW_S, EventCorrelator
from vramguard.kube.events import EVENT_DENIED_S, EventRecord, KubeEventRecorder
from vramguard_testbed.fakes import FakeClock, pod

NEVER = threading.Event()


class FakeEventsApi:
    """An `EventSink` over a dict of Events; `fail` holds statuses to answer with, in order."""

    def __init__(self, fail: list[int] | None = None) -> None:
        self.stored: dict[str, int] = {}  # name -> count
        self.calls: list[tuple[str, str, int]] = []  # (verb, name, count)
        self.bodies: list[EventRecord] = []
        self.fail = list(fail or [])

    def create(self, event: EventRecord) -> bool:
        self.calls.append(("create", event.name, event.count))
        self.bodies.append(event)
        if self.fail[:1] == [409]:  # an earlier attempt got through, its answer was lost
            self.stored[event.name] = event.count
            self.fail.pop(0)
        self._maybe_fail()
        if event.name in self.stored:
            return False
        self.stored[event.name] = event.count
        return True

    def bump(self, namespace: str, name: str, count: int, last: object) -> bool:
        self.calls.append(("patch", name, count))
        self._maybe_fail()
        if name not in self.stored:
            return False
        self.stored[name] = count
        return True

    def _maybe_fail(self) -> None:
        if self.fail:
            raise ApiException(status=self.fail.pop(0))


def _recorder(
    core: FakeEventsApi | None = None, *, spam_burst: int = 25, clock: FakeClock | None = None, **kwargs: Any
) -> tuple[KubeEventRecorder, dict[str, int]]:
    """A recorder on a FakeClock (its retries' back-off passes at once), with a write budget that never runs out."""
    clock = clock if clock is not None else FakeClock(0.0)
    counts: dict[str, int] = {}
    recorder = KubeEventRecorder(
        core or FakeEventsApi(),
        count=lambda r: counts.__setitem__(r, counts.get(r, 0) + 1),
        correlator=EventCorrelator(spam_burst=spam_burst, clock=clock),
        clock=clock,
        **{"bucket": TokenBucket(burst=1000, per_minute=60_000, clock=clock), **kwargs},
    )
    return recorder, counts


def stop(recorder: KubeEventRecorder) -> None:
    """Stop the writer (never started: nothing to join); what is still queued is dropped."""
    recorder.stop(recorder.clock.now())


def write_all(recorder: KubeEventRecorder) -> None:
    """Run the writer's rounds on this thread until nothing is left to write, each round's wait passed on its
    clock."""
    while recorder.queued():
        wait_s = recorder.step()
        if wait_s > 0:
            recorder.clock.wait(NEVER, wait_s)


def test_event_repeats_fold_into_the_queued_event() -> None:
    """The same Event recorded again before it is written is one Event, created once with the summed count."""
    core = FakeEventsApi()
    recorder, counts = _recorder(core)  # not started: what record() queues stays queued
    p = pod("noisy", "ml")
    for _ in range(5):
        recorder.record(p, "VRAMQuotaExceeded", "container main uses 5GiB")
    assert recorder.queued() == 1 and counts == {"aggregated": 4}
    write_all(recorder)
    assert [(verb, count) for verb, _, count in core.calls] == [("create", 5)]
    assert counts == {"aggregated": 4, "written": 1}


R = "VRAMQuotaExceeded"
M = "container main uses 5GiB"


@pytest.mark.parametrize(
    ("steps", "fail", "calls", "results"),
    [
        pytest.param([(0, M)], [], [("create", 1, 0)], {"written": 1}, id="first-time-a-create"),
        pytest.param(
            [(0, M), (1, M), (2, M)],
            [],
            [("create", 1, 0), ("patch", 2, 0), ("patch", 3, 0)],
            {"written": 1, "patched": 2},
            id="repeats-after-the-write-patch-its-count",
        ),
        pytest.param(
            [(0, M), (REPEAT_WINDOW_S + 1, M)],
            [],
            [("create", 1, 0), ("create", 1, 1)],
            {"written": 2},
            id="a-repeat-after-the-window-is-a-new-event",
        ),
        pytest.param(
            [(0, M), (1, "container main uses 6GiB")],
            [],
            [("create", 1, 0), ("create", 1, 1)],
            {"written": 2},
            id="another-message-is-another-event",
        ),
        pytest.param(
            [(0, M), ("deleted", M), (2, M)],
            [],
            [("create", 1, 0), ("patch", 2, 0), ("create", 1, 1), ("patch", 2, 1)],
            {"written": 2, "patched": 1},
            id="deleted-on-the-server-a-404-then-written-afresh",
        ),
        pytest.param(
            [(0, M), (1, M)],
            [400],
            [("create", 1, 0), ("patch", 2, 0), ("create", 1, 1)],
            {"failed": 1, "written": 1},
            id="a-create-that-failed-is-created-by-the-next-repeat",
        ),
        pytest.param(
            [(0, M), (1, M)],
            [409],
            [("create", 1, 0), ("patch", 2, 0)],
            {"written": 1, "patched": 1},
            id="a-409-on-create-means-written-and-a-repeat-patches-it",
        ),
        pytest.param(
            [(0, M), (1, M)],
            [503],
            [("create", 1, 0), ("create", 1, 0), ("patch", 2, 0)],
            {"written": 1, "patched": 1},
            id="a-503-is-retried-with-the-same-name",
        ),
        pytest.param(
            [(0, M), (1, M)],
            [403],
            [("create", 1, 0), ("create", 1, 0), ("patch", 2, 0)],
            {"written": 1, "patched": 1},
            id="a-403-is-retried-with-the-same-name",
        ),
    ],
)
def test_event_repeat_patch(
    steps: list[tuple[float | str, str]],
    fail: list[int],
    calls: list[tuple[str, int, int]],
    results: dict[str, int],
) -> None:
    """Said again within REPEAT_WINDOW_S, an Event is a PATCH of its count; otherwise (a new message, the window
    passed, the Event deleted or never created) it is created afresh. Retries keep the Event's name (each call
    below names its Event by the order names first appear)."""
    core = FakeEventsApi(fail)
    clock = FakeClock(0.0)
    recorder, counts = _recorder(core, clock=clock)
    p = pod("noisy", "ml")
    for at, message in steps:
        if at == "deleted":
            core.stored.clear()
        else:
            assert isinstance(at, float | int)
            clock.step(max(0.0, at - clock.now()))  # a retry's back-off may have passed it already
        with capture_logs():
            recorder.record(p, R, message)
            write_all(recorder)
    names: list[str] = []
    for _, name, _ in core.calls:
        names += [name] if name not in names else []
    assert [(verb, count, names.index(name)) for verb, name, count in core.calls] == calls
    assert counts == results


def test_one_noisy_pod_cannot_starve_the_others() -> None:
    """The spam filter is per (pod, reason): a pod past its burst is dropped, a quiet pod still gets through."""
    clock = FakeClock(0.0)
    recorder, counts = _recorder(spam_burst=3, clock=clock)
    noisy, quiet = pod("noisy", "ml"), pod("quiet", "ml")
    for i in range(10):
        recorder.record(noisy, "VRAMKilled", f"killed PID {i}")
    recorder.record(quiet, "VRAMKilled", "killed PID 99")
    recorder.record(noisy, "VRAMQuotaInvalid", "bad annotation")
    assert counts == {"dropped": 7}
    assert recorder.queued() == 5
    clock.step(300.0)  # one token back after EVENT_SPAM_REFILL_S
    recorder.record(noisy, "VRAMKilled", "killed PID 100")
    assert recorder.queued() == 6


def test_event_queue_is_bounded() -> None:
    """Past max_queue, record() drops and counts instead of queueing or blocking."""
    recorder, counts = _recorder(max_queue=4)
    for i in range(10):
        recorder.record(pod(f"p{i}", "ml"), "VRAMKilled", "killed")
    assert recorder.queued() == 4 and counts == {"dropped": 6}
    stop(recorder)
    assert counts == {"dropped": 10}, "what is still queued at stop is dropped, and counted"


def _written(core: FakeEventsApi) -> list[str]:
    return [str(body.reason) for body in core.bodies]


@pytest.mark.parametrize(
    ("warnings", "max_queue", "dropped"),
    [
        pytest.param(255, 256, 0, id="behind-255-warnings-with-room-for-it"),
        pytest.param(256, 256, 1, id="queue-full-of-warnings-the-oldest-makes-room"),
        pytest.param(402, 256, 147, id="402-limit-failures-then-a-kill"),
    ],
)
def test_a_kill_event_goes_ahead_of_queued_warnings(warnings: int, max_queue: int, dropped: int) -> None:
    """Recorded after a queue of warnings, a VRAMKilled Event is written first and never dropped for them; a full
    queue drops its oldest warning to make room."""
    core = FakeEventsApi()
    recorder, counts = _recorder(core, max_queue=max_queue)  # not started: everything stays queued
    for i in range(warnings):
        recorder.record(pod(f"p{i}", "ml"), "VRAMLimitFailed", "could not set the limit")
    recorder.record(pod("greedy", "ml"), "VRAMKilled", "killed PIDs 7", important=True)
    assert counts.get("dropped", 0) == dropped
    write_all(recorder)
    assert _written(core)[0] == "VRAMKilled"
    assert len(core.bodies) == min(warnings, max_queue - 1) + 1


@pytest.mark.parametrize(
    ("warnings", "tokens_at_start", "written_before"),
    [
        pytest.param(3, 1, ["VRAMQuotaExceeded"], id="the-pace-spent-on-a-warning-the-next-token-is-the-kill"),
        pytest.param(256, 0, [], id="a-full-queue-and-an-empty-bucket-the-first-token-is-the-kill"),
    ],
)
def test_the_next_write_token_goes_to_an_important_event(
    warnings: int, tokens_at_start: int, written_before: list[str]
) -> None:
    """While the writer waits for a token (the pace is spent on warnings), an enforcement Event recorded meanwhile
    takes the next one: the warnings wait, not the kill."""
    core = FakeEventsApi()
    clock = FakeClock(0.0)
    bucket = TokenBucket(burst=1, per_minute=600, clock=clock)  # a token per 0.1 s of the clock
    for _ in range(1 - tokens_at_start):
        assert bucket.take()
    recorder, counts = _recorder(core, bucket=bucket, clock=clock)
    for i in range(warnings):
        recorder.record(pod(f"p{i}", "ml"), "VRAMQuotaExceeded", "over")

    def evict_while_waiting() -> None:
        assert _written(core) == written_before, "no token, no write, though warnings are queued"
        recorder.record(pod("greedy", "ml"), "VRAMEvicted", "evicted", important=True)
        clock.on_wait = lambda: None

    clock.on_wait = evict_while_waiting  # the writer's wait for a token: the eviction is recorded meanwhile
    for _ in range(len(written_before) + 1):
        assert recorder.step() == 0.0
    assert clock.waits == [0.1]
    stop(recorder)
    assert _written(core) == [*written_before, "VRAMEvicted"]
    assert counts["dropped"] == warnings - len(written_before), "the warnings still queued are dropped at stop"


@pytest.mark.parametrize(
    ("queued_important", "record_important", "queued_after", "dropped"),
    [
        pytest.param(True, False, 4, 1, id="a-warning-never-displaces-an-important-event"),
        pytest.param(True, True, 4, 1, id="a-queue-full-of-important-events-drops-the-new-one"),
        pytest.param(False, False, 4, 1, id="a-warning-over-the-bound-is-dropped"),
    ],
)
def test_what_the_event_bound_drops(
    queued_important: bool, record_important: bool, queued_after: int, dropped: int
) -> None:
    """The bound holds for every Event; only an important one may take a warning's place."""
    core = FakeEventsApi()
    recorder, counts = _recorder(core, max_queue=4)
    for i in range(4):
        recorder.record(pod(f"p{i}", "ml"), "VRAMKilled" if queued_important else "VRAMQuotaExceeded", "x",
                        important=queued_important)  # fmt: skip
    recorder.record(pod("late", "ml"), "VRAMKilled", "y", important=record_important)
    assert recorder.queued() == queued_after and counts == {"dropped": dropped}
    write_all(recorder)
    assert all(body.pod.name != "late" for body in core.bodies)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        pytest.param("\x1b[2J12GB", "\\x1b[2J12GB", id="esc-clear-screen-escaped"),
        pytest.param("\x1b]0;pwned\x0712GB", "\\x1b]0;pwned\\x0712GB", id="bel-ended-title-sequence-escaped"),
        pytest.param("\u202eBG21", "\\u202eBG21", id="bidi-override-escaped"),
        pytest.param("12 Gio für 🚀", "12 Gio für 🚀", id="printable-non-ascii-kept"),
    ],
)
def test_event_messages_are_shown_escaped(value: str, shown: str) -> None:
    """A tenant's text quoted in an Event (an annotation's value) reaches `kubectl describe` with its escape
    sequences, bells and bidi overrides escaped."""
    core = FakeEventsApi()
    recorder, _ = _recorder(core)
    recorder.record(pod("p", "ml"), "VRAMQuotaInvalid", f'vramguard.io/vram-limit: "{value}" is not valid')
    write_all(recorder)
    (body,) = core.bodies
    assert body.message == f'vramguard.io/vram-limit: "{shown}" is not valid'


def test_a_pods_warnings_never_spend_its_kill_events_budget() -> None:
    """The spam filter counts per (pod, reason): a pod past its warnings' burst still gets its kill Event queued."""
    recorder, counts = _recorder(spam_burst=3)  # the clock never moves: no budget comes back
    greedy = pod("greedy", "ml")
    for i in range(10):
        recorder.record(greedy, "VRAMQuotaExceeded", f"uses {i}GiB")
    assert counts == {"dropped": 7}
    recorder.record(greedy, "VRAMKilled", "killed PIDs 7", important=True)
    assert recorder.queued() == 4 and counts == {"dropped": 7}


def test_an_escaped_message_stays_within_the_bound() -> None:
    """A message of control characters, each escaped to four or more, is still at most 1024 characters."""
    core = FakeEventsApi()
    recorder, _ = _recorder(core)
    recorder.record(pod("p", "ml"), "VRAMQuotaInvalid", "\x1b" * 5000)
    write_all(recorder)
    (body,) = core.bodies
    assert len(str(body.message)) == 1024 and "\x1b" not in str(body.message)


def test_event_messages_and_names_are_bounded() -> None:
    """A 10 MB message is cut to 1024 characters; the Event's name fits the 253-character limit."""
    core = FakeEventsApi()
    recorder, _ = _recorder(core)
    recorder.record(pod("x" * 250, "ml"), "VRAMQuotaInvalid", "v" * 10_000_000)
    write_all(recorder)
    (body,) = core.bodies
    assert len(str(body.message)) == 1024 and len(str(body.name)) <= 253


def _forbidden(namespace: str) -> ApiException:
    return _with_body({"kind": "Status", "reason": "Forbidden", "message": f'events is forbidden in "{namespace}"'})


class Authorizer(FakeEventsApi):
    """An `EventSink` behind an authorizer: `refusal` (a 403) for the namespaces in `denied` (every namespace: "*")
    while the clock is before `until`."""

    def __init__(
        self,
        clock: FakeClock,
        until: float = float("inf"),
        denied: frozenset[str] = frozenset("*"),
        refusal: Callable[[str], ApiException] = _forbidden,
    ) -> None:
        super().__init__()
        self.clock = clock
        self.until = until
        self.denied = denied
        self.refusal = refusal
        self.attempts: list[tuple[float, str]] = []  # (time, namespace) of each request

    def create(self, event: EventRecord) -> bool:
        self._authorize(event.pod.namespace)
        return super().create(event)

    def bump(self, namespace: str, name: str, count: int, last: object) -> bool:
        self._authorize(namespace)
        return super().bump(namespace, name, count, last)

    def _authorize(self, namespace: str) -> None:
        self.attempts.append((self.clock.now(), namespace))
        if self.clock.now() < self.until and ("*" in self.denied or namespace in self.denied):
            raise self.refusal(namespace)


def _writer(core: Authorizer, **kwargs: Any) -> tuple[KubeEventRecorder, dict[str, int]]:
    """A recorder on the sink's clock whose back-off has no jitter: 1, 2, 4, 8, 15 s."""
    return _recorder(core, clock=core.clock, rng=lambda: 0.0, **kwargs)


def _with_body(body: dict[str, object]) -> ApiException:
    e = ApiException(status=403, reason="Forbidden")
    e.body = json.dumps(body)
    return e


def _terminating() -> ApiException:
    cause = {"reason": "NamespaceTerminating", "message": "namespace ml is being terminated", "field": "metadata"}
    return _with_body({"kind": "Status", "reason": "Forbidden", "details": {"causes": [cause]}})


@pytest.mark.parametrize(
    ("error", "for_now"),
    [
        pytest.param(ApiException(status=403, reason="Forbidden"), True, id="403-may-be-an-authorizer-warming-up"),
        pytest.param(_with_body({"kind": "Status", "code": 403}), True, id="403-status-without-causes"),
        pytest.param(_terminating(), False, id="403-namespace-terminating-is-final"),
        pytest.param(ApiException(status=404), False, id="404-is-not-a-403"),
        pytest.param(ApiException(status=503), False, id="503-is-transient-not-forbidden"),
        pytest.param(ConnectionRefusedError("refused"), False, id="no-answer-is-not-a-403"),
    ],
)
def test_which_errors_are_forbidden_for_now(error: BaseException, for_now: bool) -> None:
    """A 403 may be an API server whose authorizer has not loaded RBAC yet, unless its namespace is being deleted."""
    assert forbidden_for_now(error) is for_now


def test_events_owed_during_rbac_warm_up_arrive_and_later_ones_too() -> None:
    """A kill and a warning of one pod queued while the API server answers 403 for 5 s: the writer holds the first,
    backs off, and writes both once the server accepts; a later Event of the pod is written at once."""
    core = Authorizer(FakeClock(0.0), until=5.0)
    recorder, counts = _writer(core)
    greedy = pod("greedy", "ml")
    recorder.record(greedy, "VRAMQuotaExceeded", "container main uses 5GiB")
    recorder.record(greedy, "VRAMKilled", "killed PIDs 7", important=True)
    with capture_logs():
        write_all(recorder)
        recorder.record(greedy, "VRAMKilled", "killed PIDs 8", important=True)
        write_all(recorder)
    assert [e.reason for e in core.bodies] == ["VRAMKilled", "VRAMQuotaExceeded", "VRAMKilled"]
    assert counts == {"written": 3}
    assert [t for t, _ in core.attempts] == [0.0, 1.0, 3.0, 7.0, 7.0, 7.0], "backed off 1, 2, 4 s, then written"


def test_a_persistent_403_ends_after_the_grace_and_is_logged_once() -> None:
    """RBAC that really denies Events: the first Event is retried for FORBIDDEN_GRACE_S, then failed; every later
    one, in any namespace, is tried once and failed; the log says so once, and again when a write succeeds."""
    core = Authorizer(FakeClock(0.0))
    with capture_logs() as logs:
        recorder, counts = _writer(core)
        recorder.record(pod("first", "ml"), "VRAMKilled", "killed PIDs 7", important=True)
        write_all(recorder)
        for i, namespace in enumerate(["ml", "ml", "other"]):
            recorder.record(pod(f"later{i}", namespace), "VRAMQuotaExceeded", "over")
            write_all(recorder)
        core.until = core.clock.now()  # the binding is restored
        recorder.record(pod("after", "ml"), "VRAMQuotaExceeded", "over")
        write_all(recorder)
    grace = FORBIDDEN_GRACE_S
    assert [t for t, _ in core.attempts] == [0.0, 1.0, 3.0, 7.0, 15.0, grace, grace, grace, grace, grace], (
        "the first Event held for the grace, with back-off; after it, one request per Event"
    )
    assert counts == {"failed": 4, "written": 1}
    said = [(e["event"], e.get("namespace")) for e in logs if e["event"].startswith("event")]
    assert said == [("event_failed", None), ("events_forbidden", "ml"), ("events_restored", None)]


def test_a_namespace_that_refuses_events_holds_the_writer_once() -> None:
    """One namespace refuses Events for good (a quota on them) while others are written: its first Event is held
    for the grace, its later ones fail at once, so the other namespaces' Events are not held behind each of them;
    after EVENT_DENIED_S the namespace has a grace again."""
    core = Authorizer(FakeClock(0.0), denied=frozenset({"quota"}))
    recorder, counts = _writer(core)
    with capture_logs():
        for i in range(3):
            recorder.record(pod(f"refused{i}", "quota"), "VRAMQuotaExceeded", "over")
            recorder.record(pod(f"fine{i}", "ml"), "VRAMQuotaExceeded", "over")
            write_all(recorder)
        held_s = core.clock.now()
        core.clock.step(EVENT_DENIED_S)
        recorder.record(pod("refused-later", "quota"), "VRAMQuotaExceeded", "over")
        write_all(recorder)
    assert held_s == FORBIDDEN_GRACE_S, "one grace in all, not one per Event"
    assert core.clock.now() == 2 * FORBIDDEN_GRACE_S + EVENT_DENIED_S
    assert counts == {"failed": 4, "written": 3}
    assert [namespace for _, namespace in core.attempts].count("ml") == 3


def test_a_namespace_being_deleted_fails_its_event_at_once() -> None:
    """A 403 for a namespace being deleted is final: one request, no back-off."""
    core = Authorizer(FakeClock(0.0), refusal=lambda namespace: _terminating())
    recorder, counts = _writer(core)
    recorder.record(pod("p", "ml"), "VRAMQuotaExceeded", "over")
    with capture_logs():
        write_all(recorder)
    assert counts == {"failed": 1}
    assert core.attempts == [(0.0, "ml")], "one request, no back-off"


def test_the_loop_paces_retries_and_a_stop_abandons_the_held_event() -> None:
    """The writer's loop, run on this thread, waits each retry's back-off on the clock; stopped while it holds an
    Event for a retry, it ends without another request and holds nothing."""
    core = FakeEventsApi(fail=[503] * 10)
    clock = FakeClock(0.0)
    recorder, counts = _recorder(core, clock=clock, rng=lambda: 0.0)
    recorder.record(pod("p", "ml"), "VRAMQuotaExceeded", "over")
    clock.on_wait = lambda: recorder.loop.stopping.set() if len(clock.waits) == 3 else None
    with capture_logs():
        recorder.loop.run()
    assert clock.waits == [1.0, 2.0, 4.0]
    assert len(core.calls) == 3, "no request after the stop"
    assert recorder.queued() == 0 and counts == {}
