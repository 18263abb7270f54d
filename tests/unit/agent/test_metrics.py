"""The scan's metrics: a scrape sees one whole scan, never a mix of two."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from vramguard.agent.act import ActionResult, OrphanResult
from vramguard.agent.metrics import Metrics
from vramguard.agent.reload import ReloadResult
from vramguard.agent.watch import Trigger
from vramguard.core.decide import Decision, quota_rows
from vramguard.core.driver_limit import LimitResult, LimitTarget
from vramguard.core.exited import HeldByExited
from vramguard.core.peaks import PeakWindow
from vramguard.core.policy import ActionKind
from vramguard.core.process import ProcessRef
from vramguard.core.quantity import GiB
from vramguard.core.quota import PodQuota, Quota
from vramguard.core.sample import GpuDevice
from vramguard.core.snapshot import UnattributedProcess, UnattributedReason
from vramguard.kube.events import EventResult
from vramguard.kube.pod_manifest import owner_labels
from vramguard_testbed.fakes import SnapshotBuilder, gpu, pod


def test_a_scrape_that_started_before_a_scan_published_shows_the_earlier_scan_whole() -> None:
    """A scrape under way when a scan publishes reads the earlier scan to its end; the next scrape reads the new one."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    trainer, notebook = pod("trainer", "ml"), pod("notebook", "ml")
    first = SnapshotBuilder().use(trainer, "main", gpu(0), 2 * GiB).build()
    second = SnapshotBuilder().use(notebook, "main", gpu(1), 3 * GiB).build()
    nothing = Decision(actions=(), violations=())
    limit = LimitTarget(trainer, "main", "cid", 0, gpu(0).uuid, 4 * GiB, "test")
    metrics.observe_scan(first, nothing, driver_limits=[limit], claim_source_up=True)

    scrape = registry.collect()  # a generator: the families are computed as the scrape reads them
    head = next(f for f in scrape if f.name == "vramguard_container_gpu_memory_used_bytes")
    metrics.observe_scan(second, nothing, driver_limits=[], claim_source_up=False)  # publishes mid-scrape
    rest = {f.name: f for f in scrape}

    assert [(s.labels["pod"], s.value) for s in head.samples] == [("trainer", 2 * GiB)]
    assert [s.labels["gpu"] for s in rest["vramguard_gpu_memory_total_bytes"].samples] == ["0"]
    assert [(s.labels["pod"], s.value) for s in rest["vramguard_driver_limit_bytes"].samples] == [("trainer", 4 * GiB)]
    assert [s.value for s in rest["vramguard_claim_source_up"].samples] == [1.0]
    after = {f.name: f for f in registry.collect()}
    assert [s.labels["pod"] for s in after["vramguard_container_gpu_memory_used_bytes"].samples] == ["notebook"]


@pytest.mark.parametrize(
    ("name", "labels"),
    [
        pytest.param(
            "vramguard_actions_total",
            {("action", k.value, "result", r.value) for k in ActionKind for r in ActionResult if r.ends(k)},
            id="every-action-with-every-result-it-can-end-in",
        ),
        pytest.param("vramguard_events_total", {("result", r.value) for r in EventResult}, id="every-event-result"),
        pytest.param(
            "vramguard_driver_limits_total", {("outcome", o.value) for o in LimitResult}, id="every-limit-outcome"
        ),
        pytest.param(
            "vramguard_triggered_scans_total", {("reason", t.value) for t in Trigger}, id="every-trigger-reason"
        ),
        pytest.param(
            "vramguard_orphan_reclaims_total", {("result", r.value) for r in OrphanResult}, id="every-orphan-result"
        ),
        pytest.param(
            "vramguard_policy_reloads_total", {("result", r.value) for r in ReloadResult}, id="every-reload-result"
        ),
    ],
)
def test_a_counted_result_is_exported_at_zero_before_its_first_count(name: str, labels: set[tuple[str, ...]]) -> None:
    """Before anything happened, each counter has a 0 series for every label value the agent counts under, so
    that a first failure is an increase for Prometheus."""
    metrics = Metrics(CollectorRegistry())
    exposed = text_string_to_metric_families(generate_latest(metrics.registry).decode())
    samples = [s for family in exposed for s in family.samples if s.name == name]
    assert {tuple(x for kv in sorted(s.labels.items()) for x in kv) for s in samples} == labels
    assert {s.value for s in samples} == {0.0}


