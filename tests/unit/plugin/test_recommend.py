"""The recommendations: verdicts, the quota in force as the agent resolves the workload's template (each peer's
unit), pod-wide quotas summed, workloads by the owner the agent saw; and the replay: usage traces scanned by the
agent's peak window, sampled by 30 s scrapes, recommended from, then replayed through the agent's decisions at the
recommended quotas, kill nothing."""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, replace
from types import MappingProxyType

import pytest

from vramguard.core.decide import DecisionState, decide
from vramguard.core.peaks import PeakWindow
from vramguard.core.pod import PodInfo
from vramguard.core.policy import Mode, NamespacePolicy, Policy
from vramguard.core.quantity import GiB, MiB
from vramguard.core.quota import QuotaBook
from vramguard.plugin.recommend import POD_WIDE, Impossible, PeakSeries, recommend, within_gpu_memory
from vramguard.plugin.strategy import recommended_bytes
from vramguard.plugin.verdict import Verdict
from vramguard.plugin.workloads import Owners, WorkloadRef
from vramguard_testbed.fakes import SnapshotBuilder, gpu, pod

from .objects import by_kind, template, workload

NS = "ml"


def _owners(*objects: dict[str, object]) -> Owners:
    return Owners(by_kind(*objects))


def _series(pod_name: str, peak: int, container: str = "main", gpu_uuid: str = "GPU-0") -> PeakSeries:
    return PeakSeries(NS, pod_name, container, gpu_uuid, peak)


@pytest.mark.parametrize(
    ("pod_template", "peak", "want"),
    [
        pytest.param(
            template({"vramguard.io/vram": "4Gi"}),
            9 * GiB,
            (Verdict.KILLED, 4 * GiB, "limits[vramguard.io/vram]", "11Gi"),
            id="over-its-quota",
        ),
        pytest.param(
            template({"vramguard.io/vram": "40Gi"}),
            9 * GiB,
            (Verdict.WASTEFUL, 40 * GiB, "limits[vramguard.io/vram]", "11Gi"),
            id="far-above-its-peak",
        ),
        pytest.param(
            template({"vramguard.io/vram": "12Gi"}),
            9 * GiB,
            (Verdict.OK, 12 * GiB, "limits[vramguard.io/vram]", "11Gi"),
            id="ok",
        ),
        pytest.param(
            template({"nvidia.com/gpumem": "4096"}),
            9 * GiB,
            (Verdict.KILLED, 4 * GiB, "limits[nvidia.com/gpumem]", "11264"),
            id="hami-mib-count",
        ),
        pytest.param(
            template({"aliyun.com/gpu-mem": "30"}),
            9 * GiB,
            (Verdict.WASTEFUL, 30 * GiB, "limits[aliyun.com/gpu-mem]", "11"),
            id="gpushare-gib-count",
        ),
        pytest.param(
            template({"tencent.com/vcuda-memory": "40"}),
            9 * GiB,
            (Verdict.OK, 10 * GiB, "limits[tencent.com/vcuda-memory]", "44"),
            id="tencent-256mi-count",
        ),
        pytest.param(
            template(annotations={"gpu-memory": "10240"}),
            9 * GiB,
            (Verdict.OK, 10 * GiB, "annotation gpu-memory", "11264"),
            id="kai-annotation-mib",
        ),
        pytest.param(
            template(),
            9 * GiB,
            (Verdict.NO_QUOTA, None, "", "11Gi"),
            id="no-quota-gets-the-annotation",
        ),
        pytest.param(
            template({"vramguard.io/vram": "4Gi"}, annotations={"vramguard.io/vram-burst": "10Gi"}),
            9 * GiB,
            (Verdict.OK, 10 * GiB, "limits[vramguard.io/vram]", "11Gi"),
            id="within-its-burst",
        ),
    ],
)
def test_one_deployment(pod_template: dict[str, object], peak: int, want: tuple[object, ...]) -> None:
    """A Deployment whose one pod peaked at `peak`: its verdict, hard limit, quota source and recommendation."""
    owners = _owners(workload("Deployment", NS, "web", pod_template))
    (row,) = recommend([_series("web-7d9f4c8b5-x2b4z", peak)], owners, Policy())
    assert row.workload == WorkloadRef(NS, "Deployment", "web")
    assert (row.verdict, row.quota_bytes, row.quota_source, row.value) == want
    assert row.peak_bytes == peak and row.recommended_bytes >= peak * 1.2


