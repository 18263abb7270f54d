"""The chart's quota admission policy on a real kube-apiserver, in the agent's words; and a ResourceQuota on the
namespace's total.

Every row of tests/quota_values.py is created with a server-side dry run (through admission, nothing stored): an
invalid row is refused with exactly the text of the agent's VRAMQuotaInvalid Event, less what applies instead,
computed here by the agent's own code from the pod as the API server stores it (a dry run in kube-system, which
every quota policy exempts, gives its canonical spelling); a valid row is admitted. The policy is rendered from the
chart with max_quotas on this module's namespaces and created alone (with its bindings and the policy ConfigMap it
reads its caps from), then deleted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import pytest
from kubernetes import client, utils

from helm_fixtures import need_helm, one, render
from quota_values import BY_NAME, CAPS, KAI, LIMIT, ROWS, VRAM, Row
from vramguard.core.policy import Policy, PolicyText, policy_from_text
from vramguard.core.quota import invalid_message, resolve_pod_quota
from vramguard_testbed.waiting import wait_until

from .controlplane import ControlPlane, kubeconfig_api_client
from .kube_fixtures import AGENT_NAMESPACE, MERGE, pod_info

EXEMPT = "kube-system"  # exempt in every rendering of the chart, as in the agent's default policy
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
MIRROR = "kubernetes.io/config.mirror"


@dataclass(frozen=True)
class Door:
    """The quota policy of one rendering of the chart, in force on the API server."""

    core: client.CoreV1Api
    name: str  # of the ValidatingAdmissionPolicy and its binding
    policy: Policy  # the agent's, from the same values (the rendered ConfigMap)
    namespaces: Mapping[str | None, str]  # a row's cap (a key of CAPS, None for none) → its namespace
    config_map: tuple[str, str] = ("", "")  # the policy ConfigMap's namespace and name, which both read


def _body(pod: dict[str, Any]) -> client.V1Pod:
    """A Pod manifest as the body of a request: the client sends a dict as it is."""
    return cast(client.V1Pod, pod)


def _create_door(api: client.ApiClient, values: Mapping[str, Any], probe_namespace: str, *, warn: bool) -> str:
    """Render the chart with `values` as release `door-<hex>` in a namespace of that name, create its policy
    ConfigMap and its quota policies and bindings alone, and wait until the API server enforces them (a 32Gi
    vram-limit in `probe_namespace`, capped at 16Gi there, is refused or warned about). Returns the policy's name,
    `<release>-quota-values`."""
    release = f"door-{uuid.uuid4().hex[:8]}"
    objects = render(need_helm(), release=release, namespace=release, values=values)
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=release)))
    utils.create_from_dict(api, one(objects, "ConfigMap", "-policy"))  # type: ignore[no-untyped-call]
    for obj in objects:
        if obj["kind"] in POLICY_KINDS and "-quota-values" in obj["metadata"]["name"]:
            utils.create_from_dict(api, obj)  # type: ignore[no-untyped-call]
    name = f"{release}-quota-values"
    probe = BY_NAME[LIMIT].pod("32Gi", f"probe-{release}", probe_namespace)

    def enforced() -> bool:
        try:
            _, _, headers = core.create_namespaced_pod_with_http_info(probe_namespace, _body(probe), dry_run="All")
        except client.ApiException as e:
            if e.status != 422:
                raise
            return f"'{name}'" in str(e.body)
        return warn and any(f"'{name}'" in w for w in _warnings(headers))

    wait_until(enforced, 30, what=f"the admission policy {name} enforced", interval_s=0.1)
    return name


def _delete_door(api: client.ApiClient, name: str) -> None:
    """Delete the quota policies and bindings of the door `name` (its namespace stays: no namespace controller)."""
    admission = client.AdmissionregistrationV1Api(api)
    for policy in (name, f"{name}-mirrors"):
        with contextlib.suppress(client.ApiException):  # the mirrors' policy is not in every rendering
            admission.delete_validating_admission_policy_binding(policy)
            admission.delete_validating_admission_policy(policy)


def _agent_policy(data: Mapping[str, str]) -> Policy:
    """The policy an agent that mounts a policy ConfigMap of `data` loads, as the chart points it at the volume."""
    return policy_from_text(PolicyText.of_config_map(data), "the policy ConfigMap")


def _chart_policy(values: Mapping[str, Any]) -> Policy:
    """The policy the agent would load from a rendering of the chart with `values`."""
    return _agent_policy(one(render(need_helm(), values=values), "ConfigMap", "-policy")["data"])


@pytest.fixture(scope="module")
def door(control_plane: ControlPlane) -> Iterator[Door]:
    """Fresh namespaces, one per max_quota of the table and one without; the chart's quota policy with those caps
    (its agent namespace, where the Warn test runs, exempt); and, created before the policy, a pod "old" whose
    vram-limit is over its namespace's cap."""
    suffix = uuid.uuid4().hex[:8]
    namespaces: dict[str | None, str] = {None: f"quota-{suffix}"}
    namespaces.update({cap: f"quota-{suffix}-{i}" for i, cap in enumerate(CAPS)})
    values = {
        "policy": {
            "exempt_namespaces": [EXEMPT, AGENT_NAMESPACE],
            "namespaces": {namespaces[cap]: {"max_quota": max_quota} for cap, max_quota in CAPS.items()},
        }
    }
    with control_plane.api_client() as api:
        core = client.CoreV1Api(api)
        for ns in namespaces.values():
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        capped = namespaces["16Gi"]
        core.create_namespaced_pod(capped, _body(BY_NAME[LIMIT].pod("32Gi", "old", capped)))
        name = _create_door(api, values, capped, warn=False)
        try:
            yield Door(core, name, _chart_policy(values), namespaces)
        finally:
            _delete_door(api, name)
            core.delete_namespaced_pod("old", capped)


