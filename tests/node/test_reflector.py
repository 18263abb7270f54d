"""The reflector and the claim source on their own threads, in real time: `start()` lists then watches there, and
`stop(deadline)` ends a watch blocked on a silent server by shutting its response down, within the deadline."""

from __future__ import annotations

import json
from typing import Any

import structlog
from kubernetes import client

from unit.kube.test_claims import FakeDraApi, SilentWatch, claim_pod
from unit.kube.test_reflector import Names
from vramguard.base.clock import SYSTEM_CLOCK
from vramguard.kube.claims import KubeClaimSource
from vramguard.kube.reflector import Reflector
from vramguard_testbed.fakes import FakePodSource


class Server:
    """A LIST of one object, then a WATCH that stays silent."""

    def __init__(self) -> None:
        self.watch = SilentWatch()
        self.requests: list[str] = []

    def __call__(self, **kwargs: Any) -> Any:
        if kwargs.get("watch"):
            self.requests.append("WATCH")
            return self.watch
        self.requests.append("LIST")
        body = {"metadata": {"resourceVersion": "5"}, "items": [{"metadata": {"name": "a"}}]}
        return type("R", (), {"data": json.dumps(body)})()


def test_started_on_its_thread_and_stopped_by_its_deadline_while_the_watch_is_silent() -> None:
    """The constructor asks nothing; `start()` lists then watches on the reflector's thread; `stop(deadline)`
    shuts the silent watch down and the thread has ended by the deadline."""
    server, store = Server(), Names()
    reflector = Reflector("things", server, store, log=structlog.get_logger("test"))
    assert server.requests == []
    reflector.start()
    assert reflector.wait_listed(SYSTEM_CLOCK.now() + 5) and store.names == {"a"}
    assert server.watch.reading.wait(5), "the watch opened after the list"
    reflector.stop(SYSTEM_CLOCK.now() + 5)
    assert server.watch.closed.is_set() and not reflector.loop.running
    assert server.requests == ["LIST", "WATCH"]


def test_claim_source_starts_and_stops() -> None:
    """Constructed idle (no request); `start()` lists the slices and reads claims on its threads; `stop(deadline)`
    ends both while the slice watch waits on a silent server."""
    api = FakeDraApi(served=True)
    source = KubeClaimSource(client.ApiClient(), "node-a", FakePodSource([claim_pod("p")]))
    source.objects = api  # type: ignore[assignment]
    assert api.slice_requests == 0 and not source.wait_synced(0)
    source.start()
    try:
        assert source.wait_synced(5) and api.gets == 1
    finally:
        source.stop(source.clock.now() + 5)
    assert not source.loop.running and not source.slices.loop.running
