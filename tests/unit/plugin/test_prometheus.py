"""Reading the peaks from Prometheus: the queries (a fixed number, of the agents' targets alone), the answer read with
the workload's labels (`exported_` ones winning), the series of any other scrape left out, every answer bounded in
time, size and depth, and each way Prometheus can fail named. A fake Prometheus on a real HTTP socket evaluates the
queries over series labelled as Prometheus labels them."""

from __future__ import annotations

import time
from typing import Any

import pytest
import yaml

from unit.test_runbooks import RULES, untemplated
from vramguard.core.quantity import GiB
from vramguard.plugin.prometheus import (
    PEAK_METRIC,
    RECORD_INTERVAL_S,
    RECORDED_METRIC,
    SLICES,
    TAIL_S,
    TOTAL_METRIC,
    USED_METRIC,
    PrometheusError,
    instant_query,
    merge_peaks,
    parse_selector,
    queries,
    read_peaks,
    recorded_of,
    recorded_queries,
    series_of,
)
from vramguard.plugin.recommend import PeakSeries

from .fake_prometheus import AGENT_TARGET, NOW, TENANT_TARGET, Store, fake_prometheus

AGENTS = 'job="vramguard-metrics",namespace="vramguard"'
FORGED = 1297036692682702848  # what a tenant's exporter published, in the attack


def gauge(store: Store, metric: str, value: float, target: dict[str, str] = AGENT_TARGET, **labels: str) -> None:
    """A per-container gauge as an agent exposes it (with the chart's honorLabels unless the target is a tenant's)."""
    exposed = {"namespace": "ml", "container": "main", "gpu": "0", "gpu_uuid": "GPU-0", **labels}
    store.add(metric, value, target, honor_labels=target is AGENT_TARGET, **exposed)


def gpu_total(store: Store, value: float, target: dict[str, str] = AGENT_TARGET, uuid: str = "GPU-0") -> None:
    store.add(TOTAL_METRIC, value, target, honor_labels=True, gpu="0", gpu_uuid=uuid, name="NVIDIA H100")


def test_the_queries_are_a_fixed_number_whose_slices_make_the_window() -> None:
    """SLICES per metric, whatever the workloads: contiguous slices, the first ending now, together the window, each
    of the series scraped from the agents' targets; and one of the GPUs' memory over the window."""
    sent = queries(7 * 86400, AGENTS, slices=7)
    assert [q.metric for q in sent] == [PEAK_METRIC] * 7 + [USED_METRIC] * 7 + [TOTAL_METRIC]
    group = (
        "max by (namespace, pod, container, exported_namespace, exported_pod, exported_container, gpu_uuid, "
        "owner_kind, owner_name)"
    )
    assert sent[0].promql == (
        f"{group} (max_over_time({PEAK_METRIC}[86400s]) and on (job, instance) max_over_time(up{{{AGENTS}}}[86400s]))"
    )
    assert sent[6].promql == (
        f"{group} (max_over_time({PEAK_METRIC}[86400s] offset 518400s)"
        f" and on (job, instance) max_over_time(up{{{AGENTS}}}[86400s] offset 518400s))"
    )
    assert sent[-1].promql == (
        f"max by (gpu_uuid) (max_over_time({TOTAL_METRIC}{{{AGENTS}}}[604800s:2363s])"
        f" or max_over_time({TOTAL_METRIC}{{{AGENTS}}}[2363s]))"
    )
    assert len(queries(60, AGENTS)) == 2 * SLICES + 1
    one = queries(60, AGENTS, "ml")[0].promql
    assert 'namespace="ml"' in one and 'exported_namespace="ml"' in one