def agent_says(door: Door, pod: dict[str, Any], policy: Policy | None = None) -> list[str] | None:
    """The agent's VRAMQuotaInvalid texts for `pod` under `policy` (the door's unless given), less what applies
    instead, as it reads the pod the API server stores ([] in a namespace it exempts); None when the API server
    refuses the pod itself."""
    policy = policy if policy is not None else door.policy
    namespace = pod["metadata"]["namespace"]
    exempt = json.loads(json.dumps(pod))
    exempt["metadata"]["namespace"] = EXEMPT
    try:
        stored = door.core.create_namespaced_pod(EXEMPT, _body(exempt), dry_run="All")
    except client.ApiException:
        return None
    if namespace in policy.exempt_namespaces:
        return []
    info = dataclasses.replace(pod_info(stored), namespace=namespace)
    errors = resolve_pod_quota(info, policy, {}).errors
    return [invalid_message(dataclasses.replace(e, applies="")) for e in errors]


def refusal(door: Door, pod: dict[str, Any]) -> tuple[int, str] | None:
    """(status, message) of the API server's refusal of `pod` (a dry run), None when it admits it."""
    try:
        door.core.create_namespaced_pod(pod["metadata"]["namespace"], _body(pod), dry_run="All")
    except client.ApiException as e:
        return int(e.status or 0), str(json.loads(e.body or "{}")["message"])
    return None


def _warnings(headers: Mapping[str, str]) -> list[str]:
    """The texts of the Warning headers of a response (RFC 9111 `299 - "text"`, which kubectl prints)."""
    raw = headers.get("Warning") or ""
    # urllib3 decodes header bytes as latin-1; the API server writes UTF-8.
    raw = raw.encode("latin-1").decode("utf-8")
    return [re.sub(r"\\(.)", r"\1", text) for text in re.findall(r'\d{3} \S+ "((?:[^"\\]|\\.)*)"', raw)]


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id) for r in ROWS])
def test_each_row_is_refused_in_the_agents_words_or_admitted(door: Door, row: Row) -> None:
    """An invalid row is refused (422) with the agent's text, and no other; a valid one is admitted, and so is a
    variable set by a valueFrom, which the agent reports as unread (no value to refuse); a resource value that is no
    whole Kubernetes quantity is refused by the API server itself, before admission."""
    pod = row.pod("row", door.namespaces[row.cap])
    expected = agent_says(door, pod)
    refused = refusal(door, pod)
    if row.api_server_refuses:
        assert expected is None and refused is not None
        status, message = refused
        assert status in (400, 422) and "ValidatingAdmissionPolicy" not in message, message
        return
    assert expected is not None, "the API server stores the pod"
    assert (expected == []) == row.valid, f"the agent's verdict on the stored pod: {expected}"
    if row.valid or row.door_admits:
        assert refused is None
        return
    assert refused is not None, f"admitted, where the agent says {expected}"
    status, message = refused
    assert status == 422 and "ValidatingAdmissionPolicy '" in message
    assert message.endswith(" denied request: " + "; ".join(expected)), (message, expected)


