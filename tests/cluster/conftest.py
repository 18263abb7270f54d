"""A real Kubernetes control plane (etcd + kube-apiserver), started once per test session.

Skips with the reason when the binaries are not built here; under CI (``CI`` set) that is a failure instead,
because CI runs scripts/controlplane.sh first.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from cgroup_fixtures import need_cgroups
from real_parts import need

from .controlplane import KUBERNETES_VERSIONS, ControlPlane, binaries_dir, unavailable_reason
from .kube_fixtures import KubeNode, deploy_manifest


@pytest.fixture(scope="session", params=KUBERNETES_VERSIONS)
def kubernetes_version(request: pytest.FixtureRequest) -> str:
    """Each Kubernetes version the integration tests run on: every test that uses the control plane runs on
    each (pytest runs all of one version's tests, then the other's)."""
    version: str = request.param
    return version


@pytest.fixture(scope="session")
def control_plane_binaries(kubernetes_version: str) -> Path:
    """The directory of the built binaries (with etcd on PATH); skips, or fails under CI, when they are missing."""
    reason = unavailable_reason(kubernetes_version)
    need(reason, skip="no Kubernetes control plane", ci="build the Kubernetes control plane first")
    return binaries_dir(kubernetes_version)


@pytest.fixture(scope="session")
def control_plane(control_plane_binaries: Path) -> Iterator[ControlPlane]:
    """etcd and kube-apiserver for the whole session; tests start the scheduler or controller-manager on demand."""
    plane = ControlPlane(control_plane_binaries).start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def admin_api(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    """An admin ApiClient for one test."""
    with control_plane.api_client() as api:
        yield api


@pytest.fixture
def namespace(admin_api: client.ApiClient) -> str:
    """A fresh namespace for one test. Never deleted: no namespace controller runs to finish a deletion."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    client.CoreV1Api(admin_api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


@pytest.fixture(scope="session")
def deployed(control_plane: ControlPlane) -> ControlPlane:
    """The control plane with deploy/daemonset.yaml applied: namespace, ServiceAccount, RBAC, admission policy."""
    with control_plane.api_client() as api:
        deploy_manifest(api)
    return control_plane


@pytest.fixture
def node(deployed: ControlPlane, admin_api: client.ApiClient, tmp_path: Path) -> Iterator[KubeNode]:
    """A fresh GPU node (API Node + simulated GPU + real cgroups) with the agent's pod-bound credentials."""
    need_cgroups(2)
    kube_node = KubeNode(deployed, admin_api, tmp_path, labels={"nvidia.com/gpu.replicas": "4"})
    try:
        yield kube_node
    finally:
        kube_node.close()
