"""Orphans: a pod cgroup's processes are orphaned only once its pod has been absent from a healthy cache for the grace
and a fresh read of the API server, begun after that, lacks it too; never a static pod, the agent's, or a process
outside the kubelet's pod cgroups."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from vramguard.core.orphans import Departed, OrphanScan, OrphanTracker, PodRead
from vramguard.core.pod import PodInfo
from vramguard.core.policy import Mode, NamespacePolicy, Orphans, Policy
from vramguard.core.process import CgroupIdentity, ProcessRef
from vramguard.core.quantity import GiB
from vramguard.core.snapshot import UnattributedProcess, UnattributedReason

GONE = "0a0a0a0a-0000-4000-8000-000000000001"
GONE_TOO = "0b0b0b0b-0000-4000-8000-000000000002"
AGENT = "0c0c0c0c-0000-4000-8000-000000000003"
STATIC = "5f3b1c0e9a8d7b6c5d4e3f2a1b0c9d8e"  # the kubelet's hash of a manifest: no dashes
STATIC_UUID = "0e0e0e0e-0000-4000-8000-000000000005"  # a static pod whose manifest sets its own UID
NEVER_SEEN = "0f0f0f0f-0000-4000-8000-000000000006"  # a pod made and deleted while no agent on the node ran
# The UIDs this node's agents saw the API server give its pods (`node/api_uids.py`).
API_UIDS = frozenset({GONE, GONE_TOO, AGENT})
CID = "ab" * 32
CID_2 = "cd" * 32
GRACE = 120.0
NOT_IN_CACHE = UnattributedReason.POD_NOT_IN_CACHE


def row(
    uid: str | None,
    pid: int = 10,
    used: int = GiB,
    *,
    device: str = "GPU-0",
    container: str | None = CID,
    reason: UnattributedReason = NOT_IN_CACHE,
) -> UnattributedProcess:
    cgroup = CgroupIdentity(uid, container, "containerd", "burstable") if uid is not None else None
    return UnattributedProcess(ProcessRef(pid, 1000 + pid), device, used, reason, cgroup)


def gone_pod(uid: str = GONE, namespace: str = "ml", name: str = "trainer", **kw: object) -> PodInfo:
    return PodInfo(uid=uid, namespace=namespace, name=name, **kw)  # type: ignore[arg-type]


class World:
    """A tracker driven scan by scan, on a clock in seconds."""

    def __init__(self, pods: Sequence[PodInfo] = ()) -> None:
        self.tracker = OrphanTracker(API_UIDS)
        self.now = 0.0
        self.pods: Mapping[str, PodInfo] = {p.uid: p for p in pods}

    def scan(self, rows: Sequence[UnattributedProcess], *, at: float | None = None, healthy: bool = True) -> OrphanScan:
        if at is not None:
            self.now = at
        return self.tracker.observe(rows, self.pods, healthy=healthy, now=self.now, grace_s=GRACE, agent_pod_uid=AGENT)

    def delete(self, uid: str) -> None:
        self.pods = {k: v for k, v in self.pods.items() if k != uid}

    def read(self, started_at: float, *present: str) -> tuple[str, ...]:
        return self.tracker.confirm(PodRead(started_at, frozenset(present)))


def test_absent_for_the_grace_and_from_a_fresh_read_is_an_orphan() -> None:
    """The clock starts at the first healthy scan without the pod; past the grace a read is wanted; a read begun
    after that without the pod confirms it, and the orphan names the pod the agent saw."""
    w = World([gone_pod()])
    assert w.scan([], at=0.0).orphans == ()
    w.delete(GONE)
    first = w.scan([row(GONE)], at=10.0)
    assert (first.read_wanted, first.waiting, first.orphans) == (False, 1, ())
    assert not w.scan([row(GONE)], at=129.9).read_wanted, "not before the grace"
    due = w.scan([row(GONE)], at=130.0)
    assert due.read_wanted and due.orphans == ()
    assert w.read(130.0) == ()
    assert w.tracker.orphaned() == {GONE}
    [orphan] = w.scan([row(GONE)], at=131.0).orphans
    assert orphan.known == Departed("ml", "trainer", False, 10.0)
    assert (orphan.absent_since, orphan.used_bytes, orphan.pids) == (10.0, GiB, (10,))
    assert orphan.subject == f"pod ml/trainer (UID {GONE})"


def test_a_read_begun_before_the_grace_passed_confirms_nothing() -> None:
    w = World()
    w.scan([row(GONE)], at=0.0)
    w.scan([row(GONE)], at=120.0)
    w.read(119.0)
    assert w.tracker.orphaned() == frozenset()
    w.read(120.0)
    assert w.tracker.orphaned() == {GONE}


def test_a_pod_the_api_server_has_is_a_cache_behind_and_its_clock_starts_again() -> None:
    """A watch that delivers late keeps the cache healthy-looking and behind: the read has the pod, so it is never
    an orphan, and it is read about again only after another grace."""
    w = World()
    w.scan([row(GONE)], at=0.0)
    w.scan([row(GONE)], at=120.0)
    assert w.read(120.0, GONE) == (GONE,)
    assert w.tracker.orphaned() == frozenset()
    assert not w.scan([row(GONE)], at=200.0).read_wanted
    assert w.scan([row(GONE)], at=240.0).read_wanted


def test_an_unhealthy_cache_starts_every_clock_afresh() -> None:
    """A scan with the cache unsynced or its watch broken (a relist after an outage follows) restarts the grace."""
    w = World()
    w.scan([row(GONE)], at=0.0)
    assert w.scan([row(GONE)], at=100.0, healthy=False).waiting == 0
    assert not w.scan([row(GONE)], at=130.0).read_wanted
    w.read(130.0)
    assert w.tracker.orphaned() == frozenset(), "absent from the healthy cache for 0 s only"
    assert w.scan([row(GONE)], at=250.0).read_wanted


def test_nothing_is_acted_on_while_the_cache_is_unhealthy_but_a_confirmed_orphan_stays_one() -> None:
    w = World()
    w.scan([row(GONE)], at=0.0)
    w.scan([row(GONE)], at=120.0)
    w.read(120.0)
    unhealthy = w.scan([row(GONE)], at=121.0, healthy=False)
    assert not unhealthy.healthy and [o.pod_uid for o in unhealthy.orphans] == [GONE]
    assert w.tracker.orphaned() == {GONE}, "a pod UID is never reused: the absence confirmed is final"


def test_an_orphan_whose_processes_are_gone_is_forgotten() -> None:
    w = World()
    w.scan([row(GONE)], at=0.0)
    w.scan([row(GONE)], at=120.0)
    w.read(120.0)
    assert w.scan([], at=121.0).orphans == ()
    assert w.tracker.orphaned() == frozenset()


# What is never a candidate: each case is one scan's row, followed for the grace and read about.
NEVER = {
    "a-static-pod-runs-under-the-kubelets-hash": row(STATIC),
    "a-static-pod-whose-manifest-sets-a-uuid-and-has-no-mirror": row(STATIC_UUID),
    "a-pod-no-agent-saw-the-api-server-give": row(NEVER_SEEN),
    "the-agents-own-pod": row(AGENT),
    "a-process-outside-any-pod-cgroup": row(None, reason=UnattributedReason.NOT_IN_POD),
    "a-look-alike-outside-the-kubelet": row(None, reason=UnattributedReason.OUTSIDE_KUBELET),
    "a-process-that-exited": row(None, reason=UnattributedReason.PROCESS_EXITED),
}


@pytest.mark.parametrize("never", list(NEVER.values()), ids=list(NEVER))
def test_never_an_orphan(never: UnattributedProcess) -> None:
    w = World()
    w.scan([never], at=0.0)
    scan = w.scan([never], at=GRACE)
    w.read(GRACE)
    assert (scan.read_wanted, scan.waiting, w.tracker.orphaned()) == (False, 0, frozenset())


def test_a_pod_last_seen_as_a_static_pod_is_never_an_orphan() -> None:
    """A static pod whose manifest sets a UUID: its mirror pod leaving the cache does not make it an orphan."""
    static = gone_pod(mirror_uid="0d0d0d0d-0000-4000-8000-000000000004")
    w = World([static])
    w.scan([], at=0.0)
    w.delete(GONE)
    w.scan([row(GONE)], at=1.0)
    assert w.scan([row(GONE)], at=1.0 + GRACE).waiting == 0


def test_the_memory_of_departed_pods_is_bounded() -> None:
    w = World([gone_pod(), gone_pod(GONE_TOO, name="other")])
    w.tracker = OrphanTracker(API_UIDS, max_departed=1)
    w.scan([], at=0.0)
    w.delete(GONE)
    w.scan([], at=1.0)
    w.delete(GONE_TOO)
    w.scan([], at=2.0)
    assert (w.tracker.departed(GONE), w.tracker.departed(GONE_TOO)) == (None, Departed("ml", "other", False, 2.0))


def test_a_pod_back_in_the_cache_is_no_longer_departed() -> None:
    pod = gone_pod()
    w = World([pod])
    w.scan([], at=0.0)
    w.delete(GONE)
    w.scan([], at=1.0)
    w.pods = {GONE: pod}
    w.scan([], at=2.0)
    assert w.tracker.departed(GONE) is None


def test_pods_followed_at_once_are_bounded() -> None:
    w = World()
    w.tracker = OrphanTracker(API_UIDS, max_pods=1)
    assert w.scan([row(GONE, 10), row(GONE_TOO, 11), row(GONE, 12)], at=0.0).waiting == 1


def test_an_orphan_never_seen_is_named_by_its_uid_and_its_rows_add_up_per_gpu() -> None:
    w = World()
    rows = [
        row(GONE, 10, GiB),
        row(GONE, 11, 2 * GiB, device="GPU-1", container=CID_2),
        row(GONE, 12, 0, container=None),
    ]
    w.scan(rows, at=0.0)
    w.scan(rows, at=GRACE)
    w.read(GRACE)
    scan = w.scan(rows, at=GRACE + 1)
    [orphan] = scan.orphans
    assert orphan.known is None and orphan.subject == f"pod UID {GONE} (deleted before this agent saw it)"
    assert dict(scan.bytes_by_gpu()) == {"GPU-0": GiB, "GPU-1": 2 * GiB}
    target = orphan.target
    assert (target.pod_uid, target.container_ids) == (GONE, tuple(sorted((CID, CID_2))))
    assert [p.pid for p in target.processes] == [10, 11], "a process in the pod's own cgroup names no container"


@pytest.mark.parametrize(
    ("policy", "namespace", "reclaims"),
    [
        pytest.param(Policy(mode=Mode.KILL), "ml", True, id="kill-mode-reclaims"),
        pytest.param(Policy(mode=Mode.EVICT), "ml", True, id="evict-mode-reclaims"),
        pytest.param(Policy(mode=Mode.WARN), "ml", False, id="warn-mode-reports"),
        pytest.param(Policy(mode=Mode.WARN, orphans=Orphans.RECLAIM), "ml", True, id="reclaim-in-warn-mode"),
        pytest.param(Policy(mode=Mode.KILL, orphans=Orphans.REPORT), "ml", False, id="report-in-kill-mode"),
        pytest.param(Policy(mode=Mode.KILL), "kube-system", False, id="an-exempt-namespace-is-reported"),
        pytest.param(
            Policy(mode=Mode.KILL, namespaces={"ml": NamespacePolicy(mode=Mode.WARN)}),
            "ml",
            True,
            id="the-global-mode-decides-not-the-namespaces",
        ),
    ],
)
def test_whether_an_orphan_is_reclaimed(policy: Policy, namespace: str, reclaims: bool) -> None:
    w = World([gone_pod(namespace=namespace)])
    w.scan([], at=0.0)
    w.delete(GONE)
    w.scan([row(GONE)], at=1.0)
    w.scan([row(GONE)], at=1.0 + GRACE)
    w.read(1.0 + GRACE)
    [orphan] = w.scan([row(GONE)], at=2.0 + GRACE).orphans
    assert orphan.reclaims(policy) is reclaims


def test_a_reclaim_is_tried_again_after_the_cooldown_and_a_report_is_made_once() -> None:
    w = World()
    w.scan([row(GONE)], at=0.0)
    w.scan([row(GONE)], at=GRACE)
    w.read(GRACE)
    [orphan] = w.scan([row(GONE)], at=GRACE).orphans
    kill, report = Policy(mode=Mode.KILL, cooldown_s=60.0), Policy(mode=Mode.WARN, cooldown_s=60.0)
    assert orphan.due(kill, GRACE) and orphan.due(report, GRACE)
    w.tracker.acted(GONE, GRACE)
    [orphan] = w.scan([row(GONE)], at=GRACE + 59.0).orphans
    assert not orphan.due(kill, GRACE + 59.0)
    assert orphan.due(kill, GRACE + 60.0) and not orphan.due(report, GRACE + 600.0)
