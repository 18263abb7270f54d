"""`kubectl vramguard` reading the agents: their pods found by the chart's label, each /status read through the
API server's pod proxy, bounded in size and time, a failure a row saying why."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError, NewConnectionError, ReadTimeoutError

from vramguard.plugin import fetch
from vramguard.plugin.fetch import AgentPod, Release, agent_from_pod, find_agents, read_all, read_status, release_agents
from vramguard.plugin.merge import Answer, Failure, merge_rows
from vramguard_testbed.fakes import FakeClock

from .agents import (
    FakeCore,
    FakeResponse,
    agent_pod,
    core_for,
    fleet,
    ref,
    rows_of,
    status_doc,
    status_exception,
)


def test_agent_pods_are_found_by_the_charts_label() -> None:
    """Agents are found by the chart's label, on one node by a field selector, in all namespaces or the one given."""
    core = core_for(fleet())
    agents = find_agents(core, None, "node-a")
    assert core.lists[0]["label_selector"] == "app.kubernetes.io/name=vramguard"
    assert core.lists[0]["field_selector"] == "spec.nodeName=node-a"
    assert core.lists[0]["namespace"] is None
    assert [a.ref.pod for a in agents] == [
        "vramguard-node-a",
        "vramguard-node-b",
        "vramguard-node-c",
        "vramguard-node-d",
    ]
    find_agents(core, "vramguard")
    assert core.lists[1]["namespace"] == "vramguard" and "field_selector" not in core.lists[1]


def test_the_status_is_read_through_the_proxy_on_the_metrics_port() -> None:
    """Each agent's /status is read through the API server's pod proxy on the agent's metrics port."""
    core = core_for(fleet()[:1])
    [got] = read_all(core, [agent_from_pod(agent_pod("node-a", port=9555))])
    assert isinstance(got, Answer) and got.document["agent"]["node"] == "node-a"
    assert core.proxied == [("vramguard-node-a:9555", "vramguard", "status")]


def refused() -> MaxRetryError:
    cause = NewConnectionError(None, "Failed to establish a new connection: [Errno 111] Connection refused")  # type: ignore[arg-type]
    return MaxRetryError(None, "/api/v1/...", cause)  # type: ignore[arg-type]


def forbidden() -> ApiException:
    return status_exception(403, "Forbidden", 'pods "vramguard-x" is forbidden: cannot get resource "pods/proxy"')


def agent_404() -> ApiException:
    e = ApiException(status=404, reason="Not Found")
    e.body = "not found\n"
    return e


@pytest.mark.parametrize(
    ("failure", "why"),
    [
        pytest.param(refused, "NewConnectionError", id="api-server-refused"),
        pytest.param(lambda: ReadTimeoutError(None, "/", "read timed out"), "timed out after 5s", id="timeout"),  # type: ignore[arg-type]
        pytest.param(forbidden, "403 Forbidden: pods", id="forbidden"),
        pytest.param(forbidden, "bind the vramguard-viewer ClusterRole", id="forbidden-hint"),
        pytest.param(
            lambda: status_exception(503, "Service Unavailable", "dial tcp 10.0.0.9:9400: connect: connection refused"),
            "503 Service Unavailable: dial tcp 10.0.0.9:9400: connect: connection refused",
            id="agent-refused",
        ),
        pytest.param(agent_404, "serves no /status", id="older-agent-without-status"),
        pytest.param(lambda: b"{not json", "unreadable JSON: line 1, column 2", id="not-json"),
        pytest.param(lambda: b"[" * 50_000 + b"]" * 50_000, "nested deeper than 64 levels", id="50000-deep"),
        pytest.param(lambda: RuntimeError("boom"), "RuntimeError: boom", id="anything-else"),
    ],
)
def test_an_agent_that_fails_is_a_row_saying_why(failure: Any, why: str) -> None:
    """An agent that cannot be read is a row saying why, and the other agents' rows stay whole."""
    core = core_for(fleet()[:2], {"vramguard-node-b": failure})
    agents = find_agents(core)
    rows = merge_rows(read_all(core, agents))
    [row] = rows_of(rows, "node-b")
    assert why in row.state and row.agent == "vramguard/vramguard-node-b"
    assert len(rows_of(rows, "node-a")) == 4


def test_a_pod_not_running_is_not_asked() -> None:
    """An agent pod that is not Running is a failure naming its phase, and is not asked."""
    core = FakeCore([agent_pod("node-p", phase="Pending")], {})
    [got] = read_all(core, find_agents(core))
    assert isinstance(got, Failure) and got.reason == "pod is Pending"
    assert core.proxied == []


