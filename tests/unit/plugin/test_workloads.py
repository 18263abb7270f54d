"""Which workload each pod belongs to: by the controller the agent saw (its series' owner labels), up to the
workload a person edits; for a series without them (an older agent), followed through its controller while it
exists, placed by its generated name once it is gone, the longest live owner winning; and each workload's pod
template."""

from __future__ import annotations

import pytest

from vramguard.plugin.workloads import Owners, WorkloadRef

from .objects import by_kind, pod, template, workload

NS = "ml"
T = template({"vramguard.io/vram": "8Gi"})

OWNERS = Owners(
    by_kind(
        workload("Deployment", NS, "web", T),
        workload("ReplicaSet", NS, "web-7d9f4c8b5", T, owner_kind="Deployment", owner_name="web"),
        workload("Deployment", NS, "web-api", T),  # a longer name sharing web's prefix
        workload("ReplicaSet", NS, "orphan-rs", T),
        workload("StatefulSet", NS, "db", T),
        workload("DaemonSet", NS, "agent", T),
        workload("CronJob", NS, "nightly", T),
        workload("Job", NS, "nightly-29000000", T, owner_kind="CronJob", owner_name="nightly"),
        workload("Job", NS, "once", T),
        pod(NS, "web-7d9f4c8b5-x2b4z", ("ReplicaSet", "web-7d9f4c8b5")),
        pod(NS, "bare", limits={"vramguard.io/vram": "1Gi"}),
        pod(NS, "op-pod", ("RayCluster", "ray-1")),
    )
)


@pytest.mark.parametrize(
    ("pod_name", "owner", "want"),
    [
        pytest.param("web-7d9f4c8b5-x2b4z", "", ("Deployment", "web"), id="live-pod-through-its-replicaset"),
        pytest.param("web-7d9f4c8b5-q9w2k", "", ("Deployment", "web"), id="gone-pod-of-a-live-replicaset"),
        pytest.param("web-5c6d7f8b9-q9w2k", "", ("Deployment", "web"), id="gone-replicaset-of-a-live-deployment"),
        pytest.param("web-api-5c6d7f8b9-q9w2k", "", ("Deployment", "web-api"), id="the-longest-owner-wins"),
        pytest.param("orphan-rs-q9w2k", "", ("ReplicaSet", "orphan-rs"), id="a-replicaset-no-deployment-owns"),
        pytest.param("db-0", "", ("StatefulSet", "db"), id="statefulset-ordinal"),
        pytest.param("db-12", "", ("StatefulSet", "db"), id="statefulset-ordinal-12"),
        pytest.param("agent-q9w2k", "", ("DaemonSet", "agent"), id="daemonset"),
        pytest.param("nightly-29000000-q9w2k", "", ("CronJob", "nightly"), id="cronjob-through-its-live-job"),
        pytest.param("nightly-28999940-q9w2k", "", ("CronJob", "nightly"), id="cronjob-whose-job-is-gone"),
        pytest.param("once-q9w2k", "", ("Job", "once"), id="job"),
        pytest.param("bare", "", ("Pod", "bare"), id="live-bare-pod"),
        pytest.param("gone-bare", "", ("Pod", "gone-bare"), id="gone-bare-pod"),
        pytest.param("web-7d9f4c8b5-aeiou", "", ("Pod", "web-7d9f4c8b5-aeiou"), id="vowels-are-never-generated"),
        pytest.param("op-pod", "", ("RayCluster", "ray-1"), id="another-controller-as-it-is"),
        pytest.param("x-1", "ReplicaSet/web-7d9f4c8b5", ("Deployment", "web"), id="gone-pod-by-the-agents-owner"),
        pytest.param("x-2", "Job/nightly-1", ("CronJob", "nightly"), id="gone-job-by-the-agents-owner"),
        # By the owner the series carry: no name is guessed, even one that would fit another owner.
        pytest.param("web-api-5c6d7f8b9-q9w2k", "ReplicaSet/web-5c6d7f8b9", ("Deployment", "web"),
                     id="the-owner-label-over-a-name-that-fits-a-longer-owner"),
        pytest.param("agent-q9w2k", "Pod/agent-q9w2k", ("Pod", "agent-q9w2k"),
                     id="owner-none-is-a-bare-pod-though-its-name-fits-a-daemonset"),
        pytest.param("web-7d9f4c8b5-x2b4z", "ReplicaSet/web-7d9f4c8b5", ("Deployment", "web"),
                     id="a-live-pod-by-its-owner-label"),
        pytest.param("x-3", "ReplicaSet/gone-5c6d7f8b9", ("ReplicaSet", "gone-5c6d7f8b9"),
                     id="an-owner-nothing-lists-as-it-is"),
        pytest.param("x-4", "RayCluster/ray-1", ("RayCluster", "ray-1"), id="another-controller-by-its-label"),
    ],
)  # fmt: skip
def test_the_workload_of_a_pod(pod_name: str, owner: str, want: tuple[str, str]) -> None:
    """The owner the agent saw first; without one, the live pod's controller, then the generated name."""
    assert OWNERS.workload_of(NS, pod_name, owner) == WorkloadRef(NS, *want)


def test_a_name_in_another_namespace_is_not_placed() -> None:
    """Owners are matched in the pod's own namespace only."""
    assert OWNERS.workload_of("other", "web-7d9f4c8b5-q9w2k") == WorkloadRef("other", "Pod", "web-7d9f4c8b5-q9w2k")


@pytest.mark.parametrize(
    ("ref", "path"),
    [
        pytest.param(WorkloadRef(NS, "Deployment", "web"), ("spec", "template"), id="deployment"),
        pytest.param(WorkloadRef(NS, "CronJob", "nightly"), ("spec", "jobTemplate", "spec", "template"), id="cronjob"),
        pytest.param(WorkloadRef(NS, "Pod", "bare"), (), id="bare-pod"),
    ],
)
def test_the_template_of_a_workload(ref: WorkloadRef, path: tuple[str, ...]) -> None:
    found = OWNERS.workload(ref)
    assert found.path == path and found.template is not None
    assert found.template["spec"]["containers"][0]["name"] == "main"
    assert found.template["metadata"]["namespace"] == NS


@pytest.mark.parametrize(
    "ref", [WorkloadRef(NS, "Pod", "gone-bare"), WorkloadRef(NS, "RayCluster", "ray-1")], ids=["gone", "unknown-kind"]
)
def test_no_template_where_none_is_known(ref: WorkloadRef) -> None:
    assert OWNERS.workload(ref).template is None
