"""Issue 36, part 2, on the real node: GPU processes left in the cgroup of a pod that the API server no longer has
are reclaimed by the chart's agent `orphan_grace` after the pod left its cache, with a Warning Event on the Node,
and a new pod that the agent's watch has not delivered yet is never touched.

The orphans come about as on a real node: the pod is force-deleted while its kubelet is stopped, so nothing tears
its containers down (containerd keeps them running, in the cgroups the kubelet made). The agent that never saw the
pod is the same container started again by hand while the kubelet is away (`RealNode.start_task`: containerd's
own task start, the restart the kubelet would make). The slow watch is a proxy between the agent and the API server
that holds back every byte of the answers to WATCH requests (tests/cluster/delaying_proxy.py), while the API server
is restarted under it.

A workload "uses GPU memory" as in test_real_node.py: the test NVML lists its host PID, and it holds the stand-in
device file open (the agent's hidden --gpu-device-prefix), as a CUDA process holds /dev/nvidia*.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from helm_fixtures import need_helm
from real_parts import need
from vramguard.core.quantity import GiB
from vramguard.node.cgroup import v2_root
from vramguard_testbed.simnode import metric_value
from vramguard_testbed.waiting import wait_until

from .delaying_proxy import DelayingProxy, ProxiedRequest
from .real_cluster import Cluster, real_cluster, unavailable_reason

pytestmark = [pytest.mark.slow, pytest.mark.real_node]

DEVICE = "/dev/zero"  # stands in for /dev/nvidia* (the agent's hidden --gpu-device-prefix)
HOLD_DEVICE = ["sh", "-c", f"exec 3<{DEVICE}; exec sleep 1000000"]
GRACE_S = 10.0
POLICY: dict[str, Any] = {"mode": "kill", "orphan_grace": f"{GRACE_S:g}s"}  # orphans: the mode's default, reclaim
USED = 3 * GiB  # under the workloads' 4Gi quota: nothing but being orphaned makes them a target
# How long after the grace a reclaim may come: the pod's DELETED on the watch, the confirming LIST, a scan (0.5 s).
LATE_S = 10.0
HOLD_S = 3600.0  # a watch held back until the test lets it catch up
RECLAIMED = "VRAMOrphanReclaimed"
FOUND = "VRAMOrphanFound"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    need(unavailable_reason(), skip="no real node", ci="build the real node's parts first (scripts/test.sh does)")
    with real_cluster(need_helm()) as found:
        found.values["extraArgs"] = [*found.values["extraArgs"], f"--gpu-device-prefix={DEVICE}"]
        found.values["policyReload"] = {"rollOnChange": True}
        yield found


@dataclass(frozen=True)
class Process:
    """A host process, known by its PID and start time (a reused PID is another process)."""

    pid: int
    started: str

    @classmethod
    def of(cls, pid: int) -> Process:
        started = cls._start_ticks(pid)
        assert started is not None, f"no process {pid}"
        return cls(pid, started)

    @staticmethod
    def _start_ticks(pid: int) -> str | None:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return None if fields[0] in ("Z", "X") else fields[19]

    def alive(self) -> bool:
        return self._start_ticks(self.pid) == self.started

    def death(self, until: float) -> float | None:
        """When (time.monotonic()) it is first seen gone, polling every 20 ms until `until`; None if it lives on."""
        while time.monotonic() < until:
            if not self.alive():
                return time.monotonic()
            time.sleep(0.02)
        return None


def gpu_workload(cluster: Cluster, namespace: str, name: str) -> tuple[dict[str, Any], Process]:
    """A running pod (4Gi quota) whose one process holds the stand-in device, listed by the test NVML at `USED`."""
    cluster.create_workload(namespace, name, "4Gi", command=HOLD_DEVICE)
    wait_until(
        lambda: cluster.phase(namespace, name) == "Running", 60, what=f"{namespace}/{name} Running", interval_s=0.25
    )
    pod = cluster.pod(namespace, name)
    assert pod is not None
    process = Process.of(cluster.pid(pod))
    cluster.gpu({process.pid: USED})
    return pod, process


def attributed(cluster: Cluster, namespace: str, name: str) -> bool:
    """The agent's last scan tied the pod's `USED` bytes to it."""
    labels = {"namespace": namespace, "pod": name}
    return metric_value(cluster.metrics(), "vramguard_container_gpu_memory_used_bytes", labels) == USED


def unattributed(cluster: Cluster, reason: str) -> float:
    found = metric_value(cluster.metrics(), "vramguard_unattributed_gpu_memory_bytes", {"reason": reason})
    return found or 0.0


def reclaims(cluster: Cluster) -> float:
    return metric_value(cluster.metrics(), "vramguard_orphan_reclaims_total") or 0.0


def force_delete(cluster: Cluster, namespace: str, name: str) -> float:
    """`kubectl delete --grace-period=0 --force`: the pod object gone at once, whatever its kubelet does; returns
    when (time.monotonic()) the API server had answered."""
    cluster.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    deleted = time.monotonic()
    assert cluster.pod(namespace, name) is None
    return deleted


def agent_on(cluster: Cluster, port: int) -> None:
    """Wait until the agent's pod that is Ready is one that reaches the API server at `port` (a change of the
    chart's extraEnv rolls the pod, and `helm_install` tells a rolled pod by its annotations only)."""

    def on_port() -> bool:
        pod = cluster.agent_pod()
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]} if pod else {}
        return env.get("KUBERNETES_SERVICE_PORT") == str(port)

    wait_until(on_port, 120, what=f"the agent Ready on port {port}", interval_s=0.25)


