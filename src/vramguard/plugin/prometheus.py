"""The peaks of a window, from a Prometheus that scrapes the agents: a fixed number of queries, however many
workloads.

Each query is an instant query of `max_over_time(<metric>[<slice>] offset <o>)`, grouped by the workload's labels:
the server reduces its slice of the window to one number per series, and answers one sample per (pod, container,
GPU). The window is cut into SLICES contiguous slices asked for at once: Prometheus evaluates one query on one core,
and a week of 30 s samples is tens of millions of them, so the slices let it use its cores. Two metrics are
read: the peak gauge (`vramguard_container_gpu_memory_peak_bytes`, each scan's usage, so a spike between two scrapes
is in it) and the usage gauge, for series scraped from agents older than the peak gauge. A scrape job without
`honor_labels` keeps the workload's labels as `exported_namespace`, `exported_pod` and `exported_container`; those
win where present.
"""

from __future__ import annotations

import contextlib
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

from vramguard.core.text import cut
from vramguard.plugin.recommend import PeakSeries

PEAK_METRIC: Final = "vramguard_container_gpu_memory_peak_bytes"
USED_METRIC: Final = "vramguard_container_gpu_memory_used_bytes"
METRICS: Final = (PEAK_METRIC, USED_METRIC)
MAX_BODY_BYTES: Final = 512 * 1024 * 1024  # 100,000 series answer in about 40 MB
TIMEOUT_S: Final = 60.0
SLICES: Final = 8  # queries per metric, each over its slice of the window, all sent at once
_LABELS: Final = ("namespace", "pod", "container")
_GROUP: Final = ", ".join([*_LABELS, *(f"exported_{name}" for name in _LABELS), "gpu_uuid"])


class PrometheusError(Exception):
    """Prometheus could not be asked, or answered something that is not a query result."""


@dataclass(frozen=True, slots=True)
class Query:
    """One query of one metric over the window, as sent to `/api/v1/query`."""

    metric: str
    promql: str


def queries(window_s: float, namespace: str | None = None, slices: int = SLICES) -> tuple[Query, ...]:
    """The queries for a window of `window_s` seconds, in one namespace or all: `slices` per metric, whose ranges
    (each left-open, as a range selector's) together are the window."""
    length = max(1, math.ceil(window_s / slices))
    out = []
    for metric in METRICS:
        for i in range(slices):
            offset = f" offset {i * length}s" if i else ""
            selector = f"max_over_time({metric}[{length}s]{offset})"
            if namespace is not None:
                quoted = json.dumps(namespace)  # a PromQL string literal takes JSON's escapes
                # Either label may carry the workload's namespace (`honor_labels` or not): a selector for each.
                selector = (
                    f"(max_over_time({metric}{{namespace={quoted}}}[{length}s]{offset})"
                    f" or max_over_time({metric}{{exported_namespace={quoted}}}[{length}s]{offset}))"
                )
            out.append(Query(metric, f"max by ({_GROUP}) ({selector})"))
    return tuple(out)


def _label(labels: Mapping[str, Any], name: str) -> str:
    exported = labels.get(f"exported_{name}")
    return str(exported if exported is not None else labels.get(name, ""))


def series_of(result: Sequence[Mapping[str, Any]]) -> list[PeakSeries]:
    """A vector result's samples as peaks; a sample without a pod or GPU, or with a value that is not a finite
    non-negative number, is left out."""
    out = []
    for sample in result:
        labels = sample.get("metric") or {}
        value = sample.get("value") or [None, None]
        try:
            number = float(value[1])
        except (TypeError, ValueError, IndexError):
            continue
        if not math.isfinite(number) or number < 0:
            continue
        pod, gpu = _label(labels, "pod"), str(labels.get("gpu_uuid", ""))
        if not pod or not gpu:
            continue
        namespace, container = _label(labels, "namespace"), _label(labels, "container")
        out.append(PeakSeries(namespace, pod, container, gpu, int(number)))
    return out


def merge_peaks(*sets: Sequence[PeakSeries]) -> list[PeakSeries]:
    """The highest of each (namespace, pod, container, GPU) across the metrics' answers."""
    best: dict[tuple[str, str, str, str], PeakSeries] = {}
    for found in sets:
        for s in found:
            key = (s.namespace, s.pod, s.container, s.gpu_uuid)
            held = best.get(key)
            if held is None or s.peak_bytes > held.peak_bytes:
                best[key] = s
    return list(best.values())


def instant_query(
    url: str, promql: str, timeout_s: float = TIMEOUT_S, headers: Mapping[str, str] | None = None
) -> list[Mapping[str, Any]]:
    """`GET <url>/api/v1/query?query=...`: the result vector. Raises PrometheusError saying what went wrong."""
    target = f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    request = urllib.request.Request(target, headers={"Accept": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # the user's URL
            body = response.read(MAX_BODY_BYTES + 1)
    except urllib.error.HTTPError as e:
        detail = e.read(4096).decode(errors="replace")
        with contextlib.suppress(ValueError, AttributeError):
            detail = str(json.loads(detail).get("error", detail))
        raise PrometheusError(f"{url}: {e.code} {e.reason}: {cut(detail, 300)}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise PrometheusError(f"cannot reach {url}: {cut(str(reason), 300)}") from None
    if len(body) > MAX_BODY_BYTES:
        raise PrometheusError(f"{url}: the answer is over {MAX_BODY_BYTES} bytes")
    try:
        document = json.loads(body)
    except ValueError as e:
        raise PrometheusError(f"{url}: not JSON ({cut(str(e), 200)}); is it a Prometheus?") from None
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, dict) or document.get("status") != "success" or data.get("resultType") != "vector":
        raise PrometheusError(f"{url}: not a query result: {cut(json.dumps(document)[:300], 300)}")
    result = data.get("result")
    return [s for s in result if isinstance(s, dict)] if isinstance(result, list) else []


def read_peaks(
    url: str,
    window_s: float,
    namespace: str | None = None,
    timeout_s: float = TIMEOUT_S,
    headers: Mapping[str, str] | None = None,
) -> tuple[list[PeakSeries], int]:
    """Every (pod, container, GPU)'s peak over the window, and the number of queries made (SLICES per metric, all at
    once). The first failure raises, once every query has ended."""
    sent = queries(window_s, namespace)
    with ThreadPoolExecutor(max_workers=len(sent), thread_name_prefix="vramguard-prometheus") as pool:
        answers = list(pool.map(lambda q: series_of(instant_query(url, q.promql, timeout_s, headers)), sent))
    found = merge_peaks(*answers)
    if namespace is not None:  # without honor_labels, `namespace` is the agent's: the workload's is exported_
        found = [s for s in found if s.namespace == namespace]
    return found, len(sent)
