"""Quota resolution: sources in precedence order, units, defaults, burst and namespace caps."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from quota_values import CAPS, ROWS, Row
from vramguard.core.limit_plan import pod_limits
from vramguard.core.pod import ContainerInfo, PodInfo
from vramguard.core.policy import (
    DefaultKind,
    DefaultQuota,
    NamespacePolicy,
    Policy,
    parse_policy,
)
from vramguard.core.quantity import GiB, MiB
from vramguard.core.quota import (
    MAX_MESSAGE_CHARS,
    NO_HARD_LIMIT,
    NO_SHARE,
    REPLICAS_LABEL,
    UNMANAGED,
    PodQuota,
    Quota,
    QuotaBook,
    QuotaScope,
    RowQuota,
    Subject,
    invalid_message,
    resolve_pod_quota,
    row_quota,
)
from vramguard.core.sample import GpuDevice
from vramguard.core.snapshot import ContainerUsage
from vramguard.core.sources import (
    BURST_ANNOTATION,
    QuotaError,
    parse_quota_source,
)
from vramguard.kube.pod_manifest import pod_info_from_manifest

VRAM = "vramguard.io/vram"
GPUMEM = "nvidia.com/gpumem"
LIMIT = "vramguard.io/vram-limit"
KAI = "gpu-memory"


def limits(name: str) -> dict[str, Any]:
    """A Quota's `source` and `origin` for a container's limit `name`."""
    origin = parse_quota_source(f"resource:{name}")
    return {"source": origin.field, "origin": origin}


def annotation(name: str) -> dict[str, Any]:
    """A Quota's `source` and `origin` for the pod's annotation `name`."""
    origin = parse_quota_source(f"annotation:{name}")
    return {"source": origin.field, "origin": origin}


FIXED_8GI = DefaultQuota(DefaultKind.FIXED, 8 * GiB)
FAIR = DefaultQuota(DefaultKind.FAIR_SHARE)
CAP_16GI = {"team-a": NamespacePolicy(max_quota_bytes=16 * GiB)}
OVER_16GI = "is over the namespace max_quota 16Gi"


def pod(
    *containers: ContainerInfo, annotations: Mapping[str, str] | None = None, namespace: str = "default"
) -> PodInfo:
    return PodInfo(
        uid="uid-1", namespace=namespace, name="p", containers=containers, annotations=dict(annotations or {})
    )


def c(name: str, **limits: str) -> ContainerInfo:
    """A container whose limits are given by short name: vram=, gpumem=, aliyun=, tencent=."""
    names = {"vram": VRAM, "gpumem": GPUMEM, "aliyun": "aliyun.com/gpu-mem", "tencent": "tencent.com/vcuda-memory"}
    return ContainerInfo(name=name, limits={names[k]: v for k, v in limits.items()})


@dataclass
class Case:
    pod: PodInfo
    containers: dict[str, Quota] = field(default_factory=dict)
    pod_quota: Quota | None = None
    errors: list[tuple[str, str, str]] = field(default_factory=list)  # (field, value, part of the message)
    policy: Policy = field(default_factory=Policy)
    labels: dict[str, str] = field(default_factory=dict)


CASES = [
    # Sources and units
    pytest.param(
        Case(pod(c("trainer", vram="12Gi")), {"trainer": Quota(12 * GiB, **limits(VRAM))}),
        id="vramguard-resource-gives-the-container-its-own-quota",
    ),
    pytest.param(
        Case(pod(c("t", aliyun="3")), {"t": Quota(3 * GiB, **limits("aliyun.com/gpu-mem"))}),
        id="aliyun-gpu-mem-GiB-units",
    ),
    pytest.param(
        Case(pod(c("t", gpumem="3000")), {"t": Quota(3000 * MiB, **limits(GPUMEM))}),
        id="hami-gpumem-MiB-units",
    ),
    pytest.param(
        Case(pod(c("t", tencent="4")), {"t": Quota(GiB, **limits("tencent.com/vcuda-memory"))}),
        id="tencent-vcuda-256Mi-units",
    ),
    pytest.param(
        Case(pod(c("t", vram="12Gi", gpumem="3000")), {"t": Quota(12 * GiB, **limits(VRAM))}),
        id="first-resource-in-precedence-wins",
    ),
    pytest.param(
        Case(pod(c("a"), c("b"), annotations={LIMIT: "12Gi"}), pod_quota=Quota(12 * GiB, **annotation(LIMIT))),
        id="annotation-gives-one-pod-wide-quota",
    ),
    pytest.param(
        Case(pod(c("a"), annotations={KAI: "2000"}), pod_quota=Quota(2000 * MiB, **annotation(KAI))),
        id="kai-gpu-memory-annotation-MiB-units",
    ),
    pytest.param(
        Case(
            pod(c("a"), annotations={LIMIT: "12Gi", KAI: "2000"}),
            pod_quota=Quota(12 * GiB, **annotation(LIMIT)),
        ),
        id="vram-limit-annotation-wins-over-gpu-memory",
    ),
    pytest.param(
        Case(
            pod(c("trainer", vram="12Gi"), c("sidecar"), annotations={LIMIT: "4Gi"}),
            {"trainer": Quota(12 * GiB, **limits(VRAM))},
            Quota(4 * GiB, **annotation(LIMIT)),
        ),
        id="limited-container-has-own-quota-others-share-annotation",
    ),
    pytest.param(
        Case(
            pod(c("trainer", vram="12Gi"), c("sidecar"), annotations={LIMIT: "4Gi"}),
            pod_quota=Quota(4 * GiB, **annotation(LIMIT)),
            policy=Policy(quota_sources=(f"annotation:{LIMIT}", f"resource:{VRAM}")),
        ),
        id="annotation-first-in-precedence-covers-limited-containers-too",
    ),
    pytest.param(
        Case(
            pod(c("a", vram="12Gi"), annotations={LIMIT: "4Gi"}),
            {"a": Quota(12 * GiB, **limits(VRAM))},
            Quota(4 * GiB, **annotation(LIMIT)),
        ),
        id="annotation-stays-set-for-unlisted-containers-when-all-listed-have-limits",
    ),
    pytest.param(
        Case(pod(annotations={LIMIT: "4Gi"}), pod_quota=Quota(4 * GiB, **annotation(LIMIT))),
        id="pod-without-listed-containers-still-gets-the-annotation",
    ),
    pytest.param(
        Case(
            pod(c("a", vram="0")),
            errors=[(f"spec.containers[a].resources.limits[{VRAM}]", "0", "must be at least 1Mi")],
        ),
        id="zero-is-not-a-quota",
    ),
    pytest.param(
        Case(
            pod(c("a", vram="12Gi"), annotations={LIMIT: "4Gi"}),
            {"a": Quota(8 * GiB, source="default fixed")},
            policy=Policy(quota_sources=(), default=FIXED_8GI),
        ),
        id="no-sources-configured-only-the-default-applies",
    ),
    pytest.param(
        Case(
            pod(c("a", vram="12Gi"), c("b")),
            {"a": Quota(12 * GiB, **limits(VRAM))},
            policy=Policy(quota_sources=("resource:example.com/vram", f"resource:{VRAM}")),
        ),
        id="unreadable-source-in-a-code-built-policy-is-skipped",
    ),
    # Invalid values fall through
    pytest.param(
        Case(
            pod(c("t", vram="12GB", gpumem="3000")),
            {"t": Quota(3000 * MiB, **limits(GPUMEM))},
            errors=[(f"spec.containers[t].resources.limits[{VRAM}]", "12GB", "is not a valid quantity")],
        ),
        id="invalid-limit-falls-back-to-next-source",
    ),
    pytest.param(
        Case(
            pod(c("t", vram="-1")),
            {"t": Quota(8 * GiB, source="default fixed")},
            errors=[(f"spec.containers[t].resources.limits[{VRAM}]", "-1", "must not be negative")],
            policy=Policy(default=FIXED_8GI),
        ),
        id="invalid-limit-falls-back-to-default",
    ),
    pytest.param(
        Case(
            pod(c("t", vram="12Gi"), annotations={LIMIT: "abc"}),
            {"t": Quota(12 * GiB, **limits(VRAM))},
            errors=[(f"metadata.annotations[{LIMIT}]", "abc", "expected a number")],
        ),
        id="invalid-annotation-reported-once-per-pod",
    ),
    pytest.param(
        Case(
            pod(c("a"), c("b"), annotations={LIMIT: "abc", KAI: "1024"}),
            pod_quota=Quota(GiB, **annotation(KAI)),
            errors=[(f"metadata.annotations[{LIMIT}]", "abc", "expected a number")],
        ),
        id="invalid-annotation-falls-back-to-next-annotation",
    ),
    pytest.param(
        Case(
            pod(c("a"), annotations={LIMIT: "99999999999999999999"}),
            {"a": Quota(8 * GiB, source="default fixed")},
            errors=[(f"metadata.annotations[{LIMIT}]", "99999999999999999999", "int64 maximum")],
            policy=Policy(default=FIXED_8GI),
        ),
        id="overflowing-annotation-falls-back-to-default",
    ),
    pytest.param(
        Case(pod(c("t", vram="12Gi", gpumem="abc")), {"t": Quota(12 * GiB, **limits(VRAM))}),
        id="invalid-value-shadowed-by-a-valid-one-is-not-read",
    ),
    pytest.param(
        Case(
            pod(c("t", gpumem="2Gi")),
            errors=[(f"spec.containers[t].resources.limits[{GPUMEM}]", "2Gi", "count of MiB")],
        ),
        id="invalid-value-with-default-none-leaves-container-unmanaged",
    ),
    # Defaults
    pytest.param(Case(pod(c("a"))), id="default-none-leaves-container-unmanaged"),
    pytest.param(
        Case(
            pod(c("a"), c("b")),
            {n: Quota(8 * GiB, source="default fixed") for n in "ab"},
            policy=Policy(default=FIXED_8GI),
        ),
        id="default-fixed-per-container",
    ),
    pytest.param(
        Case(
            pod(c("a", vram="2Gi"), c("b")),
            {"a": Quota(2 * GiB, **limits(VRAM)), "b": Quota(8 * GiB, source="default fixed")},
            policy=Policy(default=FIXED_8GI),
        ),
        id="default-only-for-containers-without-a-source",
    ),
    pytest.param(
        Case(
            pod(c("a"), namespace="team-b"),
            {"a": Quota(4 * GiB, source="default fixed")},
            policy=Policy(
                default=FIXED_8GI,
                namespaces={"team-b": NamespacePolicy(default=DefaultQuota(DefaultKind.FIXED, 4 * GiB))},
            ),
        ),
        id="namespace-default-overrides-the-global-one",
    ),
    pytest.param(
        Case(
            pod(c("a")),
            {"a": Quota(share_divisor=4, source="default fair-share (replicas=4)")},
            policy=Policy(default=FAIR),
            labels={REPLICAS_LABEL: "4"},
        ),
        id="fair-share-divides-by-the-replicas-label",
    ),
    pytest.param(
        Case(
            pod(c("a")),
            {"a": Quota(share_divisor=1, source="default fair-share (replicas=1)")},
            policy=Policy(default=FAIR),
        ),
        id="fair-share-without-replicas-label-is-the-whole-gpu",
    ),
    pytest.param(
        Case(
            pod(c("a"), c("b")),
            errors=[(f"node.metadata.labels[{REPLICAS_LABEL}]", "four", "not a valid replica count")],
            policy=Policy(default=FAIR),
            labels={REPLICAS_LABEL: "four"},
        ),
        id="fair-share-with-invalid-replicas-label-is-unmanaged-and-reported-once",
    ),
    pytest.param(
        Case(
            pod(c("a")),
            errors=[(f"node.metadata.labels[{REPLICAS_LABEL}]", "0", "positive integer")],
            policy=Policy(default=FAIR),
            labels={REPLICAS_LABEL: "0"},
        ),
        id="fair-share-with-zero-replicas-is-unmanaged",
    ),
    # Namespace caps
    pytest.param(
        Case(
            pod(c("a"), annotations={LIMIT: "64Gi"}, namespace="team-a"),
            pod_quota=Quota(
                16 * GiB, source=f"annotation {LIMIT} capped by namespace max 16Gi", origin=annotation(LIMIT)["origin"]
            ),
            errors=[(f"metadata.annotations[{LIMIT}]", "64Gi", OVER_16GI)],
            policy=Policy(namespaces=CAP_16GI),
        ),
        id="annotation-cannot-exceed-namespace-cap-and-says-so",
    ),
    pytest.param(
        Case(
            pod(c("a", vram="20Gi"), namespace="team-a"),
            {
                "a": Quota(
                    16 * GiB, source=f"limits[{VRAM}] capped by namespace max 16Gi", origin=limits(VRAM)["origin"]
                )
            },
            errors=[(f"spec.containers[a].resources.limits[{VRAM}]", "20Gi", OVER_16GI)],
            policy=Policy(namespaces=CAP_16GI),
        ),
        id="resource-limit-capped-by-namespace-max-and-says-so",
    ),
    pytest.param(
        Case(
            pod(c("a"), namespace="team-a"),
            {"a": Quota(16 * GiB, source="default fixed capped by namespace max 16Gi")},
            policy=Policy(default=DefaultQuota(DefaultKind.FIXED, 32 * GiB), namespaces=CAP_16GI),
        ),
        id="default-fixed-capped-by-namespace-max",
    ),
    pytest.param(
        Case(
            pod(c("a", vram="12Gi"), namespace="team-a"),
            {"a": Quota(12 * GiB, **limits(VRAM))},
            policy=Policy(namespaces=CAP_16GI),
        ),
        id="quota-under-the-cap-is-untouched",
    ),
    pytest.param(
        Case(
            pod(c("a", vram="20Gi")),
            {"a": Quota(20 * GiB, **limits(VRAM))},
            policy=Policy(namespaces=CAP_16GI),
        ),
        id="cap-applies-only-to-its-namespace",
    ),
    # Burst
    pytest.param(
        Case(
            pod(c("a", vram="8Gi"), c("b"), annotations={LIMIT: "4Gi", BURST_ANNOTATION: "16Gi"}),
            {"a": Quota(8 * GiB, 16 * GiB, **limits(VRAM))},
            Quota(4 * GiB, 16 * GiB, **annotation(LIMIT)),
        ),
        id="burst-applies-to-every-quota-of-the-pod",
    ),
    pytest.param(
        Case(
            pod(c("a", vram="12Gi"), annotations={BURST_ANNOTATION: "8Gi"}),
            {"a": Quota(12 * GiB, **limits(VRAM))},
            errors=[(f"metadata.annotations[{BURST_ANNOTATION}]", "8Gi", "below the quota 12Gi")],
        ),
        id="burst-below-quota-is-an-error-and-ignored",
    ),
    pytest.param(
        Case(
            pod(c("a", vram="12Gi"), annotations={BURST_ANNOTATION: "16GB"}),
            {"a": Quota(12 * GiB, **limits(VRAM))},
            errors=[(f"metadata.annotations[{BURST_ANNOTATION}]", "16GB", "not a Kubernetes suffix")],
        ),
        id="invalid-burst-is-an-error-and-ignored",
    ),
    pytest.param(
        Case(
            pod(c("a"), annotations={BURST_ANNOTATION: "16Gi"}),
            errors=[(f"metadata.annotations[{BURST_ANNOTATION}]", "16Gi", "no quota for it to extend")],
        ),
        id="burst-without-any-quota-is-reported",
    ),
    pytest.param(
        Case(
            pod(c("a", vram="12Gi"), annotations={BURST_ANNOTATION: "32Gi"}, namespace="team-a"),
            {
                "a": Quota(
                    12 * GiB,
                    16 * GiB,
                    source=f"limits[{VRAM}] capped by namespace max 16Gi",
                    origin=limits(VRAM)["origin"],
                )
            },
            errors=[(f"metadata.annotations[{BURST_ANNOTATION}]", "32Gi", OVER_16GI)],
            policy=Policy(namespaces=CAP_16GI),
        ),
        id="burst-capped-by-namespace-max-and-says-so",
    ),
    pytest.param(
        Case(
            pod(c("a", vram="20Gi"), annotations={BURST_ANNOTATION: "24Gi"}, namespace="team-a"),
            {
                "a": Quota(
                    16 * GiB,
                    16 * GiB,
                    source=f"limits[{VRAM}] capped by namespace max 16Gi",
                    origin=limits(VRAM)["origin"],
                )
            },
            errors=[
                (f"spec.containers[a].resources.limits[{VRAM}]", "20Gi", OVER_16GI),
                (f"metadata.annotations[{BURST_ANNOTATION}]", "24Gi", OVER_16GI),
            ],
            policy=Policy(namespaces=CAP_16GI),
        ),
        id="burst-checked-against-the-declared-quota-then-both-capped",
    ),
    pytest.param(
        Case(
            pod(c("a"), annotations={BURST_ANNOTATION: "40Gi"}, namespace="team-a"),
            {
                "a": Quota(
                    burst_bytes=16 * GiB,
                    share_divisor=2,
                    source="default fair-share (replicas=2) capped by namespace max 16Gi",
                    cap_bytes=16 * GiB,
                )
            },
            errors=[(f"metadata.annotations[{BURST_ANNOTATION}]", "40Gi", OVER_16GI)],
            policy=Policy(default=FAIR, namespaces=CAP_16GI),
            labels={REPLICAS_LABEL: "2"},
        ),
        id="fair-share-and-its-burst-are-capped",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_resolve_pod_quota(case: Case) -> None:
    """Each rule yields exactly the expected container quotas, pod-wide quota and errors."""
    result = resolve_pod_quota(case.pod, case.policy, case.labels)
    assert dict(result.containers) == case.containers
    assert result.pod == case.pod_quota
    assert [(e.field, e.value) for e in result.errors] == [(f, v) for f, v, _ in case.errors]
    for error, (_, value, part) in zip(result.errors, case.errors, strict=True):
        assert part in error.message
        assert f'"{value}"' in invalid_message(error)  # the Event text names the value as written


@pytest.mark.parametrize(
    "value",
    ["12GB", "-1", "abc", "", " 12Gi", "1e999999999", "9" * 40, "NaN", "12gi", "0x10", "1/2", "\uff11\uff12Gi", "\n"],
)
def test_invalid_values_never_raise(value: str) -> None:
    """No value in any source crashes resolution; each one read becomes a QuotaError and the default applies."""
    p = pod(
        c("t", vram=value, gpumem=value),
        annotations={LIMIT: value, KAI: value, BURST_ANNOTATION: value},
    )
    result = resolve_pod_quota(p, Policy(default=FIXED_8GI), {REPLICAS_LABEL: value})
    assert dict(result.containers) == {"t": Quota(8 * GiB, source="default fixed")}
    assert result.pod is None
    assert len(result.errors) == 5  # two limits, two annotations, the burst; the label is unused by fixed


@pytest.mark.parametrize("label", ["four", "0", "-2", "1.5", "", " 4", "9" * 5000, "\uff14"])
def test_invalid_replicas_label_never_raises(label: str) -> None:
    """A replicas label that is not a positive integer leaves fair-share containers unmanaged, with one error."""
    result = resolve_pod_quota(pod(c("a"), c("b")), Policy(default=FAIR), {REPLICAS_LABEL: label})
    assert dict(result.containers) == {}
    ((error),) = result.errors
    assert error.field == f"node.metadata.labels[{REPLICAS_LABEL}]"
    assert (
        error.value == label if len(label) <= QuotaError.MAX_CHARS else error.value.endswith("[cut: 5000 characters]")
    )


# --------------------------------------------------------------------------------------------------------------
# A capped namespace leaves no container unmanaged

CAP_8GI = {"team-x": NamespacePolicy(max_quota_bytes=8 * GiB)}
CAP_SOURCE = "namespace max_quota 8Gi (no valid quota)"
CAPPED = Quota(8 * GiB, source=CAP_SOURCE)
ANNOTATION_LOTS = (f"metadata.annotations[{LIMIT}]", "lots", "expected a number")


def in_x(*containers: ContainerInfo, annotations: Mapping[str, str] | None = None) -> PodInfo:
    """A pod in team-x, the namespace CAP_8GI caps."""
    return pod(*containers, annotations=annotations, namespace="team-x")


def ns_x(**kw: object) -> dict[str, NamespacePolicy]:
    """team-x capped at 8Gi, with the given NamespacePolicy fields."""
    return {"team-x": NamespacePolicy(max_quota_bytes=8 * GiB, **kw)}  # type: ignore[arg-type]


CAPPED_CASES = [
    pytest.param(
        Case(
            in_x(c("a"), c("b"), annotations={LIMIT: "lots"}),
            {"a": CAPPED, "b": CAPPED},
            errors=[ANNOTATION_LOTS],
            policy=Policy(namespaces=CAP_8GI),
        ),
        [CAP_SOURCE],
        id="capped-invalid-annotation-and-no-default-holds-every-container-to-the-cap",
    ),
    pytest.param(
        Case(in_x(c("a")), {"a": CAPPED}, policy=Policy(namespaces=CAP_8GI)),
        [],
        id="capped-no-quota-and-no-default-is-held-to-the-cap",
    ),
    pytest.param(
        Case(
            in_x(c("a"), annotations={LIMIT: "lots"}),
            {"a": Quota(2 * GiB, source="default fixed")},
            errors=[ANNOTATION_LOTS],
            policy=Policy(namespaces=ns_x(default=DefaultQuota(DefaultKind.FIXED, 2 * GiB))),
        ),
        ["default fixed 2Gi"],
        id="capped-namespace-default-applies-rather-than-the-cap",
    ),
    pytest.param(
        Case(
            in_x(c("a", vram="0")),
            {"a": Quota(8 * GiB, source="default fixed capped by namespace max 8Gi")},
            errors=[(f"spec.containers[a].resources.limits[{VRAM}]", "0", "at least 1Mi")],
            policy=Policy(namespaces=ns_x(default=DefaultQuota(DefaultKind.FIXED, 16 * GiB))),
        ),
        ["default fixed 16Gi capped to 8Gi by namespace max_quota"],
        id="capped-namespace-default-above-the-cap-is-capped",
    ),
    pytest.param(
        Case(
            in_x(c("a"), annotations={LIMIT: "lots"}),
            {"a": Quota(4 * GiB, source="default fixed")},
            errors=[ANNOTATION_LOTS],
            policy=Policy(default=DefaultQuota(DefaultKind.FIXED, 4 * GiB), namespaces=CAP_8GI),
        ),
        ["default fixed 4Gi"],
        id="capped-namespace-without-default-uses-the-policy-default-fixed",
    ),
    pytest.param(
        Case(
            in_x(c("a")),
            {"a": CAPPED},
            errors=[(f"node.metadata.labels[{REPLICAS_LABEL}]", "four", "not a valid replica count")],
            policy=Policy(default=FAIR, namespaces=CAP_8GI),
            labels={REPLICAS_LABEL: "four"},
        ),
        [CAP_SOURCE],
        id="capped-fair-share-with-invalid-replicas-label-is-held-to-the-cap",
    ),
    pytest.param(
        Case(
            in_x(c("a", gpumem="2Gi")),
            {"a": CAPPED},
            errors=[(f"spec.containers[a].resources.limits[{GPUMEM}]", "2Gi", "count of MiB")],
            policy=Policy(namespaces=CAP_8GI),
        ),
        [CAP_SOURCE],
        id="capped-invalid-limit-and-no-default-is-held-to-the-cap",
    ),
    pytest.param(
        Case(
            in_x(c("a", vram="2Gi"), c("b")),
            {"a": Quota(2 * GiB, **limits(VRAM)), "b": CAPPED},
            policy=Policy(namespaces=CAP_8GI),
        ),
        [],
        id="capped-only-the-container-without-a-quota-gets-the-cap",
    ),
    pytest.param(
        Case(
            in_x(c("a"), annotations={LIMIT: "lots", KAI: "1024"}),
            pod_quota=Quota(GiB, **annotation(KAI)),
            errors=[ANNOTATION_LOTS],
            policy=Policy(namespaces=CAP_8GI),
        ),
        [f"annotation {KAI} 1Gi"],
        id="capped-invalid-annotation-falls-to-the-next-valid-annotation-first",
    ),
    pytest.param(
        Case(
            in_x(c("a", vram="2Gi"), c("b"), annotations={BURST_ANNOTATION: "4Gi"}),
            {"a": Quota(2 * GiB, 4 * GiB, **limits(VRAM)), "b": CAPPED},
            policy=Policy(namespaces=CAP_8GI),
        ),
        [],
        id="capped-fallback-takes-no-burst-and-does-not-refuse-the-pods-burst",
    ),
    pytest.param(
        Case(
            pod(c("a"), annotations={LIMIT: "lots"}),
            errors=[ANNOTATION_LOTS],
            policy=Policy(namespaces=CAP_8GI),
        ),
        [UNMANAGED],
        id="uncapped-invalid-annotation-and-no-default-stays-unmanaged",
    ),
    pytest.param(
        Case(pod(c("a")), policy=Policy(namespaces=CAP_8GI)),
        [],
        id="uncapped-no-quota-and-no-default-stays-unmanaged",
    ),
]


@pytest.mark.parametrize(("case", "applies"), CAPPED_CASES)
def test_capped_namespace_leaves_no_container_unmanaged(case: Case, applies: list[str]) -> None:
    """In a namespace with a max_quota, a missing or invalid quota gets the effective default, else the cap."""
    result = resolve_pod_quota(case.pod, case.policy, case.labels)
    assert dict(result.containers) == case.containers
    assert result.pod == case.pod_quota
    assert [(e.field, e.value) for e in result.errors] == [(f, v) for f, v, _ in case.errors]
    for error, (_, _, part) in zip(result.errors, case.errors, strict=True):
        assert part in error.message
    assert [e.applies for e in result.errors] == applies


# --------------------------------------------------------------------------------------------------------------
# A quota is at least 1 MiB, whatever its source and unit

BELOW_1MI = "must be at least 1Mi"


def _resolve_one(where: str, value: str) -> tuple[int | None, list[QuotaError]]:
    """The bytes `value` gives as the quota (or burst) `where`, None when it gives none, and the errors."""
    if where == "burst":
        result = resolve_pod_quota(pod(c("a", vram="1Mi"), annotations={BURST_ANNOTATION: value}), Policy(), {})
        return result.containers["a"].burst_bytes, list(result.errors)
    if where in {LIMIT, KAI}:
        result = resolve_pod_quota(pod(c("a"), annotations={where: value}), Policy(), {})
        return (result.pod.limit_bytes if result.pod is not None else None), list(result.errors)
    result = resolve_pod_quota(pod(c("a", **{where: value})), Policy(), {})
    own = result.containers.get("a")
    return (own.limit_bytes if own is not None else None), list(result.errors)


_BYTE_WHERE = ("vram", LIMIT, "burst")
_BYTE_VALUES = [
    ("0", None, BELOW_1MI),
    ("-0", None, BELOW_1MI),
    ("0.5", None, BELOW_1MI),
    ("100", None, BELOW_1MI),
    ("12m", None, "m means milli"),
    ("1023Ki", None, BELOW_1MI),
    ("1Mi", MiB, None),
    ("1048576", MiB, None),
]
_COUNT_CASES = [
    ("gpumem", "0", None, BELOW_1MI),
    ("gpumem", "-0", None, BELOW_1MI),
    ("gpumem", "1", MiB, None),
    ("aliyun", "0", None, BELOW_1MI),
    ("aliyun", "1", GiB, None),
    ("tencent", "-0", None, BELOW_1MI),
    ("tencent", "1", 256 * MiB, None),
    (KAI, "0", None, BELOW_1MI),
    (KAI, "1", MiB, None),
]
MINIMUM_CASES = [
    *(
        pytest.param(where, value, expected, reason, id=f"{where}-{value}-{'ok' if expected else 'rejected'}")
        for where in _BYTE_WHERE
        for value, expected, reason in _BYTE_VALUES
    ),
    *(
        pytest.param(where, value, expected, reason, id=f"{where}-count-{value}-{'ok' if expected else 'rejected'}")
        for where, value, expected, reason in _COUNT_CASES
    ),
]


@pytest.mark.parametrize(("where", "value", "expected", "reason_part"), MINIMUM_CASES)
def test_quota_below_1mi_is_invalid(where: str, value: str, expected: int | None, reason_part: str | None) -> None:
    """Every quota source and the burst refuse values under 1 MiB with a QuotaError, never a 0- or 1-byte quota."""
    got, errors = _resolve_one(where, value)
    assert got == expected
    if reason_part is None:
        assert errors == []
    else:
        (error,) = errors
        assert error.value == value
        assert reason_part in error.message


# --------------------------------------------------------------------------------------------------------------
# What applies instead, and the VRAMQuotaInvalid text


APPLIES_CASES = [
    pytest.param(
        pod(c("t", vram="12GB", gpumem="2048")),
        Policy(),
        {},
        f"limits[{GPUMEM}] 2Gi",
        id="next-resource-source",
    ),
    pytest.param(
        pod(c("a"), annotations={LIMIT: "abc", KAI: "1536"}),
        Policy(),
        {},
        f"annotation {KAI} 1536Mi",
        id="next-annotation-source",
    ),
    pytest.param(pod(c("t", vram="-1")), Policy(default=FIXED_8GI), {}, "default fixed 8Gi", id="policy-default"),
    pytest.param(pod(c("t", vram="-1")), Policy(), {}, UNMANAGED, id="no-default-is-unmanaged"),
    pytest.param(in_x(c("a"), annotations={LIMIT: "lots"}), Policy(namespaces=CAP_8GI), {}, CAP_SOURCE, id="the-cap"),
    pytest.param(
        in_x(c("a", vram="abc"), annotations={LIMIT: "6Gi"}),
        Policy(namespaces=CAP_8GI),
        {},
        f"annotation {LIMIT} 6Gi",
        id="the-pod-wide-quota",
    ),
    pytest.param(
        in_x(c("a"), annotations={LIMIT: "64Gi"}),
        Policy(namespaces=CAP_8GI),
        {},
        f"annotation {LIMIT} 64Gi capped to 8Gi by namespace max_quota",
        id="a-pod-wide-quota-over-the-cap-says-it-is-capped",
    ),
    pytest.param(
        in_x(c("a", gpumem="10240")),
        Policy(namespaces=CAP_8GI),
        {},
        f"limits[{GPUMEM}] 10Gi capped to 8Gi by namespace max_quota",
        id="a-limit-over-the-cap-says-it-is-capped",
    ),
    pytest.param(
        in_x(c("a", vram="2Gi"), annotations={BURST_ANNOTATION: "12Gi"}),
        Policy(namespaces=CAP_8GI),
        {},
        "burst 12Gi capped to 8Gi by namespace max_quota",
        id="a-burst-over-the-cap-says-it-is-capped",
    ),
    pytest.param(
        pod(c("a", vram="1Gi"), annotations={LIMIT: "abc"}),
        Policy(),
        {},
        "no pod-wide quota (each container has a quota of its own)",
        id="annotation-over-containers-with-own-quotas",
    ),
    pytest.param(
        pod(c("a", vram="2Gi"), c("b"), annotations={LIMIT: "abc"}),
        Policy(quota_sources=(f"annotation:{LIMIT}", f"resource:{VRAM}"), default=FIXED_8GI),
        {},
        f"limits[{VRAM}] 2Gi for a; default fixed 8Gi for b",
        id="containers-that-differ-are-named",
    ),
    pytest.param(
        pod(c("a")),
        Policy(default=FAIR),
        {REPLICAS_LABEL: "four"},
        UNMANAGED,
        id="invalid-replicas-label-uncapped",
    ),
    pytest.param(
        pod(c("a"), annotations={LIMIT: "2Gi", BURST_ANNOTATION: "1Gi"}),
        Policy(),
        {},
        "no burst (each quota is also the hard limit)",
        id="burst",
    ),
    pytest.param(
        pod(c("a", vram="0")),
        Policy(default=FAIR),
        {REPLICAS_LABEL: "4"},
        "default fair-share (replicas=4)",
        id="fair-share",
    ),
]


@pytest.mark.parametrize(("p", "policy", "labels", "applies"), APPLIES_CASES)
def test_error_says_what_applies_instead(p: PodInfo, policy: Policy, labels: dict[str, str], applies: str) -> None:
    """Each QuotaError names the quota that governs instead what the bad value would have governed."""
    (error,) = resolve_pod_quota(p, policy, labels).errors
    assert error.applies == applies
    assert invalid_message(error).endswith(f"; applies instead: {applies}")


def test_invalid_message_reads_field_value_reason_and_what_applies() -> None:
    """The Event text is the field, the value in quotes, what is wrong, and what applies instead."""
    (error,) = resolve_pod_quota(in_x(c("a"), annotations={LIMIT: "lots"}), Policy(namespaces=CAP_8GI), {}).errors
    assert invalid_message(error) == (
        f'metadata.annotations[{LIMIT}]: "lots" is not a valid quantity (expected a number with an optional '
        "suffix, e.g. 12Gi, 12G, 12884901888 or 12e9); applies instead: namespace max_quota 8Gi (no valid quota)"
    )


def test_a_quota_over_the_cap_is_reported_with_the_capped_quota_that_applies() -> None:
    """A valid quota over its namespace's max_quota is capped, and reported as VRAMQuotaInvalid: the field, the
    value, the cap, and the capped quota; an invalid value it covers instead says the same capped quota."""
    result = resolve_pod_quota(in_x(c("a", vram="abc"), annotations={LIMIT: "64Gi"}), Policy(namespaces=CAP_8GI), {})
    assert result.pod == Quota(
        8 * GiB, source=f"annotation {LIMIT} capped by namespace max 8Gi", origin=annotation(LIMIT)["origin"]
    )
    capped = f"annotation {LIMIT} 64Gi capped to 8Gi by namespace max_quota"
    assert [invalid_message(e) for e in result.errors] == [
        f'metadata.annotations[{LIMIT}]: "64Gi" is over the namespace max_quota 8Gi; applies instead: {capped}',
        f'spec.containers[a].resources.limits[{VRAM}]: "abc" is not a valid quantity (expected a number with an '
        f"optional suffix, e.g. 12Gi, 12G, 12884901888 or 12e9); applies instead: {capped}",
    ]


HUGE = "9" * 10_000_000  # a tenant can write a 10 MB annotation into a pods file


@pytest.mark.parametrize(
    "p",
    [
        pytest.param(pod(c("a"), annotations={LIMIT: HUGE}), id="huge-annotation"),
        pytest.param(pod(c("a"), annotations={LIMIT: "x" + "\n" * 5_000_000}), id="huge-annotation-of-escapes"),
        pytest.param(pod(c("a", vram=HUGE)), id="huge-limit"),
        pytest.param(pod(c("a" * 5_000_000, vram="abc")), id="huge-container-name"),
        pytest.param(
            pod(*(c(f"c{i:04d}" + "x" * 50, vram=f"{i + 1}Mi") for i in range(500)), annotations={LIMIT: "abc"}),
            id="many-containers-in-what-applies",
        ),
    ],
)
def test_invalid_message_is_bounded(p: PodInfo) -> None:
    """Whatever the pod holds, the error's fields and the Event text stay within 1024 characters."""
    policy = Policy(
        quota_sources=(f"annotation:{LIMIT}", f"resource:{VRAM}"),
        namespaces={"team-x": NamespacePolicy(default=DefaultQuota(DefaultKind.FIXED, 2 * GiB))},
    )
    (error,) = resolve_pod_quota(p, policy, {}).errors
    for text in (error.field, error.value, error.message, error.applies):
        assert len(text) <= QuotaError.MAX_CHARS
    message = invalid_message(error)
    assert len(message) <= MAX_MESSAGE_CHARS == 1024
    assert "; applies instead: " in message


