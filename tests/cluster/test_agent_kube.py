"""The agent against a real kube-apiserver: RBAC from the manifest, the pod cache, Events, Eviction, capacity.

Every test here uses the real control plane (tests/cluster/conftest.py), the real `vramguard run` as a
subprocess where the agent acts, real processes in cgroups named by the pods' real UIDs, and the test NVML.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from cgroup_fixtures import need_cgroups
from vramguard.base.backoff import TokenBucket
from vramguard.core.policy import DefaultKind, DefaultQuota, Policy
from vramguard.core.quantity import GiB, MiB
from vramguard.core.quota import resolve_pod_quota
from vramguard.kube.claims import KubeClaimSource
from vramguard.kube.correlator import EventCorrelator
from vramguard.kube.events import KubeEventRecorder, KubeEventSink
from vramguard.kube.eviction import KubeEvictor
from vramguard.kube.pods import KubePodSource
from vramguard_testbed.simnode import SimProcess
from vramguard_testbed.waiting import wait_until

from .controlplane import ControlPlane, kubeconfig_api_client, serves_dra
from .kube_fixtures import MERGE, POLL_S, ApiPod, KubeNode, metric, wait_scans

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]

VRAM = "vramguard.io/vram"


def _status(call: object) -> int:
    """The HTTP status of an API call: 200 when it succeeds, the error's status when it does not."""
    try:
        call()  # type: ignore[operator]
        return 200
    except client.ApiException as e:
        return int(e.status or 0)


# --------------------------------------------------------------------------------------------------------------
# RBAC and the admission policy, exactly as deploy/daemonset.yaml installs them


def test_agent_credentials_allow_what_it_needs_and_nothing_else(
    node: KubeNode, namespace: str, kubernetes_version: str
) -> None:
    """With the manifest's ClusterRole and policy: pods, evictions, events, its node, its node's ResourceSlices
    and a claim by name — yes; secrets, deleting pods, other nodes' status, anything in its node's status but
    vramguard.io/vram, or listing and watching claims — no."""
    target, _ = node.pod("target", namespace)
    other_name = f"other-{node.name}"
    node.plane.add_node(other_name)
    with kubeconfig_api_client(node.kubeconfig) as agent_api:
        core = client.CoreV1Api(agent_api)
        vram_patch = {"status": {"capacity": {VRAM: "1Gi"}, "allocatable": {VRAM: "1Gi"}}}
        allowed: dict[str, Callable[[], object]] = {
            "list this node's pods": lambda: core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node.name}"
            ),
            "watch pods": lambda: core.list_pod_for_all_namespaces(
                watch=True, timeout_seconds=1, _preload_content=False
            ),
            "list its node": lambda: core.list_node(field_selector=f"metadata.name={node.name}"),
            "watch its node": lambda: core.list_node(
                field_selector=f"metadata.name={node.name}", watch=True, timeout_seconds=1, _preload_content=False
            ),
            "patch its node's vram": lambda: core.patch_node_status(node.name, vram_patch, _content_type=MERGE),
            "create an event": lambda: core.create_namespaced_event(
                namespace,
                client.CoreV1Event(
                    metadata=client.V1ObjectMeta(name=f"target.{node.name}"),
                    involved_object=client.V1ObjectReference(
                        api_version="v1", kind="Pod", namespace=namespace, name="target", uid=target.uid
                    ),
                    reason="VRAMTest",
                    message="rbac check",
                ),
            ),
        }
        refused: dict[str, Callable[[], object]] = {
            "read secrets": lambda: core.list_namespaced_secret(namespace),
            "delete a pod": lambda: core.delete_namespaced_pod("target", namespace),
            "create a pod": lambda: core.create_namespaced_pod(
                namespace,
                client.V1Pod(
                    metadata=client.V1ObjectMeta(name="x"),
                    spec=client.V1PodSpec(containers=[client.V1Container(name="x", image="x")]),
                ),
            ),
            "patch another node's status": lambda: core.patch_node_status(other_name, vram_patch, _content_type=MERGE),
            "change its node's cpu capacity": lambda: core.patch_node_status(
                node.name, {"status": {"capacity": {"cpu": "999"}}}, _content_type=MERGE
            ),
        }
        objects = client.CustomObjectsApi(agent_api)
        if serves_dra(kubernetes_version):
            allowed["list its node's resourceslices"] = lambda: objects.list_cluster_custom_object(
                "resource.k8s.io", "v1", "resourceslices", field_selector=f"spec.nodeName={node.name}"
            )
            allowed["watch resourceslices"] = lambda: objects.list_cluster_custom_object(
                "resource.k8s.io", "v1", "resourceslices", watch=True, timeout_seconds=1, _preload_content=False
            )
            refused["list resourceclaims"] = lambda: objects.list_cluster_custom_object(
                "resource.k8s.io", "v1", "resourceclaims"
            )
            refused["watch resourceclaims"] = lambda: objects.list_cluster_custom_object(
                "resource.k8s.io", "v1", "resourceclaims", watch=True, timeout_seconds=1, _preload_content=False
            )
        got_allowed = {what: _status(call) for what, call in allowed.items()}
        # Allowed to get a claim by name: the API server answers 404 for one that does not exist, not 403.
        got_claim = _status(
            lambda: objects.get_namespaced_custom_object("resource.k8s.io", "v1", namespace, "resourceclaims", "none")
        )
        got_refused = {what: _status(call) for what, call in refused.items()}
        evicted = KubeEvictor(agent_api).evict(target.info, "rbac check")
    assert got_allowed == dict.fromkeys(allowed, 200)
    assert got_refused == dict.fromkeys(refused, 403)
    assert got_claim == 404
    assert evicted.evicted, evicted.message
    assert node.reasons(target) == sorted(["VRAMTest"])


