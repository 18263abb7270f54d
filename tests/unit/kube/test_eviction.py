"""Evictions through policy/v1: a PodDisruptionBudget's 429 is retried, then refused; other answers end at once."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from vramguard.base.backoff import Backoff
from vramguard.core.ports import EvictResult
from vramguard.kube.eviction import KubeEvictor
from vramguard_testbed.fakes import FakeClock, pod

POD = pod("trainer", "ml")


def refusal(status: int, message: str = "") -> ApiException:
    e = ApiException(status=status, reason="Reason")
    e.body = json.dumps({"kind": "Status", "message": message}) if message else None
    return e


class FakeCoreApi:
    """CoreV1Api's eviction call, answering from `answers` in turn (an exception is raised, None succeeds), and
    recording each request's pod, namespace and precondition UID."""

    def __init__(self, *answers: BaseException | None) -> None:
        self.answers = list(answers)
        self.requests: list[tuple[str, str, str]] = []

    def create_namespaced_pod_eviction(self, name: str, namespace: str, body: Any, **kwargs: Any) -> None:
        self.requests.append((name, namespace, body.delete_options.preconditions.uid))
        answer = self.answers.pop(0)
        if answer is not None:
            raise answer


def evictor(core: FakeCoreApi, clock: FakeClock, attempts: int = 3) -> KubeEvictor:
    evictor = KubeEvictor(
        client.ApiClient(), attempts=attempts, backoff=lambda: Backoff(0.5, 4.0, jitter=0.0), clock=clock
    )
    evictor.core = core  # type: ignore[assignment]  # the API server's side, faked at our own wrapper's edge
    return evictor


BUDGET = "Cannot evict pod as it would violate the pod's disruption budget."


@pytest.mark.parametrize(
    ("answers", "result", "requests", "waits"),
    [
        pytest.param([None], EvictResult(evicted=True, refused=False), 1, [], id="evicted"),
        pytest.param(
            [refusal(429, BUDGET), None], EvictResult(evicted=True, refused=False), 2, [0.5], id="budget-then-evicted"
        ),
        pytest.param(
            [refusal(429, BUDGET)] * 3,
            EvictResult(evicted=False, refused=True, message=BUDGET),
            3,
            [0.5, 1.0],
            id="budget-until-the-attempts-run-out",
        ),
        pytest.param(
            [refusal(404, 'pods "trainer" not found')],
            EvictResult(evicted=False, refused=False, gone=True, message='pods "trainer" not found'),
            1,
            [],
            id="gone-already",
        ),
        pytest.param(
            [refusal(409, "Precondition failed: UID")],
            EvictResult(evicted=False, refused=False, gone=True, message="Precondition failed: UID"),
            1,
            [],
            id="another-pod-under-the-name",
        ),
        pytest.param(
            [refusal(403, "forbidden")],
            EvictResult(evicted=False, refused=False, message="403: forbidden"),
            1,
            [],
            id="an-error-fails-at-once",
        ),
        pytest.param(
            [TimeoutError("read timed out")],
            EvictResult(evicted=False, refused=False, message="TimeoutError: read timed out"),
            1,
            [],
            id="no-answer-fails-at-once",
        ),
    ],
)
def test_an_eviction_comes_to_one_result(
    answers: list[BaseException | None], result: EvictResult, requests: int, waits: list[float]
) -> None:
    """Only a 429 is retried, after a back-off on the clock; the result says evicted, refused, gone or failed."""
    core, clock = FakeCoreApi(*answers), FakeClock()
    assert evictor(core, clock).evict(POD, "over quota") == result
    assert len(core.requests) == requests
    assert clock.waits == waits


def test_an_eviction_is_preconditioned_on_the_pods_uid() -> None:
    """A pod re-created under the same name is never evicted for its predecessor: the UID travels with it, the
    mirror pod's for a static pod."""
    core = FakeCoreApi(None, None)
    ev = evictor(core, FakeClock())
    ev.evict(POD, "over quota")
    ev.evict(replace(pod("etcd-node1", "kube-system"), mirror_uid="m1"), "over quota")
    assert core.requests == [("trainer", "ml", POD.uid), ("etcd-node1", "kube-system", "m1")]
