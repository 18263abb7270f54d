"""`kubectl vramguard` on the real one-node cluster (tests/cluster/real_cluster.py): the built kubectl finds the
plugin on PATH and runs it as a ServiceAccount bound only to the chart's viewer ClusterRole; what it shows is
what the agent sees; an agent that does not answer is a row naming it; a GPU driven into memory pressure gives
the pod within its quota beside an over-quota one a VRAMPressure Event naming that one.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from helm_fixtures import need_helm
from real_parts import need
from vramguard.core.quantity import GiB
from vramguard.core.text import format_bytes
from vramguard_testbed.waiting import wait_until

from .controlplane import free_port
from .node import raw
from .real_cluster import (
    AGENT_NS,
    GPU_TOTAL,
    WORKLOAD_IMAGE,
    Cluster,
    kubectl_as,
    real_cluster,
    unavailable_reason,
)

pytestmark = [pytest.mark.slow, pytest.mark.real_node]

NS = "ml"
VIEWER = "vramguard-viewer"  # the chart's viewer ClusterRole (release "vramguard")
RECOMMENDER = "vramguard-recommender"  # the chart's ClusterRole for `recommend`
# Where docs/operations.md's "Seeing it" output is kept: the plugin's real output on this cluster.
SEEING_IT = Path(os.environ.get("VRAMGUARD_SEEING_IT", "/tmp/seeing-it.txt"))
COLUMNS = ("namespace", "pod", "container", "used_bytes", "quota_bytes", "state")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    need(unavailable_reason(), skip="no real node", ci="build the real node's parts first (scripts/test.sh does)")
    with real_cluster(need_helm()) as found:
        found.helm_install(mode="warn")  # the over-quota pod stays, to be shown and named
        found.namespace(NS)
        SEEING_IT.write_text("")
        yield found


@pytest.fixture(scope="module")
def viewer(cluster: Cluster) -> Path:
    """A kubeconfig for ServiceAccount people/viewer, bound to the viewer ClusterRole and nothing else."""
    return cluster.person("viewer", VIEWER)


def kubectl(kubeconfig: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return kubectl_as(kubeconfig, *args, check=check)


def agent_rows(cluster: Cluster) -> list[tuple[Any, ...]]:
    """The agent's own `vramguard top --once --json`, run in its pod as the admin, as (COLUMNS) tuples of NS."""
    agent = cluster.agent_pod()
    assert agent is not None
    top = cluster.node.kubectl(
        "exec", "--namespace", AGENT_NS, agent["metadata"]["name"], "--",
        "vramguard", "top", "--once", "--json", "--policy=/etc/vramguard",
    )  # fmt: skip
    document = json.loads(top.stdout)
    assert document["kind"] == "VramguardStatus", document
    return sorted(tuple(r[c] for c in COLUMNS) for r in document["containers"] if r["namespace"] == NS)


def plugin_rows(kubeconfig: Path, ns: str = NS) -> list[tuple[Any, ...]]:
    document = json.loads(kubectl(kubeconfig, "vramguard", "top", "-A", "-o", "json").stdout)
    assert document["kind"] == "VramguardTop", document
    return sorted(tuple(r[c] for c in COLUMNS) for r in document["items"] if r["namespace"] == ns)


def save(title: str, command: str, output: str) -> None:
    with SEEING_IT.open("a") as f:
        f.write(f"# {title}\n$ {command}\n{output.rstrip()}\n\n")


def test_the_viewer_role_reads_pods_and_their_proxy_only(cluster: Cluster, viewer: Path) -> None:
    def can(*what: str) -> str:
        return kubectl(viewer, "auth", "can-i", *what, check=False).stdout.strip()

    assert can("list", "pods", "--all-namespaces") == "yes"
    assert can("get", "pods", "--subresource=proxy", "--namespace", AGENT_NS) == "yes"
    assert can("list", "secrets", "--all-namespaces") == "no"
    assert can("get", "pods", "--subresource=log", "--namespace", NS) == "no"
    assert can("create", "pods", "--subresource=exec", "--namespace", AGENT_NS) == "no"
    assert can("get", "pods", "--namespace", NS) == "no"  # list only: what finding the agents takes
    assert kubectl(viewer, "plugin", "list", check=False).stdout.count("kubectl-vramguard") == 1


