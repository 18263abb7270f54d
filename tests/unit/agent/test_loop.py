"""The loop and the enforcer over fakes: what a scan does with a decision, and what each action's result is."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import replace

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from unit.agent.test_act import GPU0, over_quota_action
from vramguard.agent.act import Enforcer
from vramguard.agent.checks import AgentChecks, DriverLimitsCheck
from vramguard.agent.loop import Agent
from vramguard.agent.metrics import Metrics
from vramguard.agent.orphan_reads import OrphanReads
from vramguard.agent.reload import InForce, PolicyReloader
from vramguard.agent.report import rows_from_report
from vramguard.agent.watch import WATCH_STUCK_S, MemoryWatch, ScanCalls, ScanTrigger
from vramguard.base.heartbeat import Heartbeat
from vramguard.base.worker import Inline, Worker
from vramguard.core.actions import KillRecord
from vramguard.core.pod import PodInfo
from vramguard.core.policy import (
    ActionKind,
    DefaultKind,
    DefaultQuota,
    EvictionRefused,
    Mode,
    NamespacePolicy,
    OnRepeat,
    Orphans,
    Policy,
)
from vramguard.core.ports import KillResult
from vramguard.core.process import KubeletPod, ProcessRef
from vramguard.core.quantity import GiB
from vramguard.core.sample import GpuMemory, GpuProcess, GpuSample
from vramguard.core.shares import PodShares, Share
from vramguard.core.snapshot import UnattributedReason
from vramguard.kube.pod_manifest import mirrorless_static_pod
from vramguard.node.describe import ProcessDetail
from vramguard_testbed.fakes import (
    FakeClock,
    FakeEvictor,
    FakeIdentifier,
    FakePodSource,
    FakeSampler,
    GatedEvictor,
    RecordingEventRecorder,
    RecordingKiller,
    gpu,
    pod,
)

WAIT = EvictionRefused.WAIT
VRAM = "vramguard.io/vram"


class FakeClaimSource:
    """DRA shares as the claim source publishes them: replaced whole when they change."""

    def __init__(self) -> None:
        self.published: Mapping[str, PodShares] = {}

    def shares(self) -> Mapping[str, PodShares]:
        return self.published

    def problem(self) -> str | None:
        return None


class Node:
    """A scan's worth of fakes around a real Agent, Enforcer and Metrics."""

    def __init__(
        self,
        policy: Policy,
        *,
        dry_run: bool = False,
        refuse: bool = False,
        claims: FakeClaimSource | None = None,
        watch: Callable[[Node], MemoryWatch] | None = None,
        reloads: PolicyReloader | None = None,
    ) -> None:
        """`watch` builds the watch between scans over this node's fakes; `reloads` is the policy file's watch, with
        which the agent registers the parts that hold policy."""
        self.sampler = FakeSampler()
        self.ids = FakeIdentifier()
        self.pods = FakePodSource()
        self.events = RecordingEventRecorder()
        self.killer = RecordingKiller(self.sampler)
        self.evictor = FakeEvictor(refuse=refuse)
        self.metrics = Metrics()
        self.clock = FakeClock()
        self.agent = Agent(
            sampler=self.sampler,
            identifier=self.ids,
            pods=self.pods,
            policy=policy,
            enforcer=Enforcer(
                killer=self.killer,
                evictor=self.evictor,
                events=self.events,
                policy=policy,
                dry_run=dry_run,
                clock=self.clock,
                evictions=Inline(),
                node_name="gpu-node-1",
            ),
            metrics=self.metrics,
            clock=self.clock,
            agent_pid=1,
            claims=claims,
            watch=watch(self) if watch is not None else None,
            orphan_reads=OrphanReads(self.pods, clock=self.clock, runner=Inline()),
            api_uids=self.pods.given,
            reloads=reloads,
        )

    def run_gpu(self, *rows: tuple[int, int]) -> None:
        """NVML reports these (pid, used bytes) rows on GPU 0."""
        used = sum(b for _, b in rows)
        device = gpu(0, total_bytes=GPU0.total_bytes, used_bytes=used)
        self.sampler.next = GpuSample(
            devices=(device,), processes=tuple(GpuProcess(p, device.uuid, b) for p, b in rows)
        )

    def trainer_over_quota(self) -> PodInfo:
        """Pod ml/trainer, container main, quota 4Gi, using 5Gi on GPU 0 through PID 100."""
        p = pod("trainer", "ml", containers={"main": {VRAM: "4Gi"}})
        self.pods.set_pods([p])
        self.ids.add(100, p.uid, p.containers[0].container_id)
        self.run_gpu((100, 5 * GiB))
        return p

    def metric(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)


