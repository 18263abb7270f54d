"""The chart's monitoring on the real node (tests/cluster/real_cluster.py), read by a real Prometheus
(tests/cluster/prometheus.py; 3.16, built from source with Kubernetes discovery by scripts/prometheus.sh): it
discovers the agent through the API server (its kubernetes_sd_configs, role endpoints, as a ServiceAccount with a
Role that reads endpoints, services and pods in the agent's namespace) with the scrape job generated from the
ServiceMonitor the chart installed, evaluates the PrometheusRule the chart installed, and answers the Grafana
dashboard's queries as Grafana would send them. Scrapes and evaluations run every second instead of the chart's
30 s; the rules' windows and `for:` are the chart's, so the alerts reached here are pending.
"""

from __future__ import annotations

import json
import os
import shlex
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, utils
from prometheus_client.parser import text_string_to_metric_families

from helm_fixtures import need_helm
from monitoring_fixtures import as_grafana_sends, panel_queries, prometheus, variable_queries
from real_parts import need
from vramguard.core.quantity import GiB, MiB
from vramguard.plugin.prometheus import SLICES
from vramguard_testbed.waiting import wait_until

from .node import NODE_CONTROLLERS, raw
from .prometheus import KubeStateMetrics, Prometheus, install_monitoring_crds, installed, scrape_config
from .real_cluster import AGENT_NS, WORKLOAD_IMAGE, Cluster, kubectl_as, real_cluster, unavailable_reason

pytestmark = [pytest.mark.slow, pytest.mark.real_node]

INTERVAL = "1s"
# Grafana's $__rate_interval for this scrape interval and a short time range; longer than the test, so that a
# counter's increase over it, at the last scrape, is its whole count since Prometheus first scraped it (at 0).
RATE_INTERVAL = "5m"
JOB = "vramguard-metrics"  # the chart's Service: the operator names the job after it


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    need(unavailable_reason(), skip="no real node", ci="build the real node's parts first (scripts/test.sh does)")
    prometheus()
    with real_cluster(need_helm()) as found:
        install_monitoring_crds(found.api)
        found.values["serviceMonitor"] = {"enabled": True}
        found.values["prometheusRule"] = {"enabled": True}
        found.helm_install(mode="warn")
        yield found


@pytest.fixture(scope="module")
def discovery(cluster: Cluster) -> Path:
    """A ServiceAccount's kubeconfig with what Prometheus' endpoints discovery reads in the agent's namespace."""
    kubeconfig = cluster.plane.service_account_kubeconfig("monitoring", "prometheus")
    meta = {"name": "prometheus", "namespace": AGENT_NS}
    rule = {"apiGroups": [""], "resources": ["endpoints", "services", "pods"], "verbs": ["get", "list", "watch"]}
    subject = {"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}
    rbac = "rbac.authorization.k8s.io"
    for doc in (
        {"apiVersion": f"{rbac}/v1", "kind": "Role", "metadata": meta, "rules": [rule]},
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "subjects": [subject],
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": "prometheus"},
        },
    ):
        utils.create_from_dict(cluster.api, doc)  # type: ignore[no-untyped-call]  # untyped in the client
    return kubeconfig


def agent_metrics(cluster: Cluster) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The agent's own /metrics, read directly: (name, labels) -> value."""
    pod = cluster.agent_pod()
    assert pod is not None
    url = f"http://{pod['status']['podIP']}:{cluster.values['metrics']['port']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def reported(exposed: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    (value,) = [v for (n, ls), v in exposed.items() if n == name and labels.items() <= dict(ls).items()]
    return value


RECOMMENDER = "vramguard-recommender"  # the chart's ClusterRole for `recommend` (release "vramguard")
# Where docs/rollout.md's "`recommend`" output is kept: recommend's real output on this cluster.
ROLLING_OUT = Path(os.environ.get("VRAMGUARD_ROLLING_OUT", "/tmp/rolling-out.txt"))
SPIKE_BYTES = 9 * GiB + 512 * MiB  # not a round number: the recommendation must come from it, not a rounding


