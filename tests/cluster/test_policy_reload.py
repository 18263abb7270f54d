"""The policy reloads itself, on a real node: an edit of the policy ConfigMap reaches the running agent through the
kubelet's update of the ConfigMap volume (the `..data` swap) and is in force without a restart; a broken one is
refused and the last good policy stays in force.

From `kubectl apply` to the new policy in force is the kubelet's ConfigMap sync (its pod resync, `syncFrequency`:
10 s in the test node's kubelet, 1 minute by default, plus its ConfigMap cache) and then the agent's check of the
file (every 2 s) and its next scan. `.venv/bin/pytest -s tests/cluster/test_policy_reload.py` prints the figure.
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from helm_fixtures import need_helm
from real_parts import need
from vramguard.core.policy import PolicyText
from vramguard_testbed.waiting import WaitTimeout, wait_until

from .node import raw
from .real_cluster import AGENT_NS, Cluster, real_cluster, unavailable_reason

pytestmark = [pytest.mark.slow, pytest.mark.real_node]

CONFIGMAP = "vramguard-policy"
# The kubelet's sync (10 s here) with its jitter, the agent's check and a scan, with room for a busy host.
IN_FORCE_S = 120.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    need(unavailable_reason(), skip="no real node", ci="build the real node's parts first (scripts/test.sh does)")
    with real_cluster(need_helm()) as found:
        yield found


def get(cluster: Cluster, path: str) -> bytes:
    port = cluster.values["metrics"]["port"]  # the test values run the agent on the host's network
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
        body: bytes = answer.read()
    return body


def agent_part(cluster: Cluster) -> dict[str, Any]:
    part: dict[str, Any] = json.loads(get(cluster, "/status"))["agent"]
    return part


def metric(cluster: Cluster, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(get(cluster, "/metrics").decode()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


def write_policy(cluster: Cluster, text: str) -> float:
    """Replace the policy ConfigMap's document, its other keys kept, as `kubectl apply` would; when the API server
    took it (monotonic)."""
    configmap = cluster.core.read_namespaced_config_map(CONFIGMAP, AGENT_NS)
    configmap.data = {**(configmap.data or {}), "policy.yaml": text}
    cluster.core.replace_namespaced_config_map(CONFIGMAP, AGENT_NS, configmap)
    return time.monotonic()


def sha256_of(cluster: Cluster) -> str:
    """The hash /status shows of the policy ConfigMap as it is now: of every key, as the agent reads its volume."""
    data = cluster.core.read_namespaced_config_map(CONFIGMAP, AGENT_NS).data or {}
    return hashlib.sha256(PolicyText.of_config_map(data).content).hexdigest()


def the_agent(cluster: Cluster) -> tuple[str, int, int]:
    """The agent's pod UID, its container's restart count and its process' host PID."""
    pod = cluster.agent_pod()
    assert pod is not None, "the agent is Ready, alone and of the DaemonSet's template"
    (status,) = pod["status"]["containerStatuses"]
    return pod["metadata"]["uid"], int(status["restartCount"]), cluster.pid(pod)


def install(cluster: Cluster, **policy: Any) -> None:
    """`helm_install`, saying what the agent's pod and log said when it never got Ready."""
    try:
        cluster.helm_install(chart_values={"policyReload": {"rollOnChange": False}}, **policy)  # the chart's default
    except WaitTimeout:
        for pod in raw(cluster.api, cluster.core.list_namespaced_pod(AGENT_NS))["items"]:
            name = pod["metadata"]["name"]
            print(f"{name}: {json.dumps(pod['status'].get('containerStatuses'))[:2000]}")
            for previous in (False, True):
                try:
                    log = cluster.core.read_namespaced_pod_log(name, AGENT_NS, previous=previous, tail_lines=40)
                except Exception as e:  # no previous container, or none yet
                    log = repr(e)[:300]
                print(f"--- {name} log (previous={previous}):\n{log}")
        raise


def test_a_policy_edit_is_in_force_without_a_restart_and_a_broken_one_is_refused(cluster: Cluster) -> None:
    install(cluster, mode="warn")
    started = wait_until(lambda: agent_part(cluster).get("policy"), 60, what="the agent's loop running")
    assert agent_part(cluster)["mode"] == "warn" and started["invalid"] is None
    before = the_agent(cluster)
    assert before[1] == 0
    configmap = raw(cluster.api, cluster.core.read_namespaced_config_map(CONFIGMAP, AGENT_NS))
    policy = yaml.safe_load(configmap["data"]["policy.yaml"])

    # An edit: in force at a scan after the kubelet swapped the volume, in the same process.
    good = yaml.safe_dump({**policy, "mode": "evict", "driver_limits": "off", "cooldown": "2m"})
    applied = write_policy(cluster, good)
    good_sha256 = sha256_of(cluster)

    def in_force() -> dict[str, Any] | None:
        agent = agent_part(cluster)
        return agent if agent["policy"]["sha256"] == good_sha256 else None

    agent = wait_until(in_force, IN_FORCE_S, what="the edited policy in force", interval_s=0.1)
    in_force_s = time.monotonic() - applied
    print(f"\npolicy edit: {in_force_s:.1f} s from the API server taking it to in force (kubelet syncFrequency 10s)")
    assert agent["mode"] == "evict" and agent["policy"]["restart_needed"] == []
    assert the_agent(cluster) == before, "the same pod, never restarted, the same process"
    assert metric(cluster, "vramguard_policy_reloads_total", result="applied") == 1.0
    annotations = raw(cluster.api, cluster.core.list_namespaced_pod(AGENT_NS))["items"][0]["metadata"]["annotations"]
    assert "checksum/policy" not in annotations, "the chart does not roll the agents on a policy change"

    # A broken edit: refused, counted and shown, while the last good policy stays in force.
    broken = good.replace("mode: evict", "mode: evcit")
    refused_at = write_policy(cluster, broken)
    agent = wait_until(
        lambda: (a := agent_part(cluster))["policy"]["invalid"] and a, IN_FORCE_S, what="the broken policy refused"
    )
    print(f"policy broken: {time.monotonic() - refused_at:.1f} s from the API server taking it to refused")
    assert "mode" in agent["policy"]["invalid"] and "evcit" in agent["policy"]["invalid"], "names field and value"
    assert agent["mode"] == "evict" and agent["policy"]["sha256"] == good_sha256
    assert metric(cluster, "vramguard_policy_invalid") == 1.0
    assert metric(cluster, "vramguard_policy_reloads_total", result="invalid") == 1.0
    assert the_agent(cluster) == before, "enforcement never stopped: the same process"

    # Fixed again: the refusal is over.
    write_policy(cluster, good)
    wait_until(lambda: agent_part(cluster)["policy"]["invalid"] is None, IN_FORCE_S, what="the refusal over")
    assert metric(cluster, "vramguard_policy_invalid") == 0.0
    assert the_agent(cluster) == before
