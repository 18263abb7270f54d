"""The Event writer and a 403: retried while an API server's authorizer may still be loading RBAC, believed after
`FORBIDDEN_GRACE_S`, and never a hold on other namespaces' Events for more than one grace."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from structlog.testing import capture_logs

from unit.test_kube_units import FakeEventsApi, _recorder, stop
from vramguard.kube.client import FORBIDDEN_GRACE_S, forbidden_for_now
from vramguard.kube.events import EVENT_DENIED_S, EventRecord, KubeEventRecorder
from vramguard.testing.fakes import FakeClock, pod


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
    recorder.start()
    try:
        assert recorder.flush(15)
        recorder.record(greedy, "VRAMKilled", "killed PIDs 8", important=True)
        assert recorder.flush(15)
    finally:
        stop(recorder)
    assert [e.reason for e in core.bodies] == ["VRAMKilled", "VRAMQuotaExceeded", "VRAMKilled"]
    assert counts == {"written": 3}
    assert [t for t, _ in core.attempts] == [0.0, 1.0, 3.0, 7.0, 7.0, 7.0], "backed off 1, 2, 4 s, then written"


def test_a_persistent_403_ends_after_the_grace_and_is_logged_once() -> None:
    """RBAC that really denies Events: the first Event is retried for FORBIDDEN_GRACE_S, then failed; every later
    one, in any namespace, is tried once and failed; the log says so once, and again when a write succeeds."""
    core = Authorizer(FakeClock(0.0))
    with capture_logs() as logs:
        recorder, counts = _writer(core)
        recorder.start()
        try:
            recorder.record(pod("first", "ml"), "VRAMKilled", "killed PIDs 7", important=True)
            assert recorder.flush(15)
            for i, namespace in enumerate(["ml", "ml", "other"]):
                recorder.record(pod(f"later{i}", namespace), "VRAMQuotaExceeded", "over")
                assert recorder.flush(15)
            core.until = core.clock.now()  # the binding is restored
            recorder.record(pod("after", "ml"), "VRAMQuotaExceeded", "over")
            assert recorder.flush(15)
        finally:
            stop(recorder)
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
    recorder.start()
    try:
        for i in range(3):
            recorder.record(pod(f"refused{i}", "quota"), "VRAMQuotaExceeded", "over")
            recorder.record(pod(f"fine{i}", "ml"), "VRAMQuotaExceeded", "over")
            assert recorder.flush(15)
        held_s = core.clock.now()
        core.clock.step(EVENT_DENIED_S)
        recorder.record(pod("refused-later", "quota"), "VRAMQuotaExceeded", "over")
        assert recorder.flush(15)
    finally:
        stop(recorder)
    assert held_s == FORBIDDEN_GRACE_S, "one grace in all, not one per Event"
    assert core.clock.now() == 2 * FORBIDDEN_GRACE_S + EVENT_DENIED_S
    assert counts == {"failed": 4, "written": 3}
    assert [namespace for _, namespace in core.attempts].count("ml") == 3


def test_a_namespace_being_deleted_fails_its_event_at_once() -> None:
    """A 403 for a namespace being deleted is final: one request, no back-off."""
    core = Authorizer(FakeClock(0.0), refusal=lambda namespace: _terminating())
    recorder, counts = _writer(core)
    recorder.record(pod("p", "ml"), "VRAMQuotaExceeded", "over")
    recorder.start()
    try:
        assert recorder.flush(15)
    finally:
        stop(recorder)
    assert counts == {"failed": 1}
    assert core.attempts == [(0.0, "ml")], "one request, no back-off"