def _book_pod(annotation: str | None, priority: int = 0) -> PodInfo:
    """A new pod object each call (as the pod cache hands out on every change), annotated as given."""
    annotations = {LIMIT: annotation} if annotation is not None else {}
    return PodInfo(
        uid="uid-1",
        namespace="default",
        name="p",
        containers=(c("main"),),
        annotations=annotations,
        priority=priority,
    )


@pytest.mark.parametrize(
    ("first", "second", "reported"),
    [
        pytest.param("12GB", None, [], id="same-object-again-reports-nothing"),
        pytest.param("12GB", "12GB", [], id="changed-pod-with-the-same-errors-reports-nothing"),
        pytest.param("12GB", "lots", ["lots"], id="changed-pod-with-other-errors-reports-them"),
        pytest.param("12GB", "4Gi", [], id="fixed-pod-reports-nothing"),
        pytest.param("4Gi", "12GB", ["12GB"], id="newly-broken-pod-reports"),
    ],
)
def test_quota_book_reports_each_invalid_value_once(first: str, second: str | None, reported: list[str]) -> None:
    """The book resolves a pod once per pod object and reports its invalid values once: a changed pod (a label
    edit) with the same errors repeats nothing; different errors are reported."""
    book = QuotaBook(Policy(quota_sources=(f"annotation:{LIMIT}",)))
    p1 = _book_pod(first)
    _, errors = book.resolve({p1.uid: p1}, {})
    assert [e.value for _, e in errors] == ([first] if first != "4Gi" else [])
    p2 = p1 if second is None else _book_pod(second, priority=1)
    quotas, errors = book.resolve({p2.uid: p2}, {})
    assert [e.value for _, e in errors] == reported
    assert [p for p, _ in errors] == [p2] * len(reported)
    assert set(quotas) == {p1.uid}