def owned_workload(cluster: Cluster, ns: str) -> str:
    """A Deployment `trainer` (a 32Gi quota for the whole pod in its template's annotation), its ReplicaSet and one
    pod of it, made by hand (no deployment or replicaset controller runs here) with the controllers' names and owner
    references; the pod runs. Returns the pod's name."""
    apps = client.AppsV1Api(cluster.api)
    labels = {"app": "trainer"}
    container = client.V1Container(
        name="main",
        image=WORKLOAD_IMAGE,
        image_pull_policy="Never",
    )
    annotations = {"vramguard.io/vram-limit": "32Gi"}
    template = client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(labels=labels, annotations=annotations),
        spec=client.V1PodSpec(containers=[container], termination_grace_period_seconds=2),
    )
    selector = client.V1LabelSelector(match_labels=labels)
    deployment = apps.create_namespaced_deployment(
        ns,
        client.V1Deployment(
            metadata=client.V1ObjectMeta(name="trainer"),
            spec=client.V1DeploymentSpec(replicas=1, selector=selector, template=template),
        ),
    )

    def owner(kind: str, obj: Any) -> client.V1OwnerReference:
        return client.V1OwnerReference(
            api_version="apps/v1", kind=kind, name=obj.metadata.name, uid=obj.metadata.uid, controller=True
        )

    replica_set = apps.create_namespaced_replica_set(
        ns,
        client.V1ReplicaSet(
            metadata=client.V1ObjectMeta(name="trainer-7d9f4c8b5", owner_references=[owner("Deployment", deployment)]),
            spec=client.V1ReplicaSetSpec(replicas=1, selector=selector, template=template),
        ),
    )
    pod_name = "trainer-7d9f4c8b5-x2b4z"
    cluster.core.create_namespaced_pod(
        ns,
        client.V1Pod(
            metadata=client.V1ObjectMeta(
                name=pod_name,
                labels=labels,
                annotations=annotations,
                owner_references=[owner("ReplicaSet", replica_set)],
            ),
            spec=template.spec,
        ),
    )
    wait_until(lambda: cluster.phase(ns, pod_name) == "Running", 60, what="the trainer's pod Running")
    return pod_name


def kubectl(kubeconfig: Path, *args: str) -> str:
    return kubectl_as(kubeconfig, *args).stdout