def test_network_policy_manifest_is_accepted_and_selects_the_agent(deployed: ControlPlane) -> None:
    """deploy/networkpolicy.yaml is a valid object for the API server, selects the DaemonSet's pods and opens their
    port (the kubelet's probes are exec probes: they need none)."""
    root = Path(__file__).resolve().parents[2] / "deploy"
    doc = yaml.safe_load((root / "networkpolicy.yaml").read_text())
    daemonset = next(d for d in yaml.safe_load_all((root / "daemonset.yaml").read_text()) if d["kind"] == "DaemonSet")
    with deployed.api_client() as api:
        networking = client.NetworkingV1Api(api)
        networking.create_namespaced_network_policy("vramguard", doc, dry_run="All")
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert doc["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    ports = {
        p["name"]: p["containerPort"] for c in daemonset["spec"]["template"]["spec"]["containers"] for p in c["ports"]
    }
    opened = {p["port"] for rule in doc["spec"]["ingress"] for p in rule["ports"]}
    assert opened == set(ports.values())


# --------------------------------------------------------------------------------------------------------------
# The pod cache and the quota sources


# (form, resources.limits, annotations, quota bytes)
QUOTA_FORMS: list[tuple[str, dict[str, str], dict[str, str], int]] = [
    ("vramguard-vram-byte-quantity", {VRAM: "12Gi"}, {}, 12 * GiB),
    ("aliyun-gpu-mem-GiB", {"aliyun.com/gpu-mem": "3"}, {}, 3 * GiB),
    ("hami-gpumem-MiB", {"nvidia.com/gpumem": "2048"}, {}, 2 * GiB),
    ("tencent-vcuda-256MiB-units", {"tencent.com/vcuda-memory": "8"}, {}, 2 * GiB),
    ("annotation-vram-limit", {}, {"vramguard.io/vram-limit": "5Gi"}, 5 * GiB),
    ("kai-gpu-memory-annotation-MiB", {}, {"gpu-memory": "1536"}, 1536 * MiB),
]


