"""An unkind API server: frozen (SIGSTOP: connections accepted, nothing answered), then back.

The agent must keep enforcing at its own pace, say on /readyz that the API server does not answer (once its watches
have heard nothing, not even a bookmark, for `SILENCE_S`, and a renewal got no answer either),
stay alive on /healthz, stop within 2 s on SIGTERM, and deliver the Events it owes once the server is back,
none of them twice. Real kube-apiserver, real `vramguard run`, real processes in cgroups named by the pods' UIDs.
"""

from __future__ import annotations

import functools
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from vramguard.core.quantity import GiB, MiB
from vramguard.kube.pods import KubePodSource
from vramguard.kube.reflector import RENEWAL_GRACE_S, SILENCE_S
from vramguard_testbed.simnode import SimProcess
from vramguard_testbed.waiting import wait_until

from .controlplane import kubeconfig_api_client
from .kube_fixtures import MERGE, ApiPod, KubeNode, metric, on_the_newest_only, wait_scans

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]

VRAM = "vramguard.io/vram"
POLL_S = 0.5


def _event_log(node: KubeNode, pod: ApiPod) -> Counter[tuple[str, str]]:
    """How many Event objects exist per (reason, message) for `pod`: more than 1 is a duplicate."""
    return Counter((e.reason or "", e.message or "") for e in node.events(pod))


def _gone(proc: SimProcess) -> bool:
    return not proc.alive()


@on_the_newest_only
def test_frozen_api_server_kill_mode_keeps_its_pace(node: KubeNode, namespace: str) -> None:
    """API server frozen: two offenders crossing their quota are killed within a poll or two each, /healthz stays
    200, and /readyz says the server does not answer once the watches' silence outlasts a bookmark's period;
    thawed: ready again, every owed Event arrives, none twice."""
    first, sim_first = node.pod("first", namespace, limits={VRAM: "1Gi"})
    second, sim_second = node.pod("second", namespace, limits={VRAM: "1Gi"})
    a = node.sim.spawn(sim_first, "main", 512 * MiB)
    b = node.sim.spawn(sim_second, "main", 512 * MiB)
    node.sim.start_agent("--mode", "kill", "--poll-interval", str(POLL_S), stderr=subprocess.DEVNULL)
    node.sim.wait_ready()

    with node.plane.frozen_apiserver():
        frozen_at = time.monotonic()
        for proc in (a, b):
            node.sim.set_usage(proc, 2 * GiB)
            crossed = time.monotonic()
            wait_until(functools.partial(_gone, proc), 2 * POLL_S + 1, "killed while frozen")
            assert time.monotonic() - crossed < 2 * POLL_S + 1
        wait_scans(node, 3)
        assert node.sim.http_get("/healthz")[0] == 200
        assert metric(node, "vramguard_actions_total", action="kill", result="ok") == 2.0
        noticed_by = SILENCE_S + RENEWAL_GRACE_S + 10
        wait_until(lambda: node.sim.http_get("/readyz")[0] == 503, noticed_by, "/readyz 503")
        noticed_s = time.monotonic() - frozen_at
        assert "API server unreachable" in node.sim.http_get("/readyz")[1]
        assert node.sim.http_get("/healthz")[0] == 200
    assert noticed_s < noticed_by, f"/readyz noticed the freeze after {noticed_s:.1f}s"

    wait_until(lambda: node.sim.http_get("/readyz")[0] == 200, 30, "/readyz 200")
    owed = [(first, a), (second, b)]

    def delivered() -> bool:
        return all(
            sorted(r for r, _ in _event_log(node, pod)) == ["VRAMKilled", "VRAMQuotaExceeded"] for pod, _ in owed
        )

    wait_until(delivered, 45, "every Event owed delivered", interval_s=0.5)
    # A create retried after its timeout stays queued until it is answered: once nothing is queued, nothing more
    # will be written.
    wait_until(lambda: metric(node, "vramguard_events_queued") == 0, 30, "the agent's Event queue empty")
    for pod, proc in owed:
        log = _event_log(node, pod)
        assert set(log.values()) == {1}, f"an Event was written twice: {log}"
        assert any(str(proc.pid) in message for reason, message in log if reason == "VRAMKilled")


