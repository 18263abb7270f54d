"""`vramguard top`: one row per (GPU, container) from a scan, as a table or as JSON (in the status document,
`status.py`).

Like nvitop, it says whose each GPU process is and what it runs: its user and command line, read from /proc at
display time (`describe_process`), never further than what is shown. They are for people, never for decisions: a
process may have exited, or its PID been reused, between the scan and the read.

Names, commands and claims are tenant text: the table shows their control and bidi characters escaped
(`text.printable`), the JSON carries them exactly (a command line cut at COMMAND_CHARS, with a marker saying so).
"""

from __future__ import annotations

import functools
import os
import pwd
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

from vramguard.agent import ScanReport
from vramguard.model import SubjectKey, Violation
from vramguard.procfs import EXITED_STATES, is_gone_error, read_head, read_real_uid, read_stat
from vramguard.text import cut, cut_head, format_bytes, printable

COMMAND_CHARS = 1024  # a command line is cut to this (with a marker saying so): a tenant controls its length
TABLE_COMMAND_CHARS = 80  # and its escaped text to this in the table, to keep a row on a screen


@dataclass(frozen=True, slots=True)
class ProcessDetail:
    pid: int
    user: str  # "?" when it cannot be read
    # The arguments joined by spaces, exactly as the kernel holds them up to COMMAND_CHARS; "[name]" for a process
    # without arguments (a kernel thread), "(gone)" when the process exited, "?" when it cannot be read.
    command: str


def describe_process(pid: int, proc_root: str = "/proc") -> ProcessDetail:
    """The user and command line of `pid`, the command line read no further than COMMAND_CHARS can show."""
    return _describe(pid, proc_root, command_line=True)


def describe_process_name(pid: int, proc_root: str = "/proc") -> ProcessDetail:
    """`describe_process` with the program's name ("[python3]") instead of its arguments, which may hold secrets:
    what `/status` shows to whoever can read it, unless the agent runs with `--status-command-lines`. The
    arguments are never read."""
    return _describe(pid, proc_root, command_line=False)


def describer(proc_root: str, command_lines: bool) -> Callable[[int], ProcessDetail]:
    """`describe_process` (or `describe_process_name`, without `command_lines`) over `proc_root`."""
    return functools.partial(describe_process if command_lines else describe_process_name, proc_root=proc_root)


def _describe(pid: int, proc_root: str, *, command_line: bool) -> ProcessDetail:
    """Every read is bounded whatever the process holds: its stat, the head of its status, its comm, and at most
    `_COMMAND_BYTES` of its command line."""
    gone = ProcessDetail(pid, "?", "(gone)")
    try:
        state = read_stat(pid, proc_root)
        if state is None or state[0] in EXITED_STATES:
            return gone
        uid = read_real_uid(pid, proc_root)
        if uid is None:
            return gone
        user = cut(_user_name(uid), 32)
        args = read_head(f"{proc_root}/{pid}/cmdline", _COMMAND_BYTES + 1) if command_line else b""
        if args:
            return ProcessDetail(pid, user, _command_text(args))
        name = read_head(f"{proc_root}/{pid}/comm", 64)  # a kernel thread has no arguments: its name, as ps shows
    except OSError as e:
        return gone if is_gone_error(e) else ProcessDetail(pid, "?", "?")
    if name is None:
        return gone
    program = os.fsdecode(name.rstrip(b"\n"))
    return ProcessDetail(pid, user, f"[{cut(program, 64)}]")


# Enough bytes for COMMAND_CHARS characters of any text: a character decodes from at most 4 bytes of UTF-8, and an
# undecodable byte is one character of its own.
_COMMAND_BYTES = 4 * COMMAND_CHARS


def _command_text(args: bytes) -> str:
    """The arguments joined by spaces, exactly as the kernel holds them up to COMMAND_CHARS (undecodable bytes kept
    as surrogates); cut with a marker saying so where there was more than was read."""
    whole = len(args) <= _COMMAND_BYTES
    text = os.fsdecode(args[:_COMMAND_BYTES].removesuffix(b"\0") if whole else args[:_COMMAND_BYTES])
    text = text.replace("\0", " ")
    return cut(text, COMMAND_CHARS) if whole else cut_head(text, COMMAND_CHARS)


