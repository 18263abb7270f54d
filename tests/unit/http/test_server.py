"""The HTTP endpoint's answers: what each request head gets from /metrics, /healthz, /readyz and /status, each
saying why when it fails. Pure: a server that is never started answers a head as its loop would
(`_head_of`, `_request`); the sockets, the loop and the attacks are the node tier's (tests/node/test_server.py).
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from vramguard.agent.health import Checks
from vramguard.http.server import HealthServer, _head_of


def alive() -> tuple[bool, str]:
    return True, "alive"


def gauge_registry() -> CollectorRegistry:
    """A registry whose exposition is the same every time it is built (a gauge has no `_created` sample)."""
    registry = CollectorRegistry()
    Gauge("vramguard_test_bytes", "a test gauge", registry=registry).set(3)
    return registry


ALIVE = Checks("healthz", [[("ping", alive)]])


def idle_server(
    registry: CollectorRegistry | None = None,
    healthz: Checks = ALIVE,
    readyz: Checks = ALIVE,
    **options: Any,
) -> HealthServer:
    """A server on 127.0.0.1 and any free port, constructed idle: no port yet, no thread, only its routes."""
    return HealthServer(0, registry or gauge_registry(), healthz, readyz, host="127.0.0.1", **options)


def parse_response(response: bytes) -> tuple[int, dict[str, str], bytes]:
    """(status, lower-cased headers, body) of a whole response; it must be HTTP/1.1."""
    head, _, body = response.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    version, status, _ = status_line.split(" ", 2)
    assert version == "HTTP/1.1"
    headers = {name.lower(): value.strip() for name, value in (line.split(":", 1) for line in header_lines)}
    return int(status), headers, body


def _exchange(server: HealthServer, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """What the server answers the request bytes, as `parse_response` gives it; the answer must be ready at once."""
    head = _head_of(request)
    assert head is not None, "a whole head"
    _, _, response = server._request(head, server._main.routes)
    assert isinstance(response, bytes)
    return parse_response(response)


def test_endpoints_serve_metrics_and_probe_results() -> None:
    """Metrics come from the registry; probes answer 200/503 with their explanation; others are 404."""
    registry = CollectorRegistry()
    Counter("vramguard_test_total", "a test counter", registry=registry).inc(3)
    ready = {"ok": False}
    server = idle_server(
        registry,
        healthz=Checks("healthz", [[("scan-loop", lambda: (True, "last scan 0.1s ago"))]]),
        readyz=Checks(
            "readyz",
            [
                [
                    ("nvml", lambda: (True, "")),
                    ("pods", lambda: (ready["ok"], "" if ready["ok"] else "pods not synced")),
                ]
            ],
            passed="ready",
        ),
    )

    def get(path: str) -> tuple[int, str]:
        status, _, body = _exchange(server, f"GET {path} HTTP/1.1\r\n\r\n".encode())
        return status, body.decode()

    status, body = get("/metrics")
    assert status == 200 and "vramguard_test_total 3.0" in body
    assert get("/healthz") == (200, "last scan 0.1s ago\n")
    assert get("/readyz") == (503, "pods not synced\n")
    assert get("/readyz?verbose") == (503, "[+]nvml ok\n[-]pods failed: pods not synced\nreadyz check failed\n")
    ready["ok"] = True
    assert get("/readyz") == (200, "ready\n")
    assert get("/readyz?verbose") == (200, "[+]nvml ok\n[+]pods ok\nreadyz check passed\n")
    assert get("/healthz?verbose") == (200, "[+]scan-loop ok: last scan 0.1s ago\nhealthz check passed\n")
    assert get("/nope")[0] == 404


def test_status_is_served_as_json_where_the_agent_gives_a_body() -> None:
    """/status answers the provider's body as application/json, on every request (HEAD: the length alone); a
    server built without one answers 404 there."""
    bodies = iter([b'{"kind": "VramguardStatus", "n": 1}', b'{"kind": "VramguardStatus", "n": 2}'])
    server = idle_server(status=lambda wake: next(bodies))
    for n in (1, 2):
        status, headers, body = _exchange(server, b"GET /status HTTP/1.1\r\n\r\n")
        assert (status, headers["content-type"], body) == (
            200,
            "application/json",
            f'{{"kind": "VramguardStatus", "n": {n}}}'.encode(),
        )
    status, headers, body = _exchange(idle_server(status=lambda wake: b"{}"), b"HEAD /status HTTP/1.1\r\n\r\n")
    assert (status, headers["content-length"], body) == (200, "2", b"")
    assert _exchange(idle_server(), b"GET /status HTTP/1.1\r\n\r\n")[0] == 404


def test_a_status_being_built_is_answered_later_once_built() -> None:
    """/status whose body is being built elsewhere is an answer for later (the build never runs on the server's
    thread): none until the body is built, then the body."""
    built: list[bytes] = []
    server = idle_server(status=lambda wake: lambda: built[0] if built else None)
    path, head_only, later = server._request(b"GET /status HTTP/1.1", server._main.routes)
    assert (path, head_only) == ("/status", False)
    assert callable(later) and later() is None, "no answer before the body is built"
    built.append(b'{"kind": "VramguardStatus"}')
    assert later() == (200, [("Content-Type", "application/json")], b'{"kind": "VramguardStatus"}')


@pytest.mark.parametrize(
    ("received", "head"),
    [
        pytest.param(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n", b"GET / HTTP/1.1\r\nHost: t", id="crlf-head"),
        pytest.param(b"GET / HTTP/1.1\nHost: t\n\nbody", b"GET / HTTP/1.1\nHost: t", id="bare-lf-and-body-after"),
        pytest.param(b"\r\n\nGET / HTTP/1.1\r\n\r\n", b"GET / HTTP/1.1", id="blank-lines-before-skipped"),
        pytest.param(b"GET / HTTP/1.1\r\nHost: t\r\n", None, id="unfinished-head-is-none"),
        pytest.param(b"\r\n\r\n", None, id="blank-lines-alone-are-no-head"),
    ],
)
def test_the_head_ends_at_the_first_empty_line(received: bytes, head: bytes | None) -> None:
    """The head is what comes before the first empty line, blank lines before the request line skipped."""
    assert _head_of(received) == head


# The request line decides the answer; of the headers, only Accept and Accept-Encoding are read (for /metrics).


@pytest.fixture(scope="module")
def table_server() -> HealthServer:
    """One server for the whole table (it keeps no state between requests): healthz alive, readyz failing."""
    return idle_server(readyz=Checks("readyz", [[("pods", lambda: (False, "pod cache not synced"))]]))


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"


# Request bytes, and the status, body and headers they are answered with.
REQUEST_LINES = [
    pytest.param(HEALTHZ, 200, b"alive\n", {"content-type": "text/plain; charset=utf-8"}, id="healthz-is-200"),
    pytest.param(b"GET /healthz?x=1&y HTTP/1.1\r\n\r\n", 200, b"alive\n", {}, id="query-string-ignored"),
    pytest.param(
        b"GET /healthz?x&verbose=1 HTTP/1.1\r\n\r\n",
        200,
        b"[+]ping ok: alive\nhealthz check passed\n",
        {},
        id="verbose-lists-the-checks",
    ),
    pytest.param(
        b"GET /readyz?verbose HTTP/1.1\r\n\r\n",
        503,
        b"[-]pods failed: pod cache not synced\nreadyz check failed\n",
        {},
        id="verbose-failing-is-503",
    ),
    pytest.param(
        b"GET /metrics?name[]=vramguard_test_bytes HTTP/1.1\r\nAccept: */*\r\n\r\n",
        200,
        generate_latest(gauge_registry()),
        {"content-type": choose_encoder("*/*")[1]},
        id="metrics-with-query-is-the-registry",
    ),
    pytest.param(b"GET /readyz HTTP/1.1\r\n\r\n", 503, b"pod cache not synced\n", {}, id="failing-probe-is-503"),
    pytest.param(b"GET /healthz HTTP/1.0\r\n\r\n", 200, b"alive\n", {}, id="http-1.0-gets-an-http-1.1-answer"),
    pytest.param(b"GET /healthz HTTP/1.1\nHost: t\n\n", 200, b"alive\n", {}, id="bare-lf-line-ends-accepted"),
    pytest.param(b"\r\n" + HEALTHZ, 200, b"alive\n", {}, id="blank-line-before-request-skipped"),
    pytest.param(b"HEAD /healthz HTTP/1.1\r\n\r\n", 200, b"", {"content-length": "6"}, id="head-no-body"),
    pytest.param(
        b"POST /healthz HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
        405,
        b"only GET and HEAD\n",
        {"allow": "GET, HEAD"},
        id="post-is-405",
    ),
    pytest.param(b"get /healthz HTTP/1.1\r\n\r\n", 405, b"only GET and HEAD\n", {}, id="lowercase-get-is-405"),
    pytest.param(b"hello there\r\n\r\n", 400, b"malformed request line\n", {}, id="garbage-is-400"),
    pytest.param(b"GET /healthz\r\n\r\n", 400, b"malformed request line\n", {}, id="http-0.9-is-400"),
    pytest.param(b"GET /healthz HTTP/2.0\r\n\r\n", 400, b"malformed request line\n", {}, id="http-2-line-is-400"),
    pytest.param(b"GET /h\xc3\xa9 HTTP/1.1\r\n\r\n", 400, b"malformed request line\n", {}, id="non-ascii-is-400"),
    pytest.param(b"GET  /healthz HTTP/1.1\r\n\r\n", 400, b"malformed request line\n", {}, id="double-space-is-400"),
    pytest.param(
        b"GET http://t/healthz HTTP/1.1\r\n\r\n", 400, b"malformed request line\n", {}, id="absolute-form-is-400"
    ),
    pytest.param(b"GET /nope HTTP/1.1\r\n\r\n", 404, b"not found\n", {}, id="unknown-path-is-404"),
    pytest.param(b"GET /healthz/ HTTP/1.1\r\n\r\n", 404, b"not found\n", {}, id="trailing-slash-is-another-path"),
]


@pytest.mark.parametrize(("request_bytes", "status", "body", "headers"), REQUEST_LINES)
def test_request_line_decides_the_answer(
    table_server: HealthServer, request_bytes: bytes, status: int, body: bytes, headers: dict[str, str]
) -> None:
    """Each request line gets its status and body, always HTTP/1.1 with Connection: close and a true length."""
    got_status, got_headers, got_body = _exchange(table_server, request_bytes)
    assert (got_status, got_body) == (status, body)
    assert got_headers.items() >= headers.items()
    assert got_headers["connection"] == "close"
    if not request_bytes.startswith(b"HEAD"):
        assert got_headers["content-length"] == str(len(body))


BOTH = {"vramguard_test_bytes", "vramguard_other_bytes"}


def _two_metrics() -> CollectorRegistry:
    registry = gauge_registry()
    Gauge("vramguard_other_bytes", "another gauge", registry=registry).set(5)
    return registry


@pytest.mark.parametrize(
    ("headers", "query", "encoding", "content_type", "names"),
    [
        pytest.param(b"", "", None, "text/plain; version=0.0.4", BOTH, id="text"),
        pytest.param(b"Accept-Encoding: gzip\r\n", "", "gzip", "text/plain; version=0.0.4", BOTH, id="gzip"),
        pytest.param(b"accept-encoding: br, GZIP;q=0.8\r\n", "", "gzip", "text/plain", BOTH, id="gzip-any-case"),
        pytest.param(b"Accept: " + OPENMETRICS.encode() + b"\r\n", "", None, OPENMETRICS, BOTH, id="openmetrics"),
        pytest.param(
            b"", "?name[]=vramguard_other_bytes", None, "text/plain", {"vramguard_other_bytes"}, id="name-filter"
        ),
    ],
)
def test_metrics_speak_what_prometheus_asks_for(
    headers: bytes, query: str, encoding: str | None, content_type: str, names: set[str]
) -> None:
    """/metrics is client_python's WSGI app: gzip when asked, OpenMetrics when asked, `name[]` selects."""
    request = f"GET /metrics{query} HTTP/1.1\r\nHost: t\r\n".encode() + headers + b"\r\n"
    status, got_headers, body = _exchange(idle_server(_two_metrics()), request)
    assert status == 200 and got_headers["connection"] == "close"
    assert got_headers["content-length"] == str(len(body))
    assert got_headers.get("content-encoding") == encoding
    assert got_headers["content-type"].startswith(content_type)
    text = (gzip.decompress(body) if encoding else body).decode()
    assert {family.name for family in text_string_to_metric_families(text)} == names
    if content_type.startswith("application/openmetrics-text"):
        assert text.endswith("# EOF\n")