def test_pod_cache_sees_every_quota_form(node: KubeNode, namespace: str) -> None:
    """Pods created with each supported quota form are listed and watched, and resolve to the right bytes."""
    with kubeconfig_api_client(node.kubeconfig) as agent_api:
        source = KubePodSource(agent_api, node.name)
        source.start()
        try:
            assert source.wait_synced(15)
            assert source.node_labels()["nvidia.com/gpu.replicas"] == "4"
            expected = {}
            for i, (form, limits, annotations, quota_bytes) in enumerate(QUOTA_FORMS):
                pod, _ = node.pod(f"q{i}", namespace, limits=limits, annotations=annotations)
                expected[pod.uid] = (form, quota_bytes)

            # Created after the list: these arrive through the watch, the container IDs with the status update.
            def arrived() -> bool:
                pods = source.pods()
                return all(uid in pods and pods[uid].containers[0].container_id for uid in expected)

            wait_until(arrived, 10, "every pod and its container ID through the watch")
            for uid, (form, quota_bytes) in expected.items():
                info = source.pods()[uid]
                assert info.containers[0].container_id, f"{form}: the container ID comes from the pod's status"
                pq = resolve_pod_quota(info, Policy(), source.node_labels())
                quota = pq.containers.get("main") or pq.pod
                assert quota is not None and quota.limit_bytes == quota_bytes, form
            assert source.lists == 1, "new pods come through the watch, not through relists"
        finally:
            source.stop(source.clock.now() + 1.0)


def test_fair_share_uses_the_node_replicas_label(node: KubeNode, namespace: str) -> None:
    """A pod with no quota under a fair-share default gets GPU memory ÷ the node's nvidia.com/gpu.replicas."""
    with kubeconfig_api_client(node.kubeconfig) as agent_api:
        pod, _ = node.pod("shared", namespace)
        source = KubePodSource(agent_api, node.name)
        source.start()
        try:
            wait_until(lambda: pod.uid in source.pods(), 10, "the pod in the cache")
            policy = Policy(default=DefaultQuota(kind=DefaultKind.FAIR_SHARE))
            (quota,) = resolve_pod_quota(source.pods()[pod.uid], policy, source.node_labels()).containers.values()
            assert quota.share_divisor == 4 and quota.limit_for(24 * GiB) == 6 * GiB
        finally:
            source.stop(source.clock.now() + 1.0)


# --------------------------------------------------------------------------------------------------------------
# Events


def test_events_are_aggregated_spam_filtered_and_written_once(node: KubeNode, namespace: str) -> None:
    """A repeat while queued folds into one Event's count; a repeat after it was written PATCHes the count; past
    the per-(pod, reason) burst, Events are dropped and counted; the queue drains through the writer thread."""
    pod, _ = node.pod("chatty", namespace)
    counts: dict[str, int] = {}
    with kubeconfig_api_client(node.kubeconfig) as agent_api:
        recorder = KubeEventRecorder(
            KubeEventSink(agent_api, node.name),
            count=lambda r: counts.__setitem__(r, counts.get(r, 0) + 1),
            bucket=TokenBucket(burst=100, per_minute=600),
            correlator=EventCorrelator(spam_burst=2),
        )
        recorder.start()
        try:
            info = pod.info
            recorder.record(info, "VRAMQuotaExceeded", "container main uses 5.0GiB")
            assert recorder.flush(10)
            recorder.record(info, "VRAMQuotaExceeded", "container main uses 5.0GiB")  # written: a PATCH
            recorder.record(info, "VRAMKilled", "killed PIDs 1")
            recorder.record(info, "VRAMKilled", "killed PIDs 1")  # still queued: folded into its count
            recorder.record(info, "VRAMKilled", "killed PIDs 2")
            recorder.record(info, "VRAMKilled", "killed PIDs 3")  # past the burst of 2 for (pod, VRAMKilled)
            assert recorder.flush(10)
        finally:
            recorder.stop(recorder.clock.now() + 1.0)
    wait_until(lambda: sum(counts.get(k, 0) for k in ("written", "patched")) == 4, 5, f"4 writes: {counts}")
    assert counts == {"written": 3, "patched": 1, "aggregated": 1, "dropped": 1}
    events = {(e.reason, e.message): e.count for e in node.events(pod)}
    assert events == {
        ("VRAMQuotaExceeded", "container main uses 5.0GiB"): 2,
        ("VRAMKilled", "killed PIDs 1"): 2,
        ("VRAMKilled", "killed PIDs 2"): 1,
    }


# --------------------------------------------------------------------------------------------------------------
# The whole agent: evict, kill, capacity, and an API server that goes away


