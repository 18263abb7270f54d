"""The test control plane itself: a real kube-apiserver with real authentication, RBAC, scheduling and storage."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
import urllib3
from kubernetes import client

from vramguard_testbed.waiting import wait_until

from .controlplane import (
    _OWNER_FILE,
    _WORKDIR_PREFIX,
    KUBERNETES_VERSIONS,
    ControlPlane,
    ControlPlaneError,
    _process_identity,
    _remove_abandoned_workdirs,
    kubeconfig_api_client,
)

REPO = Path(__file__).resolve().parents[2]


def pod(name: str, *, node_name: str | None = None, node_selector: dict[str, str] | None = None) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app": name}),
        spec=client.V1PodSpec(
            node_name=node_name,
            node_selector=node_selector,
            containers=[client.V1Container(name="main", image="registry.k8s.io/pause:3.10")],
        ),
    )


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_go_mod_pins_the_version_the_package_expects(version: str) -> None:
    """hack/k8s/<minor>/go.mod builds the Kubernetes version whose cache directory find_binaries() reads."""
    minor = ".".join(version.split(".")[:2])
    go_mod = (REPO / "hack" / "k8s" / minor / "go.mod").read_text()
    pinned = re.search(r"^\s*(?:require )?k8s\.io/kubernetes (v\S+)", go_mod, re.MULTILINE)
    assert pinned is not None
    assert pinned.group(1) == version
    staging = re.findall(r"^\s*k8s\.io/\S+ => k8s\.io/\S+ (v\S+)$", go_mod, re.MULTILINE)
    assert staging and set(staging) == {"v0." + version.removeprefix("v1.")}
    assert sorted(p.name for p in (REPO / "hack" / "k8s").iterdir()) == sorted(
        ".".join(v.split(".")[:2]) for v in KUBERNETES_VERSIONS
    ), "every version under hack/k8s is one the tests run"


def test_component_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A component is SIGKILLed by the kernel when the test process that started it is killed."""
    starter = (
        "import sys, time\n"
        "from pathlib import Path\n"
        f"sys.path.insert(0, {str(Path(__file__).parents[1])!r})\n"
        "from cluster.controlplane import Component\n"
        "c = Component('sleeper', ['/bin/sleep', '300'], Path(sys.argv[1]))\n"
        "c.start()\n"
        "print(c.popen.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", starter, str(tmp_path / "sleeper.log")], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    # The shim exec'ed into sleep: the PID started by the component is sleep itself.
    wait_until(
        lambda: Path(f"/proc/{child_pid}/cmdline").read_bytes().startswith(b"/bin/sleep"), 5, what="the exec into sleep"
    )
    parent.send_signal(signal.SIGKILL)
    parent.wait()

    def gone() -> bool | None:
        try:
            state = Path(f"/proc/{child_pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        return True if state in ("Z", "X") else None

    wait_until(gone, 5, what="the component to exit")


def test_workdirs_of_dead_sessions_are_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A workdir whose owner process is gone is removed; a live owner's, and one with no owner, are kept."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen(["/bin/true"])
    dead_identity = f"{dead.pid} 1"  # a start time no live process with that PID can have
    dead.wait()
    workdirs = {}
    for name, owner in [("dead", dead_identity), ("live", _process_identity(os.getpid())), ("foreign", None)]:
        workdirs[name] = tmp_path / f"{_WORKDIR_PREFIX}{name}"
        workdirs[name].mkdir()
        if owner is not None:
            (workdirs[name] / _OWNER_FILE).write_text(owner)

    _remove_abandoned_workdirs()

    assert {name for name, path in workdirs.items() if path.exists()} == {"live", "foreign"}


def test_start_failure_names_the_component_and_shows_its_log(control_plane_binaries: Path) -> None:
    """An apiserver that cannot start raises with the end of its log, and nothing is left running."""
    plane = ControlPlane(control_plane_binaries, apiserver_args=["--no-such-flag=1"])
    with pytest.raises(ControlPlaneError, match=r"(?s)kube-apiserver exited .*unknown flag: --no-such-flag"):
        plane.start()
    assert not any(component.running() for component in plane.components.values())
    assert plane.workdir is not None and not plane.workdir.exists()


def test_apiserver_reports_the_pinned_version(admin_api: client.ApiClient, kubernetes_version: str) -> None:
    """The admin client reaches the apiserver, which reports the version it was built as (not v0.0.0)."""
    info = client.VersionApi(admin_api).get_code()
    assert info.git_version == kubernetes_version
    assert (info.major, info.minor) == ("1", kubernetes_version.split(".")[1])


def test_pod_bound_to_a_node_is_listed_by_node_field_selector(admin_api: client.ApiClient, namespace: str) -> None:
    """Pods bound with spec.nodeName are what a field selector spec.nodeName=<node> returns (the agent's watch)."""
    core = client.CoreV1Api(admin_api)
    ours, other = unique("node"), unique("node")
    for node in (ours, other):
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=node)))
    core.create_namespaced_pod(namespace, pod("on-ours", node_name=ours))
    core.create_namespaced_pod(namespace, pod("on-other", node_name=other))

    listed = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={ours}")
    assert [(p.metadata.namespace, p.metadata.name) for p in listed.items if p.metadata] == [(namespace, "on-ours")]


