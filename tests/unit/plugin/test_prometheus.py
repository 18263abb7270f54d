"""Reading the peaks from Prometheus: the queries (one per metric, whatever the workloads), the answer read with the
workload's labels (`exported_` ones winning), and each way Prometheus can fail named. A fake Prometheus on a real
HTTP socket answers with what each query should give."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from vramguard.core.model import GiB
from vramguard.plugin.prometheus import PEAK_METRIC, SLICES, USED_METRIC, PrometheusError, queries, read_peaks
from vramguard.plugin.recommend import PeakSeries


def sample(value: float | str, **labels: str) -> dict[str, Any]:
    return {"metric": labels, "value": [1764300000.0, str(value)]}


class _Server(ThreadingHTTPServer):
    # read_peaks connects 2 * SLICES times at once; past the default backlog of 5 the kernel drops a SYN and the
    # client sends it again a second later.
    request_queue_size = 64


@contextmanager
def fake_prometheus(answer: Any, status: int = 200) -> Iterator[tuple[str, list[str]]]:
    """A server whose /api/v1/query answers `answer(query)` (a dict by metric name, or raw bytes), and the queries
    it was sent."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query).get("query", [""])[0]
            asked.append(query)
            if isinstance(answer, bytes):
                body = answer
            else:
                metric = PEAK_METRIC if PEAK_METRIC in query else USED_METRIC
                result = answer.get(metric, [])
                body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = _Server(("127.0.0.1", 0), Handler)
    # A short poll: shutdown() waits for serve_forever to look at its flag, by default every 0.5 s.
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


def test_the_queries_are_a_fixed_number_whose_slices_make_the_window() -> None:
    """SLICES per metric, whatever the workloads: contiguous slices, the first ending now, together the window."""
    sent = queries(7 * 86400, slices=7)
    assert [q.metric for q in sent] == [PEAK_METRIC] * 7 + [USED_METRIC] * 7
    group = "max by (namespace, pod, container, exported_namespace, exported_pod, exported_container, gpu_uuid)"
    assert sent[0].promql == f"{group} (max_over_time({PEAK_METRIC}[86400s]))"
    assert sent[6].promql == f"{group} (max_over_time({PEAK_METRIC}[86400s] offset 518400s))"
    assert len(queries(60)) == 2 * SLICES
    one = queries(60, "ml")[0].promql
    assert 'namespace="ml"' in one and 'exported_namespace="ml"' in one


def test_the_peaks_are_read_and_merged() -> None:
    """The highest of the two metrics per (pod, container, GPU); exported_ labels win; unusable samples are left
    out."""
    answer = {
        PEAK_METRIC: [
            sample(9 * GiB, namespace="ml", pod="web-1", container="main", gpu_uuid="GPU-0"),
            sample(3 * GiB, namespace="vramguard", exported_namespace="ml", pod="agent", exported_pod="web-2",
                   container="vramguard", exported_container="main", gpu_uuid="GPU-0"),
            sample("NaN", namespace="ml", pod="web-3", container="main", gpu_uuid="GPU-0"),
            sample(-1, namespace="ml", pod="web-4", container="main", gpu_uuid="GPU-0"),
            sample(GiB, namespace="ml", container="main", gpu_uuid="GPU-0"),
        ],
        USED_METRIC: [
            sample(2 * GiB, namespace="ml", pod="web-1", container="main", gpu_uuid="GPU-0"),
            sample(5 * GiB, namespace="ml", pod="old", container="main", gpu_uuid="GPU-1"),  # an older agent's
        ],
    }  # fmt: skip
    with fake_prometheus(answer) as (url, asked):
        found, count = read_peaks(url, 3600)
    assert count == len(asked) == 2 * SLICES
    assert sorted(found, key=lambda s: s.pod) == [
        PeakSeries("ml", "old", "main", "GPU-1", 5 * GiB),
        PeakSeries("ml", "web-1", "main", "GPU-0", 9 * GiB),
        PeakSeries("ml", "web-2", "main", "GPU-0", 3 * GiB),
    ]


@pytest.mark.parametrize(
    ("answer", "status", "words"),
    [
        pytest.param(b'{"status":"error","error":"parse error at char 3"}', 400,
                     "400 Bad Request: parse error at char 3", id="prometheus-refuses"),
        pytest.param(b"<html>login</html>", 200, "not JSON", id="a-login-page"),
        pytest.param(b'{"status":"success","data":{"resultType":"matrix","result":[]}}', 200, "not a query result",
                     id="not-a-vector"),
    ],
)  # fmt: skip
def test_failures_are_named(answer: bytes, status: int, words: str) -> None:
    with fake_prometheus(answer, status) as (url, _), pytest.raises(PrometheusError, match=words):
        read_peaks(url, 60)


def test_an_unreachable_prometheus_is_named() -> None:
    with pytest.raises(PrometheusError, match=r"cannot reach http://127\.0\.0\.1:9"):
        read_peaks("http://127.0.0.1:9", 60, timeout_s=2)