def test_evict_mode_evicts_once_and_records_it(node: KubeNode, namespace: str) -> None:
    """Over quota in evict mode: an Eviction (the pod gets DisruptionTarget and a deletionTimestamp), a
    VRAMEvicted Event, and no second eviction of the terminating pod."""
    pod, sim_pod = node.pod("greedy", namespace, limits={VRAM: "2Gi"})
    neighbour, sim_neighbour = node.pod("modest", namespace, limits={VRAM: "4Gi"})
    proc = node.sim.spawn(sim_pod, "main", 1 * GiB)
    node.sim.spawn(sim_neighbour, "main", 3 * GiB)
    node.sim.start_agent("--mode", "evict", "--poll-interval", str(POLL_S), stderr=subprocess.DEVNULL)
    node.sim.wait_ready()
    node.sim.set_usage(proc, 3 * GiB)

    def evicted() -> bool:
        live = node.core.read_namespaced_pod(pod.name, namespace)
        conditions = {c.type for c in (live.status.conditions or [])} if live.status else set()
        return (
            live.metadata is not None
            and live.metadata.deletion_timestamp is not None
            and "DisruptionTarget" in conditions
        )

    wait_until(evicted, 10, "the pod evicted")
    wait_scans(node, 4)
    assert metric(node, "vramguard_actions_total", action="evict", result="ok") == 1.0
    wait_until(lambda: node.reasons(pod) == sorted(["VRAMQuotaExceeded", "VRAMEvicted"]), 10, "both Events")
    assert node.events(neighbour) == []
    assert proc.alive(), "evict mode leaves stopping the container to the kubelet"


def protect_with_a_pdb(node: KubeNode, pod: ApiPod) -> None:
    """A PodDisruptionBudget that allows no disruption of the pod: every eviction of it is answered 429."""
    labels = {"app": pod.name}
    node.core.patch_namespaced_pod(pod.name, pod.namespace, {"metadata": {"labels": labels}}, _content_type=MERGE)
    client.PolicyV1Api(node.api).create_namespaced_pod_disruption_budget(
        pod.namespace,
        client.V1PodDisruptionBudget(
            metadata=client.V1ObjectMeta(name=pod.name),
            spec=client.V1PodDisruptionBudgetSpec(
                min_available=1, selector=client.V1LabelSelector(match_labels=labels)
            ),
        ),
    )


@pytest.mark.parametrize(
    ("on_refused", "killed"),
    [pytest.param("wait", False, id="pdb-refusal-then-wait"), pytest.param("kill", True, id="pdb-refusal-then-kill")],
)
def test_eviction_refused_by_a_pdb_follows_the_policy(
    node: KubeNode, namespace: str, tmp_path: Path, on_refused: str, killed: bool
) -> None:
    """A PodDisruptionBudget that allows no disruption answers 429; after the retries the policy decides."""
    pod, sim_pod = node.pod("protected", namespace, limits={VRAM: "1Gi"})
    protect_with_a_pdb(node, pod)
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"mode: evict\non_eviction_refused: {on_refused}\ncooldown: 600s\n")
    proc = node.sim.spawn(sim_pod, "main", 2 * GiB)
    node.sim.start_agent("--policy", str(policy), "--poll-interval", str(POLL_S), stderr=subprocess.DEVNULL)
    node.sim.wait_ready()
    result = "refused-then-killed" if killed else "refused"
    wait_until(lambda: metric(node, "vramguard_actions_total", action="evict", result=result) == 1.0, 15, result)
    live = node.core.read_namespaced_pod(pod.name, namespace)
    assert live.metadata is not None and live.metadata.deletion_timestamp is None, "the PDB kept the pod"
    # The refusal is said on the pod (its owner sees why it was not evicted), then what followed.
    expected = sorted(["VRAMQuotaExceeded", "VRAMEvictionRefused", *(["VRAMKilled"] if killed else [])])
    wait_until(lambda: node.reasons(pod) == expected, 10, f"Events {expected}")
    if killed:
        wait_until(lambda: not proc.alive(), 5, "the process killed")
    else:
        assert proc.alive()
    refusal = next(e for e in node.events(pod) if e.reason == "VRAMEvictionRefused")
    assert "disruption budget" in (refusal.message or "")


def _disruption_target(node: KubeNode, pod: ApiPod) -> bool:
    live = node.core.read_namespaced_pod(pod.name, pod.namespace)
    conditions = {c.type for c in (live.status.conditions or [])} if live.status else set()
    return (
        live.metadata is not None and live.metadata.deletion_timestamp is not None and "DisruptionTarget" in conditions
    )


