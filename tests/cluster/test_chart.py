"""The real API server validates what the Helm chart renders (server-side dry run), with every option on, the
agent's container both ways: the narrow security context (the default) and `privileged: true`.

The default rendering is applied for real by the `deployed` fixture (deploy/daemonset.yaml is generated from the
chart). Kinds whose CRDs this API server does not have (ServiceMonitor, PrometheusRule) are left out here; their
shape is checked in tests/cluster/test_helm.py.
"""

from __future__ import annotations

import uuid

import pytest
from kubernetes import client, utils

from helm_fixtures import need_helm, render

from .controlplane import ControlPlane

CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}


@pytest.mark.parametrize("privileged", ["false", "true"])
def test_api_server_accepts_every_object_the_chart_renders(
    control_plane: ControlPlane, namespace: str, privileged: str
) -> None:
    release = f"vg-{uuid.uuid4().hex[:8]}"
    objects = render(
        need_helm(),
        "serviceMonitor.enabled=true",
        "prometheusRule.enabled=true",
        f"privileged={privileged}",
        "advertiseCapacity=true",
        "capacityReserve=1Gi",
        "imagePullSecrets[0].name=registry",
        "extraArgs={--dry-run}",
        "extraEnv[0].name=LD_LIBRARY_PATH",
        "extraEnv[0].value=/host/nvml",
        "extraVolumes[0].name=nvml",
        "extraVolumes[0].hostPath.path=/opt/nvml",
        "extraVolumeMounts[0].name=nvml",
        "extraVolumeMounts[0].mountPath=/host/nvml",
        release=release,
        namespace=namespace,
    )
    kinds = {o["kind"] for o in objects}
    assert {"DaemonSet", "ServiceAccount", "ClusterRole", "ValidatingAdmissionPolicy", "Service"} <= kinds
    with control_plane.api_client() as api:
        for obj in objects:
            if obj["kind"] in CRD_KINDS:
                continue
            # Raises FailToCreateError with the API server's reasons for any object it would refuse, an unknown
            # field included (Strict: a field this server does not know is an error, not a warning).
            utils.create_from_dict(api, obj, dry_run="All", field_validation="Strict")  # type: ignore[no-untyped-call]
        # A dry run stores nothing.
        assert not client.AppsV1Api(api).list_namespaced_daemon_set(namespace).items


def test_api_server_accepts_the_driver_root_and_openshift_objects(control_plane: ControlPlane, namespace: str) -> None:
    """The driver root's hostPath volume and propagating read-only mount, its variables, and OpenShift's SCC
    RoleBinding (to a ClusterRole this server does not have: a binding may name one before it exists)."""
    objects = render(
        need_helm(),
        "privileged=true",
        "driver.root=/run/nvidia/driver",
        "driver.mountPropagation=HostToContainer",
        "driver.nvmlLibrary=usr/lib64/libnvidia-ml.so.1",
        "openshift.scc=privileged",
        release=f"vg-{uuid.uuid4().hex[:8]}",
        namespace=namespace,
    )
    assert {"DaemonSet", "RoleBinding"} <= {o["kind"] for o in objects}
    with control_plane.api_client() as api:
        for obj in objects:
            if obj["kind"] in CRD_KINDS:
                continue
            utils.create_from_dict(api, obj, dry_run="All", field_validation="Strict")  # type: ignore[no-untyped-call]
