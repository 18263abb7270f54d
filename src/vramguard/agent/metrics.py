"""Prometheus metrics. Per-container series come from the latest scan, so a pod that is gone leaves no stale series.

Names carry their units (`_bytes`, `_seconds`, `_total`), following client_python's conventions. Everything is
registered on the registry passed in: no module-level globals, so tests and the benchmark build their own.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from vramguard.agent.act import ActionResult, OrphanResult
from vramguard.agent.reload import RESTART_FIELDS, ReloadResult
from vramguard.agent.watch import WATCH_STUCK_S, Trigger
from vramguard.core.actions import Reason
from vramguard.core.decide import Decision
from vramguard.core.driver_limit import LimitKey, LimitResult, LimitTarget
from vramguard.core.exited import EXITED_HOLD_S, HeldByExited
from vramguard.core.peaks import PEAK_WINDOW_S, Peak
from vramguard.core.policy import ActionKind
from vramguard.core.ports import LIMIT_MAX
from vramguard.core.quota import QuotaRow
from vramguard.core.snapshot import Snapshot, UnattributedReason
from vramguard.kube.events import EventResult
from vramguard.kube.pod_manifest import OWNER_LABELS, owner_labels

SCAN_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# Every label value the agent counts under is exported at 0 from the start, read from the enum its producer owns: a
# series born with its first count is no increase to Prometheus, and the alerts on failures read increase().


@dataclass(frozen=True, slots=True)
class ScanView:
    """What one scan publishes: replaced whole after each scan, so a scrape never mixes two scans."""

    snapshot: Snapshot
    rows: tuple[QuotaRow, ...]  # each row with its subject and quota (`Decision.rows`)
    driver_limits: tuple[LimitTarget, ...] = ()
    claim_source_up: bool | None = None  # None: no claim quota source
    peaks: tuple[Peak, ...] = ()  # each subject's highest usage over the last PEAK_WINDOW_S (`core/peaks.py`)
    # The GPUs whose memory exited processes have held past the threshold, by UUID (`core/exited.py`).
    exited: Mapping[str, HeldByExited] = field(default_factory=dict)
    # The bytes of processes of pods that are gone (confirmed orphans), by GPU UUID (`core/orphans.py`).
    orphaned: Mapping[str, int] = field(default_factory=dict)


class _ScanCollector(Collector):
    """Gauges computed at scrape time from the latest scan's `ScanView`."""

    def __init__(self) -> None:
        self.view: ScanView | None = None  # one reference, swapped in one assignment

    def collect(self) -> Iterator[Metric]:
        view = self.view  # read once: the scan may publish the next view while this scrape runs
        if view is None:
            return
        snap = view.snapshot
        labels = ["namespace", "pod", "container", "gpu", "gpu_uuid"]
        owned = [*labels, *OWNER_LABELS]  # the usage and the peak: what `kubectl vramguard recommend` groups by
        used = GaugeMetricFamily(
            "vramguard_container_gpu_memory_used_bytes",
            "GPU memory used by a container on one GPU, with its pod's controller (owner_kind, owner_name).",
            labels=owned,
        )
        quota = GaugeMetricFamily(
            "vramguard_container_gpu_memory_quota_bytes",
            "VRAM quota of a container on one GPU (container is empty for a pod-wide quota).",
            labels=labels,
        )
        peak = GaugeMetricFamily(
            "vramguard_container_gpu_memory_peak_bytes",
            f"The highest GPU memory a container used on one GPU in the agent's scans over the last "
            f"{PEAK_WINDOW_S:g} s, also after it stopped: max_over_time of it is the true peak between scrapes. "
            "With its pod's controller (owner_kind, owner_name).",
            labels=owned,
        )
        share = GaugeMetricFamily(
            "vramguard_claim_share_bytes",
            "GPU memory a container holds on one GPU through DRA claims (a claim quota source), by claim name.",
            labels=[*labels, "claim"],
        )
        devices = {d.uuid: d for d in snap.devices}
        for u in snap.containers:
            device = devices.get(u.device_uuid)
            if device is not None:
                values = [u.pod.namespace, u.pod.name, u.container, device.label, device.uuid, *owner_labels(u.pod)]
                used.add_metric(values, u.used_bytes)
        # One quota series per quota a container holds as its own, and one per pod-wide quota (container "").
        quota_seen: set[LimitKey] = set()
        for u, governing in view.rows:
            device = devices.get(u.device_uuid)
            if device is None or governing is None or (key := governing.limit_key) in quota_seen:
                continue
            quota_seen.add(key)
            q = governing.quota
            values = [u.pod.namespace, u.pod.name, governing.holder or "", device.label, device.uuid]
            limit = q.limit_for(device.total_bytes)
            quota.add_metric(values, limit)
            if q.claim is not None:
                share.add_metric([*values, q.claim], limit)
        for p in view.peaks:
            values = [p.pod.namespace, p.pod.name, p.container, p.gpu, p.device_uuid, *owner_labels(p.pod)]
            peak.add_metric(values, p.peak_bytes)
        yield used
        yield peak
        yield quota
        yield share

        gpu_labels = ["gpu", "gpu_uuid", "name"]
        families = {
            "total": GaugeMetricFamily(
                "vramguard_gpu_memory_total_bytes", "Total memory of a GPU or MIG instance.", labels=gpu_labels
            ),
            "used": GaugeMetricFamily(
                "vramguard_gpu_memory_used_bytes", "Used memory of a GPU or MIG instance.", labels=gpu_labels
            ),
            "free": GaugeMetricFamily(
                "vramguard_gpu_memory_free_bytes", "Free memory of a GPU or MIG instance.", labels=gpu_labels
            ),
        }
        healthy = GaugeMetricFamily(
            "vramguard_gpu_healthy", "1 when every NVML call for the GPU succeeded in the last scan.", labels=gpu_labels
        )
        unattributed = GaugeMetricFamily(
            "vramguard_unattributed_gpu_memory_bytes",
            "GPU memory used by processes outside any known pod, by reason: not-in-pod (a host process), "
            "outside-kubelet (in a pod-shaped cgroup outside this node's kubelet's: a host process too), "
            "pod-not-in-cache (a pod the agent does not know yet), orphaned (a pod that is gone: reclaimed or "
            "reported, vramguard_orphaned_gpu_memory_bytes), process-exited (NVML lists a PID that has no process). "
            "Only orphaned memory is ever acted on.",
            labels=["gpu", "gpu_uuid", "reason"],
        )
        exited = GaugeMetricFamily(
            "vramguard_gpu_memory_held_by_exited_processes_bytes",
            "GPU memory NVML lists under PIDs that have no process, held longer than a teardown takes "
            f"({EXITED_HOLD_S:g} s): only a GPU reset frees it. 0 on a GPU without.",
            labels=["gpu", "gpu_uuid"],
        )
        orphaned = GaugeMetricFamily(
            "vramguard_orphaned_gpu_memory_bytes",
            "GPU memory held by processes of pods that are gone (orphans, confirmed by a fresh read of the API "
            "server); 0 on a GPU without.",
            labels=["gpu", "gpu_uuid"],
        )
        unattributed_bytes: dict[tuple[str, UnattributedReason], int] = {}
        for row in snap.unattributed:
            by = (row.device_uuid, row.reason)
            unattributed_bytes[by] = unattributed_bytes.get(by, 0) + row.used_bytes
        for d in snap.devices:
            lv = [d.label, d.uuid, d.name]
            families["total"].add_metric(lv, d.total_bytes)
            families["used"].add_metric(lv, d.used_bytes)
            families["free"].add_metric(lv, d.free_bytes)
            healthy.add_metric(lv, 1.0 if d.healthy else 0.0)
            for reason in UnattributedReason:
                unattributed.add_metric([d.label, d.uuid, reason.value], unattributed_bytes.get((d.uuid, reason), 0))
            held = view.exited.get(d.uuid)
            exited.add_metric([d.label, d.uuid], held.held_bytes if held is not None else 0)
            orphaned.add_metric([d.label, d.uuid], view.orphaned.get(d.uuid, 0))
        yield from families.values()
        yield healthy
        yield unattributed
        yield exited
        yield orphaned

        limits = GaugeMetricFamily(
            "vramguard_driver_limit_bytes",
            "The hard GPU memory limit the driver holds for a container's cgroup on one GPU (container is empty for "
            "a pod's own cgroup): allocations beyond it fail in that container. The agent's own, or the one NVIDIA's "
            "container toolkit hook set (from NVIDIA_GPU_MEMORY_LIMIT), which the agent leaves alone.",
            labels=labels,
        )
        for t in view.driver_limits:
            if t.hard_bytes == LIMIT_MAX:
                continue  # a soft limit alone, as the toolkit's hook sets for a request alone: no hard limit held
            device = devices.get(t.gpu_uuid)
            label = device.label if device is not None else t.gpu
            limits.add_metric([t.pod.namespace, t.pod.name, t.container or "", label, t.gpu_uuid], t.hard_bytes)
        yield limits
        if view.claim_source_up is not None:
            yield GaugeMetricFamily(
                "vramguard_claim_source_up",
                "1 while the claim quota source reads this node's ResourceSlices, 0 while it cannot (then pods with "
                "DRA claims fall through to the next quota source); absent without a claim: source.",
                value=1.0 if view.claim_source_up else 0.0,
            )


