"""The pod source's watch: events update its cache, a 410 relists, chunks are joined. Its calls to the API server
are tested against a real one in tests/cluster/."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from vramguard.kube.pods import KubePodSource
from vramguard.kube.reflector import WatchExpired, watch_events, watched_object

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


def test_each_pod_version_taken_in_is_heard_once_cached() -> None:
    """`on_pods` hears every pod a relist or an event puts in the cache, once the cache holds it (a pod learned
    late calls for a scan); a deletion names no pod."""
    heard: list[tuple[list[str], set[str]]] = []
    s = source()
    s.on_pods = lambda pods: heard.append(([p.uid for p in pods], set(s._pods)))
    second = {**POD, "metadata": {"uid": "u2", "name": "q", "namespace": "ns", "resourceVersion": "11"}}
    s.replace([POD])
    s.apply("ADDED", second)
    s.apply("DELETED", POD)
    assert heard == [(["u1"], {"u1"}), (["u2"], {"u1", "u2"})]


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
