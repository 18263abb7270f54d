"""Orphans: GPU processes left in the cgroup of a pod that no longer exists.

A pod deleted while its kubelet was down or wedged, a pod whose cgroup the kubelet's cleanup holds back (it
waits for volumes), a process that survived its container's teardown: the processes sit in a kubelet pod cgroup
whose pod the API server no longer has, holding GPU memory the scheduler hands to new pods. `OrphanTracker` tells
them from a pod the agent has not heard of yet (a cgroup the kubelet made before the agent's watch delivered the
pod) by two tests, both needed:

1. **Absent from a healthy cache for the grace.** The pod cgroup's UID has been absent from the pod cache, while
   the cache was synced and its watch working (`PodSource.synced()` and no `problem()`), at every scan for
   `Policy.orphan_grace_s`. A scan that finds the cache unhealthy (unsynced, its watch broken, the API server
   silent, a relist after an outage) starts every such clock afresh.
2. **Absent from a fresh read of the API server.** A consistent read of the node's pods (`PodLister.present`),
   started once the grace had passed, does not have it either. A watch that delivers late (a slow proxy, a
   lagging watch cache) keeps the cache healthy-looking and behind; the read is not behind. A pod UID is never
   reused, so an absence confirmed so is final: the UID is an orphan for as long as its processes hold memory.

Only what the API server could have deleted is ever an orphan: a pod cgroup whose UID this node's agents saw the
API server give a pod (`api_uids`, `node/api_uids.py`); not a static pod, whatever its UID's form (a manifest may
set a UUID of its own, and its mirror may be missing), not a pod made and deleted while no agent ran (reported,
never reclaimed), not the agent's own pod, not a pod last seen as a static pod. A process outside the kubelet's
pod cgroups is never one (the attribute stage gives it no pod cgroup). The tracker also keeps a bounded memory of
the pods that left the cache (`Departed`), so that what is reported names the pod where the agent saw it.

    scan = tracker.observe(snapshot.unattributed, pods, healthy=pods.synced() and pods.problem() is None, now=now)
    if scan.read_wanted: ...  # a fresh read of the API server, off the scan (`agent/orphan_reads.py`)
    tracker.confirm(read)  # when it answers
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field

from vramguard.core.actions import KillTarget
from vramguard.core.pod import PodInfo
from vramguard.core.policy import Policy
from vramguard.core.process import ProcessRef
from vramguard.core.snapshot import UnattributedProcess, UnattributedReason

# Pods followed at once while absent, and confirmed orphans remembered (their processes still on a GPU). A scan's
# rows are bounded by NVML's process lists already; past the bound, the first seen are kept (the closest to due).
MAX_ORPHAN_PODS = 1024
# Pods remembered after they left the cache, to name an orphan: a node runs at most a few hundred pods at once, so
# this covers the deletions of hours on a busy node, and of the whole grace on any.
MAX_DEPARTED = 1024

CANDIDATE_REASONS = frozenset({UnattributedReason.POD_NOT_IN_CACHE, UnattributedReason.ORPHANED})


@dataclass(frozen=True, slots=True)
class Departed:
    """A pod as the agent last saw it in its cache, and when it left."""

    namespace: str
    name: str
    static: bool  # a static pod (its mirror pod went): never an orphan, the kubelet runs it from a file
    left_at: float  # the first scan that found it gone from the cache, on the scan's clock

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Orphan:
    """One pod's processes found orphaned this scan: the pod's UID, what the agent knew of it, its GPU rows."""

    pod_uid: str
    known: Departed | None  # None: the pod left before this agent started (or past the memory's bound)
    rows: tuple[UnattributedProcess, ...]  # its GPU processes, as this scan found them
    absent_since: float  # since when the healthy cache has lacked it, continuously
    last_acted: float | None = None  # when it was last reclaimed or reported (`OrphanTracker.acted`)

    @property
    def used_bytes(self) -> int:
        return sum(r.used_bytes for r in self.rows)

    def bytes_by_gpu(self) -> Mapping[str, int]:
        """Its bytes per GPU (device UUID), in row order."""
        by: dict[str, int] = {}
        for r in self.rows:
            by[r.device_uuid] = by.get(r.device_uuid, 0) + r.used_bytes
        return by

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(sorted({r.process.pid for r in self.rows}))

    @property
    def target(self) -> KillTarget:
        """What reclaiming it signals: its processes in the pod's container cgroups (a process in the pod cgroup
        itself names no container; the killer cannot check its membership, so it is reported, not signalled)."""
        refs: dict[int, ProcessRef] = {}
        containers: set[str] = set()
        for r in self.rows:
            if r.cgroup is not None and r.cgroup.container_id is not None:
                refs.setdefault(r.process.pid, r.process)
                containers.add(r.cgroup.container_id)
        return KillTarget(self.pod_uid, tuple(sorted(containers)), tuple(refs[p] for p in sorted(refs)))

    @property
    def subject(self) -> str:
        """How messages name it: "pod ml/trainer (UID ...)", or the UID alone when the agent never saw it."""
        if self.known is not None:
            return f"pod {self.known.key} (UID {self.pod_uid})"
        return f"pod UID {self.pod_uid} (deleted before this agent saw it)"

    def reclaims(self, policy: Policy) -> bool:
        """Whether the policy has it killed: `orphans` (or the mode) says reclaim, and the namespace it was seen in
        is not exempt (kube-system's leftovers are reported only)."""
        exempt = self.known is not None and policy.exemption(self.pod_uid, self.known.namespace) is not None
        return policy.reclaims_orphans and not exempt

    def due(self, policy: Policy, now: float) -> bool:
        """Whether to act on it now: never acted on yet; or reclaimed before, its processes still here and the
        policy's cooldown passed (a kill whose memory was not freed is tried again, at the pace of any other)."""
        if self.last_acted is None:
            return True
        return self.reclaims(policy) and now - self.last_acted >= policy.cooldown_s


@dataclass(frozen=True, slots=True)
class OrphanScan:
    """What one scan found of orphans."""

    healthy: bool  # the pod cache was healthy at this scan: nothing is acted on otherwise
    orphans: tuple[Orphan, ...] = ()  # confirmed orphans with processes on a GPU now, by UID
    read_wanted: bool = False  # a pod past its grace waits for a fresh read of the API server
    waiting: int = 0  # pods absent from the healthy cache, not (yet) confirmed orphans

    def bytes_by_gpu(self) -> Mapping[str, int]:
        """Orphaned bytes per GPU (device UUID): the metric."""
        by: dict[str, int] = {}
        for o in self.orphans:
            for uuid, used in o.bytes_by_gpu().items():
                by[uuid] = by.get(uuid, 0) + used
        return by


@dataclass(frozen=True, slots=True)
class PodRead:
    """A fresh read of the API server: the UIDs of this node's pods, as the kubelet runs them (a mirror pod's
    `kubernetes.io/config.mirror` too), consistent as of some moment after `started_at` (the scan's clock)."""

    started_at: float
    present: frozenset[str] = field(default_factory=frozenset)


class OrphanTracker:
    """`observe` after each attribution; `confirm` with each fresh read; `acted` after each reclaim or report.
    The loop owns it; nothing here reads a clock."""

    def __init__(
        self,
        api_uids: Container[str] = frozenset(),
        max_pods: int = MAX_ORPHAN_PODS,
        max_departed: int = MAX_DEPARTED,
    ) -> None:
        if max_pods < 1 or max_departed < 1:
            raise ValueError("need max_pods >= 1 and max_departed >= 1")
        self.api_uids = api_uids  # read only: the pod source adds to it
        self.max_pods = max_pods
        self.max_departed = max_departed
        self._absent: dict[str, float] = {}  # pod UID → since when the healthy cache has lacked it
        self._confirmed: set[str] = set()  # UIDs a fresh read found absent past their grace: orphans
        self._acted: dict[str, float] = {}  # confirmed UIDs → when last reclaimed or reported
        self._departed: dict[str, Departed] = {}  # pods that left the cache, oldest first
        self._pods: Mapping[str, PodInfo] | None = None  # the cache's mapping at the last scan
        self._grace_s = 0.0
        self._now = 0.0

    def orphaned(self) -> frozenset[str]:
        """The UIDs confirmed orphans: the attribute stage labels their rows `orphaned`."""
        return frozenset(self._confirmed)

    def departed(self, uid: str) -> Departed | None:
        return self._departed.get(uid)

    def observe(
        self,
        unattributed: Iterable[UnattributedProcess],
        pods: Mapping[str, PodInfo],
        *,
        healthy: bool,
        now: float,
        grace_s: float,
        agent_pod_uid: str | None = None,
    ) -> OrphanScan:
        """Take one scan: its unattributed rows, the pod cache it was attributed with and whether that cache was
        healthy, at `now`. A pod not among the rows is forgotten (its processes are gone, or it is in the cache)."""
        self._remember_departures(pods, now)
        self._grace_s, self._now = grace_s, now
        rows: dict[str, list[UnattributedProcess]] = {}
        for u in unattributed:
            c = u.cgroup
            if u.reason not in CANDIDATE_REASONS or c is None or c.pod_uid not in self.api_uids:
                continue
            if c.pod_uid == agent_pod_uid:
                continue
            known = self._departed.get(c.pod_uid)
            if known is not None and known.static:
                continue
            if c.pod_uid in rows or len(rows) < self.max_pods:
                rows.setdefault(c.pod_uid, []).append(u)
        self._confirmed &= rows.keys()
        self._acted = {uid: at for uid, at in self._acted.items() if uid in self._confirmed}
        if healthy:
            self._absent = {uid: self._absent.get(uid, now) for uid in rows}
        else:
            self._absent = {}  # every clock starts afresh once the cache is healthy again
        orphans = tuple(
            Orphan(
                uid,
                self._departed.get(uid),
                tuple(rows[uid]),
                self._absent.get(uid, now),
                self._acted.get(uid),
            )
            for uid in sorted(self._confirmed)
        )
        waiting = [uid for uid in self._absent if uid not in self._confirmed]
        read_wanted = healthy and any(now - self._absent[uid] >= grace_s for uid in waiting)
        return OrphanScan(healthy, orphans, read_wanted, len(waiting))

    def confirm(self, read: PodRead) -> tuple[str, ...]:
        """Take a fresh read of the API server: each pod past its grace before the read began, and absent from it,
        is an orphan from now on. Returns the UIDs the read has and the healthy cache lacked past their grace (a
        cache behind the API server: their clocks start afresh)."""
        lagging = []
        for uid, since in list(self._absent.items()):
            if since + self._grace_s > read.started_at or uid in self._confirmed:
                continue
            if uid in read.present:
                lagging.append(uid)
                self._absent[uid] = self._now
            else:
                self._confirmed.add(uid)
        return tuple(sorted(lagging))

    def acted(self, uid: str, now: float) -> None:
        """An orphan was reclaimed (or reported) at `now`."""
        if uid in self._confirmed:
            self._acted[uid] = now

    def _remember_departures(self, pods: Mapping[str, PodInfo], now: float) -> None:
        """Note the pods that left the cache since the last scan (a new mapping means a change: `PodSource`)."""
        before, self._pods = self._pods, pods
        if before is None or before is pods:
            return
        for uid in pods.keys() & self._departed.keys():
            del self._departed[uid]  # back in the cache (a watch that lost it for a while)
        for uid in before.keys() - pods.keys():
            pod = before[uid]
            self._departed[uid] = Departed(pod.namespace, pod.name, pod.static, now)
        while len(self._departed) > self.max_departed:
            del self._departed[next(iter(self._departed))]


NO_ORPHANS = OrphanScan(healthy=True)
"""What a scan reports without a tracker (tests)."""