def test_quota_book_forgets_pods_that_left() -> None:
    """A pod that left the cache leaves the book: if it comes back, its errors are reported again."""
    book = QuotaBook(Policy(quota_sources=(f"annotation:{LIMIT}",)))
    p = _book_pod("12GB")
    assert len(book.resolve({p.uid: p}, {})[1]) == 1
    assert book.resolve({}, {}) == ({}, [])
    assert len(book.resolve({p.uid: p}, {})[1]) == 1


def test_quota_book_resolves_again_only_for_a_new_pod_object_or_new_labels() -> None:
    """The book keys on the pod object itself (sources replace, never mutate) and on the labels by value."""
    book = QuotaBook(Policy(quota_sources=(f"annotation:{LIMIT}",)))
    p = _book_pod("4Gi")
    first = book.resolve({p.uid: p}, {"zone": "a"})[0][p.uid]
    assert book.resolve({p.uid: p}, {"zone": "a"})[0][p.uid] is first, "same pod, equal labels: kept"
    assert book.resolve({p.uid: p}, {"zone": "b"})[0][p.uid] is not first, "new labels: resolved again"
    again = book.resolve({p.uid: p}, {"zone": "b"})[0][p.uid]
    equal = _book_pod("4Gi")
    assert book.resolve({equal.uid: equal}, {"zone": "b"})[0][p.uid] is not again, "a new pod object: resolved again"