def fresh_reads(proxy: DelayingProxy, *, since_s: float) -> list[ProxiedRequest]:
    """The LISTs of pods (not WATCHes) without a resourceVersion that reached the proxy since `since_s`: the
    agent's consistent reads of the API server, as it makes to confirm an orphan (its reflector always names a
    version, "0" or one it saw)."""
    return [
        r
        for r in proxy.seen(since_s=since_s, path="/api/v1/pods", watch=False)
        if "resourceVersion" not in parse_qs(r.query, keep_blank_values=True)
    ]


def orphan_events(cluster: Cluster, reason: str, *words: str) -> list[dict[str, Any]]:
    """The Node's Events with `reason` whose message says every one of `words`."""
    return [e for e in cluster.node_events(reason) if all(w in e["message"] for w in words)]


def pod_cgroup(pod: dict[str, Any]) -> Path:
    root = v2_root("/sys/fs/cgroup")
    assert root is not None
    return Path(f"{root}/kubepods/besteffort/pod{pod['metadata']['uid']}")


def torn_down(cluster: Cluster, pod: dict[str, Any]) -> None:
    """Wait until the kubelet, back, has removed the deleted pod's cgroup: its containers are gone, the node
    clean."""
    wait_until(
        lambda: not pod_cgroup(pod).exists(), 90, what="the kubelet tearing the orphan's pod down", interval_s=0.5
    )


def test_a_pod_deleted_while_its_kubelet_is_stopped_is_reclaimed_after_the_grace(cluster: Cluster) -> None:
    """Force-deleted with the kubelet stopped, the pod's process runs on, in its pod cgroup: the agent, which saw
    the pod, kills it `orphan_grace` after the deletion (not before) and names it, namespace/name, in a Node Event
    with its PID, bytes and GPU."""
    cluster.helm_install(**POLICY)
    ns = cluster.namespace("orphan-kubelet-down")
    pod, process = gpu_workload(cluster, ns, "trainer")
    wait_until(lambda: attributed(cluster, ns, "trainer"), 30, what="the agent attributing the trainer")
    try:
        with cluster.node.kubelet_stopped():
            deleted = force_delete(cluster, ns, "trainer")
            died = process.death(deleted + GRACE_S + LATE_S + 20)
            log = cluster.agent_log()
            assert died is not None, f"the orphan lives {GRACE_S + LATE_S + 20:g}s after its pod's deletion:\n{log}"
            (event,) = wait_until(
                lambda: orphan_events(cluster, RECLAIMED, f"{ns}/trainer"), 30, what=f"{RECLAIMED} on the Node"
            )
            reclaimed = reclaims(cluster)
            log = cluster.agent_log()
    finally:
        cluster.gpu({})
    reclaim_s = died - deleted
    print(f"grace to reclaim: killed {reclaim_s:.2f}s after the pod's deletion (orphan_grace {GRACE_S:g}s)")
    print(f"{RECLAIMED}: {event['message']}")
    assert reclaim_s >= GRACE_S, f"killed {reclaim_s:.2f}s after the deletion, within the grace"
    assert reclaim_s < GRACE_S + LATE_S, f"killed {reclaim_s:.2f}s after the deletion"
    assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "Node", event
    message = event["message"]
    assert str(process.pid) in message and "3.0GiB" in message and "GPU 0" in message, message
    assert reclaimed >= 1
    assert metric_value(cluster.metrics(), "vramguard_orphan_reclaims_total", {"result": "ok"}) == reclaimed
    assert "orphan_reclaimed" in log, log
    torn_down(cluster, pod)