def test_service_account_token_is_authenticated_and_rbac_decides(
    control_plane: ControlPlane, admin_api: client.ApiClient, namespace: str
) -> None:
    """A TokenRequest kubeconfig authenticates as the ServiceAccount; RBAC forbids pods until a Role grants them."""
    kubeconfig = control_plane.service_account_kubeconfig(namespace, "agent")
    with kubeconfig_api_client(kubeconfig) as sa_api:
        review = client.AuthenticationV1Api(sa_api).create_self_subject_review(client.V1SelfSubjectReview())
        assert review.status and review.status.user_info
        assert review.status.user_info.username == f"system:serviceaccount:{namespace}:agent"

        with pytest.raises(client.ApiException) as denied:
            client.CoreV1Api(sa_api).list_namespaced_pod(namespace)
        assert denied.value.status == 403

        rbac = client.RbacAuthorizationV1Api(admin_api)
        rbac.create_namespaced_role(
            namespace,
            client.V1Role(
                metadata=client.V1ObjectMeta(name="pod-reader"),
                rules=[client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["list"])],
            ),
        )
        rbac.create_namespaced_role_binding(
            namespace,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name="agent-reads-pods"),
                role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="pod-reader"),
                subjects=[client.RbacV1Subject(kind="ServiceAccount", name="agent", namespace=namespace)],
            ),
        )

        def allowed() -> bool | None:
            try:
                client.CoreV1Api(sa_api).list_namespaced_pod(namespace)
            except client.ApiException as error:
                assert error.status == 403
                return None
            return True

        wait_until(allowed, 10, what="the RoleBinding in effect")


def test_scheduler_binds_a_pod_to_a_ready_node(
    control_plane: ControlPlane, admin_api: client.ApiClient, namespace: str
) -> None:
    """kube-scheduler binds a pending pod to the Ready, untainted node its nodeSelector names."""
    node = unique("ready")
    control_plane.add_node(node, labels={"vramguard.test/node": node})
    scheduler = control_plane.start_scheduler()
    try:
        core = client.CoreV1Api(admin_api)
        core.create_namespaced_pod(namespace, pod("pending", node_selector={"vramguard.test/node": node}))

        def bound() -> str | None:
            spec = core.read_namespaced_pod("pending", namespace).spec
            return spec.node_name if spec and spec.node_name else None

        assert wait_until(bound, 30, what="the pod bound") == node
    finally:
        scheduler.stop()


def test_controller_manager_computes_disruption_budget_status(
    control_plane: ControlPlane, admin_api: client.ApiClient, namespace: str
) -> None:
    """kube-controller-manager's disruption controller fills in a PodDisruptionBudget's status."""
    node = unique("pdb")
    control_plane.add_node(node)
    client.CoreV1Api(admin_api).create_namespaced_pod(namespace, pod("guarded", node_name=node))
    policy = client.PolicyV1Api(admin_api)
    policy.create_namespaced_pod_disruption_budget(
        namespace,
        client.V1PodDisruptionBudget(
            metadata=client.V1ObjectMeta(name="guard"),
            spec=client.V1PodDisruptionBudgetSpec(
                min_available=1, selector=client.V1LabelSelector(match_labels={"app": "guarded"})
            ),
        ),
    )
    manager = control_plane.start_controller_manager()
    try:

        def computed() -> client.V1PodDisruptionBudgetStatus | None:
            budget = policy.read_namespaced_pod_disruption_budget("guard", namespace)
            status = budget.status
            if status is None or budget.metadata is None or status.observed_generation != budget.metadata.generation:
                return None
            return status

        status = wait_until(computed, 30, what="the PodDisruptionBudget status")
        # The pod is bound but no kubelet runs it, so it is expected yet not healthy: no disruption allowed.
        assert (status.expected_pods, status.current_healthy, status.disruptions_allowed) == (1, 0, 0)
    finally:
        manager.stop()


@pytest.mark.parametrize("kill", [pytest.param(False, id="graceful-stop"), pytest.param(True, id="sigkill")])
def test_apiserver_restart_keeps_data_and_clients_reconnect(
    control_plane: ControlPlane, admin_api: client.ApiClient, namespace: str, kill: bool
) -> None:
    """After the apiserver restarts on the same port, objects written before are there and old clients work."""
    core = client.CoreV1Api(admin_api)
    core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="before"), data={"k": "v"})
    )
    host = control_plane.host

    control_plane.stop_apiserver(kill=kill)
    with pytest.raises(urllib3.exceptions.HTTPError):  # nothing listens: connection refused
        core.read_namespace(namespace, _request_timeout=2)
    control_plane.start_apiserver()

    assert control_plane.host == host
    assert core.read_namespaced_config_map("before", namespace).data == {"k": "v"}
    core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="after")))
    names = {cm.metadata.name for cm in core.list_namespaced_config_map(namespace).items if cm.metadata}
    assert {"before", "after"} <= names