OWN = Quota(limit_bytes=8 * GiB, source="own")
WIDE = Quota(limit_bytes=2 * GiB, source="wide")
SHARE = Quota(limit_bytes=20 * GiB, share="claim/0", source="share")
LAYOUT = PodQuota(containers={"own": OWN}, pod=WIDE, shares={"dra": {"GPU-0": SHARE}})
CONTAINER, POD, SHARED = QuotaScope.CONTAINER, QuotaScope.POD, QuotaScope.SHARE


@pytest.mark.parametrize(
    ("pod_quota", "container", "gpu", "owner"),
    [
        pytest.param(LAYOUT, "own", "GPU-1", (CONTAINER, "own", OWN, "own"), id="its-own-quota-on-every-gpu"),
        pytest.param(LAYOUT, "rest", "GPU-0", (POD, None, WIDE, None), id="covered-by-the-pod-wide-quota"),
        pytest.param(LAYOUT, "dra", "GPU-0", (SHARED, "claim/0", SHARE, "dra"), id="its-share-is-the-shares-subject"),
        pytest.param(LAYOUT, "dra", "GPU-1", (CONTAINER, "dra", NO_SHARE, "dra"), id="nothing-where-it-holds-no-share"),
        pytest.param(LAYOUT, "", "GPU-0", (POD, None, WIDE, None), id="the-pods-own-cgroup-under-the-pod-wide-quota"),
        pytest.param(PodQuota(containers={"own": OWN}), "", "GPU-0", None, id="the-pods-own-cgroup-unmanaged"),
        pytest.param(PodQuota(containers={"own": OWN}), "rest", "GPU-0", None, id="no-quota-unmanaged"),
    ],
)  # fmt: skip
def test_row_quota_lays_out_which_quota_governs_a_row(
    pod_quota: PodQuota, container: str, gpu: str, owner: tuple[QuotaScope, str | None, Quota, str | None] | None
) -> None:
    """A container's own quota (or DRA share) first, then the pod-wide one; the subject says which rows are judged
    together, the holder whose cgroup holds the driver limit."""
    found = row_quota("uid-1", pod_quota, container, gpu)
    if owner is None:
        assert found is None
        return
    scope, name, quota, holder = owner
    assert found == RowQuota(Subject("uid-1", gpu, scope, name), quota, holder)


