"""The chart's alerting rules under promtool (Prometheus 3.16, built from source by scripts/prometheus.sh):
`promtool check rules` on the rendered PrometheusRule, and `promtool test rules` for each alert with the series that
must make it fire (its labels and summary as an operator reads them) and the nearby series that must not; and one
list of what the rules and the Grafana dashboard may name: the agent's own series (asked of its registry),
Prometheus' and kube-state-metrics'. The series are as Prometheus stores them when it scrapes the agent through the
chart's ServiceMonitor; the agent's counters start at 0 (it exports every result it counts under from its start).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from helm_fixtures import CHART, need_helm
from monitoring_fixtures import (
    PROVIDED,
    agent_series,
    alerting_rules,
    as_grafana_sends,
    legend_labels,
    monitor_target_labels,
    name_mistakes,
    panel_queries,
    promql_names,
    promtool,
    rule_groups,
    variable_queries,
)

NODE = "gpu-node-1"
# The labels of a series scraped from the agent on NODE (its pod's target labels, the chart's `node` relabeling).
TARGET = {
    "job": "vramguard-metrics",
    "namespace": "vramguard",
    "service": "vramguard-metrics",
    "endpoint": "metrics",
    "pod": "vramguard-x7k2p",
    "container": "vramguard",
    "instance": "10.0.0.5:9400",
    "node": NODE,
}
KSM = {"job": "kube-state-metrics", "instance": "10.0.0.9:8080"}
GPU0 = {"gpu": "0", "gpu_uuid": "GPU-6e1f0c2a-0000-0000-0000-000000000000"}


def agent(metric: str, /, **labels: str) -> str:
    """A series of the agent on NODE, as Prometheus stores it."""
    return _series(metric, {**TARGET, **labels})


def ksm(metric: str, /, **labels: str) -> str:
    """A kube-state-metrics series (honorLabels: its namespace is the object's)."""
    return _series(metric, {**KSM, **labels})


# kube-state-metrics' counts of a DaemonSet's agents, by the word a case names them with.
DAEMONSET_COUNTS = {
    "desired": "kube_daemonset_status_desired_number_scheduled",
    "available": "kube_daemonset_status_number_available",
    "updated": "kube_daemonset_status_updated_number_scheduled",
}


def daemonset(namespace: str = "vramguard", /, **counts: str) -> dict[str, str]:
    """The `vramguard` DaemonSet in `namespace` as kube-state-metrics reports it: each count's values."""
    return {ksm(DAEMONSET_COUNTS[k], namespace=namespace, daemonset="vramguard"): v for k, v in counts.items()}


def _series(name: str, labels: Mapping[str, str]) -> str:
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


@dataclass(frozen=True)
class Case:
    """Input series (promtool's expanding notation, one sample a minute) and the alerts that fire at `at`."""

    series: Mapping[str, str]
    at: str
    fires: tuple[Mapping[str, Any], ...] = ()


def fired(summary: str, /, **labels: str) -> dict[str, Any]:
    return {"exp_labels": labels, "exp_annotations": {"summary": summary}}


def runbook(alert: str) -> str:
    """The runbook_url the chart gives an alert: its section of docs/operations.md (tests/unit/test_runbooks.py
    checks that the heading exists)."""
    home = yaml.safe_load((CHART / "Chart.yaml").read_text())["home"]
    return f"{home}/blob/main/docs/operations.md#{alert.lower()}"


DOWN = f"vramguard on {NODE} cannot be scraped: GPU memory quotas are not enforced there"
BUCKETS_SLOW = {"0.5": "0x30", "1.0": "0+60x30", "+Inf": "0+60x30"}
BUCKETS_FAST = {"0.5": "0+60x30", "1.0": "0+60x30", "+Inf": "0+60x30"}
UNATTRIBUTED = "GPU memory outside any known pod grows on gpu-node-1: no quota covers it"
HOST = {**GPU0, "reason": "not-in-pod"}  # the unattributed memory of host processes
NEEDS_RESET = (
    "GPU 0 on gpu-node-1 needs a reset: 2GiB held by exited processes (VRAMGPUNeedsReset on the Node); drain the "
    "node, then nvidia-smi --gpu-reset -i <index>"
)
HELD = "vramguard_gpu_memory_held_by_exited_processes_bytes"
ORPHANED = (
    "GPU 0 on gpu-node-1: 3GiB held by processes of pods that are gone (VRAMOrphanReclaimed / VRAMOrphanFound on the "
    "Node; kubectl vramguard nodes)"
)
ORPHANED_BYTES = "vramguard_orphaned_gpu_memory_bytes"


def missing(count: int) -> dict[str, Any]:
    """VramguardAgentMissing firing for the chart's DaemonSet, `count` agents short."""
    return fired(
        f"DaemonSet vramguard/vramguard is {count} agent(s) short of those it wants (its events say why a pod is "
        "missing or refused; `kubectl -n vramguard get pods -o wide` shows which GPU node lacks one): GPU memory "
        "quotas are not enforced there",
        **KSM,
        namespace="vramguard",
        daemonset="vramguard",
        severity="critical",
    )


# A rollout of 30 agents, 3 (10%) at a time: each round's new pods are created (updated) and take 3 minutes.
ROLLOUT_UPDATED = "0 " + " ".join(f"{3 * r}x2" for r in range(1, 11)) + " 30x10"
# The third agent's pod gone at 1m (deleted, or refused when recreated): the other two keep VramguardAgentDown quiet.
GONE = daemonset(desired="3x40", available="3 2x40", updated="3 2x40")
# A node drained and shut down: NotReady (its agent unavailable) from 5m until its Node is deleted at 10m.
DRAINED = daemonset(desired="3x9 2x25", available="3x4 2x30", updated="3x9 2x25")

CASES: dict[str, dict[str, Case]] = {
    "VramguardAgentDown": {
        "fires-after-5m-unscraped": Case({agent("up"): "1 0x10"}, "7m", (fired(DOWN, **TARGET, severity="critical"),)),
        "fires-when-every-agent-is-gone-and-the-daemonset-wants-one": Case(
            {
                ksm(
                    "kube_daemonset_status_desired_number_scheduled", namespace="vramguard", daemonset="vramguard"
                ): "1x10"
            },
            "7m",
            (
                fired(
                    "no vramguard agent is scraped though its DaemonSet wants some: GPU memory quotas are not "
                    "enforced there",
                    job="vramguard-metrics",
                    namespace="vramguard",
                    severity="critical",
                ),
            ),
        ),
        "quiet-for-a-blip-shorter-than-for": Case({agent("up"): "1 0 0 0 1x10"}, "4m"),
        "quiet-once-back-after-a-blip": Case({agent("up"): "1 0 0 0 1x10"}, "8m"),
        "quiet-while-healthy": Case({agent("up"): "1x10"}, "10m"),
        "quiet-without-gpu-nodes": Case(
            {
                ksm(
                    "kube_daemonset_status_desired_number_scheduled", namespace="vramguard", daemonset="vramguard"
                ): "0x10"
            },
            "10m",
        ),
    },
    "VramguardAgentMissing": {
        "fires-20m-after-a-third-agents-pod-is-gone": Case(GONE, "21m", (missing(1),)),
        "fires-when-a-third-agents-pod-is-never-created": Case(
            daemonset(desired="3x30", available="2x30", updated="2x30"), "16m", (missing(1),)
        ),
        "fires-when-a-rollout-stalls": Case(
            daemonset(desired="30x40", available="30 27x40", updated="0 3x2 6x2 9x40"), "28m", (missing(3),)
        ),
        "quiet-until-for-has-passed-after-the-pod-is-gone": Case(GONE, "19m"),
        "quiet-while-a-rollout-replaces-an-agent": Case(
            daemonset(desired="3x30", available="3 2x2 3x25", updated="2 3x30"), "3m"
        ),
        "quiet-during-a-rollout-twice-as-long-as-for": Case(
            daemonset(desired="30x40", available="30 27x29 30x10", updated=ROLLOUT_UPDATED), "30m"
        ),
        "quiet-while-a-drained-nodes-agent-goes-before-its-node": Case(DRAINED, "9m"),
        "quiet-once-a-drained-node-is-removed": Case(DRAINED, "25m"),
        "quiet-while-every-agent-is-available": Case(
            daemonset(desired="3x30", available="3x30", updated="3x30"), "25m"
        ),
        "quiet-for-another-namespaces-daemonset": Case(
            daemonset("ml", desired="3x30", available="2x30", updated="2x30"), "25m"
        ),
    },
    "VramguardAgentNotReady": {
        "fires-after-10m-not-ready": Case(
            {ksm("kube_pod_status_ready", namespace="vramguard", pod="vramguard-x7k2p", condition="false"): "1x15"},
            "11m",
            (
                fired(
                    "vramguard pod vramguard-x7k2p is not ready: its /readyz says why (NVML, pod cache, API server)",
                    **KSM,
                    namespace="vramguard",
                    pod="vramguard-x7k2p",
                    condition="false",
                    severity="warning",
                ),
            ),
        ),
        "quiet-for-a-start-shorter-than-for": Case(
            {ksm("kube_pod_status_ready", namespace="vramguard", pod="vramguard-x7k2p", condition="false"): "1x5 0x10"},
            "11m",
        ),
        "quiet-while-ready": Case(
            {
                ksm("kube_pod_status_ready", namespace="vramguard", pod="vramguard-x7k2p", condition="false"): "0x15",
                ksm("kube_pod_status_ready", namespace="vramguard", pod="vramguard-x7k2p", condition="true"): "1x15",
            },
            "11m",
        ),
        "quiet-for-another-namespaces-pod": Case(
            {ksm("kube_pod_status_ready", namespace="ml", pod="vramguard-x7k2p", condition="false"): "1x15"}, "11m"
        ),
    },
    "VramguardScansFailing": {
        "fires-on-failures-that-go-on-for-10m": Case(
            {agent("vramguard_scans_failed_total"): "0+1x25"},
            "21m",
            (fired(f"vramguard on {NODE} has scans that fail (scan_failed in its log)", **TARGET, severity="warning"),),
        ),
        "quiet-after-one-failure": Case({agent("vramguard_scans_failed_total"): "0 1x25"}, "15m"),
        "quiet-while-healthy": Case({agent("vramguard_scans_failed_total"): "0x25"}, "21m"),
    },
    "VramguardScansSlow": {
        "fires-on-a-p99-over-half-a-second-for-15m": Case(
            {agent("vramguard_scan_duration_seconds_bucket", le=le): v for le, v in BUCKETS_SLOW.items()},
            "20m",
            (
                fired(
                    f"vramguard scans on {NODE} take over 0.5 s at p99: enforcement reacts late",
                    node=NODE,
                    severity="warning",
                ),
            ),
        ),
        "quiet-while-slow-for-less-than-for": Case(
            {agent("vramguard_scan_duration_seconds_bucket", le=le): v for le, v in BUCKETS_SLOW.items()}, "10m"
        ),
        "quiet-while-fast": Case(
            {agent("vramguard_scan_duration_seconds_bucket", le=le): v for le, v in BUCKETS_FAST.items()}, "20m"
        ),
    },
    "VramguardGpuUnhealthy": {
        "fires-after-5m-unhealthy": Case(
            {agent("vramguard_gpu_healthy", **GPU0, name="NVIDIA L4"): "1 0x10"},
            "7m",
            (
                fired(
                    f"GPU 0 on {NODE}: NVML calls fail or hang; nothing on it is enforced",
                    **TARGET,
                    **GPU0,
                    name="NVIDIA L4",
                    severity="warning",
                ),
            ),
        ),
        "quiet-for-a-blip-shorter-than-for": Case(
            {agent("vramguard_gpu_healthy", **GPU0, name="NVIDIA L4"): "1 0 0 1x10"}, "8m"
        ),
        "quiet-while-healthy": Case({agent("vramguard_gpu_healthy", **GPU0, name="NVIDIA L4"): "1x10"}, "8m"),
        "quiet-on-a-node-without-gpus": Case({agent("up"): "1x10"}, "8m"),
    },
    "VramguardActionsFailing": {
        "fires-on-the-first-failure": Case(
            {agent("vramguard_actions_total", action="kill", result="failed"): "0x5 1x20"},
            "8m",
            (
                fired(
                    f"vramguard on {NODE}: kill actions end failed",
                    **TARGET,
                    action="kill",
                    result="failed",
                    severity="warning",
                ),
            ),
        ),
        "fires-on-a-later-failure": Case(
            {agent("vramguard_actions_total", action="evict", result="memory-not-freed"): "0 1x20 2x10"},
            "25m",
            (
                fired(
                    f"vramguard on {NODE}: evict actions end memory-not-freed",
                    **TARGET,
                    action="evict",
                    result="memory-not-freed",
                    severity="warning",
                ),
            ),
        ),
        "quiet-15m-after-the-last-failure": Case(
            {agent("vramguard_actions_total", action="kill", result="failed"): "0 1x40"}, "30m"
        ),
        "quiet-before-any-failure": Case(
            {agent("vramguard_actions_total", action="kill", result="failed"): "0x20"}, "10m"
        ),
        "quiet-while-actions-succeed": Case(
            {agent("vramguard_actions_total", action="kill", result="ok"): "0+1x20"}, "10m"
        ),
    },
    "VramguardEventsDropped": {
        "fires-on-the-first-drop": Case(
            {agent("vramguard_events_total", result="dropped"): "0x5 3x20"},
            "8m",
            (
                fired(
                    f"vramguard on {NODE} drops Kubernetes Events (a noisy pod, or the API server away)",
                    **TARGET,
                    result="dropped",
                    severity="info",
                ),
            ),
        ),
        "quiet-15m-after-the-last-drop": Case({agent("vramguard_events_total", result="failed"): "0 1x40"}, "30m"),
        "quiet-before-any-drop": Case({agent("vramguard_events_total", result="dropped"): "0x20"}, "10m"),
        "quiet-while-events-are-written": Case({agent("vramguard_events_total", result="written"): "0+5x20"}, "10m"),
    },
    "VramguardUnattributedMemoryGrowing": {
        "fires-on-30m-of-growth": Case(
            {agent("vramguard_unattributed_gpu_memory_bytes", **HOST): "0+100000000x80"},
            "40m",
            (fired(UNATTRIBUTED, node=NODE, severity="info"),),
        ),
        "fires-on-growth-of-one-reason-while-another-falls-slower": Case(
            {
                agent("vramguard_unattributed_gpu_memory_bytes", **HOST): "0+100000000x80",
                agent(
                    "vramguard_unattributed_gpu_memory_bytes", **GPU0, reason="pod-not-in-cache"
                ): "8000000000-50000000x80",
            },
            "40m",
            (fired(UNATTRIBUTED, node=NODE, severity="info"),),
        ),
        "quiet-while-growing-for-less-than-for": Case(
            {agent("vramguard_unattributed_gpu_memory_bytes", **HOST): "0+100000000x80"}, "20m"
        ),
        "quiet-while-steady": Case({agent("vramguard_unattributed_gpu_memory_bytes", **HOST): "2000000000x80"}, "60m"),
        "quiet-once-freed": Case(
            {agent("vramguard_unattributed_gpu_memory_bytes", **HOST): "0+100000000x20 0x60"}, "45m"
        ),
    },
    "VramguardGpuNeedsReset": {
        "fires-2m-after-the-agent-says-so": Case(
            {agent(HELD, **GPU0): "0 2147483648x10"},
            "4m",
            (fired(NEEDS_RESET, **TARGET, **GPU0, severity="warning"),),
        ),
        "quiet-for-a-single-scrape": Case({agent(HELD, **GPU0): "0 2147483648 0x10"}, "4m"),
        "quiet-once-reset": Case({agent(HELD, **GPU0): "0 2147483648x5 0x10"}, "10m"),
        "quiet-while-nothing-is-held": Case({agent(HELD, **GPU0): "0x10"}, "8m"),
    },
    "VramguardOrphanedGpuMemory": {
        "fires-10m-after-orphans-hold-memory": Case(
            {agent(ORPHANED_BYTES, **GPU0): "0 3221225472x15"},
            "12m",
            (fired(ORPHANED, **TARGET, **GPU0, severity="warning"),),
        ),
        "quiet-for-less-than-for": Case({agent(ORPHANED_BYTES, **GPU0): "0 3221225472x15"}, "9m"),
        "quiet-once-a-reclaim-freed-it": Case({agent(ORPHANED_BYTES, **GPU0): "0 3221225472x2 0x15"}, "12m"),
        "quiet-once-freed-after-it-fired": Case({agent(ORPHANED_BYTES, **GPU0): "0 3221225472x12 0x10"}, "20m"),
        "quiet-while-no-orphan-holds-memory": Case({agent(ORPHANED_BYTES, **GPU0): "0x20"}, "15m"),
    },
    "VramguardDriverLimitsFailing": {
        "fires-after-15m-failing": Case(
            {agent("vramguard_driver_limits_failing"): "0 1x20"},
            "17m",
            (
                fired(
                    f"vramguard on {NODE} cannot set the driver's GPU memory limits (VRAMLimitFailed Events): quotas "
                    "there are enforced reactively only",
                    **TARGET,
                    severity="warning",
                ),
            ),
        ),
        "quiet-for-a-failure-shorter-than-for": Case({agent("vramguard_driver_limits_failing"): "0 1x5 0x20"}, "17m"),
        "quiet-while-limits-hold": Case({agent("vramguard_driver_limits_failing"): "0x20"}, "17m"),
    },
    "VramguardRelisting": {
        "fires-on-a-relist-a-minute": Case(
            {agent("vramguard_api_requests_total", resource="pods", verb="LIST"): "1+1x60"},
            "30m",
            (
                fired(
                    f"vramguard on {NODE} relists pods often: its watches break (watch_failed, watch_expired in its "
                    "log; an API server restarting, or a proxy cutting long requests)",
                    **TARGET,
                    resource="pods",
                    verb="LIST",
                    severity="info",
                ),
            ),
        ),
        "quiet-for-three-relists-an-hour": Case(
            {agent("vramguard_api_requests_total", resource="pods", verb="LIST"): "1x10 2x10 3x10 4x30"}, "60m"
        ),
        "quiet-while-only-watches-renew": Case(
            {
                agent("vramguard_api_requests_total", resource="pods", verb="LIST"): "1x60",
                agent("vramguard_api_requests_total", resource="pods", verb="WATCH"): "1+1x60",
            },
            "60m",
        ),
    },
    "VramguardClaimSourceDown": {
        "fires-after-15m-down": Case(
            {agent("vramguard_claim_source_up"): "1 0x20"},
            "17m",
            (
                fired(
                    f"vramguard on {NODE} cannot read its node's ResourceSlices (claim_source_unavailable in its "
                    "log): DRA shares are not enforced there",
                    **TARGET,
                    severity="warning",
                ),
            ),
        ),
        "quiet-for-an-outage-shorter-than-for": Case({agent("vramguard_claim_source_up"): "1 0x5 1x20"}, "17m"),
        "quiet-while-up": Case({agent("vramguard_claim_source_up"): "1x20"}, "17m"),
        "quiet-without-a-claim-source": Case({agent("up"): "1x20"}, "17m"),
    },
    "VramguardPolicyInvalid": {
        "fires-after-2m-invalid": Case(
            {agent("vramguard_policy_invalid"): "0 1x5"},
            "4m",
            (
                fired(
                    f"vramguard on {NODE} refuses its policy file (policy_invalid in its log, .agent.policy.invalid "
                    "in /status says which field): the last good policy stays in force",
                    **TARGET,
                    severity="warning",
                ),
            ),
        ),
        "quiet-once-fixed": Case({agent("vramguard_policy_invalid"): "0 1 0x5"}, "4m"),
        "quiet-while-valid": Case({agent("vramguard_policy_invalid"): "0x5"}, "4m"),
    },
    "VramguardPolicyRestartNeeded": {
        "fires-after-15m-waiting": Case(
            {agent("vramguard_policy_restart_needed", field="driver_limits"): "0 1x20"},
            "17m",
            (
                fired(
                    f"vramguard on {NODE} applies the policy's driver_limits only after a restart (policy_reloaded "
                    "in its log): restart its pod",
                    **TARGET,
                    field="driver_limits",
                    severity="info",
                ),
            ),
        ),
        "quiet-for-a-reload-that-needs-none": Case(
            {agent("vramguard_policy_restart_needed", field="driver_limits"): "0x20"}, "17m"
        ),
    },
}


@pytest.fixture(scope="module")
def rules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rendered PrometheusRule's groups as a rule file."""
    path = tmp_path_factory.mktemp("rules") / "rules.yaml"
    path.write_text(yaml.safe_dump(rule_groups(need_helm())))
    return path


def test_rendered_rules_pass_promtool_check(rules: Path) -> None:
    """`promtool check rules` accepts the rendered PrometheusRule, and it holds the alerts this file tests."""
    result = subprocess.run([promtool(), "check", "rules", rules], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert {r["alert"] for r in alerting_rules(yaml.safe_load(rules.read_text()))} == set(CASES)


def test_every_alert_has_a_firing_and_a_quiet_case(rules: Path) -> None:
    """Each alert the chart renders is shown to fire on some series and to stay quiet on a nearby one: a quiet case
    holds a metric the alert's expression reads, so it is not quiet only because the rule never sees its series."""
    reads = {r["alert"]: promql_names(r["expr"]).metrics for r in alerting_rules(yaml.safe_load(rules.read_text()))}
    for alert, metrics in reads.items():
        cases = CASES.get(alert, {})
        assert any(c.fires for c in cases.values()), f"{alert} has no case where it fires"
        nearby = [n for n, c in cases.items() if not c.fires and metrics & {s.split("{")[0] for s in c.series}]
        assert nearby, f"{alert} has no case where it stays quiet on a series it reads ({sorted(metrics)})"


@pytest.mark.parametrize(
    ("alert", "case"),
    [pytest.param(alert, case, id=f"{alert}-{name}") for alert, cases in CASES.items() for name, case in cases.items()],
)
def test_alert(rules: Path, tmp_path: Path, alert: str, case: Case) -> None:
    """`promtool test rules`: at `case.at` exactly `case.fires` are firing, with their labels, summary and runbook."""
    fires = [{**f, "exp_annotations": {**f["exp_annotations"], "runbook_url": runbook(alert)}} for f in case.fires]
    test = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in case.series.items()],
                "alert_rule_test": [{"eval_time": case.at, "alertname": alert, "exp_alerts": fires}],
            }
        ],
    }
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump(test))
    result = subprocess.run([promtool(), "test", "rules", path], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rules_and_panels_name_only_what_is_exported() -> None:
    """Every metric a rule or a panel reads is the agent's (asked of its registry), Prometheus' own or
    kube-state-metrics' (PROVIDED); every label it matches, groups by or shows in a legend is one that metric
    has, or one the ServiceMonitor's scrape adds to all of them."""
    helm = need_helm()
    known = {**agent_series(), **PROVIDED}
    target = monitor_target_labels(helm)
    queries = [(f"alert {r['alert']}", r["expr"], frozenset[str]()) for r in alerting_rules(rule_groups(helm))]
    queries += [
        (f"panel {q.panel!r} {q.ref}", as_grafana_sends(q.expr, node=NODE), frozenset(legend_labels(q.legend)))
        for q in panel_queries()
    ]
    queries += [(f"variable over {m}", f'{m}{{{label}=""}}', frozenset[str]()) for m, label in variable_queries()]
    mistakes = [f"{where} {m}" for where, expr, legend in queries for m in name_mistakes(expr, known, target, legend)]
    assert not mistakes, "\n".join(mistakes)


@pytest.mark.parametrize(
    ("expr", "legend", "mistake"),
    [
        pytest.param("vramguard_gpu_healthy_typo == 0", "", "reads", id="a-metric-nobody-exports"),
        pytest.param('vramguard_actions_total{outcome="failed"}', "", "matches", id="a-label-of-another-metric"),
        pytest.param("sum by (claim) (vramguard_actions_total)", "", "groups by", id="grouping-by-a-missing-label"),
        pytest.param("vramguard_gpu_healthy", "{{pod}} {{uuid}}", "shows", id="a-legend-label-nothing-has"),
    ],
)
def test_the_name_check_catches(expr: str, legend: str, mistake: str) -> None:
    """The check above fails on a mistaken name, so its silence means something."""
    found = name_mistakes(expr, {**agent_series(), **PROVIDED}, frozenset(TARGET), frozenset(legend_labels(legend)))
    assert [m.split(" ")[0] for m in found] == [mistake.split(" ")[0]]