def test_scan_kills_the_offender_and_reports_it() -> None:
    """Over quota in kill mode: one warning, one kill of the container's processes, Events and metrics."""
    n = Node(Policy(mode=Mode.KILL))
    trainer = n.trainer_over_quota()
    report = n.agent.scan()
    assert [(o.action.kind, o.result) for o in report.outcomes] == [(ActionKind.WARN, "ok"), (ActionKind.KILL, "ok")]
    assert [t.pod_uid for t in n.killer.killed] == [trainer.uid]
    assert n.events.reasons() == ["VRAMQuotaExceeded", "VRAMKilled"]
    assert n.events.important == ["VRAMKilled"], "what was done goes ahead of warnings"
    assert n.metric("vramguard_actions_total", action="kill", result="ok") == 1.0
    assert n.metric("vramguard_violations_total", namespace="ml", severity="hard") == 1.0
    assert (
        n.metric(
            "vramguard_container_gpu_memory_used_bytes",
            namespace="ml",
            pod="trainer",
            container="main",
            gpu="0",
            gpu_uuid=GPU0.uuid,
            owner_kind="<none>",  # the pod's controller: none
            owner_name="<none>",
        )
        == 5 * GiB
    )


def test_respawned_gpu_workers_get_the_whole_container_killed() -> None:
    """A supervisor's new GPU worker in the container just killed in: the next scan kills every process of the
    container, says why in the VRAMKilled Event and the log, and counts the escalation."""
    n = Node(Policy(mode=Mode.KILL))
    p = n.trainer_over_quota()
    n.agent.scan()
    assert n.killer.whole == [False], "the first kill takes the GPU processes only"
    n.clock.step(0.4)
    n.ids.add(101, p.uid, p.containers[0].container_id)  # the supervisor's next worker
    n.run_gpu((101, 5 * GiB))
    with capture_logs() as logs:
        report = n.agent.scan()
    assert n.killer.whole == [False, True]
    assert [(o.action.kind, o.result) for o in report.outcomes] == [(ActionKind.KILL, "ok")]
    _, reason, message, *_ = n.events.events[-1]
    assert reason == "VRAMKilled"
    assert message.startswith(
        "GPU processes came back within 0.4 s of the last kill: stopped the whole container; killed PIDs 101"
    )
    (action,) = [e for e in logs if e["event"] == "action"]
    assert action["escalation"] == "GPU processes came back within 0.4 s of the last kill"
    assert n.metric("vramguard_escalations_total", namespace="ml", step="kill-container") == 1.0


def test_a_kill_is_remembered_with_what_it_killed() -> None:
    """Each kill is remembered in its container instance with the processes the killer signalled, as this agent's
    own (not restored); a process over the quota that started before them did not come back: a plain kill."""
    n = Node(Policy(mode=Mode.KILL, cooldown_s=0.0))
    p = n.trainer_over_quota()
    container_id = p.containers[0].container_id or ""
    n.agent.scan()
    assert n.agent.state.kills[container_id] == KillRecord(n.clock.now(), (ProcessRef(100, 1000),), restored=False)
    n.clock.step(0.4)
    n.ids.add(99, p.uid, container_id)  # started before the killed worker (the fake's start time is pid * 10)
    n.run_gpu((99, 5 * GiB))
    report = n.agent.scan()
    assert [(o.action.kind, o.action.escalation) for o in report.outcomes] == [(ActionKind.KILL, None)]
    assert n.killer.whole == [False, False]


def test_a_repeat_may_evict_instead() -> None:
    """With on_repeat: evict, the repeat evicts the pod (through the Eviction API), and says why."""
    n = Node(Policy(mode=Mode.KILL, on_repeat=OnRepeat.EVICT))
    p = n.trainer_over_quota()
    n.agent.scan()
    n.clock.step(1.0)
    n.ids.add(101, p.uid, p.containers[0].container_id)
    n.run_gpu((101, 5 * GiB))
    report = n.agent.scan()
    assert [(o.action.kind, o.result) for o in report.outcomes] == [(ActionKind.EVICT, "ok")]
    assert n.evictor.evicted == [p.key]
    assert n.events.events[-1][2].startswith("GPU processes came back within 1.0 s of the last kill: evicted")
    assert n.metric("vramguard_escalations_total", namespace="ml", step="evict") == 1.0


@pytest.mark.parametrize(
    ("now", "kills"),
    [
        pytest.param("same", 1, id="same-process-is-killed"),
        pytest.param("recycled", 0, id="pid-recycled-since-the-sample-nothing-happens"),
        pytest.param("moved", 0, id="now-outside-the-pod-nothing-happens"),
        pytest.param("gone", 1, id="gone-since-the-sample-the-killer-reports-it"),
    ],
)
def test_evidence_is_checked_again_before_a_kill(now: str, kills: int) -> None:
    """Just before killing, each sampled process is looked up afresh: if its PID now belongs to another process
    (or another place), the usage may not have been the pod's, and this scan kills nothing."""
    n = Node(Policy(mode=Mode.KILL))
    p = n.trainer_over_quota()
    ref, identity = n.ids.known[100]
    n.ids.now_known[100] = {
        "same": (ref, identity),
        "recycled": (ProcessRef(100, ref.start_time + 1), identity),
        "moved": (ref, None),
        "gone": None,
    }[now]
    report = n.agent.scan()
    assert len(n.killer.killed) == kills
    assert [o.action.kind for o in report.outcomes] == [ActionKind.WARN] + [ActionKind.KILL] * kills
    assert p.uid in {v.pod.uid for v in report.decision.violations}, "the violation is still seen and warned"