def test_an_env_from_is_left_to_the_agent(door: Door) -> None:
    """A GPU container whose `envFrom` may set NVIDIA's variables, with no quota of its own, is admitted: the agent
    reports it (it reads no ConfigMap), but it is no value, and most such pods set no GPU memory there at all. The
    variables it does set in env[] are judged."""
    namespace = door.namespaces[None]
    pod = BY_NAME[VRAM].pod("1Mi", "env-from", namespace)
    main = pod["spec"]["containers"][0]
    main["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    main["envFrom"] = [{"configMapRef": {"name": "gpu"}}]
    said = agent_says(door, pod)
    assert said is not None and len(said) == 1 and "envFrom" in said[0]
    assert refusal(door, pod) is None
    main["env"] = [{"name": "NVIDIA_GPU_MEMORY_LIMIT", "value": "4Gi"}]
    (expected,) = agent_says(door, pod) or [""]
    refused = refusal(door, pod)
    assert refused is not None and refused[1].endswith(": " + expected)


def test_only_the_first_256_variables_of_a_container_are_read(door: Door) -> None:
    """The door reads a container's first 256 env[] entries, so that a long env costs a bounded share of the CEL
    budget: a bad NVIDIA_GPU_MEMORY_LIMIT among them is refused; one past them is left to the agent, which reads
    them all."""
    namespace = door.namespaces[None]
    filler = [{"name": f"V{i}", "value": "x"} for i in range(300)]
    for at, refused in ((255, True), (256, False)):
        pod = BY_NAME[VRAM].pod("1Mi", f"long-env-{at}", namespace)
        pod["spec"]["containers"][0]["resources"]["limits"] = {}
        env = [*filler]
        env.insert(at, {"name": "NVIDIA_GPU_MEMORY_LIMIT", "value": "0"})
        pod["spec"]["containers"][0]["env"] = env
        (expected,) = agent_says(door, pod) or [""]
        assert "env[NVIDIA_GPU_MEMORY_LIMIT]" in expected
        got = refusal(door, pod)
        assert (got is not None and got[1].endswith(": " + expected)) if refused else got is None, (at, got)


def test_many_bad_fields_are_each_named_and_the_message_stays_bounded(door: Door) -> None:
    """Six bad limits (two in init containers) are refused with the agent's first four texts, in the agent's
    order, and how many more: the API server takes no message over 5 KiB."""
    namespace = door.namespaces[None]
    pod = BY_NAME[VRAM].pod("0", "many", namespace)
    main = pod["spec"]["containers"][0]
    pod["spec"]["initContainers"] = [{**main, "name": f"init-{i}"} for i in range(2)]
    pod["spec"]["containers"] = [{**main, "name": f"main-{i}"} for i in range(4)]
    expected = agent_says(door, pod)
    assert expected is not None and len(expected) == 6
    assert expected[0].startswith("spec.containers[init-0]")
    refused = refusal(door, pod)
    assert refused is not None
    assert refused[1].endswith(": " + "; ".join(expected[:4]) + "; and 2 more")


def test_a_pod_of_400_quota_fields_is_judged_whole(door: Door) -> None:
    """100 containers with a bad value in each of the four resources: every field is judged, within the API
    server's CEL cost budget (past about 1,600 fields it is exceeded, and the policy, failing open, leaves the pod
    to the agent)."""
    namespace = door.namespaces[None]
    limits = {field.name: "0" for field in BY_NAME.values() if field.kind == "resource"}
    pod = BY_NAME[VRAM].pod("0", "big", namespace)
    pod["spec"]["containers"] = [
        {"name": f"main-{i}", "image": "busybox", "resources": {"limits": limits}} for i in range(100)
    ]
    started = time.monotonic()
    refused = refusal(door, pod)
    took_s = time.monotonic() - started
    assert refused is not None and refused[1].endswith("; and 396 more"), refused
    print(f"a pod of 400 bad quota fields refused in {took_s:.2f} s")


def test_an_update_is_judged_only_where_a_quota_field_changed(door: Door) -> None:
    """A pod admitted before the policy, over its namespace's max_quota, takes every update that leaves its quota
    fields as they are (it is never wedged); a change to a bad value is refused, a change to a good one admitted."""
    namespace = door.namespaces["16Gi"]

    def patched(annotations: dict[str, str]) -> str | None:
        try:
            door.core.patch_namespaced_pod(
                "old", namespace, {"metadata": {"annotations": annotations}}, dry_run="All", _content_type=MERGE
            )
        except client.ApiException as e:
            assert e.status == 422
            return str(json.loads(e.body or "{}")["message"])
        return None

    assert patched({"team": "ml"}) is None
    over = agent_says(door, BY_NAME[LIMIT].pod("33Gi", "old", namespace))
    assert over == [f'metadata.annotations[{LIMIT}]: "33Gi" is over the namespace max_quota 16Gi']
    assert over[0] in (patched({LIMIT: "33Gi"}) or "")
    assert patched({LIMIT: "8Gi"}) is None
    (typo,) = agent_says(door, BY_NAME[KAI].pod("abc", "old", namespace)) or []
    assert typo in (patched({KAI: "abc"}) or "")


def test_warn_admits_and_kubectl_prints_the_agents_words(deployed: ControlPlane) -> None:
    """With admission.action Warn, an invalid row is admitted and the response carries the agent's text in a
    Warning header (what kubectl prints as "Warning: ..."). In the agent's namespace, which the manifest's own
    policy (Deny) exempts."""
    values = {"admission": {"action": "Warn"}, "policy": {"namespaces": {AGENT_NAMESPACE: {"max_quota": "16Gi"}}}}
    rows = [r for r in ROWS if r.id in {"vram-limit-GB", "hami-cap-16Gi-over"}]
    assert len(rows) == 2
    with deployed.api_client() as api:
        name = _create_door(api, values, AGENT_NAMESPACE, warn=True)
        try:
            door = Door(client.CoreV1Api(api), name, _chart_policy(values), {})
            for row in rows:
                pod = row.pod("row", AGENT_NAMESPACE)
                (expected,) = agent_says(door, pod) or [""]
                _, status, headers = door.core.create_namespaced_pod_with_http_info(
                    AGENT_NAMESPACE, _body(pod), dry_run="All"
                )
                assert status == 201
                assert any(f"'{name}'" in w and expected in w for w in _warnings(headers)), _warnings(headers)
        finally:
            _delete_door(api, name)


def _mirror_of(pod: dict[str, Any], node: client.V1Node, node_name: str) -> dict[str, Any]:
    """`pod` as the kubelet of `node` makes the mirror of a static pod, bound to `node_name`: the mirror annotation
    (the static pod's hash), and the Node as its controlling owner, as NodeRestriction demands of a node's pod."""
    assert node.metadata is not None
    mirror: dict[str, Any] = json.loads(json.dumps(pod))
    mirror["metadata"]["annotations"][MIRROR] = uuid.uuid4().hex
    mirror["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Node", "name": node.metadata.name, "uid": node.metadata.uid, "controller": True}
    ]
    mirror["spec"]["nodeName"] = node_name
    return mirror