def test_a_repeat_in_kill_mode_may_evict_the_pod(node: KubeNode, namespace: str, tmp_path: Path) -> None:
    """Kill mode with on_repeat: evict: the supervisor's worker is killed, its replacement gets the pod evicted
    through the Eviction API, and the VRAMEvicted Event says why; still over its quota while terminating, the
    container is killed whole."""
    pod, sim_pod = node.pod("ray", namespace, limits={VRAM: "1Gi"})
    policy = tmp_path / "policy.yaml"
    policy.write_text("mode: kill\non_repeat: evict\n")
    node.sim.start_agent("--policy", str(policy), "--poll-interval", str(POLL_S), stderr=subprocess.DEVNULL)
    node.sim.wait_ready()
    supervisor = node.sim.spawn_supervisor(sim_pod, "main", 2 * GiB, max_workers=1, hold_s=3600, respawn_delay_s=0.3)

    wait_until(lambda: _disruption_target(node, pod), 15, "the DisruptionTarget condition")
    wait_until(lambda: "VRAMEvicted" in node.reasons(pod), 10, "a VRAMEvicted Event")
    evicted = next(e for e in node.events(pod) if e.reason == "VRAMEvicted")
    assert "GPU processes came back within" in (evicted.message or "")
    assert metric(node, "vramguard_escalations_total", namespace=namespace, step="evict") == 1.0
    # No kubelet ends the evicted pod here: still over its quota while terminating, it is killed whole.
    wait_until(lambda: supervisor.poll() is not None, 10, "the supervisor gone")
    labels = {"namespace": namespace, "step": "kill-container"}
    wait_until(lambda: metric(node, "vramguard_escalations_total", **labels) == 1.0, 5, "one escalation")


def test_a_repeat_in_evict_mode_behind_a_pdb_loses_its_whole_container(
    node: KubeNode, namespace: str, tmp_path: Path
) -> None:
    """Evict mode, a PodDisruptionBudget that allows nothing and on_eviction_refused: kill: the refused eviction
    kills the worker; the supervisor's replacement is a repeat: evicted again, refused again, and then every
    process of the container is killed, the supervisor too."""
    pod, sim_pod = node.pod("serve", namespace, limits={VRAM: "1Gi"})
    protect_with_a_pdb(node, pod)
    policy = tmp_path / "policy.yaml"
    policy.write_text("mode: evict\non_eviction_refused: kill\n")
    log = tmp_path / "agent.log"
    with log.open("w") as stderr:
        node.sim.start_agent("--policy", str(policy), "--poll-interval", str(POLL_S), stderr=stderr)
    node.sim.wait_ready()
    supervisor = node.sim.spawn_supervisor(sim_pod, "main", 2 * GiB, max_workers=1, hold_s=3600, respawn_delay_s=0.3)

    wait_until(lambda: supervisor.poll() is not None, 30, "the whole container gone")
    wait_until(
        lambda: metric(node, "vramguard_actions_total", action="evict", result="refused-then-killed") == 2.0,
        10,
        "two refused-then-killed evictions",
    )
    actions = [line for line in log.read_text().splitlines() if '"event": "action"' in line]
    assert metric(node, "vramguard_escalations_total", namespace=namespace, step="evict") == 1.0, actions
    live = node.core.read_namespaced_pod(pod.name, namespace)
    assert live.metadata is not None and live.metadata.deletion_timestamp is None, "the PDB kept the pod"

    def whole_container_killed() -> bool:
        return any("stopped the whole container" in (e.message or "") for e in node.events(pod))

    wait_until(whole_container_killed, 10, "an Event saying the whole container was stopped")