def test_kill_whose_memory_stays_is_reported() -> None:
    """If NVML still lists a killed process after the kill, the result says the memory was not freed."""
    n = Node(Policy(mode=Mode.KILL))
    p = pod("stuck", "ml", containers={"main": {VRAM: "1Gi"}})
    n.pods.set_pods([p])
    n.ids.add(7, p.uid, p.containers[0].container_id)
    n.killer.sampler = None  # NVML keeps reporting PID 7 after the "kill"
    n.run_gpu((7, 2 * GiB))
    report = n.agent.scan()
    assert [o.result for o in report.outcomes if o.action.kind is ActionKind.KILL] == ["memory-not-freed"]
    assert n.sampler.calls == 2, "one re-sample confirms the kill"


def test_unattributed_and_unmanaged_processes_are_never_acted_on() -> None:
    """A host process and a pod without any quota are reported, never killed, whatever they use."""
    n = Node(Policy(mode=Mode.KILL, pressure_free_bytes=15 * GiB))
    p = pod("free-rider", "ml")
    n.pods.set_pods([p])
    n.ids.add(1000, None)
    n.ids.add(1001, p.uid, p.containers[0].container_id)
    n.run_gpu((1000, 8 * GiB), (1001, 7 * GiB))
    report = n.agent.scan()
    assert report.outcomes == () and n.killer.killed == []
    assert [u.reason for u in report.snapshot.unattributed] == [UnattributedReason.NOT_IN_POD]
    assert (
        n.metric("vramguard_unattributed_gpu_memory_bytes", gpu="0", gpu_uuid=GPU0.uuid, reason="not-in-pod") == 8 * GiB
    )


def test_memory_an_exited_pid_holds_past_the_threshold_needs_a_reset_told_once_on_the_node() -> None:
    """NVML listing a PID with no process for 60 s: the GPU needs a reset (metric, report), one Warning on the Node
    however many scans follow, nothing signalled; the unattributed metric says why."""
    n = Node(Policy(mode=Mode.KILL))
    n.run_gpu((4242, 3 * GiB))  # no such process: the fake /proc does not know it
    held = "vramguard_gpu_memory_held_by_exited_processes_bytes"
    for _ in range(60):
        report = n.agent.scan()
        n.clock.step(1.0)
    assert report.exited.held == {} and n.metric(held, gpu="0", gpu_uuid=GPU0.uuid) == 0
    assert n.metric(
        "vramguard_unattributed_gpu_memory_bytes", gpu="0", gpu_uuid=GPU0.uuid, reason="process-exited"
    ) == (3 * GiB)
    for _ in range(5):
        report = n.agent.scan()
        n.clock.step(1.0)
    assert report.exited.held[GPU0.uuid].pids == (4242,)
    assert n.metric(held, gpu="0", gpu_uuid=GPU0.uuid) == 3 * GiB
    assert [(key, reason) for key, reason, _, _ in n.events.events] == [("node/gpu-node-1", "VRAMGPUNeedsReset")]
    message = n.events.events[0][2]
    assert f"GPU 0 ({GPU0.uuid}) needs a reset: 3.0GiB held by exited processes (PIDs 4242, listed" in message
    assert "nvidia-smi --gpu-reset -i 0" in message
    assert n.killer.killed == [] and report.outcomes == ()


def test_memory_an_exited_pid_lets_go_of_within_the_threshold_raises_nothing() -> None:
    """A PID gone from /proc whose memory leaves NVML's list a few scans later is a teardown: nothing is raised,
    however long the agent runs on."""
    n = Node(Policy(mode=Mode.KILL))
    n.run_gpu((4242, 3 * GiB))
    for _ in range(3):
        n.agent.scan()
        n.clock.step(0.5)
    n.run_gpu()
    for _ in range(120):
        report = n.agent.scan()
        n.clock.step(1.0)
    assert report.exited.held == {} and n.events.events == []
    assert n.metric("vramguard_gpu_memory_held_by_exited_processes_bytes", gpu="0", gpu_uuid=GPU0.uuid) == 0


def test_the_agents_own_pod_is_never_acted_on() -> None:
    """The agent finds its own pod through its own cgroup and never acts on it."""
    p = pod("vramguard-x", "vramguard", containers={"agent": {VRAM: "1Gi"}})
    n = Node.__new__(Node)
    Node.__init__(n, Policy(mode=Mode.KILL))
    n.ids.add(1, p.uid, p.containers[0].container_id)  # PID 1 is the agent (agent_pid=1)
    n.agent = Agent(
        sampler=n.sampler, identifier=n.ids, pods=n.pods, policy=Policy(mode=Mode.KILL),
        enforcer=n.agent.enforcer, metrics=n.metrics, clock=n.clock, agent_pid=1,
    )  # fmt: skip
    n.pods.set_pods([p])
    n.run_gpu((1, 4 * GiB))
    assert n.agent.agent_pod_uid == p.uid
    assert n.agent.scan().outcomes == ()


def test_invalid_quota_is_reported_once_per_pod() -> None:
    """`12GB` gives one VRAMQuotaInvalid Event naming field and value, not one per scan."""
    n = Node(Policy())
    p = pod("typo", "ml", containers={"main": {VRAM: "12GB"}})
    n.pods.set_pods([p])
    for _ in range(3):
        n.agent.scan()
    assert n.events.reasons() == ["VRAMQuotaInvalid"]
    (_, _, message, _) = n.events.events[0]
    assert "spec.containers[main].resources.limits[vramguard.io/vram]" in message and "12GB" in message