def test_the_peaks_are_read_and_merged() -> None:
    """The highest of the two metrics per (pod, container, GPU); exported_ labels win; unusable samples are left
    out; each GPU's memory by UUID."""
    store = Store()
    gauge(store, PEAK_METRIC, 9 * GiB, pod="web-1")
    # An agents' scrape job without honor_labels: the workload's labels are exported_.
    plain = {**AGENT_TARGET, "job": "vramguard-pods", "instance": "10.0.0.2:9400"}
    store.add(PEAK_METRIC, 3 * GiB, plain, honor_labels=False, namespace="ml", pod="web-2", container="main",
              gpu_uuid="GPU-0")  # fmt: skip
    gauge(store, PEAK_METRIC, float("nan"), pod="web-3")
    gauge(store, PEAK_METRIC, -1, pod="web-4")
    gauge(store, PEAK_METRIC, GiB, pod="")
    gauge(store, USED_METRIC, 2 * GiB, pod="web-1")
    gauge(store, USED_METRIC, 5 * GiB, pod="old", gpu_uuid="GPU-1")  # an older agent's
    gpu_total(store, 80 * GiB)
    gpu_total(store, 40 * GiB, uuid="GPU-1")
    with fake_prometheus(store) as (url, asked):
        got = read_peaks(url, 3600, 'namespace="vramguard"')
    assert got.queries == len(asked) == 2 * SLICES + 3, "the recording rule's two questions, then the window's"
    assert not got.recorded
    assert sorted(got.series, key=lambda s: s.pod) == [
        PeakSeries("ml", "old", "main", "GPU-1", 5 * GiB),
        PeakSeries("ml", "web-1", "main", "GPU-0", 9 * GiB),
        PeakSeries("ml", "web-2", "main", "GPU-0", 3 * GiB),
    ]
    assert got.gpu_total_bytes == {"GPU-0": 80 * GiB, "GPU-1": 40 * GiB}


DAY = 86400


@pytest.mark.parametrize("recorded", [False, True], ids=["the-gauges-as-scraped", "the-recording-rule"])
def test_a_window_the_recording_rule_covers_is_read_from_it(recorded: bool) -> None:
    """Where the rule covers the window, its series in SLICES queries (not the usage gauge, which only agents older
    than the rule need) and the peak gauge over the last two intervals, which the rule lags; else both gauges."""
    sent = queries(7 * DAY, AGENTS, slices=7, recorded=recorded)
    metrics = [q.metric for q in sent]
    want = [RECORDED_METRIC] * 7 + [PEAK_METRIC] if recorded else [PEAK_METRIC] * 7 + [USED_METRIC] * 7
    assert metrics == [*want, TOTAL_METRIC]
    if recorded:
        assert f"max_over_time({RECORDED_METRIC}[{DAY}s])" in sent[0].promql
        assert f"max_over_time({PEAK_METRIC}[{TAIL_S}s])" in sent[7].promql


def test_whether_the_rule_covers_the_window_is_asked_at_its_start_and_now() -> None:
    """Two queries of one instant each, of the agents' targets: at the window's start (the oldest slice's) and
    within the last two intervals; the rule covers the window when both count a series."""
    then, now = recorded_queries(7 * DAY, AGENTS, slices=7)
    assert then == f"count({RECORDED_METRIC} offset {7 * DAY}s and on (job, instance) up{{{AGENTS}}} offset {7 * DAY}s)"
    assert f"last_over_time({RECORDED_METRIC}[{TAIL_S}s])" in now and f"up{{{AGENTS}}}[{TAIL_S}s]" in now
    counted: list[dict[str, Any]] = [{"metric": {}, "value": [NOW, "3"]}]
    assert recorded_of(counted, counted)
    assert not recorded_of(counted, [])
    assert not recorded_of([], counted)


