"""The HTTP endpoint: /metrics, /healthz and /readyz, each saying why when it fails."""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client import CollectorRegistry, Counter

from vramguard.health import HealthServer


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_endpoints_serve_metrics_and_probe_results() -> None:
    """Metrics come from the registry; probes answer 200/503 with their explanation; others are 404."""
    registry = CollectorRegistry()
    Counter("vramguard_test_total", "a test counter", registry=registry).inc(3)
    ready = {"ok": False}
    server = HealthServer(
        0,
        registry,
        healthz=lambda: (True, "last scan 0.1s ago"),
        readyz=lambda: (ready["ok"], "ready" if ready["ok"] else "pod cache not synced"),
        host="127.0.0.1",
    )
    try:
        status, body = _get(server.port, "/metrics")
        assert status == 200 and "vramguard_test_total 3.0" in body
        assert _get(server.port, "/healthz") == (200, "last scan 0.1s ago\n")
        assert _get(server.port, "/readyz") == (503, "pod cache not synced\n")
        ready["ok"] = True
        assert _get(server.port, "/readyz") == (200, "ready\n")
        assert _get(server.port, "/nope")[0] == 404
    finally:
        server.close()