def test_dry_run_sends_no_event_of_any_kind() -> None:
    """Every Event leaves through the Enforcer, so dry-run holds back all of them, the invalid-quota one too:
    each goes to the log instead, and the action is reported as `dry-run`."""
    n = Node(Policy(mode=Mode.KILL, pressure_free_bytes=12 * GiB), dry_run=True)
    typo = pod("typo", "ml", containers={"main": {VRAM: "12GB"}})
    trainer = n.trainer_over_quota()
    n.pods.set_pods([typo, trainer])
    with capture_logs() as logs:
        report = n.agent.scan()
    assert n.events.events == [] and n.killer.killed == []
    assert {o.result for o in report.outcomes} == {"dry-run"}
    held_back = [(e["pod"], e["reason"]) for e in logs if e["event"] == "event"]
    assert held_back == [("ml/typo", "VRAMQuotaInvalid"), ("ml/trainer", "VRAMPressure")]


def test_pods_on_a_gpu_entering_pressure_are_told_who_holds_it() -> None:
    """The GPU fills up: each pod with a process on it gets one VRAMPressure Warning naming the container over
    its quota and by how much, the offender too; none again while the pressure lasts."""
    n = Node(Policy(mode=Mode.WARN, pressure_free_bytes=2 * GiB, pressure_transition_s=30))
    trainer = pod("trainer", "ml", containers={"main": {VRAM: "8Gi"}})
    notebook = pod("notebook", "ml", containers={"main": {VRAM: "4Gi"}})
    n.pods.set_pods([trainer, notebook])
    n.ids.add(100, trainer.uid, trainer.containers[0].container_id)
    n.ids.add(200, notebook.uid, notebook.containers[0].container_id)

    def told() -> list[tuple[str, str, bool]]:
        return [
            (key, message, warning) for key, reason, message, warning in n.events.events if reason == "VRAMPressure"
        ]

    n.run_gpu((100, 11 * GiB), (200, 3 * GiB))  # 2 GiB free: at the threshold, not under it
    n.agent.scan()
    assert told() == []
    n.clock.step(1.0)
    n.run_gpu((100, 11 * GiB), (200, 4 * GiB))
    n.agent.scan()
    said = (
        "GPU 0 is 93 % full (15.0GiB of 16.0GiB); ml/trainer container main holds 11.0GiB, 3.0GiB over its 8.0GiB quota"
    )
    assert told() == [("ml/notebook", said, True), ("ml/trainer", said, True)]
    assert "VRAMPressure" not in n.events.important, "a notice never crowds out what was done to a pod"
    for _ in range(3):
        n.clock.step(1.0)
        n.agent.scan()
    assert len(told()) == 2, "one notice per pod when the GPU enters pressure, not one per scan"


def test_a_failing_scan_does_not_stop_the_loop() -> None:
    """An exception in one scan is logged; the loop keeps scanning, one poll interval apart on its clock, until
    told to stop."""
    n = Node(Policy())
    n.sampler.inject_error(RuntimeError("driver went away"))
    clock = n.agent.clock = FakeClock()
    stop = threading.Event()
    clock.on_wait = lambda: stop.set() if len(clock.waits) >= 3 else None  # the loop's third wait ends it
    calls_before = n.sampler.calls
    with capture_logs() as logs:  # and not through the console renderer, whose highlighted traceback takes ~1 s
        n.agent.run(poll_interval_s=0.5, stop=stop)
    assert n.sampler.calls == calls_before + 3
    assert [(e["event"], e["log_level"], e["error"]) for e in logs] == [
        ("scan_failed", "error", "RuntimeError('driver went away')")
    ] * 3, "each failure logged with its traceback"
    assert all(e["exc_info"] for e in logs)
    assert clock.waits == [0.5, 0.5, 0.5], "a scan that takes no time waits the whole interval"
    assert n.metric("vramguard_scans_failed_total") == 3, "each failed scan counted"


class ExplodingKiller:
    def kill(self, violation: object, every_process: bool = False) -> KillResult:
        raise PermissionError("no CAP_KILL")


