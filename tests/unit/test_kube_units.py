"""The Kubernetes adapters' own logic, without a server: watch events, the Event bound, advertisable memory.

Everything that talks to the API server is tested against a real one in tests/cluster/.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from structlog.testing import capture_logs

from unit.test_reflector import HangingResponse
from vramguard.base.backoff import Backoff, TokenBucket
from vramguard.base.worker import Inline
from vramguard.core.model import ClaimUse, GiB, GpuDevice, GpuSample, PodInfo
from vramguard.kube.capacity import KubeCapacityPublisher, advertisable_bytes
from vramguard.kube.claims import KubeClaimSource
from vramguard.kube.correlator import REPEAT_WINDOW_S, EventCorrelator
from vramguard.kube.events import EventRecord, KubeEventRecorder
from vramguard.kube.pods import KubePodSource
from vramguard.kube.reflector import Reflector, WatchExpired, watch_events, watched_object
from vramguard.testing.fakes import FakeClock, FakePodSource, SteppedClock, pod
from vramguard_testbed.waiting import wait_until

POD = {
    "metadata": {"uid": "u1", "name": "p", "namespace": "ns", "resourceVersion": "10"},
    "spec": {"containers": [{"name": "main"}]},
}


def source() -> KubePodSource:
    return KubePodSource(client.ApiClient(), "node-1")


@pytest.mark.parametrize(
    ("events", "pods", "resource_version"),
    [
        pytest.param([("ADDED", POD)], {"u1"}, "10", id="added-pod-is-cached"),
        pytest.param([("ADDED", POD), ("DELETED", POD)], set(), "10", id="deleted-pod-is-forgotten"),
        pytest.param(
            [("BOOKMARK", {"metadata": {"resourceVersion": "42"}})], set(), "42", id="bookmark-advances-the-version"
        ),
        pytest.param(
            [("ADDED", {"metadata": {"name": "no-uid", "resourceVersion": "11"}})], set(), "11", id="bad-pod-skipped"
        ),
    ],
)
def test_watch_events_update_the_cache(
    events: list[tuple[str, dict[str, Any]]], pods: set[str], resource_version: str
) -> None:
    """ADDED/MODIFIED/DELETED change the cache, BOOKMARK only the resourceVersion; bad objects are skipped."""
    s = source()
    rv = "1"
    for event_type, event_object in events:
        kind, obj, rv = watched_object({"type": event_type, "object": event_object}, rv)
        if kind != "BOOKMARK":
            s.apply(kind, obj)
    assert set(s._pods) == pods
    assert rv == resource_version


def test_watch_410_means_relist() -> None:
    """An ERROR event with code 410 (resourceVersion too old) asks for a relist; other errors are errors."""
    with pytest.raises(WatchExpired):
        watched_object({"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}, "1")
    with pytest.raises(RuntimeError, match="500"):
        watched_object({"type": "ERROR", "object": {"code": 500, "message": "boom"}}, "1")


def test_unchanged_pod_keeps_its_object() -> None:
    """A MODIFIED event that changes nothing the agent reads keeps the cached object (quotas stay resolved)."""
    s = source()
    s.apply("ADDED", POD)
    first = s._pods["u1"]
    s.apply("MODIFIED", {**POD, "status": {"phase": "Running"}})
    assert s._pods["u1"] is first


class ChunkedResponse:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def stream(self, amt: int, decode_content: bool) -> list[bytes]:
        return self.chunks


def test_events_split_across_chunks() -> None:
    """Watch lines cut anywhere by the transport are reassembled into whole events."""
    body = b'{"type": "ADDED", "object": {}}\n{"type": "BOOKMARK", "object": {}}\n'
    chunks = [body[:7], body[7:40], body[40:]]
    assert [e["type"] for e in watch_events(ChunkedResponse(chunks))] == ["ADDED", "BOOKMARK"]


def test_token_bucket_bounds_bursts_and_rate() -> None:
    """`burst` at once, then `per_minute` spread over the minute."""
    clock = FakeClock(0.0)
    bucket = TokenBucket(burst=3, per_minute=6, clock=clock)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    clock.step(9.9)
    assert not bucket.take()
    clock.step(0.1)
    assert bucket.take()
    clock.step(990.0)
    assert sum(bucket.take() for _ in range(10)) == 3, "refills cap at the burst"


def _device(uuid: str, total_gib: int, parent: str | None = None, healthy: bool = True) -> GpuDevice:
    total = total_gib * GiB
    return GpuDevice(
        index=0, uuid=uuid, name="g", total_bytes=total, used_bytes=0, free_bytes=total,
        mig_index=0 if parent else None, parent_uuid=parent, healthy=healthy,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("devices", "reserve", "expected_gib"),
    [
        pytest.param([_device("GPU-a", 80), _device("GPU-b", 80)], 0, 160, id="whole-gpus-add-up"),
        pytest.param(
            [_device("GPU-a", 80), _device("MIG-1", 40, "GPU-a"), _device("MIG-2", 20, "GPU-a")],
            0,
            60,
            id="mig-instances-count-not-their-parent",
        ),
        pytest.param([_device("GPU-a", 80), _device("GPU-b", 80, healthy=False)], 0, 80, id="unhealthy-gpu-left-out"),
        pytest.param([_device("GPU-a", 24)], 4 * GiB, 20, id="reserve-is-kept-back"),
        pytest.param([_device("GPU-a", 2)], 4 * GiB, 0, id="never-below-zero"),
    ],
)
def test_advertisable_bytes(devices: list[GpuDevice], reserve: int, expected_gib: int) -> None:
    """Schedulable GPU memory: whole GPUs or MIG instances that answer NVML, minus the reserve."""
    assert advertisable_bytes(GpuSample(tuple(devices), ()), reserve) == expected_gib * GiB


class RefusingCore:
    """Stands in for CoreV1Api's one call the publisher makes, answering like an admission policy that denies."""

    def __init__(self) -> None:
        self.calls = 0

    def patch_node_status(self, name: str, body: object, _content_type: str, _request_timeout: object) -> None:
        self.calls += 1
        raise client.ApiException(status=403, reason="Forbidden")