def test_quota_book_works_out_each_rows_owner_once_per_pod_version() -> None:
    """The book keeps each row's owner while the pod's quota is unchanged, and works it out again for a new pod
    object; a pod it holds no quota for is unmanaged."""
    book = QuotaBook(Policy(quota_sources=(f"annotation:{LIMIT}",)))
    p = _book_pod("4Gi")
    row = ContainerUsage(p, "main", "cid", "GPU-0", GiB, ())
    stranger = row._replace(pod=replace(p, uid="uid-2"))
    book.resolve({p.uid: p}, {})
    ((_, first), (_, none)) = book.rows([row, stranger])
    assert first is not None and none is None
    assert first == RowQuota(Subject(p.uid, "GPU-0", POD, None), first.quota, None)
    assert book.rows([row])[0][1] is first, "found once: kept for the next scans"
    changed = _book_pod("4Gi", priority=1)
    book.resolve({changed.uid: changed}, {})
    again = book.rows([row._replace(pod=changed)])[0][1]
    assert again == first and again is not first, "a new version of the pod: worked out again"


# --------------------------------------------------------------------------------------------------------------
# The table the chart's admission policy is held to (tests/quota_values.py; tests/cluster/test_quota_admission.py)


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS])
def test_the_shared_table_of_quota_values(row: Row) -> None:
    """Each row of the table, as the agent reads its pod: a valid value is a quota and no error; an invalid one is
    one VRAMQuotaInvalid naming the field, whose one-line text says why. The agent and the limit planner lay the
    pod's quota out alike (`_lays_out`)."""
    namespace = "capped" if row.cap is not None else "default"
    policy = parse_policy({"namespaces": {"capped": {"max_quota": CAPS[row.cap]}}} if row.cap is not None else {})
    manifest = row.pod(namespace=namespace)
    manifest["metadata"]["uid"] = "uid-1"
    p = pod_info_from_manifest(manifest)
    result = resolve_pod_quota(p, policy, {})
    _lays_out(row, p, result, policy.cap_for(namespace))
    if row.valid:
        assert result.errors == ()
        assert result.containers or result.pod is not None
        return
    (error,) = result.errors
    assert error.field == row.field.path
    text = invalid_message(error)
    assert row.says in text
    assert "\n" not in text and len(invalid_message(replace(error, applies=""))) <= MAX_MESSAGE_CHARS