def test_top_as_the_viewer_shows_the_agents_rows(cluster: Cluster, viewer: Path) -> None:
    notebook = cluster.workload(NS, "notebook", "4Gi")
    trainer = cluster.workload(NS, "trainer", "4Gi")
    cluster.gpu({cluster.pid(notebook): 2 * GiB, cluster.pid(trainer): 6 * GiB})
    expected = [
        (NS, "notebook", "main", 2 * GiB, 4 * GiB, "ok"),
        (NS, "trainer", "main", 6 * GiB, 4 * GiB, "over-hard"),
    ]
    wait_until(lambda: agent_rows(cluster) == expected, 60, what=f"the agent's top showing {expected}", interval_s=0.5)
    wait_until(lambda: plugin_rows(viewer) == expected, 60, what=f"the plugin showing {expected}", interval_s=0.5)
    assert agent_rows(cluster) == plugin_rows(viewer)

    table = kubectl(viewer, "vramguard", "top", "-A").stdout
    lines = [line.split() for line in table.splitlines()]
    assert lines[0] == ["NODE", "GPU", "NAMESPACE", "POD", "CONTAINER", "USED", "QUOTA", "%", "STATE", "HELD-BY"]
    shown = sorted(
        (words[2], words[3], words[4], words[5], words[6], words[8]) for words in lines[1:] if words[2] == NS
    )
    assert shown == [
        (ns, pod, container, format_bytes(used), format_bytes(quota), state)
        for ns, pod, container, used, quota, state in expected
    ], table
    assert all(words[0] == cluster.node.name and words[1] == "0" for words in lines[1:]), table
    save("top, as a user bound only to vramguard-viewer", "kubectl vramguard top -A", table)


def test_nodes_as_the_viewer_shows_the_nodes_gpus(cluster: Cluster, viewer: Path) -> None:
    document = json.loads(kubectl(viewer, "vramguard", "nodes", "-o", "json").stdout)
    (gpu,) = document["items"]
    assert (gpu["node"], gpu["gpu"], gpu["name"], gpu["total_bytes"]) == (
        cluster.node.name,
        "0",
        "NVIDIA L4 (test NVML)",
        GPU_TOTAL,
    ), gpu
    assert gpu["healthy"] and not gpu["error"] and gpu["limits"] == "agent", gpu
    table = kubectl(viewer, "vramguard", "nodes").stdout
    header, *rows = (line.split() for line in table.splitlines())
    assert header[:3] == ["NODE", "GPU", "NAME"] and len(rows) == 1, table
    assert rows[0][:2] == [cluster.node.name, "0"] and format_bytes(GPU_TOTAL) in rows[0], table
    save("nodes, as the same user", "kubectl vramguard nodes", table)


def events(cluster: Cluster, name: str, reason: str) -> list[str]:
    found = cluster.core.list_namespaced_event(NS, field_selector=f"involvedObject.name={name},reason={reason}")
    return [str(e["message"]) for e in raw(cluster.api, found)["items"]]


