"""The Helm chart deploy/helm/vramguard: lint, what its values render to, and the plain manifest generated from it.

helm is built from the Go module proxy by scripts/helm.sh (scripts/test.sh runs it first) into the tool cache;
without it these tests skip, or fail under CI. The API server's own validation of the rendered objects is in
tests/cluster/test_chart.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from helm_fixtures import CHART, KUBE_VERSION, container, need_helm, one, render
from vramguard.agent.metrics import Metrics
from vramguard.core.decide import Decision
from vramguard.core.policy import DEFAULT_QUOTA_SOURCES, Mode, NamespacePolicy, Policy, PolicyText, policy_from_text
from vramguard.core.quantity import GiB
from vramguard.core.sources import BURST_ANNOTATION
from vramguard_testbed.fakes import SnapshotBuilder, gpu, pod

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def helm() -> Path:
    return need_helm()


EVERYTHING = (
    "serviceMonitor.enabled=true",
    "prometheusRule.enabled=true",
    "privileged=true",
    "advertiseCapacity=true",
    "runtimeClassName=nvidia",
    "imagePullSecrets[0].name=registry",
    "hostNetwork=true",
)


@pytest.mark.parametrize("sets", [pytest.param((), id="defaults"), pytest.param(EVERYTHING, id="everything-on")])
def test_chart_lints_strictly(helm: Path, sets: tuple[str, ...]) -> None:
    args = [str(helm), "lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION]
    for s in sets:
        args += ["--set", s]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_plain_manifest_is_the_rendered_chart(helm: Path, tmp_path: Path) -> None:
    """deploy/daemonset.yaml is generated from the chart: edit the chart, then run scripts/render-manifest.sh."""
    out = tmp_path / "daemonset.yaml"
    subprocess.run(["bash", str(REPO / "scripts" / "render-manifest.sh"), str(out)], check=True, timeout=300)
    assert out.read_text() == (REPO / "deploy" / "daemonset.yaml").read_text(), "run bash scripts/render-manifest.sh"


@pytest.mark.parametrize(
    ("sets", "check"),
    [
        pytest.param((), lambda p: p.mode is Mode.WARN and p.pressure_transition_s == 30.0, id="defaults"),
        pytest.param(("policy.mode=kill",), lambda p: p.mode is Mode.KILL, id="set-mode"),
        pytest.param(("policy.cooldown=5m",), lambda p: p.cooldown_s == 300.0, id="set-a-duration"),
        pytest.param(
            ("policy.namespaces.team-a.max_quota=16Gi",),
            lambda p: p.cap_for("team-a") == 16 * 2**30,
            id="add-a-namespace",
        ),
        pytest.param(
            ("policy.namespaces.team-a.max_quota=16Gi", "policy.namespaces.team-a.mode=kill"),
            lambda p: p.namespaces["team-a"] == NamespacePolicy(mode=Mode.KILL, max_quota_bytes=16 * GiB),
            id="a-namespace-in-both-parts",
        ),
        pytest.param(
            ("policy.exempt_namespaces={kube-system,infra}", "policy.quota_sources={annotation:gpu-memory}"),
            lambda p: p.exempt_namespaces == {"kube-system", "infra"} and p.quota_sources == ("annotation:gpu-memory",),
            id="lists",
        ),
    ],
)
def test_policy_values_are_the_policy_file(helm: Path, sets: tuple[str, ...], check: Any) -> None:
    """`policy` is the whole policy file as a map; what it renders is a policy the agent, pointed at the ConfigMap's
    volume, accepts."""
    objects = render(helm, *sets)
    assert "--policy=/etc/vramguard" in container(objects)["args"]
    assert check(policy_from_text(PolicyText.of_config_map(one(objects, "ConfigMap")["data"]), "chart"))


def test_the_doors_fields_are_keys_of_their_own(helm: Path) -> None:
    """The fields the quota admission policy reads are the ConfigMap's keys, as written in the values, and not in
    policy.yaml; a namespace with nothing but a cap is left out of it."""
    values = {
        "policy": {
            "exempt_namespaces": ["kube-system", "infra"],
            "namespaces": {"ml": {"max_quota": 17179869184}, "web": {"max_quota": "1.5Gi", "mode": "kill"}},
        }
    }
    data = one(render(helm, values=values), "ConfigMap")["data"]
    assert {k: v for k, v in data.items() if k != "policy.yaml"} == {
        "exempt_namespaces": "kube-system, infra",
        "namespaces.ml.max_quota": "17179869184",
        "namespaces.web.max_quota": "1.5Gi",
    }
    document = yaml.safe_load(data["policy.yaml"])
    assert document["namespaces"] == {"web": {"mode": "kill"}} and "exempt_namespaces" not in document


def test_a_policy_value_the_agent_would_refuse_is_refused_at_install(helm: Path) -> None:
    result = subprocess.run(
        [str(helm), "template", "x", str(CHART), "--kube-version", KUBE_VERSION, "--set", "policy.mode=explode"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and "/policy/mode" in result.stderr


def test_defaults_are_a_gpu_node_agent(helm: Path) -> None:
    objects = render(helm)
    spec = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["priorityClassName"] == "system-node-critical" and spec["hostPID"] is True
    assert "runtimeClassName" not in spec
    c = container(objects)
    assert c["image"] == "ghcr.io/vramguard/vramguard:0.1.0"
    assert c["securityContext"] == NARROW
    assert "--advertise-capacity" not in c["args"]
    assert {o["kind"] for o in objects}.isdisjoint({"Service", "ServiceMonitor", "PrometheusRule"})


def test_values_reach_the_pod(helm: Path) -> None:
    objects = render(
        helm,
        *EVERYTHING,
        "image.repository=registry.local/vramguard",
        "image.tag=dev",
        "extraArgs={--dry-run,--poll-interval=0.5}",
        "capacityReserve=2Gi",
        "metrics.port=9500",
        "podAnnotations.team=gpu",
    )
    spec = one(objects, "DaemonSet")["spec"]["template"]
    c = container(objects)
    assert c["image"] == "registry.local/vramguard:dev"
    assert c["args"][-4:] == ["--advertise-capacity", "--capacity-reserve=2Gi", "--dry-run", "--poll-interval=0.5"]
    assert "--metrics-port=9500" in c["args"]
    assert c["ports"] == [{"name": "metrics", "containerPort": 9500}]
    assert spec["spec"]["runtimeClassName"] == "nvidia"
    assert spec["spec"]["hostNetwork"] is True and spec["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert spec["spec"]["imagePullSecrets"] == [{"name": "registry"}]
    assert spec["metadata"]["annotations"]["team"] == "gpu"
    assert spec["metadata"]["annotations"]["prometheus.io/port"] == "9500"
    assert one(objects, "Service")["spec"]["ports"][0]["port"] == 9500


def test_a_policy_change_reloads_in_place_and_rolls_the_agents_only_when_asked(helm: Path) -> None:
    """By default the pod template does not carry the policy's checksum: a `helm upgrade` of the policy changes the
    ConfigMap alone, which each agent reloads; `policyReload.rollOnChange` puts the rolling annotation back."""

    def annotations(*sets: str) -> dict[str, str]:
        found: dict[str, str] = one(render(helm, *sets), "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
        return found

    assert "checksum/policy" not in annotations()
    assert annotations("policy.mode=kill") == annotations(), "a policy change leaves the pods as they are"
    rolled = annotations("policyReload.rollOnChange=true")
    assert (
        rolled["checksum/policy"]
        != annotations("policyReload.rollOnChange=true", "policy.mode=kill")["checksum/policy"]
    )
    mount = next(m for m in container(render(helm))["volumeMounts"] if m["name"] == "policy")
    assert "subPath" not in mount, "a subPath mount is never updated by the kubelet: no reload could see a change"


def test_the_kubelet_probes_read_the_health_file(helm: Path) -> None:
    """Liveness and readiness are exec probes of the health file the agent is told to write, in a memory-backed
    volume of the pod's own: no port is probed, so no connection to one can fail them."""
    objects = render(helm)
    c = container(objects)
    health = "/run/vramguard/health"
    assert c["livenessProbe"]["exec"]["command"] == ["vramguard-probe", "live", "--file", health]
    assert c["readinessProbe"]["exec"]["command"] == ["vramguard-probe", "ready", "--file", health]
    assert f"--health-file={health}" in c["args"]
    assert {"name": "run", "mountPath": "/run/vramguard"} in c["volumeMounts"]
    volumes = one(objects, "DaemonSet")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}} in volumes
    assert [p["name"] for p in c["ports"]] == ["metrics"]


