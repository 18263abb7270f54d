"""A scan's rows as JSON (`row_dict`): what `top --json` prints and /status carries, tenant text exact."""

from __future__ import annotations

import json

import pytest

from unit.node.test_describe import HOSTILE
from vramguard.agent.metrics import Metrics
from vramguard.agent.report import ScanReport, TopRow, row_dict, rows_from_report
from vramguard.core.decide import Decision, DecisionState, decide
from vramguard.core.driver_limit import HeldLimit, LimitKey, LimitSetter
from vramguard.core.orphans import Departed, Orphan, OrphanScan
from vramguard.core.policy import Policy
from vramguard.core.process import CgroupIdentity, ProcessRef
from vramguard.core.quantity import GiB
from vramguard.core.quota import PodQuota, Quota
from vramguard.core.snapshot import Snapshot, UnattributedProcess, UnattributedReason
from vramguard.node.describe import ProcessDetail
from vramguard_testbed.fakes import SnapshotBuilder, gpu, pod

# A container with two processes; a row whose quota is a DRA share; a row of hostile tenant text in every field.
TRAINER_ROW = TopRow(
    gpu="0",
    namespace="ml",
    pod="trainer",
    container="main",
    processes=(ProcessDetail(10, "alice", "python train.py"), ProcessDetail(11, "alice", "python loader.py")),
    used_bytes=3 * GiB,
    quota_bytes=4 * GiB,
    state="ok",
    held_by="driver",
)
CLAIM_ROW = TopRow("2", "ml", "small", "main", (ProcessDetail(7, "bob", "python serve.py"),), 11 * GiB, 10 * GiB,
                   "over-hard", "agent", claim="small-gpu0-x7k2")  # fmt: skip
HOSTILE_ROW = TopRow("0", HOSTILE, HOSTILE, HOSTILE, (ProcessDetail(7, HOSTILE, HOSTILE),), GiB, 2 * GiB,
                     f"unattributed: {HOSTILE}", claim=HOSTILE)  # fmt: skip


def test_a_rows_json_names_each_process_and_its_pids() -> None:
    """A container's row lists its processes, and their PIDs on their own."""
    as_json = json.dumps(row_dict(TRAINER_ROW))
    assert '"pids": [10, 11]' in as_json and '"command": "python loader.py"' in as_json


def test_a_rows_json_names_its_dra_claim() -> None:
    """A row whose quota is a DRA share names its claim."""
    assert row_dict(CLAIM_ROW)["claim"] == "small-gpu0-x7k2"


def test_hostile_tenant_text_is_exact_in_json() -> None:
    """Namespace, pod, container, user, command, state and claim: the exact text in JSON (which escapes it)."""
    back = json.loads(json.dumps(row_dict(HOSTILE_ROW)))
    assert back["namespace"] == back["pod"] == back["container"] == back["claim"] == HOSTILE
    assert back["state"] == f"unattributed: {HOSTILE}"
    assert back["processes"] == [{"pid": 7, "user": HOSTILE, "command": HOSTILE}]


@pytest.mark.parametrize(
    ("reason", "label", "why"),
    [
        pytest.param(UnattributedReason.NOT_IN_POD, "not-in-pod", "not in a pod cgroup", id="a-host-process"),
        pytest.param(
            UnattributedReason.OUTSIDE_KUBELET,
            "outside-kubelet",
            "a pod-shaped cgroup outside this node's kubelet",
            id="a-look-alike-of-a-pod-cgroup",
        ),
        pytest.param(
            UnattributedReason.POD_NOT_IN_CACHE, "pod-not-in-cache", "pod not in cache", id="a-pod-not-known-yet"
        ),
        pytest.param(UnattributedReason.ORPHANED, "orphaned", "orphaned: its pod is gone", id="a-pod-that-is-gone"),
        pytest.param(
            UnattributedReason.PROCESS_EXITED,
            "process-exited",
            "held by an exited process",
            id="a-pid-without-a-process",
        ),
    ],
)
def test_each_reason_is_a_metric_label_and_words_for_people(reason: UnattributedReason, label: str, why: str) -> None:
    """The reason is the `reason` label of the unattributed metric and of /status's rows, and `top` says it in words."""
    device = gpu(0, used_bytes=GiB)
    snapshot = Snapshot(devices=(device,), containers=(), unattributed=(unattributed(7, reason),))
    nothing = Decision(actions=(), violations=())
    metrics = Metrics()
    metrics.observe_scan(snapshot, nothing)
    series = {"gpu": "0", "gpu_uuid": device.uuid, "reason": label}
    assert metrics.registry.get_sample_value("vramguard_unattributed_gpu_memory_bytes", series) == GiB
    [shown] = rows_from_report(
        ScanReport(snapshot, {}, nothing, (), 0.0), describe=lambda pid: ProcessDetail(pid, "u", "x")
    )
    assert (row_dict(shown)["reason"], row_dict(shown)["state"]) == (label, f"unattributed: {why}")