def test_the_peak_is_the_highest_of_every_pod_and_gpu() -> None:
    """A workload's pods come and go under new names: the row is the highest of any of them on any one GPU."""
    owners = _owners(workload("StatefulSet", NS, "db", template({"vramguard.io/vram": "8Gi"})))
    series = [
        _series("db-0", 3 * GiB),
        _series("db-0", 7 * GiB, gpu_uuid="GPU-1"),
        _series("db-1", 5 * GiB),
        _series("db-2", 6 * GiB),
    ]
    (row,) = recommend(series, owners, Policy())
    assert (row.peak_bytes, row.pods, row.gpus) == (7 * GiB, 3, 2)


def test_a_pod_wide_quota_sums_its_containers_per_gpu() -> None:
    """Containers covered by an annotation are one row: their peaks on one GPU summed, per pod; a container with
    its own limit is a row of its own."""
    pod_template = template(annotations={"vramguard.io/vram-limit": "10Gi"}, containers=("a", "b", "own"))
    pod_template["spec"]["containers"][2]["resources"] = {"limits": {"vramguard.io/vram": "2Gi"}}
    owners = _owners(workload("Deployment", NS, "web", pod_template))
    series = [
        _series("web-7d9f4c8b5-x2b4z", 4 * GiB, "a"),
        _series("web-7d9f4c8b5-x2b4z", 5 * GiB, "b"),
        _series("web-7d9f4c8b5-q9w2k", 6 * GiB, "a"),
        _series("web-7d9f4c8b5-x2b4z", GiB, "own"),
    ]
    pod_wide, own = recommend(series, owners, Policy())
    assert (pod_wide.container, pod_wide.containers, pod_wide.peak_bytes) == (POD_WIDE, ("a", "b"), 9 * GiB)
    assert (pod_wide.quota_source, pod_wide.verdict) == ("annotation vramguard.io/vram-limit", Verdict.OK)
    assert (own.container, own.peak_bytes, own.verdict) == ("own", GiB, Verdict.OK)


def test_the_namespace_cap_and_an_invalid_value_are_noted() -> None:
    """The quota in force is the agent's: capped by max_quota, an invalid value named in the agent's words."""
    policy = Policy(namespaces=MappingProxyType({NS: NamespacePolicy(max_quota_bytes=8 * GiB)}))
    owners = _owners(
        workload("Deployment", NS, "web", template({"vramguard.io/vram": "32Gi"})),
        workload("Deployment", NS, "typo", template(annotations={"vramguard.io/vram-limit": "12GB"})),
    )
    rows = recommend([_series("web-7d9f4c8b5-x2b4z", 9 * GiB), _series("typo-7d9f4c8b5-x2b4z", GiB)], owners, policy)
    typo, web = rows
    assert (web.quota_bytes, web.verdict) == (8 * GiB, Verdict.KILLED)
    assert any("over the namespace max_quota 8Gi" in n for n in web.notes)
    assert any('metadata.annotations[vramguard.io/vram-limit]: "12GB" is not a valid quantity' in n for n in typo.notes)


def test_a_gone_bare_pod_is_unknown_and_a_workload_without_gpu_memory_is_left_out() -> None:
    owners = _owners(workload("Deployment", NS, "cpu-only", template()))
    rows = recommend([_series("gone", 2 * GiB), _series("cpu-only-7d9f4c8b5-x2b4z", 0)], owners, Policy())
    assert [(r.workload.kind, r.workload.name, r.verdict) for r in rows] == [("Pod", "gone", Verdict.UNKNOWN)]