def _tenant_core(control_plane: ControlPlane, api: client.ApiClient, namespace: str) -> client.ApiClient:
    """An ApiClient of a tenant: ServiceAccount `tenant` of `namespace`, which RBAC lets create pods there."""
    rbac = client.RbacAuthorizationV1Api(api)
    rule = client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["create"])
    rbac.create_namespaced_role(namespace, client.V1Role(metadata=client.V1ObjectMeta(name="tenant"), rules=[rule]))
    binding = client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name="tenant"),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="tenant"),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name="tenant", namespace=namespace)],
    )
    rbac.create_namespaced_role_binding(namespace, binding)
    return kubeconfig_api_client(control_plane.service_account_kubeconfig(namespace, "tenant"))


@pytest.mark.parametrize(
    ("by", "mirror", "on_itself", "admitted"),
    [
        pytest.param("node", True, True, True, id="a-nodes-own-mirror-is-admitted-with-a-warning"),
        pytest.param("tenant", True, True, False, id="a-tenants-mirror-is-refused"),
        pytest.param("node", True, False, False, id="a-nodes-mirror-bound-to-another-node-is-refused"),
        pytest.param("node", False, True, False, id="a-nodes-pod-that-is-no-mirror-is-refused"),
    ],
)
def test_a_nodes_own_mirror_pod_is_only_warned_about(
    control_plane: ControlPlane, door: Door, by: str, mirror: bool, on_itself: bool, admitted: bool
) -> None:
    """A node's mirror of its static pod, 32Gi in a namespace capped at 16Gi, is admitted with the agent's words as
    a warning: refusing it would not stop the static pod, only hide it from the agent, which enforces its quota. A
    pod with the mirror annotation from a tenant, one a node binds to another node, and a node's pod without the
    annotation are judged as any pod (the test API server runs without NodeRestriction, so they reach the door)."""
    namespace = door.namespaces["16Gi"]
    node_name = f"static-{uuid.uuid4().hex[:8]}"
    node = control_plane.add_node(node_name)
    pod = BY_NAME[LIMIT].pod("32Gi", f"static-{node_name}", namespace)
    if mirror:
        pod = _mirror_of(pod, node, node_name if on_itself else "another-node")
    else:
        pod["spec"]["nodeName"] = node_name
    (expected,) = agent_says(door, pod) or [""]
    assert expected == f'metadata.annotations[{LIMIT}]: "32Gi" is over the namespace max_quota 16Gi'
    with contextlib.ExitStack() as stack:
        if by == "node":
            api = stack.enter_context(kubeconfig_api_client(control_plane.node_kubeconfig(node_name)))
        else:
            with control_plane.api_client() as admin:
                api = stack.enter_context(_tenant_core(control_plane, admin, namespace))
        core = client.CoreV1Api(api)
        try:
            _, status, headers = core.create_namespaced_pod_with_http_info(namespace, _body(pod), dry_run="All")
        except client.ApiException as e:
            assert not admitted, f"refused: {e.body}"
            message = str(json.loads(e.body or "{}")["message"])
            assert e.status == 422 and f"ValidatingAdmissionPolicy '{door.name}'" in message and expected in message
            return
    assert admitted and status == 201
    warnings = _warnings(headers)
    assert any(f"'{door.name}-mirrors'" in w and expected in w for w in warnings), warnings


