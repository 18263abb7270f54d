"""The quota in force: the agent's own resolution of a workload's pod template, laid out by the agent's own
function, and the field a recommendation goes into, spelt in its unit."""

from __future__ import annotations

import pytest

from vramguard.core.policy import Policy
from vramguard.core.quantity import GiB, MiB
from vramguard.core.sources import parse_quota_source
from vramguard.plugin.in_force import NEW_FIELD, QuotaInForce, field_of, in_force, spell
from vramguard.plugin.workloads import Owners, WorkloadRef

from .objects import by_kind, template, workload

NS = "ml"
VRAM = parse_quota_source("resource:vramguard.io/vram")
LIMIT = parse_quota_source("annotation:vramguard.io/vram-limit")
TOOLKIT = parse_quota_source("env:NVIDIA_GPU_MEMORY")
KAI = parse_quota_source("annotation:nvidia.com/container.<container>.gpu-memory")
VALUE_FROM = {"name": "NVIDIA_GPU_MEMORY_LIMIT", "valueFrom": {"secretKeyRef": {"name": "gpu", "key": "limit"}}}


def _in_force(pod_template: dict[str, object] | None) -> QuotaInForce:
    objects = [workload("Deployment", NS, "web", pod_template)] if pod_template is not None else []
    owners = Owners(by_kind(*objects))
    return in_force(owners.workload(WorkloadRef(NS, "Deployment", "web")), Policy())


@pytest.mark.parametrize(
    ("pod_template", "governs"),
    [
        pytest.param(template({"vramguard.io/vram": "4Gi"}), (4 * GiB, False, True, VRAM), id="its-own-limit"),
        pytest.param(
            template(annotations={"vramguard.io/vram-limit": "8Gi"}), (8 * GiB, True, True, LIMIT),
            id="the-pod-wide-annotation",
        ),
        pytest.param(template(), (None, False, False, NEW_FIELD), id="no-quota-gets-the-new-field"),
        pytest.param(
            template(env=[{"name": "NVIDIA_GPU_MEMORY_LIMIT", "value": "4096"}]), (4 * GiB, False, True, TOOLKIT),
            id="the-toolkits-limit-variable",
        ),
        pytest.param(
            template(env=[{"name": "NVIDIA_GPU_MEMORY_REQUEST", "value": "4096"}]), (4 * GiB, False, True, TOOLKIT),
            id="the-toolkits-request-alone",
        ),
        pytest.param(
            template(annotations={"nvidia.com/container.main.gpu-memory.limit": "4Gi"}), (4 * GiB, False, True, KAI),
            id="kais-annotation-for-the-container",
        ),
        pytest.param(template(env=[VALUE_FROM]), (None, False, False, TOOLKIT), id="a-value-from-still-the-variable"),
        pytest.param(
            template(env=[{"name": "NVIDIA_GPU_MEMORY_LIMIT", "value": "4GiB"}]), (None, False, False, TOOLKIT),
            id="an-invalid-variable-still-the-variable",
        ),
        pytest.param(
            template(annotations={"nvidia.com/container.main.gpu-memory.limit": "12GB"}), (None, False, False, KAI),
            id="an-invalid-kai-annotation-still-the-annotation",
        ),
        pytest.param(
            template(annotations={"nvidia.com/container.other.gpu-memory.limit": "4Gi"}),
            (None, False, False, NEW_FIELD), id="kais-annotation-for-another-container-is-not-its",
        ),
        pytest.param(None, None, id="no-template-unknown"),
    ],
)  # fmt: skip
def test_what_governs_a_container_is_the_agents_layout(
    pod_template: dict[str, object] | None, governs: tuple[int | None, bool, bool, object] | None
) -> None:
    """A container's own limit, NVIDIA's declarations, the pod-wide annotation or nothing, as the agent lays the
    template's quota out; unknown without a template to read. The field is the one in force, else NVIDIA's pair the
    container declares where the agent could not read it, else the new field."""
    force = _in_force(pod_template)
    found = force.governs("main", "GPU-0")
    if governs is None:
        assert found is None and force.quotas is None
        return
    hard, pod_wide, managed, field = governs
    assert found is not None
    assert (found.quota.hard_bytes if found.quota else None, found.pod_wide, found.managed) == (hard, pod_wide, managed)
    assert field_of(found.quota, force.declared.get("main")) == field


def test_field_spelling() -> None:
    """A byte field takes a quantity, the shortest exact one (KAI's annotations too); a count field its units,
    rounded up (the toolkit's variables: whole MiB in digits)."""
    assert spell(parse_quota_source("resource:vramguard.io/vram"), 11 * GiB) == "11Gi"
    assert spell(parse_quota_source("resource:tencent.com/vcuda-memory"), 11 * GiB) == "44"
    assert spell(TOOLKIT, 11 * GiB) == "11264"
    assert spell(TOOLKIT, 11 * GiB + 1) == "11265"
    assert spell(KAI, 11 * GiB) == "11Gi"
    assert spell(KAI, 704 * MiB) == "704Mi"
