"""The status document: what `GET /status` answers and `vramguard top --once --json` prints.

One JSON object: the agent's facts and its last scan's age, each GPU, and the rows of `vramguard top`
(`agent/report.py`).
Bounded: at most MAX_ROWS container rows and MAX_PROCESSES processes a row, every string cut to MAX_TEXT_CHARS,
and the rows' JSON to ROWS_BUDGET_BYTES; the rows left out are counted in "truncated". At most MAX_DESCRIBED
processes are read from /proc, each no further than it is shown, so a build costs a bounded amount whatever the
tenants' processes hold. Tenant text is carried exactly (JSON escapes it), as in `top --json`.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from vramguard.agent.report import LastScan, ScanReport, TopRow, peak_dicts, row_dict, rows_from_report
from vramguard.base.background import BackgroundLoop
from vramguard.base.clock import Clock
from vramguard.core.driver_limit import HeldLimit, LimitKey, LimitTarget
from vramguard.core.exited import HeldByExited
from vramguard.core.ports import LIMIT_MAX
from vramguard.core.sample import GpuDevice
from vramguard.core.text import cut
from vramguard.node.describe import ProcessDetail, describe_process

KIND = "VramguardStatus"
SCHEMA = 1
MAX_ROWS = 4096
MAX_PROCESSES = 64  # a row's processes beyond this are left out (its "pids" are those shown)
# Processes described (user and command) in one document; the ones after it show their PID, with "" for both.
MAX_DESCRIBED = 1024
# The rows' JSON stays within this (from the first row that would pass it, the rest are left out and counted): with
# every character escaped as \uXXXX, MAX_ROWS rows of cut text could be gigabytes. The GPUs and the agent's part are
# small (a node has a few dozen GPUs and MIG instances at most), so the body stays well under 8 MiB.
ROWS_BUDGET_BYTES = 4 * 1024 * 1024
# The peaks since the agent's start ("peaks"), bounded the same way: at most MAX_ROWS, within this much JSON.
PEAKS_BUDGET_BYTES = 2 * 1024 * 1024
CONTENT_TYPE = "application/json"


@dataclass(frozen=True, slots=True)
class AgentFacts:
    """What the document says of the agent itself, fixed for its life."""

    version: str
    node: str
    mode: str  # warn | evict | kill: the policy's mode at start (`PolicyFacts` has the one in force)
    dry_run: bool
    poll_interval_s: float


@dataclass(frozen=True, slots=True)
class DriverFacts:
    """The NVIDIA side, as `vramguard version` prints it and the document's agent part carries it: nvidia-ml-py's
    version, and once NVML is up the driver's, NVML's and whether the driver can hold per-cgroup memory limits."""

    binding_version: str  # nvidia-ml-py's
    binds_limits: bool  # whether that nvidia-ml-py binds nvmlDeviceSetMemoryLimits_v1
    driver_version: str | None = None  # None: NVML not up (`problem` says why, where known)
    nvml_version: str | None = None
    limits_possible: bool | None = None  # None: not known (not asked yet, or the driver could not say)
    limits_reason: str = ""  # why not, or where not, or why not known; "" where every GPU can
    problem: str = ""  # why NVML is not up
    nvml_library: str = ""  # the libnvidia-ml file loaded ("" where NVML is not up)


@dataclass(frozen=True, slots=True)
class PolicyFacts:
    """The policy in force, which a reload of the policy file changes: its mode, the hash of the file's content
    (None: no file), why the file's current content is refused (None: it is in force), the fields whose new
    value waits for a restart, and how many looks at the file the reloader has completed (a count that grows)."""

    mode: str
    digest: str | None = None
    invalid: str | None = None
    restart_needed: tuple[str, ...] = ()
    checks: int = 0


def policy_dict(policy: PolicyFacts) -> dict[str, object]:
    """The document's `policy` part, in its agent part."""
    return {
        "sha256": policy.digest,
        "invalid": cut(policy.invalid) if policy.invalid is not None else None,
        "restart_needed": list(policy.restart_needed),
        "checks": policy.checks,
    }


def driver_dict(driver: DriverFacts) -> dict[str, object]:
    """The document's fields of the NVIDIA side (in its agent part; `vramguard version --json` prints the same)."""
    return {
        "nvidia_ml_py": cut(driver.binding_version),
        "driver_version": None if driver.driver_version is None else cut(driver.driver_version),
        "nvml_version": None if driver.nvml_version is None else cut(driver.nvml_version),
        "driver_limits_possible": driver.limits_possible,
        "driver_limits_reason": cut(driver.limits_reason),
    }


