"""Process → container → pod: who owns each GPU process, and how much each container uses per device.

Two halves, split along the observe/decide seam:

- `ProcessAttributor` is the side-effecting half: it reads /proc/<pid>/stat and /proc/<pid>/cgroup and keeps a
  cache keyed by (pid, start time), so a warm scan parses no cgroup file, while a recycled PID (same number,
  new start time) is read afresh.
- `attribute` is the pure half: a GPU sample, the identities and the pod cache in, a `Snapshot` out.

Typical use, once per scan::

    identities = attributor.scan(p.pid for p in sample.processes)
    snapshot = attribute(sample, identities, pod_source.pods(), agent_pod_uid=..., agent_pid=os.getpid())
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from types import TracebackType

from vramguard.cgroup import parse_cgroup
from vramguard.model import (
    CgroupIdentity,
    ContainerUsage,
    GpuSample,
    PodInfo,
    ProcessRef,
    Snapshot,
    UnattributedProcess,
)
from vramguard.procfs import read_cgroup_text_tolerant, read_stat_start_token

Identity = tuple[ProcessRef, CgroupIdentity | None]
"""A process's reuse-proof reference and where it lives; the identity is None outside any pod."""

# Reasons an UnattributedProcess carries (the wording `model.UnattributedProcess` documents).
NOT_IN_POD = "not in a pod cgroup"
POD_NOT_IN_CACHE = "pod not in cache"
PROCESS_GONE = "process gone"

# The start time of a process that was gone before it could be read: no real process has it.
UNKNOWN_START_TIME = -1

# A process can be replaced by a recycled PID between the reads of its stat and cgroup files; after this many
# inconsistent attempts it is treated as gone for this scan (the next scan reads it again).
_MAX_READ_ATTEMPTS = 3


@dataclass(slots=True)
class _Entry:
    stat_path: str  # precomputed: formatting it is a measurable part of a warm lookup
    start_token: bytes  # field 22 of stat as the kernel wrote it
    identity: Identity
    pidfd: int | None  # pins the process read; None where pidfds cannot be used (then stat is re-read)