def test_recommend_gets_a_two_second_peak_between_two_30s_scrapes(
    cluster: Cluster, discovery: Path, tmp_path: Path
) -> None:
    """A Deployment's container holds 2GiB, spikes to 9.5GiB for 2 s between two of Prometheus' 30 s scrapes, and
    drops back: the usage gauge's max_over_time never sees it, the peak gauge's does, and `kubectl vramguard
    recommend --prometheus-url`, run as a user bound only to the recommender role, gives that peak (within 1 %)
    for Deployment/trainer, with the quota in force (32Gi from its template's annotation), "wasteful", and a patch
    that, applied, sets the recommendation in the Deployment's template. (Within its quota: this module's next test
    counts every violation and warning the agent made.)"""
    started = time.monotonic()
    ns = cluster.namespace("rollout")
    pod_name = owned_workload(cluster, ns)
    monitor = installed(cluster.api, AGENT_NS, "servicemonitors")
    service = raw(cluster.api, cluster.core.read_namespaced_service(JOB, AGENT_NS))
    job = scrape_config(monitor, service, discovery, "30s")
    pod = cluster.pod(ns, pod_name)
    assert pod is not None
    pid = cluster.pid(pod)
    cluster.gpu({pid: 2 * GiB})
    user = cluster.person("recommender", RECOMMENDER)
    with Prometheus(prometheus(), tmp_path / "prometheus", [job], {"groups": []}, interval="30s").running() as prom:
        used = f'vramguard_container_gpu_memory_used_bytes{{pod="{pod_name}"}}'
        wait_until(lambda: prom.query(f"{used} == {2 * GiB}"), 90, what="2GiB scraped", interval_s=0.5)
        ((_, scraped_at),) = prom.query(f'timestamp(up{{job="{JOB}"}})')
        # 10 s after that scrape, 20 s before the next: the spike, 2 s long.
        time.sleep(max(0.0, scraped_at + 10 - time.time()))
        cluster.gpu({pid: SPIKE_BYTES})
        time.sleep(2.0)
        cluster.gpu({pid: 2 * GiB})
        spike_over = time.time()
        wait_until(
            lambda: prom.query(f'timestamp(up{{job="{JOB}"}}) > {spike_over}'), 60, what="a scrape after the spike"
        )
        ((_, usage_max),) = prom.query(f"max_over_time({used}[10m])")
        assert usage_max == 2 * GiB, "the usage gauge's scrapes missed the spike"

        table = kubectl(user, "vramguard", "recommend", "-n", ns, "--prometheus-url", prom.url)
        answer = json.loads(
            kubectl(user, "vramguard", "recommend", "-n", ns, "--prometheus-url", prom.url, "-o", "json")
        )
        patch = kubectl(user, "vramguard", "recommend", "-n", ns, "--prometheus-url", prom.url, "-o", "patch")
    # The window's queries, the GPUs' and the recording rule's two (this Prometheus holds no rule: the gauges).
    assert (answer["source"], answer["queries"], answer["caveats"]) == ("prometheus", 2 * SLICES + 3, [])
    assert answer["agents"] == f'up{{job="{JOB}",namespace="{AGENT_NS}"}}', "the chart's scrape, the default selector"
    (item,) = answer["items"]
    assert (item["kind"], item["name"], item["container"], item["containers"]) == (
        "Deployment",
        "trainer",
        "",
        ["main"],
    )
    assert item["peak_bytes"] == pytest.approx(SPIKE_BYTES, rel=0.01)
    assert (item["quota_bytes"], item["quota_source"], item["verdict"]) == (
        32 * GiB,
        "annotation vramguard.io/vram-limit",
        "wasteful",
    )
    assert item["field"] == {"kind": "annotation", "name": "vramguard.io/vram-limit", "value": "12Gi"}
    with ROLLING_OUT.open("w") as f:
        f.write(f"$ kubectl vramguard recommend -n {ns} --prometheus-url http://prometheus:9090\n{table}\n")
        f.write(f"$ kubectl vramguard recommend -n {ns} --prometheus-url http://prometheus:9090 -o patch\n{patch}\n")

    (command,) = [line for line in patch.splitlines() if line.startswith("kubectl patch")]
    argv = shlex.split(command)
    cluster.node.kubectl(*argv[1:])  # as the admin: the recommender role reads only
    deployment = raw(cluster.api, client.AppsV1Api(cluster.api).read_namespaced_deployment("trainer", ns))
    assert deployment["spec"]["template"]["metadata"]["annotations"] == {"vramguard.io/vram-limit": "12Gi"}
    print(f"recommend test {time.monotonic() - started:.1f}s; peak {item['peak_bytes']} of {SPIKE_BYTES} spiked")