TABLE_GPU = GpuDevice(index=0, uuid="GPU-0", name="test", total_bytes=80 * GiB, used_bytes=0, free_bytes=80 * GiB)


def _lays_out(row: Row, p: PodInfo, result: PodQuota, cap: int | None) -> None:
    """The row's pod as the agent (`row_quota`) and the limit planner (`pod_limits`) lay it out: a valid value
    governs "main" (its own limit, or the pod-wide annotation); an invalid one leaves it unmanaged, or under what
    applies instead (the pod-wide 1Mi a bad burst would have extended, the namespace's cap); the planner holds the
    same hard limit on the pod's cgroup, and on the container's where the quota is the container's own, unless the
    quota has no hard limit (`NO_HARD_LIMIT`, which a burst of int64's maximum is too): the agent holds it alone."""
    owner = row_quota(p.uid, result, "main", TABLE_GPU.uuid)
    is_burst = row.field.name == BURST_ANNOTATION
    if row.valid or cap is not None or is_burst:
        assert owner is not None
        scope = POD if row.field.pod_wide else CONTAINER
        assert owner.subject.scope is scope and owner.holder == ("main" if scope is CONTAINER else None)
        hard = owner.quota.hard_for(TABLE_GPU.total_bytes)
        if not row.valid:
            assert hard == (MiB if cap is None else cap), "what applies instead: no burst, or the cap"
    else:
        assert owner is None, "an invalid value governs nothing"
    wanted = {(t.container, t.hard_bytes) for t in pod_limits(p, result, [TABLE_GPU])}
    if owner is None or (owner.quota.burst_bytes or 0) >= NO_HARD_LIMIT:
        assert wanted == set()
        return
    held = min(owner.quota.hard_for(TABLE_GPU.total_bytes), TABLE_GPU.total_bytes)
    assert wanted == {(None, held), *([("main", held)] if owner.holder is not None else [])}