def test_capacity_publisher_backs_off_after_a_refusal() -> None:
    """A denied PATCH is not raised; it is retried after 10 s, then 20 s, ... — not once per scan."""
    clock = FakeClock(0.0)
    publisher = KubeCapacityPublisher(
        client.ApiClient(), "node-1", clock=clock, runner=Inline(), backoff=Backoff(10.0, 600.0, jitter=0.0)
    )
    core = RefusingCore()
    publisher.core = core  # type: ignore[assignment]
    sample = GpuSample((_device("GPU-a", 24),), ())
    publisher.start()
    attempts = []
    with capture_logs() as logs:
        for _ in range(0, 40):
            publisher.publish(sample)
            attempts.append(core.calls)
            clock.step(1.0)
    publisher.stop(clock.now())
    assert core.calls == 3  # at 0 s, 10 s and 30 s
    assert attempts[9] == 1 and attempts[10] == 2 and attempts[29] == 2 and attempts[30] == 3
    assert [e["event"] for e in logs] == ["capacity_publish_failed"], "one line for a run of the same refusal"


@pytest.mark.parametrize(
    ("initial", "cap", "draws", "expected"),
    [
        pytest.param(1.0, 60.0, [0.0] * 8, [1, 2, 4, 8, 16, 32, 60, 60], id="doubles-up-to-the-cap"),
        pytest.param(1.0, 60.0, [1.0] * 3, [1.5, 3, 6], id="jitter-stretches-by-up-to-half"),
        pytest.param(10.0, 600.0, [0.5, 0.0], [12.5, 20], id="each-delay-draws-its-own-jitter"),
    ],
)
def test_backoff_grows_with_jitter(initial: float, cap: float, draws: list[float], expected: list[float]) -> None:
    """Delays double up to the cap, each stretched by jitter x a random draw (so a fleet spreads out)."""
    it = iter([*draws, 0.0])
    backoff = Backoff(initial, cap, jitter=0.5, rng=lambda: next(it))
    assert [backoff.next() for _ in draws] == expected
    backoff.reset()
    assert backoff.next() == initial, "a reset starts again from the initial delay"


def test_backoff_spreads_a_fleet() -> None:
    """A thousand agents failing together retry over a spread of times, not in lockstep."""
    delays = sorted(Backoff(1.0, 60.0).next() for _ in range(1000))
    assert delays[0] >= 1.0 and delays[-1] <= 1.5
    assert delays[900] - delays[100] > 0.3


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
    """Stop the writer, giving it 5 s (real: it joins the thread) to finish the Event it is writing."""
    recorder.stop(recorder.clock.now() + 5)


