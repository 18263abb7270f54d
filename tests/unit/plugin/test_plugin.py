"""`kubectl vramguard`: many agents' status documents (some missing, stale, or from an older agent) merged into
`top`'s and `nodes`' rows, read through a fake API server's pod proxy, and rendered."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Mapping
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException
from typer.testing import CliRunner
from urllib3.exceptions import MaxRetryError, NewConnectionError, ReadTimeoutError

from vramguard.core.model import GiB
from vramguard.plugin import fetch
from vramguard.plugin.command import build_app
from vramguard.plugin.fetch import AgentPod, agent_from_pod, find_agents, read_all, read_status
from vramguard.plugin.merge import (
    AgentRef,
    Answer,
    Failure,
    Fetched,
    Level,
    Row,
    SortBy,
    filter_rows,
    merge_nodes,
    merge_rows,
    partial,
    sort_rows,
)
from vramguard.plugin.render import Output, render_nodes, render_top, row_dict
from vramguard.testing.fakes import FakeClock

# --------------------------------------------------------------------------------------------------------------
# Status documents as agents write them


def gpu_doc(
    gpu: str = "0", *, total: int = 80 * GiB, used: int = 0, pressure: bool = False, **extra: Any
) -> dict[str, Any]:
    return {
        "gpu": gpu,
        "uuid": f"GPU-{gpu}",
        "name": "NVIDIA H100",
        "total_bytes": total,
        "used_bytes": used,
        "free_bytes": total - used,
        "healthy": True,
        "error": "",
        "pressure": pressure,
        "limits": "driver",
        **extra,
    }


def container_doc(
    namespace: str, pod: str, used: int, quota: int | None, state: str = "ok", gpu: str = "0", **extra: Any
) -> dict[str, Any]:
    return {
        "gpu": gpu,
        "namespace": namespace,
        "pod": pod,
        "container": "main",
        "processes": [{"pid": 100, "user": "root", "command": "python train.py"}],
        "used_bytes": used,
        "quota_bytes": quota,
        "state": state,
        "held_by": "driver" if quota is not None else "-",
        "claim": "",
        "pids": [100],
        "percent": 100.0 * used / quota if quota else None,
        "quota_source": "limits[vramguard.io/vram]" if quota is not None else "",
        **extra,
    }


def status_doc(
    node: str,
    gpus: list[dict[str, Any]],
    containers: list[dict[str, Any]],
    *,
    scan_age_s: float | None = 1.0,
    poll_interval_s: float = 2.0,
    version: str = "0.2.0",
) -> dict[str, Any]:
    return {
        "kind": "VramguardStatus",
        "schema": 1,
        "agent": {
            "version": version,
            "node": node,
            "mode": "warn",
            "dry_run": False,
            "poll_interval_s": poll_interval_s,
            "scan_age_s": scan_age_s,
        },
        "gpus": gpus,
        "containers": containers,
        "truncated": 0,
    }


def ref(node: str) -> AgentRef:
    return AgentRef("vramguard", f"vramguard-{node}", node)


def answer(node: str, gpus: list[dict[str, Any]], containers: list[dict[str, Any]], **kw: Any) -> Answer:
    return Answer(ref(node), status_doc(node, gpus, containers, **kw))


def fleet() -> list[Fetched]:
    """Three agents that answer, one that does not."""
    return [
        answer(
            "node-a",
            [gpu_doc("0", used=30 * GiB, pressure=True), gpu_doc("1", used=5 * GiB)],
            [
                container_doc("team-a", "train", 20 * GiB, 16 * GiB, "over-hard"),
                container_doc("team-b", "serve", 8 * GiB, 10 * GiB),
                container_doc("-", "-", 2 * GiB, None, "unattributed: no cgroup", container="-"),
                container_doc("team-a", "big", 5 * GiB, 4 * GiB, "over-soft", gpu="1"),
            ],
        ),
        answer(
            "node-b", [gpu_doc("0", used=12 * GiB)], [container_doc("team-b", "batch", 12 * GiB, None, "unmanaged")]
        ),
        answer("node-c", [gpu_doc("0", used=19 * GiB)], [container_doc("team-c", "edge", 19 * GiB, 20 * GiB)]),
        Failure(ref("node-d"), "503 Service Unavailable: connection refused"),
    ]


def rows_of(rows: list[Row], node: str) -> list[Row]:
    return [r for r in rows if r.node == node]


# --------------------------------------------------------------------------------------------------------------
# Merging


def test_every_agent_is_in_the_table_and_the_silent_one_says_why() -> None:
    rows = merge_rows(fleet())
    assert len(rows_of(rows, "node-a")) == 4
    assert [(r.namespace, r.pod) for r in rows_of(rows, "node-b")] == [("team-b", "batch")]
    [silent] = rows_of(rows, "node-d")
    assert silent.state == "no answer: 503 Service Unavailable: connection refused"
    assert silent.agent == "vramguard/vramguard-node-d"
    assert silent.level is Level.problem
    assert partial(fleet())
    assert not partial(fleet()[:3])


def test_many_agents_merge() -> None:
    fetched: list[Fetched] = [
        answer(f"node-{i:03}", [gpu_doc("0")], [container_doc(f"ns-{i % 7}", f"p{i}", i * GiB, 100 * GiB)])
        for i in range(200)
    ]
    fetched[17] = Failure(ref("node-017"), "timed out after 5s")
    rows = merge_rows(fetched)
    assert len(rows) == 200
    assert {r.node for r in rows} == {f"node-{i:03}" for i in range(200)}
    assert [r.state for r in rows if r.error] == ["no answer: timed out after 5s"]


def test_a_stale_agent_is_marked_on_every_row() -> None:
    stale = answer("node-s", [gpu_doc("0")], [container_doc("t", "p", GiB, 2 * GiB)], scan_age_s=600.0)
    fresh = answer("node-f", [gpu_doc("0")], [container_doc("t", "q", GiB, 2 * GiB)], scan_age_s=3.0)
    rows = merge_rows([stale, fresh])
    [s] = rows_of(rows, "node-s")
    [f] = rows_of(rows, "node-f")
    assert s.stale and s.state == "ok (stale: last scan 600s ago)" and s.level is Level.problem
    assert not f.stale and f.state == "ok" and f.level is Level.fine
    [g] = merge_nodes([stale])
    assert g.stale and g.state.startswith("stale")


def test_an_agent_before_its_first_scan_is_a_row() -> None:
    fetched: list[Fetched] = [answer("node-n", [], [], scan_age_s=None)]
    assert [(r.node, r.state) for r in merge_rows(fetched)] == [("node-n", "no scan yet")]
    assert [(g.node, g.state) for g in merge_nodes(fetched)] == [("node-n", "no scan yet")]


def test_an_older_agents_document_is_read_with_defaults() -> None:
    old_gpu = {"gpu": "0", "uuid": "GPU-0", "name": "A100", "total_bytes": 40 * GiB, "used_bytes": 9 * GiB}
    old_row = {"gpu": "0", "namespace": "t", "pod": "p", "container": "c", "used_bytes": 9 * GiB}
    old_row |= {"quota_bytes": 10 * GiB, "state": "ok", "processes": [{"pid": 7}]}
    doc = {"kind": "VramguardStatus", "agent": {"version": "0.1.0", "node": "node-o"}, "gpus": [old_gpu]}
    doc["containers"] = [old_row, "not a row", {"used_bytes": "lots"}]
    [row, junk] = merge_rows([Answer(ref("node-o"), doc)])
    assert (row.held_by, row.quota_source, row.pids, row.agent_version) == ("-", "", (7,), "0.1.0")
    assert row.percent == pytest.approx(90.0)
    assert row.level is Level.near
    assert (junk.used_bytes, junk.pod, junk.state) == (None, "?", "?")
    [g] = merge_nodes([Answer(ref("node-o"), doc)])
    assert (g.limits, g.pressure, g.free_bytes, g.under_quota_bytes) == ("-", False, None, 9 * GiB)


@pytest.mark.parametrize(
    ("document", "why"),
    [
        pytest.param(["a list"], "not a status document (a JSON list)", id="a-list"),
        pytest.param({"kind": "Status"}, "not a status document (kind 'Status')", id="another-kind"),
    ],
)
def test_something_else_than_a_status_is_a_failure_row(document: Any, why: str) -> None:
    fetched = [Answer(ref("node-x"), document)]
    [row] = merge_rows(fetched)
    assert row.state == f"no answer: {why}"
    assert partial(fetched)
    [g] = merge_nodes(fetched)
    assert g.state == f"no answer: {why}"


def test_a_truncated_document_says_so() -> None:
    doc = status_doc("node-t", [gpu_doc("0")], [container_doc("t", "p", GiB, None, "unmanaged")])
    doc["truncated"] = 12
    rows = merge_rows([Answer(ref("node-t"), doc)])
    assert "truncated: 12 more rows not sent by the agent" in [r.state for r in rows]


@pytest.mark.parametrize(
    ("namespace", "node", "want"),
    [
        pytest.param(None, None, 7, id="all"),
        pytest.param("team-a", None, 3, id="namespace-keeps-the-silent-agent"),
        pytest.param("team-b", "node-b", 1, id="namespace-and-node"),
        pytest.param(None, "node-d", 1, id="node-of-the-silent-agent"),
        pytest.param("nobody", "node-c", 0, id="nothing"),
    ],
)
def test_filters(namespace: str | None, node: str | None, want: int) -> None:
    rows = filter_rows(merge_rows(fleet()), namespace, node)
    assert len(rows) == want
    assert all(node is None or r.node == node for r in rows)
    assert all(namespace is None or r.namespace in (namespace, "-") for r in rows)


@pytest.mark.parametrize(
    ("by", "first"),
    [
        pytest.param(None, ("node-a", "0", "-"), id="place"),
        pytest.param(SortBy.used, ("node-a", "0", "train"), id="used"),
        pytest.param(SortBy.overage, ("node-a", "0", "train"), id="overage"),
        pytest.param(SortBy.quota, ("node-c", "0", "edge"), id="quota"),
    ],
)
def test_sort_orders(by: SortBy | None, first: tuple[str, str, str]) -> None:
    rows = sort_rows(merge_rows(fleet()), by)
    assert (rows[0].node, rows[0].gpu, rows[0].pod) == first
    assert rows[-1].node == "node-d" or by is None  # a row without a value sorts last
    if by is SortBy.overage:
        assert [r.pod for r in rows[:3]] == ["train", "big", "edge"]  # +4Gi, +1Gi, -1Gi


def test_nodes_totals() -> None:
    gpus = merge_nodes(fleet())
    by_key = {(g.node, g.gpu): g for g in gpus}
    a0 = by_key["node-a", "0"]
    assert a0.under_quota_bytes == 28 * GiB  # train 20 + serve 8; the unattributed 2 has no quota
    assert a0.unattributed_bytes == 2 * GiB
    assert (a0.total_bytes, a0.used_bytes, a0.free_bytes, a0.limits) == (80 * GiB, 30 * GiB, 50 * GiB, "driver")
    assert a0.state == "pressure" and a0.level is Level.over
    assert by_key["node-a", "1"].under_quota_bytes == 5 * GiB
    assert by_key["node-b", "0"].under_quota_bytes == 0  # unmanaged: no quota
    assert by_key["node-d", "-"].state.startswith("no answer")
    assert [g.node for g in merge_nodes(fleet(), node="node-c")] == ["node-c"]


def test_nodes_shows_an_unhealthy_gpu() -> None:
    bad = answer("node-u", [gpu_doc("0", healthy=False, error="GPU is lost")], [])
    [g] = merge_nodes([bad])
    assert g.state == "unhealthy: GPU is lost" and g.level is Level.problem


# --------------------------------------------------------------------------------------------------------------
# Rendering


def test_pods_over_quota_on_a_gpu_under_pressure_are_marked() -> None:
    rows = {r.pod: r for r in merge_rows(fleet())}
    assert rows["train"].at_risk  # over-hard on GPU 0, under pressure
    assert not rows["big"].at_risk  # over-soft, on GPU 1: no pressure
    assert not rows["serve"].at_risk  # under its quota, on GPU 0
    table = render_top(list(rows.values()), Output.table)
    [train] = [line for line in table.splitlines() if "train" in line]
    assert "over-hard (GPU under pressure)" in train
    assert sum("under pressure" in line for line in table.splitlines()) == 1
    assert json.loads(render_top([rows["train"]], Output.json))["items"][0]["at_risk"] is True


def test_the_tables_name_an_agent_without_an_answer() -> None:
    """The AGENT column is in `-o wide` only: the plain tables name the silent agent in its STATE."""
    said = "no answer from vramguard/vramguard-node-d: 503 Service Unavailable: connection refused"
    for table in (render_top(merge_rows(fleet()), Output.table), render_nodes(merge_nodes(fleet()), Output.table)):
        [silent] = [line for line in table.splitlines() if line.startswith("node-d")]
        assert silent.endswith(said) or f"{said}  " in silent, table
    items = json.loads(render_top(merge_rows(fleet()), Output.json))["items"]
    [failed] = [item for item in items if item["error"]]
    assert failed["state"].startswith("no answer: ") and failed["agent"] == "vramguard/vramguard-node-d"


def test_table_columns() -> None:
    table = render_top(sort_rows(merge_rows(fleet())), Output.table)
    header, *lines = table.splitlines()
    assert header.split() == ["NODE", "GPU", "NAMESPACE", "POD", "CONTAINER", "USED", "QUOTA", "%", "STATE", "HELD-BY"]
    assert len(lines) == 7
    wide = render_top(merge_rows(fleet()), Output.wide).splitlines()[0].split()
    assert wide[-6:] == ["QUOTA-SOURCE", "CLAIM", "PIDS", "AGENT", "VERSION", "COMMAND"]
    assert render_nodes(merge_nodes(fleet()), Output.table).splitlines()[0].split() == [
        "NODE",
        "GPU",
        "NAME",
        "TOTAL",
        "USED",
        "UNDER-QUOTA",
        "UNATTRIBUTED",
        "FREE",
        "LIMITS",
        "STATE",
    ]


def test_tenant_text_is_escaped_in_the_table_and_exact_in_json() -> None:
    hostile = "evil\x1b[2J\u202e"
    rows = merge_rows([answer("node-h", [gpu_doc("0")], [container_doc("t", hostile, GiB, None, "unmanaged")])])
    assert "\x1b" not in render_top(rows, Output.wide)
    assert "evil\\x1b[2J\\u202e" in render_top(rows, Output.table)
    assert json.loads(render_top(rows, Output.json))["items"][0]["pod"] == hostile


@pytest.mark.parametrize("output", [Output.json, Output.yaml])
def test_machine_output_round_trips(output: Output) -> None:
    rows = sort_rows(merge_rows(fleet()))
    load = json.loads if output is Output.json else yaml.safe_load
    top = load(render_top(rows, output))
    assert top == {"kind": "VramguardTop", "items": [row_dict(r) for r in rows]}
    nodes = load(render_nodes(merge_nodes(fleet()), output))
    assert nodes["kind"] == "VramguardNodes" and len(nodes["items"]) == 5


@pytest.mark.parametrize(
    ("pod", "colour", "sgr"),
    [
        pytest.param("train", True, "\x1b[1;31m", id="over-red"),
        pytest.param("edge", True, "\x1b[33m", id="near-yellow"),
        pytest.param("serve", True, "\x1b[32m", id="fine-green"),
        pytest.param("train", False, None, id="plain"),
    ],
)
def test_state_colour_only_when_asked(pod: str, colour: bool, sgr: str | None) -> None:
    rows = [r for r in merge_rows(fleet()) if r.pod == pod]
    table = render_top(rows, Output.table, colour=colour)
    if sgr is None:
        assert "\x1b" not in table
    else:
        assert f"{sgr}{rows[0].state}" in table.splitlines()[1]
        # The coloured column stays aligned: the HELD-BY column starts where the header says.
        header, line = table.splitlines()
        plain = line.replace(sgr, "").replace("\x1b[0m", "")
        assert plain.index(rows[0].held_by, header.index("STATE")) == header.index("HELD-BY")


# --------------------------------------------------------------------------------------------------------------
# Reading the agents through the pod proxy (a fake CoreV1Api)


class FakeResponse:
    def __init__(self, body: bytes, clock: FakeClock | None = None, step: float = 0.0) -> None:
        self._body = io.BytesIO(body)
        self.data = body
        self._clock, self._step = clock, step
        self.released = False

    def read(self, n: int) -> bytes:
        if self._clock is not None:
            self._clock.step(self._step)
        return self._body.read(n)

    def release_conn(self) -> None:
        self.released = True


def agent_pod(node: str, phase: str = "Running", port: int = 9400) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "vramguard", "name": f"vramguard-{node}"},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "vramguard",
                    "ports": [{"name": "other", "containerPort": 1}, {"name": "metrics", "containerPort": port}],
                }
            ],
        },
        "status": {"phase": phase},
    }


def status_exception(code: int, reason: str, message: str) -> ApiException:
    e = ApiException(status=code, reason=reason)
    e.body = json.dumps({"kind": "Status", "code": code, "message": message})
    return e


class FakeCore:
    """The two calls the plugin makes: list the agent pods, GET their /status through the pod proxy."""

    def __init__(self, pods: list[dict[str, Any]], answers: Mapping[str, Any]) -> None:
        self.pods, self.answers = pods, answers
        self.lists: list[dict[str, Any]] = []
        self.proxied: list[tuple[str, str, str]] = []
        self.lock = threading.Lock()

    def list_pod_for_all_namespaces(self, **kw: Any) -> FakeResponse:
        self.lists.append({"namespace": None, **kw})
        return FakeResponse(json.dumps({"items": self.pods, "metadata": {}}).encode())

    def list_namespaced_pod(self, namespace: str, **kw: Any) -> FakeResponse:
        self.lists.append({"namespace": namespace, **kw})
        return FakeResponse(json.dumps({"items": self.pods, "metadata": {}}).encode())

    def connect_get_namespaced_pod_proxy_with_path(self, name: str, namespace: str, path: str, **kw: Any) -> Any:
        with self.lock:
            self.proxied.append((name, namespace, path))
        a = self.answers[name.split(":")[0]]
        if callable(a):
            a = a()
        if isinstance(a, BaseException):
            raise a
        return FakeResponse(a if isinstance(a, bytes) else json.dumps(a).encode())


def core_for(fetched: list[Fetched], extra: Mapping[str, Any] | None = None) -> FakeCore:
    """A fake API server whose agents answer as `fetched` says (a Failure: a 503 from the proxy)."""
    pods: list[dict[str, Any]] = []
    answers: dict[str, Any] = {}
    for f in fetched:
        pods.append(agent_pod(f.agent.node))
        if isinstance(f, Answer):
            answers[f.agent.pod] = dict(f.document)
        else:
            answers[f.agent.pod] = status_exception(503, "Service Unavailable", f.reason.split(": ", 1)[-1])
    return FakeCore(pods, {**answers, **(extra or {})})


def test_agent_pods_are_found_by_the_charts_label() -> None:
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
        pytest.param(lambda: b"{not json", "not JSON", id="not-json"),
        pytest.param(lambda: RuntimeError("boom"), "RuntimeError: boom", id="anything-else"),
    ],
)
def test_an_agent_that_fails_is_a_row_saying_why(failure: Any, why: str) -> None:
    core = core_for(fleet()[:2], {"vramguard-node-b": failure})
    agents = find_agents(core)
    rows = merge_rows(read_all(core, agents))
    [row] = rows_of(rows, "node-b")
    assert why in row.state and row.agent == "vramguard/vramguard-node-b"
    assert len(rows_of(rows, "node-a")) == 4


def test_a_pod_not_running_is_not_asked() -> None:
    core = FakeCore([agent_pod("node-p", phase="Pending")], {})
    [got] = read_all(core, find_agents(core))
    assert isinstance(got, Failure) and got.reason == "pod is Pending"
    assert core.proxied == []


def test_the_body_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch, "MAX_BODY_BYTES", 1000)
    monkeypatch.setattr(fetch, "CHUNK_BYTES", 100)
    core = FakeCore([agent_pod("node-b")], {"vramguard-node-b": b"x" * 5000})
    [got] = read_all(core, find_agents(core))
    assert isinstance(got, Failure) and got.reason == "status body over 1000 bytes"


def test_a_trickling_agent_is_cut_at_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
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


# --------------------------------------------------------------------------------------------------------------
# The command


def invoke(core: FakeCore, *args: str, colour: bool = False, namespace: str = "team-a") -> Any:
    app = build_app(connect=lambda kubeconfig, context: (core, namespace), clock=FakeClock(), colour=lambda: colour)
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize(
    ("fetched", "args", "code"),
    [
        pytest.param(fleet(), ["top", "-A"], 0, id="partial-is-fine"),
        pytest.param(fleet(), ["top", "-A", "--strict"], 1, id="partial-strict"),
        pytest.param(fleet()[:3], ["top", "-A", "--strict"], 0, id="whole-strict"),
        pytest.param(fleet(), ["nodes", "--strict"], 1, id="nodes-partial-strict"),
        pytest.param(fleet(), ["nodes"], 0, id="nodes-partial"),
        pytest.param([], ["top"], 1, id="no-agents"),
        pytest.param(fleet(), ["top", "-n", "x", "-A"], 2, id="n-and-A"),
    ],
)
def test_exit_codes(fetched: list[Fetched], args: list[str], code: int) -> None:
    result = invoke(core_for(fetched), *args)
    assert result.exit_code == code, result.output


def test_top_defaults_to_the_contexts_namespace() -> None:
    result = invoke(core_for(fleet()), "top")
    pods = {line.split()[3] for line in result.stdout.splitlines()[1:]}
    assert pods == {"train", "big", "-"}  # team-a's, and the agent that did not answer


def test_top_json_from_the_command() -> None:
    result = invoke(core_for(fleet()), "top", "-A", "--node", "node-a", "--sort-by", "used", "-o", "json")
    items = json.loads(result.stdout)["items"]
    assert [i["pod"] for i in items] == ["train", "serve", "big", "-"]


def test_colour_from_the_command() -> None:
    assert "\x1b[" in invoke(core_for(fleet()), "top", "-A", colour=True).stdout
    assert "\x1b" not in invoke(core_for(fleet()), "top", "-A", colour=False).stdout
    assert "\x1b[" in invoke(core_for(fleet()), "nodes", colour=True).stdout


def test_watch_reads_again_until_stopped() -> None:
    clock = FakeClock()
    stop = threading.Event()
    core = core_for(fleet())
    app = build_app(connect=lambda k, c: (core, "default"), clock=clock, stop=stop, colour=lambda: False)
    clock.on_wait = lambda: stop.set() if len(clock.waits) == 3 else None
    result = CliRunner().invoke(app, ["nodes", "--watch", "--interval", "5"])
    assert result.exit_code == 0, result.output
    assert clock.waits == [5.0, 5.0, 5.0]
    assert len(core.lists) == 3
    assert result.stdout.count("NODE") == 3


def test_a_forbidden_list_says_which_role_to_bind() -> None:
    class Forbidden(FakeCore):
        def list_pod_for_all_namespaces(self, **kw: Any) -> FakeResponse:
            raise status_exception(403, "Forbidden", "pods is forbidden")

    result = invoke(Forbidden([], {}), "top", "-A")
    assert result.exit_code == 1
    assert "403 Forbidden" in result.stderr and "vramguard-viewer" in result.stderr


def test_no_configuration_is_a_usage_error() -> None:
    def connect(kubeconfig: str | None, context: str | None) -> tuple[Any, str]:
        raise fetch.ConfigError("cannot load the Kubernetes configuration: none")

    result = CliRunner().invoke(build_app(connect=connect, colour=lambda: False), ["nodes"])
    assert result.exit_code == 2 and "cannot load" in result.stderr


def test_the_package_installs_the_kubectl_plugin() -> None:
    from importlib.metadata import entry_points

    from vramguard.plugin.command import main

    [script] = [e for e in entry_points(group="console_scripts") if e.name == "kubectl-vramguard"]
    assert script.load() is main