class ProcessAttributor:
    """Reads and caches the identity of host processes: (pid, start time) → cgroup identity.

    How a cached entry is known to still be the same process, cheapest first:

    - pidfd (the default when `proc_root` shows the agent's own PID namespace): the entry keeps a pidfd opened
      when the process was read, and a warm lookup is ``pidfd_send_signal(fd, 0)`` — a signal-less permission
      check that fails with ESRCH once that very process is gone, whatever now holds its number. One syscall
      and no text: ~0.2 µs against ~3.5 µs for reading and splitting /proc/<pid>/stat, which is what lets a warm
      scan of 512 GPU processes fit in the 2 ms budget. The price is one fd per cached process; the cache is
      bounded by the latest scan (and `max_entries`), and `close()` releases them.
    - stat: re-read field 22 of /proc/<pid>/stat and compare it with the cached start time. Used for a fake
      proc root (tests), a /proc of another PID namespace, and any process whose pidfd could not be opened
      (EMFILE, a thread ID).

    Either way a recycled PID is a miss and is read afresh. The cache trusts that a process keeps its cgroup for
    its whole life: the kubelet and runtimes place a container's processes before they exec the workload, so
    that holds for anything that can hold GPU memory; a process moved by hand later keeps its old attribution
    until it restarts. The killer never relies on this cache: it re-reads the cgroup right before signalling.
    """

    def __init__(self, proc_root: str = "/proc", max_entries: int = 65536, use_pidfd: bool | None = None) -> None:
        self._proc_root = proc_root.rstrip("/") or "/"
        self._max_entries = max_entries
        self._use_pidfd = _pidfds_usable(self._proc_root) if use_pidfd is None else use_pidfd
        self._cache: dict[int, _Entry] = {}
        self._hits = 0
        self._misses = 0

    @property
    def hits(self) -> int:
        """Lookups answered from the cache (no cgroup read; a pidfd check or one stat read)."""
        return self._hits

    @property
    def misses(self) -> int:
        """Lookups that read and parsed /proc/<pid>/cgroup: new processes and recycled PIDs."""
        return self._misses

    @property
    def cache_size(self) -> int:
        return len(self._cache)

    @property
    def uses_pidfds(self) -> bool:
        """Whether cache entries are validated through pidfds (else by re-reading stat)."""
        return self._use_pidfd

    def identify(self, pid: int) -> Identity | None:
        """The process's (ProcessRef, cgroup identity), or None when the process is gone."""
        entry = self._cache.get(pid)
        if entry is not None:
            if _still_same(entry):
                self._hits += 1
                return entry.identity
            self._drop(pid)
        return self._read(pid)

    def scan(self, pids: Iterable[int]) -> dict[int, Identity]:
        """Identify every pid of one scan, and forget the cached ones that were not asked about.

        Forgetting is what bounds the cache: it holds at most the processes of the latest scan. Gone
        processes are absent from the result (attribution reports them as "process gone").
        """
        found: dict[int, Identity] = {}
        cache, send = self._cache, signal.pidfd_send_signal
        for pid in pids:
            if pid in found:
                continue
            # The warm path, written out (it runs once per GPU process per scan): a live pidfd means the cached
            # identity still belongs to this PID. Everything else goes through identify().
            entry = cache.get(pid)
            if entry is not None and entry.pidfd is not None:
                try:
                    send(entry.pidfd, 0)
                except ProcessLookupError:
                    pass
                except PermissionError:  # it exists; we may just not signal it
                    self._hits += 1
                    found[pid] = entry.identity
                    continue
                else:
                    self._hits += 1
                    found[pid] = entry.identity
                    continue
            identity = self.identify(pid)
            if identity is not None:
                found[pid] = identity
        self.forget_except(found)
        return found

    def forget_except(self, pids: Iterable[int]) -> None:
        """Drop the cached processes not in `pids` (the ones the latest scan saw): this bounds the cache."""
        keep = pids if isinstance(pids, (AbstractSet, Mapping)) else set(pids)
        for pid in [pid for pid in self._cache if pid not in keep]:
            self._drop(pid)

    def close(self) -> None:
        """Forget everything and close the pidfds."""
        for pid in list(self._cache):
            self._drop(pid)

    def __enter__(self) -> ProcessAttributor:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _drop(self, pid: int) -> None:
        entry = self._cache.pop(pid)
        if entry.pidfd is not None:
            os.close(entry.pidfd)

    def _read(self, pid: int) -> Identity | None:
        stat_path = f"{self._proc_root}/{pid}/stat"
        # Opened before the reads, so that a live pidfd afterwards proves the reads were about its process.
        pidfd = self._open_pidfd(pid)
        try:
            for _ in range(_MAX_READ_ATTEMPTS):
                before = read_stat_start_token(stat_path)
                if before is None:
                    return None
                text = read_cgroup_text_tolerant(pid, self._proc_root)
                if text is None:
                    return None
                # The cgroup text belongs to the process whose start time was read only if the start time is
                # the same after the read: otherwise the PID was recycled in between.
                if read_stat_start_token(stat_path) != before:
                    continue
                try:
                    start_time = int(before)
                except ValueError:
                    return None
                if pidfd is not None and not _alive(pidfd):
                    return None  # the pidfd's process died, so what was read may be a newcomer's
                self._misses += 1
                identity: Identity = (ProcessRef(pid, start_time), parse_cgroup(text))
                if len(self._cache) >= self._max_entries:
                    # Only reachable when identify() is used without scan(): drop the oldest entry.
                    self._drop(next(iter(self._cache)))
                self._cache[pid] = _Entry(stat_path, before, identity, pidfd)
                pidfd = None  # the entry owns it now
                return identity
            return None
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def _open_pidfd(self, pid: int) -> int | None:
        if not self._use_pidfd:
            return None
        try:
            return os.pidfd_open(pid)
        except OSError:
            # Gone (the stat read will say so), a thread ID, or out of fds: fall back to stat for this entry.
            return None


