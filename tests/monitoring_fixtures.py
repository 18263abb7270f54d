"""The chart's monitoring objects and the Grafana dashboard for the tests: Prometheus and promtool (3.16, built
from source with Kubernetes discovery by scripts/prometheus.sh), the rendered PrometheusRule and ServiceMonitor, the
dashboard's queries as Grafana sends them, the names a PromQL expression reads, and every metric the rules and
panels may name with its labels.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from helm_fixtures import one, render
from real_parts import need
from vramguard_testbed.reference import filled_metrics

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana-dashboard.json"
PROMETHEUS_VERSION = "3.16.0"  # as scripts/prometheus.sh builds it
PROMETHEUS_DIR = (
    Path(os.environ.get("VRAMGUARD_CACHE") or Path.home() / ".cache" / "vramguard") / "prometheus" / PROMETHEUS_VERSION
)
MONITORING = ("serviceMonitor.enabled=true", "prometheusRule.enabled=true")

# Labels prometheus-operator puts on every target of a ServiceMonitor endpoint (its promcfg.go): the chart's own
# relabelings add more (`monitor_target_labels`).
OPERATOR_TARGET_LABELS = frozenset({"job", "instance", "namespace", "service", "endpoint", "pod", "container"})
# What the rules and panels may read besides the agent's own series, each with the labels it has.
PROVIDED: Mapping[str, frozenset[str]] = {
    # Prometheus itself, for every target: the target labels only.
    "up": frozenset(),
    "scrape_duration_seconds": frozenset(),
    "scrape_samples_scraped": frozenset(),
    "scrape_series_added": frozenset(),
    # kube-state-metrics (scraped with honorLabels, as kube-prometheus does: its namespace is the object's).
    "kube_pod_status_ready": frozenset({"namespace", "pod", "uid", "condition"}),
    "kube_daemonset_status_desired_number_scheduled": frozenset({"namespace", "daemonset"}),
    "kube_daemonset_status_number_available": frozenset({"namespace", "daemonset"}),
    "kube_daemonset_status_updated_number_scheduled": frozenset({"namespace", "daemonset"}),
}


def promtool() -> Path:
    """The built promtool; skips without it, or fails under CI (scripts/test.sh runs scripts/prometheus.sh)."""
    return _tool("promtool")


def prometheus() -> Path:
    """The built prometheus server; skips without it, or fails under CI."""
    return _tool("prometheus")


def _tool(name: str) -> Path:
    path = PROMETHEUS_DIR / name
    need(
        None if path.exists() else f"Prometheus {PROMETHEUS_VERSION} is not built at {path}",
        skip="no Prometheus (bash scripts/prometheus.sh builds it)",
        ci="build Prometheus first",
    )
    return path


def rule_groups(helm: Path) -> dict[str, Any]:
    """The rendered PrometheusRule's spec: a Prometheus rule file as it is (`groups`)."""
    spec: dict[str, Any] = one(render(helm, *MONITORING), "PrometheusRule")["spec"]
    return spec


def alerting_rules(groups: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [r for g in groups["groups"] for r in g["rules"] if "alert" in r]


def monitor_target_labels(helm: Path) -> frozenset[str]:
    """Every label a target of the chart's ServiceMonitor carries: the operator's and the chart's relabelings'."""
    (endpoint,) = one(render(helm, *MONITORING), "ServiceMonitor")["spec"]["endpoints"]
    return OPERATOR_TARGET_LABELS | {r["targetLabel"] for r in endpoint.get("relabelings", []) if "targetLabel" in r}


# -- the dashboard ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    ref: str
    expr: str
    legend: str


def dashboard() -> dict[str, Any]:
    found: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return found


def panel_queries() -> list[PanelQuery]:
    """Every query of every panel, as written (with Grafana's variables)."""
    return [
        PanelQuery(p["title"], t["refId"], t["expr"], t.get("legendFormat", ""))
        for p in dashboard()["panels"]
        for t in p["targets"]
    ]


def variable_queries() -> list[tuple[str, str]]:
    """Each query variable's `label_values(metric, label)`, as (metric, label)."""
    found = []
    for v in dashboard()["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", v["query"]["query"])
            assert m is not None, f"variable {v['name']}: {v['query']['query']!r} is not label_values(metric, label)"
            found.append((m[1], m[2]))
    return found


def as_grafana_sends(expr: str, *, node: str, rate_interval: str = "1m") -> str:
    """`expr` with the variables substituted as Grafana does for a Prometheus data source: a multi-value
    variable's one value regex-escaped inside its `=~` matcher (the backslash doubled for the PromQL string)."""
    escaped = re.sub(r"([\\^$*+?.()|\[\]{}])", r"\\\\\1", node)
    out = expr.replace("$__rate_interval", rate_interval).replace("$node", escaped)
    assert "$" not in out, f"a Grafana variable left in {out!r}"
    return out


def legend_labels(legend: str) -> set[str]:
    return set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))