@pytest.mark.parametrize(
    ("kind", "refuse", "on_refused", "dry_run", "result", "events", "killed"),
    [
        pytest.param(ActionKind.WARN, False, WAIT, False, "ok", ["VRAMQuotaExceeded"], 0, id="warn-records-an-event"),
        pytest.param(ActionKind.EVICT, False, WAIT, False, "ok", ["VRAMEvicted"], 0, id="evict-evicts"),
        pytest.param(
            ActionKind.EVICT, True, WAIT, False, "refused", ["VRAMEvictionRefused"], 0,
            id="evict-refused-waits-and-says-so-on-the-pod",
        ),
        pytest.param(
            ActionKind.EVICT, True, EvictionRefused.KILL, False, "refused-then-killed",
            ["VRAMEvictionRefused", "VRAMKilled"], 1, id="evict-refused-falls-back-to-kill",
        ),
        pytest.param(ActionKind.KILL, False, WAIT, False, "ok", ["VRAMKilled"], 1, id="kill-kills"),
        pytest.param(ActionKind.KILL, False, WAIT, True, "dry-run", [], 0, id="dry-run-changes-nothing"),
        pytest.param(ActionKind.EVICT, False, WAIT, True, "dry-run", [], 0, id="dry-run-evicts-nothing"),
    ],
)  # fmt: skip
def test_enforcer_outcomes(
    kind: ActionKind,
    refuse: bool,
    on_refused: EvictionRefused,
    dry_run: bool,
    result: str,
    events: list[str],
    killed: int,
) -> None:
    """Each mode does what the policy says, and dry-run only reports."""
    recorder, killer, evictor = RecordingEventRecorder(), RecordingKiller(), FakeEvictor(refuse=refuse)
    enforcer = Enforcer(
        killer=killer,
        evictor=evictor,
        events=recorder,
        policy=Policy(on_eviction_refused=on_refused),
        dry_run=dry_run,
        evictions=Inline(),
    )
    outcome = enforcer.execute(over_quota_action(kind))
    if outcome is None:  # an eviction: its outcome comes from collect() once the API server answered
        (outcome,) = enforcer.collect()
    assert outcome.result == result
    assert recorder.reasons() == events
    assert recorder.important == [e for e in events if e != "VRAMQuotaExceeded"], "enforcement Events go first"
    assert len(killer.killed) == killed
    if dry_run:
        assert evictor.evicted == evictor.refused == []


def test_enforcer_survives_failing_seams() -> None:
    """A killer that raises is a failed result; an Event that cannot be written does not undo a kill."""
    recorder = RecordingEventRecorder()
    failed = Enforcer(killer=ExplodingKiller(), evictor=FakeEvictor(), events=recorder, policy=Policy()).execute(
        over_quota_action(ActionKind.KILL)
    )
    assert failed is not None and failed.result == "failed"
    recorder.inject_error(ConnectionError("apiserver down"))
    killer = RecordingKiller()
    outcome = Enforcer(killer=killer, evictor=FakeEvictor(), events=recorder, policy=Policy()).execute(
        over_quota_action(ActionKind.KILL)
    )
    assert outcome is not None and outcome.result == "ok" and len(killer.killed) == 1


def test_metrics_exposition_names_carry_units() -> None:
    """Every exported metric name ends with a unit or _total, as Prometheus conventions ask."""
    n = Node(Policy(mode=Mode.KILL))
    n.trainer_over_quota()
    n.agent.scan()
    text = generate_latest(n.metrics.registry).decode()
    names = {f.name + ("_total" if f.type == "counter" else "") for f in text_string_to_metric_families(text)}
    names = {name for name in names if name.startswith("vramguard_")}
    assert {
        "vramguard_container_gpu_memory_used_bytes",
        "vramguard_container_gpu_memory_quota_bytes",
        "vramguard_gpu_memory_total_bytes",
        "vramguard_gpu_memory_used_bytes",
        "vramguard_gpu_memory_free_bytes",
        "vramguard_unattributed_gpu_memory_bytes",
        "vramguard_violations_total",
        "vramguard_actions_total",
        "vramguard_scan_duration_seconds",
        "vramguard_scans_failed_total",
        "vramguard_nvml_errors_total",
    } <= names
    counts = {"vramguard_driver_limits_failing", "vramguard_events_queued", "vramguard_pod_mirror_claims_refused"}
    states = {"vramguard_gpu_healthy", "vramguard_watch_stuck", "vramguard_policy_invalid"}
    states |= {"vramguard_policy_restart_needed"}
    for name in names - {*states, *counts}:  # states, counts: no unit
        assert name.endswith(("_bytes", "_seconds", "_total")), name


def test_a_dra_share_is_the_quota_on_its_gpu_and_follows_the_claim() -> None:
    """With `claim:` as the quota source the agent reads the claim source's shares each scan (from memory): 4Gi on
    GPU 0 is over a 3Gi share (killed, the Event names the claim and the GPU), within a 6Gi one."""
    claims = FakeClaimSource()
    n = Node(Policy(mode=Mode.KILL, quota_sources=("claim:gpu.nvidia.com",)), claims=claims)
    p = pod("trainer", "ml")
    n.pods.set_pods([p])
    n.ids.add(100, p.uid, p.containers[0].container_id)
    n.run_gpu((100, 4 * GiB))

    def share(gib: int) -> Mapping[str, PodShares]:
        held = Share("ml/trainer-gpu-x7k2", "gpu", "gpu.nvidia.com", "", "uid/0", GPU0.uuid, gib * GiB, "5f0e2a1c")
        return {p.uid: {"main": (held,)}}

    claims.published = share(6)
    assert n.agent.scan().outcomes == ()
    assert n.metric("vramguard_claim_source_up") == 1.0
    assert n.metric("vramguard_claim_share_bytes", namespace="ml", pod="trainer", container="main", gpu="0",
                    gpu_uuid=GPU0.uuid, claim="trainer-gpu-x7k2") == 6 * GiB  # fmt: skip
    claims.published = share(3)
    report = n.agent.scan()
    assert [(o.action.kind, o.result) for o in report.outcomes] == [(ActionKind.WARN, "ok"), (ActionKind.KILL, "ok")]
    killed = next(e for e in n.events.events if e[1] == "VRAMKilled")
    assert (
        "on GPU 0 (GPU-" in killed[2]
        and "quota 3.0GiB (claim ml/trainer-gpu-x7k2 (request gpu, share 5f0e2a1c))" in killed[2]
    )