def test_a_kill_event_is_not_queued_behind_warnings(node: KubeNode, namespace: str, tmp_path: Path) -> None:
    """60 pods over their quotas in a warn-mode namespace fill the Event pace (25 at once, then 20 a minute); a
    kill in a kill-mode namespace meanwhile has its VRAMKilled Event written ahead of the warnings still queued."""
    strict = f"{namespace}-kill"
    node.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=strict)))
    warned = []
    for i in range(60):
        api_pod, sim_pod = node.pod(f"over-{i}", namespace, limits={VRAM: "1Gi"})
        node.sim.processes.append(
            SimProcess(sim_pod.containers["main"].spawn(["sleep", "600"]), gpu=0, used_bytes=2 * GiB, pod=sim_pod)
        )
        warned.append(api_pod)
    offender, sim_offender = node.pod("offender", strict, limits={VRAM: "1Gi"})
    node.sim.sync()
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"mode: warn\nnamespaces:\n  {strict}:\n    mode: kill\n")
    node.sim.start_agent("--policy", str(policy), "--poll-interval", str(POLL_S), stderr=subprocess.DEVNULL)
    node.sim.wait_ready()
    wait_until(lambda: (metric(node, "vramguard_events_total", result="written") or 0) >= 25, 30, "25 Events")

    proc = node.sim.spawn(sim_offender, "main", 2 * GiB)
    wait_until(lambda: not proc.alive(), 5, "the process killed")
    killed_at = time.monotonic()
    wait_until(lambda: "VRAMKilled" in node.reasons(offender), 30, "a VRAMKilled Event")
    took_s = time.monotonic() - killed_at
    listed = node.core.list_namespaced_event(namespace).items
    written = sum(1 for e in listed if e.reason == "VRAMQuotaExceeded")
    print(f"VRAMKilled written {took_s:.1f} s after the kill, with {written} of 60 warnings written")
    assert written < 50, f"the kill's Event went ahead of the warnings still queued ({written} of 60 written)"


def test_kill_mode_full_loop(node: KubeNode, namespace: str) -> None:
    """Kill mode through the API: the offender's processes die, the neighbour lives, Events and metrics say so,
    and an invalid quota is reported once as VRAMQuotaInvalid."""
    offender, sim_offender = node.pod("offender", namespace, limits={"nvidia.com/gpumem": "1024"})
    neighbour, sim_neighbour = node.pod("neighbour", namespace, annotations={"vramguard.io/vram-limit": "4Gi"})
    # The manifest's admission policy refuses a malformed quota at the door (tests/cluster/test_quota_admission.py);
    # a burst below its quota is the agent's alone to find.
    typo, _ = node.pod(
        "typo", namespace, annotations={"vramguard.io/vram-limit": "4Gi", "vramguard.io/vram-burst": "2Gi"}
    )
    bad = node.sim.spawn(sim_offender, "main", 512 * MiB, children=1)
    good = node.sim.spawn(sim_neighbour, "main", 3 * GiB)
    node.sim.start_agent("--mode", "kill", "--poll-interval", str(POLL_S), stderr=subprocess.DEVNULL)
    node.sim.wait_ready()
    node.sim.set_usage(bad, 2 * GiB)
    wait_until(lambda: not bad.alive(), 2 * POLL_S + 1, "the offender killed")
    wait_scans(node, 3)
    assert good.alive()
    assert metric(node, "vramguard_actions_total", action="kill", result="ok") == 1.0
    wait_until(lambda: (metric(node, "vramguard_events_total", result="written") or 0) >= 3, 10, "3 Events")
    killed = [e for e in node.events(offender) if e.reason == "VRAMKilled"]
    assert len(killed) == 1 and str(bad.pid) in (killed[0].message or "")
    assert "quota 1.0GiB" in (killed[0].message or "")
    assert node.events(neighbour) == []
    (invalid,) = node.events(typo)
    assert invalid.reason == "VRAMQuotaInvalid" and "below the quota 4Gi" in (invalid.message or "")
    assert (metric(node, "vramguard_events_total", result="written") or 0) >= 3


