"""The quota in force: the agent's own resolution of a workload's pod template, laid out by the agent's own
function, and the field a recommendation goes into, spelt in its unit."""

from __future__ import annotations

import pytest

from vramguard.core.policy import Policy
from vramguard.core.quantity import GiB
from vramguard.core.sources import parse_quota_source
from vramguard.plugin.in_force import NEW_FIELD, QuotaInForce, field_of, in_force, spell
from vramguard.plugin.workloads import Owners, WorkloadRef

from .objects import by_kind, template, workload

NS = "ml"
VRAM = parse_quota_source("resource:vramguard.io/vram")
LIMIT = parse_quota_source("annotation:vramguard.io/vram-limit")


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
        pytest.param(None, None, id="no-template-unknown"),
    ],
)  # fmt: skip
def test_what_governs_a_container_is_the_agents_layout(
    pod_template: dict[str, object] | None, governs: tuple[int | None, bool, bool, object] | None
) -> None:
    """A container's own limit, the pod-wide annotation or nothing, as the agent lays the template's quota out;
    unknown without a template to read."""
    force = _in_force(pod_template)
    found = force.governs("main", "GPU-0")
    if governs is None:
        assert found is None and force.quotas is None
        return
    hard, pod_wide, managed, field = governs
    assert found is not None
    assert (found.quota.hard_bytes if found.quota else None, found.pod_wide, found.managed) == (hard, pod_wide, managed)
    assert field_of(found.quota) == field


def test_field_spelling() -> None:
    """A byte field takes a quantity; a count field its units, rounded up."""
    assert spell(parse_quota_source("resource:vramguard.io/vram"), 11 * GiB) == "11Gi"
    assert spell(parse_quota_source("resource:tencent.com/vcuda-memory"), 11 * GiB) == "44"