def checks_of(n: Node, *, built: bool = True, http: Heartbeat | None = None) -> AgentChecks:
    """The agent's named checks as `serve` registers them; `built`: with the checkers the agent's parts supply once
    NVML is up (as `serve` does once it has built the agent)."""
    checks = AgentChecks(n.pods, clock=n.clock, http=http)
    if built:
        supply(checks, n)
    return checks


def supply(checks: AgentChecks, n: Node) -> None:
    checks.supply(n.agent, 1.0, DriverLimitsCheck(None, InForce(n.agent.policy)))


def test_healthz_is_the_scan_age_on_the_agents_clock() -> None:
    """The liveness probe ages the last scan on the clock the scan read, and fails past 30 s (or ten intervals)."""
    n = Node(Policy())
    checks = checks_of(n, built=False)
    assert checks.healthz() == (True, "starting")
    supply(checks, n)
    n.agent.scan()
    n.clock.step(29.0)
    assert checks.healthz() == (True, "last scan 29.0s ago")
    n.clock.step(2.0)
    assert checks.healthz() == (False, "last scan 31.0s ago: the scan loop is stuck")
    assert checks.readyz() == (False, "NVML not initialised yet")
    checks.nvml(None)
    assert checks.readyz() == (True, "ready")


def test_healthz_fails_when_the_http_servers_thread_stops_going_round() -> None:
    """Liveness also reads the HTTP server's rounds: a thread that has not gone round for 30 s is stuck (live
    fails, also while starting); one that goes round, however busy, is not."""
    n = Node(Policy())
    rounds = Heartbeat()
    checks = checks_of(n, built=False, http=rounds)
    rounds.beat(n.clock.now())
    n.clock.step(29.0)
    assert checks.healthz() == (True, "starting")
    n.clock.step(1.0)
    assert checks.healthz() == (False, "HTTP server's last round 30.0s ago: stuck")
    supply(checks, n)
    n.agent.scan()
    rounds.beat(n.clock.now())
    assert checks.healthz() == (True, "last scan 0.0s ago")


def test_ready_only_after_a_scan_that_saw_the_pods() -> None:
    """A scan that ran before the pod list was current attributed nothing: /readyz waits for the next one."""
    n = Node(Policy())
    checks = checks_of(n)
    checks.nvml(None)
    n.pods.is_synced = False
    n.agent.scan()
    assert checks.readyz() == (False, "pod cache not synced")
    n.pods.is_synced = True
    assert checks.readyz() == (False, "no scan with the pod list yet")
    n.agent.scan()
    assert checks.readyz() == (True, "ready")


def test_readiness_lists_its_named_checks() -> None:
    """/readyz?verbose names every check, failing or not, in the order the answer reads them, from the start
    (before the parts that supply theirs are built); the scan's waits for the parts' in the answer, never in the
    listing."""
    n = Node(Policy())
    checks = checks_of(n, built=False)
    n.pods.is_synced = False
    assert checks.readyz() == (False, "NVML not initialised yet; pod cache not synced")
    assert checks.readyz.listing() == (
        False,
        "[-]nvml failed: NVML not initialised yet\n[-]pods failed: pod cache not synced\n[+]driver-limits ok\n"
        "[+]memory-watch ok\n[-]scan failed: no scan completed yet\nreadyz check failed",
    )
    assert checks.healthz.listing() == (True, "[+]http ok\n[+]scan-loop ok: starting\nhealthz check passed")
    supply(checks, n)
    assert checks.readyz.names() == ("nvml", "pods", "driver-limits", "memory-watch", "scan")
    assert checks.healthz.names() == ("http", "scan-loop")


def test_a_pod_learned_late_is_scanned_at_once() -> None:
    """A GPU process whose pod the cache lacks is unattributed; the pod source's update that names the pod calls for
    a scan at once (reason pod-learned), and that scan kills the offender: no time passes on the loop's clock."""
    policy = Policy(mode=Mode.KILL)
    calls: list[ScanCalls] = []

    def watch(n: Node) -> MemoryWatch:
        calls.append(ScanCalls(policy, n.clock))  # what the pod sources are handed, built before the agent
        return MemoryWatch(n.sampler.memory, ScanTrigger(policy), 0.02, n.clock, calls=calls[0])

    n = Node(policy, watch=watch)
    late = pod("trainer", "ml", containers={"main": {VRAM: "4Gi"}})
    n.ids.add(100, late.uid, late.containers[0].container_id)
    n.run_gpu((100, 5 * GiB))
    stop, started = threading.Event(), n.clock.now()

    def pods_file_read() -> None:  # the loop's first wait: the pod arrives; its second: the test is done
        if len(n.clock.waits) == 1:
            n.pods.set_pods([late])
            calls[0].pods_updated(n.pods.pods().values())  # as a pod source does once it serves them
        else:
            stop.set()

    n.clock.on_wait = pods_file_read
    n.agent.run(poll_interval_s=30.0, stop=stop)
    assert [t.pod_uid for t in n.killer.killed] == [late.uid]
    assert n.metric("vramguard_triggered_scans_total", reason="pod-learned") == 1.0
    assert n.agent.last_scan_at == started, "the scan that killed ran when the update came, not at the poll"