def test_a_window_the_rule_recorded_is_read_from_it() -> None:
    """With the rule there the whole window, the peaks come from its series (and the raw tail); the usage gauge is
    not asked."""
    store = Store(recorded=True)
    gauge(store, RECORDED_METRIC, 9 * GiB, pod="web-1")
    gauge(store, PEAK_METRIC, 10 * GiB, pod="web-1")  # the last minutes, past the rule's last sample
    gauge(store, USED_METRIC, 50 * GiB, pod="web-1")
    gpu_total(store, 80 * GiB)
    with fake_prometheus(store) as (url, asked):
        got = read_peaks(url, 7 * DAY, AGENTS)
    assert got.recorded and got.queries == len(asked) == SLICES + 4
    assert not any(USED_METRIC in q for q in asked)
    assert got.series == [PeakSeries("ml", "web-1", "main", "GPU-0", 10 * GiB)]
    with fake_prometheus(store) as (url, asked):
        raw = read_peaks(url, 7 * DAY, AGENTS, recorded=False)
    assert raw.queries == len(asked) == 2 * SLICES + 1 and not raw.recorded, "the bench's raw reading"


@pytest.mark.parametrize(
    ("labels", "owner"),
    [
        pytest.param({"owner_kind": "ReplicaSet", "owner_name": "web-7d9f"}, "ReplicaSet/web-7d9f", id="controller"),
        pytest.param({"owner_kind": "<none>", "owner_name": "<none>"}, "Pod/web-1", id="none-is-the-pod-itself"),
        pytest.param({}, "", id="an-older-agent-without-the-labels"),
        pytest.param({"owner_kind": "ReplicaSet"}, "", id="half-an-owner-is-none"),
    ],
)
def test_each_series_carries_its_pods_controller(labels: dict[str, str], owner: str) -> None:
    """owner_kind and owner_name, as kube_pod_owner names them, are the pod's owner; "<none>" the pod itself."""
    sample = {"metric": {"pod": "web-1", "gpu_uuid": "GPU-0", "namespace": "ml", **labels}, "value": [NOW, "1"]}
    (series,) = series_of([sample])
    assert series.owner == owner


def test_merging_keeps_the_owner_any_answer_carries() -> None:
    """An agent upgraded within the window: the highest peak wins, with the owner the newer series carry."""
    old = PeakSeries("ml", "web-1", "main", "GPU-0", 9 * GiB)
    new = PeakSeries("ml", "web-1", "main", "GPU-0", 5 * GiB, "ReplicaSet/web-7d9f")
    assert merge_peaks([old], [new]) == [PeakSeries("ml", "web-1", "main", "GPU-0", 9 * GiB, "ReplicaSet/web-7d9f")]
    assert merge_peaks([new], [old]) == merge_peaks([old], [new])


@pytest.mark.parametrize("honor_labels", [False, True], ids=["tenant-plain", "tenant-honor-labels"])
def test_only_the_agents_series_are_read(honor_labels: bool) -> None:
    """A tenant's exporter, scraped by the same Prometheus under a Service named as the chart's, publishing the
    peak gauge for a real workload's pod (over the agent's 9GiB), for a workload that used no GPU, and a GPU's
    memory: none of it is read; the agent's series are."""
    store = Store()
    gauge(store, PEAK_METRIC, 9 * GiB, pod="web-7d9f4c8b5-x2b4z")
    gpu_total(store, 80 * GiB)
    tenant = {"namespace": "ml", "container": "main", "gpu_uuid": "GPU-0"}
    store.add(PEAK_METRIC, FORGED, TENANT_TARGET, honor_labels, pod="web-7d9f4c8b5-x2b4z", **tenant)
    store.add(PEAK_METRIC, 5 * GiB, TENANT_TARGET, honor_labels, pod="cpu-only-7d9f4c8b5-q9w2k", **tenant)
    store.add(TOTAL_METRIC, FORGED, TENANT_TARGET, honor_labels, gpu_uuid="GPU-0")
    with fake_prometheus(store) as (url, _):
        got = read_peaks(url, 3600, AGENTS, "ml")
    assert got.series == [PeakSeries("ml", "web-7d9f4c8b5-x2b4z", "main", "GPU-0", 9 * GiB)]
    if not honor_labels:  # with honor_labels a tenant writes any label, `namespace` too: the bound is what is left
        assert got.gpu_total_bytes == {"GPU-0": 80 * GiB}


