"""The patches: the recommendation in the field the workload uses, where its kind keeps its template; never a value
the agent's own quota parser refuses; none for a workload that is ok."""

from __future__ import annotations

import pytest

from vramguard.core.policy import Policy
from vramguard.core.quantity import GiB
from vramguard.plugin.patch import patches
from vramguard.plugin.recommend import PeakSeries, recommend
from vramguard.plugin.workloads import Owners

from .objects import by_kind, template, workload

NS = "ml"


def _owners(*objects: dict[str, object]) -> Owners:
    return Owners(by_kind(*objects))


def _series(pod_name: str, peak: int) -> PeakSeries:
    return PeakSeries(NS, pod_name, "main", "GPU-0", peak)


@pytest.mark.parametrize(
    ("kind", "pod_name", "pod_template", "want"),
    [
        pytest.param(
            "Deployment",
            "web-7d9f4c8b5-x2b4z",
            template({"vramguard.io/vram": "4Gi"}, requests=True),
            {"spec": {"template": {"spec": {"containers": [{"name": "main", "resources": {
                "limits": {"vramguard.io/vram": "11Gi"}, "requests": {"vramguard.io/vram": "11Gi"}}}]}}}},
            id="deployment-limit-and-its-request",
        ),
        pytest.param(
            "CronJob",
            "nightly-29000000-x2b4z",
            template({"nvidia.com/gpumem": "1024"}),
            {"spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [
                {"name": "main", "resources": {"limits": {"nvidia.com/gpumem": "11264"}}}]}}}}}},
            id="cronjob-in-its-job-template-in-mib",
        ),
        pytest.param(
            "StatefulSet",
            "nightly-0",
            template(),
            {"spec": {"template": {"metadata": {"annotations": {"vramguard.io/vram-limit": "11Gi"}}}}},
            id="no-quota-gets-the-annotation",
        ),
        pytest.param("Job", "nightly-x2b4z", template({"vramguard.io/vram": "4Gi"}), None, id="job-cannot-change"),
    ],
)  # fmt: skip
def test_patches(kind: str, pod_name: str, pod_template: dict[str, object], want: object) -> None:
    """The patch sets the recommendation in the field the workload uses, where its kind keeps its template."""
    owners = _owners(workload(kind, NS, "nightly" if kind != "Deployment" else "web", pod_template))
    rows = recommend([_series(pod_name, 9 * GiB)], owners, Policy())
    (patch,) = patches(rows, owners)
    assert patch.body == want
    if want is not None:
        assert patch.command().startswith(f"kubectl patch {kind.lower()} ")
    else:
        assert patch.command().startswith("# ml Job/nightly: a Job's pod template cannot change")


@pytest.mark.parametrize(
    ("pod_template", "peak", "field"),
    [
        pytest.param(template({"vramguard.io/vram": "4Gi"}), 8 * 2**60, "limits[vramguard.io/vram] '10Ei'",
                     id="over-int64-in-a-limit"),
        pytest.param(template(), 10**30, "annotation vramguard.io/vram-limit '1099511627776Ei'",
                     id="over-int64-in-the-annotation"),
    ],
)  # fmt: skip
def test_no_patch_the_agent_would_refuse(pod_template: dict[str, object], peak: int, field: str) -> None:
    """A recommendation the agent's own quota parser refuses is never printed as a patch: the line says why, in
    the agent's words."""
    owners = _owners(workload("Deployment", NS, "web", pod_template))
    (patch,) = patches(recommend([_series("web-7d9f4c8b5-x2b4z", peak)], owners, Policy()), owners)
    assert patch.body is None
    assert patch.command() == (
        f"# ml Deployment/web: the agent would refuse {field}: larger than the int64 maximum of {2**63 - 1} bytes"
    )


def test_no_patch_for_ok_rows() -> None:
    """A workload whose every row is ok gets no patch."""
    owners = _owners(workload("Deployment", NS, "web", template({"vramguard.io/vram": "12Gi"})))
    assert patches(recommend([_series("web-7d9f4c8b5-x2b4z", 9 * GiB)], owners, Policy()), owners) == []
