"""Events owed while the API server refuses them with a 403 that it later takes back, as a restarting API server does
until its authorizer has loaded RBAC: the real agent, a real kube-apiserver, the agent's ServiceAccount as deployed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from vramguard.core.quantity import GiB, MiB
from vramguard.kube.client import FORBIDDEN_GRACE_S
from vramguard_testbed.waiting import wait_until

from .kube_fixtures import AGENT_NAMESPACE, MERGE, KubeNode, metric

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]

VRAM = "vramguard.io/vram"
POLL_S = 0.5
ROLE = "vramguard"  # the agent's ClusterRole in deploy/daemonset.yaml


def _agent_may_create_events(api: client.ApiClient, namespace: str) -> bool:
    """What the API server's authorizer now says of the agent's ServiceAccount creating an Event in `namespace`."""
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=f"system:serviceaccount:{AGENT_NAMESPACE}:vramguard",
            groups=["system:serviceaccounts", f"system:serviceaccounts:{AGENT_NAMESPACE}", "system:authenticated"],
            resource_attributes=client.V1ResourceAttributes(namespace=namespace, verb="create", resource="events"),
        )
    )
    answer = client.AuthorizationV1Api(api).create_subject_access_review(review)
    return bool(answer.status and answer.status.allowed)


@contextmanager
def _events_denied(api: client.ApiClient, namespace: str) -> Iterator[None]:
    """The agent's ClusterRole without its Events rule for the duration; the rule is back at the end, whatever
    happens inside, and the authorizer has seen each change before this goes on."""
    rbac = client.RbacAuthorizationV1Api(api)
    # The rules as the API server takes them, in its field names.
    rules: list[dict[str, Any]] = api.sanitize_for_serialization(rbac.read_cluster_role(ROLE).rules or [])  # type: ignore[no-untyped-call]
    assert any("events" in r.get("resources", ()) for r in rules), f"no Events rule in {json.dumps(rules)}"
    without = [r for r in rules if "events" not in r.get("resources", ())]
    rbac.patch_cluster_role(ROLE, {"rules": without}, _content_type=MERGE)  # a merge patch replaces the list
    try:
        wait_until(lambda: not _agent_may_create_events(api, namespace), 10, "the Events rule gone", interval_s=0.05)
        yield
    finally:
        rbac.patch_cluster_role(ROLE, {"rules": rules}, _content_type=MERGE)
        wait_until(lambda: _agent_may_create_events(api, namespace), 10, "the Events rule back", interval_s=0.05)


def _refused(log: Path) -> bool:
    """Whether the agent has logged an Event write refused with a 403."""
    lines = log.read_text(errors="replace").splitlines()
    return any('"event_failed"' in line and "403" in line for line in lines)


def test_an_event_refused_with_a_403_arrives_once_the_authorizer_allows_it(
    node: KubeNode, namespace: str, tmp_path: Path
) -> None:
    """The agent owes a VRAMQuotaExceeded Event while RBAC refuses it (403): it retries with back-off instead of
    dropping it, and the Event arrives once, exactly once, when the authorizer allows Events again."""
    pod, sim_pod = node.pod("greedy", namespace, limits={VRAM: "1Gi"})
    proc = node.sim.spawn(sim_pod, "main", 512 * MiB)
    log = tmp_path / "agent.log"
    with log.open("wb") as stderr:
        node.sim.start_agent("--mode", "warn", "--poll-interval", str(POLL_S), stderr=stderr)
    node.sim.wait_ready()

    with _events_denied(node.api, namespace):
        node.sim.set_usage(proc, 2 * GiB)
        wait_until(lambda: _refused(log), 10, "the agent's Event write refused with a 403", interval_s=0.1)
        assert node.reasons(pod) == []
        assert not metric(node, "vramguard_events_total", result="failed"), "a 403 within its grace is no failure"

    wait_until(lambda: node.reasons(pod) == ["VRAMQuotaExceeded"], FORBIDDEN_GRACE_S, "the owed Event", interval_s=0.2)
    wait_until(lambda: metric(node, "vramguard_events_queued") == 0, 10, "the agent's Event queue empty")
    node.sim.wait_scans(2)  # a second write, were there one, would have landed by now
    (event,) = node.events(pod)
    assert event.count == 1 and "uses 2" in (event.message or ""), event
    assert metric(node, "vramguard_events_total", result="written") == 1.0
    assert not metric(node, "vramguard_events_total", result="failed")
    assert proc.alive(), "warn mode"