def test_a_gpu_under_pressure_tells_the_neighbour_who_holds_it(cluster: Cluster, viewer: Path) -> None:
    notebook, trainer = cluster.pod(NS, "notebook"), cluster.pod(NS, "trainer")
    assert notebook is not None and trainer is not None
    # 23.5 GiB of 24 used: under the chart's default pressure threshold (5 % free).
    cluster.gpu({cluster.pid(notebook): 2 * GiB, cluster.pid(trainer): 21 * GiB + GiB // 2})
    said = (
        "GPU 0 is 97 % full (23.5GiB of 24.0GiB); "
        f"{NS}/trainer container main holds 21.5GiB, 17.5GiB over its 4.0GiB quota"
    )
    wait_until(
        lambda: events(cluster, "notebook", "VRAMPressure"), 60, what="VRAMPressure on the notebook", interval_s=0.5
    )
    assert events(cluster, "notebook", "VRAMPressure") == [said]
    described = cluster.node.kubectl("describe", "pod", "notebook", "--namespace", NS).stdout
    assert "VRAMPressure" in described and f"{NS}/trainer container main holds 21.5GiB" in described, described
    assert cluster.phase(NS, "trainer") == "Running", "warn mode: the offender is told, not stopped"

    def marked() -> bool:
        table = kubectl(viewer, "vramguard", "top", "-A").stdout
        return any("trainer" in line and "(GPU under pressure)" in line for line in table.splitlines())

    wait_until(marked, 30, what="the trainer's row marked as at risk", interval_s=0.5)
    save(
        "top while GPU 0 is under memory pressure",
        "kubectl vramguard top -A",
        kubectl(viewer, "vramguard", "top", "-A").stdout,
    )
    save(
        "nodes while GPU 0 is under memory pressure",
        "kubectl vramguard nodes",
        kubectl(viewer, "vramguard", "nodes").stdout,
    )
    save(
        "the neighbour's Event",
        "kubectl describe pod notebook -n ml | grep VRAMPressure",
        "\n".join(line for line in described.splitlines() if "VRAMPressure" in line),
    )


def test_an_agent_without_an_answer_is_named(cluster: Cluster, viewer: Path) -> None:
    """A pod with the agents' label that serves nothing on its metrics port (an agent stuck starting, say): its
    row names it and why; the others' rows are still shown; only --strict makes that a failure."""
    port = free_port()
    decoy = client.V1Pod(
        # Not the DaemonSet's selector (it has app.kubernetes.io/instance too), so it is nobody's to adopt.
        metadata=client.V1ObjectMeta(name="silent-agent", labels={"app.kubernetes.io/name": "vramguard"}),
        spec=client.V1PodSpec(
            host_network=True,
            termination_grace_period_seconds=0,
            containers=[
                client.V1Container(
                    name="main",
                    image=WORKLOAD_IMAGE,
                    image_pull_policy="Never",
                    command=["sleep", "1000000"],
                    ports=[client.V1ContainerPort(name="metrics", container_port=port)],
                )
            ],
        ),
    )
    cluster.core.create_namespaced_pod(AGENT_NS, decoy)
    try:
        wait_until(
            lambda: cluster.phase(AGENT_NS, "silent-agent") == "Running", 60, what="the decoy Running", interval_s=0.25
        )
        silent = f"no answer from {AGENT_NS}/silent-agent: "
        top = kubectl(viewer, "vramguard", "top", "-A", "--timeout", "3")  # exit 0: the others' rows are shown
        (row,) = [line for line in top.stdout.splitlines() if silent in line]
        assert row.startswith(cluster.node.name) and "connection refused" in row, top.stdout
        assert {"notebook", "trainer"} <= {line.split()[3] for line in top.stdout.splitlines()[1:]}, top.stdout
        nodes = kubectl(viewer, "vramguard", "nodes", "--timeout", "3").stdout
        (gpu_row,) = [line for line in nodes.splitlines() if silent in line]
        assert "connection refused" in gpu_row, nodes
        assert len(nodes.splitlines()) == 3, "the header, GPU 0 of the answering agent, and the silent one"
        wide = kubectl(viewer, "vramguard", "top", "-A", "-o", "wide", "--timeout", "3").stdout
        assert any(f"{AGENT_NS}/silent-agent" in line.split() for line in wide.splitlines()), "its AGENT column"
        for command in ("top", "nodes"):
            strict = kubectl(viewer, "vramguard", command, "--strict", "--timeout", "3", check=False)
            assert strict.returncode == 1, strict.stdout + strict.stderr
        save("an agent that does not answer (exit 0; --strict exits 1)", "kubectl vramguard top -A", top.stdout)
        save("the same, per GPU", "kubectl vramguard nodes", nodes)
    finally:
        cluster.core.delete_namespaced_pod("silent-agent", AGENT_NS, grace_period_seconds=0)


def test_recommend_without_prometheus_reads_the_agents_own_peaks(cluster: Cluster, viewer: Path) -> None:
    """Without --prometheus-url, `recommend` as a user bound to the viewer and recommender roles reads the agent's
    own peaks through the pod proxy (the pods of the release's DaemonSet, in its namespace): each bare pod with the
    highest it used since the agent started, the 4Gi quota in force read under the release's policy from its
    ConfigMap, its verdict, and a caveat saying what the peaks cover."""
    user = cluster.person("recommender", VIEWER, RECOMMENDER)
    notebook, trainer = cluster.pod(NS, "notebook"), cluster.pod(NS, "trainer")
    assert notebook is not None and trainer is not None
    cluster.gpu({cluster.pid(notebook): GiB, cluster.pid(trainer): 9 * GiB})
    wait_until(
        lambda: (NS, "trainer", "main", 9 * GiB, 4 * GiB, "over-hard") in plugin_rows(viewer),
        60,
        what="the trainer's 9GiB seen",
        interval_s=0.5,
    )
    document = json.loads(kubectl(user, "vramguard", "recommend", "-n", NS, "-o", "json").stdout)
    assert (document["source"], document["agents"]) == ("agents", f"DaemonSet {AGENT_NS}/vramguard"), document
    assert document["caveats"][0].startswith("no --prometheus-url: the peaks are the agents' own"), document
    items = {i["name"]: i for i in document["items"]}
    assert items.keys() == {"notebook", "trainer"}, document
    row = items["trainer"]
    assert (row["kind"], row["container"], row["quota_bytes"], row["quota_source"]) == (
        "Pod",
        "main",
        4 * GiB,
        "limits[vramguard.io/vram]",
    )
    assert row["peak_bytes"] >= 9 * GiB and row["verdict"] == "would have been killed", row
    assert items["notebook"]["peak_bytes"] >= GiB


def deployment_declaring(cluster: Cluster, ns: str, name: str, env: dict[str, str]) -> dict[str, Any]:
    """A Deployment `name` whose template's container main has `env`, its ReplicaSet and one running pod of it,
    made by hand (no deployment or replicaset controller runs here) with the controllers' names and owner
    references, as the agent then sees the pod's owner. Returns the pod."""
    apps = client.AppsV1Api(cluster.api)
    labels = {"app": name}
    container = client.V1Container(
        name="main",
        image=WORKLOAD_IMAGE,
        image_pull_policy="Never",
        env=[client.V1EnvVar(name=k, value=v) for k, v in env.items()],
    )
    template = client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(labels=labels),
        spec=client.V1PodSpec(containers=[container], termination_grace_period_seconds=2),
    )
    selector = client.V1LabelSelector(match_labels=labels)
    deployment = apps.create_namespaced_deployment(
        ns,
        client.V1Deployment(
            metadata=client.V1ObjectMeta(name=name),
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
            metadata=client.V1ObjectMeta(name=f"{name}-7d9f4c8b5", owner_references=[owner("Deployment", deployment)]),
            spec=client.V1ReplicaSetSpec(replicas=1, selector=selector, template=template),
        ),
    )
    pod_name = f"{name}-7d9f4c8b5-x2b4z"
    cluster.core.create_namespaced_pod(
        ns,
        client.V1Pod(
            metadata=client.V1ObjectMeta(
                name=pod_name, labels=labels, owner_references=[owner("ReplicaSet", replica_set)]
            ),
            spec=template.spec,
        ),
    )
    wait_until(lambda: cluster.phase(ns, pod_name) == "Running", 60, what=f"{ns}/{pod_name} Running")
    found = cluster.pod(ns, pod_name)
    assert found is not None
    return found


def test_recommend_patches_the_toolkits_variable_the_deployment_declares(cluster: Cluster, viewer: Path) -> None:
    """A Deployment whose template declares NVIDIA_GPU_MEMORY_REQUEST=2048 and NVIDIA_GPU_MEMORY_LIMIT=4096 (the
    container toolkit's variables, whole MiB) beside a variable of its own, its pod at 9GiB: `recommend`, as a user
    bound to the viewer and recommender roles, holds it to that 4Gi hard limit (would have been killed), and its
    patch, applied by the admin with kubectl, sets NVIDIA_GPU_MEMORY_LIMIT=11264 in the template's env and no
    vramguard field, keeping the request (below the new limit) and the other variable; recommend, asked again, finds
    the template's quota ok and prints no patch."""
    ns = cluster.namespace("toolkit")
    user = cluster.person("toolkit-recommender", VIEWER, RECOMMENDER)
    declared = {"NVIDIA_GPU_MEMORY_REQUEST": "2048", "NVIDIA_GPU_MEMORY_LIMIT": "4096", "TEAM_SETTING": "x"}
    pod = deployment_declaring(cluster, ns, "trainer", declared)
    cluster.gpu({cluster.pid(pod): 9 * GiB})
    wait_until(
        # QUOTA is the soft limit (the request's 2Gi); over-hard: above the variable's 4Gi.
        lambda: (ns, pod["metadata"]["name"], "main", 9 * GiB, 2 * GiB, "over-hard") in plugin_rows(viewer, ns),
        60,
        what="the agent holding the pod to the variable's 4Gi",
        interval_s=0.5,
    )
    document = json.loads(kubectl(user, "vramguard", "recommend", "-n", ns, "-o", "json").stdout)
    (item,) = document["items"]
    assert (item["kind"], item["name"], item["container"], item["quota_bytes"], item["quota_source"]) == (
        "Deployment",
        "trainer",
        "main",
        4 * GiB,
        "env NVIDIA_GPU_MEMORY_REQUEST and NVIDIA_GPU_MEMORY_LIMIT",
    ), item
    assert item["verdict"] == "would have been killed", item
    assert item["field"] == {"kind": "env", "name": "NVIDIA_GPU_MEMORY_LIMIT", "value": "11264"}, item

    patch = kubectl(user, "vramguard", "recommend", "-n", ns, "-o", "patch").stdout
    (command,) = [line for line in patch.splitlines() if line.startswith("kubectl patch")]
    cluster.node.kubectl(*shlex.split(command)[1:])  # as the admin: the recommender role reads only
    save("recommend's patch of the toolkit's variable", f"kubectl vramguard recommend -n {ns} -o patch", patch)
    apps = client.AppsV1Api(cluster.api)
    deployment = raw(cluster.api, apps.read_namespaced_deployment("trainer", ns))
    template = deployment["spec"]["template"]
    (container,) = template["spec"]["containers"]
    assert {e["name"]: e.get("value") for e in container["env"]} == {
        **declared,
        "NVIDIA_GPU_MEMORY_LIMIT": "11264",
    }, container["env"]
    assert not (template["metadata"].get("annotations") or {}), "no vramguard annotation beside the variable"

    again = json.loads(kubectl(user, "vramguard", "recommend", "-n", ns, "-o", "json").stdout)
    (item,) = again["items"]
    assert (item["quota_bytes"], item["verdict"]) == (11 * GiB, "ok"), item
    assert "kubectl patch" not in kubectl(user, "vramguard", "recommend", "-n", ns, "-o", "patch").stdout