def gpu_dict(
    device: GpuDevice,
    pressured: bool,
    held: Mapping[LimitKey, HeldLimit | LimitTarget],
    exited: HeldByExited | None = None,
    orphaned_bytes: int = 0,
) -> dict[str, object]:
    """One GPU: "limits" is "driver" when the driver holds at least one limit on it ("kernel" when the kernel's dmem
    controller does, on a DRM GPU), else "agent"; "needs_reset" when exited processes hold memory on it past a
    teardown (`core/exited.py`), with the bytes and the PIDs; "orphaned_bytes" what the processes of pods that are
    gone hold on it (`core/orphans.py`), 0 without."""
    on_it = {device.uuid, device.parent_uuid}
    limited = any(k.gpu_uuid in on_it and h.hard_bytes != LIMIT_MAX for k, h in held.items())  # a hard limit
    return {
        "gpu": cut(device.label),
        "uuid": cut(device.uuid),
        "name": cut(device.name),
        "total_bytes": device.total_bytes,
        "used_bytes": device.used_bytes,
        "free_bytes": device.free_bytes,
        "healthy": device.healthy,
        "error": cut(device.error or ""),
        "pressure": pressured,
        "limits": device.backend.holder if limited else "agent",
        "needs_reset": exited is not None,
        "held_by_exited_bytes": exited.held_bytes if exited is not None else 0,
        "held_by_exited_pids": list(exited.pids[:MAX_PROCESSES]) if exited is not None else [],
        "orphaned_bytes": orphaned_bytes,
    }


def _bounded_row(row: TopRow, describe: Callable[[int], ProcessDetail]) -> dict[str, object]:
    """The row with its first MAX_PROCESSES processes described (`describe`) and every string cut."""
    shown = tuple(describe(p.pid) for p in row.processes[:MAX_PROCESSES])
    shown = tuple(ProcessDetail(p.pid, cut(p.user), cut(p.command)) for p in shown)
    out = row_dict(replace(row, processes=shown))
    return {k: cut(v) if isinstance(v, str) else v for k, v in out.items()}


def scan_json(
    report: ScanReport | None,
    held: Mapping[LimitKey, HeldLimit | LimitTarget],
    describe: Callable[[int], ProcessDetail] = describe_process,
) -> str:
    """The document's scan part as JSON object members (`"gpus": [...], "containers": [...], "truncated": n,
    "peaks": [...], "peaks_cover_s": s`), without braces: `render` puts them after the agent's part. Processes are
    described (`describe`, which reads /proc) only for the rows kept. The peaks (`core/peaks.py` `Highest`) are
    bounded as the rows are (MAX_ROWS, every string cut)."""
    if report is None:
        return '"gpus": [], "containers": [], "truncated": 0, "peaks": [], "peaks_cover_s": 0'
    pressured = set(report.decision.pressured_devices)
    orphaned = report.orphans.bytes_by_gpu()
    gpus = [
        gpu_dict(d, d.uuid in pressured, held, report.exited.held.get(d.uuid), orphaned.get(d.uuid, 0))
        for d in report.snapshot.devices
    ]
    # Described below, for the rows kept only: a placeholder is cheap, /proc is not.
    rows = rows_from_report(report, describe=lambda pid: ProcessDetail(pid, "", ""), driver_limits=held)
    parts: list[str] = []
    size = 0
    described = itertools.count(1)

    def bounded(pid: int) -> ProcessDetail:
        return describe(pid) if next(described) <= MAX_DESCRIBED else ProcessDetail(pid, "", "")

    for row in rows[:MAX_ROWS]:
        part = json.dumps(_bounded_row(row, bounded))
        if size + len(part) > ROWS_BUDGET_BYTES:
            break
        parts.append(part)
        size += len(part) + 2
    truncated = len(rows) - len(parts)
    peaks: list[str] = []
    size = 0
    for peak in peak_dicts(report.highest)[:MAX_ROWS]:
        part = json.dumps({k: cut(v) if isinstance(v, str) else v for k, v in peak.items()})
        if size + len(part) > PEAKS_BUDGET_BYTES:
            break
        peaks.append(part)
        size += len(part) + 2
    return (
        f'"gpus": {json.dumps(gpus)}, "containers": [{", ".join(parts)}], "truncated": {truncated}, '
        f'"peaks": [{", ".join(peaks)}], "peaks_cover_s": {round(report.highest.covers_s, 3)}'
    )