def test_workloads_are_grouped_by_the_owner_the_agents_saw() -> None:
    """Series with the pod's controller are grouped by it (two ReplicaSets of one Deployment, one row), whatever
    their pods' names; a series without it, from an older agent, is placed by its name."""
    owners = _owners(workload("Deployment", NS, "web", template({"vramguard.io/vram": "12Gi"})))
    found = [
        replace(_series("renamed-1", 9 * GiB), owner="ReplicaSet/web-7d9f4c8b5"),
        replace(_series("renamed-2", 10 * GiB), owner="ReplicaSet/web-5c6d7f8b9"),
        _series("web-7d9f4c8b5-x2b4z", 11 * GiB),
    ]
    (row,) = recommend(found, owners, Policy())
    assert (row.workload, row.pods, row.peak_bytes) == (WorkloadRef(NS, "Deployment", "web"), 3, 11 * GiB)


def test_a_peak_over_its_gpus_memory_is_impossible() -> None:
    """A peak is kept within its GPU's memory, or the largest GPU's where its GPU is not reported; above, or with no
    GPU reported at all, it is refused with the bound it broke."""
    fits, over, elsewhere = _series("a", 80 * GiB), _series("b", 80 * GiB + 1), _series("c", 90 * GiB, gpu_uuid="G-9")
    totals = {"GPU-0": 80 * GiB, "GPU-1": 40 * GiB}
    assert within_gpu_memory([fits, over, elsewhere], totals) == (
        [fits],
        [Impossible(over, 80 * GiB), Impossible(elsewhere, 80 * GiB)],
    )
    assert within_gpu_memory([fits], {}) == ([], [Impossible(fits, None)])


# --------------------------------------------------------------------------------------------------------------
# The replay

SCRAPE_S = 30.0
SCAN_S = 0.25  # scans at the poll and at each change the watch sees
DAY_S = 300.0  # a compressed day: the shape matters, not the length


def _trace(rng: random.Random) -> list[tuple[float, int]]:
    """(time, bytes) of one training job: a base, a step spike every so often (seconds long), rare big evals."""
    base = rng.randint(2, 30) * GiB
    out = []
    t = 0.0
    while t < DAY_S:
        used = base + rng.randint(0, 512) * MiB
        if rng.random() < 0.02:  # a step's spike, 0.25 to 2 s
            used += rng.randint(1, 12) * GiB
        if rng.random() < 0.002:
            used += rng.randint(8, 20) * GiB
        out.append((t, used))
        t += SCAN_S
    return out


@dataclass(frozen=True)
class _Scraped:
    """What the replay's workloads used, and what Prometheus scraped of it."""

    traces: dict[str, list[tuple[float, int]]]  # by workload name
    pods: dict[str, PodInfo]
    peak_bytes: dict[str, int]  # max_over_time of the scraped peak gauge
    used_bytes: dict[str, int]  # max_over_time of the scraped usage gauge


@functools.cache
def _scraped() -> _Scraped:
    """Twenty-four workloads' traces, scanned by the agent's peak window and scraped every 30 s. It does not depend on
    the headroom, so it is made once for every case."""
    rng = random.Random(34)
    device = gpu(0, total_bytes=10_000 * GiB)
    names = [f"job-{i}" for i in range(24)]
    traces = {name: _trace(rng) for name in names}
    window = PeakWindow()
    scraped_peak: dict[str, int] = dict.fromkeys(names, 0)
    scraped_used: dict[str, int] = dict.fromkeys(names, 0)
    pods = {name: pod(f"{name}-7d9f4c8b5-x2b4z", NS) for name in names}
    next_scrape = SCRAPE_S
    for step in range(len(traces[names[0]])):
        now = step * SCAN_S
        builder = SnapshotBuilder(devices=[device])
        for name in names:
            builder.use(pods[name], "main", device, traces[name][step][1])
        snapshot = builder.build()
        peaks = window.observe(snapshot.containers, {device.uuid: device}, now)
        last = step == len(traces[names[0]]) - 1  # and the scrape after the end: the peaks are exported 60 s on
        if now >= next_scrape or last:  # a scrape: each gauge's value now
            next_scrape += SCRAPE_S
            for p in peaks:
                name = p.pod.name.rsplit("-", 2)[0]
                scraped_peak[name] = max(scraped_peak[name], p.peak_bytes)
            for u in snapshot.containers:
                name = u.pod.name.rsplit("-", 2)[0]
                scraped_used[name] = max(scraped_used[name], u.used_bytes)
    return _Scraped(traces, pods, scraped_peak, scraped_used)


