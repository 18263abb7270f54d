"""Memory with no process: GPU memory NVML still lists under PIDs that have exited, held past a teardown.

The driver frees a process's memory as it tears the process's contexts down, while the process is reaped: 79-141
ms measured on an H100 from SIGKILL to the reap, 1 GiB or 20 GiB alike (docs/scale.md, "Benchmarks").
A PID that NVML lists and /proc does not have (`UnattributedReason.PROCESS_EXITED`) is that teardown caught
mid-way, or memory the driver holds for a process that is gone for good, which only a GPU reset frees: there is no
process left to signal, so the agent never tries. `ExitedTracker` tells the two apart by time: the bytes an exited
PID has held on a GPU for `EXITED_HOLD_S` or longer make that GPU need a reset; a PID whose memory vanishes sooner
was a teardown and raises nothing. A PID that exists again (reused by a new process) is attributed to that process
and ends its record: the tracker under-reports then, never over-reports.

    exited = tracker.observe(snapshot.unattributed, now)  # after each scan, at the scan's time
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from vramguard.core.snapshot import UnattributedProcess, UnattributedReason

# A teardown takes well under a second, a few seconds for a context with much host-mapped memory; 60 s is two
# orders of magnitude past the slowest, so a PID still listed then is not being torn down. It is also one scrape
# interval at Prometheus' default: a fault shows within about two minutes of the process's exit.
EXITED_HOLD_S = 60.0
# (GPU, PID) pairs followed at once. NVML's process lists bound a scan's rows already; the bound keeps the first
# seen past it (the ones closest to the threshold), and a pair left out is followed once room frees.
MAX_EXITED_TRACKED = 4096


@dataclass(frozen=True, slots=True)
class HeldByExited:
    """One GPU whose memory exited processes have held for `EXITED_HOLD_S` or longer: it needs a reset."""

    device_uuid: str
    held_bytes: int  # by the exited PIDs past the threshold (one still inside it is not counted yet)
    pids: tuple[int, ...]  # those PIDs, sorted
    since: float  # when the earliest of them was first seen exited, on the scan's clock


@dataclass(frozen=True, slots=True)
class ExitedScan:
    """What one scan found of memory held by exited processes."""

    held: Mapping[str, HeldByExited] = field(default_factory=lambda: MappingProxyType({}))  # by device UUID
    onsets: tuple[HeldByExited, ...] = ()  # the GPUs in `held` that were not at the previous scan: one Event each
    cleared: tuple[str, ...] = ()  # device UUIDs held at the previous scan and not now (reset, or the PID reused)


class ExitedTracker:
    """`observe(unattributed, now)` after each scan: when each exited PID was first seen holding memory on a GPU,
    and which GPUs that makes need a reset. The loop owns it; nothing here reads a clock."""

    def __init__(self, hold_s: float = EXITED_HOLD_S, max_tracked: int = MAX_EXITED_TRACKED) -> None:
        if hold_s < 0 or max_tracked < 1:
            raise ValueError("need hold_s >= 0 and max_tracked >= 1")
        self.hold_s = hold_s
        self.max_tracked = max_tracked
        self._first_seen: dict[tuple[str, int], float] = {}  # (device UUID, PID) → first scan that saw it exited
        self._held: frozenset[str] = frozenset()  # the GPUs that needed a reset at the previous scan

    def tracked(self) -> int:
        """(GPU, PID) pairs followed now."""
        return len(self._first_seen)

    def observe(self, unattributed: Iterable[UnattributedProcess], now: float) -> ExitedScan:
        """Take one scan's unattributed rows at `now`; a pair not among them this scan is forgotten (its memory
        was released, or its PID belongs to a live process again)."""
        rows = [
            u for u in unattributed if u.reason is UnattributedReason.PROCESS_EXITED and u.used_bytes > 0
        ]  # a row whose bytes NVML does not give (NOT_AVAILABLE, 0 here) says nothing of memory held
        first_seen: dict[tuple[str, int], float] = {}
        for u in rows:  # pairs followed already first: past the bound, the new ones wait
            key = (u.device_uuid, u.process.pid)
            if key in self._first_seen:
                first_seen[key] = self._first_seen[key]
        for u in rows:
            key = (u.device_uuid, u.process.pid)
            if key not in first_seen and len(first_seen) < self.max_tracked:
                first_seen[key] = now
        self._first_seen = first_seen

        pids: dict[str, list[int]] = {}
        held_bytes: dict[str, int] = {}
        since: dict[str, float] = {}
        for u in rows:
            key = (u.device_uuid, u.process.pid)
            first = first_seen.get(key)
            if first is None or now - first < self.hold_s:
                continue
            pids.setdefault(u.device_uuid, []).append(u.process.pid)
            held_bytes[u.device_uuid] = held_bytes.get(u.device_uuid, 0) + u.used_bytes
            since[u.device_uuid] = min(since.get(u.device_uuid, first), first)
        held = {
            uuid: HeldByExited(uuid, held_bytes[uuid], tuple(sorted(set(p))), since[uuid])
            for uuid, p in sorted(pids.items())
        }
        onsets = tuple(h for uuid, h in held.items() if uuid not in self._held)
        cleared = tuple(sorted(self._held - held.keys()))
        self._held = frozenset(held)
        return ExitedScan(MappingProxyType(held), onsets, cleared)


NOTHING_HELD = ExitedScan()
