"""The decision core, scenario by scenario: each case is a sequence of clock steps and the actions expected."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from unittest.mock import ANY

import pytest

from vramguard.core.actions import Action, Escalation, KillRecord, Reason, Violation
from vramguard.core.decide import (
    VICTIM_ORDER,
    Comparator,
    Decision,
    DecisionState,
    by_overage,
    by_priority,
    by_uid,
    by_usage,
    decide,
    find_violations,
    ordered_by,
    quota_rows,
    rank,
    record_outcomes,
    repeat_of,
    track_pressure,
)
from vramguard.core.driver_limit import LimitKey
from vramguard.core.pod import ContainerInfo, PodInfo
from vramguard.core.policy import ActionKind, EvictionRefused, Mode, NamespacePolicy, OnRepeat, Policy
from vramguard.core.process import ProcessRef
from vramguard.core.quantity import GiB, MiB
from vramguard.core.quota import NO_SHARE, PodQuota, Quota, QuotaScope, RowQuota, Subject
from vramguard.core.sample import GpuDevice
from vramguard.core.snapshot import Snapshot, UnattributedProcess, UnattributedReason
from vramguard_testbed.fakes import FakeClock, SnapshotBuilder, gpu, pod

GPU0 = gpu(0, total_bytes=16 * GiB)
GPU1 = gpu(1, total_bytes=16 * GiB)
SICK = gpu(2, total_bytes=16 * GiB, healthy=False)

TRAINER = pod("trainer", "ml", containers={"main": {}, "sidecar": {}})
NOTEBOOK = pod("notebook", "ml", priority=100)
BATCH = pod("batch", "ml", priority=0)
SYSTEM = pod("dcgm", "kube-system")
AGENT = pod("vramguard-abc", "vramguard")
LEAVING = pod("leaving", "ml", terminating=True)
GOING = pod("going", "ml", terminating=True)  # quota 4Gi, burst 8Gi
TEAM_KILL = pod("strict", "team-kill")
OTHER = pod("other", "ml")  # no quota: unmanaged, but its memory counts toward the GPU's pressure


def violations_under(snapshot: Snapshot, quotas: Mapping[str, PodQuota]) -> tuple[Violation, ...]:
    """The snapshot's violations under `quotas`, each row's owner found first (`decide`'s step 1)."""
    return find_violations(snapshot, quota_rows(snapshot, quotas))


def q(gib: float, burst_gib: float | None = None) -> PodQuota:
    """A per-container quota of `gib` for container "main"."""
    return PodQuota(
        containers=MappingProxyType(
            {"main": Quota(limit_bytes=int(gib * GiB), burst_bytes=int(burst_gib * GiB) if burst_gib else None)}
        )
    )


QUOTAS: dict[str, PodQuota] = {
    TRAINER.uid: PodQuota(pod=Quota(limit_bytes=8 * GiB, source="annotation vramguard.io/vram-limit")),
    NOTEBOOK.uid: q(4, burst_gib=8),
    BATCH.uid: q(4, burst_gib=8),
    SYSTEM.uid: q(1),
    AGENT.uid: q(1),
    LEAVING.uid: q(1),
    GOING.uid: q(4, burst_gib=8),
    TEAM_KILL.uid: q(1),
}

Row = tuple[PodInfo, str, object, float]  # pod, container, device, GiB used


@dataclass
class Step:
    after_s: float
    rows: list[Row]
    expect: list[str]  # "kind:pod/reason", in order
    held: list[str] = field(default_factory=list)  # "pod: why-substring"


def _policy(**kw: object) -> Policy:
    base: dict[str, object] = {
        "mode": Mode.KILL,
        "pressure_free_ratio": None,
        "cooldown_s": 30.0,
        "namespaces": MappingProxyType(
            {"team-kill": NamespacePolicy(mode=Mode.KILL), "ml-warn": NamespacePolicy(mode=Mode.WARN)}
        ),
    }
    base.update(kw)
    return Policy(**base)  # type: ignore[arg-type]


PRESSURE_KILL, PRESSURE_KILL_B = "kill:notebook/gpu-pressure", "kill:batch/gpu-pressure"

CASES = [
    pytest.param(
        _policy(),
        [Step(0, [(NOTEBOOK, "main", GPU0, 3.9)], [])],
        id="under-quota-no-action",
    ),
    pytest.param(
        _policy(),
        [Step(0, [(NOTEBOOK, "main", GPU0, 9)], ["warn:notebook/over-quota", "kill:notebook/hard-limit"])],
        id="hard-limit-zero-grace-acts-in-first-scan",
    ),
    pytest.param(
        _policy(hard_grace_s=10),
        [
            Step(0, [(NOTEBOOK, "main", GPU0, 9)], ["warn:notebook/over-quota"]),
            Step(5, [(NOTEBOOK, "main", GPU0, 9)], []),
            Step(5, [(NOTEBOOK, "main", GPU0, 9)], ["kill:notebook/hard-limit"]),
        ],
        id="hard-limit-waits-for-hard-grace",
    ),
    pytest.param(
        _policy(hard_grace_s=10),
        [
            Step(0, [(NOTEBOOK, "main", GPU0, 9)], ["warn:notebook/over-quota"]),
            Step(8, [(NOTEBOOK, "main", GPU0, 7)], []),
            Step(8, [(NOTEBOOK, "main", GPU0, 9)], []),
            Step(9, [(NOTEBOOK, "main", GPU0, 9)], []),
            Step(1, [(NOTEBOOK, "main", GPU0, 9)], ["kill:notebook/hard-limit"]),
        ],
        id="hard-grace-restarts-when-usage-drops-below-burst",
    ),
    pytest.param(
        _policy(mode=Mode.WARN),
        [
            Step(
                0,
                [(NOTEBOOK, "main", GPU0, 9)],
                ["warn:notebook/over-quota"],
                held=["notebook: mode is warn"],
            ),
            Step(1, [(NOTEBOOK, "main", GPU0, 9)], [], held=["notebook: mode is warn"]),
            Step(1, [(NOTEBOOK, "main", GPU0, 3)], []),
            Step(
                1,
                [(NOTEBOOK, "main", GPU0, 9)],
                ["warn:notebook/over-quota"],
                held=["notebook: mode is warn"],
            ),
        ],
        id="warn-mode-warns-once-per-episode",
    ),
    pytest.param(
        _policy(soft_grace_s=60),
        [
            Step(0, [(NOTEBOOK, "main", GPU0, 6)], ["warn:notebook/over-quota"]),
            Step(59, [(NOTEBOOK, "main", GPU0, 6)], []),
            Step(1, [(NOTEBOOK, "main", GPU0, 6)], ["kill:notebook/soft-limit"]),
        ],
        id="soft-limit-within-burst-acts-after-soft-grace",
    ),
    pytest.param(
        _policy(soft_grace_s=60),
        [
            Step(0, [(NOTEBOOK, "main", GPU0, 6)], ["warn:notebook/over-quota"]),
            Step(1, [(NOTEBOOK, "main", GPU0, 8.5)], ["kill:notebook/hard-limit"]),
        ],
        id="above-burst-is-a-hard-violation",
    ),
    pytest.param(
        _policy(soft_grace_s=600, pressure_free_bytes=2 * GiB),
        [
            Step(
                0,
                [(NOTEBOOK, "main", GPU0, 6), (BATCH, "main", GPU0, 5)],
                ["warn:batch/over-quota", "warn:notebook/over-quota"],
            ),
            Step(1, [(NOTEBOOK, "main", GPU0, 7), (BATCH, "main", GPU0, 7.5)], ["kill:batch/gpu-pressure"]),
        ],
        id="pressure-picks-largest-overage-first",
    ),
    pytest.param(
        _policy(soft_grace_s=600, pressure_free_bytes=2 * GiB),
        [
            Step(
                0,
                [(NOTEBOOK, "main", GPU0, 7.5), (BATCH, "main", GPU0, 7.5)],
                ["warn:batch/over-quota", "warn:notebook/over-quota", "kill:batch/gpu-pressure"],
            ),
        ],
        id="pressure-tie-breaks-on-lower-priority",
    ),
    pytest.param(
        _policy(soft_grace_s=600, pressure_free_bytes=2 * GiB),
        [Step(0, [(NOTEBOOK, "main", GPU0, 4), (BATCH, "main", GPU0, 4), (TRAINER, "main", GPU0, 7.5)], [])],
        id="pressure-never-touches-pods-within-quota",
    ),
    pytest.param(
        _policy(soft_grace_s=600, pressure_free_bytes=2 * GiB),
        [
            Step(
                0,
                [(NOTEBOOK, "main", GPU0, 7.5), (BATCH, "main", GPU1, 7.5), (TRAINER, "main", GPU0, 1)],
                ["warn:batch/over-quota", "warn:notebook/over-quota"],
            )
        ],
        id="pressure-is-per-gpu",
    ),
    pytest.param(
        _policy(soft_grace_s=600, pressure_free_bytes=2 * GiB, pressure_transition_s=30),
        [
            Step(
                0,
                [(NOTEBOOK, "main", GPU0, 6), (OTHER, "main", GPU0, 9)],
                ["warn:notebook/over-quota", "kill:notebook/gpu-pressure"],
            ),
            # 6 GiB free, above the threshold, but for less than the transition period: still under pressure.
            Step(
                10,
                [(BATCH, "main", GPU0, 6), (OTHER, "main", GPU0, 4)],
                ["warn:batch/over-quota", "kill:batch/gpu-pressure"],
            ),
            # 45 s above the threshold: out of pressure; batch (cool-down over) is only over its soft limit.
            Step(35, [(BATCH, "main", GPU0, 6), (OTHER, "main", GPU0, 4)], []),
        ],
        id="pressure-lasts-the-transition-period-after-free-memory-recovers",
    ),
    pytest.param(
        _policy(soft_grace_s=600, pressure_free_bytes=2 * GiB, pressure_transition_s=0),
        [
            Step(
                0,
                [(NOTEBOOK, "main", GPU0, 6), (OTHER, "main", GPU0, 9)],
                ["warn:notebook/over-quota", "kill:notebook/gpu-pressure"],
            ),
            Step(10, [(BATCH, "main", GPU0, 6), (OTHER, "main", GPU0, 4)], ["warn:batch/over-quota"]),
        ],
        id="no-transition-period-pressure-ends-with-the-shortage",
    ),
    pytest.param(
        _policy(max_actions_per_scan=1),
        [
            Step(
                0,
                [(NOTEBOOK, "main", GPU0, 9), (BATCH, "main", GPU1, 10)],
                ["warn:batch/over-quota", "warn:notebook/over-quota", "kill:batch/hard-limit"],
                held=["notebook: max_actions_per_scan=1"],
            ),
            Step(
                1,
                [(NOTEBOOK, "main", GPU0, 9), (BATCH, "main", GPU1, 10)],
                ["kill:notebook/hard-limit"],
                held=["batch: cool-down"],
            ),
        ],
        id="max-actions-per-scan-takes-worst-first",
    ),
    pytest.param(
        _policy(cooldown_s=30),
        [
            Step(0, [(NOTEBOOK, "main", GPU0, 9)], ["warn:notebook/over-quota", "kill:notebook/hard-limit"]),
            Step(10, [(NOTEBOOK, "main", GPU0, 9)], [], held=["notebook: cool-down"]),
            Step(20, [(NOTEBOOK, "main", GPU0, 9)], ["kill:notebook/hard-limit"]),
        ],
        id="cooldown-per-container-instance",
    ),
    pytest.param(
        _policy(),
        [
            Step(
                0,
                [(SYSTEM, "main", GPU0, 9)],
                ["warn:dcgm/over-quota"],
                held=["dcgm: namespace kube-system is exempt"],
            )
        ],
        id="exempt-namespace-is-warned-never-acted-on",
    ),
    pytest.param(
        _policy(),
        [Step(0, [(AGENT, "main", GPU0, 9)], [], held=["vramguard-abc: the agent's own pod"])],
        id="never-the-agent-itself",
    ),
    pytest.param(
        _policy(mode=Mode.EVICT, cooldown_s=30),
        [
            Step(0, [(LEAVING, "main", GPU0, 9)], ["warn:leaving/over-quota", "kill:leaving/hard-limit"]),
            Step(10, [(LEAVING, "main", GPU0, 9)], [], held=["leaving: cool-down"]),
            Step(20, [(LEAVING, "main", GPU0, 9)], ["kill:leaving/hard-limit"]),
        ],
        id="terminating-pod-over-hard-limit-is-killed-again-only-after-cooldown",
    ),
    pytest.param(
        _policy(max_actions_per_scan=1),
        [
            Step(
                0,
                [(LEAVING, "main", GPU0, 9), (BATCH, "main", GPU1, 12)],
                ["warn:batch/over-quota", "warn:leaving/over-quota", "kill:batch/hard-limit"],
                held=["leaving: max_actions_per_scan=1"],
            )
        ],
        id="terminating-pod-counts-against-max-actions-per-scan",
    ),
    pytest.param(
        _policy(),
        [Step(0, [(NOTEBOOK, "main", SICK, 15)], [])],
        id="unhealthy-gpu-is-never-acted-on",
    ),
    pytest.param(
        _policy(),
        [
            Step(0, [(TRAINER, "main", GPU0, 5), (TRAINER, "sidecar", GPU0, 2)], []),
            Step(
                1,
                [(TRAINER, "main", GPU0, 5), (TRAINER, "sidecar", GPU0, 4)],
                ["warn:trainer/over-quota", "kill:trainer/hard-limit"],
            ),
        ],
        id="pod-wide-quota-sums-its-containers",
    ),
    pytest.param(
        _policy(),
        [Step(0, [(TRAINER, "main", GPU0, 5), (TRAINER, "sidecar", GPU1, 5)], [])],
        id="pod-wide-quota-is-per-gpu",
    ),
    pytest.param(
        _policy(mode=Mode.WARN),
        [Step(0, [(TEAM_KILL, "main", GPU0, 2)], ["warn:strict/over-quota", "kill:strict/hard-limit"])],
        id="namespace-mode-overrides-default-mode",
    ),
    pytest.param(
        _policy(pressure_free_bytes=8 * GiB),
        [Step(0, [(pod("unmanaged"), "main", GPU0, 15)], [])],
        id="unmanaged-pod-is-never-acted-on-even-under-pressure",
    ),
]


@pytest.mark.parametrize(("policy", "steps"), CASES)
def test_scenarios(policy: Policy, steps: list[Step]) -> None:
    """Each scan's actions (and held enforcements) match the scenario's expectations."""
    clock = FakeClock()
    state = DecisionState()
    for i, step in enumerate(steps):
        clock.step(step.after_s)
        b = SnapshotBuilder(agent_pod_uid=AGENT.uid)
        for pid, (p, container, device, used_gib) in enumerate(step.rows, start=100):
            b.use(p, container, device, int(used_gib * GiB), pid=pid)  # type: ignore[arg-type]
        decision, state = decide(b.build(), QUOTAS, policy, state, clock.now())
        got = [f"{a.kind.value}:{a.pod.name}/{a.reason.value}" for a in decision.actions]
        assert got == step.expect, f"step {i}"
        for expected in step.held:
            name, why = expected.split(": ", 1)
            held = [(h.violation.pod.name, h.why) for h in decision.held]
            assert any(n == name and why in w for n, w in held), f"step {i}: expected {name} held for {why!r}: {held}"


@pytest.mark.parametrize(
    ("mode", "used_gib", "policy_kw", "expected", "held_why"),
    [
        pytest.param(Mode.KILL, 9, {}, ActionKind.KILL, None, id="kill-mode-hard-limit-kills"),
        pytest.param(Mode.EVICT, 9, {}, ActionKind.KILL, None, id="evict-mode-hard-limit-kills-not-evicts"),
        pytest.param(Mode.WARN, 9, {}, None, "mode is warn", id="warn-mode-hard-limit-only-warns"),
        pytest.param(Mode.KILL, 6, {"soft_grace_s": 0}, None, "already terminating", id="kill-mode-soft-held"),
        pytest.param(Mode.EVICT, 6, {"soft_grace_s": 0}, None, "already terminating", id="evict-mode-soft-held"),
        pytest.param(Mode.WARN, 6, {"soft_grace_s": 0}, None, "already terminating", id="warn-mode-soft-held"),
        pytest.param(
            Mode.KILL, 6, {"pressure_free_bytes": 12 * GiB}, None, "already terminating", id="kill-mode-pressure-held"
        ),
        pytest.param(
            Mode.EVICT, 6, {"pressure_free_bytes": 12 * GiB}, None, "already terminating", id="evict-mode-pressure-held"
        ),
        pytest.param(
            Mode.WARN, 6, {"pressure_free_bytes": 12 * GiB}, None, "already terminating", id="warn-mode-pressure-held"
        ),
    ],
)
def test_terminating_pod_is_acted_on_only_over_its_hard_limit(
    mode: Mode, used_gib: float, policy_kw: dict[str, object], expected: ActionKind | None, held_why: str | None
) -> None:
    """A pod in deletion over its hard limit is killed (in evict mode too); soft limit and pressure are held."""
    policy = _policy(**{"mode": mode, "soft_grace_s": 600.0, **policy_kw})
    snapshot = SnapshotBuilder().use(GOING, "main", GPU0, int(used_gib * GiB)).build()
    decision, _ = decide(snapshot, QUOTAS, policy, DecisionState(), 0.0)
    enforced = [(a.kind, a.reason) for a in decision.actions if a.reason is not Reason.OVER_QUOTA]
    assert enforced == ([(expected, Reason.HARD_LIMIT)] if expected is not None else [])
    assert [a.kind for a in decision.actions if a.reason is Reason.OVER_QUOTA] == [ActionKind.WARN]
    if held_why is None:
        assert decision.held == ()
    else:
        (held,) = decision.held
        assert held_why in held.why


def test_one_action_per_pod_per_scan() -> None:
    """A pod violating on two GPUs is acted on once per scan, not once per GPU."""
    b = SnapshotBuilder().use(NOTEBOOK, "main", GPU0, 9 * GiB, pid=1).use(NOTEBOOK, "main", GPU1, 9 * GiB, pid=2)
    decision, _ = decide(b.build(), QUOTAS, _policy(max_actions_per_scan=5), DecisionState(), 0.0)
    assert [a.kind for a in decision.actions].count(ActionKind.KILL) == 1
    assert any("already acted on" in h.why for h in decision.held)


OWN = Quota(limit_bytes=4 * GiB, source="limits[vramguard.io/vram]")
POD_WIDE = Quota(limit_bytes=8 * GiB, source="annotation vramguard.io/vram-limit")
SHARE = Quota(limit_bytes=6 * GiB, source="claim ml/gpu", share="claim-uid/0", claim="gpu")
CONTAINER, POD, SHARED = QuotaScope.CONTAINER, QuotaScope.POD, QuotaScope.SHARE


@pytest.mark.parametrize(
    ("pod_quota", "container", "device", "owner"),
    [
        pytest.param(PodQuota(containers={"main": OWN}), "main", GPU0, (CONTAINER, "main", OWN, "main"), id="own"),
        pytest.param(PodQuota(pod=POD_WIDE), "main", GPU0, (POD, None, POD_WIDE, None), id="pod-wide"),
        pytest.param(
            PodQuota(containers={"main": OWN}, pod=POD_WIDE), "side", GPU0, (POD, None, POD_WIDE, None),
            id="a-container-without-its-own-under-the-pod-wide-quota",
        ),
        pytest.param(
            PodQuota(containers={"main": OWN}, pod=POD_WIDE), "", GPU0, (POD, None, POD_WIDE, None),
            id="the-pods-own-cgroup-under-the-pod-wide-quota",
        ),
        pytest.param(PodQuota(containers={"main": OWN}), "", GPU0, None, id="the-pods-own-cgroup-unmanaged"),
        pytest.param(
            PodQuota(shares={"main": {GPU0.uuid: SHARE}}), "main", GPU0, (SHARED, "claim-uid/0", SHARE, "main"),
            id="a-dra-share-is-its-allocations-subject",
        ),
        pytest.param(
            PodQuota(shares={"main": {GPU0.uuid: SHARE}}), "main", GPU1, (CONTAINER, "main", NO_SHARE, "main"),
            id="no-share-on-another-gpu-is-its-own-zero-quota",
        ),
        pytest.param(PodQuota(), "main", GPU0, None, id="no-quota-unmanaged"),
        pytest.param(None, "main", GPU0, None, id="no-quotas-resolved-unmanaged"),
    ],
)  # fmt: skip
def test_each_rows_owner_is_found_once(
    pod_quota: PodQuota | None,
    container: str,
    device: GpuDevice,
    owner: tuple[QuotaScope, str | None, Quota, str | None] | None,
) -> None:
    """Each row gets its subject (whose quota, and which container or share) and the quota that holds it, and
    the container whose own quota it is (the quota metric's and the driver limit's container)."""
    p = pod("trainer", "ml", containers={"main": {}, "side": {}})
    snapshot = SnapshotBuilder().use(p, container, device, GiB).build()
    quotas = {p.uid: pod_quota} if pod_quota is not None else {}
    ((usage, found),) = quota_rows(snapshot, quotas)
    assert usage == snapshot.containers[0]
    if owner is None:
        assert found is None
        return
    scope, name, quota, holder = owner
    assert found == RowQuota(Subject(p.uid, device.uuid, scope, name), quota, holder)
    assert found.limit_key == LimitKey(p.uid, holder, device.uuid)


def test_decide_judges_the_rows_it_is_handed() -> None:
    """The owners the caller worked out (`QuotaBook.rows`) are the ones judged: none are worked out again."""
    p = pod("trainer", "ml")
    snapshot = SnapshotBuilder().use(p, "main", GPU0, 2 * GiB).build()
    quotas = {p.uid: PodQuota(containers={"main": Quota(limit_bytes=GiB)})}
    (row,) = quota_rows(snapshot, quotas)
    assert decide(snapshot, quotas, Policy(), DecisionState(), 0.0)[0].violations != ()
    handed = ((row[0], None),)  # the caller says unmanaged
    decision, _ = decide(snapshot, quotas, Policy(), DecisionState(), 0.0, handed)
    assert decision.rows == handed and decision.violations == ()


def test_fair_share_quota_divides_the_device() -> None:
    """A fair-share quota is the device's total memory divided by the replica count."""
    p = pod("shared")
    quotas = {p.uid: PodQuota(containers=MappingProxyType({"main": Quota(share_divisor=4, source="fair-share")}))}
    under = SnapshotBuilder().use(p, "main", GPU0, 4 * GiB).build()
    over = SnapshotBuilder().use(p, "main", GPU0, 4 * GiB + 1).build()
    assert violations_under(under, quotas) == ()
    (v,) = violations_under(over, quotas)
    assert v.limit_bytes == 4 * GiB


def test_violation_carries_processes_and_container_ids() -> None:
    """A pod-wide violation names every process and runtime container ID involved, for the killer."""
    b = SnapshotBuilder().use(TRAINER, "main", GPU0, 5 * GiB, pid=10).use(TRAINER, "sidecar", GPU0, 5 * GiB, pid=11)
    (v,) = violations_under(b.build(), QUOTAS)
    assert [p.pid for p in v.processes] == [10, 11]
    assert set(v.container_ids) == {c.container_id for c in TRAINER.containers}
    assert v.container is None and v.subject == "pod trainer"


def test_action_message_names_container_gpu_usage_and_quota() -> None:
    """The message a person reads says who, which GPU, how much and the quota."""
    b = SnapshotBuilder().use(NOTEBOOK, "main", GPU0, int(14.2 * GiB))
    decision, _ = decide(b.build(), QUOTAS, _policy(), DecisionState(), 0.0)
    msg = decision.actions[0].message
    assert msg.startswith("container main uses 14.2GiB on GPU 0 (GPU-00000000")
    assert "quota 4.0GiB, burst 8.0GiB" in msg


def test_victim_order_prefers_overage_then_low_priority_then_usage() -> None:
    """Ranking: largest overage first; on a tie the lower priority; then the larger usage."""
    b = (
        SnapshotBuilder()
        .use(NOTEBOOK, "main", GPU0, 6 * GiB, pid=1)  # overage 2, priority 100
        .use(BATCH, "main", GPU0, 6 * GiB, pid=2)  # overage 2, priority 0
        .use(TEAM_KILL, "main", GPU0, 4 * GiB, pid=3)  # overage 3
    )
    ranked = rank(violations_under(b.build(), QUOTAS))
    assert [v.pod.name for v in ranked] == ["strict", "batch", "notebook"]


Spec = tuple[float, float, int, str]  # (quota GiB, used GiB, pod priority, pod UID): overage is used - quota


def _violation(name: str, spec: Spec) -> Violation:
    quota_gib, used_gib, priority, uid = spec
    p = pod(name, "ml", priority=priority, uid=uid)
    (v,) = violations_under(SnapshotBuilder().use(p, "main", GPU0, int(used_gib * GiB)).build(), {p.uid: q(quota_gib)})
    return v


@pytest.mark.parametrize(
    ("comparator", "a", "b", "sign"),
    [
        pytest.param(by_overage, (1, 4, 0, "a"), (2, 4, 0, "b"), -1, id="overage-larger-first"),
        pytest.param(by_overage, (2, 4, 0, "a"), (1, 3, 0, "b"), 0, id="overage-tie"),
        pytest.param(by_priority, (1, 2, 5, "a"), (1, 2, 9, "b"), -1, id="priority-lower-first"),
        pytest.param(by_priority, (1, 2, 9, "a"), (1, 2, 5, "b"), 1, id="priority-higher-after"),
        pytest.param(by_usage, (1, 6, 0, "a"), (4, 5, 0, "b"), -1, id="usage-larger-first"),
        pytest.param(by_usage, (1, 5, 0, "a"), (4, 5, 0, "b"), 0, id="usage-tie"),
        pytest.param(by_uid, (1, 2, 0, "a"), (1, 2, 0, "b"), -1, id="uid-order"),
    ],
)
def test_each_comparator(comparator: Comparator, a: Spec, b: Spec, sign: int) -> None:
    """Each comparator puts first the larger overage, lower priority, larger usage or lower UID; a tie is 0."""
    va, vb = _violation("a", a), _violation("b", b)
    assert comparator(va, vb) == sign
    assert comparator(vb, va) == -sign


# Who goes first when the criteria disagree. Each case has two violators; the expected first one is the one the
# comparator earlier in VICTIM_ORDER prefers, so any reordering of VICTIM_ORDER's comparators fails a case.
DISAGREE = [
    pytest.param((1, 4, 100, "a"), (3, 4, 0, "b"), "a", id="overage-beats-priority"),
    pytest.param((3, 4, 0, "a"), (1, 4, 100, "b"), "b", id="overage-beats-priority-reversed"),
    pytest.param((1, 3, 0, "a"), (4, 5, 0, "b"), "a", id="overage-beats-usage"),
    pytest.param((1, 2, 0, "a"), (4, 5, 100, "b"), "a", id="priority-beats-usage-on-equal-overage"),
    pytest.param((4, 5, 100, "a"), (1, 2, 0, "b"), "b", id="priority-beats-usage-reversed"),
    pytest.param((4, 5, 0, "z"), (1, 2, 0, "y"), "a", id="usage-beats-uid"),
    pytest.param((1, 2, 0, "z"), (1, 2, 0, "y"), "b", id="uid-breaks-a-full-tie"),
]


@pytest.mark.parametrize(("a", "b", "first"), DISAGREE)
def test_victim_order_when_criteria_disagree(a: Spec, b: Spec, first: str) -> None:
    """Where two criteria disagree the comparator earlier in VICTIM_ORDER decides, whatever the input order."""
    va, vb = _violation("a", a), _violation("b", b)
    assert rank([va, vb])[0].pod.name == first
    assert rank([vb, va])[0].pod.name == first, "whatever the input order"


def test_swapped_comparators_rank_differently() -> None:
    """The order of the comparators is the policy: with priority before overage, the disagreeing pair flips."""
    va, vb = _violation("a", (1, 4, 100, "a")), _violation("b", (3, 4, 0, "b"))
    assert rank([va, vb], VICTIM_ORDER)[0] is va
    assert rank([va, vb], ordered_by(by_priority, by_overage, by_usage, by_uid))[0] is vb


@pytest.mark.parametrize(
    ("period_s", "steps"),
    [
        pytest.param(30, [(0, 15, True), (10, 13, True), (29, 13, True), (30, 13, False)], id="leaves-after-period"),
        pytest.param(
            30, [(0, 15, True), (20, 13, True), (25, 15, True), (50, 13, True), (56, 13, False)], id="dip-restarts-it"
        ),
        # 16 GiB GPU, 2 GiB threshold: 14 GiB used leaves 2 GiB free, at the threshold, not under it.
        pytest.param(30, [(0, 13, False), (1, 14, False), (2, 14.5, True)], id="enters-at-once-below-threshold"),
        pytest.param(0, [(0, 15, True), (1, 13, False)], id="period-0-leaves-at-once"),
    ],
)
def test_pressure_transition_period(period_s: float, steps: list[tuple[float, float, bool]]) -> None:
    """(time, GiB used, under pressure?) in turn on one GPU: in at once, out after the period above threshold."""
    policy = _policy(pressure_free_bytes=2 * GiB, pressure_transition_s=period_s)
    state: dict[str, float] = {}
    for at, used_gib, expected in steps:
        used = int(used_gib * GiB)
        device = gpu(0, total_bytes=16 * GiB, used_bytes=used)
        state = track_pressure([device], policy, state, at)
        assert (device.uuid in state) is expected, f"at {at}s with {used_gib} GiB used"


def test_an_unhealthy_or_vanished_gpu_leaves_pressure() -> None:
    """A GPU under pressure leaves it at once when it turns unhealthy or is no longer listed."""
    policy = _policy(pressure_free_bytes=2 * GiB, pressure_transition_s=30)
    full = gpu(0, total_bytes=16 * GiB, used_bytes=15 * GiB)
    state = track_pressure([full], policy, {}, 0.0)
    assert full.uuid in state
    assert track_pressure([gpu(0, total_bytes=16 * GiB, used_bytes=15 * GiB, healthy=False)], policy, state, 1.0) == {}
    assert track_pressure([], policy, state, 1.0) == {}


def test_state_is_bounded() -> None:
    """Episodes end when usage is back under quota, and cool-downs are forgotten once they expire."""
    over = SnapshotBuilder().use(NOTEBOOK, "main", GPU0, 9 * GiB).build()
    under = SnapshotBuilder().use(NOTEBOOK, "main", GPU0, 1 * GiB).build()
    _, state = decide(over, QUOTAS, _policy(cooldown_s=30), DecisionState(), 0.0)
    assert state.episodes and state.last_action_at
    _, state = decide(under, QUOTAS, _policy(cooldown_s=30), state, 31.0)
    assert not state.episodes and not state.last_action_at


def test_capped_fair_share_is_bounded_on_a_large_gpu() -> None:
    """A namespace cap bounds a fair share even where the device's share would be larger."""
    p = pod("shared")
    quota = Quota(share_divisor=2, cap_bytes=6 * GiB, source="fair-share capped")
    quotas = {p.uid: PodQuota(containers=MappingProxyType({"main": quota}))}
    (v,) = violations_under(SnapshotBuilder().use(p, "main", GPU0, 7 * GiB).build(), quotas)
    assert v.limit_bytes == 6 * GiB  # not 16Gi / 2 = 8Gi


# --------------------------------------------------------------------------------------------------------------
# Repeats: a container instance killed in and over its quota again, by a process started after the kill, within the
# repeat window

SUPERVISED = pod("ray-head", "ml")
RESTARTED = replace(
    SUPERVISED, containers=(ContainerInfo(name="main", container_id="f" * 64),)
)  # the same pod after the kubelet restarted its container: a new runtime ID
EVICTING_NS = pod("serve", "ml-evict")
REPEAT_QUOTAS = {p.uid: q(1) for p in (SUPERVISED, EVICTING_NS)}


@dataclass
class Scan:
    after_s: float
    pod: PodInfo
    used_gib: float
    expect: list[str]  # "kind:pod" or "kind:pod+step" for an escalated action
    held: str | None = None  # a substring of why the enforcement was held
    pid: int | None = None  # the container's GPU process (start time pid * 10); None: a new one each scan


def _repeat_policy(**kw: object) -> Policy:
    namespaces = {"ml-evict": NamespacePolicy(mode=Mode.EVICT), "ml-wait": NamespacePolicy(on_repeat=OnRepeat.WAIT)}
    return _policy(**{"cooldown_s": 60.0, "namespaces": MappingProxyType(namespaces), **kw})


REPEAT_CASES = [
    pytest.param(
        _repeat_policy(),
        [
            Scan(0, SUPERVISED, 2, ["warn:ray-head", "kill:ray-head"]),
            Scan(0.5, SUPERVISED, 2, ["kill:ray-head+kill-container"]),
        ],
        id="kill-mode-repeat-kills-the-whole-container-at-once",
    ),
    pytest.param(
        _repeat_policy(hard_grace_s=10),
        [
            Scan(0, SUPERVISED, 2, ["warn:ray-head"]),
            Scan(10, SUPERVISED, 2, ["kill:ray-head"]),
            Scan(0.5, SUPERVISED, 0, []),
            Scan(0.5, SUPERVISED, 2, ["warn:ray-head", "kill:ray-head+kill-container"]),
        ],
        id="repeat-skips-hard-grace-it-had-before-the-kill",
    ),
    pytest.param(
        _repeat_policy(),
        [
            Scan(0, SUPERVISED, 2, ["warn:ray-head", "kill:ray-head"]),
            Scan(5, SUPERVISED, 0.5, []),
            Scan(20, SUPERVISED, 0.5, []),
        ],
        id="over-once-then-within-quota-is-not-escalated",
    ),
    pytest.param(
        _repeat_policy(),
        [
            Scan(0, SUPERVISED, 2, ["warn:ray-head", "kill:ray-head"]),
            Scan(2, RESTARTED, 2, ["kill:ray-head"]),
            Scan(0.5, RESTARTED, 2, ["kill:ray-head+kill-container"]),
        ],
        id="restarted-container-new-id-is-killed-at-once-then-a-repeat-of-its-own",
    ),
    pytest.param(
        _repeat_policy(),
        [
            Scan(0, SUPERVISED, 2, ["warn:ray-head", "kill:ray-head"]),
            Scan(61, SUPERVISED, 2, ["kill:ray-head+kill-container"]),
        ],
        id="over-again-after-the-cooldown-within-the-repeat-window-is-a-repeat",
    ),
    pytest.param(
        _repeat_policy(cooldown_s=0.0),
        [
            Scan(0, SUPERVISED, 2, ["warn:ray-head", "kill:ray-head"]),
            Scan(0.5, SUPERVISED, 2, ["kill:ray-head+kill-container"]),
        ],
        id="cooldown-0s-still-escalates-a-repeat",
    ),
    pytest.param(
        _repeat_policy(cooldown_s=0.0),
        [
            Scan(0, SUPERVISED, 2, ["warn:ray-head", "kill:ray-head"]),
            Scan(300, SUPERVISED, 2, ["kill:ray-head"]),
        ],
        id="over-again-after-the-repeat-window-is-a-plain-kill",
    ),
    pytest.param(
        _repeat_policy(repeat_window_s=10.0),
        [
            Scan(0, SUPERVISED, 2, ["warn:ray-head", "kill:ray-head"]),
            Scan(10, SUPERVISED, 2, [], held="cool-down: acted 10.0s ago (cooldown 1m)"),
            Scan(50, SUPERVISED, 2, ["kill:ray-head"]),
        ],
        id="past-a-short-repeat-window-the-cooldown-spaces-plain-kills",
    ),
    pytest.param(
        _repeat_policy(on_repeat=OnRepeat.WAIT),
        [
            Scan(0, SUPERVISED, 2, ["warn:ray-head", "kill:ray-head"]),
            Scan(0.5, SUPERVISED, 2, [], held="cool-down"),
            Scan(60, SUPERVISED, 2, ["kill:ray-head"]),
        ],
        id="on-repeat-wait-keeps-the-cooldown",
    ),
    pytest.param(
        _repeat_policy(on_repeat=OnRepeat.EVICT),
        [
            Scan(0, SUPERVISED, 2, ["warn:ray-head", "kill:ray-head"]),
            Scan(0.5, SUPERVISED, 2, ["evict:ray-head+evict"]),
        ],
        id="on-repeat-evict-in-kill-mode-evicts",
    ),
    pytest.param(
        _repeat_policy(on_eviction_refused=EvictionRefused.KILL),
        [
            Scan(0, EVICTING_NS, 2, ["warn:serve", "evict:serve"]),
            Scan(0.5, EVICTING_NS, 2, ["evict:serve+evict"]),
        ],
        id="evict-mode-repeat-after-a-refused-eviction-and-kill-evicts",
    ),
    pytest.param(
        _repeat_policy(),
        [
            Scan(0, SUPERVISED, 2, ["warn:ray-head", "kill:ray-head"], pid=200),
            Scan(0.5, SUPERVISED, 2, [], held="cool-down", pid=200),
        ],
        id="the-process-the-kill-did-not-end-has-not-come-back-no-repeat",
    ),
    pytest.param(
        _repeat_policy(),
        [
            Scan(0, SUPERVISED, 2, ["warn:ray-head", "kill:ray-head"], pid=200),
            Scan(0.5, SUPERVISED, 2, [], held="cool-down", pid=150),
            Scan(60, SUPERVISED, 2, ["kill:ray-head"], pid=150),
        ],
        id="a-process-older-than-the-killed-one-has-not-come-back-its-kill-is-plain",
    ),
]


def _play(
    policy: Policy, scans: list[Scan], outcomes: Callable[[DecisionState, Decision, float], DecisionState]
) -> None:
    """Each scan's decision against what it expects; `outcomes` records in the state what the agent does with the
    decision's actions."""
    clock = FakeClock()
    state = DecisionState()
    for i, scan in enumerate(scans):
        clock.step(scan.after_s)
        pid = scan.pid if scan.pid is not None else 100 + i  # a supervisor's new worker each scan
        snapshot = SnapshotBuilder().use(scan.pod, "main", GPU0, int(scan.used_gib * GiB), pid=pid).build()
        decision, state = decide(snapshot, REPEAT_QUOTAS, policy, state, clock.now())
        got = [
            f"{a.kind.value}:{a.pod.name}" + (f"+{a.escalation.step.value}" if a.escalation else "")
            for a in decision.actions
        ]
        assert got == scan.expect, f"scan {i}"
        if scan.held is not None:
            assert any(scan.held in h.why for h in decision.held), f"scan {i}: {decision.held}"
        state = outcomes(state, decision, clock.now())


@pytest.mark.parametrize(("policy", "scans"), REPEAT_CASES)
def test_repeats(policy: Policy, scans: list[Scan]) -> None:
    """A repeat is acted on at once, one step further; a restarted container, a cured one, or one whose process
    over its quota did not start after the kill is not a repeat."""

    def outcomes(state: DecisionState, decision: Decision, now: float) -> DecisionState:
        # Each kill (and an evict mode's refused-then-killed) is recorded, with the processes it killed.
        killed = [a for a in decision.actions if a.kind is not ActionKind.WARN]
        return record_outcomes(state, now, killed_in=_killed_in(killed))

    _play(policy, scans, outcomes)


EVICTING_GOING = replace(EVICTING_NS, terminating=True)  # the pod once the watch shows its deletion

EVICTION_CASES = [
    pytest.param(
        _repeat_policy(cooldown_s=0.0),
        True,
        [
            Scan(0, EVICTING_NS, 2, ["warn:serve", "evict:serve"]),
            Scan(1, EVICTING_NS, 2, [], held="evicted 1.0s ago: waiting for its deletion (eviction_timeout 15s)"),
            Scan(13.9, EVICTING_NS, 2, [], held="waiting for its deletion"),
            Scan(0.1, EVICTING_NS, 2, ["evict:serve"]),
        ],
        id="accepted-eviction-holds-the-next-until-the-eviction-timeout",
    ),
    pytest.param(
        _repeat_policy(cooldown_s=0.0),
        True,
        [
            Scan(0, EVICTING_NS, 2, ["warn:serve", "evict:serve"]),
            Scan(1, EVICTING_GOING, 2, ["kill:serve"]),
        ],
        id="seen-terminating-over-its-hard-limit-is-killed-not-evicted-again",
    ),
    pytest.param(
        _repeat_policy(),
        True,
        [
            Scan(0, EVICTING_NS, 2, ["warn:serve", "evict:serve"]),
            Scan(1, EVICTING_GOING, 2, [], held="cool-down: acted 1.0s ago"),
            Scan(59.5, EVICTING_GOING, 2, ["kill:serve"]),
        ],
        id="the-pod-it-evicted-has-its-grace-period-for-the-cooldown-then-is-killed",
    ),
    pytest.param(
        _repeat_policy(on_repeat=OnRepeat.EVICT),
        True,
        [
            Scan(0, SUPERVISED, 2, ["warn:ray-head", "kill:ray-head"]),
            Scan(0.5, SUPERVISED, 2, ["evict:ray-head+evict"]),
            Scan(0.5, SUPERVISED, 2, [], held="waiting for its deletion"),
        ],
        id="a-repeat-escalated-to-an-eviction-is-held-too",
    ),
    pytest.param(
        _repeat_policy(cooldown_s=0.0),
        False,
        [
            Scan(0, EVICTING_NS, 2, ["warn:serve", "evict:serve"]),
            Scan(1, EVICTING_NS, 2, ["evict:serve"]),
        ],
        id="an-eviction-not-accepted-is-spaced-by-the-cooldown-alone",
    ),
]


@pytest.mark.parametrize(("policy", "accepted", "scans"), EVICTION_CASES)
def test_one_eviction_per_pod_until_it_is_seen_going(policy: Policy, accepted: bool, scans: list[Scan]) -> None:
    """After the API server accepted an eviction, the pod is not evicted again until it is seen terminating or
    gone, or eviction_timeout has passed."""

    def outcomes(state: DecisionState, decision: Decision, now: float) -> DecisionState:
        killed_in = _killed_in(a for a in decision.actions if a.kind is ActionKind.KILL)
        evicted = [a.pod.uid for a in decision.actions if a.kind is ActionKind.EVICT and accepted]
        return record_outcomes(state, now, killed_in=killed_in, evicted=evicted)

    _play(policy, scans, outcomes)


def test_an_accepted_eviction_is_forgotten_once_the_pod_is_gone() -> None:
    """The record of accepted evictions is bounded: a pod that left the pod cache leaves it."""
    state = record_outcomes(DecisionState(), 0.0, evicted=[EVICTING_NS.uid])
    idle = SnapshotBuilder().build()
    _, state = decide(idle, REPEAT_QUOTAS, _repeat_policy(), state, 1.0)
    assert dict(state.evicted) == {EVICTING_NS.uid: 0.0}
    _, state = decide(idle, {}, _repeat_policy(), state, 2.0)
    assert not state.evicted


def _killed_in(actions: Iterable[Action]) -> list[tuple[str, tuple[ProcessRef, ...]]]:
    """What the agent records of these actions' kills: each container instance with the processes killed."""
    return [(c, a.violation.processes) for a in actions for c in a.violation.container_ids]


SUPERVISED_ID = SUPERVISED.containers[0].container_id or ""


@pytest.mark.parametrize(
    ("restored", "message"),
    [
        pytest.param(False, "GPU processes came back within 0.4 s of the last kill", id="a-kill-of-this-agent"),
        pytest.param(
            True,
            "GPU processes came back within 0.4 s of the last kill "
            "(a kill recorded by an earlier agent, restored from kills.json)",
            id="a-kill-restored-from-disk-says-so",
        ),
    ],
)
def test_repeat_message_says_how_soon_the_processes_came_back(restored: bool, message: str) -> None:
    """The escalation says how long after the last kill the container was over its quota again, and whether that
    kill was recorded by an earlier agent."""
    policy = _repeat_policy()
    killed = (ProcessRef(100, 1000),)
    state = DecisionState(kills=MappingProxyType({SUPERVISED_ID: KillRecord(100.0, killed, restored=restored)}))
    over = SnapshotBuilder().use(SUPERVISED, "main", GPU0, 2 * GiB, pid=101).build()
    decision, _ = decide(over, REPEAT_QUOTAS, policy, state, 100.4)
    assert [a.kind for a in decision.actions] == [ActionKind.WARN, ActionKind.KILL]
    escalation = decision.actions[1].escalation
    assert escalation is not None and escalation.restored is restored
    assert escalation.came_back == message


def _over(*processes: tuple[int, int], container_ids: tuple[str, ...] = (SUPERVISED_ID,)) -> Violation:
    """SUPERVISED over its 1Gi quota on GPU0 with these processes, each (PID, start time)."""
    return Violation(
        pod=SUPERVISED,
        container="main",
        device=GPU0,
        used_bytes=2 * GiB,
        limit_bytes=1 * GiB,
        hard_bytes=1 * GiB,
        quota_source="test",
        processes=tuple(ProcessRef(pid, start) for pid, start in processes),
        container_ids=container_ids,
        key=Subject(SUPERVISED.uid, GPU0.uuid, QuotaScope.CONTAINER, "main"),
    )


def _kill(at: float, *killed: tuple[int, int], restored: bool = False) -> KillRecord:
    return KillRecord(at, tuple(ProcessRef(pid, start) for pid, start in killed), restored)


OTHER_ID = "e" * 64

KILLED_CONTAINER = OnRepeat.KILL_CONTAINER

REPEAT_OF_CASES = [
    pytest.param(
        _over((7, 500)), {SUPERVISED_ID: _kill(90, (5, 400))}, Escalation(KILLED_CONTAINER, 9.0),
        id="a-process-started-after-the-kill-came-back",
    ),
    pytest.param(
        _over((7, 500)), {SUPERVISED_ID: _kill(90, (5, 400), restored=True)},
        Escalation(KILLED_CONTAINER, 9.0, restored=True), id="a-restored-kill-escalates-and-says-restored",
    ),
    pytest.param(
        _over((5, 400), (9, 600)), {SUPERVISED_ID: _kill(90, (5, 300), (6, 410))}, Escalation(KILLED_CONTAINER, 9.0),
        id="one-new-process-among-old-ones-came-back",
    ),
    pytest.param(_over((5, 400)), {SUPERVISED_ID: _kill(90, (5, 400))}, None, id="the-killed-process-itself-no"),
    pytest.param(_over((4, 300)), {SUPERVISED_ID: _kill(90, (5, 400))}, None, id="a-process-older-than-the-kill-no"),
    pytest.param(
        _over((6, 400)), {SUPERVISED_ID: _kill(90, (5, 400))}, None, id="started-in-the-killed-ones-tick-no",
    ),
    pytest.param(
        _over((7, 450)), {SUPERVISED_ID: _kill(90, (5, 400), (8, 500))}, None,
        id="not-after-every-killed-process-no",
    ),
    pytest.param(_over((7, 500)), {SUPERVISED_ID: _kill(90)}, None, id="a-kill-that-names-no-process-is-no-evidence"),
    pytest.param(_over((7, -1)), {SUPERVISED_ID: _kill(90, (5, 400))}, None, id="an-unknown-start-time-no"),
    pytest.param(_over((7, 500)), {OTHER_ID: _kill(90, (5, 400))}, None, id="a-kill-in-another-container-no"),
    pytest.param(
        _over((7, 500)), {SUPERVISED_ID: _kill(99.0 - 300, (5, 400))}, None, id="a-kill-before-the-repeat-window-no",
    ),
    pytest.param(
        _over((7, 500), container_ids=(SUPERVISED_ID, OTHER_ID)),
        {SUPERVISED_ID: _kill(90, (5, 400), restored=True), OTHER_ID: _kill(95, (6, 450))},
        Escalation(KILLED_CONTAINER, 4.0), id="of-two-kills-the-last-one-it-came-back-after",
    ),
    pytest.param(
        _over((7, 500), container_ids=(SUPERVISED_ID, OTHER_ID)),
        {SUPERVISED_ID: _kill(90, (5, 400), restored=True), OTHER_ID: _kill(95, (6, 600))},
        Escalation(KILLED_CONTAINER, 9.0, restored=True), id="a-later-kill-it-did-not-come-back-after-is-not-the-one",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("v", "kills", "expected"), REPEAT_OF_CASES)
def test_repeat_of(v: Violation, kills: dict[str, KillRecord], expected: Escalation | None) -> None:
    """A violation is a repeat only on evidence that GPU processes came back: one of its processes started after
    every process the last kill in its container instance killed (start times, both from /proc), within the
    repeat window; the escalation carries whether that kill was restored from disk."""
    assert repeat_of(v, _repeat_policy(), kills, 99.0) == expected


def test_on_repeat_wait_makes_no_repeat_whatever_the_evidence() -> None:
    """With on_repeat: wait, a process that came back after a kill is no repeat."""
    kills = {SUPERVISED_ID: _kill(90, (5, 400))}
    assert repeat_of(_over((7, 500)), _repeat_policy(on_repeat=OnRepeat.WAIT), kills, 99.0) is None


def test_a_recorded_kill_keeps_what_it_killed() -> None:
    """A kill's record replaces the last one of its container instance, with every process killed there; a record
    this agent makes is never restored, whatever the one it replaces was."""
    state = DecisionState(kills=MappingProxyType({SUPERVISED_ID: _kill(1.0, (5, 400), restored=True)}))
    killed_in = [(SUPERVISED_ID, [ProcessRef(9, 900)]), (SUPERVISED_ID, [ProcessRef(8, 800)])]
    state = record_outcomes(state, 2.0, killed_in=killed_in)
    state = record_outcomes(state, 3.0, killed_in=[(OTHER_ID, [ProcessRef(3, 30)])])
    assert dict(state.kills) == {SUPERVISED_ID: _kill(2.0, (8, 800), (9, 900)), OTHER_ID: _kill(3.0, (3, 30))}


@pytest.mark.parametrize(
    ("killed_in", "evicted", "kills", "evictions"),
    [
        pytest.param([], [], {OTHER_ID: 1.0}, {"evicted-before": 1.0}, id="nothing-done-the-state-is-kept-as-it-is"),
        pytest.param(
            [(SUPERVISED_ID, [ProcessRef(9, 900)])], [], {OTHER_ID: 1.0, SUPERVISED_ID: 2.0},
            {"evicted-before": 1.0}, id="a-kill-is-remembered-the-evictions-kept",
        ),
        pytest.param(
            [], ["pod-uid"], {OTHER_ID: 1.0}, {"evicted-before": 1.0, "pod-uid": 2.0},
            id="an-accepted-eviction-is-remembered-the-kills-kept",
        ),
        pytest.param(
            [(SUPERVISED_ID, [ProcessRef(9, 900)])], ["pod-uid"], {OTHER_ID: 1.0, SUPERVISED_ID: 2.0},
            {"evicted-before": 1.0, "pod-uid": 2.0}, id="both-in-one-scan",
        ),
    ],
)  # fmt: skip
def test_outcomes_are_folded_into_the_state_once(
    killed_in: list[tuple[str, list[ProcessRef]]],
    evicted: list[str],
    kills: dict[str, float],
    evictions: dict[str, float],
) -> None:
    """What the enforcer did in a scan (kills, accepted evictions) is folded into the decision's state in one step;
    a scan that did neither keeps the very state `decide` returned."""
    before = DecisionState(
        kills=MappingProxyType({OTHER_ID: _kill(1.0, (3, 30))}),
        evicted=MappingProxyType({"evicted-before": 1.0}),
    )
    after = record_outcomes(before, 2.0, killed_in=killed_in, evicted=evicted)
    assert {c: r.at for c, r in after.kills.items()} == kills
    assert dict(after.evicted) == evictions
    assert (after is before) == (not killed_in and not evicted)


@pytest.mark.parametrize(
    ("namespace", "policy", "expected"),
    [
        pytest.param("ml", _repeat_policy(), OnRepeat.KILL_CONTAINER, id="kill-mode-default-kills-the-container"),
        pytest.param("ml-evict", _repeat_policy(), OnRepeat.EVICT, id="evict-mode-default-evicts"),
        pytest.param("ml-wait", _repeat_policy(), OnRepeat.WAIT, id="namespace-override"),
        pytest.param("ml", _repeat_policy(on_repeat=OnRepeat.EVICT), OnRepeat.EVICT, id="policy-wide-choice"),
        pytest.param(
            "ml-evict", _repeat_policy(on_repeat=OnRepeat.KILL_CONTAINER), OnRepeat.KILL_CONTAINER,
            id="policy-wide-choice-beats-the-mode-default",
        ),
    ],
)  # fmt: skip
def test_on_repeat_for(namespace: str, policy: Policy, expected: OnRepeat) -> None:
    """Namespace override, else the policy's choice, else the mode's next step."""
    assert policy.on_repeat_for(namespace) is expected


@pytest.mark.parametrize(
    ("cooldown_s", "kept_until_s"),
    [
        pytest.param(60.0, 300.0, id="kept-for-the-repeat-window-not-the-cooldown"),
        pytest.param(0.0, 300.0, id="cooldown-0s-keeps-them-all-the-same"),
    ],
)
def test_kills_are_forgotten_after_the_repeat_window(cooldown_s: float, kept_until_s: float) -> None:
    """The record of kills is bounded by the repeat window (default 5m), whatever the cooldown."""
    policy = _repeat_policy(cooldown_s=cooldown_s)
    state = record_outcomes(DecisionState(), 0.0, killed_in=[("a" * 64, [ProcessRef(5, 50)])])
    idle = SnapshotBuilder().use(SUPERVISED, "main", GPU0, 0).build()
    _, state = decide(idle, REPEAT_QUOTAS, policy, state, kept_until_s - 0.1)
    assert dict(state.kills) == {"a" * 64: _kill(0.0, (5, 50))}
    _, state = decide(idle, REPEAT_QUOTAS, policy, state, kept_until_s)
    assert not state.kills


# --------------------------------------------------------------------------------------------------------------
# Pressure notices: who is told, and what, when a GPU enters memory pressure

PRESSURE = _policy(soft_grace_s=600, pressure_free_bytes=2 * GiB, pressure_transition_s=0)
TRAINER_OVER = "ml/trainer holds 11.0GiB, 3.0GiB over its 8.0GiB quota"

NoticeStep = tuple[float, list[Row], list[tuple[str, str]]]  # after s, rows, (pod told, message) in order

NOTICE_CASES = [
    pytest.param(
        [
            (
                0,
                [(TRAINER, "main", GPU0, 11), (OTHER, "main", GPU0, 4)],
                [
                    ("ml/other", f"GPU 0 is 93 % full (15.0GiB of 16.0GiB); {TRAINER_OVER}"),
                    ("ml/trainer", f"GPU 0 is 93 % full (15.0GiB of 16.0GiB); {TRAINER_OVER}"),
                ],
            ),
        ],
        id="entering-pressure-tells-every-pod-there-the-offender-too",
    ),
    pytest.param(
        [
            (0, [(TRAINER, "main", GPU0, 11), (OTHER, "main", GPU0, 4)], [("ml/other", ANY), ("ml/trainer", ANY)]),
            (1, [(TRAINER, "main", GPU0, 11), (OTHER, "main", GPU0, 4.5)], []),
            (1, [(TRAINER, "main", GPU0, 12), (OTHER, "main", GPU0, 3.5)], []),
        ],
        id="staying-in-pressure-tells-no-one-again",
    ),
    pytest.param(
        [
            (0, [(TRAINER, "main", GPU0, 11), (OTHER, "main", GPU0, 4)], [("ml/other", ANY), ("ml/trainer", ANY)]),
            (1, [(TRAINER, "main", GPU0, 11), (OTHER, "main", GPU0, 1)], []),
            (1, [(TRAINER, "main", GPU0, 11), (OTHER, "main", GPU0, 4)], [("ml/other", ANY), ("ml/trainer", ANY)]),
        ],
        id="leaving-and-entering-again-tells-them-again",
    ),
    pytest.param(
        [
            (
                0,
                [(NOTEBOOK, "main", GPU0, 3.5), (OTHER, "main", GPU0, 11)],
                [
                    (
                        "ml/notebook",
                        "GPU 0 is 90 % full (14.5GiB of 16.0GiB); no pod is over its quota there: "
                        "3.5GiB by pods within their quotas, 11.0GiB by pods without a quota there",
                    ),
                    ("ml/other", ANY),
                ],
            ),
        ],
        id="no-one-over-quota-says-where-the-memory-is",
    ),
    pytest.param(
        [
            (
                0,
                [(SYSTEM, "main", GPU0, 2), (TRAINER, "main", GPU0, 13), (NOTEBOOK, "main", GPU0, 0.5)],
                [
                    (
                        "kube-system/dcgm",
                        "GPU 0 is 96 % full (15.5GiB of 16.0GiB); ml/trainer holds 13.0GiB, 5.0GiB over its 8.0GiB "
                        "quota; kube-system/dcgm container main holds 2.0GiB, 1.0GiB over its 1.0GiB quota",
                    ),
                    ("ml/notebook", ANY),
                    ("ml/trainer", ANY),
                ],
            ),
        ],
        id="exempt-pods-are-told-and-named-furthest-over-first",
    ),
    pytest.param(
        [
            (
                0,
                [
                    (TRAINER, "main", GPU0, 11),
                    (OTHER, "main", GPU0, 4),
                    (AGENT, "main", GPU0, 0.5),
                    (BATCH, "main", GPU1, 1),
                ],
                [("ml/other", ANY), ("ml/trainer", ANY)],
            ),
        ],
        id="only-pods-on-that-gpu-never-the-agent",
    ),
    pytest.param(
        [(0, [(TRAINER, "main", GPU0, 14.5), (BATCH, "main", GPU1, 15)], [("ml/trainer", ANY), ("ml/batch", ANY)])],
        id="each-gpu-entering-pressure-tells-its-own-pods",
    ),
]


@pytest.mark.parametrize("steps", NOTICE_CASES)
def test_pressure_notices(steps: list[NoticeStep]) -> None:
    """A GPU entering pressure tells each pod on it once per episode, naming who is over; never the agent."""
    clock = FakeClock()
    state = DecisionState()
    for i, (after_s, rows, expected) in enumerate(steps):
        clock.step(after_s)
        b = SnapshotBuilder(agent_pod_uid=AGENT.uid)
        for pid, (p, container, device, used_gib) in enumerate(rows, start=100):
            b.use(p, container, device, int(used_gib * GiB), pid=pid)  # type: ignore[arg-type]
        decision, state = decide(b.build(), QUOTAS, PRESSURE, state, clock.now())
        got = [(n.pod.key, n.message) for n in decision.notices]
        assert got == expected, f"step {i}"


def _with_device(snapshot: Snapshot, device: GpuDevice, used_bytes: int, **kw: object) -> Snapshot:
    """`snapshot` with `device` as its only device, `used_bytes` of it used (what NVML says, whoever holds it)."""
    full = replace(device, used_bytes=used_bytes, free_bytes=device.total_bytes - used_bytes)
    return Snapshot(devices=(full,), containers=snapshot.containers, **kw)  # type: ignore[arg-type]


MIG = GpuDevice(
    index=0,
    uuid="MIG-00000000-0000-0000-0000-000000000001",
    name="Fake GPU MIG 2g.20gb",
    total_bytes=20 * GiB,
    used_bytes=0,
    free_bytes=20 * GiB,
    mig_index=1,
    parent_uuid=GPU0.uuid,
)


def test_a_notice_names_the_five_furthest_over_and_counts_the_rest() -> None:
    """Seven pods over their 2Gi quota on a MIG instance by 128 MiB steps: the five furthest over are named."""
    jobs = [pod(f"job-{k}", "batch") for k in range(1, 8)]
    quotas = {p.uid: q(2) for p in jobs}
    b = SnapshotBuilder()
    for k, p in enumerate(jobs, start=1):
        b.use(p, "main", MIG, 2 * GiB + k * 128 * MiB, pid=100 + k)
    snapshot = _with_device(b.build(), MIG, 2 * GiB * 7 + 28 * 128 * MiB)
    decision, _ = decide(snapshot, quotas, _policy(pressure_free_bytes=3 * GiB), DecisionState(), 0.0)
    assert [n.pod.name for n in decision.notices] == [f"job-{k}" for k in range(1, 8)]
    assert decision.notices[0].message == (
        "GPU 0/mig1 is 87 % full (17.5GiB of 20.0GiB); "
        "batch/job-7 container main holds 2.9GiB, 896.0MiB over its 2.0GiB quota; "
        "batch/job-6 container main holds 2.8GiB, 768.0MiB over its 2.0GiB quota; "
        "batch/job-5 container main holds 2.6GiB, 640.0MiB over its 2.0GiB quota; "
        "batch/job-4 container main holds 2.5GiB, 512.0MiB over its 2.0GiB quota; "
        "batch/job-3 container main holds 2.4GiB, 384.0MiB over its 2.0GiB quota; "
        "and 2 more over their quota"
    )


def test_a_notice_with_no_one_over_counts_memory_outside_pods() -> None:
    """Memory of processes outside any pod, and memory NVML lists against no process, are said as such."""
    rows = SnapshotBuilder().use(NOTEBOOK, "main", GPU0, 3 * GiB).build()
    stranger = UnattributedProcess(ProcessRef(pid=7, start_time=70), GPU0.uuid, 10 * GiB, UnattributedReason.NOT_IN_POD)
    snapshot = _with_device(rows, GPU0, int(14.5 * GiB), unattributed=(stranger,))
    decision, _ = decide(snapshot, QUOTAS, PRESSURE, DecisionState(), 0.0)
    assert [(n.pod.key, n.message) for n in decision.notices] == [
        (
            "ml/notebook",
            "GPU 0 is 90 % full (14.5GiB of 16.0GiB); no pod is over its quota there: 3.0GiB by pods within their "
            "quotas, 10.0GiB by processes outside any pod, 1.5GiB not listed against any process",
        )
    ]