class Metrics:
    """Every metric the agent exports, on one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # `*_created` timestamps double the series count and say nothing an agent's restart time does not.
        # (client_python keeps this switch process-wide; the agent is the only exporter in its process.)
        disable_created_metrics()  # type: ignore[no-untyped-call]  # client_python leaves it unannotated
        self.registry = registry if registry is not None else CollectorRegistry()
        self._scan = _ScanCollector()
        self.registry.register(self._scan)
        # process_open_fds and process_max_fds: fd pressure (alert on their ratio), with the agent's CPU and memory.
        ProcessCollector(registry=self.registry)
        self.violations = Counter(
            "vramguard_violations_total",
            "Violation episodes started: a subject went above its quota (severity hard: above its hard limit).",
            ["namespace", "severity"],
            registry=self.registry,
        )
        self.actions = Counter(
            "vramguard_actions_total",
            "Actions taken, by action (warn, evict, kill) and result (ok, failed, refused, dry-run, ...).",
            ["action", "result"],
            registry=self.registry,
        )
        for kind in ActionKind:  # each action with every result it can end in (`ActionResult.ends`)
            for result in ActionResult:
                if result.ends(kind):
                    self.actions.labels(action=kind.value, result=result.value)
        self.escalations = Counter(
            "vramguard_escalations_total",
            "Repeats acted on one step further (counted when the action's outcome is known): a container killed "
            "within the cooldown and over its quota again (a supervisor respawning GPU workers), by namespace and "
            "step (kill-container, evict).",
            ["namespace", "step"],
            registry=self.registry,
        )
        self.scan_duration = Histogram(
            "vramguard_scan_duration_seconds",
            "Wall time of one scan: sample, attribute, decide, act.",
            buckets=SCAN_BUCKETS_S,
            registry=self.registry,
        )
        self.scans_failed = Counter(
            "vramguard_scans_failed_total",
            "Scans that raised (logged as scan_failed); the loop goes on with the next one.",
            registry=self.registry,
        )
        self.scan_cpu = Counter(
            "vramguard_scan_cpu_seconds_total",
            "CPU the agent process spent in scans (all its threads while a scan ran); the process's own "
            "process_cpu_seconds_total less this is what it spends between scans.",
            registry=self.registry,
        )
        self.triggered_scans = Counter(
            "vramguard_triggered_scans_total",
            "Scans run before the next poll because the watch between scans saw a GPU's used memory rise "
            "(memory-rise) or fall (memory-fall) past watch_rise, or its free memory fall into the pressure band "
            "(pressure), or because a pod update named a pod or container whose GPU memory the last scan could not "
            "attribute (pod-learned).",
            ["reason"],
            registry=self.registry,
        )
        for trigger in Trigger:
            self.triggered_scans.labels(reason=trigger.value)
        self.watch_stuck = Gauge(
            "vramguard_watch_stuck",
            f"1 while the watch between scans has waited on the driver for a reading for {WATCH_STUCK_S:g} s or more "
            "(scans only at the poll; the log says watch_stuck), 0 otherwise and without a watch.",
            registry=self.registry,
        )
        self.scan_triggers_held = Counter(
            "vramguard_scan_triggers_held_total",
            "Times a trigger had to wait for triggered_scans_per_second (allocations churning faster than that).",
            registry=self.registry,
        )
        self.events = Counter(
            "vramguard_events_total",
            "Kubernetes Events by result: written, patched (a repeat of a written one), aggregated (a repeat of a "
            "queued one), dropped (over a bound), failed (refused, or unanswered for 10 minutes).",
            ["result"],
            registry=self.registry,
        )
        for event in EventResult:
            self.events.labels(result=event.value)
        self.events_queued = Gauge(
            "vramguard_events_queued",
            "Kubernetes Events waiting to be written, the one being written included (0 once every Event is out).",
            registry=self.registry,
        )
        self.mirror_claims_refused = Gauge(
            "vramguard_pod_mirror_claims_refused",
            "Pods on this node claiming to be a static pod's mirror (kubernetes.io/config.mirror) whose claim is not "
            "believed: the node's kubelet does not run that UID under their namespace and name, or the API server "
            "gave the UID to a pod. Each is logged once (pod_mirror_claim_refused); none changes what is enforced.",
            registry=self.registry,
        )
        self.api_requests = Counter(
            "vramguard_api_requests_total",
            "LIST and WATCH requests the agent made to the API server, by resource and verb. In steady state only "
            "WATCH grows, by one per watched resource every 5 to 10 minutes; LISTs are relists (start, 410 Gone).",
            ["resource", "verb"],
            registry=self.registry,
        )
        self.driver_limit_results = Counter(
            "vramguard_driver_limits_total",
            "Driver memory limits programmed, by outcome: applied, late (applied to a container already running), "
            "unchanged (already held), toolkit (NVIDIA's container toolkit hook set one there: left alone), cleared, "
            "unsupported (the reactive modes hold that quota), failed (the first failure of a run; retried with "
            "back-off).",
            ["outcome"],
            registry=self.registry,
        )
        for limit in LimitResult:
            self.driver_limit_results.labels(outcome=limit.value)
        self.driver_limits_failing = Gauge(
            "vramguard_driver_limits_failing",
            "Driver memory limits (per cgroup and GPU) whose calls are failing now, each retried with back-off.",
            registry=self.registry,
        )
        self.nvml_errors = Counter(
            "vramguard_nvml_errors_total",
            "NVML failures and rows dropped by sanity checks, by kind.",
            ["kind"],
            registry=self.registry,
        )

        self.policy_reloads = Counter(
            "vramguard_policy_reloads_total",
            "Changes of the policy file seen, by result: applied (in force from the next scan) or invalid (refused, "
            "once per distinct content or cause: the last good policy stays in force; the log says policy_invalid, "
            "policy_refused or policy_unreadable, and why).",
            ["result"],
            registry=self.registry,
        )
        for reload in ReloadResult:
            self.policy_reloads.labels(result=reload.value)
        self.policy_invalid = Gauge(
            "vramguard_policy_invalid",
            "1 while the policy file's content is invalid or unreadable (the last good policy is in force; /status "
            "says why), 0 otherwise.",
            registry=self.registry,
        )
        self.policy_restart_needed = Gauge(
            "vramguard_policy_restart_needed",
            "1 for each policy field whose reloaded value needs a part the agent builds at start only (quota_sources, "
            "driver_limits, watch_interval): the rest of the policy is in force, that field only after a restart.",
            ["field"],
            registry=self.registry,
        )
        for name in RESTART_FIELDS:
            self.policy_restart_needed.labels(field=name).set(0)
        self.orphan_reclaims = Counter(
            "vramguard_orphan_reclaims_total",
            "Orphans acted on (the GPU processes of a pod that is gone), by result: ok (killed, memory freed), failed, "
            "nothing-to-kill, memory-not-freed, reported (the policy only reports: orphans: report, warn mode, an "
            "exempt namespace), dry-run.",
            ["result"],
            registry=self.registry,
        )
        for orphan in OrphanResult:
            self.orphan_reclaims.labels(result=orphan.value)

    def observe_scan(
        self,
        snapshot: Snapshot,
        decision: Decision,
        driver_limits: Iterable[LimitTarget] = (),
        claim_source_up: bool | None = None,
        peaks: tuple[Peak, ...] = (),
        exited: Mapping[str, HeldByExited] | None = None,
        *,
        orphaned: Mapping[str, int] | None = None,
    ) -> None:
        """Publish one scan. `orphaned`: the bytes of confirmed orphans by GPU UUID (`OrphanScan.bytes_by_gpu`)."""
        self._scan.view = ScanView(
            snapshot, decision.rows, tuple(driver_limits), claim_source_up, peaks, exited or {}, orphaned or {}
        )
        for a in decision.actions:
            # One OVER_QUOTA warning is decided per episode, so counting them counts episodes.
            if a.kind is ActionKind.WARN and a.reason is Reason.OVER_QUOTA:
                severity = "hard" if a.violation.hard else "soft"
                self.violations.labels(namespace=a.pod.namespace, severity=severity).inc()

    def count_nvml_errors(self, counts: Iterable[tuple[str, int]]) -> None:
        for kind, n in counts:
            if n:
                self.nvml_errors.labels(kind=kind).inc(n)