@pytest.mark.parametrize(
    ("answer", "status", "words"),
    [
        pytest.param(b'{"status":"error","error":"parse error at char 3"}', 400,
                     "400 Bad Request: parse error at char 3", id="prometheus-refuses"),
        pytest.param(b"<html>login</html>", 200, "not JSON", id="a-login-page"),
        pytest.param(b'{"status":"success","data":{"resultType":"matrix","result":[]}}', 200, "not a query result",
                     id="not-a-vector"),
        pytest.param(b"[" * 50_000 + b"]" * 50_000, 200, "nested deeper than 64 levels", id="50000-deep"),
    ],
)  # fmt: skip
def test_failures_are_named(answer: bytes, status: int, words: str) -> None:
    """Each answer that is not a query result is a PrometheusError saying what it is, never a traceback."""
    with fake_prometheus(answer, status) as (url, _), pytest.raises(PrometheusError, match=words):
        read_peaks(url, 60, AGENTS)


def test_a_trickling_answer_is_cut_at_its_deadline() -> None:
    """An answer sent a byte at a time, each within the timeout, is cut when the whole answer's deadline passes:
    a 1 s deadline ends a read that would take 30 s, well before 10 s."""
    body = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
    body = body[:-1] + b" " * (300 - len(body)) + b"}"  # JSON still, 30 s at a byte every 0.1 s
    started = time.monotonic()
    with fake_prometheus(body, pace_s=0.1) as (url, _):
        with pytest.raises(PrometheusError, match=r"no whole answer within 1s"):
            instant_query(url, "up", timeout_s=1.0)
        cut_s = time.monotonic() - started
    print(f"a trickling answer cut {cut_s:.2f} s after the query")
    assert cut_s < 10.0


def test_an_answer_over_its_size_bound_is_refused() -> None:
    """An answer longer than the bound is refused, naming the bound."""
    body = b'{"status":"success","data":{"resultType":"vector","result":[' + b"{}," * 100 + b"{}]}}"
    with fake_prometheus(body) as (url, _), pytest.raises(PrometheusError, match="over 200 bytes"):
        instant_query(url, "up", max_bytes=200)


def test_an_unreachable_prometheus_is_named() -> None:
    with pytest.raises(PrometheusError, match=r"cannot reach http://127\.0\.0\.1:9"):
        read_peaks("http://127.0.0.1:9", 60, AGENTS, timeout_s=2)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param(AGENTS, AGENTS, id="the-charts"),
        pytest.param('{job = "a", instance=~"10\\\\..*"}', 'job = "a",instance=~"10\\\\..*"', id="braces-and-regex"),
        pytest.param("job=a", None, id="unquoted"),
        pytest.param('job="a"} or up{x="y"', None, id="an-injected-expression"),
        pytest.param("", None, id="empty"),
    ],
)
def test_the_selector_is_a_list_of_matchers(text: str, want: str | None) -> None:
    """--prometheus-selector takes label matchers alone: anything else is refused, not put into a query."""
    if want is None:
        with pytest.raises(ValueError):
            parse_selector(text)
    else:
        assert parse_selector(text) == want


def test_the_charts_recording_rule_records_what_recommend_reads() -> None:
    """The chart's PrometheusRule records, under the name recommend reads, the peak gauge's maximum over each
    interval, evaluated every interval (so its samples together hold every scraped peak), from the agents' job."""
    spec = yaml.safe_load(untemplated(RULES.read_text()))["spec"]
    ((group, rule),) = [(g, r) for g in spec["groups"] for r in g["rules"] if "record" in r]
    assert rule["record"] == RECORDED_METRIC
    assert group["interval"] == f"{RECORD_INTERVAL_S // 60}m"
    assert rule["expr"] == f'max_over_time({PEAK_METRIC}{{job="T"}}[{RECORD_INTERVAL_S // 60}m])'