def test_prometheus_reads_the_agent_as_the_dashboard_and_rules_expect(
    cluster: Cluster, discovery: Path, tmp_path: Path
) -> None:
    """With a pod over its quota, one within a quota for the whole pod and memory outside any pod on the real
    node: Prometheus discovers and scrapes the agent through the ServiceMonitor's job, every dashboard panel returns
    the series it is meant to show with the values the agent reports, only VramguardUnattributedMemoryGrowing is
    raised (pending); then with the agent's pod deleted and not replaced, VramguardAgentDown is."""
    started = time.monotonic()
    node = cluster.node.name
    monitor = installed(cluster.api, AGENT_NS, "servicemonitors")
    rules = installed(cluster.api, AGENT_NS, "prometheusrules")
    service = raw(cluster.api, cluster.core.read_namespaced_service(JOB, AGENT_NS))
    job = scrape_config(monitor, service, discovery, INTERVAL)
    with KubeStateMetrics(cluster.plane, AGENT_NS) as ksm:
        ksm_job = {
            "job_name": "kube-state-metrics",
            "honor_labels": True,
            "static_configs": [{"targets": [ksm.address]}],
        }
        server = Prometheus(prometheus(), tmp_path / "prometheus", [job, ksm_job], rules["spec"], interval=INTERVAL)
        with server.running() as prom:
            # Discovered through the API server, with the operator's target labels and the chart's `node`.
            (target,) = wait_until(lambda: prom.targets(job["job_name"]), 60, what="the agent discovered")
            agent_pod = cluster.agent_pod()
            assert agent_pod is not None
            assert target["labels"] | {"instance": ""} == {
                "job": JOB,
                "namespace": AGENT_NS,
                "service": JOB,
                "endpoint": "metrics",
                "pod": agent_pod["metadata"]["name"],
                "container": "vramguard",
                "node": node,
                "instance": "",
            }
            wait_until(lambda: prom.query(f'up{{job="{JOB}"}} == 1'), 30, what="the agent scraped")
            wait_until(lambda: prom.query("vramguard_unattributed_gpu_memory_bytes == 0"), 30, what="a first scrape")

            # The situation: a 4Gi pod using 9GiB, a pod with a 4Gi quota for the whole pod (an annotation) using
            # 1GiB, and 1GiB held by a process outside any pod (this test's).
            ns = cluster.namespace("ml")
            trainer = cluster.workload(ns, "trainer", "4Gi")
            notebook = cluster.workload(ns, "notebook", None, annotations={"vramguard.io/vram-limit": "4Gi"})
            cluster.gpu({cluster.pid(trainer): 9 * GiB, cluster.pid(notebook): 1 * GiB, os.getpid(): 1 * GiB})
            wait_until(
                lambda: prom.query(f'vramguard_violations_total{{namespace="{ns}"}}'), 60, what="the violation scraped"
            )
            wait_until(lambda: prom.query("vramguard_unattributed_gpu_memory_bytes > 0"), 30, what="unattributed")
            exposed = agent_metrics(cluster)
            # The dashboard's right edge at the agent's last scrape: increase() then extrapolates nothing.
            ((_, scraped_at),) = prom.query(f'timestamp(up{{job="{JOB}"}})')

            def panel(expr: str) -> list[tuple[dict[str, str], float]]:
                return prom.query(as_grafana_sends(expr, node=node, rate_interval=RATE_INTERVAL), at=scraped_at)

            gpu = {"gpu": "0"}
            trainer_labels = {"namespace": ns, "pod": "trainer", "container": "main", **gpu}
            notebook_labels = {"namespace": ns, "pod": "notebook", "container": "main", **gpu}
            used = reported(exposed, "vramguard_container_gpu_memory_used_bytes", pod="trainer")
            quota = reported(exposed, "vramguard_container_gpu_memory_quota_bytes", pod="trainer")
            assert (used, quota) == (9 * GiB, 4 * GiB)
            notebook_used = reported(exposed, "vramguard_container_gpu_memory_used_bytes", pod="notebook")
            pod_quota = reported(exposed, "vramguard_container_gpu_memory_quota_bytes", pod="notebook", container="")
            assert (notebook_used, pod_quota) == (1 * GiB, 4 * GiB)
            violations = reported(exposed, "vramguard_violations_total", namespace=ns)
            warnings = reported(exposed, "vramguard_actions_total", action="warn", result="ok")
            actions: list[tuple[dict[str, str], float | None]] = [
                (dict(ls), v) for (n, ls), v in exposed.items() if n == "vramguard_actions_total"
            ]
            assert warnings > 0 and [(ls, v) for ls, v in actions if v] == [
                ({"action": "warn", "result": "ok"}, warnings)
            ]
            expected: dict[str, list[tuple[dict[str, str], float | None]]] = {
                "GPU memory used by container/A": [(trainer_labels, used), (notebook_labels, notebook_used)],
                "Usage / quota/A": [(trainer_labels, used / quota)],
                "Usage / quota/B": [({"namespace": ns, "pod": "notebook", **gpu}, notebook_used / pod_quota)],
                "GPU memory free/A": [({"node": node, **gpu}, reported(exposed, "vramguard_gpu_memory_free_bytes"))],
                # By reason, the reasons with none left out: this test's process is in no pod.
                "Unattributed GPU memory (outside any known pod), by reason/A": [
                    ({"node": node, **gpu, "reason": "not-in-pod"}, 1.0 * GiB)
                ],
                # Counted within the panel's window: its increase is the whole count.
                "Violations and actions/A": [({"namespace": ns, "severity": "hard"}, violations)],
                # Every action's every result, counted from 0: the warnings, and 0 for the others.
                "Violations and actions/B": actions,
                "Agent health/A": [({"node": node}, 1.0)],
                "Agent health/B": [({"node": node}, None)],
                "Agent health/C": [
                    ({"kind": dict(ls)["kind"]}, None)
                    for (n, ls), _ in exposed.items()
                    if n == "vramguard_nvml_errors_total"
                ],
            }
            answers = {f"{q.panel}/{q.ref}": panel(q.expr) for q in panel_queries()}
            assert answers.keys() == expected.keys()
            for key, want in expected.items():
                got = answers[key]
                assert len(got) == len(want), f"{key}: {got}"
                for want_labels, want_value in want:
                    (value,) = [v for labels, v in got if want_labels.items() <= labels.items()]
                    if want_value is not None:
                        assert value == pytest.approx(want_value), f"{key}: {want_labels} {value} != {want_value}"
            (_, p99), *_ = answers["Agent health/B"]
            assert 0 < p99 <= 5.0
            for metric, label in variable_queries():
                assert prom.api(f"label/{label}/values", **{"match[]": metric}) == [node]

            # What the situation raises: memory outside any pod grew (pending for the rule's 30 minutes); nothing
            # else, kube-state-metrics' series included (the agent's pod is Ready, its DaemonSet has it).
            def unattributed_raised() -> dict[str, list[dict[str, Any]]]:
                found = prom.alerts()
                return found if "VramguardUnattributedMemoryGrowing" in found else {}

            raised = wait_until(unattributed_raised, 30, what="VramguardUnattributedMemoryGrowing raised")
            assert {name: [a["state"] for a in found] for name, found in raised.items()} == {
                "VramguardUnattributedMemoryGrowing": ["pending"]
            }
            assert raised["VramguardUnattributedMemoryGrowing"][0]["labels"]["node"] == node
            print(f"panels and alerts checked {time.monotonic() - started:.1f}s after Prometheus started")

            # Stopped on purpose: no daemonset-controller to replace it, the agent's pod deleted. Its target leaves
            # with it (no `up` series at all) while its DaemonSet still wants one agent.
            cluster.plane.components["kube-controller-manager"].stop()
            cluster.plane.start_controller_manager(controllers=NODE_CONTROLLERS.replace(",daemonset-controller", ""))
            cluster.core.delete_namespaced_pod(agent_pod["metadata"]["name"], AGENT_NS, grace_period_seconds=1)
            wait_until(lambda: not prom.targets(job["job_name"]), 60, what="the agent's target gone")
            # Its last scrapes may have failed (up 0); then its series are marked stale and `up` is gone.
            wait_until(lambda: not prom.query(f'up{{job="{JOB}"}}'), 30, what="no up series left")

            def agent_down() -> list[dict[str, Any]]:
                # The one for the whole job (absent up), not one that a failed last scrape raised for the node.
                return [a for a in prom.alerts().get("VramguardAgentDown", []) if "node" not in a["labels"]]

            (down,) = wait_until(agent_down, 30, what="VramguardAgentDown raised")
            assert down["state"] in ("pending", "firing")
            assert down["labels"] == {
                "alertname": "VramguardAgentDown",
                "job": JOB,
                "namespace": AGENT_NS,
                "severity": "critical",
            }
            assert down["annotations"]["summary"].startswith("no vramguard agent is scraped")
    print(f"Prometheus test {time.monotonic() - started:.1f}s")
