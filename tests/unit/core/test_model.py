"""The decision core's vocabulary: the few rules its types carry (labels, quotas on a GPU, pressure, exemption)."""

from __future__ import annotations

import pytest

from vramguard.core.model import (
    NO_SHARE,
    ContainerInfo,
    GiB,
    GpuDevice,
    GpuMemory,
    PodInfo,
    PodQuota,
    Policy,
    Quota,
    QuotaError,
)

AGENT_UID = "a9e1c0de-0000-4000-8000-000000000001"
POD_UID = "5f3c2b1a-0000-4000-8000-000000000002"


def device(used_gib: int, total_gib: int = 80) -> GpuDevice:
    total, used = total_gib * GiB, used_gib * GiB
    return GpuDevice(index=0, uuid="GPU-0", name="H100", total_bytes=total, used_bytes=used, free_bytes=total - used)


@pytest.mark.parametrize(
    ("pod_uid", "namespace", "agent_pod_uid", "exempt"),
    [
        pytest.param(POD_UID, "ml", AGENT_UID, None, id="a-tenant-pod-may-be-acted-on"),
        pytest.param(AGENT_UID, "vramguard-system", AGENT_UID, "the agent's own pod", id="the-agents-own-pod"),
        pytest.param(AGENT_UID, "ml", AGENT_UID, "the agent's own pod", id="the-agents-pod-wherever-it-runs"),
        pytest.param(POD_UID, "kube-system", AGENT_UID, "namespace kube-system is exempt", id="an-exempt-namespace"),
        pytest.param(POD_UID, "kube-system", None, "namespace kube-system is exempt", id="exempt-with-no-agent-pod"),
        pytest.param(POD_UID, "ml", None, None, id="no-agent-pod-known-exempts-nobody-else"),
    ],
)
def test_exemption_is_the_agents_own_pod_or_an_exempt_namespace(
    pod_uid: str, namespace: str, agent_pod_uid: str | None, exempt: str | None
) -> None:
    """The one rule decide, the driver limits and the orphan reclaim go by: never the agent's pod, nor a pod in
    an exempt namespace (kube-system by default); the agent's own pod is named first."""
    assert Policy().exemption(pod_uid, namespace, agent_pod_uid) == exempt


def test_exempt_namespaces_come_from_the_policy() -> None:
    """The policy's list replaces the default: kube-system is exempt only while it is listed."""
    policy = Policy(exempt_namespaces=frozenset({"monitoring"}))
    assert policy.exemption(POD_UID, "monitoring") == "namespace monitoring is exempt"
    assert policy.exemption(POD_UID, "kube-system") is None


@pytest.mark.parametrize(
    ("mig_index", "label"),
    [pytest.param(None, "3", id="whole-gpu"), pytest.param(1, "3/mig1", id="mig-instance")],
)
def test_a_device_label_names_its_gpu_and_mig_instance(mig_index: int | None, label: str) -> None:
    """A GPU's label is its NVML index; a MIG instance's adds the instance."""
    gpu = GpuDevice(index=3, uuid="GPU-3", name="A100", total_bytes=1, used_bytes=0, free_bytes=1, mig_index=mig_index)
    assert gpu.label == label


def test_a_static_pod_is_known_to_the_api_server_by_its_mirror() -> None:
    """`uid` names the cgroup; `object_uid` the API object (the mirror pod's for a static pod)."""
    plain = PodInfo(POD_UID, "ml", "trainer")
    static = PodInfo("0123456789abcdef0123456789abcdef", "kube-system", "etcd-node1", mirror_uid=POD_UID)
    assert (plain.key, plain.static, plain.object_uid) == ("ml/trainer", False, POD_UID)
    assert (static.key, static.static, static.object_uid) == ("kube-system/etcd-node1", True, POD_UID)


def test_containers_are_found_by_runtime_id() -> None:
    """Attribution's lookup: a running container by its ID; none for an unknown ID or one not yet running."""
    main = ContainerInfo("main", container_id="c0ffee")
    pod = PodInfo(POD_UID, "ml", "trainer", containers=(main, ContainerInfo("init")))
    assert pod.container_by_id("c0ffee") is main
    assert pod.container_by_id("beef") is None


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
    every GPU; None for a container without one (the pod-wide quota, if any, is `quota.row_owner`'s to apply)."""
    assert POD_QUOTA.own(container, device_uuid) == own


def test_a_quota_error_is_stored_cut() -> None:
    """A tenant's 10 MB annotation is kept as at most MAX_CHARS characters in every field."""
    error = QuotaError(field="annotation x", value="9" * 10_000_000, message="is not a valid quantity")
    assert len(error.value) <= QuotaError.MAX_CHARS
    assert error.message == "is not a valid quantity"


@pytest.mark.parametrize(
    ("policy", "used_gib", "pressure"),
    [
        pytest.param(Policy(), 75, False, id="default-5-percent-free-is-not-pressure"),
        pytest.param(Policy(), 77, True, id="default-under-5-percent-free"),
        pytest.param(Policy(pressure_free_bytes=10 * GiB, pressure_free_ratio=None), 69, False, id="bytes-not-met"),
        pytest.param(Policy(pressure_free_bytes=10 * GiB, pressure_free_ratio=None), 71, True, id="bytes-met"),
        pytest.param(Policy(pressure_free_bytes=1 * GiB), 77, True, id="either-threshold-set-counts"),
        pytest.param(Policy(pressure_free_ratio=None), 80, False, id="no-threshold-no-pressure"),
    ],
)
def test_pressure_is_free_memory_under_either_threshold(policy: Policy, used_gib: int, pressure: bool) -> None:
    """A GPU is under pressure when its free memory is below the byte or the ratio threshold, whichever is set."""
    assert policy.under_pressure(device(used_gib)) is pressure
    assert policy.under_pressure(GpuMemory(0, 80 * GiB, used_gib * GiB, (80 - used_gib) * GiB)) is pressure


@pytest.mark.parametrize(
    ("policy", "rise_bytes"),
    [
        pytest.param(Policy(), 256 * 1024 * 1024, id="default-the-smaller-of-256mib-and-1-percent"),
        pytest.param(Policy(watch_rise_bytes=4 * GiB), int(0.01 * 80 * GiB), id="the-ratio-when-smaller"),
        pytest.param(Policy(watch_rise_ratio=None), 256 * 1024 * 1024, id="bytes-alone"),
        pytest.param(Policy(watch_rise_bytes=None), int(0.01 * 80 * GiB), id="ratio-alone"),
        pytest.param(Policy(watch_rise_bytes=None, watch_rise_ratio=None), 80 * GiB, id="neither-the-whole-gpu"),
    ],
)
def test_the_watch_scans_at_once_on_the_smaller_rise(policy: Policy, rise_bytes: int) -> None:
    """The change in used memory that triggers a scan: the smaller threshold set, the whole GPU when none is."""
    assert policy.watch_rise_for(80 * GiB) == rise_bytes
