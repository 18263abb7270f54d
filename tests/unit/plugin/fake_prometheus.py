"""A fake Prometheus on a real HTTP socket, for the recommend tests: a store of scraped series (`Store`) labelled as
Prometheus labels them (`scrape`: the target's labels, honor_labels or not), which evaluates the few query shapes
`plugin.prometheus` sends (a metric's selectors, `and on (job, instance)` against `up`, `max by`); or raw bytes, a
status and a pace for the answers that break a client."""

from __future__ import annotations

import json
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\[")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_GROUP = re.compile(r"max by \(([^)]*)\)")

AGENT_TARGET = {
    "job": "vramguard-metrics",
    "instance": "10.0.0.1:9400",
    "namespace": "vramguard",
    "service": "vramguard-metrics",
    "pod": "vramguard-x2b4z",
    "container": "vramguard",
    "endpoint": "metrics",
}
# A tenant's ServiceMonitor in its own namespace, whose Service it named as the chart names the agents'.
TENANT_TARGET = {
    **AGENT_TARGET,
    "instance": "10.9.9.9:8080",
    "namespace": "tenant",
    "pod": "exporter",
    "container": "exporter",
}


def scrape(target: Mapping[str, str], exposed: Mapping[str, str], honor_labels: bool) -> dict[str, str]:
    """A series' labels as Prometheus stores them: the target's, and the exposition's; on a clash the exposition's
    win with honor_labels, else they are kept as `exported_<name>`."""
    labels = dict(target)
    for name, value in exposed.items():
        if name in target and not honor_labels:
            labels[f"exported_{name}"] = value
        else:
            labels[name] = value
    return labels


NOW = 1764300000.0  # the fake's clock: when every query is evaluated


@dataclass
class Store:
    """Scraped series, and the targets they came from (`up`); `recorded`: whether the chart's recording rule has
    recorded since before any window and still does."""

    series: list[tuple[str, dict[str, str], float]] = field(default_factory=list)
    targets: list[dict[str, str]] = field(default_factory=list)
    recorded: bool = False

    def add(
        self, metric: str, value: float, target: Mapping[str, str], honor_labels: bool = True, **exposed: str
    ) -> None:
        if dict(target) not in self.targets:
            self.targets.append(dict(target))
        self.series.append((metric, scrape(target, exposed, honor_labels), value))

    def answer(self, query: str) -> list[dict[str, Any]]:
        """The vector `query` gives over these series (where the recording rule is there, for its question)."""
        if query.startswith(("count(vramguard:", "count(last_over_time(vramguard:")):
            return [{"metric": {}, "value": [NOW, "1"]}] if self.recorded else []
        selectors = [(name, _matchers(text or "")) for name, text in _SELECTOR.findall(query)]
        picked = [
            (labels, value)
            for metric, labels, value in self.series
            if any(name == metric and _match(labels, m) for name, m in selectors if name != "up")
        ]
        if "and on (job, instance)" in query:
            (up,) = [m for name, m in selectors if name == "up"]
            scraped = {(t["job"], t["instance"]) for t in self.targets if _match(t, up)}
            picked = [(labels, v) for labels, v in picked if (labels.get("job"), labels.get("instance")) in scraped]
        group = _GROUP.search(query)
        assert group is not None, query
        by = [g.strip() for g in group[1].split(",")]
        out: dict[tuple[tuple[str, str], ...], float] = {}
        for labels, value in picked:
            key = tuple((name, labels[name]) for name in by if name in labels)
            out[key] = max(out.get(key, value), value)
        return [{"metric": dict(key), "value": [NOW, repr(value)]} for key, value in out.items()]


def _matchers(text: str) -> list[tuple[str, str, str]]:
    return [(name, op, json.loads(f'"{value}"')) for name, op, value in _MATCHER.findall(text)]


def _match(labels: Mapping[str, str], matchers: list[tuple[str, str, str]]) -> bool:
    for name, op, value in matchers:
        have = labels.get(name, "")
        ok = {"=": have == value, "!=": have != value}.get(op)
        if ok is None:
            ok = bool(re.fullmatch(value, have)) == (op == "=~")
        if not ok:
            return False
    return True


class _Server(ThreadingHTTPServer):
    # read_peaks connects 2 * SLICES + 1 times at once (after the recording rule's question); past the default backlog
    # of 5 the kernel drops a SYN and the client sends it again a second later.
    request_queue_size = 64
    daemon_threads = True


Answer = Store | bytes | Callable[[str], list[dict[str, Any]]]


@contextmanager
def fake_prometheus(answer: Answer, status: int = 200, pace_s: float = 0.0) -> Iterator[tuple[str, list[str]]]:
    """A server whose /api/v1/query answers from a Store, a function of the query, or raw bytes (sent a byte every
    `pace_s` seconds, if given); and the queries it was sent."""
    asked: list[str] = []
    closing = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query).get("query", [""])[0]
            asked.append(query)
            if isinstance(answer, bytes):
                body = answer
            else:
                result = answer.answer(query) if isinstance(answer, Store) else answer(query)
                body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not pace_s:
                self.wfile.write(body)
                return
            for i in range(len(body)):
                if closing.wait(pace_s):
                    return
                try:
                    self.wfile.write(body[i : i + 1])
                    self.wfile.flush()
                except OSError:  # the client gave up
                    return

        def log_message(self, *args: Any) -> None:
            pass

    server = _Server(("127.0.0.1", 0), Handler)
    # A short poll: shutdown() waits for serve_forever to look at its flag, by default every 0.5 s.
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        closing.set()
        server.shutdown()
        server.server_close()
