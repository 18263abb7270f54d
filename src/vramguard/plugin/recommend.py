"""`kubectl vramguard recommend`: per workload and container, the GPU memory quota it needs. Pure: peaks in
(from Prometheus or the agents), the live owners (`workloads.Owners`) and the policy, recommendations out.

Four parts, each in its module: the rule (`strategy`: peak → recommended quota), the quota in force (`in_force`:
the agent's own resolution and layout of the workload's pod template), the verdict (`verdict`) and the patch
(`patch`). This module joins them: it groups the peaks by workload (by the pod's controller the agent saw,
`PeakSeries.owner`), and a workload's by the quota that governs them.

A container's peak is the highest usage any of its pods had on any one GPU over the window (a quota applies per
GPU). Containers a pod-wide quota covers (an annotation) are judged together, as the agent judges them: their
peaks on one GPU summed, per pod (a sum of peaks is never below the peak of the sum, so the recommendation is on
the safe side).

A peak is a fact only within the GPU memory the agents report: one above it (`within_gpu_memory`) is impossible, and
is refused and reported rather than taken as a workload's need.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from vramguard.core.policy import Policy
from vramguard.core.quantity import format_quantity
from vramguard.core.sources import QuotaSource
from vramguard.plugin.in_force import Governs, field_of, in_force, spell
from vramguard.plugin.strategy import DEFAULT_HEADROOM, recommended_bytes
from vramguard.plugin.verdict import Verdict, verdict
from vramguard.plugin.workloads import Owners, Workload, WorkloadRef

POD_WIDE: Final = ""  # the container of a row for a pod-wide quota (the pod's covered containers together)


@dataclass(frozen=True, slots=True)
class PeakSeries:
    """One (pod, container, GPU)'s highest usage over the window. `owner`: the pod's controller as the agent saw
    it ("ReplicaSet/web-7d9f"; "Pod/<pod>" for a pod it saw without one), where known: "" from older agents."""

    namespace: str
    pod: str
    container: str
    gpu_uuid: str
    peak_bytes: int
    owner: str = ""


@dataclass(frozen=True, slots=True)
class Impossible:
    """A peak above the memory of the GPU it was on: `bound_bytes`, that GPU's (or, where its GPU is not reported,
    the largest GPU's on its node, or in the fleet); None where the agents report no GPU at all."""

    series: PeakSeries
    bound_bytes: int | None


def within_gpu_memory(
    series: Iterable[PeakSeries], total_bytes: Mapping[str, int]
) -> tuple[list[PeakSeries], list[Impossible]]:
    """The peaks no larger than their GPU's memory (`total_bytes`, by GPU UUID, as the agents report it; a GPU it
    does not name: its largest), and the others, refused."""
    largest = max(total_bytes.values(), default=None)
    kept: list[PeakSeries] = []
    refused: list[Impossible] = []
    for s in series:
        bound = total_bytes.get(s.gpu_uuid, largest)
        if bound is None or s.peak_bytes > bound:
            refused.append(Impossible(s, bound))
        else:
            kept.append(s)
    return kept, refused


@dataclass(frozen=True, slots=True)
class Recommendation:
    workload: WorkloadRef
    container: str  # POD_WIDE: the containers a pod-wide quota covers, summed per GPU
    containers: tuple[str, ...]  # the containers the row stands for
    pods: int  # pods seen with GPU memory in the window
    gpus: int  # the most GPUs one pod of it used (the container, or the covered containers)
    peak_bytes: int
    recommended_bytes: int
    quota_bytes: int | None  # the hard limit in force per GPU; None: none, or not a number of bytes
    quota_source: str
    verdict: Verdict
    target: QuotaSource  # where the recommendation goes: the field in force, or NEW_FIELD
    value: str  # the recommendation as `target` takes it
    notes: tuple[str, ...] = ()

    @property
    def target_key(self) -> str:
        """The key the recommendation is written to: a pair's limit for the row's container
        (`NVIDIA_GPU_MEMORY_LIMIT`, `nvidia.com/container.<name>.gpu-memory.limit`), else the target's name."""
        return (
            self.target.pair_keys(self.containers[0])[1] if self.target.pair and self.containers else self.target.name
        )

    @property
    def target_field(self) -> str:
        """`target_key` as messages name a field: `limits[<name>]`, `annotation <key>`, `env <key>`."""
        return self.target.field if not self.target.pair else f"{self.target.kind.value} {self.target_key}"