GONE_UID = "0b7f3c1e-2d4a-4e6b-9c8d-0123456789ab"  # the pod of an orphan the agent saw before it went
UNSEEN_UID = "5e6f7a8b-9c0d-4e1f-8a2b-3c4d5e6f7a8b"  # the pod of one deleted before this agent started
LATE_UID = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"  # a pod the cache does not have (yet)


def unattributed(pid: int, reason: UnattributedReason, uid: str | None = None) -> UnattributedProcess:
    """A row of GPU 0 of `reason`, in a container of the pod `uid` when one is given."""
    cgroup = CgroupIdentity(uid, f"{pid:064x}") if uid is not None else None
    return UnattributedProcess(ProcessRef(pid, pid * 10), gpu(0).uuid, GiB, reason, cgroup)


@pytest.mark.parametrize(
    ("row", "namespace", "pod", "state"),
    [
        pytest.param(
            unattributed(10, UnattributedReason.ORPHANED, GONE_UID),
            "ml",
            "trainer",
            "unattributed: orphaned: its pod is gone",
            id="orphan-of-a-pod-the-agent-saw-names-it",
        ),
        pytest.param(
            unattributed(11, UnattributedReason.ORPHANED, UNSEEN_UID),
            "-",
            UNSEEN_UID,
            "unattributed: orphaned: its pod is gone",
            id="orphan-of-a-pod-never-seen-names-its-uid",
        ),
        pytest.param(
            unattributed(12, UnattributedReason.POD_NOT_IN_CACHE, LATE_UID),
            "-",
            "-",
            "unattributed: pod not in cache",
            id="pod-not-in-cache-names-nothing",
        ),
        pytest.param(
            unattributed(13, UnattributedReason.NOT_IN_POD), "-", "-", "unattributed: not in a pod cgroup", id="host"
        ),
        pytest.param(
            unattributed(14, UnattributedReason.PROCESS_EXITED),
            "-",
            "-",
            "unattributed: held by an exited process",
            id="exited",
        ),
    ],
)
def test_an_unattributed_row_names_the_pod_of_an_orphan_only(
    row: UnattributedProcess, namespace: str, pod: str, state: str
) -> None:
    """An orphan's row shows its pod's namespace and name where the agent saw the pod before it went, else the
    pod's UID; no other unattributed row names a pod, and none a container."""
    seen = Departed("ml", "trainer", static=False, left_at=0.0)
    orphans = OrphanScan(
        healthy=True,
        orphans=(
            Orphan(GONE_UID, seen, (unattributed(10, UnattributedReason.ORPHANED, GONE_UID),), 0.0),
            Orphan(UNSEEN_UID, None, (unattributed(11, UnattributedReason.ORPHANED, UNSEEN_UID),), 0.0),
        ),
    )
    snapshot = Snapshot(devices=(gpu(0, used_bytes=GiB),), containers=(), unattributed=(row,))
    report = ScanReport(snapshot, {}, Decision(actions=(), violations=()), (), 0.0, orphans=orphans)
    [shown] = rows_from_report(report, describe=lambda pid: ProcessDetail(pid, "u", "python"))
    assert (shown.gpu, shown.namespace, shown.pod, shown.container) == ("0", namespace, pod, "-")
    assert (shown.state, shown.reason, shown.pids, shown.quota_bytes) == (
        state,
        row.reason.value,
        (row.process.pid,),
        None,
    )


GPU = gpu(0, total_bytes=16 * GiB)
OWN_4G = Quota(limit_bytes=4 * GiB, source="limits[vramguard.io/vram]")
WHOLE_POD_8G = Quota(limit_bytes=8 * GiB, source="annotation vramguard.io/vram-limit")
SHARE_6G = Quota(limit_bytes=6 * GiB, source="claim ml/gpu", share="claim-uid/0", claim="gpu")
HELD_MAIN, HELD_POD = "main", None  # the driver holds a limit on the container's cgroup, on the pod's