def test_capacity_advertisement_lets_the_scheduler_fit_three_of_four(
    deployed: ControlPlane, admin_api: client.ApiClient, tmp_path: Path, namespace: str
) -> None:
    """--advertise-capacity publishes 24Gi; four pods asking 8Gi each: the real kube-scheduler binds three and
    leaves the fourth Pending. Without the flag, the agent withdraws the resource."""
    need_cgroups(2)
    kube_node = KubeNode(deployed, admin_api, tmp_path, labels={"vramguard-test": "scheduling"})
    scheduler = deployed.start_scheduler()
    try:
        agent = kube_node.sim.start_agent("--advertise-capacity", "--poll-interval", str(POLL_S))
        kube_node.sim.wait_ready()
        core = kube_node.core

        def advertised() -> str | None:
            status = core.read_node(kube_node.name).status
            return (status.allocatable or {}).get(VRAM) if status else None

        wait_until(lambda: advertised() == str(24 * GiB), 10, "24Gi advertised")
        for i in range(4):
            core.create_namespaced_pod(
                namespace,
                client.V1Pod(
                    metadata=client.V1ObjectMeta(name=f"job-{i}"),
                    spec=client.V1PodSpec(
                        node_selector={"vramguard-test": "scheduling"},
                        containers=[
                            client.V1Container(
                                name="main",
                                image="busybox",
                                resources=client.V1ResourceRequirements(limits={VRAM: "8Gi"}, requests={VRAM: "8Gi"}),
                            )
                        ],
                    ),
                ),
            )

        def placement() -> tuple[int, int]:
            pods = core.list_namespaced_pod(namespace).items
            bound = sum(1 for p in pods if p.spec and p.spec.node_name == kube_node.name)
            unschedulable = sum(
                1
                for p in pods
                if p.status
                and any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in (p.status.conditions or []))
            )
            return bound, unschedulable

        # The fourth pod's PodScheduled=False/Unschedulable is the scheduler's verdict that it does not fit.
        wait_until(lambda: placement() == (3, 1), 30, "3 pods placed, the fourth unschedulable")

        kube_node.sim.stop_agents()
        assert agent.returncode is not None
        kube_node.sim.start_agent("--poll-interval", str(POLL_S))
        wait_until(lambda: advertised() is None, 10, "without the flag the resource withdrawn")
    finally:
        scheduler.stop()
        kube_node.close()


def test_api_server_restart_agent_keeps_enforcing_and_resyncs(node: KubeNode, namespace: str) -> None:
    """API server down: not ready, still enforcing from the cache; back: ready again, and a pod deleted in the
    meantime is forgotten — its processes are never acted on."""
    _, sim_known = node.pod("known", namespace, limits={VRAM: "1Gi"})
    leaving, sim_leaving = node.pod("leaving", namespace, limits={VRAM: "1Gi"})
    a = node.sim.spawn(sim_known, "main", 512 * MiB)
    b = node.sim.spawn(sim_leaving, "main", 512 * MiB)
    node.sim.start_agent("--mode", "kill", "--poll-interval", str(POLL_S), stderr=subprocess.DEVNULL)
    node.sim.wait_ready()

    node.plane.stop_apiserver()
    try:
        wait_until(lambda: node.sim.http_get("/readyz")[0] == 503, 20, "/readyz 503")
        assert "API server unreachable" in node.sim.http_get("/readyz")[1]
        node.sim.set_usage(a, 2 * GiB)
        wait_until(lambda: not a.alive(), 5, "enforcing from the cache while disconnected")
    finally:
        node.plane.start_apiserver()
    node.core.delete_namespaced_pod(leaving.name, namespace, grace_period_seconds=0)
    wait_until(lambda: node.sim.http_get("/readyz")[0] == 200, 90, "/readyz 200")
    wait_scans(node, 3)
    node.sim.set_usage(b, 2 * GiB)
    wait_scans(node, 4)
    assert b.alive(), "a pod the cache no longer knows is never acted on"
    assert metric(node, "vramguard_unattributed_gpu_memory_bytes", gpu="0") == 2 * GiB


def test_the_claim_source_says_when_the_api_server_has_no_dra(
    deployed: ControlPlane, admin_api: client.ApiClient, kubernetes_version: str
) -> None:
    """On 1.34+ the claim source lists the node's ResourceSlices (none here) and is synced; on an older API
    server, which does not serve resource.k8s.io/v1, it says so once and gives no shares: the next quota source
    applies."""
    pods = KubePodSource(admin_api, "no-dra-node")
    source = KubeClaimSource(admin_api, "no-dra-node", pods)
    pods.start()
    source.start()
    try:
        assert pods.wait_synced(30) and source.wait_synced(30)
        if serves_dra(kubernetes_version):
            assert source.problem() is None and source.slice_lists == 1
        else:
            assert source.problem() == (
                "the API server does not serve resource.k8s.io/v1 (Kubernetes 1.34 or later has it)"
            )
        assert source.shares() == {}
    finally:
        source.stop(source.clock.now() + 1.0)
        pods.stop(pods.clock.now() + 1.0)