def test_a_watch_stuck_in_the_driver_is_logged_once_exported_and_not_ready() -> None:
    """A watch reading stuck for WATCH_STUCK_S: the scans log watch_stuck once, vramguard_watch_stuck is 1 and
    /readyz names it; once the reading returns, watch_recovered, 0 and ready."""
    during: list[tuple[float | None, tuple[bool, str]]] = []

    def stuck_read() -> list[GpuMemory]:
        n.clock.step(WATCH_STUCK_S)
        n.agent.scan()
        n.agent.scan()
        during.append((n.metric("vramguard_watch_stuck"), checks.readyz()))
        return []

    n = Node(Policy(), watch=lambda n: MemoryWatch(stuck_read, ScanTrigger(Policy()), 0.02, n.clock))
    checks = checks_of(n)
    checks.nvml(None)
    n.agent.scan()
    assert checks.readyz() == (True, "ready") and n.metric("vramguard_watch_stuck") == 0.0
    assert n.agent.watch is not None
    with capture_logs() as logs:
        n.agent.watch.read_once()
        n.agent.scan()
    said = "memory watch: a reading has not returned for 5.0 s; scans at the poll only"
    assert during == [(1.0, (False, said))]
    assert [(e["event"], e.get("problem")) for e in logs if e["event"].startswith("watch_")] == [
        ("watch_stuck", said),
        ("watch_recovered", None),
    ]
    assert n.metric("vramguard_watch_stuck") == 0.0 and checks.readyz() == (True, "ready")


def test_an_api_outage_then_back_evicts_the_pod_once() -> None:
    """Evict mode, on_eviction_refused: wait, cooldown 0s: through a 30 s API outage (one eviction sent and
    unanswered, then given up on) and after it, the pod is evicted once; once accepted, the next scans hold it
    ("waiting for its deletion") until the pod cache shows it terminating."""
    policy = Policy(mode=Mode.EVICT, on_eviction_refused=WAIT, cooldown_s=0.0, eviction_timeout_s=15.0)
    n = Node(policy)
    evictor = GatedEvictor()
    worker = Worker("test-evict", max_queue=16, clock=n.clock)
    n.agent.enforcer = enforcer = Enforcer(
        killer=n.killer, evictor=evictor, events=n.events, policy=policy, clock=n.clock, evictions=worker
    )
    p = n.trainer_over_quota()
    enforcer.start()
    try:
        n.agent.scan()
        assert evictor.entered.wait(10), "the first eviction was sent into the outage"
        for _ in range(30):  # a scan a second while the API server does not answer
            n.clock.step(1.0)
            n.agent.scan()
        evictor.gate.set()  # the API server is back: it accepts the eviction it was sent
        done = threading.Event()
        assert worker.submit(done.set) and done.wait(10), "the worker ran everything queued before"
        held = []
        for _ in range(5):  # the pod cache has not seen the deletion yet
            n.clock.step(1.0)
            held += [h.why for h in n.agent.scan().decision.held]
        n.pods.set_pods([replace(p, terminating=True)])
        n.clock.step(1.0)
        n.agent.scan()
    finally:
        evictor.gate.set()
        enforcer.stop(n.clock.now() + 1.0)
    assert evictor.calls == [p.key], "one eviction of the pod reached the API server"
    assert n.metric("vramguard_actions_total", action="evict", result="ok") == 1.0
    # The scan that collects the late acceptance decided before it, and left its eviction unsent; then held.
    assert len(held) == 4 and all("waiting for its deletion" in why for why in held)


# --------------------------------------------------------------------------------------------------------------
# Orphans: the processes of a pod that is gone


def orphan_node(policy: Policy, *, dry_run: bool = False) -> tuple[Node, PodInfo]:
    """ml/trainer within its quota on GPU 0 through PID 100, scanned once; then deleted from the cache."""
    n = Node(policy, dry_run=dry_run)
    p = pod("trainer", "ml", containers={"main": {VRAM: "8Gi"}})
    n.pods.set_pods([p])
    n.ids.add(100, p.uid, p.containers[0].container_id)
    n.run_gpu((100, 5 * GiB))
    n.agent.scan()
    n.pods.set_pods([])
    return n, p


def scans_past_the_grace(n: Node) -> None:
    """A scan at the deletion, one at the grace (a fresh read is asked for), one a second later (its answer)."""
    n.agent.scan()
    n.clock.step(n.agent.policy.orphan_grace_s)
    n.agent.scan()
    n.clock.step(1.0)
    n.agent.scan()