def test_an_agent_started_after_the_deletion_reclaims_a_pod_it_never_saw(cluster: Cluster) -> None:
    """With the kubelet stopped, the pod is force-deleted and then the agent's container is killed and started
    again (the same container, a fresh process): the new agent never had the pod in its cache, but the first one
    noted its UID as the API server's in the state directory (a hostPath), so the new one kills its process
    `orphan_grace` after its own start at the earliest, naming the pod by its UID."""
    cluster.helm_install(**POLICY)
    ns = cluster.namespace("orphan-agent-restart")
    pod, process = gpu_workload(cluster, ns, "trainer")
    uid = pod["metadata"]["uid"]
    agent = cluster.agent_pod()
    assert agent is not None
    (status,) = agent["status"]["containerStatuses"]
    agent_container, first_agent = status["containerID"], cluster.pid(agent)
    log_path = cluster.workdir / "agent-restarted.log"
    try:
        with cluster.node.kubelet_stopped():
            try:
                deleted = force_delete(cluster, ns, "trainer")
                cluster.node.kill_task(agent_container)
                restarted = time.monotonic()
                second_agent = cluster.node.start_task(agent_container, log_path)
                died = process.death(restarted + GRACE_S + LATE_S + 30)
                log = log_path.read_text(errors="replace")
                assert died is not None, f"the orphan lives on {time.monotonic() - deleted:.1f}s after deletion:\n{log}"
                (event,) = wait_until(
                    lambda: orphan_events(cluster, RECLAIMED, uid), 30, what=f"{RECLAIMED} naming {uid} on the Node"
                )
                log = log_path.read_text(errors="replace")
            finally:
                cluster.node.kill_task(agent_container)  # the CRI does not know of it: gone before the kubelet is back
    finally:
        cluster.gpu({})
    reclaim_s, after_delete_s = died - restarted, died - deleted
    print(
        f"grace to reclaim: killed {reclaim_s:.2f}s after the agent's restart, {after_delete_s:.2f}s after the "
        f"pod's deletion (orphan_grace {GRACE_S:g}s)"
    )
    print(f"{RECLAIMED}: {event['message']}")
    assert second_agent != first_agent
    assert reclaim_s >= GRACE_S, f"killed {reclaim_s:.2f}s after the agent started, within the grace"
    assert reclaim_s < GRACE_S + LATE_S + 15, f"killed {reclaim_s:.2f}s after the agent started"  # + its start-up
    message = event["message"]
    assert f"{ns}/trainer" not in message, "named as if the agent had seen it"
    assert str(process.pid) in message and "3.0GiB" in message and "GPU 0" in message, message
    assert "orphan_reclaimed" in log, log
    # The kubelet, back, starts the agent's container again (it saw it exit) and tears the orphan's pod down.
    wait_until(lambda: cluster.agent_pod() is not None, 90, what="the agent Ready again under the kubelet")
    torn_down(cluster, pod)


def test_a_new_pod_the_watch_has_not_delivered_is_never_touched(cluster: Cluster) -> None:
    """The agent reaches the API server through a proxy that holds back its watches until the test lets them catch
    up: a new pod's process runs in its pod cgroup, with GPU memory, while the agent's cache looks healthy and lacks
    the pod, past the grace. No agent on the node saw the API server give its UID, so it is no orphan candidate: the
    agent does not even read the API server afresh for it. It is never killed nor reported an orphan, and the agent
    attributes it once the watch catches up."""
    with DelayingProxy(cluster.plane) as proxy:
        try:
            installed = time.monotonic()
            cluster.helm_install(chart_values=cluster.api_values(proxy.port), **POLICY)
            agent_on(cluster, proxy.port)
            wait_until(
                lambda: proxy.seen(since_s=installed, path="/api/v1/pods", watch=True),
                30,
                what="the agent watching its pods through the proxy",
            )
            ns = cluster.namespace("orphan-slow-watch")
            proxy.watch_delay_s = HOLD_S
            pod, process = gpu_workload(cluster, ns, "newcomer")
            # The pod's cgroup and process are there, the watch has not said so: the agent sees GPU memory in a pod
            # cgroup it has no pod for.
            wait_until(
                lambda: unattributed(cluster, "pod-not-in-cache") == USED,
                GRACE_S,
                what="the newcomer's memory unattributed, pod not in cache",
            )
            unseen = time.monotonic()
            # Past the grace and the latest a read would come, the cache healthy and behind: nothing is done to it.
            while time.monotonic() < unseen + GRACE_S + LATE_S:
                assert process.alive(), "killed while the watch was behind"
                time.sleep(0.05)
            assert not attributed(cluster, ns, "newcomer"), "the watch delivered the pod: is the proxy holding it?"
            assert fresh_reads(proxy, since_s=unseen) == [], "a UID no agent saw the API server give was a candidate"
            # The watch catches up: what the proxy held arrives at once.
            proxy.watch_delay_s = 0.0
            caught_up = time.monotonic()
            wait_until(lambda: attributed(cluster, ns, "newcomer"), 30, what="the agent attributing the newcomer")
            attributed_s = time.monotonic() - caught_up
            assert process.death(time.monotonic() + GRACE_S) is None, "killed after the watch caught up"
            uid = pod["metadata"]["uid"]
            wrong = [
                e for r in (RECLAIMED, FOUND) for w in (uid, f"{ns}/newcomer") for e in orphan_events(cluster, r, w)
            ]
            print(
                f"newcomer unattributed {caught_up - unseen:.1f}s, orphan_grace {GRACE_S:g}s, no fresh read; "
                f"attributed {attributed_s:.1f}s after the watch caught up ({proxy.held_chunks} chunks held); "
                f"wrong reclaims: {len(wrong)}"
            )
            assert wrong == [], wrong
            assert reclaims(cluster) == 0
            assert process.alive() and cluster.status(ns, "newcomer")["restartCount"] == 0
        finally:
            proxy.watch_delay_s = 0.0
            cluster.gpu({})
            cluster.helm_install(**POLICY)  # the agent back on the API server itself, before the proxy goes
            agent_on(cluster, int(cluster.plane.host.rsplit(":", 1)[1]))