@pytest.mark.parametrize(
    ("quota", "total_gib", "limit_gib", "hard_gib"),
    [
        pytest.param(Quota(limit_bytes=8 * GiB), 80, 8, 8, id="fixed"),
        pytest.param(Quota(limit_bytes=8 * GiB, burst_bytes=12 * GiB), 80, 8, 12, id="burst-is-the-hard-limit"),
        pytest.param(Quota(limit_bytes=8 * GiB, burst_bytes=4 * GiB), 80, 8, 8, id="burst-below-limit-is-no-lower"),
        pytest.param(Quota(share_divisor=4), 80, 20, 20, id="fair-share-of-the-device"),
        pytest.param(Quota(share_divisor=4, cap_bytes=16 * GiB), 80, 16, 16, id="fair-share-capped"),
        pytest.param(Quota(share_divisor=4, cap_bytes=16 * GiB), 40, 10, 10, id="fair-share-under-its-cap"),
    ],
)
def test_a_quota_is_bytes_once_it_meets_a_gpu(quota: Quota, total_gib: int, limit_gib: int, hard_gib: int) -> None:
    """A fixed quota is its bytes on any GPU; a fair share is the GPU's memory divided, bounded by the cap."""
    assert quota.limit_for(total_gib * GiB) == limit_gib * GiB
    assert quota.hard_for(total_gib * GiB) == hard_gib * GiB


OWN = Quota(limit_bytes=8 * GiB)


WIDE = Quota(limit_bytes=2 * GiB)


SHARE = Quota(limit_bytes=20 * GiB, share="claim/0")


POD_QUOTA = PodQuota(containers={"own": OWN}, pod=WIDE, shares={"dra": {"GPU-0": SHARE}})


@pytest.mark.parametrize(
    ("container", "device_uuid", "own"),
    [
        pytest.param("own", "GPU-0", OWN, id="its-own-quota-on-every-gpu"),
        pytest.param("rest", "GPU-0", None, id="none-of-its-own"),
        pytest.param("dra", "GPU-0", SHARE, id="its-share-where-allocated"),
        pytest.param("dra", "GPU-1", NO_SHARE, id="nothing-where-no-share-was-allocated"),
        pytest.param("", "GPU-0", None, id="the-pod-cgroup-itself"),
    ],
)
def test_a_containers_own_quota_on_a_gpu(container: str, device_uuid: str, own: Quota | None) -> None:
    """A container's own quota on a GPU: its DRA share there (nothing where it holds none), else its quota on
    every GPU; None for a container without one (the pod-wide quota, if any, is `quota.row_quota`'s to apply)."""
    assert POD_QUOTA.own(container, device_uuid) == own


# NVIDIA's declarations: a request (soft) and a limit (hard) per container, in the container toolkit's variables
# (whole MiB) or KAI Scheduler's per-container annotations (Kubernetes quantities).
ENV = parse_quota_source("env:NVIDIA_GPU_MEMORY")
KAI_PAIR = parse_quota_source("annotation:nvidia.com/container.<container>.gpu-memory")
KAI_REQUEST = "nvidia.com/container.main.gpu-memory.request"
KAI_LIMIT = "nvidia.com/container.main.gpu-memory.limit"