def test_the_peak_is_exported_beside_the_usage_it_shadows() -> None:
    """vramguard_container_gpu_memory_peak_bytes has the usage metric's labels, one series a subject of the window,
    and the window's highest value, also for a container no longer in the scan."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    trainer, notebook = pod("trainer", "ml"), pod("notebook", "ml")
    window, devices = PeakWindow(), {gpu(0).uuid: gpu(0)}
    nothing = Decision(actions=(), violations=())
    for at, snapshot in [
        (0.0, SnapshotBuilder().use(trainer, "main", gpu(0), 9 * GiB).use(notebook, "main", gpu(0), GiB).build()),
        (1.0, SnapshotBuilder().use(notebook, "main", gpu(0), 2 * GiB).build()),
    ]:
        metrics.observe_scan(snapshot, nothing, peaks=window.observe(snapshot.containers, devices, at))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    peaks = {
        s.labels["pod"]: (s.labels, s.value) for s in families["vramguard_container_gpu_memory_peak_bytes"].samples
    }
    used = {s.labels["pod"]: s.labels for s in families["vramguard_container_gpu_memory_used_bytes"].samples}
    assert {pod: value for pod, (_, value) in peaks.items()} == {"trainer": 9 * GiB, "notebook": 2 * GiB}
    assert peaks["notebook"][0] == used["notebook"] and "trainer" not in used


@pytest.mark.parametrize(
    ("owner", "labels"),
    [
        pytest.param("ReplicaSet/web-7d9f4c8b5", ("ReplicaSet", "web-7d9f4c8b5"), id="its-controller"),
        pytest.param("Node/gpu-node-1", ("Node", "gpu-node-1"), id="a-mirror-pods-node"),
        pytest.param(None, ("<none>", "<none>"), id="no-controller-as-kube-state-metrics-says"),
    ],
)
def test_the_usage_and_the_peak_carry_the_pods_controller(owner: str | None, labels: tuple[str, str]) -> None:
    """The usage and peak gauges carry the pod's controller as kube_pod_owner's owner_kind and owner_name (what
    `kubectl vramguard recommend` groups by); the quota gauge does not."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    p = replace(pod("web-7d9f4c8b5-x2b4z", "ml"), owner=owner)
    snapshot = SnapshotBuilder().use(p, "main", gpu(0), GiB).build()
    peaks = PeakWindow().observe(snapshot.containers, {gpu(0).uuid: gpu(0)}, 0.0)
    metrics.observe_scan(snapshot, Decision(actions=(), violations=()), peaks=peaks)
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    for name in ("vramguard_container_gpu_memory_used_bytes", "vramguard_container_gpu_memory_peak_bytes"):
        (sample,) = families[name].samples
        assert (sample.labels["owner_kind"], sample.labels["owner_name"]) == labels
    assert owner_labels(p) == labels