@pytest.mark.parametrize(
    ("pod_quota", "held", "expected"),
    [
        pytest.param(
            PodQuota(containers={"main": OWN_4G, "side": OWN_4G}), [HELD_MAIN],
            [("main", 4, "over-hard", "driver", ""), ("side", 4, "ok", "agent", "")],
            id="own-quotas-each-judged-alone",
        ),
        pytest.param(
            PodQuota(pod=WHOLE_POD_8G), [HELD_POD],
            [("main", 8, "over-hard", "driver", ""), ("side", 8, "over-hard", "driver", "")],
            id="a-pod-wide-quota-over-on-the-sum-every-row-over",
        ),
        pytest.param(
            PodQuota(shares={"main": {GPU.uuid: SHARE_6G}, "side": {GPU.uuid: SHARE_6G}}), [HELD_MAIN, HELD_POD],
            [("main", 6, "over-hard", "driver", "gpu"), ("side", 6, "over-hard", "driver:pod", "gpu")],
            id="one-dra-share-over-on-the-sum-every-holder-over",
        ),
        pytest.param(PodQuota(), [], [("main", None, "unmanaged", "-", ""), ("side", None, "unmanaged", "-", "")],
                     id="no-quota-unmanaged"),
    ],
)  # fmt: skip
def test_a_rows_state_is_its_subjects(
    pod_quota: PodQuota, held: list[str | None], expected: list[tuple[str, int | None, str, str, str]]
) -> None:
    """Each container's row shows the quota that holds it and the state of the subject it belongs to, as the
    decision found them: a pod-wide quota or a DRA share is over on its rows' sum, and then every row of it is."""
    p = pod("trainer", "ml", containers={"main": {}, "side": {}})
    snapshot = SnapshotBuilder().use(p, "main", GPU, 5 * GiB, pid=10).use(p, "side", GPU, 4 * GiB, pid=11).build()
    decision, _ = decide(snapshot, {p.uid: pod_quota}, Policy(), DecisionState(), 0.0)
    report = ScanReport(snapshot, {p.uid: pod_quota}, decision, (), 0.0)
    limits = {LimitKey(p.uid, c, GPU.uuid): HeldLimit(1, LimitSetter.AGENT) for c in held}
    shown = rows_from_report(report, describe=lambda pid: ProcessDetail(pid, "u", "python"), driver_limits=limits)
    got = [
        (r.container, r.quota_bytes // GiB if r.quota_bytes is not None else None, r.state, r.held_by, r.claim)
        for r in shown
    ]
    assert got == expected


# NVIDIA's pair (quota.py `_pair_quota`): NVIDIA_GPU_MEMORY_REQUEST 2 GiB, LIMIT 4 GiB; KAI's 3900M (not whole MiB).
PAIR_2G_4G = Quota(limit_bytes=2 * GiB, burst_bytes=4 * GiB, source="env NVIDIA_GPU_MEMORY_REQUEST and ..._LIMIT")
KAI_3900M = Quota(limit_bytes=3_900_000_000, source="annotation nvidia.com/container.main.gpu-memory.limit")
ROUNDED_UP = 3720 * 2**20  # 3900M as KAI's NRI plugin hands it to the hook: whole MiB, rounded up
TOOLKIT, AGENT = LimitSetter.TOOLKIT, LimitSetter.AGENT


@pytest.mark.parametrize(
    ("quota", "held", "expected"),
    [
        pytest.param(PAIR_2G_4G, {"main": HeldLimit(4 * GiB, AGENT)}, "driver", id="the-agents-own-limit"),
        pytest.param(PAIR_2G_4G, {"main": HeldLimit(4 * GiB, TOOLKIT)}, "driver:toolkit",
                     id="the-toolkits-limit-at-the-quotas-hard-limit"),
        pytest.param(PAIR_2G_4G, {"main": HeldLimit(3 * GiB, TOOLKIT)}, "driver:toolkit",
                     id="the-toolkits-limit-tighter-than-the-quota"),
        pytest.param(KAI_3900M, {"main": HeldLimit(ROUNDED_UP, TOOLKIT)}, "driver:toolkit",
                     id="the-toolkits-limit-rounded-up-to-a-whole-mib-still-holds-it"),
        pytest.param(KAI_3900M, {"main": HeldLimit(ROUNDED_UP + 2**20, TOOLKIT)}, "agent",
                     id="a-mib-over-the-quota-is-looser"),
        pytest.param(PAIR_2G_4G, {"main": HeldLimit(8 * GiB, TOOLKIT)}, "agent",
                     id="the-toolkits-limit-looser-than-the-quota-leaves-it-to-the-agent"),
        pytest.param(PAIR_2G_4G, {"main": HeldLimit(8 * GiB, TOOLKIT), None: HeldLimit(4 * GiB, AGENT)},
                     "driver:pod", id="looser-but-the-pods-cgroup-holds-it"),
        pytest.param(PAIR_2G_4G, {}, "agent", id="no-limit-held"),
    ],
)  # fmt: skip
def test_who_holds_a_quota_the_toolkit_may_have_set(
    quota: Quota, held: dict[str | None, HeldLimit], expected: str
) -> None:
    """HELD-BY names the toolkit's hook where the driver holds the container within its quota by the limit the hook
    set, and the agent where that limit is looser than the quota (the agent then enforces the quota alone)."""
    p = pod("trainer", "ml", containers={"main": {}})
    snapshot = SnapshotBuilder().use(p, "main", GPU, GiB, pid=10).build()
    pod_quota = PodQuota(containers={"main": quota})
    decision, _ = decide(snapshot, {p.uid: pod_quota}, Policy(), DecisionState(), 0.0)
    report = ScanReport(snapshot, {p.uid: pod_quota}, decision, (), 0.0)
    limits = {LimitKey(p.uid, c, GPU.uuid): h for c, h in held.items()}
    [row] = rows_from_report(report, describe=lambda pid: ProcessDetail(pid, "u", "python"), driver_limits=limits)
    assert row.held_by == expected