def _still_same(entry: _Entry) -> bool:
    if entry.pidfd is not None:
        return _alive(entry.pidfd)
    return read_stat_start_token(entry.stat_path) == entry.start_token


def _alive(pidfd: int) -> bool:
    """True while the process behind `pidfd` exists (a zombie still does: its PID is not free yet)."""
    try:
        signal.pidfd_send_signal(pidfd, 0)
        return True
    except PermissionError:
        return True  # it exists; we may just not signal it
    except OSError:
        return False


def _pidfds_usable(proc_root: str) -> bool:
    # pidfd_open takes PIDs of the agent's namespace; <proc_root>/self names the agent as that procfs numbers
    # it. When the two differ (a fake tree, or a /proc of another namespace), a pidfd would pin the wrong
    # process, so entries are validated through stat instead.
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        return os.readlink(os.path.join(proc_root, "self")) == str(os.getpid())
    except OSError:
        return False


def attribute(
    sample: GpuSample,
    identities: Mapping[int, Identity],
    pods: Mapping[str, PodInfo],
    agent_pod_uid: str | None = None,
    agent_pid: int | None = None,
) -> Snapshot:
    """Sum each container's GPU memory per device; report every other GPU process as unattributed.

    Pure: no I/O. Equal inputs give equal snapshots (rows in NVML's order, unattributed processes sorted).
    Processes of unhealthy devices are already absent from the sample, so nothing here can act on a GPU in that
    state.
    """
    groups: dict[tuple[str, str | None, str], tuple[int, list[ProcessRef]]] = {}
    unattributed: list[UnattributedProcess] = []
    for pid, device_uuid, used, _kind in sample.processes:
        # NVML_VALUE_NOT_AVAILABLE (None) hides the amount, not the fact that the process is on the GPU: it
        # counts as 0 bytes, since any guess could push an innocent container over quota, but its ref stays
        # in the container's processes so a kill of that container still reaches it.
        used_bytes = used if used is not None else 0
        found = identities.get(pid)
        if found is None:
            ref = ProcessRef(pid, UNKNOWN_START_TIME)
            unattributed.append(UnattributedProcess(ref, device_uuid, used_bytes, PROCESS_GONE))
            continue
        ref, cgroup = found
        if cgroup is None:
            unattributed.append(UnattributedProcess(ref, device_uuid, used_bytes, NOT_IN_POD))
            continue
        if cgroup.pod_uid not in pods:
            unattributed.append(UnattributedProcess(ref, device_uuid, used_bytes, POD_NOT_IN_CACHE))
            continue
        group_key = (cgroup.pod_uid, cgroup.container_id, device_uuid)
        group = groups.get(group_key)
        if group is None:
            groups[group_key] = (used_bytes, [ref])
        else:
            group[1].append(ref)
            groups[group_key] = (group[0] + used_bytes, group[1])

    containers: list[ContainerUsage] = []
    for (pod_uid, container_id, device_uuid), (total, refs) in groups.items():
        pod = pods[pod_uid]
        container = pod.container_by_id(container_id) if container_id is not None else None
        # Positional, in ContainerUsage's field order: keyword construction doubles the cost of this line, which
        # runs once per (container, device) per scan. "" covers a process in the pod cgroup itself and a container
        # the pod's status does not list yet (or the sandbox): usage that is the pod's, not a named container's.
        containers.append(
            ContainerUsage(
                pod,
                container.name if container is not None else "",
                container_id,
                device_uuid,
                total,
                (refs[0],) if len(refs) == 1 else tuple(sorted(refs)),
            )
        )
    # Rows keep NVML's order (device, then list order), which equal samples repeat: sorting 512 rows would
    # cost a tenth of the scan budget, and every reader that shows rows to people sorts them its own way.
    unattributed.sort(key=lambda u: (u.device_uuid, u.process.pid, u.reason))
    return Snapshot(
        devices=sample.devices,
        containers=tuple(containers),
        unattributed=tuple(unattributed),
        agent_pod_uid=agent_pod_uid,
        agent_pid=agent_pid,
    )