def write_all(recorder: KubeEventRecorder) -> None:
    """Start the writer, let it write everything queued, stop it."""
    recorder.start()
    try:
        assert recorder.flush(15)
    finally:
        stop(recorder)


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
        pytest.param([(0, M)], [], [("create", 1)], {"written": 1}, id="first-time-a-create"),
        pytest.param(
            [(0, M), (1, M), (2, M)],
            [],
            [("create", 1), ("patch", 2), ("patch", 3)],
            {"written": 1, "patched": 2},
            id="repeats-after-the-write-patch-its-count",
        ),
        pytest.param(
            [(0, M), (REPEAT_WINDOW_S + 1, M)],
            [],
            [("create", 1), ("create", 1)],
            {"written": 2},
            id="a-repeat-after-the-window-is-a-new-event",
        ),
        pytest.param(
            [(0, M), (1, "container main uses 6GiB")],
            [],
            [("create", 1), ("create", 1)],
            {"written": 2},
            id="another-message-is-another-event",
        ),
        pytest.param(
            [(0, M), ("deleted", M), (2, M)],
            [],
            [("create", 1), ("patch", 2), ("create", 1), ("patch", 2)],
            {"written": 2, "patched": 1},
            id="deleted-on-the-server-a-404-then-written-afresh",
        ),
        pytest.param(
            [(0, M), (1, M)],
            [409],
            [("create", 1), ("patch", 2)],
            {"written": 1, "patched": 1},
            id="a-409-on-create-means-written-and-a-repeat-patches-it",
        ),
        pytest.param(
            [(0, M), (1, M)],
            [503],
            [("create", 1), ("create", 1), ("patch", 2)],
            {"written": 1, "patched": 1},
            id="a-503-is-retried-with-the-same-name",
        ),
        pytest.param(
            [(0, M), (1, M)],
            [403],
            [("create", 1), ("create", 1), ("patch", 2)],
            {"written": 1, "patched": 1},
            id="a-403-is-retried-with-the-same-name",
        ),
    ],
)
def test_event_repeat_patch(
    steps: list[tuple[float | str, str]], fail: list[int], calls: list[tuple[str, int]], results: dict[str, int]
) -> None:
    """Said again within REPEAT_WINDOW_S of being written, an Event is a PATCH of its count; otherwise (a
    new message, the window passed, the Event deleted) it is created afresh. Retries keep the Event's name."""
    core = FakeEventsApi(fail)
    clock = FakeClock(0.0)
    recorder, counts = _recorder(core, clock=clock)
    recorder.start()
    p = pod("noisy", "ml")
    try:
        for at, message in steps:
            if at == "deleted":
                core.stored.clear()
            else:
                assert isinstance(at, float | int)
                clock.step(max(0.0, at - clock.now()))  # a retry's back-off may have passed it already
            recorder.record(p, R, message)
            assert recorder.flush(15)
    finally:
        stop(recorder)
    assert [(verb, count) for verb, _, count in core.calls] == calls
    assert counts == results
    names = [name for verb, name, _ in core.calls]
    if fail:  # the retry, and everything after it, speak of the one Event first created
        assert len(set(names)) == 1


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
    clock = SteppedClock()
    bucket = TokenBucket(burst=1, per_minute=600, clock=clock)  # a token per 0.1 s of the clock
    for _ in range(1 - tokens_at_start):
        assert bucket.take()
    recorder, counts = _recorder(core, bucket=bucket, clock=clock)
    for i in range(warnings):
        recorder.record(pod(f"p{i}", "ml"), "VRAMQuotaExceeded", "over")
    recorder.start()
    try:
        wait_until(lambda: len(core.bodies) == len(written_before), 5, "the warnings the bucket had tokens for")
        wait_until(lambda: clock.waiting, 5, "the writer waiting for a token")
        assert _written(core) == written_before, "no token, no write, though warnings are queued"
        recorder.record(pod("greedy", "ml"), "VRAMEvicted", "evicted", important=True)
        clock.step(0.1)  # the next token is due
        wait_until(lambda: len(core.bodies) == len(written_before) + 1, 5, "the next write")
    finally:
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


class ListResponse:
    def __init__(self, data: bytes) -> None:
        self.data = data


