"""What the decision core outputs: the few rules a violation, an escalation, an action and a notice carry."""

from __future__ import annotations

import pytest

from vramguard.core.actions import Action, Escalation, PressureNotice, Reason, Violation
from vramguard.core.pod import PodInfo
from vramguard.core.policy import ActionKind, OnRepeat
from vramguard.core.process import ProcessRef
from vramguard.core.quantity import GiB
from vramguard.core.quota import QuotaScope, Subject
from vramguard.core.sample import GpuDevice

POD = PodInfo("5f3c2b1a-0000-4000-8000-000000000002", "ml", "trainer")
GPU = GpuDevice(index=0, uuid="GPU-0", name="H100", total_bytes=80 * GiB, used_bytes=78 * GiB, free_bytes=2 * GiB)


def violation(used_gib: int, limit_gib: int = 8, hard_gib: int = 12, container: str | None = "main") -> Violation:
    return Violation(
        pod=POD,
        container=container,
        device=GPU,
        used_bytes=used_gib * GiB,
        limit_bytes=limit_gib * GiB,
        hard_bytes=hard_gib * GiB,
        quota_source="limits[vramguard.io/vram]",
        processes=(ProcessRef(7, 100),),
        container_ids=("c0ffee",),
        key=Subject(POD.uid, GPU.uuid, QuotaScope.CONTAINER, container),
    )


@pytest.mark.parametrize(
    ("used_gib", "hard", "overage_gib"),
    [
        pytest.param(10, False, 2, id="over-the-soft-limit-within-the-burst"),
        pytest.param(12, False, 4, id="at-the-hard-limit-is-not-over-it"),
        pytest.param(13, True, 5, id="over-the-hard-limit"),
    ],
)
def test_a_violation_is_hard_past_its_hard_limit(used_gib: int, hard: bool, overage_gib: int) -> None:
    """The overage is counted from the quota (the soft limit); hard means past the burst."""
    v = violation(used_gib)
    assert (v.hard, v.overage_bytes) == (hard, overage_gib * GiB)


def test_a_violation_names_its_subject_and_what_a_kill_signals() -> None:
    """A container's violation names the container, a pod-wide one the pod; a kill signals its processes only."""
    assert violation(13).subject == "container main"
    assert violation(13, container=None).subject == "pod trainer"
    target = violation(13).target
    assert (target.pod_uid, target.container_ids, target.processes) == (POD.uid, ("c0ffee",), (ProcessRef(7, 100),))


@pytest.mark.parametrize(
    ("kind", "escalation", "step"),
    [
        pytest.param(ActionKind.KILL, None, None, id="a-first-offence-is-no-repeat"),
        pytest.param(ActionKind.KILL, Escalation(OnRepeat.KILL_CONTAINER, 3.0), OnRepeat.KILL_CONTAINER, id="kill"),
        pytest.param(ActionKind.EVICT, Escalation(OnRepeat.EVICT, 3.0), OnRepeat.EVICT, id="evict"),
        pytest.param(ActionKind.KILL, Escalation(OnRepeat.EVICT, 3.0), OnRepeat.KILL_CONTAINER, id="killed-whole"),
    ],
)
def test_a_repeat_is_counted_by_what_the_action_does(
    kind: ActionKind, escalation: Escalation | None, step: OnRepeat | None
) -> None:
    """A repeat's step is what the action does: a terminating pod killed where it would be evicted counts a kill."""
    assert Action(kind, Reason.HARD_LIMIT, violation(13), escalation).repeat_step == step


@pytest.mark.parametrize(
    ("step", "kind"),
    [pytest.param(OnRepeat.KILL_CONTAINER, ActionKind.KILL, id="kill"), pytest.param(OnRepeat.EVICT, ActionKind.EVICT)],
)
def test_an_escalation_calls_for_its_steps_action(step: OnRepeat, kind: ActionKind) -> None:
    assert Escalation(step, 1.0).kind is kind


def test_a_pressure_notice_names_the_furthest_over_and_counts_the_rest() -> None:
    """At most `NAMED` offenders are named; the others are counted, so a notice stays one line."""
    offenders = tuple(violation(20 - i) for i in range(PressureNotice.NAMED + 2))
    message = PressureNotice(POD, GPU, offenders).message
    assert message.startswith("GPU 0 is 97 % full (78.0GiB of 80.0GiB); ml/trainer container main holds 20.0GiB")
    assert message.count(" holds ") == PressureNotice.NAMED and message.endswith("and 2 more over their quota")


def test_a_pressure_notice_with_no_offender_says_where_the_memory_is() -> None:
    notice = PressureNotice(POD, GPU, (), within_quota_bytes=70 * GiB, outside_pods_bytes=4 * GiB)
    assert notice.message.endswith(
        "no pod is over its quota there: 70.0GiB by pods within their quotas, 4.0GiB by processes outside any pod, "
        "4.0GiB not listed against any process"
    )