def env(**values: str | None) -> ContainerInfo:
    return ContainerInfo("main", env={f"NVIDIA_GPU_MEMORY_{k.upper()}": v for k, v in values.items()})


@pytest.mark.parametrize(
    ("container", "annotations", "limit", "burst", "source", "error"),
    [
        pytest.param(env(limit="4096"), {}, 4 * GiB, None, "env NVIDIA_GPU_MEMORY_LIMIT", None, id="env-limit"),
        pytest.param(
            env(request="2048", limit="4096"),
            {},
            2 * GiB,
            4 * GiB,
            "env NVIDIA_GPU_MEMORY_REQUEST and NVIDIA_GPU_MEMORY_LIMIT",
            None,
            id="env-request-soft-limit-hard",
        ),
        pytest.param(env(request="4096", limit="4096"), {}, 4 * GiB, None, None, None, id="env-equal-is-one-limit"),
        pytest.param(
            env(request="2048"),
            {},
            2 * GiB,
            NO_HARD_LIMIT,
            "env NVIDIA_GPU_MEMORY_REQUEST",
            None,
            id="env-request-alone-has-no-hard-limit",
        ),
        pytest.param(env(limit="0010"), {}, 10 * MiB, None, None, None, id="env-leading-zeros-as-the-toolkit"),
        pytest.param(
            env(limit="2048MiB"),
            {},
            None,
            None,
            None,
            "digits alone, as NVIDIA's toolkit reads it; write 2048 for 2048MiB",
            id="env-unit-written-out-refused",
        ),
        pytest.param(env(limit="4Gi"), {}, None, None, None, "write 4096 for 4Gi", id="env-quantity-refused"),
        pytest.param(env(limit="0"), {}, None, None, None, "must be at least 1Mi", id="env-zero-refused"),
        pytest.param(env(limit=None), {}, None, None, None, "valueFrom", id="env-value-from-is-unreadable"),
        pytest.param(
            env(request="8192", limit="4096"),
            {},
            None,
            None,
            None,
            "is above the limit 4096",
            id="env-request-above-limit-refused",
        ),
        pytest.param(
            env(request="bad", limit="4096"), {}, None, None, None, "digits alone", id="env-half-a-pair-is-no-quota"
        ),
        pytest.param(c("main"), {KAI_LIMIT: "8Gi"}, 8 * GiB, None, None, None, id="kai-limit"),
        pytest.param(
            c("main"),
            {KAI_REQUEST: "4Gi", KAI_LIMIT: "8Gi"},
            4 * GiB,
            8 * GiB,
            f"annotation {KAI_REQUEST} and {KAI_LIMIT}",
            None,
            id="kai-request-soft-limit-hard",
        ),
        pytest.param(c("main"), {KAI_REQUEST: "4Gi"}, 4 * GiB, None, None, None, id="kai-request-alone-is-the-limit"),
        pytest.param(c("main"), {KAI_LIMIT: "4096"}, None, None, None, "must be at least 1Mi", id="kai-bare-is-bytes"),
        pytest.param(c("main"), {KAI_LIMIT: "12GB"}, None, None, None, "not a Kubernetes suffix", id="kai-12GB"),
        pytest.param(
            c("main"),
            {"nvidia.com/container.other.gpu-memory.limit": "8Gi"},
            None,
            None,
            None,
            None,
            id="kai-another-containers-annotation",
        ),
    ],
)
def test_nvidias_pairs_are_a_soft_and_a_hard_limit(
    container: ContainerInfo,
    annotations: dict[str, str],
    limit: int | None,
    burst: int | None,
    source: str | None,
    error: str | None,
) -> None:
    """The request is the soft limit, the limit the hard one, in the units their owners define and as strictly; a
    bad half, a valueFrom or a request above its limit is reported and the pair gives no quota (the container is
    unmanaged here, with no other source)."""
    policy = Policy(quota_sources=(str(KAI_PAIR), str(ENV)))
    q = resolve_pod_quota(pod(container, annotations=annotations), policy, {})
    got = q.containers.get("main")
    assert (got.limit_bytes if got else None, got.burst_bytes if got else None) == (limit, burst)
    if source is not None:
        assert got is not None and got.source == source
    if error is None:
        assert q.errors == ()
    else:
        assert len(q.errors) == 1 and error in q.errors[0].message, q.errors
        assert q.errors[0].applies == UNMANAGED


def test_a_request_alone_is_judged_soft_up_to_the_whole_gpu() -> None:
    """A soft limit with no hard one: over it the agent acts after the soft grace, and its hard limit is the GPU's own
    size (nothing for a driver limit to hold)."""
    quota = Quota(limit_bytes=2 * GiB, burst_bytes=NO_HARD_LIMIT)
    assert (quota.limit_for(80 * GiB), quota.hard_for(80 * GiB)) == (2 * GiB, 80 * GiB)


def test_the_kai_annotation_goes_before_the_variables_it_writes() -> None:
    """By default a container declaring both takes KAI's annotation (its NRI plugin writes the variables from it,
    over any the pod sets), and either goes before a pod-wide annotation."""
    container = ContainerInfo("main", env={"NVIDIA_GPU_MEMORY_LIMIT": "1024"})
    q = resolve_pod_quota(pod(container, annotations={KAI_LIMIT: "8Gi", KAI: "2048"}), Policy(), {})
    assert q.containers["main"].limit_bytes == 8 * GiB
    q = resolve_pod_quota(pod(container, annotations={KAI: "2048"}), Policy(), {})
    assert q.containers["main"].limit_bytes == GiB


def test_a_pod_wide_burst_leaves_a_declared_pair_alone() -> None:
    """vramguard's burst annotation extends the quotas that have no hard limit of their own, not a pair's limit."""
    annotations = {KAI_REQUEST: "4Gi", KAI_LIMIT: "8Gi", "vramguard.io/vram-burst": "16Gi"}
    q = resolve_pod_quota(pod(c("main"), c("side", vram="4Gi"), annotations=annotations), Policy(), {})
    assert (q.containers["main"].limit_bytes, q.containers["main"].burst_bytes) == (4 * GiB, 8 * GiB)
    assert (q.containers["side"].limit_bytes, q.containers["side"].burst_bytes) == (4 * GiB, 16 * GiB)


def test_an_envfrom_on_a_gpu_container_with_no_quota_is_reported_not_guessed() -> None:
    """A GPU container whose variables may come from a ConfigMap or Secret (`envFrom`) gets no quota from there: when
    nothing else gives it one, VRAMQuotaInvalid says why; a container with a quota of its own is not told."""
    unread = ContainerInfo("main", env_from=True)
    q = resolve_pod_quota(pod(unread), Policy(), {})
    assert [(e.field, e.applies) for e in q.errors] == [("spec.containers[main].envFrom", UNMANAGED)]
    covered = ContainerInfo("main", limits={VRAM: "4Gi"}, env_from=True)
    assert resolve_pod_quota(pod(covered), Policy(), {}).errors == ()
    assert resolve_pod_quota(pod(unread), Policy(quota_sources=(f"resource:{VRAM}",)), {}).errors == ()