def test_the_body_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A status body over MAX_BODY_BYTES is a failure saying so."""
    monkeypatch.setattr(fetch, "MAX_BODY_BYTES", 1000)
    monkeypatch.setattr(fetch, "CHUNK_BYTES", 100)
    core = FakeCore([agent_pod("node-b")], {"vramguard-node-b": b"x" * 5000})
    [got] = read_all(core, find_agents(core))
    assert isinstance(got, Failure) and got.reason == "status body over 1000 bytes"


def test_a_trickling_agent_is_cut_at_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent that sends its body slowly is cut at its deadline, a failure, and its response is released."""
    monkeypatch.setattr(fetch, "CHUNK_BYTES", 10)
    clock = FakeClock()
    agent = AgentPod(ref("node-t"), 9400, "Running")
    body = json.dumps(status_doc("node-t", [], [])).encode()
    slow = FakeResponse(body, clock, step=1.0)  # a second per 10 bytes

    class Core(FakeCore):
        def connect_get_namespaced_pod_proxy_with_path(self, *a: Any, **kw: Any) -> Any:
            return slow

    got = read_status(Core([], {}), agent, timeout_s=3.0, clock=clock)
    assert isinstance(got, Failure) and got.reason == "timed out after 3s"
    assert slow.released


def test_reads_are_concurrent_and_bounded() -> None:
    """Reads run `workers` at once and no more, and the answers keep the agents' order."""
    workers = 3
    meeting = threading.Barrier(workers, timeout=10)  # passes only when `workers` reads are in flight at once
    in_flight, most = 0, 0
    lock = threading.Lock()

    def meet(node: str) -> Any:
        def answer_() -> Any:
            nonlocal in_flight, most
            with lock:
                in_flight += 1
                most = max(most, in_flight)
            meeting.wait()
            with lock:
                in_flight -= 1
            return status_doc(node, [], [])

        return answer_

    nodes = [f"node-{i}" for i in range(9)]
    core = FakeCore([agent_pod(n) for n in nodes], {f"vramguard-{n}": meet(n) for n in nodes})
    got = read_all(core, find_agents(core), workers=workers)
    assert all(isinstance(g, Answer) for g in got)
    assert [g.agent.node for g in got] == nodes  # in the agents' order
    assert most == workers


def test_a_releases_agents_are_its_daemonsets_pods_in_its_namespace() -> None:
    """A release's agents are listed in its namespace by its DaemonSet's selector; a pod there with its labels that
    another controller (or nobody) made is left out, and named; one elsewhere is never listed."""
    pods = [
        agent_pod("node-a"),
        agent_pod("node-b", owner=None),
        agent_pod("node-c", owner=("ReplicaSet", "vramguard")),
        agent_pod("node-t", namespace="tenant"),
    ]
    core = FakeCore(pods, {})
    agents, strangers = release_agents(core, Release("vramguard", "vramguard"))
    assert core.lists == [{"namespace": "vramguard", "label_selector": (
        "app.kubernetes.io/name=vramguard,app.kubernetes.io/instance=vramguard"), "limit": 500,
        "_preload_content": False, "_request_timeout": fetch.LIST_TIMEOUT}]  # fmt: skip
    assert [a.ref.pod for a in agents] == ["vramguard-node-a"]
    assert [(a.ref.pod, a.controller) for a in strangers] == [
        ("vramguard-node-b", ""),
        ("vramguard-node-c", "ReplicaSet/vramguard"),
    ]


@pytest.mark.parametrize(
    ("release", "want"),
    [
        pytest.param(Release("vramguard", "vramguard"),
                     ("vramguard", "vramguard-policy", 'job="vramguard-metrics",namespace="vramguard"'), id="readme"),
        pytest.param(Release("gpu", "x" * 49 + "-long"),
                     ("x" * 49, "x" * 49 + "-policy", f'job="{"x" * 49}-metrics",namespace="gpu"'), id="cut-at-50"),
    ],
)  # fmt: skip
def test_a_release_names_its_objects_as_the_chart_does(release: Release, want: tuple[str, str, str]) -> None:
    """The DaemonSet, the policy ConfigMap and the scrape job are named as the chart's _helpers.tpl names them."""
    assert (release.daemonset, release.policy_config_map, release.scrape_selector) == want