@pytest.mark.parametrize("headroom", [0.0, 0.10, 0.25])
def test_replaying_the_usage_at_the_recommended_quotas_kills_nothing(headroom: float) -> None:
    """Twenty-four workloads' traces, scanned by the agent's peak window and scraped every 30 s: `recommend` from the
    scraped peaks (max_over_time), then every scan of every trace through `decide` in kill mode with the recommended
    quotas: no violation, no action. The same traces at the quotas the usage gauge alone would give (max_over_time
    of the scraped usage) are killed: the peak metric is what makes it hold."""
    scraped = _scraped()
    device = gpu(0, total_bytes=10_000 * GiB)
    names = list(scraped.traces)
    owners = _owners(*(workload("Deployment", NS, name, template()) for name in names))
    series = [_series(scraped.pods[name].name, scraped.peak_bytes[name]) for name in names]
    rows = {r.workload.name: r for r in recommend(series, owners, Policy(), headroom)}
    assert all(r.peak_bytes == max(b for _, b in scraped.traces[name]) for name, r in rows.items()), "the true peaks"

    def first_violation(quotas: dict[str, int]) -> float | None:
        """The time of the first scan in which `decide` finds a container over its quota; None if none does. Each
        scan is decided from a fresh state, so the scans after the first violation need not be replayed."""
        limited = {
            name: replace(p, containers=(replace(p.containers[0], limits={"vramguard.io/vram": str(quotas[name])}),))
            for name, p in scraped.pods.items()
        }
        policy = Policy(mode=Mode.KILL, hard_grace_s=0.0)
        book, _ = QuotaBook(policy).resolve({p.uid: p for p in limited.values()}, {})
        for step in range(len(scraped.traces[names[0]])):
            builder = SnapshotBuilder(devices=[device])
            for name in names:
                builder.use(limited[name], "main", device, scraped.traces[name][step][1])
            decision, _ = decide(builder.build(), book, policy, DecisionState(), step * SCAN_S)
            if decision.violations:
                return step * SCAN_S
        return None

    assert first_violation({name: r.recommended_bytes for name, r in rows.items()}) is None
    by_usage_gauge = {name: recommended_bytes(scraped.used_bytes[name], headroom) for name in names}
    assert first_violation(by_usage_gauge) is not None, "the scraped usage alone misses spikes"


@pytest.mark.parametrize(
    ("pod_template", "key", "field", "value"),
    [
        pytest.param(
            template(env=[{"name": "NVIDIA_GPU_MEMORY_LIMIT", "value": "4096"}]),
            "NVIDIA_GPU_MEMORY_LIMIT",
            "env NVIDIA_GPU_MEMORY_LIMIT",
            "11264",
            id="the-toolkits-variable",
        ),
        pytest.param(
            template(annotations={"nvidia.com/container.main.gpu-memory.limit": "4Gi"}),
            "nvidia.com/container.main.gpu-memory.limit",
            "annotation nvidia.com/container.main.gpu-memory.limit",
            "11Gi",
            id="kais-annotation",
        ),
        pytest.param(
            template({"vramguard.io/vram": "4Gi"}), "vramguard.io/vram", "limits[vramguard.io/vram]", "11Gi", id="one"
        ),
    ],
)
def test_a_pair_is_recommended_in_its_limits_own_key(
    pod_template: dict[str, object], key: str, field: str, value: str
) -> None:
    """The wide table and the JSON name the key the patch writes (the container's limit of a pair), not the source."""
    owners = _owners(workload("Deployment", NS, "web", pod_template))
    (row,) = recommend([_series("web-7d9f4c8b5-x2b4z", 9 * GiB)], owners, Policy())
    assert (row.target_key, row.target_field, row.value) == (key, field, value)