def render(
    facts: AgentFacts, scan_age_s: float | None, scan_part: str, driver: DriverFacts, policy: PolicyFacts | None = None
) -> bytes:
    """The whole document: the agent's part (its scan age as of now, the NVIDIA side and the policy in force as
    known now) and a `scan_json` part."""
    agent = {
        "version": cut(facts.version),
        "node": cut(facts.node),
        "mode": policy.mode if policy is not None else facts.mode,
        "dry_run": facts.dry_run,
        "poll_interval_s": facts.poll_interval_s,
        "scan_age_s": None if scan_age_s is None else round(max(0.0, scan_age_s), 3),
        **driver_dict(driver),
        **({"policy": policy_dict(policy)} if policy is not None else {}),
    }
    head = json.dumps({"kind": KIND, "schema": SCHEMA, "agent": agent})
    return f"{head[:-1]}, {scan_part}}}".encode()


class StatusPage:
    """The agent's /status body, built from its last scan on a thread of its own (`start`/`stop`), only when asked
    and once per scan however many ask.

    `body(notify)` never builds on the caller's thread (the HTTP server's, which must answer probes meanwhile): it
    gives the document at once when the last scan's is built, else a callable that gives it (None until then) and
    asks for the build, calling `notify` (the server's `wake`) once it is done. The page is handed whom to tell with
    each ask, so it needs no pointer to the server that reads it. A reader waits for the scan that was the last when
    it asked, or a later one: scans faster than builds never starve it.
    """

    def __init__(
        self,
        facts: AgentFacts,
        last_scan: Callable[[], LastScan | None],
        clock: Clock,
        describe: Callable[[int], ProcessDetail] = describe_process,
        *,
        driver: Callable[[], DriverFacts],
        policy: Callable[[], PolicyFacts | None] = lambda: None,
    ) -> None:
        self.facts = facts
        self.policy = policy  # the policy in force now (None: the one in `facts`, for the agent's life)
        self.last_scan = last_scan
        self.driver = driver  # the NVIDIA side as the agent knows it now; asks NVML nothing
        self.clock = clock  # the agent's: `LastScan.finished_at` is on its scale
        self.describe = describe
        self._cond = threading.Condition()
        self._built_for: LastScan | None = None
        self._scan_part = scan_json(None, {})
        self._wanted = False
        self._notify: set[Callable[[], None]] = set()  # whom to tell once the build asked for is done
        self._loop = BackgroundLoop("vramguard-status", self._step, clock=clock, wake=self._wake)
        self.builds = 0  # scan parts built, for tests

    def start(self) -> None:
        self._loop.start()

    def stop(self, deadline: float) -> None:
        """Stop building; a build under way (bounded: MAX_DESCRIBED reads) is waited for until `deadline` at most."""
        self._loop.stop(deadline)

    def body(self, notify: Callable[[], None]) -> bytes | Callable[[], bytes | None]:
        scan = self.last_scan()
        ready = self._ready(scan, notify)
        if ready is not None:
            return ready
        return lambda: self._ready(scan, notify)

    def _ready(self, scan: LastScan | None, notify: Callable[[], None]) -> bytes | None:
        """The document of `scan` or a later scan, if built; else None, its build asked for and `notify` told once
        it is done."""
        with self._cond:
            built = self._built_for
            if scan is not None and scan is not built and (built is None or built.finished_at <= scan.finished_at):
                self._wanted = True
                self._notify.add(notify)
                self._cond.notify()
                return None
            part = self._scan_part
        age = None if built is None else self.clock.now() - built.finished_at
        return render(self.facts, age, part, self.driver(), self.policy())

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _step(self) -> float:
        """The thread's round: wait until a reader asks for a build (or the stop), then `build`."""
        with self._cond:
            while not self._wanted and not self._loop.stopping.is_set():
                self._cond.wait()
        if not self._loop.stopping.is_set():
            self.build()
        return 0.0

    def build(self) -> None:
        """Where a reader asked for a document not built yet, build the last scan's (it serves every reader waiting
        for an older scan too) and tell those who asked."""
        with self._cond:
            wanted, self._wanted = self._wanted, False
            notify, self._notify = self._notify, set()
        scan = self.last_scan()
        if wanted and scan is not None and scan is not self._built_for:
            part = scan_json(scan.report, scan.held, self.describe)
            with self._cond:
                self._scan_part, self._built_for = part, scan
                self.builds += 1
        for told in notify:  # a reader told with nothing new built asks again, and so asks for a build again
            told()
