"""The enforcer's evictions: off the scan, bounded in time, and `on_eviction_refused` when they cannot happen."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest
from structlog.testing import capture_logs

from vramguard.agent.act import ActionResult, Enforcer, Outcome, confirm_freed
from vramguard.core.actions import Action, PressureNotice, Reason, Violation
from vramguard.core.decide import find_violations, quota_rows
from vramguard.core.driver_limit import LimitOutcome, LimitResult, LimitTarget
from vramguard.core.exited import HeldByExited
from vramguard.core.pod import PodInfo
from vramguard.core.policy import ActionKind, EvictionRefused, Policy
from vramguard.core.ports import Evictor, EvictResult, KillResult
from vramguard.core.process import ProcessRef
from vramguard.core.quantity import GiB
from vramguard.core.quota import PodQuota, Quota
from vramguard.core.sample import GpuDevice, GpuProcess, GpuSample
from vramguard.core.snapshot import Snapshot
from vramguard_testbed.fakes import (
    FakeClock,
    HeldRunner,
    RecordingEventRecorder,
    RecordingKiller,
    SnapshotBuilder,
    gpu,
    pod,
)

GPU0 = gpu(0, total_bytes=16 * GiB)


def violations_under(snapshot: Snapshot, quotas: Mapping[str, PodQuota]) -> tuple[Violation, ...]:
    """The snapshot's violations under `quotas`, each row's owner found first (`decide`'s step 1)."""
    return find_violations(snapshot, quota_rows(snapshot, quotas))


def over_quota_action(
    kind: ActionKind = ActionKind.EVICT, name: str = "victim", *, mirror_uid: str | None = None
) -> Action:
    """An action of `kind` on pod `ml/<name>` (static, with `mirror_uid`), whose container uses 2 GiB of its 1 GiB
    quota."""
    p = pod(name, "ml", mirror_uid=mirror_uid)
    quotas = {p.uid: PodQuota(containers={"main": Quota(limit_bytes=1 * GiB)})}
    (violation,) = violations_under(SnapshotBuilder().use(p, "main", GPU0, 2 * GiB).build(), quotas)
    return Action(kind=kind, reason=Reason.HARD_LIMIT, violation=violation)


@pytest.mark.parametrize(
    ("kind", "results"),
    [
        pytest.param(ActionKind.WARN, {"ok", "dry-run", "failed"}, id="a-warning-is-written-or-not"),
        pytest.param(
            ActionKind.KILL,
            {"ok", "dry-run", "failed", "nothing-to-kill", "memory-not-freed"},
            id="a-kill-may-find-nothing-or-leave-memory-behind",
        ),
        pytest.param(
            ActionKind.EVICT,
            {
                *("ok", "dry-run", "failed", "nothing-to-kill", "memory-not-freed", "gone", "refused"),
                *("refused-then-killed", "failed-then-killed"),
            },
            id="an-eviction-may-end-in-anything-a-kill-included",
        ),
    ],
)
def test_the_results_each_kind_of_action_can_end_in(kind: ActionKind, results: set[str]) -> None:
    """Each kind of action ends in its own results, each a `result` of vramguard_actions_total from the start."""
    assert {r.value for r in ActionResult if r.ends(kind)} == results


KILLED = (ProcessRef(7, 70),)
OTHER_GPU = gpu(1, total_bytes=16 * GiB)


@pytest.mark.parametrize(
    ("kind", "result", "kill", "after", "expected"),
    [
        pytest.param(
            ActionKind.KILL, ActionResult.OK, KillResult(KILLED, (), exited=True), [], ActionResult.OK,
            id="nvml-lists-nothing-of-it-the-kill-stands",
        ),
        pytest.param(
            ActionKind.KILL, ActionResult.OK, KillResult(KILLED, (), exited=True), [(7, GPU0)],
            ActionResult.MEMORY_NOT_FREED, id="nvml-still-lists-the-killed-process",
        ),
        pytest.param(
            ActionKind.KILL, ActionResult.OK, KillResult(KILLED, (), exited=True), [(8, GPU0)],
            ActionResult.MEMORY_NOT_FREED, id="nvml-lists-another-process-of-the-container",
        ),
        pytest.param(
            ActionKind.KILL, ActionResult.OK, KillResult(KILLED, (), exited=True), [(7, OTHER_GPU), (9, GPU0)],
            ActionResult.OK, id="on-another-gpu-or-someone-elses-the-kill-stands",
        ),
        pytest.param(
            ActionKind.EVICT, ActionResult.REFUSED_THEN_KILLED, KillResult(KILLED, (), exited=True), [(7, GPU0)],
            ActionResult.MEMORY_NOT_FREED, id="a-kill-after-a-refused-eviction-is-checked-too",
        ),
        pytest.param(
            ActionKind.KILL, ActionResult.FAILED, KillResult(KILLED, (), exited=False), [(7, GPU0)],
            ActionResult.FAILED, id="a-kill-whose-processes-did-not-exit-stays-failed",
        ),
        pytest.param(
            ActionKind.EVICT, ActionResult.OK, None, [(7, GPU0)], ActionResult.OK, id="an-eviction-is-not-a-kill",
        ),
    ],
)  # fmt: skip
def test_a_finished_kill_is_confirmed_by_a_fresh_sample(
    kind: ActionKind,
    result: ActionResult,
    kill: KillResult | None,
    after: list[tuple[int, GpuDevice]],
    expected: ActionResult,
) -> None:
    """A kill the killer saw through is `memory-not-freed` when NVML, sampled again, still lists a killed process or
    another of the container's on that GPU; any other outcome is left as it is."""
    outcome = Outcome(over_quota_action(kind), result, "", kill)
    sample = GpuSample((GPU0, OTHER_GPU), tuple(GpuProcess(pid, d.uuid, GiB) for pid, d in after))
    (confirmed,) = confirm_freed((outcome,), sample, lambda pid, v: pid in (7, 8))
    assert confirmed.result is expected
    assert confirmed.kill is kill
    if expected is ActionResult.MEMORY_NOT_FREED:
        assert confirmed.detail.endswith(f"still hold memory on {GPU0.uuid}")


class ScriptedEvictor:
    """An API server that answers `result`, once `meanwhile` (what the agent does while a request is in flight)
    has run."""

    def __init__(self, result: EvictResult) -> None:
        self.result = result
        self.calls: list[str] = []
        self.meanwhile: Callable[[], None] = lambda: None

    def evict(self, pod: PodInfo, message: str) -> EvictResult:
        self.calls.append(pod.key)
        self.meanwhile()
        return self.result


EVICTED = EvictResult(evicted=True, refused=False)


def _enforcer(
    evictor: Evictor, on_refused: EvictionRefused = EvictionRefused.WAIT
) -> tuple[Enforcer, HeldRunner, FakeClock, RecordingEventRecorder, RecordingKiller]:
    clock, runner, events, killer = FakeClock(), HeldRunner(), RecordingEventRecorder(), RecordingKiller()
    policy = Policy(on_eviction_refused=on_refused, eviction_timeout_s=15.0)
    enforcer = Enforcer(
        killer=killer,
        evictor=evictor,
        events=events,
        policy=policy,
        clock=clock,
        evictions=runner,
    )
    return enforcer, runner, clock, events, killer


def test_an_eviction_leaves_the_scan_and_reports_when_answered() -> None:
    """execute() hands the eviction to the worker and returns at once; collect() reports it once answered."""
    enforcer, runner, _, events, _ = _enforcer(ScriptedEvictor(EVICTED))
    assert enforcer.execute(over_quota_action()) is None
    assert enforcer.collect() == [] and enforcer.evictions_in_flight() == 1
    runner.run_all()
    (outcome,) = enforcer.collect()
    assert outcome.result == "ok" and events.reasons() == ["VRAMEvicted"]
    assert enforcer.evictions_in_flight() == 0


@pytest.mark.parametrize(
    ("on_refused", "result", "reasons", "kills"),
    [
        pytest.param(EvictionRefused.WAIT, "failed", ["VRAMEvictionFailed"], 0, id="unanswered-then-wait"),
        pytest.param(
            EvictionRefused.KILL, "failed-then-killed", ["VRAMEvictionFailed", "VRAMKilled"], 1,
            id="unanswered-then-kill",
        ),
    ],
)  # fmt: skip
def test_an_unanswered_eviction_is_not_evicted_after_the_bound(
    on_refused: EvictionRefused, result: str, reasons: list[str], kills: int
) -> None:
    """A frozen API server: after eviction_timeout the eviction counts as not done and the policy applies."""
    enforcer, _, clock, events, killer = _enforcer(ScriptedEvictor(EVICTED), on_refused)
    assert enforcer.execute(over_quota_action()) is None
    clock.step(14.9)
    assert enforcer.collect() == []
    clock.step(0.1)
    (outcome,) = enforcer.collect()
    assert outcome.result == result and "no answer from the API server in 15s" in outcome.detail + events.events[0][2]
    assert events.reasons() == reasons
    assert len(killer.killed) == kills


def test_an_abandoned_eviction_is_never_sent() -> None:
    """An eviction still queued when eviction_timeout passes (the worker stuck on a frozen API server) is dropped
    when the worker reaches it: the API server never sees it, and the outcome stays the one reported."""
    evictor = ScriptedEvictor(EVICTED)
    enforcer, runner, clock, events, _ = _enforcer(evictor)
    enforcer.execute(over_quota_action())
    clock.step(15.0)
    assert [o.result for o in enforcer.collect()] == ["failed"]
    with capture_logs() as logs:
        runner.run_all()
        assert enforcer.collect() == []
    assert evictor.calls == []
    assert [e["event"] for e in logs] == ["eviction_not_sent"]
    assert events.reasons() == ["VRAMEvictionFailed"]


# The API server's late answer to an eviction already abandoned, what the eviction's outcomes are, and its Events.
LATE_ANSWERS = [
    pytest.param(
        EVICTED, ["failed", "ok"], ["VRAMEvictionFailed", "VRAMEvictionFailed", "VRAMEvicted"],
        id="late-acceptance-is-reported",
    ),
    pytest.param(
        EvictResult(evicted=False, refused=True, message="budget"), ["failed"],
        ["VRAMEvictionFailed", "VRAMEvictionFailed"], id="late-refusal-is-only-logged",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("answer", "results", "reasons"), LATE_ANSWERS)
def test_a_late_answer_to_a_sent_eviction(answer: EvictResult, results: list[str], reasons: list[str]) -> None:
    """An eviction sent before it was abandoned is still the pod's eviction: no other of the pod is sent before its
    answer (a new one fails at once), and when the API server accepts it after all, that is reported."""
    evictor = ScriptedEvictor(answer)
    enforcer, runner, clock, events, _ = _enforcer(evictor)
    action = over_quota_action()
    meanwhile: list[Outcome | None] = []

    def while_in_flight() -> None:
        clock.step(15.0)
        meanwhile.extend(enforcer.collect())
        meanwhile.append(enforcer.execute(action))

    evictor.meanwhile = while_in_flight
    assert enforcer.execute(action) is None
    runner.run_all()
    *outcomes, again = meanwhile
    assert again is not None and again.result == "failed" and "still unanswered" in again.detail
    outcomes += enforcer.collect()
    assert [o.result for o in outcomes if o is not None] == results
    assert evictor.calls == ["ml/victim"], "one request for the pod, never a second behind it"
    assert events.reasons() == reasons


def test_one_eviction_per_pod_at_a_time() -> None:
    """While a pod's eviction is in flight another action on it is not queued a second time."""
    evictor = ScriptedEvictor(EVICTED)
    enforcer, runner, _, _, _ = _enforcer(evictor)
    action = over_quota_action()
    assert enforcer.execute(action) is None
    assert enforcer.execute(action) is None
    runner.run_all()
    assert len(enforcer.collect()) == 1 and evictor.calls == ["ml/victim"]


@pytest.mark.parametrize(
    ("answer", "result", "reasons", "kills"),
    [
        pytest.param(
            EvictResult(evicted=False, refused=True, message="would violate the pod's disruption budget"),
            "refused-then-killed", ["VRAMEvictionRefused", "VRAMKilled"], 1, id="pdb-refusal-then-kill",
        ),
        pytest.param(
            EvictResult(evicted=False, refused=False, message="403: forbidden"),
            "failed-then-killed", ["VRAMEvictionFailed", "VRAMKilled"], 1, id="error-then-kill",
        ),
        pytest.param(
            EvictResult(evicted=False, refused=False, gone=True, message="pods not found"),
            "gone", [], 0, id="gone-pod-is-left-alone",
        ),
    ],
)  # fmt: skip
def test_what_follows_an_eviction_that_did_not_happen(
    answer: EvictResult, result: str, reasons: list[str], kills: int
) -> None:
    """With on_eviction_refused: kill, a refusal or an error is said on the pod, then its GPU processes die;
    a pod that is gone is nobody's business any more."""
    enforcer, runner, _, events, killer = _enforcer(ScriptedEvictor(answer), EvictionRefused.KILL)
    enforcer.execute(over_quota_action())
    runner.run_all()
    (outcome,) = enforcer.collect()
    assert outcome.result == result
    assert events.reasons() == reasons
    assert len(killer.killed) == kills
    if reasons:
        assert answer.message in events.events[0][2]


class RaisingEvictor:
    """An evictor that raises instead of answering with a result."""

    def evict(self, pod: PodInfo, message: str) -> EvictResult:
        raise ConnectionResetError("connection reset by peer")


def test_an_evictor_that_raises_is_a_failed_eviction() -> None:
    """An exception from the evictor is its answer: a failed eviction naming the error, then on_eviction_refused."""
    enforcer, runner, _, events, killer = _enforcer(RaisingEvictor(), EvictionRefused.KILL)
    assert enforcer.execute(over_quota_action()) is None
    runner.run_all()
    (outcome,) = enforcer.collect()
    assert outcome.result == "failed-then-killed"
    assert events.reasons() == ["VRAMEvictionFailed", "VRAMKilled"] and len(killer.killed) == 1
    assert "ConnectionResetError: connection reset by peer" in events.events[0][2]


@pytest.mark.parametrize(
    ("on_refused", "result", "reasons", "kills"),
    [
        pytest.param(EvictionRefused.WAIT, "refused", ["VRAMEvictionRefused"], 0, id="static-refused-then-wait"),
        pytest.param(
            EvictionRefused.KILL, "refused-then-killed", ["VRAMEvictionRefused", "VRAMKilled"], 1,
            id="static-refused-then-kill",
        ),
    ],
)  # fmt: skip
def test_a_static_pod_eviction_is_refused_without_a_request(
    on_refused: EvictionRefused, result: str, reasons: list[str], kills: int
) -> None:
    """The Eviction API would delete a static pod's mirror alone (the kubelet puts it back and the pod runs on):
    its eviction is refused at once, with no request, saying why, and on_eviction_refused decides what follows."""
    evictor = ScriptedEvictor(EVICTED)
    enforcer, runner, _, events, killer = _enforcer(evictor, on_refused)
    outcome = enforcer.execute(over_quota_action(mirror_uid="5d2c6c1e-0a4b-4b8e-9f3e-1c2d3e4f5a6b"))
    assert outcome is not None and outcome.result == result
    assert evictor.calls == [] and runner.pending() == 0 and enforcer.evictions_in_flight() == 0
    assert events.reasons() == reasons
    assert "a static pod cannot be evicted" in events.events[0][2]
    assert len(killer.killed) == kills


def test_a_pressure_notice_is_a_bounded_warning_and_never_raises() -> None:
    """Five offenders with 253-character names make a long message: it is cut to the Event bound. A recorder
    that fails is logged, not raised: the scan goes on."""
    offenders: list[Violation] = []
    for k in range(6):
        p = pod(f"{k}" + "x" * 252, "ml")
        quotas = {p.uid: PodQuota(containers={"main": Quota(limit_bytes=1 * GiB)})}
        offenders += violations_under(SnapshotBuilder().use(p, "main", GPU0, 2 * GiB).build(), quotas)
    victim = pod("victim", "ml")
    notice = PressureNotice(pod=victim, device=offenders[0].device, offenders=tuple(offenders))
    events = RecordingEventRecorder()
    enforcer = Enforcer(killer=RecordingKiller(), evictor=ScriptedEvictor(EvictResult(True, False)), events=events,
                        policy=Policy())  # fmt: skip
    enforcer.report_pressure([notice])
    ((key, reason, message, warning),) = events.events
    assert (key, reason, warning) == ("ml/victim", "VRAMPressure", True)
    assert len(message) <= 1024 and message.endswith("characters]") and len(notice.message) > 1024
    events.inject_error(RuntimeError("queue closed"))
    with capture_logs() as logs:
        enforcer.report_pressure([notice])
    assert [(e["event"], e["reason"]) for e in logs] == [("event_failed", "VRAMPressure")]


@pytest.mark.parametrize(
    ("node_name", "dry_run", "recorded", "logged"),
    [
        pytest.param("gpu-node-1", False, [("node/gpu-node-1", "VRAMGPUNeedsReset")], 0, id="on-the-node"),
        pytest.param("gpu-node-1", True, [], 1, id="dry-run-logs-it"),
        pytest.param(None, False, [], 0, id="no-node-no-event"),
    ],
)
def test_a_gpu_that_needs_a_reset_is_a_warning_on_the_node(
    node_name: str | None, dry_run: bool, recorded: list[tuple[str, str]], logged: int
) -> None:
    """Each onset is one VRAMGPUNeedsReset Warning on the Node, naming the GPU, the bytes, the PIDs and the reset;
    in dry-run it goes to the log; an agent that does not know its Node writes none."""
    events = RecordingEventRecorder()
    enforcer = Enforcer(
        killer=RecordingKiller(),
        evictor=ScriptedEvictor(EVICTED),
        events=events,
        policy=Policy(),
        dry_run=dry_run,
        node_name=node_name,
    )
    device = gpu(1)
    with capture_logs() as logs:
        enforcer.report_needs_reset([HeldByExited(device.uuid, 2 * GiB, (41, 42), 0.0)], [device], 60.0)
    assert [(key, reason) for key, reason, _, _ in events.events] == recorded
    assert len([e for e in logs if e.get("reason") == "VRAMGPUNeedsReset"]) == logged
    for _, _, message, warning in events.events:
        assert warning and message == (
            f"GPU 1 ({device.uuid}) needs a reset: 2.0GiB held by exited processes (PIDs 41, 42, listed with no "
            "process for 1m or more): nothing is left to kill. Drain the node, then reset the GPU "
            "(nvidia-smi --gpu-reset -i 1)"
        )


def test_a_limit_the_toolkit_set_is_one_normal_event_per_container() -> None:
    """A limit NVIDIA's container toolkit hook set, found on a container's cgroup on each GPU, is one Normal Event
    naming the GPUs and what the hook set; nothing is said for a limit found unchanged."""
    p = pod("trainer", "ml")
    targets = [LimitTarget(p, "main", "c1", i, f"GPU-{i}", 8 * GiB, "env NVIDIA_GPU_MEMORY_LIMIT") for i in (0, 1)]
    detail = "NVIDIA's container toolkit set it to soft 4.0GiB, hard 8.0GiB, which holds the quota's hard limit"
    events = RecordingEventRecorder()
    enforcer = Enforcer(killer=RecordingKiller(), evictor=ScriptedEvictor(EVICTED), events=events, policy=Policy())
    outcomes = [LimitOutcome(t, LimitResult.TOOLKIT, detail) for t in targets]
    enforcer.report_limits([*outcomes, LimitOutcome(targets[0], LimitResult.UNCHANGED)])
    assert events.events == [
        (
            "ml/trainer",
            "VRAMLimitSetByToolkit",
            f"the driver holds container main on GPU 0, 1 by a limit vramguard did not set: {detail}",
            False,
        )
    ]
