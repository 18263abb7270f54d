"""Driver-level memory limits, pure: which limits the quotas call for (a table), and which rows the driver's own
count replaces."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vramguard.core.driver_limit import LimitKey, LimitTarget
from vramguard.core.limit_plan import (
    LimitPlanner,
    WantedLimits,
    limits_enabled,
    uses_limiter,
    wanted_limits,
    with_driver_usage,
)
from vramguard.core.pod import PodInfo
from vramguard.core.policy import DriverLimits, Mode, NamespacePolicy, Policy
from vramguard.core.quantity import GiB
from vramguard.core.quota import QuotaBook
from vramguard.core.sample import GpuDevice
from vramguard_testbed.fakes import FakePodSource, SnapshotBuilder, gpu, pod

QUOTA = "vramguard.io/vram"
KILL = Policy(mode=Mode.KILL)
MIG_PARENT = gpu(2, 80 * GiB)
MIG_SLICE = replace(gpu(3, 10 * GiB), uuid="MIG-aaaa", mig_index=0, parent_uuid=MIG_PARENT.uuid)


def targets_for(
    pods: list[PodInfo], devices: list[GpuDevice], policy: Policy = KILL, agent_pod_uid: str | None = None
) -> list[tuple[str, str | None, int, int]]:
    by_uid = {p.uid: p for p in pods}
    quotas, _ = QuotaBook(policy).resolve(by_uid, {})
    found = wanted_limits(by_uid, quotas, devices, policy, agent_pod_uid=agent_pod_uid)
    return [(t.pod.name, t.container, t.gpu_index, t.hard_bytes) for t in found]


TRAINER = pod("trainer", "ml", containers={"main": {QUOTA: "8Gi"}, "sidecar": {}})
PAIR = pod("pair", "ml", containers={"a": {QUOTA: "8Gi"}, "b": {QUOTA: "4Gi"}})
MIXED = pod("mixed", "ml", containers={"own": {QUOTA: "8Gi"}, "rest": {}},
            annotations={"vramguard.io/vram-limit": "2Gi", "vramguard.io/vram-containers": "rest"})  # fmt: skip


def with_env(p: PodInfo, **variables: str) -> PodInfo:
    """The pod with each container's `env[]` setting `variables` (NVIDIA's toolkit variables), each a literal value."""
    return replace(p, containers=tuple(replace(c, env=dict(variables)) for c in p.containers))


MiB = 2**20
# NVIDIA's own declarations: the toolkit's variables (whole MiB), KAI's per-container annotations (quantities).
HOOKED = with_env(pod("hooked", "ml"), NVIDIA_GPU_MEMORY_REQUEST="2048", NVIDIA_GPU_MEMORY_LIMIT="4096")
REQUEST_ONLY = with_env(pod("soft", "ml"), NVIDIA_GPU_MEMORY_REQUEST="2048")
REQUEST_ONLY_BESIDE = with_env(pod("beside", "ml", containers={"main": {}, "own": {QUOTA: "8Gi"}}),
                               NVIDIA_GPU_MEMORY_REQUEST="2048")  # fmt: skip
KAI = pod("kai", "ml", annotations={"nvidia.com/container.main.gpu-memory.request": "2Gi",
                                    "nvidia.com/container.main.gpu-memory.limit": "3Gi"})  # fmt: skip

# (case, pods, devices, policy, expected limits as (pod, container, GPU, bytes)); the case is the test's id
WANTED_CASES = [
        ("a container quota on every GPU; none on the pod, whose sidecar has none", [TRAINER], [gpu(0), gpu(1)], KILL,
         [("trainer", "main", 0, 8 * GiB), ("trainer", "main", 1, 8 * GiB)]),
        ("the pod holds the sum of its containers'", [PAIR], [gpu(0)], KILL,
         [("pair", None, 0, 12 * GiB), ("pair", "a", 0, 8 * GiB), ("pair", "b", 0, 4 * GiB)]),
        ("own quotas and a pod-wide one add up", [MIXED], [gpu(0)], KILL,
         [("mixed", None, 0, 10 * GiB), ("mixed", "own", 0, 8 * GiB)]),
        ("evict mode too", [PAIR], [gpu(0)], Policy(mode=Mode.EVICT),
         [("pair", None, 0, 12 * GiB), ("pair", "a", 0, 8 * GiB), ("pair", "b", 0, 4 * GiB)]),
        ("never in warn mode", [TRAINER], [gpu(0)], Policy(mode=Mode.WARN), []),
        ("a namespace in warn mode", [TRAINER], [gpu(0)],
         replace(KILL, namespaces={"ml": NamespacePolicy(mode=Mode.WARN)}), []),
        ("a namespace in kill mode under a warn policy", [TRAINER], [gpu(0)],
         Policy(mode=Mode.WARN, namespaces={"ml": NamespacePolicy(mode=Mode.KILL)}), [("trainer", "main", 0, 8 * GiB)]),
        ("an exempt namespace", [pod("agent", "kube-system", containers={"main": {QUOTA: "1Gi"}})], [gpu(0)], KILL, []),
        ("the burst is the hard limit",
         [pod("b", "ml", containers={"main": {QUOTA: "4Gi"}}, annotations={"vramguard.io/vram-burst": "6Gi"})],
         [gpu(0)], KILL, [("b", None, 0, 6 * GiB), ("b", "main", 0, 6 * GiB)]),
        ("capped at the GPU's memory", [PAIR], [gpu(0, 10 * GiB)], KILL,
         [("pair", None, 0, 10 * GiB), ("pair", "a", 0, 8 * GiB), ("pair", "b", 0, 4 * GiB)]),
        ("a pod-wide quota goes on the pod's cgroup",
         [pod("p", "ml", annotations={"vramguard.io/vram-limit": "6Gi"})], [gpu(0)], KILL, [("p", None, 0, 6 * GiB)]),
        ("no MIG instance, nor its parent", [TRAINER], [MIG_PARENT, MIG_SLICE], KILL, []),
        ("no unhealthy GPU", [TRAINER], [gpu(0, healthy=False), gpu(1)], KILL, [("trainer", "main", 1, 8 * GiB)]),
        ("no container without a quota", [pod("free", "ml")], [gpu(0)], KILL, []),
        ("NVIDIA's variables: the limit is the hard limit (the toolkit's hook may hold it: the limiter looks)",
         [HOOKED], [gpu(0)], KILL, [("hooked", None, 0, 4096 * MiB), ("hooked", "main", 0, 4096 * MiB)]),
        ("KAI's annotations: the limit is the hard limit", [KAI], [gpu(0)], KILL,
         [("kai", None, 0, 3 * GiB), ("kai", "main", 0, 3 * GiB)]),
        ("a request alone has no hard limit: nothing to program, the agent holds it", [REQUEST_ONLY], [gpu(0)], KILL,
         []),
        ("a request alone beside a container with a quota: the pod's cgroup holds none", [REQUEST_ONLY_BESIDE],
         [gpu(0)], KILL, [("beside", "own", 0, 8 * GiB)]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "pods", "devices", "policy", "expected"), WANTED_CASES, ids=[row[0] for row in WANTED_CASES]
)
def test_wanted_limits(
    case: str, pods: list[PodInfo], devices: list[GpuDevice], policy: Policy, expected: list[object]
) -> None:
    """A container with a quota gets a driver limit on each healthy whole GPU in kill or evict mode; its pod the sum."""
    assert targets_for(pods, devices, policy) == expected, case


def test_not_the_agents_own_pod_and_pending_before_the_container_runs() -> None:
    """The agent's own pod gets no limit; a container not yet running is pending, its pod's limit is not."""
    assert targets_for([PAIR], [gpu(0)], agent_pod_uid=PAIR.uid) == []
    not_started = replace(PAIR, containers=tuple(replace(c, container_id=None) for c in PAIR.containers))
    by_uid = {not_started.uid: not_started}
    quotas, _ = QuotaBook(KILL).resolve(by_uid, {})
    found = wanted_limits(by_uid, quotas, [gpu(0)], KILL)
    assert [(t.container, t.pending, t.hard_bytes) for t in found] == [
        (None, False, 12 * GiB), ("a", True, 8 * GiB), ("b", True, 4 * GiB)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("policy", "dry_run", "enabled"),
    [
        pytest.param(KILL, False, True, id="kill"),
        pytest.param(KILL, True, False, id="dry-run"),
        pytest.param(replace(KILL, driver_limits=DriverLimits.OFF), False, False, id="driver-limits-off"),
        pytest.param(replace(KILL, driver_limits=DriverLimits.REQUIRE), False, True, id="driver-limits-require"),
    ],
)
def test_limits_enabled(policy: Policy, dry_run: bool, enabled: bool) -> None:
    """Driver limits are on unless the agent runs dry or the policy turns them off."""
    assert limits_enabled(policy, dry_run) is enabled


def test_the_driver_count_replaces_the_rows_and_disagreements_are_reported() -> None:
    """The driver's count replaces the rows' usage of each limited container, and each difference is reported."""
    gpu0 = gpu(0, 24 * GiB)
    other = pod("other", "ml", containers={"main": {QUOTA: "8Gi"}})
    quiet = pod("quiet", "ml", containers={"main": {QUOTA: "8Gi"}})
    snapshot = SnapshotBuilder().use(TRAINER, "main", gpu0, 3 * GiB).use(other, "main", gpu0, 2 * GiB).build()
    by_uid = {p.uid: p for p in (TRAINER, other, quiet)}
    quotas, _ = QuotaBook(KILL).resolve(by_uid, {})
    held = {t.key: t for t in wanted_limits(by_uid, quotas, [gpu0], KILL)}
    usage: dict[LimitKey, int] = {
        LimitKey(TRAINER.uid, "main", gpu0.uuid): 5 * GiB,  # a context the process rows miss
        LimitKey(other.uid, "main", gpu0.uuid): 2 * GiB,  # the same: no disagreement
        LimitKey(quiet.uid, "main", gpu0.uuid): 1 * GiB,  # no process row at all
    }
    merged, disagreements = with_driver_usage(snapshot, held, usage)
    used = {(u.pod.name, u.container): (u.used_bytes, len(u.processes)) for u in merged.containers}
    assert used == {("trainer", "main"): (5 * GiB, 1), ("other", "main"): (2 * GiB, 1), ("quiet", "main"): (1 * GiB, 0)}
    assert [(d.target.pod.name, d.rows_bytes, d.driver_bytes) for d in disagreements] == [
        ("trainer", 3 * GiB, 5 * GiB), ("quiet", 0, 1 * GiB)
    ]  # fmt: skip
    assert with_driver_usage(snapshot, held, {}) == (snapshot, ())


def test_wanted_limits_are_kept_while_the_sources_hand_out_the_same_inputs() -> None:
    """The memo keys on the mappings the sources handed out and on the GPUs' UUID, index and size."""
    gpu0 = gpu(0, 24 * GiB)
    pods = {TRAINER.uid: TRAINER}
    labels = {"zone": "a"}
    memo = WantedLimits.of(pods, labels, None, [gpu0], ())
    assert memo.computed_from(pods, labels, None, [gpu0])
    assert memo.computed_from(pods, labels, None, [replace(gpu0, healthy=True)]), "the same GPU, read again"
    assert not memo.computed_from({}, labels, None, [gpu0]), "other pods"
    assert not memo.computed_from(pods, {"zone": "b"}, None, [gpu0]), "other labels"
    assert not memo.computed_from(pods, labels, {}, [gpu0]), "DRA shares appeared"
    assert not memo.computed_from(pods, labels, None, [replace(gpu0, total_bytes=48 * GiB)]), "another size"
    assert not memo.computed_from(pods, labels, None, []), "the GPU left"


