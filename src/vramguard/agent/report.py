"""What one scan found and did (`ScanReport`), the agent's last one (`LastScan`), and its rows, one per (GPU,
container): what `vramguard top` shows and `/status` carries (`http/status.py`).

Names, commands and claims are tenant text: the rows carry them exactly; whoever shows them escapes them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field

from vramguard.agent.act import Outcome
from vramguard.core.decide import Decision
from vramguard.core.driver_limit import HeldLimit, LimitKey, LimitSetter, LimitTarget, holds_quota
from vramguard.core.exited import NOTHING_HELD, ExitedScan
from vramguard.core.orphans import NO_ORPHANS, OrphanScan
from vramguard.core.peaks import Highest
from vramguard.core.quota import PodQuota, RowQuota
from vramguard.core.snapshot import Snapshot, UnattributedReason
from vramguard.node.describe import ProcessDetail, describe_process

# The container cell of a static pod the API server holds no mirror of: its containers are unknown.
MIRRORLESS = "(static pod, no mirror)"


@dataclass(frozen=True, slots=True)
class ScanReport:
    snapshot: Snapshot
    quotas: Mapping[str, PodQuota]
    decision: Decision
    outcomes: tuple[Outcome, ...]
    duration_s: float
    highest: Highest = field(
        default_factory=Highest
    )  # each subject's highest usage since the agent's first scan (`core/peaks.py`)
    exited: ExitedScan = NOTHING_HELD  # the GPUs whose memory exited processes hold past a teardown (`core/exited.py`)
    orphans: OrphanScan = NO_ORPHANS  # the processes of pods that are gone (`core/orphans.py`)


@dataclass(frozen=True, slots=True)
class LastScan:
    """The agent's last completed scan, for /status (`status.StatusPage`): replaced whole after each scan, so the
    HTTP thread reads it without a lock; nothing in it is changed once built."""

    report: ScanReport
    held: Mapping[LimitKey, LimitTarget]  # the limits the driver held as the scan reported (the limiter's record)
    finished_at: float  # on the agent's clock


@dataclass(frozen=True, slots=True)
class TopRow:
    gpu: str
    namespace: str
    pod: str
    container: str
    processes: tuple[ProcessDetail, ...]
    used_bytes: int
    quota_bytes: int | None
    state: str  # ok | over-soft | over-hard | unmanaged | unattributed: <why> | gpu-unhealthy: <error>
    # Who holds the quota: "driver" (the agent's hard limit on the container's cgroup, R615+: an allocation beyond
    # it fails), "driver:toolkit" (the driver holds the container's cgroup within the quota by the limit NVIDIA's
    # container toolkit hook set from NVIDIA_GPU_MEMORY_*, which the agent leaves alone), "driver:pod" (only the
    # pod's cgroup holds one: the container's own is missing), "agent" (the reactive modes alone: where the driver
    # holds limits, a container running without its own, or with only a soft limit or a looser one the toolkit
    # set), "-" without one. On a DRM GPU (AMD, Intel) the kernel's dmem controller holds the limit: "kernel",
    # "kernel:pod".
    held_by: str = "-"
    claim: str = ""  # the DRA claim(s) the quota comes from, when it is a claim share
    quota_source: str = ""  # the quota's `Quota.source`, e.g. "limits[vramguard.io/vram]"; "" without a quota
    reason: str = ""  # an unattributed row's `UnattributedReason` (the metric's `reason` label); "" for the others

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(p.pid for p in self.processes)

    @property
    def percent(self) -> float | None:
        return 100.0 * self.used_bytes / self.quota_bytes if self.quota_bytes else None


def rows_from_report(
    report: ScanReport,
    describe: Callable[[int], ProcessDetail] = describe_process,
    driver_limits: Mapping[LimitKey, HeldLimit | LimitTarget] | None = None,
) -> list[TopRow]:
    """The rows of one scan, each with the subject and quota the decision found for it (`Decision.rows`);
    `driver_limits` (`limiter.read_held_limits`, or the agent's `DriverLimiter.held`) says which quotas the driver
    holds, and who set each limit."""
    snap = report.snapshot
    held = driver_limits or {}
    violated = {v.key: v for v in report.decision.violations}
    rows: list[TopRow] = []
    for u, governing in report.decision.rows:
        device = snap.device(u.device_uuid)
        if device is None:
            continue
        quota = governing.quota if governing is not None else None
        v = violated.get(governing.subject) if governing is not None else None
        if governing is None:
            state, held_by = "unmanaged", "-"
        else:
            state = "ok" if v is None else "over-hard" if v.hard else "over-soft"
            pod_key = LimitKey(u.pod.uid, None, u.device_uuid)
            held_by = _held_by(held, governing, pod_key, device.total_bytes, device.backend.holder)
        rows.append(
            TopRow(
                gpu=device.label,
                namespace=u.pod.namespace,
                pod=u.pod.name,
                container=u.container or (MIRRORLESS if u.pod.mirrorless else "?"),
                processes=tuple(describe(p.pid) for p in u.processes),
                used_bytes=u.used_bytes,
                quota_bytes=quota.limit_for(device.total_bytes) if quota is not None else None,
                state=state,
                held_by=held_by,
                claim=(quota.claim or "") if quota is not None else "",
                quota_source=quota.source if quota is not None else "",
            )
        )
    # An orphan's rows name its pod as the agent last saw it, else by the UID its cgroup names.
    orphans = {o.pod_uid: o.known for o in report.orphans.orphans}
    for p in snap.unattributed:
        device = snap.device(p.device_uuid)
        namespace, pod_name = "-", "-"
        if p.reason is UnattributedReason.ORPHANED and p.cgroup is not None:
            known = orphans.get(p.cgroup.pod_uid)
            namespace, pod_name = (known.namespace, known.name) if known is not None else ("-", p.cgroup.pod_uid)
        rows.append(
            TopRow(
                gpu=device.label if device else p.device_uuid,
                namespace=namespace,
                pod=pod_name,
                container="-",
                processes=(describe(p.process.pid),),
                used_bytes=p.used_bytes,
                quota_bytes=None,
                state=f"unattributed: {p.reason.why}",
                reason=p.reason.value,
            )
        )
    for d in snap.devices:
        if not d.healthy:
            rows.append(TopRow(d.label, "-", "-", "-", (), 0, None, f"gpu-unhealthy: {d.error}"))
    return sorted(rows, key=lambda r: (r.gpu, r.namespace, r.pod, r.container))


def _held_by(
    held: Mapping[LimitKey, HeldLimit | LimitTarget],
    governing: RowQuota,
    pod_key: LimitKey,
    total_bytes: int,
    holder: str = "driver",
) -> str:
    """Who holds a row's quota (`TopRow.held_by`): the limit on its holder's cgroup where `holder` holds one (NVIDIA's
    "driver", or for a DRM GPU the "kernel"'s dmem controller; the toolkit's only where it keeps the cgroup within
    the quota's hard limit), else the pod's cgroup's, else the agent."""
    own = held.get(governing.limit_key)
    if own is not None and own.set_by is LimitSetter.AGENT:
        return holder
    if own is not None and holds_quota(own.hard_bytes, governing.quota.hard_for(total_bytes)):
        return f"{holder}:toolkit"
    return f"{holder}:pod" if pod_key in held else "agent"


def row_dict(row: TopRow) -> dict[str, object]:
    """The row as JSON takes it, its text exact (json escapes controls and non-ASCII characters itself); the
    status document's (`status.py`) "containers" are these."""
    return {**asdict(row), "pids": list(row.pids), "percent": row.percent}


def peak_dicts(highest: Highest) -> list[dict[str, object]]:
    """Each subject's highest usage since the agent's first scan, as the status document's "peaks" carry it: with
    the pod's controller (`owner`, e.g. "ReplicaSet/web-7d9f"), so a reader can tell the workload of a pod since
    gone. Sorted as the rows are."""
    rows = [
        {
            "gpu": p.gpu,
            "gpu_uuid": p.device_uuid,
            "namespace": p.pod.namespace,
            "pod": p.pod.name,
            "owner": p.pod.owner or "",
            "container": p.container,
            "peak_bytes": p.peak_bytes,
        }
        for p in highest.peaks
    ]
    return sorted(rows, key=lambda r: (str(r["gpu"]), str(r["namespace"]), str(r["pod"]), str(r["container"])))