def test_unattributed_memory_is_split_by_reason_and_every_reason_is_exported() -> None:
    """Each GPU has one unattributed series per reason, at 0 where none; the bytes held past a teardown by exited
    PIDs and the bytes of confirmed orphans have gauges of their own, 0 on a GPU without."""
    metrics = Metrics()
    device, other = gpu(0), gpu(1)
    snapshot = replace(
        SnapshotBuilder(devices=[device, other]).build(),
        unattributed=(
            UnattributedProcess(ProcessRef(7, 1), device.uuid, 2 * GiB, UnattributedReason.NOT_IN_POD),
            UnattributedProcess(ProcessRef(8, 1), device.uuid, GiB, UnattributedReason.NOT_IN_POD),
            UnattributedProcess(ProcessRef(9, -1), device.uuid, 3 * GiB, UnattributedReason.PROCESS_EXITED),
            UnattributedProcess(ProcessRef(10, 1), device.uuid, 4 * GiB, UnattributedReason.ORPHANED),
        ),
    )
    held = {device.uuid: HeldByExited(device.uuid, 3 * GiB, (9,), 0.0)}
    nothing = Decision(actions=(), violations=())
    metrics.observe_scan(snapshot, nothing, exited=held, orphaned={device.uuid: 4 * GiB})

    def value(name: str, d: GpuDevice, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"gpu": d.label, "gpu_uuid": d.uuid, **labels})

    unattributed = "vramguard_unattributed_gpu_memory_bytes"
    assert {r.value: value(unattributed, device, reason=r.value) for r in UnattributedReason} == {
        "not-in-pod": 3 * GiB,
        "outside-kubelet": 0,
        "pod-not-in-cache": 0,
        "orphaned": 4 * GiB,
        "process-exited": 3 * GiB,
    }
    assert {value(unattributed, other, reason=r.value) for r in UnattributedReason} == {0}
    held_name = "vramguard_gpu_memory_held_by_exited_processes_bytes"
    assert (value(held_name, device), value(held_name, other)) == (3 * GiB, 0)
    orphaned = "vramguard_orphaned_gpu_memory_bytes"
    assert (value(orphaned, device), value(orphaned, other)) == (4 * GiB, 0)
    metrics.observe_scan(snapshot, nothing)  # a scan without orphans: every GPU back at 0
    assert (value(orphaned, device), value(orphaned, other)) == (0, 0)


GPU0 = gpu(0, total_bytes=16 * GiB)
OWN_4G = Quota(limit_bytes=4 * GiB, source="limits[vramguard.io/vram]")
SHARE_6G = Quota(limit_bytes=6 * GiB, source="claim ml/gpu", share="claim-uid/0", claim="gpu")


@pytest.mark.parametrize(
    ("pod_quota", "quotas", "shares"),
    [
        pytest.param(
            PodQuota(containers={"main": OWN_4G, "side": OWN_4G}), {("main", 4), ("side", 4)}, set(),
            id="one-series-per-container-with-its-own",
        ),
        pytest.param(
            PodQuota(pod=Quota(limit_bytes=8 * GiB)), {("", 8)}, set(), id="one-series-for-a-pod-wide-quota",
        ),
        pytest.param(
            PodQuota(containers={"main": OWN_4G}, pod=Quota(limit_bytes=8 * GiB)), {("main", 4), ("", 8)}, set(),
            id="own-and-pod-wide-side-by-side",
        ),
        pytest.param(
            PodQuota(shares={"main": {GPU0.uuid: SHARE_6G}, "side": {GPU0.uuid: SHARE_6G}}),
            {("main", 6), ("side", 6)}, {("main", "gpu", 6), ("side", "gpu", 6)},
            id="a-dra-share-per-container-that-holds-it-with-its-claim",
        ),
        pytest.param(PodQuota(), set(), set(), id="unmanaged-no-series"),
    ],
)  # fmt: skip
def test_the_quota_series_follow_each_rows_owner(
    pod_quota: PodQuota, quotas: set[tuple[str, int]], shares: set[tuple[str, str, int]]
) -> None:
    """The quota gauge has one series per quota a container holds as its own (container named) and one per pod-wide
    quota (container ""), as the decision found them; a DRA share's also shows on the claim share gauge."""
    metrics = Metrics(CollectorRegistry())
    p = pod("trainer", "ml", containers={"main": {}, "side": {}})
    snapshot = SnapshotBuilder().use(p, "main", GPU0, GiB, pid=10).use(p, "side", GPU0, GiB, pid=11).build()
    metrics.observe_scan(snapshot, Decision(actions=(), violations=(), rows=quota_rows(snapshot, {p.uid: pod_quota})))
    families = {f.name: f for f in metrics.registry.collect()}
    quota = families["vramguard_container_gpu_memory_quota_bytes"].samples
    share = families["vramguard_claim_share_bytes"].samples
    assert {(s.labels["container"], int(s.value) // GiB) for s in quota} == quotas
    assert {(s.labels["container"], s.labels["claim"], int(s.value) // GiB) for s in share} == shares
