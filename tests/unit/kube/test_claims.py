"""The DRA claim source: reads only where the API server serves resource.k8s.io/v1, failures logged once per run."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from structlog.testing import capture_logs

from vramguard.core.pod import ClaimUse, PodInfo
from vramguard.kube.claims import CYCLE_S, KubeClaimSource
from vramguard.kube.reflector import Reflector
from vramguard_testbed.fakes import FakeClock, FakePodSource, pod


class SilentWatch:
    """A watch on which nothing arrives until the reflector shuts it down (its stop); `reading` is set once it is
    read."""

    def __init__(self) -> None:
        self.reading = threading.Event()
        self.closed = threading.Event()

    def stream(self, amt: int, decode_content: bool) -> Iterator[bytes]:
        self.reading.set()
        self.closed.wait(30)
        yield from ()

    def release_conn(self) -> None:
        pass

    def shutdown(self) -> None:
        self.closed.set()


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
            return SilentWatch()
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
    source.slices.loop.run()
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


def test_the_claim_loop_reads_a_cycle_every_cycle_s_until_stopped() -> None:
    """Constructed idle (no request); the claim loop runs a cycle, then waits `CYCLE_S` on its clock, until the stop;
    the claim is read once, in the first cycle."""
    clock = FakeClock()
    api = FakeDraApi(served=True, stop_slices_at=2)
    source = KubeClaimSource(client.ApiClient(), "node-a", FakePodSource([claim_pod("p")]), clock=clock)
    source.objects = api  # type: ignore[assignment]
    assert api.slice_requests == 0 and not source.wait_synced(0)
    api.slices = source.slices
    source.slices.loop.run()
    clock.on_wait = lambda: source.loop.stopping.set() if source.cycles == 3 else None
    source.loop.run()
    assert source.cycles == 3 and clock.waits == [CYCLE_S] * 3
    assert api.gets == 1 and source.wait_synced(0)
