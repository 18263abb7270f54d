"""The peaks of a window, from a Prometheus that scrapes the agents: a fixed number of queries, however many
workloads, and only the agents' series.

Each query is an instant query of `max_over_time(<metric>[<slice>] offset <o>)`, grouped by the workload's labels:
the server reduces its slice of the window to one number per series, and answers one sample per (pod, container,
GPU). The window is cut into SLICES contiguous slices asked for at once: Prometheus evaluates one query on one core,
and a week of 30 s samples is tens of millions of them, so the slices let it use its cores. Two metrics are
read: the peak gauge (`vramguard_container_gpu_memory_peak_bytes`, each scan's usage, so a spike between two scrapes
is in it) and the usage gauge, for series scraped from agents older than the peak gauge. A scrape job without
`honor_labels` keeps the workload's labels as `exported_namespace`, `exported_pod` and `exported_container`; those
win where present.

Any scrape may publish a series under these names, so a series counts only where it came from an agents' target:
the `agents` selector picks those targets on `up`, whose labels are the target's alone (no exposition sets them),
and a series is kept only when its `job` and `instance` are one of theirs. With the chart's ServiceMonitor the
per-container series carry the workload's `namespace` (honorLabels), so the agents' namespace is matched on `up`,
not on them. The GPUs' memory (`vramguard_gpu_memory_total_bytes`, which carries no workload label, so the selector
applies to it directly) is read the same way: what bounds each peak.

Each series carries the pod's controller (`owner_kind`, `owner_name`, as kube-state-metrics' `kube_pod_owner` names
them), which places a pod in its workload whether or not it still exists; a series without them, from an older
agent, is placed by its name (`workloads.Owners.workload_of`).

The chart's PrometheusRule records the peak gauge's maximum over each 5 minutes (`RECORDED_METRIC`). Where it has
recorded since before the window began and still does (two queries of one instant each ask, `recorded_queries`),
the window is read from it alone: one sample a series every 5 minutes, whatever the scrape interval, and not the
usage gauge, which only agents older than the chart that brought the rule lack the peak gauge for. The last recorded
sample may be up to an interval old, so one more query reads the raw peak gauge over the last two intervals
(`TAIL_S`). Anywhere else (the first window's length after the rule is installed, a Prometheus without it) the
gauges are read as they were scraped.

Every request has a deadline for the whole answer (a server that trickles bytes is cut at it), and every answer a
size bound and the JSON depth bound of `core.documents.load_json`.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Final

from vramguard.core.documents import DocumentError, load_json
from vramguard.core.text import cut
from vramguard.kube.pod_manifest import NO_OWNER, OWNER_LABELS
from vramguard.plugin.recommend import PeakSeries

PEAK_METRIC: Final = "vramguard_container_gpu_memory_peak_bytes"
USED_METRIC: Final = "vramguard_container_gpu_memory_used_bytes"
TOTAL_METRIC: Final = "vramguard_gpu_memory_total_bytes"
METRICS: Final = (PEAK_METRIC, USED_METRIC)
# The chart's recording rule (templates/prometheusrule.yaml): max_over_time of the peak gauge over each
# RECORD_INTERVAL_S, evaluated every RECORD_INTERVAL_S, so its samples together hold every scraped peak.
RECORDED_METRIC: Final = "vramguard:container_gpu_memory_peak_bytes:max5m"
RECORD_INTERVAL_S: Final = 300
TAIL_S: Final = 2 * RECORD_INTERVAL_S  # what the newest slice reads raw: since the last recorded sample, and its lag
MAX_BODY_BYTES: Final = 512 * 1024 * 1024  # 100,000 series answer in about 40 MB
ERROR_BODY_BYTES: Final = 4096  # of an answer that is an error: its message
CHUNK_BYTES: Final = 64 * 1024
TIMEOUT_S: Final = 60.0
SLICES: Final = 8  # queries per metric, each over its slice of the window, all sent at once
# A GPU's memory does not change within a window: a subquery at this many steps reads it cheaply.
TOTAL_STEPS: Final = 256
_LABELS: Final = ("namespace", "pod", "container")
_GROUP: Final = ", ".join([*_LABELS, *(f"exported_{name}" for name in _LABELS), "gpu_uuid", *OWNER_LABELS])
# Where a series was scraped from: the two labels every scrape sets, and no exposition of the agents' does.
_TARGET: Final = "job, instance"
_MATCHER: Final = re.compile(r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\\n]|\\.)*"\s*')


class PrometheusError(Exception):
    """Prometheus could not be asked, or answered something that is not a query result."""


@dataclass(frozen=True, slots=True)
class Query:
    """One query of one metric over the window, as sent to `/api/v1/query`."""

    metric: str
    promql: str


@dataclass(frozen=True, slots=True)
class Scraped:
    """What the agents' series say of a window: the peaks, each GPU's memory by UUID, and the queries made."""

    series: list[PeakSeries]
    gpu_total_bytes: dict[str, int]
    queries: int
    recorded: bool = False  # the window was read from the recording rule


def parse_selector(text: str) -> str:
    """A PromQL label-matcher list (`job="vramguard-metrics",namespace="vramguard"`, braces optional) as it goes
    between braces. Raises ValueError saying what is wrong."""
    inner = text.strip()
    if inner.startswith("{") and inner.endswith("}"):
        inner = inner[1:-1]
    matchers = []
    pos = 0
    while pos < len(inner):
        m = _MATCHER.match(inner, pos)
        if m is None:
            raise ValueError(f'{cut(text, 120)!r} is not a list of label matchers such as job="vramguard-metrics"')
        matchers.append(m.group().strip())
        pos = m.end()
        if pos < len(inner):
            if inner[pos] != ",":
                raise ValueError(f"{cut(text, 120)!r}: expected ',' after {cut(m.group().strip(), 60)}")
            pos += 1
    if not matchers:
        raise ValueError("an empty selector would take every scrape's series")
    return ",".join(matchers)


def queries(
    window_s: float,
    agents: str,
    namespace: str | None = None,
    slices: int = SLICES,
    recorded: bool = False,
) -> tuple[Query, ...]:
    """The queries for a window of `window_s` seconds, in one namespace or all, of the series scraped from the
    targets `agents` (a `parse_selector` list) selects: `slices` per metric, whose ranges (each left-open, as a range
    selector's) together are the window; and one of the GPUs' memory over the window. `recorded` (the recording
    rule covers the window): `slices` of its series instead, and one of the peak gauge over `TAIL_S`."""
    length = _length(window_s, slices)
    out = []
    for metric in (RECORDED_METRIC,) if recorded else METRICS:
        for i in range(slices):
            span = f"[{length}s]" + (f" offset {i * length}s" if i else "")
            out.append(Query(metric, _peaks_query(metric, span, agents, namespace)))
    if recorded:
        out.append(Query(PEAK_METRIC, _peaks_query(PEAK_METRIC, f"[{TAIL_S}s]", agents, namespace)))
    window = max(1, math.ceil(window_s))
    step = max(1, math.ceil(window / TOTAL_STEPS))
    # The subquery looks at its steps only, the last up to a step ago: the raw last step covers what came since.
    stepped = f"max_over_time({TOTAL_METRIC}{{{agents}}}[{window}s:{step}s])"
    recent = f"max_over_time({TOTAL_METRIC}{{{agents}}}[{step}s])"
    out.append(Query(TOTAL_METRIC, f"max by (gpu_uuid) ({stepped} or {recent})"))
    return tuple(out)


def _peaks_query(metric: str, span: str, agents: str, namespace: str | None) -> str:
    """The highest of `metric` over `span` per (pod, container, GPU, owner), of the agents' series alone."""
    selector = f"max_over_time({metric}{span})"
    if namespace is not None:
        quoted = json.dumps(namespace)  # a PromQL string literal takes JSON's escapes
        # Either label may carry the workload's namespace (`honor_labels` or not): a selector for each.
        selector = (
            f"(max_over_time({metric}{{namespace={quoted}}}{span})"
            f" or max_over_time({metric}{{exported_namespace={quoted}}}{span}))"
        )
    scraped = f"max_over_time(up{{{agents}}}{span})"
    return f"max by ({_GROUP}) ({selector} and on ({_TARGET}) {scraped})"


def _length(window_s: float, slices: int) -> int:
    return max(1, math.ceil(window_s / slices))


def recorded_queries(window_s: float, agents: str, slices: int = SLICES) -> tuple[str, str]:
    """Whether the recording rule's series of the agents' targets are there at the window's start (the oldest
    slice's) and now (within `TAIL_S`): a count at one instant each, the same cost whatever the window and the scrape
    interval. Two queries, since one holding both selectors is read over the whole window between them."""
    start = f" offset {slices * _length(window_s, slices)}s"
    then = f"count({RECORDED_METRIC}{start} and on ({_TARGET}) up{{{agents}}}{start})"
    recent = f"[{TAIL_S}s]"
    now = f"count(last_over_time({RECORDED_METRIC}{recent}) and on ({_TARGET}) last_over_time(up{{{agents}}}{recent}))"
    return then, now


def recorded_of(*answers: Sequence[Mapping[str, Any]]) -> bool:
    """`recorded_queries`' answers: whether each counts a recorded series."""
    return all(any((_bytes(sample) or 0) > 0 for sample in answer) for answer in answers)


def _label(labels: Mapping[str, Any], name: str) -> str:
    exported = labels.get(f"exported_{name}")
    return str(exported if exported is not None else labels.get(name, ""))


def _bytes(sample: Mapping[str, Any]) -> int | None:
    """A sample's value as whole bytes; None for one that is not a finite non-negative number."""
    value = sample.get("value") or [None, None]
    try:
        number = float(value[1])
    except (TypeError, ValueError, IndexError):
        return None
    return int(number) if math.isfinite(number) and number >= 0 else None


def series_of(result: Sequence[Mapping[str, Any]]) -> list[PeakSeries]:
    """A vector result's samples as peaks; a sample without a pod or GPU, or with a value that is not a finite
    non-negative number, is left out."""
    out = []
    for sample in result:
        labels = sample.get("metric") or {}
        number = _bytes(sample)
        pod, gpu = _label(labels, "pod"), str(labels.get("gpu_uuid", ""))
        if number is None or not pod or not gpu:
            continue
        namespace, container = _label(labels, "namespace"), _label(labels, "container")
        out.append(PeakSeries(namespace, pod, container, gpu, number, _owner(labels, pod)))
    return out


def _owner(labels: Mapping[str, Any], pod: str) -> str:
    """The pod's controller as the agent saw it ("ReplicaSet/web-7d9f"; "Pod/<pod>" for a pod it saw without one),
    or "" for a series without the labels (an older agent's)."""
    kind, name = (str(labels.get(label, "")) for label in OWNER_LABELS)
    if kind == NO_OWNER:
        return f"Pod/{pod}"
    return f"{kind}/{name}" if kind and name else ""


def totals_of(result: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Each GPU's memory by UUID; a sample without a UUID or a usable value is left out."""
    out: dict[str, int] = {}
    for sample in result:
        gpu = str((sample.get("metric") or {}).get("gpu_uuid", ""))
        number = _bytes(sample)
        if gpu and number:
            out[gpu] = max(out.get(gpu, 0), number)
    return out


def merge_peaks(*sets: Sequence[PeakSeries]) -> list[PeakSeries]:
    """The highest of each (namespace, pod, container, GPU) across the metrics' answers, with the pod's owner where
    any of them carries it (an agent upgraded within the window)."""
    best: dict[tuple[str, str, str, str], PeakSeries] = {}
    for found in sets:
        for s in found:
            key = (s.namespace, s.pod, s.container, s.gpu_uuid)
            held = best.get(key)
            if held is None:
                best[key] = s
                continue
            top = s if s.peak_bytes > held.peak_bytes else held
            owner = top.owner or held.owner or s.owner
            best[key] = top if top.owner == owner else replace(top, owner=owner)
    return list(best.values())


def _get(url: str, target: str, timeout_s: float, headers: Mapping[str, str], max_bytes: int) -> tuple[int, bytes]:
    """`GET target`: the status and the body, all within `timeout_s` of the connection's start.

    Once connected, a watchdog shuts the socket at the deadline, which ends a read that is waiting: a per-read
    timeout would not, as a server sending a byte every few seconds never trips it."""
    parts = urllib.parse.urlsplit(target)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PrometheusError(f"{url}: not an http:// or https:// URL")
    started = time.monotonic()
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname, parts.port, timeout=timeout_s)
    try:
        conn.connect()
    except OSError as e:
        conn.close()
        reason = f"no connection within {timeout_s:g}s" if isinstance(e, TimeoutError) else str(e)
        raise PrometheusError(f"cannot reach {url}: {cut(reason or type(e).__name__, 300)}") from None
    expired = threading.Event()
    sock = conn.sock  # the response reads it after the connection lets go of it (a server that closes after one)

    def cut_off() -> None:
        expired.set()
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    watchdog = threading.Timer(max(0.0, timeout_s - (time.monotonic() - started)), cut_off)
    watchdog.daemon = True
    watchdog.start()
    late = PrometheusError(f"{url}: no whole answer within {timeout_s:g}s")
    response: http.client.HTTPResponse | None = None
    try:
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", path or "/", headers={"Accept": "application/json", **headers})
        response = conn.getresponse()
        limit = max_bytes if 200 <= response.status < 300 else ERROR_BODY_BYTES
        chunks: list[bytes] = []
        size = 0
        while chunk := response.read1(CHUNK_BYTES):  # what one read gives: the bounds are looked at as bytes come
            size += len(chunk)
            if size > max_bytes:
                raise PrometheusError(f"{url}: the answer is over {max_bytes} bytes")
            chunks.append(chunk)
            if size > limit:  # an error's message: its start is enough
                break
    except (OSError, http.client.HTTPException) as e:
        if expired.is_set() or isinstance(e, TimeoutError):
            raise late from None
        raise PrometheusError(f"{url}: the answer broke off: {cut(str(e) or type(e).__name__, 300)}") from None
    finally:
        watchdog.cancel()
        if response is not None:
            response.close()
        conn.close()
    if expired.is_set():  # the shut socket ended the body early: what was read is not the whole answer
        raise late
    return response.status, b"".join(chunks)[:limit]


def instant_query(
    url: str,
    promql: str,
    timeout_s: float = TIMEOUT_S,
    headers: Mapping[str, str] | None = None,
    max_bytes: int = MAX_BODY_BYTES,
) -> list[Mapping[str, Any]]:
    """`GET <url>/api/v1/query?query=...`: the result vector. Raises PrometheusError saying what went wrong."""
    target = f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    status, body = _get(url, target, timeout_s, headers or {}, max_bytes)
    if not 200 <= status < 300:
        detail = body.decode(errors="replace")
        with contextlib.suppress(ValueError, AttributeError):
            detail = str(json.loads(detail).get("error", detail))
        reason = http.client.responses.get(status, "")
        raise PrometheusError(f"{url}: {status} {reason}: {cut(detail, 300)}")
    try:
        document = load_json(body, max_bytes=max_bytes)
    except DocumentError as e:
        raise PrometheusError(f"{url}: not JSON ({cut(str(e), 200)}); is it a Prometheus?") from None
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(document, dict) or not isinstance(data, dict) or document.get("status") != "success":
        raise PrometheusError(f"{url}: not a query result: {cut(json.dumps(document)[:300], 300)}")
    if data.get("resultType") != "vector":
        raise PrometheusError(f"{url}: not a query result: {cut(json.dumps(document)[:300], 300)}")
    result = data.get("result")
    return [s for s in result if isinstance(s, dict)] if isinstance(result, list) else []


def read_peaks(
    url: str,
    window_s: float,
    agents: str,
    namespace: str | None = None,
    timeout_s: float = TIMEOUT_S,
    headers: Mapping[str, str] | None = None,
    recorded: bool = True,
) -> Scraped:
    """Every (pod, container, GPU)'s peak over the window and every GPU's memory, from the series scraped from the
    targets `agents` selects: first, with `recorded`, whether the recording rule covers the window; then SLICES
    queries per metric (of the recorded series alone, where it does) and one of the GPUs, all at once, each within
    `timeout_s`. The first failure raises, once every query has ended."""
    asked = 0
    with ThreadPoolExecutor(max_workers=2 * SLICES + 1, thread_name_prefix="vramguard-prometheus") as pool:
        there = False
        if recorded:
            asks = recorded_queries(window_s, agents)
            there = recorded_of(*pool.map(lambda q: instant_query(url, q, timeout_s, headers), asks))
            asked += len(asks)
        sent = queries(window_s, agents, namespace, recorded=there)
        answers = list(pool.map(lambda q: instant_query(url, q.promql, timeout_s, headers), sent))
    found = merge_peaks(*(series_of(a) for q, a in zip(sent, answers, strict=True) if q.metric != TOTAL_METRIC))
    if namespace is not None:  # without honor_labels, `namespace` is the agent's: the workload's is exported_
        found = [s for s in found if s.namespace == namespace]
    totals: dict[str, int] = {}
    for q, a in zip(sent, answers, strict=True):
        if q.metric == TOTAL_METRIC:
            totals |= totals_of(a)
    return Scraped(found, totals, asked + len(sent), there)