def scan(
    planner: LimitPlanner, source: FakePodSource, devices: list[GpuDevice], agent_pod_uid: str | None = None
) -> tuple[tuple[LimitTarget, ...], list[int]]:
    """What the scan hands the limiter: the planner's targets for the source's pods (their quotas resolved in kill
    mode), and the GPUs."""
    pods = source.pods()
    quotas, _ = QuotaBook(KILL).resolve(pods, {})
    return planner.wanted(pods, {}, None, quotas, devices, agent_pod_uid)


def test_the_planner_keeps_the_scans_targets_while_nothing_changes() -> None:
    """The scan's targets are the same tuple while the sources hand out the same mappings; a reload computes them
    afresh, with the reloaded policy."""
    source = FakePodSource([TRAINER])
    planner = LimitPlanner(source, None, KILL)
    devices = [gpu(0, 24 * GiB), MIG_PARENT, MIG_SLICE]
    targets, gpus = scan(planner, source, devices)
    assert gpus == [0] and [(t.container, t.hard_bytes) for t in targets] == [("main", 8 * GiB)]
    assert scan(planner, source, devices)[0] is targets
    planner.use(Policy(mode=Mode.WARN))
    assert scan(planner, source, devices)[0] == ()


def test_the_planner_plans_one_pod_from_the_sources_and_the_last_scan() -> None:
    """`plan` reads the pod fresh from its source, with the GPUs and the agent's pod the last scan saw and the
    policy in force: nothing before a scan saw the GPUs, nothing for a pod the source does not know yet, nothing
    for the agent's own pod, nothing once a reload turned limits off."""
    source = FakePodSource()
    planner = LimitPlanner(source, None, KILL)
    assert planner.plan(TRAINER.uid) is None, "no scan yet"
    scan(planner, source, [gpu(0, 24 * GiB), gpu(1, 24 * GiB)], agent_pod_uid=PAIR.uid)
    assert planner.plan(TRAINER.uid) is None, "not known yet"
    source.set_pods([TRAINER, PAIR])
    found = planner.plan(TRAINER.uid)
    assert found is not None and [(t.container, t.gpu_index) for t in found] == [("main", 0), ("main", 1)]
    assert planner.plan(PAIR.uid) == (), "the agent's own pod"
    planner.use(replace(KILL, driver_limits=DriverLimits.OFF))
    assert planner.plan(TRAINER.uid) == ()
    dry = LimitPlanner(source, None, KILL, dry_run=True)
    scan(dry, source, [gpu(0, 24 * GiB)])
    assert dry.plan(TRAINER.uid) == ()


@pytest.mark.parametrize(
    ("policy", "dry_run", "uses"),
    [
        pytest.param(KILL, False, True, id="kill"),
        pytest.param(Policy(mode=Mode.WARN), False, False, id="warn-only-limits-nothing"),
        pytest.param(
            Policy(mode=Mode.WARN, namespaces={"ml": NamespacePolicy(mode=Mode.EVICT)}),
            False,
            True,
            id="warn-but-one-namespace-evicts",
        ),
        pytest.param(KILL, True, False, id="dry-run"),
        pytest.param(replace(KILL, driver_limits=DriverLimits.OFF), False, False, id="driver-limits-off"),
    ],
)
def test_uses_limiter(policy: Policy, dry_run: bool, uses: bool) -> None:
    """The agent programs limits where it enforces somewhere and may use them (at start and at each reload)."""
    assert uses_limiter(policy, dry_run) is uses
