"""Status documents as agents write them, and a fake API server (CoreV1Api's two calls the plugin makes) that
serves them through its pod proxy: shared by the plugin's tests."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from vramguard.core.quantity import GiB
from vramguard.plugin.merge import AgentRef, Answer, Failure, Fetched, Row
from vramguard_testbed.fakes import FakeClock


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


def agent_pod(
    node: str,
    phase: str = "Running",
    port: int = 9400,
    namespace: str = "vramguard",
    owner: tuple[str, str] | None = ("DaemonSet", "vramguard"),
) -> dict[str, Any]:
    """A pod of the chart's DaemonSet (release "vramguard"), or one like it `namespace` and `owner` say."""
    meta: dict[str, Any] = {
        "namespace": namespace,
        "name": f"vramguard-{node}",
        "labels": {"app.kubernetes.io/name": "vramguard", "app.kubernetes.io/instance": "vramguard"},
    }
    if owner is not None:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True, "uid": "u"}]
    return {
        "metadata": meta,
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


def _selected(pod: Mapping[str, Any], namespace: str | None, label_selector: str = "", **_: Any) -> bool:
    """Whether a LIST in `namespace` (None: all) with `label_selector` (`k=v,...`) returns the pod."""
    meta = pod["metadata"]
    labels = meta.get("labels") or {}
    wanted = dict(term.split("=", 1) for term in label_selector.split(",") if term)
    return (namespace is None or meta["namespace"] == namespace) and all(labels.get(k) == v for k, v in wanted.items())


class FakeCore:
    """The two calls the plugin makes: list the agent pods (by namespace and label, as the API server does), GET
    their /status through the pod proxy."""

    def __init__(self, pods: list[dict[str, Any]], answers: Mapping[str, Any]) -> None:
        self.pods, self.answers = pods, answers
        self.lists: list[dict[str, Any]] = []
        self.proxied: list[tuple[str, str, str]] = []
        self.lock = threading.Lock()

    def list_pod_for_all_namespaces(self, **kw: Any) -> FakeResponse:
        self.lists.append({"namespace": None, **kw})
        items = [p for p in self.pods if _selected(p, None, **kw)]
        return FakeResponse(json.dumps({"items": items, "metadata": {}}).encode())

    def list_namespaced_pod(self, namespace: str, **kw: Any) -> FakeResponse:
        self.lists.append({"namespace": namespace, **kw})
        items = [p for p in self.pods if _selected(p, namespace, **kw)]
        return FakeResponse(json.dumps({"items": items, "metadata": {}}).encode())

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