def test_a_deleted_pods_processes_are_reclaimed_after_the_grace_with_a_warning_on_the_node() -> None:
    n, p = orphan_node(Policy(mode=Mode.KILL))
    n.agent.scan()
    n.clock.step(n.agent.policy.orphan_grace_s - 1.0)
    n.agent.scan()
    assert n.killer.killed == [] and n.pods.reads == 0, "nothing before the grace, not even a read"
    n.clock.step(1.0)
    report = n.agent.scan()
    assert n.killer.killed == [] and n.pods.reads == 1
    assert [u.reason for u in report.snapshot.unattributed] == [UnattributedReason.POD_NOT_IN_CACHE]
    n.clock.step(1.0)
    report = n.agent.scan()
    assert [u.reason for u in report.snapshot.unattributed] == [UnattributedReason.ORPHANED]
    assert [(t.pod_uid, [r.pid for r in t.processes]) for t in n.killer.killed] == [(p.uid, [100])]
    [(subject, reason, message, warning)] = n.events.events
    assert (subject, reason, warning) == ("node/gpu-node-1", "VRAMOrphanReclaimed", True)
    assert f"pod ml/trainer (UID {p.uid}) is gone" in message and "5.0GiB on GPU 0" in message and "PIDs 100" in message
    assert n.events.important == ["VRAMOrphanReclaimed"]
    assert n.metric("vramguard_orphan_reclaims_total", result="ok") == 1.0
    n.clock.step(1.0)
    assert n.agent.scan().snapshot.unattributed == (), "the killed process left NVML's list"
    assert len(n.killer.killed) == 1


@pytest.mark.parametrize(
    ("policy", "dry_run", "result"),
    [
        pytest.param(Policy(mode=Mode.WARN), False, "reported", id="warn-mode-reports"),
        pytest.param(Policy(mode=Mode.KILL, orphans=Orphans.REPORT), False, "reported", id="orphans-report"),
        pytest.param(Policy(mode=Mode.KILL), True, "dry-run", id="dry-run"),
    ],
)
def test_an_orphan_is_reported_not_killed_where_the_policy_says_so(policy: Policy, dry_run: bool, result: str) -> None:
    n, _ = orphan_node(policy, dry_run=dry_run)
    scans_past_the_grace(n)
    assert n.killer.killed == []
    assert n.metric("vramguard_orphan_reclaims_total", result=result) == 1.0
    if not dry_run:
        assert n.events.reasons() == ["VRAMOrphanFound"]
    n.clock.step(600.0)
    n.agent.scan()
    assert n.metric("vramguard_orphan_reclaims_total", result=result) == (1.0 if result == "reported" else 2.0)


def test_a_pod_the_api_server_still_has_is_never_touched() -> None:
    """A cache behind the API server (a watch that delivers late) lacks a running pod for longer than the grace:
    the fresh read has it, so its processes are left alone, however long the cache lags."""
    n, p = orphan_node(Policy(mode=Mode.KILL))
    n.pods.api_uids = frozenset({p.uid})
    for _ in range(5):
        scans_past_the_grace(n)
    assert n.killer.killed == [] and n.events.events == [] and n.pods.reads >= 5


def test_no_orphan_is_acted_on_while_the_pod_cache_is_unhealthy() -> None:
    """The cache broken at each scan that reaches the grace: the clock starts afresh, nothing is read or killed."""
    n, _ = orphan_node(Policy(mode=Mode.KILL))
    n.pods.problem_text = "pods watch failed: connection refused"
    for _ in range(3):
        scans_past_the_grace(n)
    assert n.killer.killed == [] and n.pods.reads == 0
    n.pods.problem_text = None
    scans_past_the_grace(n)
    assert len(n.killer.killed) == 1


def test_a_failed_read_confirms_nothing() -> None:
    n, _ = orphan_node(Policy(mode=Mode.KILL))
    n.pods.read_error = OSError("connection refused")
    scans_past_the_grace(n)
    assert n.killer.killed == [] and n.pods.reads == 1


@pytest.mark.parametrize(
    ("policy", "used", "killed"),
    [
        pytest.param(Policy(mode=Mode.KILL, default=DefaultQuota(DefaultKind.FIXED, 4 * GiB)), 5, True,
                     id="over-the-policy-default-killed"),
        pytest.param(Policy(mode=Mode.KILL, default=DefaultQuota(DefaultKind.FIXED, 4 * GiB)), 3, False,
                     id="within-the-policy-default-untouched"),
        pytest.param(Policy(mode=Mode.KILL, namespaces={"infra": NamespacePolicy(max_quota_bytes=2 * GiB)}), 3, True,
                     id="over-its-namespaces-cap-killed"),
        pytest.param(Policy(mode=Mode.KILL), 30, False, id="no-default-unmanaged"),
    ],
)  # fmt: skip
def test_a_static_pod_without_a_mirror_is_governed_under_its_own_namespace(
    policy: Policy, used: int, killed: bool
) -> None:
    """A static pod whose mirror the API server lacks (`mirrorless_static_pod`, from the kubelet's word) gets the
    policy's default quota and its namespace's cap, as any pod that declares none; its kill names it."""
    n = Node(policy)
    static = mirrorless_static_pod("5d41402abc4b2a76b9719d911017c592", KubeletPod("infra", "etcd-gpu-node-1"))
    n.pods.set_pods([static])
    n.ids.add(100, static.uid, "ab" * 32)
    n.run_gpu((100, used * GiB))
    report = n.agent.scan()
    assert [t.pod_uid for t in n.killer.killed] == ([static.uid] if killed else [])
    (row,) = rows_from_report(report, describe=lambda pid: ProcessDetail(pid, "root", "etcd"))
    assert (row.namespace, row.pod, row.container) == ("infra", "etcd-gpu-node-1", "(static pod, no mirror)")
