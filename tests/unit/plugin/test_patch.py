"""The patches: the recommendation in the field the workload uses, where its kind keeps its template; never a value
the agent's own quota parser refuses; none for a workload that is ok."""

from __future__ import annotations

from typing import Any

import pytest

from vramguard.core.policy import Policy
from vramguard.core.quantity import GiB
from vramguard.plugin.patch import patches
from vramguard.plugin.recommend import PeakSeries, recommend
from vramguard.plugin.workloads import Owners

from .objects import by_kind, pod, template, workload

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


LIMIT, REQUEST = "NVIDIA_GPU_MEMORY_LIMIT", "NVIDIA_GPU_MEMORY_REQUEST"
KAI = "nvidia.com/container.main.gpu-memory"
FROM_A_CONFIGMAP = {"configMapKeyRef": {"name": "gpu", "key": "limit"}}


def _env(*entries: dict[str, object]) -> dict[str, object]:
    """The Deployment patch that sets the container main's `env` entries."""
    return {"spec": {"template": {"spec": {"containers": [{"name": "main", "env": list(entries)}]}}}}


def _kai(annotations: dict[str, str]) -> dict[str, object]:
    return {"spec": {"template": {"metadata": {"annotations": annotations}}}}


def _with_env_from(pod_template: dict[str, Any]) -> dict[str, Any]:
    for c in pod_template["spec"]["containers"]:
        c["envFrom"] = [{"configMapRef": {"name": "team-settings"}}]
    return pod_template


# A 9GiB peak: 11Gi recommended, 11264 in the toolkit's MiB.
@pytest.mark.parametrize(
    ("pod_template", "want"),
    [
        pytest.param(template(env=[{"name": LIMIT, "value": "4096"}]), _env({"name": LIMIT, "value": "11264"}),
                     id="env-limit-in-mib-digits"),
        pytest.param(template(env=[{"name": REQUEST, "value": "2048"}, {"name": LIMIT, "value": "4096"}]),
                     _env({"name": LIMIT, "value": "11264"}), id="env-request-below-the-new-limit-kept"),
        pytest.param(template(env=[{"name": REQUEST, "value": "24576"}, {"name": LIMIT, "value": "32768"}]),
                     _env({"name": LIMIT, "value": "11264"}, {"name": REQUEST, "value": "11264"}),
                     id="env-request-above-the-new-limit-lowered-to-it"),
        pytest.param(template(env=[{"name": REQUEST, "value": "4096"}]), _env({"name": LIMIT, "value": "11264"}),
                     id="env-request-only-gets-a-limit-request-kept"),
        pytest.param(template(env=[{"name": REQUEST, "value": "32768"}]),
                     _env({"name": LIMIT, "value": "11264"}, {"name": REQUEST, "value": "11264"}),
                     id="env-request-only-above-gets-the-limit-as-request"),
        pytest.param(template(env=[{"name": LIMIT, "value": "4096Mi"}]), _env({"name": LIMIT, "value": "11264"}),
                     id="env-invalid-limit-replaced-not-a-vramguard-annotation"),
        pytest.param(template(env=[{"name": REQUEST, "value": "2GiB"}, {"name": LIMIT, "value": "4096"}]),
                     _env({"name": LIMIT, "value": "11264"}, {"name": REQUEST, "value": "11264"}),
                     id="env-invalid-request-becomes-the-limit"),
        pytest.param(template(annotations={f"{KAI}.limit": "4Gi"}), _kai({f"{KAI}.limit": "11Gi"}),
                     id="kai-limit-a-quantity"),
        pytest.param(template(annotations={f"{KAI}.request": "2Gi", f"{KAI}.limit": "4Gi"}),
                     _kai({f"{KAI}.limit": "11Gi"}), id="kai-request-below-the-new-limit-kept"),
        pytest.param(template(annotations={f"{KAI}.request": "24Gi", f"{KAI}.limit": "32Gi"}),
                     _kai({f"{KAI}.limit": "11Gi", f"{KAI}.request": "11Gi"}),
                     id="kai-request-above-the-new-limit-lowered-to-it"),
        pytest.param(template(annotations={f"{KAI}.request": "4Gi"}), _kai({f"{KAI}.limit": "11Gi"}),
                     id="kai-request-only-gets-a-limit-request-kept"),
        pytest.param(template(annotations={f"{KAI}.limit": "12GB"}), _kai({f"{KAI}.limit": "11Gi"}),
                     id="kai-invalid-limit-replaced"),
        pytest.param(_with_env_from(template({"nvidia.com/gpu": "1"})), _env({"name": LIMIT, "value": "11264"}),
                     id="env-from-on-a-gpu-container-overridden-in-env"),
        pytest.param(template(env=[{"name": LIMIT, "value": "4096"}], annotations={"vramguard.io/vram-limit": "4Gi"}),
                     _env({"name": LIMIT, "value": "11264"}), id="env-ahead-of-the-pod-wide-annotation"),
    ],
)  # fmt: skip
def test_nvidia_declarations_are_patched_where_declared(pod_template: dict[str, object], want: object) -> None:
    """A quota declared in NVIDIA's own fields gets the recommendation there: the limit takes it (whole MiB in digits
    in the variable, the shortest quantity in KAI's annotation); a declared request is kept where at most the new
    limit, and becomes the limit otherwise; an invalid declaration is replaced, never shadowed by vramguard's field;
    a GPU container's envFrom that may set the variables unread is overridden in env[]."""
    owners = _owners(workload("Deployment", NS, "web", pod_template))
    (patch,) = patches(recommend([_series("web-7d9f4c8b5-x2b4z", 9 * GiB)], owners, Policy()), owners)
    assert patch.body == want, patch.why


