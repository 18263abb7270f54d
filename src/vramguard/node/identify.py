"""Identify: which container and pod each GPU process belongs to, read from /proc and cached.

`ProcIdentifier` implements the `ProcessIdentifier` seam: it reads /proc/<pid>/stat (the start time, which with
the PID makes a reuse-proof `ProcessRef`) and /proc/<pid>/cgroup (placed by `cgroup.place_cgroup` in a pod and
container of this node's kubelet, a look-alike of one, or neither), and keeps a cache keyed by (pid, start time),
so a warm scan parses no cgroup file while a recycled PID (same number, new start time) is read afresh. Once per
scan::

    identities = identifier.scan(p.pid for p in sample.processes)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from vramguard.core.process import Identity, ProcessRef
from vramguard.node.cgroup import HOST_KUBELET, KubeletTree, parse_cgroup, place_cgroup
from vramguard.node.procfs import (
    PidCursor,
    boot_ticks,
    holds_device,
    list_pids,
    read_cgroup,
    read_pid_cursor,
    read_stat,
    read_stat_start_token,
    same_pid_namespace,
)

# A process can be replaced by a recycled PID between the reads of its stat and cgroup files; after this many
# inconsistent attempts it is treated as gone for this scan (the next scan reads it again).
_MAX_READ_ATTEMPTS = 3

# The kernel's RESERVED_PIDS: once the cursor has wrapped, PIDs are handed out from here to pid_max - 1.
RESERVED_PIDS = 300

PidWindow = tuple[int, int]
"""(A, B): every PID handed out between two cursor readings lies in the cyclic interval (A, B]; A == B: none."""


def new_pid_window(before: PidCursor | None, after: PidCursor | None) -> PidWindow | None:
    """Where the PIDs handed out between two cursor readings can be, or None when that cannot be bounded.

    Pure. None (re-validate everything) for a first reading, a failed one, a changed pid_max, a fork count that
    went backwards, and whenever the cursor may have gone a whole lap: the cursor has to pass every number of
    the ring for that, each one either handed out in between (a fork, counted) or skipped because in use (at
    most 3 per task: its PID, and the process group and session IDs it may keep alive). The trusted bound on
    that, 2 x forks + 3 x tasks, must stay under half the ring: the other half is the margin that forks failing
    after their PID was handed out (see ProcIdentifier) would have to burn, uncounted, between two scans.
    """
    if before is None or after is None or before.pid_max != after.pid_max:
        return None
    forks = after.forks - before.forks
    if forks < 0:
        return None
    a, b = before.last_pid, after.last_pid
    if a == b:
        # Forks elsewhere that did not move this namespace's cursor, or a whole lap: only no forks is safe.
        return (a, b) if forks == 0 else None
    ring = before.pid_max - RESERVED_PIDS
    if 2 * forks + 3 * before.tasks >= ring // 2:
        return None
    return (a, b)


def in_pid_window(pid: int, window: PidWindow) -> bool:
    """Whether `pid` lies in the cyclic interval (A, B] (wrapping past pid_max when B < A; empty when A == B)."""
    low, high = window
    return low < pid <= high if low <= high else (pid > low or pid <= high)


@dataclass(slots=True)
class _Entry:
    stat_path: str  # precomputed: formatting it is a measurable part of a stat check
    start_token: bytes  # field 22 of stat as the kernel wrote it
    identity: Identity
    # Read within the clock tick the process started in: a process handed its PID later in that same tick would
    # have the same start time, so a stat check cannot vouch for this entry; it is re-read instead.
    same_tick: bool


class ProcIdentifier:
    """Reads and caches the identity of host processes: (pid, start time) → cgroup identity. Holds no fds.

    A scan re-reads (through /proc/<pid>/stat) only the cached entries whose PID the kernel may have handed out
    since the previous scan (the PID cursor), plus `audit_per_scan` of the least recently checked; the cursor
    is used only when `proc_root` is of the agent's own PID namespace. Why that keeps every entry true, and what
    can defeat it: `docs/architecture.md` "Identifying GPU processes". The killer never relies on this cache: it
    re-reads the cgroup right before signalling. `kubelet`: where this node's kubelet makes pod cgroups.
    """

    def __init__(
        self,
        proc_root: str = "/proc",
        max_entries: int = 65536,
        *,
        use_pid_cursor: bool | None = None,
        audit_per_scan: int = 2,
        kubelet: KubeletTree = HOST_KUBELET,
    ) -> None:
        self._proc_root = proc_root.rstrip("/") or "/"
        self._kubelet = kubelet
        self._max_entries = max_entries
        self._use_cursor = same_pid_namespace(self._proc_root) if use_pid_cursor is None else use_pid_cursor
        self._audit_per_scan = audit_per_scan
        self._cursor: PidCursor | None = None  # the reading of the last scan that completed
        self._cache: dict[int, _Entry] = {}  # in order of the last stat check: the front is audited next
        self._hits = 0
        self._misses = 0
        self._stat_checks = 0
        self._full_checks = 0

    @property
    def hits(self) -> int:
        """Lookups answered from the cache (no cgroup read; at most one stat read)."""
        return self._hits

    @property
    def misses(self) -> int:
        """Lookups that read and parsed /proc/<pid>/cgroup: new processes, recycled PIDs, and entries a start
        time cannot vouch for (`docs/architecture.md` "Same tick")."""
        return self._misses

    @property
    def stat_checks(self) -> int:
        """Cached entries checked by re-reading their stat start time (hit or not): in the cursor's window,
        audited, in a scan the cursor could not bound, or looked up with `identify()`."""
        return self._stat_checks

    @property
    def full_checks(self) -> int:
        """Scans that checked every cached entry through stat (no cursor, first scan, or a possible lap)."""
        return self._full_checks

    @property
    def cache_size(self) -> int:
        return len(self._cache)

    @property
    def uses_pid_cursor(self) -> bool:
        """Whether scans skip the stat check of entries whose PID the kernel cannot have handed out again."""
        return self._use_cursor

    def identify(self, pid: int) -> Identity | None:
        """The process's (ProcessRef, cgroup identity), or None when the process is gone. Checks through stat."""
        entry = self._cache.get(pid)
        if entry is not None:
            if not entry.same_tick:
                self._stat_checks += 1
                if read_stat_start_token(entry.stat_path) == entry.start_token:
                    self._hits += 1
                    return entry.identity
            del self._cache[pid]
        return self._read(pid)

    def scan(self, pids: Iterable[int]) -> dict[int, Identity]:
        """Identify every pid of one scan, and forget the cached ones that were not asked about.

        `pids` must come from a sample taken before this call (`docs/architecture.md` "Why an entry outside (A, B] needs
        no check"). Forgetting is what bounds the cache: it holds at most the processes of the latest scan. Gone
        processes are absent from the result (attribution reports them as "process gone").
        """
        found: dict[int, Identity] = {}
        cache = self._cache
        cursor = read_pid_cursor(self._proc_root) if self._use_cursor else None
        window = new_pid_window(self._cursor, cursor)
        if window is None:
            self._full_checks += 1
            check_all, low, high, wrapped = True, 0, 0, False
        else:
            check_all, (low, high) = False, window
            wrapped = low > high
        audit = set(itertools.islice(cache, self._audit_per_scan)) if not check_all else set()
        hits = 0
        try:
            for pid in pids:
                if pid in found:
                    continue
                entry = cache.get(pid)
                if entry is not None:
                    # The warm path (once per GPU process per scan): in_pid_window() written out.
                    if not (
                        check_all or ((pid > low or pid <= high) if wrapped else low < pid <= high) or pid in audit
                    ):
                        hits += 1
                        found[pid] = entry.identity
                        continue
                    if entry.same_tick:
                        del cache[pid]
                        entry = None  # a start time cannot vouch for it: read it afresh below
                if entry is not None:
                    self._stat_checks += 1
                    del cache[pid]
                    if read_stat_start_token(entry.stat_path) == entry.start_token:
                        hits += 1
                        found[pid] = entry.identity
                        cache[pid] = entry  # re-inserted at the end: the audit goes round robin
                        continue
                identity = self._read(pid)
                if identity is not None:
                    found[pid] = identity
        finally:
            self._hits += hits
        # Every PID found is cached, so equal sizes mean nothing to forget (unless max_entries evicted some).
        if len(cache) != len(found) or len(found) >= self._max_entries:
            self.forget_except(found)
        if cursor is not None:
            self._cursor = cursor  # only now: every entry inside the window has been checked
        return found

    def forget_except(self, pids: Iterable[int]) -> None:
        """Drop the cached processes not in `pids` (the ones the latest scan saw): this bounds the cache."""
        keep = pids if isinstance(pids, (AbstractSet, Mapping)) else set(pids)
        for pid in [pid for pid in self._cache if pid not in keep]:
            del self._cache[pid]

    def _read(self, pid: int) -> Identity | None:
        stat_path = f"{self._proc_root}/{pid}/stat"
        for _ in range(_MAX_READ_ATTEMPTS):
            now_ticks = boot_ticks()  # before the reads: the tick they happen in is this one or later
            before = read_stat_start_token(stat_path)
            if before is None:
                return None
            try:
                text = read_cgroup(pid, self._proc_root)
            except OSError:
                text = None  # unreadable: like gone for attribution (the killer reads for itself)
            if text is None:
                return None
            # The cgroup text belongs to the process whose start time was read only if the start time is the
            # same after the read: otherwise the PID was recycled in between.
            if read_stat_start_token(stat_path) != before:
                continue
            try:
                start_time = int(before)
            except ValueError:
                return None
            self._misses += 1
            identity: Identity = (ProcessRef(pid, start_time), place_cgroup(text, self._kubelet))
            if len(self._cache) >= self._max_entries:
                # Only reachable when identify() is used without scan(): drop the oldest entry.
                del self._cache[next(iter(self._cache))]
            self._cache[pid] = _Entry(stat_path, before, identity, same_tick=start_time >= now_ticks)
            return identity
        return None


def device_holders(
    proc_root: str,
    pod_uid: str,
    container_ids: AbstractSet[str],
    device_prefix: str | tuple[str, ...] = "/dev/nvidia",
    kubelet: KubeletTree = HOST_KUBELET,
) -> list[ProcessRef]:
    """The processes of the pod's `container_ids` (in the kubelet's tree) holding a GPU device file, by one walk of
    `proc_root`, in PID order. It only reports (the killer's list of what it left in a /proc of another PID
    namespace): a process that cannot be read is left out."""
    found = []
    try:
        pids = list_pids(proc_root)
    except OSError:
        return []
    for pid in pids:
        try:
            text = read_cgroup(pid, proc_root)
            identity = parse_cgroup(text, kubelet) if text is not None else None
            if identity is None or identity.pod_uid != pod_uid or identity.container_id not in container_ids:
                continue
            if holds_device(pid, proc_root, device_prefix):
                state = read_stat(pid, proc_root)
                if state is not None:
                    found.append(ProcessRef(pid, state[1]))
        except OSError:
            continue
    return sorted(found)
