"""`vramguard top`: one row per (GPU, container) from a scan, as a table or as JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from vramguard.agent import ScanReport
from vramguard.model import format_bytes


@dataclass(frozen=True, slots=True)
class TopRow:
    gpu: str
    namespace: str
    pod: str
    container: str
    pids: tuple[int, ...]
    used_bytes: int
    quota_bytes: int | None
    state: str  # ok | over-soft | over-hard | unmanaged | unattributed: <why> | gpu-unhealthy: <error>

    @property
    def percent(self) -> float | None:
        return 100.0 * self.used_bytes / self.quota_bytes if self.quota_bytes else None


def rows_from_report(report: ScanReport) -> list[TopRow]:
    snap, quotas = report.snapshot, report.quotas
    violated = {(v.pod.uid, v.container, v.device.uuid): v for v in report.decision.violations}
    rows: list[TopRow] = []
    for u in snap.containers:
        device = snap.device(u.device_uuid)
        if device is None:
            continue
        pq = quotas.get(u.pod.uid)
        own = pq.containers.get(u.container) if pq is not None else None
        quota = own if own is not None else (pq.pod if pq is not None else None)
        v = violated.get((u.pod.uid, u.container if own is not None else None, u.device_uuid))
        if quota is None:
            state = "unmanaged"
        elif v is None:
            state = "ok"
        else:
            state = "over-hard" if v.hard else "over-soft"
        rows.append(
            TopRow(
                gpu=device.label,
                namespace=u.pod.namespace,
                pod=u.pod.name,
                container=u.container or "?",
                pids=tuple(p.pid for p in u.processes),
                used_bytes=u.used_bytes,
                quota_bytes=quota.limit_for(device.total_bytes) if quota is not None else None,
                state=state,
            )
        )
    for p in snap.unattributed:
        device = snap.device(p.device_uuid)
        rows.append(
            TopRow(
                gpu=device.label if device else p.device_uuid,
                namespace="-",
                pod="-",
                container="-",
                pids=(p.process.pid,),
                used_bytes=p.used_bytes,
                quota_bytes=None,
                state=f"unattributed: {p.reason}",
            )
        )
    for d in snap.devices:
        if not d.healthy:
            rows.append(TopRow(d.label, "-", "-", "-", (), 0, None, f"gpu-unhealthy: {d.error}"))
    return sorted(rows, key=lambda r: (r.gpu, r.namespace, r.pod, r.container))


def render_table(rows: Sequence[TopRow]) -> str:
    header = ("GPU", "NAMESPACE", "POD", "CONTAINER", "PIDS", "USED", "QUOTA", "%", "STATE")
    lines = [header] + [
        (
            r.gpu,
            r.namespace,
            r.pod,
            r.container,
            ",".join(map(str, r.pids)) or "-",
            format_bytes(r.used_bytes),
            format_bytes(r.quota_bytes) if r.quota_bytes is not None else "-",
            f"{r.percent:.0f}" if r.percent is not None else "-",
            r.state,
        )
        for r in rows
    ]
    if not rows:
        lines.append(("-", "", "", "", "", "", "", "", "no GPU processes"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def render_json(rows: Sequence[TopRow]) -> str:
    return json.dumps([{**asdict(r), "pids": list(r.pids), "percent": r.percent} for r in rows])
