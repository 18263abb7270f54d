"""A real Prometheus server (3.16, built from source with Kubernetes discovery by scripts/prometheus.sh) for the
cluster tests: it discovers the agents through the API server and scrapes them with the scrape job
prometheus-operator would generate from the chart's ServiceMonitor (`scrape_config`: role endpoints, as a
ServiceAccount the test grants a Role), evaluates the chart's PrometheusRule, and scrapes a stand-in for
kube-state-metrics that serves the series the rules read.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client, utils

from vramguard_testbed.waiting import wait_until

from .controlplane import Component, ControlPlane, free_port
from .node import raw

GROUP = "monitoring.coreos.com"
# prometheus-operator's labels on every ServiceMonitor target, in the order its promcfg.go writes them.
OPERATOR_RELABELINGS: tuple[dict[str, Any], ...] = (
    {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
    {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
    {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
    {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
    {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)", "action": "drop"},
    {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
)


def install_monitoring_crds(api: client.ApiClient) -> None:
    """ServiceMonitor and PrometheusRule as kinds the API server stores (no schema: the operator is not here), so
    the chart installs with both enabled as on a cluster with prometheus-operator."""
    extensions = client.ApiextensionsV1Api(api)
    for kind, plural in (("ServiceMonitor", "servicemonitors"), ("PrometheusRule", "prometheusrules")):
        schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
        crd: dict[str, Any] = {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{GROUP}"},
            "spec": {
                "group": GROUP,
                "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
                "versions": [{"name": "v1", "served": True, "storage": True, "schema": schema}],
            },
        }
        utils.create_from_dict(api, crd)  # type: ignore[no-untyped-call]  # untyped in the client

        def established(name: str = f"{plural}.{GROUP}") -> bool:
            conditions = raw(api, extensions.read_custom_resource_definition(name))["status"].get("conditions", [])
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        wait_until(established, 30, what=f"the {kind} CRD established", interval_s=0.2)


def installed(api: client.ApiClient, namespace: str, plural: str) -> dict[str, Any]:
    """The one object of a monitoring.coreos.com kind in `namespace`, as the chart installed it."""
    listed = client.CustomObjectsApi(api).list_namespaced_custom_object(GROUP, "v1", namespace, plural)
    assert isinstance(listed, dict)
    (found,) = listed["items"]
    assert isinstance(found, dict)
    return found


def scrape_config(
    monitor: Mapping[str, Any], service: Mapping[str, Any], kubeconfig: Path, interval: str
) -> dict[str, Any]:
    """The scrape job prometheus-operator generates for the ServiceMonitor's one endpoint (role endpoints, its
    namespaces, its selector, its port, the operator's target labels, then the monitor's own relabelings in
    Prometheus' spelling), discovering through `kubeconfig`, every `interval`. The selected Service, whose
    name is the job, must be one the selector matches."""
    spec = monitor["spec"]
    (endpoint,) = spec["endpoints"]
    labels = service["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items(), "the ServiceMonitor does not select it"
    keep = [
        {
            "action": "keep",
            "source_labels": [f"__meta_kubernetes_service_label_{_sanitized(k)}", _present(k)],
            "regex": f"({re.escape(v)});true",
        }
        for k, v in spec["selector"]["matchLabels"].items()
    ]
    keep.append(
        {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": endpoint["port"]}
    )
    return {
        "job_name": f"serviceMonitor/{monitor['metadata']['namespace']}/{monitor['metadata']['name']}/0",
        "honor_labels": endpoint.get("honorLabels", False),
        "scrape_interval": interval,
        "scrape_timeout": interval,
        "metrics_path": endpoint.get("path", "/metrics"),
        "kubernetes_sd_configs": [
            {
                "role": "endpoints",
                "kubeconfig_file": str(kubeconfig),
                "namespaces": {"names": spec["namespaceSelector"]["matchNames"]},
            }
        ],
        "relabel_configs": [
            *keep,
            *OPERATOR_RELABELINGS,
            {"target_label": "endpoint", "replacement": endpoint["port"]},
            *(_snake_keys(r) for r in endpoint.get("relabelings", [])),
        ],
    }


def _sanitized(label: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def _present(label: str) -> str:
    return f"__meta_kubernetes_service_labelpresent_{_sanitized(label)}"


def _snake_keys(relabeling: Mapping[str, Any]) -> dict[str, Any]:
    """A ServiceMonitor relabeling (sourceLabels, targetLabel, ...) as Prometheus spells it (source_labels, ...)."""
    return {re.sub(r"([A-Z])", lambda m: "_" + m[1].lower(), k): v for k, v in relabeling.items()}


_S = TypeVar("_S", bound="_Served")


class _Served:
    """A loopback HTTP server answering every GET with `body()`, computed at each request."""

    content_type = "text/plain; version=0.0.4"

    def __init__(self) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, name=type(self).__name__, daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self: _S) -> _S:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def body(self) -> str:
        raise NotImplementedError

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = outer.body().encode()
                self.send_response(200)
                self.send_header("Content-Type", outer.content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # a request a second would bury the test's output

        return Handler


# kube-state-metrics' DaemonSet series the rules read, each with the status field it reports (0 when unset).
DAEMONSET_STATUS = {
    "kube_daemonset_status_desired_number_scheduled": "desiredNumberScheduled",
    "kube_daemonset_status_number_available": "numberAvailable",
    "kube_daemonset_status_updated_number_scheduled": "updatedNumberScheduled",
}


class KubeStateMetrics(_Served):
    """Serves, at every scrape, the kube-state-metrics series the rules read, from the API server's objects in
    `namespace`: a DaemonSet's status counts (DAEMONSET_STATUS) and kube_pod_status_ready (as the real one names
    and labels them). A stand-in: the Go module proxy answers 403 for k8s.io/kube-state-metrics/v2."""

    def __init__(self, plane: ControlPlane, namespace: str) -> None:
        super().__init__()
        self._plane = plane
        self._namespace = namespace

    def body(self) -> str:
        ns = self._namespace
        lines = []
        with self._plane.api_client() as api:
            for ds in raw(api, client.AppsV1Api(api).list_namespaced_daemon_set(ns))["items"]:
                status, name = ds.get("status", {}), ds["metadata"]["name"]
                for metric, field in DAEMONSET_STATUS.items():
                    lines.append(f'{metric}{{namespace="{ns}",daemonset="{name}"}} {status.get(field, 0)}')
            for pod in raw(api, client.CoreV1Api(api).list_namespaced_pod(ns))["items"]:
                ready = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}.get("Ready", "Unknown")
                meta = pod["metadata"]
                for condition in ("true", "false", "unknown"):
                    labels = f'namespace="{ns}",pod="{meta["name"]}",uid="{meta["uid"]}",condition="{condition}"'
                    lines.append(f"kube_pod_status_ready{{{labels}}} {int(ready.lower() == condition)}")
        return "\n".join(lines) + "\n"


class Prometheus:
    """A Prometheus server on a free loopback port with `scrape_configs` and `rule_groups`, evaluating every
    `interval`, its data in `workdir`. Queried through its HTTP API as Grafana and an operator would."""

    def __init__(
        self,
        binary: Path,
        workdir: Path,
        scrape_configs: list[dict[str, Any]],
        rule_groups: Mapping[str, Any],
        *,
        interval: str,
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "rules.yaml").write_text(yaml.safe_dump(dict(rule_groups)))
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(workdir / "rules.yaml")],
            "scrape_configs": scrape_configs,
        }
        (workdir / "prometheus.yaml").write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{free_port()}"
        argv = [
            str(binary),
            f"--config.file={workdir / 'prometheus.yaml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address={self.url.removeprefix('http://')}",
        ]
        self.component = Component("prometheus", argv, workdir / "prometheus.log")

    @contextmanager
    def running(self) -> Iterator[Prometheus]:
        self.component.start()
        try:
            self.component.wait_until(self._ready, 60, "ready")
            yield self
        finally:
            self.component.stop()

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as r:
            answer = json.loads(r.read())
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expr: str, at: float | None = None) -> list[tuple[dict[str, str], float]]:
        """An instant query's series, at `at` (Unix seconds, to a sample's millisecond) or now: (labels, value)."""
        params = {"query": expr}
        if at is not None:
            # RFC 3339: a float's seconds may round a millisecond down, and past the sample at `at`.
            ms = round(at * 1000)
            params["time"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"
        data = self.api("query", **params)
        assert data["resultType"] == "vector", data
        return [(s["metric"], float(s["value"][1])) for s in data["result"]]

    def alerts(self) -> dict[str, list[dict[str, Any]]]:
        """The pending and firing alerts, by name."""
        found: dict[str, list[dict[str, Any]]] = {}
        for a in self.api("alerts")["alerts"]:
            found.setdefault(a["labels"]["alertname"], []).append(a)
        return found

    def targets(self, job: str) -> list[dict[str, Any]]:
        return [t for t in self.api("targets", state="active")["activeTargets"] if t["scrapePool"] == job]
