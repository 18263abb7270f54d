"""The agent's HTTP endpoint: /metrics for Prometheus, /healthz for liveness, /readyz for readiness."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

# Returns (ok, explanation) — the explanation is the response body, so `curl /readyz` says what is missing.
Probe = Callable[[], tuple[bool, str]]


class HealthServer:
    """Serves metrics and probes on a background thread until `close()`."""

    def __init__(self, port: int, registry: CollectorRegistry, healthz: Probe, readyz: Probe, host: str = "") -> None:
        routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(registry)),
            "/healthz": lambda: _probe(healthz),
            "/readyz": lambda: _probe(readyz),
        }

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                route = routes.get(self.path.split("?", 1)[0])
                status, ctype, body = route() if route else (404, "text/plain", b"not found\n")
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # probes every few seconds would drown the agent's own logs

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="vramguard-http", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _probe(probe: Probe) -> tuple[int, str, bytes]:
    ok, why = probe()
    return (200 if ok else 503), "text/plain; charset=utf-8", (why + "\n").encode()