def test_pod_network_by_default(helm: Path) -> None:
    spec = one(render(helm), "DaemonSet")["spec"]["template"]["spec"]
    assert "hostNetwork" not in spec and "dnsPolicy" not in spec


def test_args_replace_the_defaults(helm: Path) -> None:
    c = container(render(helm, "args={run,--mode=warn}", "extraArgs={--dry-run}"))
    assert c["args"] == ["run", "--mode=warn", "--dry-run"]


# The chart's default security context: what the agent needs, each item with its reason in values.yaml.
NARROW_CAPABILITIES = ["KILL", "SYS_PTRACE", "DAC_READ_SEARCH"]
NARROW: dict[str, Any] = {
    "privileged": False,
    "runAsUser": 0,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"], "add": NARROW_CAPABILITIES},
    "seccompProfile": {"type": "RuntimeDefault"},
    "appArmorProfile": {"type": "Unconfined"},
}


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        pytest.param((), NARROW, id="default"),
        pytest.param(("privileged=false",), NARROW, id="privileged-false"),
        pytest.param(("privileged=true",), {"privileged": True, "runAsUser": 0}, id="privileged-opt-in"),
        pytest.param(
            ("securityContext.capabilities.add={KILL,SYS_PTRACE,DAC_READ_SEARCH,SYS_ADMIN}",),
            {**NARROW, "capabilities": {"drop": ["ALL"], "add": [*NARROW_CAPABILITIES, "SYS_ADMIN"]}},
            id="a-capability-added",
        ),
        pytest.param(
            ("privileged=true", "securityContext.capabilities.add={SYS_ADMIN}"),
            {"privileged": True, "runAsUser": 0},
            id="privileged-ignores-the-narrow-context",
        ),
    ],
)
def test_security_context(helm: Path, sets: tuple[str, ...], expected: dict[str, Any]) -> None:
    assert container(render(helm, *sets))["securityContext"] == expected