class FakeDraApi:
    """resource.k8s.io/v1 as an API server serves it (`served`) or does not (every request: 404), with no claims
    (GETs answer 404, or `get_error`): counts the requests. With `stop_slices_at`, it stops the slice reflector at
    that request, so a test can run the reflector on its own thread."""

    def __init__(self, served: bool, stop_slices_at: int | None = None) -> None:
        self.served = served
        self.stop_slices_at = stop_slices_at
        self.slices: Reflector | None = None
        self.slice_requests = self.gets = 0
        self.get_error: ApiException | None = None

    def list_cluster_custom_object(self, *args: Any, watch: bool = False, **kwargs: Any) -> Any:
        self.slice_requests += 1
        if self.slice_requests == self.stop_slices_at:
            assert self.slices is not None
            self.slices.stop(self.slices.clock.now())
        if not self.served:
            raise ApiException(status=404, reason="Not Found")
        if watch:
            return HangingResponse()
        return ListResponse(b'{"metadata": {"resourceVersion": "1"}, "items": []}')

    def get_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> Any:
        self.gets += 1
        raise self.get_error or ApiException(status=404, reason="Not Found")


def claim_pod(name: str) -> PodInfo:
    """A pod whose one container holds the claim `<name>-gpu`."""
    named = replace(pod(name, "ml"), claims={"gpu": f"{name}-gpu"})
    return replace(named, containers=(replace(named.containers[0], claims=(ClaimUse("gpu"),)),))


def listed_claim_source(api: FakeDraApi, pods: list[PodInfo], clock: FakeClock) -> KubeClaimSource:
    """A claim source whose slice reflector made its requests on this thread (its LIST and WATCH, or its 404s) until
    `api` stopped it; its claim thread not started: the test runs its cycles (`read_once`)."""
    source = KubeClaimSource(client.ApiClient(), "node-a", FakePodSource(pods), clock=clock)
    source.objects = api  # type: ignore[assignment]
    api.slices = source.slices
    source.slices._run()
    return source


@pytest.mark.parametrize("served", [True, False], ids=["v1-served", "no-resource.k8s.io/v1"])
def test_claims_are_read_only_where_the_api_server_serves_them(served: bool) -> None:
    """A pod naming a claim: with resource.k8s.io/v1 the claim is read (after the slices) and reported missing;
    without it, no claim is read at all (each GET would 404, and the claim be reported missing for nothing)."""
    named = claim_pod("p")
    api = FakeDraApi(served, stop_slices_at=2)  # the WATCH after the LIST; or the retry after the first 404
    source = listed_claim_source(api, [named], FakeClock())
    for _ in range(3):  # three cycles of the claim reader
        source.read_once()
    assert source.wait_synced(0)
    if served:
        ((missing,),) = source.shares()[named.uid].values()
        assert missing.error is not None and missing.error.message == "does not exist"
        assert api.gets == 1 and source.problem() is None
    else:
        assert api.gets == 0 and source.shares() == {}
        assert source.problem() == "the API server does not serve resource.k8s.io/v1 (Kubernetes 1.34 or later has it)"


def test_claim_read_failures_are_logged_once_per_run() -> None:
    """Claims of 3 pods failing to be read on a failing API server: one `claim_read_failed` line, not one per claim;
    read again `retry_s` later, the first success logs one `claim_read_recovered`."""
    clock = FakeClock()
    api = FakeDraApi(served=True, stop_slices_at=2)
    source = listed_claim_source(api, [claim_pod("a"), claim_pod("b"), claim_pod("c")], clock)
    api.get_error = ApiException(status=503, reason="Service Unavailable")
    with capture_logs() as logs:
        source.read_once()
        assert api.gets == 3 and not source.wait_synced(0)
        api.get_error = None
        source.read_once()
        assert api.gets == 3, "not read again before retry_s"
        clock.step(source.retry_s)
        source.read_once()
    assert api.gets == 6 and source.wait_synced(0)
    failed = ("claim_read_failed", "503 Service Unavailable")
    recovered = ("claim_read_recovered", "503 Service Unavailable")
    seen = [(e["event"], e.get("error") or e.get("last_error")) for e in logs if e["event"].startswith("claim_")]
    assert seen == [failed, recovered]


def test_claim_source_starts_and_stops() -> None:
    """Constructed idle (no request); `start()` lists the slices and reads claims on its threads; `stop(deadline)`
    ends both while the slice watch waits on a silent server."""
    named = claim_pod("p")
    api = FakeDraApi(served=True)
    source = KubeClaimSource(client.ApiClient(), "node-a", FakePodSource([named]))
    source.objects = api  # type: ignore[assignment]
    assert api.slice_requests == 0 and not source.wait_synced(0)
    source.start()
    try:
        assert source.wait_synced(5) and api.gets == 1
    finally:
        source.stop(source.clock.now() + 5)
    assert not source._thread.is_alive() and not source.slices._thread.is_alive()