class _BrokenCollector(Collector):
    def collect(self) -> Iterable[Metric]:
        raise RuntimeError("collector broke")


def _broken_probe() -> tuple[bool, str]:
    raise RuntimeError("probe broke")


def _broken_status(wake: object) -> bytes:
    raise RuntimeError("status broke")


def _broken_metrics_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(_BrokenCollector())
    return registry


@pytest.mark.parametrize(
    ("path", "server_args", "body"),
    [
        pytest.param(
            b"/healthz",
            {"healthz": Checks("healthz", [[("broken", _broken_probe)]])},
            b"healthz failed: RuntimeError\n",
            id="probe-raises",
        ),
        pytest.param(
            b"/metrics",
            {"registry": _broken_metrics_registry()},
            b"metrics failed: RuntimeError\n",
            id="collector-raises",
        ),
        pytest.param(b"/status", {"status": _broken_status}, b"status failed: RuntimeError\n", id="status-raises"),
    ],
)
def test_a_raising_callback_is_a_500_and_serving_goes_on(path: bytes, server_args: dict[str, Any], body: bytes) -> None:
    """A probe or collector that raises answers 500 naming the route, every time, and the other routes still work."""
    server = idle_server(**server_args)
    for _ in range(2):
        status, _, got_body = _exchange(server, b"GET " + path + b" HTTP/1.1\r\n\r\n")
        assert (status, got_body) == (500, body)
        assert _exchange(server, b"GET /readyz HTTP/1.1\r\n\r\n")[0] == 200