@functools.lru_cache(maxsize=256)
def _user_name(uid: int) -> str:
    """The name the agent's own user database gives `uid`, else the number (psutil's rule)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


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
    # Who holds the quota: "driver" (its hard limit on the container's cgroup, R615+: an allocation beyond it
    # fails), "driver:pod" (only the pod's cgroup holds one: the container's own is missing), "agent" (the
    # reactive modes alone: where the driver holds limits, a container running without its own), "-" without one.
    held_by: str = "-"
    claim: str = ""  # the DRA claim(s) the quota comes from, when it is a claim share
    quota_source: str = ""  # the quota's `Quota.source`, e.g. "limits[vramguard.io/vram]"; "" without a quota

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(p.pid for p in self.processes)

    @property
    def percent(self) -> float | None:
        return 100.0 * self.used_bytes / self.quota_bytes if self.quota_bytes else None


def rows_from_report(
    report: ScanReport,
    describe: Callable[[int], ProcessDetail] = describe_process,
    driver_limits: Mapping[SubjectKey, object] | None = None,
) -> list[TopRow]:
    """The rows of one scan; `driver_limits` (`limiter.read_held_limits`, or the agent's `DriverLimiter.held`)
    says which quotas the driver holds."""
    snap, quotas = report.snapshot, report.quotas
    held = driver_limits or {}
    # A container's violation: its own, its pod's (pod-wide quota), or its share's (containers holding one DRA
    # share are one subject).
    violated: dict[tuple[str, str | None, str], Violation] = {v.key: v for v in report.decision.violations}
    violated |= {(v.pod.uid, cid, v.device.uuid): v for v in report.decision.violations for cid in v.container_ids}
    rows: list[TopRow] = []
    for u in snap.containers:
        device = snap.device(u.device_uuid)
        if device is None:
            continue
        pq = quotas.get(u.pod.uid)
        own = pq.own(u.container, u.device_uuid) if pq is not None and u.container else None
        quota = own if own is not None else (pq.pod if pq is not None else None)
        v = violated.get((u.pod.uid, u.container if own is not None else None, u.device_uuid))
        if v is None and u.container_id is not None:
            v = violated.get((u.pod.uid, u.container_id, u.device_uuid))
        if quota is None:
            state = "unmanaged"
        elif v is None:
            state = "ok"
        else:
            state = "over-hard" if v.hard else "over-soft"
        key = SubjectKey(u.pod.uid, u.container if own is not None else None, u.device_uuid)
        pod_key = SubjectKey(u.pod.uid, None, u.device_uuid)
        held_by = "-" if quota is None else "driver" if key in held else "driver:pod" if pod_key in held else "agent"
        rows.append(
            TopRow(
                gpu=device.label,
                namespace=u.pod.namespace,
                pod=u.pod.name,
                container=u.container or "?",
                processes=tuple(describe(p.pid) for p in u.processes),
                used_bytes=u.used_bytes,
                quota_bytes=quota.limit_for(device.total_bytes) if quota is not None else None,
                state=state,
                held_by=held_by,
                claim=(quota.claim or "") if quota is not None else "",
                quota_source=quota.source if quota is not None else "",
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
                processes=(describe(p.process.pid),),
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
    """One line per container and GPU; a container's further processes on lines of their own below it."""
    header: tuple[str, ...] = (
        "GPU",
        "NAMESPACE",
        "POD",
        "CONTAINER",
        "USED",
        "QUOTA",
        "%",
        "STATE",
        "HELD-BY",
        "CLAIM",
        "PID",
        "USER",
        "COMMAND",
    )
    lines: list[tuple[str, ...]] = [header]
    for r in rows:
        first, *rest = r.processes or (ProcessDetail(0, "", ""),)
        lines.append(
            (
                r.gpu,
                r.namespace,
                r.pod,
                r.container,
                format_bytes(r.used_bytes),
                format_bytes(r.quota_bytes) if r.quota_bytes is not None else "-",
                f"{r.percent:.0f}" if r.percent is not None else "-",
                r.state,
                r.held_by,
                r.claim,
                str(first.pid) if r.processes else "-",
                first.user,
                cut(printable(first.command), TABLE_COMMAND_CHARS),
            )
        )
        lines.extend(
            ("", "", "", "", "", "", "", "", "", "", str(p.pid), p.user, cut(printable(p.command), TABLE_COMMAND_CHARS))
            for p in rest
        )
    if not rows:
        lines.append(("-", "", "", "", "", "", "", "no GPU processes", "", "", "", "", ""))
    if not any(r.claim for r in rows):  # the CLAIM column only where DRA claims give quotas
        at = header.index("CLAIM")
        lines = [line[:at] + line[at + 1 :] for line in lines]
        header = lines[0]
    # Tenant text: nothing raw on a terminal; the widths are those of the escaped text (a command's is already).
    lines = [tuple(printable(cell) for cell in line) for line in lines]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def row_dict(row: TopRow) -> dict[str, object]:
    """The row as JSON takes it, its text exact (json escapes controls and non-ASCII characters itself); the
    status document's (`status.py`) "containers" are these."""
    return {**asdict(row), "pids": list(row.pids), "percent": row.percent}