@pytest.fixture
def own_door(control_plane: ControlPlane) -> Iterator[Door]:
    """A door of its own, for a test that edits its policy ConfigMap: one namespace, capped at 16Gi."""
    namespace = f"edited-{uuid.uuid4().hex[:8]}"
    values = {"policy": {"exempt_namespaces": [EXEMPT], "namespaces": {namespace: {"max_quota": "16Gi"}}}}
    with control_plane.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        name = _create_door(api, values, namespace, warn=False)
        release = name.removesuffix("-quota-values")
        try:
            yield Door(core, name, _chart_policy(values), {"16Gi": namespace}, (release, f"{release}-policy"))
        finally:
            _delete_door(api, name)


@pytest.mark.parametrize(
    ("edit", "value", "refused_after"),
    [
        pytest.param({"namespaces.{ns}.max_quota": "8Gi"}, "12Gi", True, id="a-lowered-cap-refuses"),
        pytest.param({"namespaces.{ns}.max_quota": "32Gi"}, "24Gi", False, id="a-raised-cap-admits"),
        pytest.param({"exempt_namespaces": "kube-system, {ns}"}, "24Gi", False, id="an-exempted-namespace-admits"),
        pytest.param({"quota_sources": "resource:vramguard.io/vram"}, "24Gi", False, id="a-source-no-longer-read"),
    ],
)
def test_an_edit_of_the_policy_config_map_is_in_force_at_the_door_within_a_minute(
    own_door: Door, edit: dict[str, str], value: str, refused_after: bool
) -> None:
    """The door takes its caps, exempt namespaces and quota sources from the agents' policy ConfigMap: one edit of
    it (docs/rollout.md "Changing the policy") turns the door's verdict on a vram-limit annotation, within a minute,
    into what an agent that reads the edited ConfigMap says."""
    namespace = own_door.namespaces["16Gi"]
    pod = BY_NAME[LIMIT].pod(value, "edited", namespace)
    assert (refusal(own_door, pod) is not None) is not refused_after, "before the edit"
    config_namespace, config_map = own_door.config_map
    data = {key.format(ns=namespace): text.format(ns=namespace) for key, text in edit.items()}
    edited = own_door.core.patch_namespaced_config_map(
        config_map, config_namespace, {"data": data}, _content_type=MERGE
    )
    started = time.monotonic()
    agent = agent_says(own_door, pod, _agent_policy(edited.data or {}))
    assert agent is not None and bool(agent) is refused_after, f"the agent, reading the edited ConfigMap: {agent}"

    def turned() -> bool:
        refused = refusal(own_door, pod)
        if refused is None:
            return not refused_after
        return refused_after and all(text in refused[1] for text in agent)

    wait_until(turned, 60, what="the door's verdict after the edit", interval_s=0.1)
    print(f"{edit}: in force at the door {time.monotonic() - started:.2f} s after the edit")