@pytest.mark.parametrize(
    ("kind", "declared", "why"),
    [
        pytest.param("Deployment", {"env": [{"name": LIMIT, "valueFrom": FROM_A_CONFIGMAP}]},
                     f"spec.containers[main].env[{LIMIT}] is set from elsewhere (valueFrom): set {LIMIT}=11264 where "
                     "it comes from", id="env-value-from-a-configmap"),
        pytest.param("Deployment", {"env": [{"name": REQUEST, "valueFrom": FROM_A_CONFIGMAP},
                                            {"name": LIMIT, "value": "4096"}]},
                     f"spec.containers[main].env[{REQUEST}] is set from elsewhere (valueFrom): set {LIMIT}=11264 "
                     "where it comes from", id="env-request-value-from"),
        pytest.param("Deployment", {"env": [{"name": LIMIT, "value": "4096"}, {"name": LIMIT, "value": "8192"}]},
                     f"spec.containers[main].env[{LIMIT}] is listed 2 times, which no patch makes one: keep one, "
                     f"{LIMIT}=11264", id="env-listed-twice"),
        pytest.param("Pod", {"env": [{"name": LIMIT, "value": "4096"}]},
                     f"a pod's environment cannot change; recreate it with main: {LIMIT}=11264", id="bare-pod-env"),
        pytest.param("Pod", {"annotations": {f"{KAI}.request": "24Gi", f"{KAI}.limit": "32Gi"}},
                     "KAI's annotations are read only when a container is created; recreate it with "
                     f"main: {KAI}.limit=11Gi, main: {KAI}.request=11Gi", id="bare-pod-kai"),
        pytest.param("Pod", {"limits": {"vramguard.io/vram": "4Gi"}},
                     "a pod's resource limits cannot change; recreate it with main: vramguard.io/vram=11Gi",
                     id="bare-pod-limit"),
    ],
)  # fmt: skip
def test_nvidia_declarations_no_patch_says_why(kind: str, declared: dict[str, Any], why: str) -> None:
    """Where the field in force cannot be patched, no patch is printed, and never a vramguard annotation instead: a
    variable set by a valueFrom lives in what it refers to, a variable listed twice is ambiguous, a bare pod's
    containers take their limits and NVIDIA's declarations only when created. The line says what to set."""
    if kind == "Pod":
        owners, pod_name = _owners(pod(NS, "web", **declared)), "web"
    else:
        owners, pod_name = _owners(workload(kind, NS, "web", template(**declared))), "web-7d9f4c8b5-x2b4z"
    (patch,) = patches(recommend([_series(pod_name, 9 * GiB)], owners, Policy()), owners)
    assert patch.body is None
    assert patch.command() == f"# ml {kind}/web: {why}"