def _most_gpus(series: Iterable[PeakSeries]) -> int:
    per_pod: dict[str, set[str]] = defaultdict(set)
    for s in series:
        per_pod[s.pod].add(s.gpu_uuid)
    return max((len(g) for g in per_pod.values()), default=0)


def _summed_peak(series: Iterable[PeakSeries]) -> int:
    """The highest, over pods and GPUs, of the peaks of the series' containers on one GPU summed."""
    per_gpu: dict[tuple[str, str], int] = defaultdict(int)
    for s in series:
        per_gpu[(s.pod, s.gpu_uuid)] += s.peak_bytes
    return max(per_gpu.values(), default=0)


def recommend(
    series: Iterable[PeakSeries],
    owners: Owners,
    policy: Policy,
    headroom: float = DEFAULT_HEADROOM,
) -> list[Recommendation]:
    """One row per workload and container (or pod-wide quota) that used GPU memory in the window."""
    by_workload: dict[WorkloadRef, list[PeakSeries]] = defaultdict(list)
    for s in series:
        if s.peak_bytes > 0:
            by_workload[owners.workload_of(s.namespace, s.pod, s.owner)].append(s)
    rows: list[Recommendation] = []
    for ref, found in by_workload.items():
        rows.extend(_rows(owners.workload(ref), found, policy, headroom))
    return sorted(rows, key=lambda r: (r.workload, r.container))


def _rows(workload: Workload, found: Sequence[PeakSeries], policy: Policy, headroom: float) -> list[Recommendation]:
    force = in_force(workload, policy)
    cap = policy.cap_for(workload.ref.namespace)
    by_container: dict[str, list[PeakSeries]] = defaultdict(list)
    for s in found:
        by_container[s.container].append(s)

    # Each container under what governs it on a GPU it used (`QuotaInForce.governs`): its own quota, a DRA share, or the
    # pod-wide quota (one row for the containers it covers, POD_WIDE); None: the quota in force is unknown.
    governs: dict[str, Governs | None] = {}
    groups: dict[str, list[str]] = {}  # row container → the containers it stands for
    for name in sorted(by_container):
        governs[name] = g = force.governs(name, by_container[name][0].gpu_uuid)
        groups.setdefault(POD_WIDE if g is not None and g.pod_wide else name, []).append(name)

    rows = []
    for row_container, names in groups.items():
        covered = [s for name in names for s in by_container[name]]
        notes = list(force.notes)
        governed = governs[names[0]]
        quota = governed.quota if governed is not None else None
        if row_container == POD_WIDE:
            peak = _summed_peak(covered)
        else:
            peak = max(s.peak_bytes for s in covered)
            if governed is not None and governed.share:
                notes.append("held to its DRA claims' shares: size the claim, not a quota field")
        target = field_of(quota, None if row_container == POD_WIDE else force.declared.get(row_container))
        recommended = recommended_bytes(peak, headroom, target.unit_bytes)
        if cap is not None and recommended > cap:
            notes.append(f"over the namespace max_quota {format_quantity(cap)}: it would be capped there")
        hard = quota.hard_bytes if quota is not None else None
        if quota is not None and quota.share_divisor is not None:
            notes.append("a fair share: its bytes depend on the GPU")
        has_quota = None if governed is None else governed.managed
        rows.append(
            Recommendation(
                workload=workload.ref,
                container=row_container,
                containers=tuple(names),
                pods=len({s.pod for s in covered}),
                gpus=_most_gpus(covered),
                peak_bytes=peak,
                recommended_bytes=recommended,
                quota_bytes=hard,
                quota_source=quota.source if quota is not None else ("unknown" if governed is None else ""),
                verdict=verdict(peak, hard, recommended, has_quota),
                target=target,
                value=spell(target, recommended),
                notes=tuple(notes),
            )
        )
    return rows