def test_a_resource_quota_holds_the_namespace_total(control_plane: ControlPlane, namespace: str) -> None:
    """`requests.vramguard.io/vram: 16Gi` counts each container's request of the extended resource (its limit,
    where only a limit is given) across the namespace: with 8Gi and 6Gi admitted, 4Gi more is refused by the
    API server's ResourceQuota admission and 2Gi admitted. An annotation is no request: it is not counted."""
    with control_plane.api_client() as api:
        _hold_the_total(control_plane, client.CoreV1Api(api), namespace)


def _hold_the_total(control_plane: ControlPlane, core: client.CoreV1Api, namespace: str) -> None:
    quota = client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="vram"),
        spec=client.V1ResourceQuotaSpec(hard={f"requests.{VRAM}": "16Gi"}),
    )
    core.create_namespaced_resource_quota(namespace, quota)
    # The quota's status (what is used) comes from kube-controller-manager; the admission plugin refuses every pod
    # of the namespace until it is there.
    manager = control_plane.start_controller_manager(controllers="resourcequota-controller")
    try:

        def used() -> str | None:
            status = core.read_namespaced_resource_quota("vram", namespace).status
            return (status.used or {}).get(f"requests.{VRAM}") if status is not None else None

        wait_until(used, 30, "the quota's status", interval_s=0.1)
        # Created for real, not dry runs: the admission plugin then writes each pod's usage into the quota's status
        # as it admits it (a conflict makes it read the quota afresh), so no verdict rests on a stale copy.
        for name, vram in (("a", "8Gi"), ("b", "6Gi")):
            core.create_namespaced_pod(namespace, _body(BY_NAME[VRAM].pod(vram, name, namespace)))
        with pytest.raises(client.ApiException) as over:
            core.create_namespaced_pod(namespace, _body(BY_NAME[VRAM].pod("4Gi", "c", namespace)))
        assert over.value.status == 403
        message = json.loads(over.value.body or "{}")["message"]
        request = f"requests.{VRAM}"
        assert (
            f"exceeded quota: vram, requested: {request}=4Gi, used: {request}=14Gi, limited: {request}=16Gi" in message
        )
        core.create_namespaced_pod(namespace, _body(BY_NAME[VRAM].pod("2Gi", "d", namespace)))
        core.create_namespaced_pod(namespace, _body(BY_NAME[LIMIT].pod("32Gi", "e", namespace)))
        assert used() == "16Gi"
    finally:
        manager.stop()