def test_the_old_hardened_value_is_refused_naming_its_replacement(helm: Path) -> None:
    for value in ("true", "false"):
        result = subprocess.run(
            [str(helm), "template", "x", str(CHART), "--kube-version", KUBE_VERSION, "--set", f"hardened={value}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode != 0 and "/hardened" in result.stderr and "privileged" in result.stderr


def test_every_privilege_has_its_reason_in_values(helm: Path) -> None:
    """Each capability the narrow context adds has a comment on its line or just above it, and each node path
    the pod gets (its hostPath volumes, hostPID's /proc) is named in the values' comments: adding one without
    saying why fails here. The hostPaths are the three the agent needs, whichever `privileged` says."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    for cap in NARROW_CAPABILITIES:
        (at,) = [i for i, line in enumerate(lines) if line.strip().startswith(f"- {cap}")]
        assert "#" in lines[at] or lines[at - 1].strip().startswith("#"), f"{cap} without its reason"
    comments = "\n".join(line for line in lines if line.strip().startswith("#"))
    for sets in ((), ("privileged=true",)):
        spec = one(render(helm, *sets), "DaemonSet")["spec"]["template"]["spec"]
        host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
        assert host_paths == {"/sys/fs/cgroup", "/var/lib/vramguard", "/var/log/pods"}
        assert spec["hostPID"] is True
        for path in [*host_paths, "hostPID"]:
            assert path in comments, f"{path} is not explained in values.yaml"


def test_admission_policy_names_the_releases_service_account(helm: Path) -> None:
    objects = render(helm, release="gpu-guard", namespace="ops")
    own_node = one(objects, "ValidatingAdmissionPolicy", "-own-node-only")
    condition = own_node["spec"]["matchConditions"][0]["expression"]
    assert "system:serviceaccount:ops:gpu-guard" in condition
    binding = one(objects, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-guard", "namespace": "ops"}]
    assert one(objects, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"] == "gpu-guard"


def _quota_policy(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The quota admission policy's spec and its binding's."""
    policy = one(objects, "ValidatingAdmissionPolicy", "-quota-values")
    return policy["spec"], one(objects, "ValidatingAdmissionPolicyBinding", "-quota-values")["spec"]


def _fields(spec: dict[str, Any]) -> str:
    (fields,) = [v["expression"] for v in spec["variables"] if v["name"] == "fields"]
    assert isinstance(fields, str)
    return fields


def _read(fields: str) -> list[str]:
    """The quota fields a rendered policy reads, as quota sources, in its order: each source it judges where the
    policy names it, then the burst annotation, which it always judges."""
    found = re.findall(r"'((?:resource|annotation|env):[^']+)' in variables\.sources", fields)
    annotations = re.findall(r"'field': 'metadata\.annotations\[([^\]]+)\]'", fields)
    return found + [f"annotation:{a}" for a in annotations if f"annotation:{a}" not in found]


def test_quota_admission_policy_reads_the_agents_policy_config_map(helm: Path) -> None:
    """The policy takes the release's policy ConfigMap as its parameters, judges every field of a known source
    (those the ConfigMap's quota_sources names, by default DEFAULT_QUOTA_SOURCES) and the burst annotation, refuses
    (Deny), and skips the namespaces the agent exempts: the ConfigMap's exempt_namespaces (by default the agent's
    default) and the release's."""
    objects = render(helm, release="gpu-guard", namespace="ops")
    spec, binding = _quota_policy(objects)
    assert _read(_fields(spec)) == [*DEFAULT_QUOTA_SOURCES, f"annotation:{BURST_ANNOTATION}"]
    assert spec["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
    assert binding["paramRef"] == {"name": "gpu-guard-policy", "namespace": "ops", "parameterNotFoundAction": "Deny"}
    config_map = one(objects, "ConfigMap")["metadata"]
    assert (config_map["name"], config_map["namespace"]) == ("gpu-guard-policy", "ops")
    assert binding["validationActions"] == ["Deny"] and binding["policyName"] == "gpu-guard-quota-values"
    (release,) = spec["matchConstraints"]["namespaceSelector"]["matchExpressions"]
    assert release == {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["ops"]}
    exempt = _condition(spec, "not-exempt")
    assert "params.data['exempt_namespaces']" in exempt
    assert f"'{', '.join(sorted(Policy().exempt_namespaces))}'" in exempt, "the agent's default without the key"
    (sources,) = [v["expression"] for v in spec["variables"] if v["name"] == "sources"]
    assert f"'{', '.join(DEFAULT_QUOTA_SOURCES)}'" in sources, "the agent's default without the key"
    (cap,) = [v["expression"] for v in spec["variables"] if v["name"] == "capText"]
    assert cap == "variables.keys[?'namespaces.' + request.namespace + '.max_quota'].orValue('')"
    assert spec["failurePolicy"] == "Ignore"


def _condition(spec: dict[str, Any], name: str) -> str:
    (expression,) = [c["expression"] for c in spec["matchConditions"] if c["name"] == name]
    assert isinstance(expression, str)
    return expression


def test_a_nodes_mirror_pods_are_judged_by_a_policy_that_only_warns(helm: Path) -> None:
    """The quota policy skips a node's own mirror pods; a second one, alike but for its match condition, judges
    them and only warns (also with `admission.action: Deny`), since refusing a mirror never stops its static pod."""
    objects = render(helm)
    spec, binding = _quota_policy(objects)
    mirrors = one(objects, "ValidatingAdmissionPolicy", "-quota-values-mirrors")["spec"]
    mirrors_binding = one(objects, "ValidatingAdmissionPolicyBinding", "-quota-values-mirrors")["spec"]
    assert mirrors_binding["validationActions"] == ["Warn", "Audit"] and binding["validationActions"] == ["Deny"]
    assert mirrors_binding["paramRef"] == binding["paramRef"]
    node_mirror = _condition(mirrors, "a-nodes-mirror-pod")
    assert _condition(spec, "not-a-nodes-mirror-pod") == f"!{node_mirror}"
    for part in ("startsWith('system:node:')", "'system:nodes' in", "'kubernetes.io/config.mirror' in", "nodeName"):
        assert part in node_mirror
    assert {**mirrors, "matchConditions": None} == {**spec, "matchConditions": None}


def test_quota_admission_values(helm: Path) -> None:
    """`admission.action: Warn` binds the policy to warn; `admission.enabled: false` renders no policy at all."""
    _, binding = _quota_policy(render(helm, "admission.action=Warn"))
    assert binding["validationActions"] == ["Warn"]
    kinds = {(o["kind"], o["metadata"]["name"]) for o in render(helm, "admission.enabled=false")}
    assert ("ValidatingAdmissionPolicy", "vramguard-quota-values") not in kinds
    assert ("ValidatingAdmissionPolicy", "vramguard-quota-values-mirrors") not in kinds
    assert ("ValidatingAdmissionPolicy", "vramguard-own-node-only") in kinds


@pytest.mark.parametrize(
    ("sets", "error"),
    [
        pytest.param(("admission.action=Audit",), "/admission/action", id="an-action-that-is-not-deny-or-warn"),
        pytest.param(
            ("policy.quota_sources={resource:example.com/vram}",), "example.com/vram", id="a-source-of-unknown-unit"
        ),
    ],
)
def test_quota_admission_values_the_agent_would_refuse_are_refused_at_install(
    helm: Path, sets: tuple[str, ...], error: str
) -> None:
    args = [str(helm), "template", "x", str(CHART), "--kube-version", KUBE_VERSION]
    for s in sets:
        args += ["--set", s]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and error in result.stderr


def _exported_metric_names() -> set[str]:
    """Every series name the agent's registry can expose, after one scan (the per-GPU gauges appear with it, the
    claim source's with a claim source)."""
    metrics = Metrics()
    p = pod("trainer", "ml")
    snapshot = SnapshotBuilder().use(p, "main", gpu(0), GiB).build()
    metrics.observe_scan(snapshot, Decision(actions=(), violations=()), claim_source_up=True)
    names = set()
    for family in metrics.registry.collect():
        names.add(family.name)
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "histogram":
            names.update(family.name + suffix for suffix in ("_bucket", "_count", "_sum"))
        names.update(sample.name for sample in family.samples)
    return names


def test_monitoring_objects_select_the_agent_and_alert_on_real_metrics(helm: Path) -> None:
    objects = render(
        helm, "serviceMonitor.enabled=true", "serviceMonitor.labels.release=prom", "prometheusRule.enabled=true"
    )
    monitor, service = one(objects, "ServiceMonitor"), one(objects, "Service")
    pod_labels = one(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    rules = one(objects, "PrometheusRule")["spec"]["groups"][0]["rules"]
    alerts = {r["alert"] for r in rules}
    assert {
        "VramguardAgentDown",
        "VramguardAgentNotReady",
        "VramguardScansFailing",
        "VramguardScansSlow",
        "VramguardGpuUnhealthy",
        "VramguardActionsFailing",
        "VramguardEventsDropped",
        "VramguardUnattributedMemoryGrowing",
        "VramguardDriverLimitsFailing",
        "VramguardClaimSourceDown",
        "VramguardRelisting",
    } <= alerts
    exported = _exported_metric_names()
    for rule in rules:
        used = set(re.findall(r"\bvramguard_[a-z_]+", rule["expr"]))
        assert used <= exported, f"{rule['alert']} uses metrics the agent does not export: {used - exported}"


def test_network_policy_admits_the_scraper_and_the_api_servers_proxy(helm: Path) -> None:
    """Off by default; on, it admits the scraper's namespace and, for kubectl vramguard, the API server's
    addresses, both to the metrics port (the only one: the probes are exec probes)."""
    assert not [o for o in render(helm) if o["kind"] == "NetworkPolicy"]
    objects = render(
        helm,
        "networkPolicy.enabled=true",
        "networkPolicy.scraperNamespace=prom",
        "networkPolicy.apiServerCIDRs={10.0.0.10/32,10.0.0.11/32}",
        "metrics.port=9500",
    )
    policy = one(objects, "NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"] == one(objects, "DaemonSet")["spec"]["selector"]["matchLabels"]
    scraper, proxy = policy["ingress"]
    assert scraper["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "prom"}}}]
    assert proxy["from"] == [{"ipBlock": {"cidr": "10.0.0.10/32"}}, {"ipBlock": {"cidr": "10.0.0.11/32"}}]
    assert scraper["ports"] == proxy["ports"] == [{"protocol": "TCP", "port": 9500}]
    only_scraper = one(render(helm, "networkPolicy.enabled=true"), "NetworkPolicy")["spec"]["ingress"]
    assert len(only_scraper) == 1


# Where the driver lives: one values file per platform (docs/install.md "Platform profiles"), and what each sets.
PROFILES = CHART / "profiles"
PROFILE_EXPECTED = {
    # profile: (driver.root, privileged, runtimeClassName)
    "nvidia-runtime": ("", False, None),
    "gpu-operator": ("/run/nvidia/driver", True, None),
    "gke": ("/home/kubernetes/bin/nvidia", True, None),
    "eks-al2023": ("", False, None),
    "eks-bottlerocket": ("", False, None),
    "aks": ("", False, None),
    "openshift": ("/run/nvidia/driver", True, None),
    "k3s-rke2": ("", False, "nvidia"),
    "amd-gpu-operator": ("", False, None),
}


def _template(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm), "template", "x", str(CHART), "--kube-version", KUBE_VERSION, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_every_profile_is_tested() -> None:
    """A profile added to profiles/ is added to the table above (and to docs/install.md's and the README's)."""
    assert {p.stem for p in PROFILES.glob("*.yaml")} == set(PROFILE_EXPECTED)
    install = (REPO / "docs" / "install.md").read_text()
    readme = (REPO / "README.md").read_text()
    for name in PROFILE_EXPECTED:
        assert f"profiles/{name}.yaml" in install, f"{name} is not in docs/install.md's table"
        assert f"`{name}.yaml`" in readme, f"{name} is not in the README's compatibility table"


@pytest.mark.parametrize("name", sorted(PROFILE_EXPECTED))
def test_profile_lints_and_renders_what_it_says(helm: Path, name: str) -> None:
    """Each profile passes `helm lint --strict` and the schema, and renders its driver root (mounted read-only, the
    agent told where), its security context and its runtime class."""
    profile = PROFILES / f"{name}.yaml"
    lint = subprocess.run(
        [str(helm), "lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION, "-f", str(profile)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    objects = render(helm, values=yaml.safe_load(profile.read_text()))
    spec = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    c = container(objects)
    root, privileged, runtime_class = PROFILE_EXPECTED[name]
    assert spec.get("runtimeClassName") == runtime_class
    assert c["securityContext"] == ({"privileged": True, "runAsUser": 0} if privileged else NARROW)
    drivers = [v for v in spec["volumes"] if v["name"] == "driver"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    if root:
        assert drivers == [{"name": "driver", "hostPath": {"path": root, "type": "Directory"}}]
        assert env["VRAMGUARD_DRIVER_ROOT"] == "/host/driver"
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == "driver"]
        driver_container = root == "/run/nvidia/driver"  # mounted by the GPU Operator's driver container, maybe late
        assert (mount.get("mountPropagation") == "HostToContainer") is driver_container
    else:
        assert drivers == [] and "VRAMGUARD_DRIVER_ROOT" not in env
    assert spec["nodeSelector"] if name != "gke" else "nodeSelector" not in spec, "every profile selects GPU nodes"


def test_the_amd_profile_selects_the_operators_nodes_and_not_nvidias(helm: Path) -> None:
    """The AMD GPU Operator's NFD label alone (the chart's NVIDIA label nulled: helm merges maps), the amd.com/gpu
    taint tolerated, and no NVIDIA runtime class or driver root: the agent reads sysfs and fdinfo, no library."""
    profile = PROFILES / "amd-gpu-operator.yaml"
    objects = render(helm, values=yaml.safe_load(profile.read_text()))
    spec = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"feature.node.kubernetes.io/amd-gpu": "true"}
    assert {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert "runtimeClassName" not in spec
    assert container(objects)["securityContext"] == NARROW, "fdinfo needs SYS_PTRACE and DAC_READ_SEARCH, no more"


def test_driver_root_is_mounted_read_only_and_named_to_the_agent(helm: Path) -> None:
    """The host directory, read-only at /host/driver (the host's later mounts propagated where asked: a driver
    container that starts after the agent), and the agent (and `vramguard version` in its container) told by
    variable."""
    root = ("driver.root=/run/nvidia/driver", "privileged=true")
    mount = {"name": "driver", "mountPath": "/host/driver", "readOnly": True}
    assert mount in container(render(helm, *root))["volumeMounts"], "no propagation by default: a private / refuses it"
    objects = render(
        helm, *root, "driver.mountPropagation=HostToContainer", "driver.nvmlLibrary=usr/lib64/libnvidia-ml.so.1"
    )
    c = container(objects)
    assert {**mount, "mountPropagation": "HostToContainer"} in c["volumeMounts"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["VRAMGUARD_DRIVER_ROOT"] == "/host/driver"
    assert env["VRAMGUARD_NVML_LIBRARY"] == "usr/lib64/libnvidia-ml.so.1"
    assert "LD_LIBRARY_PATH" not in env


@pytest.mark.parametrize(
    ("sets", "refused"),
    [
        pytest.param(("driver.root=/home/kubernetes/bin/nvidia",), True, id="root-without-the-devices-refused"),
        pytest.param(("driver.root=/run/nvidia/driver", "privileged=true"), False, id="privileged-gets-the-devices"),
        pytest.param(
            ("driver.root=/run/nvidia/driver", "driver.devicesFromRuntime=true"), False, id="runtime-gives-devices"
        ),
        pytest.param(("driver.nvmlLibrary=/opt/nvidia/libnvidia-ml.so.1",), False, id="a-library-alone-is-a-path"),
    ],
)
def test_driver_root_without_the_device_nodes_is_refused_naming_the_values(
    helm: Path, sets: tuple[str, ...], refused: bool
) -> None:
    """NVML opens /dev/nvidia*, which an unprivileged container gets only from the runtime: `driver.root` alone
    would make an agent that never gets ready, so the chart refuses it and names the two values that fix it."""
    args = [a for s in sets for a in ("--set", s)]
    result = _template(helm, *args)
    if refused:
        assert result.returncode != 0
        assert "privileged=true" in result.stderr and "driver.devicesFromRuntime=true" in result.stderr
        assert "/dev/nvidiactl" in result.stderr
    else:
        assert result.returncode == 0, result.stderr
        narrow = "privileged=true" not in sets
        assert (container(render(helm, *sets))["securityContext"] == NARROW) is narrow


def test_a_relative_driver_root_is_refused_by_the_schema(helm: Path) -> None:
    result = _template(helm, "--set", "driver.root=run/nvidia/driver", "--set", "privileged=true")
    assert result.returncode != 0 and "/driver/root" in result.stderr


def test_openshift_scc_lets_the_service_account_use_it(helm: Path) -> None:
    """Off by default; `openshift.scc=privileged` binds the release's ServiceAccount to OpenShift's ClusterRole that
    grants `use` on that SCC, in the release's namespace."""
    assert not [o for o in render(helm) if o["kind"] == "RoleBinding"]
    objects = render(helm, "openshift.scc=privileged", "privileged=true", release="gpu-guard", namespace="ops")
    binding = one(objects, "RoleBinding", "-scc")
    assert binding["metadata"]["namespace"] == "ops"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "system:openshift:scc:privileged",
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-guard", "namespace": "ops"}]
