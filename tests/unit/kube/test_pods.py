"""The pod source's watch: events update its cache, a 410 relists, chunks are joined. Its calls to the API server
are tested against a real one in tests/cluster/."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from structlog.testing import capture_logs

from vramguard.kube.pods import KubePodSource
from vramguard.kube.reflector import WatchExpired, watch_events, watched_object
from vramguard_testbed.fakes import FakeKubeletPods

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


STATIC = "6f0c2c0b1b6e4b3f8e1d2a3b4c5d6e7f"  # the UID the kubelet runs the static pod under
MIRROR_POD = {
    "metadata": {
        "uid": "m1",
        "name": "job-node-1",
        "namespace": "ml",
        "resourceVersion": "20",
        "annotations": {"kubernetes.io/config.mirror": STATIC},
    },
    "spec": {"nodeName": "node-1", "containers": [{"name": "main"}]},
}


VICTIM_UID = "1b2c3d4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e"
VICTIM = {
    "metadata": {"uid": VICTIM_UID, "name": "victim", "namespace": "ml", "resourceVersion": "12"},
    "spec": {"containers": [{"name": "main"}]},
}


def forged(uid: str, claims: str, rv: str) -> dict[str, Any]:
    """A tenant's pod (metadata.uid `uid`) that claims to be the mirror of the pod of UID `claims`."""
    meta = {"uid": uid, "name": f"forged-{uid}", "namespace": "tenant", "resourceVersion": rv}
    return {**MIRROR_POD, "metadata": {**meta, "annotations": {"kubernetes.io/config.mirror": claims}}}


@pytest.mark.parametrize(
    ("events", "served", "refusals"),
    [
        pytest.param([("ADDED", MIRROR_POD)], {STATIC: "m1"}, 0, id="mirror-served-under-the-kubelets-uid"),
        pytest.param(
            [("ADDED", MIRROR_POD), ("MODIFIED", {**MIRROR_POD, "status": {"qosClass": "Burstable"}})],
            {STATIC: "m1"}, 0, id="mirror-update-replaces-its-entry",
        ),
        pytest.param([("ADDED", MIRROR_POD), ("DELETED", MIRROR_POD)], {}, 0, id="mirror-deletion-forgets-it"),
        pytest.param(
            [("ADDED", VICTIM), ("ADDED", forged("f1", VICTIM_UID, "21"))], {VICTIM_UID: VICTIM_UID}, 1,
            id="forged-claim-on-a-real-pod",
        ),
        pytest.param(
            [("ADDED", VICTIM), ("DELETED", VICTIM), ("ADDED", forged("f1", VICTIM_UID, "21"))], {}, 1,
            id="forged-claim-on-a-deleted-pod-refused-by-its-remembered-uid",
        ),
        pytest.param(
            [("ADDED", MIRROR_POD), ("ADDED", forged("f1", STATIC, "21"))], {STATIC: "m1"}, 1,
            id="second-claim-voids-nothing",
        ),
        pytest.param(
            [("ADDED", MIRROR_POD), ("ADDED", forged("f1", STATIC, "21")), ("MODIFIED", forged("f1", STATIC, "22"))],
            {STATIC: "m1"}, 1, id="a-refusal-is-logged-once",
        ),
        pytest.param(
            [("ADDED", forged("f1", STATIC, "21")), ("ADDED", MIRROR_POD)], {STATIC: "m1"}, 1,
            id="a-forgery-first-takes-nothing-from-the-mirror-after-it",
        ),
        pytest.param(
            [("ADDED", MIRROR_POD), ("ADDED", forged("f1", STATIC, "21")), ("ADDED", forged("f2", STATIC, "22"))],
            {STATIC: "m1"}, 2, id="a-second-forger-is-a-new-refusal",
        ),
    ],
)  # fmt: skip
def test_a_static_pods_mirror_in_the_cache(
    events: list[tuple[str, dict[str, Any]]], served: dict[str, str], refusals: int
) -> None:
    """The cache holds a mirror pod by its own UID, as the watch names it, and serves it by the kubelet's where the
    node backs the claim (`index_pods`); a claim not believed serves nobody and is logged once, when it appears."""
    s = KubePodSource(client.ApiClient(), "node-1", kubelet=FakeKubeletPods({STATIC: ("ml", "job-node-1")}))
    with capture_logs() as logs:
        for kind, obj in events:
            s.apply(kind, obj)
    assert {uid: p.object_uid for uid, p in s._pods.items() if not p.mirrorless} == served
    assert [e["event"] for e in logs].count("pod_mirror_claim_refused") == refusals


def test_a_mirror_made_before_its_sandbox_is_believed_once_the_kubelet_backs_it() -> None:
    """The kubelet makes a mirror pod before the pod's sandbox (and its pod logs directory): the claim waits, and
    is believed when the node's word changes (`rejudge`), with no pod event; the pods are heard again."""
    kubelet = FakeKubeletPods()
    heard: list[set[str]] = []
    s = KubePodSource(
        client.ApiClient(), "node-1", kubelet=kubelet, on_pods=lambda ps: heard.append({p.uid for p in ps})
    )
    s.apply("ADDED", MIRROR_POD)
    assert s.pods() == {} or STATIC not in s._pods
    kubelet.running[STATIC] = ("ml", "job-node-1")
    s.rejudge()
    assert set(s._pods) == {STATIC} and heard[-1] == {STATIC} and s.refused() == {}


class LateKubelet(FakeKubeletPods):
    """The node's word read every few seconds: the kubelet has set up `pending` already, but the last listing
    predates it; `refresh` reads it (and, as `KubeletPods` does, calls `on_change` when it changed)."""

    def __init__(self, pending: dict[str, tuple[str, str]]) -> None:
        super().__init__()
        self.pending = pending
        self.on_change: Callable[[], None] | None = None

    def refresh(self) -> bool:
        super().refresh()
        changed = any(self.running.get(uid) != runs for uid, runs in self.pending.items())
        self.running.update(self.pending)
        if changed and self.on_change is not None:
            self.on_change()
        return changed


def test_a_claim_the_last_listing_does_not_back_makes_the_source_read_the_node_again_at_once() -> None:
    """The kubelet makes the mirror pod and the pod together, and its pods are read every REFRESH_S: a claim refused
    for want of the node's word reads it again at once (on the watch's thread), and is believed then, before the
    kubelet could delete a forgery and leave its refusal said with the wrong reason."""
    kubelet = LateKubelet({STATIC: ("ml", "job-node-1")})
    s = KubePodSource(client.ApiClient(), "node-1", kubelet=kubelet)
    kubelet.on_change = s.rejudge
    s.apply("ADDED", MIRROR_POD)
    assert (kubelet.refreshes, set(s._pods), s.refused()) == (1, {STATIC}, {})
    s.apply("MODIFIED", MIRROR_POD)
    assert kubelet.refreshes == 1, "a believed claim reads nothing"


def test_a_fresh_read_believes_only_the_claims_the_node_backs() -> None:
    """What confirms an orphan (`present`) holds each pod's own UID and a believed mirror's claim: a forged claim on
    a gone pod's UID does not make that pod present, so it shields none of its processes."""
    s = KubePodSource(client.ApiClient(), "node-1", kubelet=FakeKubeletPods({STATIC: ("ml", "job-node-1")}))
    s.apply("ADDED", VICTIM)
    s.apply("DELETED", VICTIM)
    items = [MIRROR_POD, forged("f1", VICTIM_UID, "21")]
    assert set(s._uids(items)) == {"m1", "f1", STATIC}


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