# -- the names PromQL reads --------------------------------------------------------------------------------------


_TOKEN = re.compile(
    r"""
    (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    |(?P<range>\[[^\]]*\])
    |(?P<duration>\d+(?:ms|[smhdwy])\b)
    |(?P<number>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+)
    |(?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
    |(?P<op>=~|!~|!=|==|<=|>=|[=<>+\-*/%^(){},])
    |(?P<space>\s+)
    """,
    re.VERBOSE,
)
_BINARY = frozenset({"and", "or", "unless", "bool", "offset", "inf", "nan"})
_LABEL_LISTS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})


@dataclass
class PromqlNames:
    """What one PromQL expression reads: metric names, the labels its selectors match on (per metric), and the
    labels its `by`/`without`/`on`/`ignoring`/`group_*` lists name."""

    metrics: set[str] = field(default_factory=set)
    matchers: set[tuple[str, str]] = field(default_factory=set)
    grouping: set[str] = field(default_factory=set)


def promql_names(expr: str) -> PromqlNames:
    """The names in `expr`, by a tokenizer that knows PromQL's shapes: `ident(` is a function or aggregation, an
    identifier after `by`/`on`/... lists labels, `{label op "value"}` matches a label of the selector's metric,
    strings, ranges and durations are skipped, and any other identifier is a metric name."""
    tokens = [(kind, text) for kind, text in _tokens(expr) if kind != "space"]
    names = PromqlNames()
    i = 0
    metric = ""  # the selector whose braces come next
    while i < len(tokens):
        kind, text = tokens[i]
        following = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if kind == "ident" and text in _LABEL_LISTS:
            if following == "(":
                i, labels = _until_close(tokens, i + 2)
                names.grouping |= labels
                continue
        elif kind == "ident" and text in _BINARY:
            pass
        elif kind == "ident" and (following == "(" or following in ("by", "without")):
            pass  # a function, or an aggregation with its grouping first
        elif kind == "ident":
            metric = text
            names.metrics.add(text)
        elif text == "{":
            i, matchers = _matchers(tokens, i + 1)
            for label, value in matchers:
                if label == "__name__":
                    metric = value
                    names.metrics.add(value)
            names.matchers |= {(metric, label) for label, _ in matchers if label != "__name__"}
            metric = ""
            continue
        i += 1
    return names


def _tokens(expr: str) -> Iterator[tuple[str, str]]:
    at = 0
    while at < len(expr):
        m = _TOKEN.match(expr, at)
        if m is None or m.lastgroup is None:
            raise ValueError(f"cannot read PromQL at {expr[at:]!r}")
        yield m.lastgroup, m.group()
        at = m.end()


def _until_close(tokens: list[tuple[str, str]], i: int) -> tuple[int, set[str]]:
    labels = set()
    while tokens[i][1] != ")":
        if tokens[i][0] == "ident":
            labels.add(tokens[i][1])
        i += 1
    return i + 1, labels


def _matchers(tokens: list[tuple[str, str]], i: int) -> tuple[int, list[tuple[str, str]]]:
    found = []
    while tokens[i][1] != "}":
        if tokens[i][0] == "ident":
            found.append((tokens[i][1], tokens[i + 2][1][1:-1]))
            i += 3
        else:
            i += 1  # a comma
    return i + 1, found


def name_mistakes(
    expr: str, known: Mapping[str, frozenset[str]], target: frozenset[str], legend: frozenset[str] = frozenset()
) -> list[str]:
    """What `expr` (and a legend over its series) names that nothing provides: a metric not in `known`, a matcher's
    label that its metric lacks, a grouping or legend label that none of its metrics has; `target` labels are on
    every series."""
    names = promql_names(expr)
    found = [f"reads {m}, which nothing exports" for m in sorted(names.metrics - known.keys())]
    for metric, label in sorted(names.matchers):
        if label not in known.get(metric, frozenset()) | target:
            found.append(f"matches {metric} on {label}, which it does not have")
    has = set(target).union(*(known.get(m, frozenset()) for m in names.metrics))
    found += [f"groups by {label}, which none of its metrics has" for label in sorted(names.grouping - has)]
    found += [f"shows {label} in its legend, which none of its series has" for label in sorted(legend - has)]
    return found


# -- what the agent exports ---------------------------------------------------------------------------------------


def agent_series() -> dict[str, frozenset[str]]:
    """Every series name the agent's registry exposes, with its label names: read back from the registry's own
    exposition with every family filled (`vramguard_testbed.reference.filled_metrics`, which the metrics reference
    is generated from too)."""
    metrics = filled_metrics()
    exposed: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            exposed.setdefault(sample.name, set()).update(sample.labels)
    return {name: frozenset(labels) for name, labels in exposed.items()}