def test_frozen_api_server_evict_mode_falls_back_to_kill_after_its_bound(
    node: KubeNode, namespace: str, tmp_path: Path
) -> None:
    """Evict mode with on_eviction_refused: kill and a 2 s eviction bound: the eviction gets no answer, the
    agent records that it could not evict and kills the offender; the Events arrive after the thaw."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("mode: evict\non_eviction_refused: kill\neviction_timeout: 2s\ncooldown: 600s\n")
    offender, sim_offender = node.pod("offender", namespace, limits={VRAM: "1Gi"})
    proc = node.sim.spawn(sim_offender, "main", 512 * MiB)
    node.sim.start_agent("--policy", str(policy), "--poll-interval", str(POLL_S), stderr=subprocess.DEVNULL)
    node.sim.wait_ready()

    with node.plane.frozen_apiserver():
        node.sim.set_usage(proc, 2 * GiB)
        crossed = time.monotonic()
        wait_until(lambda: not proc.alive(), 8, "killed after the eviction bound")
        took_s = time.monotonic() - crossed
        assert 2.0 <= took_s < 2.0 + 3 * POLL_S + 1, took_s
        wait_scans(node, 2)
        assert metric(node, "vramguard_actions_total", action="evict", result="failed-then-killed") == 1.0

    def delivered() -> set[str]:
        return {reason for reason, _ in _event_log(node, offender)}

    expected = {"VRAMQuotaExceeded", "VRAMEvictionFailed", "VRAMKilled"}
    wait_until(lambda: expected <= delivered(), 45, f"Events {sorted(expected)} delivered", interval_s=0.5)
    assert set(_event_log(node, offender).values()) == {1}


def _evictions_received(node: KubeNode) -> float:
    """How many eviction requests the apiserver has answered since it started (any code)."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(node.plane.apiserver_metrics())
        for sample in family.samples
        if sample.name == "apiserver_request_total"
        and sample.labels.get("resource") == "pods"
        and sample.labels.get("subresource") == "eviction"
    )


def test_frozen_api_server_then_back_evicts_the_pod_once(node: KubeNode, namespace: str, tmp_path: Path) -> None:
    """Evict mode, on_eviction_refused: wait, cooldown 0s: an eviction sent into a frozen API server is given up
    on after its 3 s bound; the scans after it send no other eviction of the pod, and once the server is back the
    pod is evicted once (it was evicted ten times when every scan queued another)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("mode: evict\non_eviction_refused: wait\neviction_timeout: 3s\ncooldown: 0s\n")
    offender, sim_offender = node.pod("offender", namespace, limits={VRAM: "1Gi"})
    proc = node.sim.spawn(sim_offender, "main", 512 * MiB)
    node.sim.start_agent("--policy", str(policy), "--poll-interval", str(POLL_S), stderr=subprocess.DEVNULL)
    node.sim.wait_ready()
    before = _evictions_received(node)

    with node.plane.frozen_apiserver():  # shorter than the request's 10 s read timeout: the answer arrives late
        node.sim.set_usage(proc, 2 * GiB)
        wait_scans(node, 2)
        wait_until(
            lambda: (metric(node, "vramguard_actions_total", action="evict", result="failed") or 0) >= 2,
            10,
            "the eviction given up on, and another one failed at once",
        )

    def evicted() -> bool:
        meta = node.core.read_namespaced_pod(offender.name, namespace).metadata
        return meta is not None and meta.deletion_timestamp is not None

    wait_until(evicted, 30, "the pod evicted")
    wait_scans(node, 6)  # long past the eviction bound: the agent sees the pod terminating, and kills instead
    evictions = _evictions_received(node) - before
    print(f"the API server received {evictions:g} eviction request(s) for the pod")
    assert evictions == 1
    assert metric(node, "vramguard_actions_total", action="evict", result="ok") == 1.0


def test_sigterm_ends_the_agent_within_two_seconds_while_the_api_server_is_frozen(node: KubeNode) -> None:
    """With every API connection hanging, SIGTERM still ends the agent within 2 s."""
    agent = node.sim.start_agent("--mode", "kill", "--poll-interval", str(POLL_S), stderr=subprocess.DEVNULL)
    node.sim.wait_ready()
    with node.plane.frozen_apiserver():
        wait_scans(node, 2)  # scanning while its watches hang on the frozen server
        agent.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        try:
            agent.wait(timeout=10)
        finally:
            took_s = time.monotonic() - sent
    assert agent.returncode == 0
    assert took_s < 2.0, f"SIGTERM took {took_s:.2f}s"


def test_node_label_change_reaches_the_agent_within_seconds(node: KubeNode) -> None:
    """A changed nvidia.com/gpu.replicas label reaches the pod source with the Node watch's event (fair share)."""
    with kubeconfig_api_client(node.kubeconfig) as agent_api:
        source = KubePodSource(agent_api, node.name)
        source.start()
        try:
            assert source.wait_synced(15)
            assert source.node_labels()["nvidia.com/gpu.replicas"] == "4"
            client.CoreV1Api(node.api).patch_node(
                node.name, {"metadata": {"labels": {"nvidia.com/gpu.replicas": "8"}}}, _content_type=MERGE
            )
            changed = time.monotonic()
            wait_until(lambda: source.node_labels().get("nvidia.com/gpu.replicas") == "8", 15, "the new label")
            assert time.monotonic() - changed < 10
        finally:
            source.stop(source.clock.now() + 1.0)
