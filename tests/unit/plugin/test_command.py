"""The `kubectl vramguard` command: exit codes, the context's namespace, output and colour flags, --watch."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from typer.testing import CliRunner

from vramguard.core.quantity import GiB
from vramguard.plugin import fetch
from vramguard.plugin.command import build_app
from vramguard.plugin.merge import Answer, Failure, Fetched
from vramguard.plugin.prometheus import PEAK_METRIC, SLICES
from vramguard_testbed.fakes import FakeClock

from .agents import FakeCore, FakeResponse, agent_pod, answer, core_for, fleet, gpu_doc, ref, status_exception
from .fake_prometheus import AGENT_TARGET, TENANT_TARGET, Store, fake_prometheus
from .objects import by_kind, template, workload
from .test_prometheus import FORGED, gauge, gpu_total


def invoke(core: FakeCore, *args: str, colour: bool = False, namespace: str = "team-a") -> Any:
    app = build_app(connect=lambda kubeconfig, context: (core, namespace), clock=FakeClock(), colour=lambda: colour)
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize(
    ("fetched", "args", "code"),
    [
        pytest.param(fleet(), ["top", "-A"], 0, id="partial-is-fine"),
        pytest.param(fleet(), ["top", "-A", "--strict"], 1, id="partial-strict"),
        pytest.param(fleet()[:3], ["top", "-A", "--strict"], 0, id="whole-strict"),
        pytest.param(fleet(), ["nodes", "--strict"], 1, id="nodes-partial-strict"),
        pytest.param(fleet(), ["nodes"], 0, id="nodes-partial"),
        pytest.param([], ["top"], 1, id="no-agents"),
        pytest.param(fleet(), ["top", "-n", "x", "-A"], 2, id="n-and-A"),
    ],
)
def test_exit_codes(fetched: list[Fetched], args: list[str], code: int) -> None:
    """The command exits 0 on a partial answer, 1 on one with --strict or with no agents, and 2 on a usage error."""
    result = invoke(core_for(fetched), *args)
    assert result.exit_code == code, result.output


def test_top_defaults_to_the_contexts_namespace() -> None:
    """`top` without -n or -A shows the context's namespace, and the agents that did not answer."""
    result = invoke(core_for(fleet()), "top")
    pods = {line.split()[3] for line in result.stdout.splitlines()[1:]}
    assert pods == {"train", "big", "-"}  # team-a's, and the agent that did not answer


def test_top_json_from_the_command() -> None:
    """`top -o json` with --node and --sort-by prints that node's rows in that order."""
    result = invoke(core_for(fleet()), "top", "-A", "--node", "node-a", "--sort-by", "used", "-o", "json")
    items = json.loads(result.stdout)["items"]
    assert [i["pod"] for i in items] == ["train", "serve", "big", "-"]


def test_colour_from_the_command() -> None:
    """Both tables are coloured when the terminal takes colour, and plain when it does not."""
    assert "\x1b[" in invoke(core_for(fleet()), "top", "-A", colour=True).stdout
    assert "\x1b" not in invoke(core_for(fleet()), "top", "-A", colour=False).stdout
    assert "\x1b[" in invoke(core_for(fleet()), "nodes", colour=True).stdout


def test_watch_reads_again_until_stopped() -> None:
    """--watch reads the agents and prints again each interval until stopped."""
    clock = FakeClock()
    stop = threading.Event()
    core = core_for(fleet())
    app = build_app(connect=lambda k, c: (core, "default"), clock=clock, stop=stop, colour=lambda: False)
    clock.on_wait = lambda: stop.set() if len(clock.waits) == 3 else None
    result = CliRunner().invoke(app, ["nodes", "--watch", "--interval", "5"])
    assert result.exit_code == 0, result.output
    assert clock.waits == [5.0, 5.0, 5.0]
    assert len(core.lists) == 3
    assert result.stdout.count("NODE") == 3


def test_a_forbidden_list_says_which_role_to_bind() -> None:
    """A forbidden pod list exits 1, naming the 403 and the vramguard-viewer role to bind."""

    class Forbidden(FakeCore):
        def list_pod_for_all_namespaces(self, **kw: Any) -> FakeResponse:
            raise status_exception(403, "Forbidden", "pods is forbidden")

    result = invoke(Forbidden([], {}), "top", "-A")
    assert result.exit_code == 1
    assert "403 Forbidden" in result.stderr and "vramguard-viewer" in result.stderr


def test_no_configuration_is_a_usage_error() -> None:
    """A Kubernetes configuration that cannot be loaded is a usage error, exit 2."""

    def connect(kubeconfig: str | None, context: str | None) -> tuple[Any, str]:
        raise fetch.ConfigError("cannot load the Kubernetes configuration: none")

    result = CliRunner().invoke(build_app(connect=connect, colour=lambda: False), ["nodes"])
    assert result.exit_code == 2 and "cannot load" in result.stderr


def test_the_package_installs_the_kubectl_plugin() -> None:
    """The package installs `kubectl-vramguard` as a console script running the command's main."""
    from importlib.metadata import entry_points

    from vramguard.plugin.command import main

    [script] = [e for e in entry_points(group="console_scripts") if e.name == "kubectl-vramguard"]
    assert script.load() is main


# --------------------------------------------------------------------------------------------------------------
# recommend


class FakeReader(fetch.KubeReader):
    """The lists recommend reads, from `objects`, and ConfigMaps by (namespace, name): one not there is forbidden, as
    the recommender role forbids every ConfigMap but the release's policy. `on_list` runs at each list."""

    def __init__(
        self,
        objects: dict[str, list[dict[str, Any]]],
        config_maps: dict[tuple[str, str], dict[str, str]] | None = None,
        on_list: Callable[[], object] = lambda: None,
    ) -> None:
        super().__init__(api=None)
        self.objects, self.on_list = objects, on_list
        self.config_maps = {POLICY: {"policy.yaml": "mode: kill\n"}} if config_maps is None else config_maps
        self.read: list[tuple[str, str]] = []

    def list_objects(
        self, kind: str, namespace: str | None, timeout: tuple[float, float] = fetch.LIST_TIMEOUT
    ) -> list[dict[str, Any]]:
        self.requests += 1
        self.on_list()
        items = self.objects.get(kind, [])
        return [o for o in items if namespace is None or o["metadata"]["namespace"] == namespace]

    def config_map_data(self, namespace: str, name: str, timeout: tuple[float, float]) -> dict[str, str]:
        self.read.append((namespace, name))
        if (namespace, name) not in self.config_maps:
            raise status_exception(403, "Forbidden", f'configmaps "{name}" is forbidden')
        return self.config_maps[(namespace, name)]


POLICY = ("vramguard", "vramguard-policy")  # the release's policy ConfigMap


def peaks_answer(node: str, peaks: list[dict[str, Any]], cover_s: float) -> Fetched:
    found = answer(node, [gpu_doc("0")], [])
    return type(found)(found.agent, {**found.document, "peaks": peaks, "peaks_cover_s": cover_s})


WEB = by_kind(workload("Deployment", "ml", "web", template({"vramguard.io/vram": "4Gi"})))
PEAK = {"namespace": "ml", "pod": "web-7d9f4c8b5-x2b4z", "container": "main", "gpu_uuid": "GPU-0"}


def invoke_recommend(
    *args: str,
    fetched: list[Fetched] | None = None,
    reader: FakeReader | None = None,
    namespace: str = "ml",
    core: FakeCore | None = None,
    clock: FakeClock | None = None,
) -> Any:
    core = core or core_for(fetched if fetched is not None else fleet())
    app = build_app(
        connect=lambda kubeconfig, context: (core, namespace),
        clock=clock or FakeClock(),
        colour=lambda: False,
        connect_reader=lambda kubeconfig, context: (reader or FakeReader(WEB), core, namespace),
    )
    return CliRunner().invoke(app, ["recommend", *args])


def web_store(peak: float = 9 * GiB) -> Store:
    """An agent's peak gauge for the web Deployment's pod, and its GPU's 80GiB."""
    store = Store()
    gauge(store, PEAK_METRIC, peak, pod=PEAK["pod"])
    gpu_total(store, 80 * GiB)
    return store


def test_recommend_from_prometheus() -> None:
    """With --prometheus-url: the peak over the window, the quota in force under the release's policy, the verdict,
    and in JSON the facts and the patch; the agents' targets it read named."""
    with fake_prometheus(web_store()) as (url, asked):
        table = invoke_recommend("--prometheus-url", url)
        doc = json.loads(invoke_recommend("--prometheus-url", url, "-o", "json", "--window", "2w").stdout)
        patch = invoke_recommend("--prometheus-url", url, "-o", "patch").stdout
    assert table.exit_code == 0, table.output
    header, line, agents = table.stdout.splitlines()
    assert header.split() == ["NAMESPACE", "WORKLOAD", "CONTAINER", "PODS", "GPUS", "PEAK", "RECOMMENDED", "QUOTA",
                              "SOURCE", "VERDICT"]  # fmt: skip
    assert line.split() == ["ml", "Deployment/web", "main", "1", "1", "9.0GiB", "11Gi", "4Gi",
                            "limits[vramguard.io/vram]", "would", "have", "been", "killed"]  # fmt: skip
    assert agents == '# agents: up{job="vramguard-metrics",namespace="vramguard"}'
    assert len(asked) == 3 * (2 * SLICES + 3), "the same queries a run, whatever the workloads"
    assert (doc["source"], doc["window"], doc["queries"], doc["headroom"]) == (
        "prometheus",
        "336h",
        2 * SLICES + 3,
        0.2,
    )
    assert doc["agents"] == 'up{job="vramguard-metrics",namespace="vramguard"}'
    (item,) = doc["items"]
    assert (item["kind"], item["name"], item["field"]["value"]) == ("Deployment", "web", "11Gi")
    assert doc["patches"][0]["patch"]["spec"]["template"]["spec"]["containers"][0]["name"] == "main"
    assert patch.startswith("# agents: up{")
    assert patch.splitlines()[1].startswith("kubectl patch deployment web --namespace ml --type strategic --patch '{")


def test_the_selector_follows_the_release_and_can_be_given() -> None:
    """The agents' targets follow --agent-namespace and --release, and --prometheus-selector replaces them."""
    with fake_prometheus(Store()) as (url, asked):
        moved = invoke_recommend("--prometheus-url", url, "--agent-namespace", "gpu", "--release", "vg", "-o", "json")
        given = invoke_recommend("--prometheus-url", url, "--prometheus-selector", 'job="gpu-agents"', "-o", "json")
    assert json.loads(moved.stdout)["agents"] == 'up{job="vg-metrics",namespace="gpu"}'
    assert json.loads(given.stdout)["agents"] == 'up{job="gpu-agents"}'
    assert all('up{job="gpu-agents"}' in q or "gpu_memory_total" in q for q in asked[len(asked) // 2 :])


def test_recommend_reads_only_the_agents_series() -> None:
    """A tenant's exporter scraped by the same Prometheus (its Service named as the chart's) publishes the peak gauge
    at 1297036692682702848 bytes for the web Deployment's pod, and 5GiB for a Deployment that used no GPU: the row
    is the agent's 9GiB, its patch 11Gi, and the other Deployment has no row."""
    store = web_store()
    tenant = {"namespace": "ml", "container": "main", "gpu_uuid": "GPU-0"}
    store.add(PEAK_METRIC, FORGED, TENANT_TARGET, honor_labels=False, pod=PEAK["pod"], **tenant)
    store.add(PEAK_METRIC, 5 * GiB, TENANT_TARGET, honor_labels=False, pod="cpu-only-7d9f4c8b5-q9w2k", **tenant)
    objects = {**WEB, "Deployment": [*WEB["Deployment"], workload("Deployment", "ml", "cpu-only", template())]}
    with fake_prometheus(store) as (url, _):
        doc = json.loads(invoke_recommend("--prometheus-url", url, "-o", "json", reader=FakeReader(objects)).stdout)
        patch = invoke_recommend("--prometheus-url", url, "-o", "patch", reader=FakeReader(objects)).stdout
    assert [(i["name"], i["peak_bytes"], i["field"]["value"]) for i in doc["items"]] == [("web", 9 * GiB, "11Gi")]
    assert str(FORGED) not in patch and "Pi" not in patch and '"11Gi"' in patch


def test_a_peak_over_its_gpus_memory_is_refused_and_named() -> None:
    """A series that passes the selector (a tenant whose scrape keeps the labels it forges) above the memory of the
    GPU it names, or of the largest GPU where its GPU is unknown: refused, named, not taken."""
    store = web_store()
    forged_target = {**AGENT_TARGET}  # honor_labels: every label its exposition sets, `instance` and `job` too
    store.add(PEAK_METRIC, FORGED, forged_target, namespace="ml", pod="web-7d9f4c8b5-q9w2k", container="main",
              gpu_uuid="GPU-0")  # fmt: skip
    store.add(PEAK_METRIC, 81 * GiB, forged_target, namespace="ml", pod="web-7d9f4c8b5-q9w2k", container="main",
              gpu_uuid="GPU-9")  # fmt: skip
    with fake_prometheus(store) as (url, _):
        doc = json.loads(invoke_recommend("--prometheus-url", url, "-o", "json").stdout)
    assert [(i["name"], i["peak_bytes"], i["pods"]) for i in doc["items"]] == [("web", 9 * GiB, 1)]
    forged = "refused as impossible: ml/web-7d9f4c8b5-q9w2k main on GPU-{} peaked at {} bytes, over the GPU's 80.0GiB"
    assert sorted(c for c in doc["caveats"] if c.startswith("refused")) == [
        forged.format(0, FORGED),
        forged.format(9, 81 * GiB),
    ]


def test_a_deep_answer_is_an_error_not_a_traceback() -> None:
    """A 50,000-deep JSON answer exits 1 with a message naming the depth bound."""
    with fake_prometheus(b"[" * 50_000 + b"]" * 50_000) as (url, _):
        result = invoke_recommend("--prometheus-url", url)
    assert result.exit_code == 1 and "nested deeper than 64 levels" in result.stderr, result.output
    assert not isinstance(result.exception, RecursionError)


def test_a_trickling_prometheus_is_cut_at_the_query_deadline() -> None:
    """An answer trickled a byte at a time ends the run at --prometheus-timeout, exit 1."""
    body = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
    with fake_prometheus(body, pace_s=0.1) as (url, _):
        result = invoke_recommend("--prometheus-url", url, "--prometheus-timeout", "1")
    assert result.exit_code == 1 and "no whole answer within 1s" in result.stderr, result.output


def test_the_whole_run_has_a_deadline() -> None:
    """A run whose steps together pass --deadline (the API server slow to list, 50 s a list) ends at the next
    step, exit 1, saying which."""
    clock = FakeClock()
    reader = FakeReader(WEB, on_list=lambda: clock.step(50.0))
    with fake_prometheus(web_store()) as (url, _):
        result = invoke_recommend("--prometheus-url", url, reader=reader, clock=clock)
    assert result.exit_code == 1, result.output
    assert "ran past its --deadline of 120s before listing the DaemonSets" in result.stderr


def test_recommend_from_the_agents_says_what_they_cover() -> None:
    """Without a Prometheus: the agents' own peaks (their pods' owners placing gone pods), and caveats saying
    they cover the time since each agent started, and which agent did not answer."""
    gone = {**PEAK, "pod": "web-5c6d7f8b9-q9w2k", "owner": "ReplicaSet/web-5c6d7f8b9", "peak_bytes": 3 * GiB}
    fetched = [
        peaks_answer("node-a", [{**PEAK, "owner": "ReplicaSet/web-7d9f4c8b5", "peak_bytes": 2 * GiB}], 3600.0),
        peaks_answer("node-b", [gone], 7200.0),
        Failure(ref("node-c"), "503 Service Unavailable: connection refused"),
    ]
    result = invoke_recommend(fetched=fetched, reader=FakeReader(WEB, config_maps={}))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[1].split()[:8] == ["ml", "Deployment/web", "main", "2", "1", "3.0GiB", "3840Mi", "4Gi"]
    assert lines[2] == "# agents: DaemonSet vramguard/vramguard"
    assert lines[3].startswith("# no --prometheus-url: the peaks are the agents' own, since each agent started")
    assert "(1h to 2h)" in lines[3]
    assert lines[4] == (
        "# no answer from vramguard/vramguard-node-c on node-c: 503 Service Unavailable: connection refused"
    )
    assert lines[5] == (
        '# the default policy: cannot read vramguard/vramguard-policy: 403 Forbidden: configmaps "vramguard-policy" '
        "is forbidden (bind the vramguard-recommender ClusterRole)"
    )


def test_without_prometheus_only_the_releases_agents_and_policy_are_read() -> None:
    """A tenant's pod with the chart's labels, in its own namespace (its /status claiming 10^30 bytes for the web
    pod) is never asked, nor its ConfigMap read; a pod in the release's namespace that its DaemonSet did not make is
    left out, and named; the release's policy is the one in force."""
    tenant_doc = {**answer("node-t", [gpu_doc("0")], []).document, "peaks": [{**PEAK, "peak_bytes": 10**30}]}
    pods = [
        agent_pod("node-a"),
        agent_pod("a-node", namespace="tenant"),
        agent_pod("node-x", owner=("ReplicaSet", "vramguard")),
    ]
    for pod in pods:  # each mounts a `policy` ConfigMap of its namespace
        pod["spec"]["volumes"] = [{"name": "policy", "configMap": {"name": "vramguard-policy"}}]
    good = peaks_answer("node-a", [{**PEAK, "peak_bytes": 9 * GiB}], 60.0)
    assert isinstance(good, Answer)
    core = FakeCore(pods, {"vramguard-node-a": good.document, "vramguard-a-node": tenant_doc,
                           "vramguard-node-x": tenant_doc})  # fmt: skip
    release_policy = {"policy.yaml": "mode: warn\n", "namespaces.ml.max_quota": "2Gi"}  # as the chart writes it
    reader = FakeReader(WEB, {POLICY: release_policy, ("tenant", "vramguard-policy"): {
        "policy.yaml": "", "quota_sources": "annotation:vramguard.io/vram-limit"}})  # fmt: skip
    doc = json.loads(invoke_recommend("-o", "json", core=core, reader=reader).stdout)
    assert [(i["name"], i["peak_bytes"], i["quota_bytes"]) for i in doc["items"]] == [("web", 9 * GiB, 2 * GiB)]
    assert [name for name, _, _ in core.proxied] == ["vramguard-node-a:9400"]
    assert reader.read == [POLICY]
    assert "left out vramguard/vramguard-node-x: not a pod of DaemonSet/vramguard" in doc["caveats"]


def test_an_agents_peak_over_its_gpus_memory_is_refused() -> None:
    """An agent's peak above the memory of its node's GPU is refused and named, not summed into the workload's."""
    fetched = [
        peaks_answer("node-a", [{**PEAK, "peak_bytes": 9 * GiB}, {**PEAK, "container": "side", "peak_bytes": 10**30}],
                     60.0),
    ]  # fmt: skip
    doc = json.loads(invoke_recommend("-o", "json", fetched=fetched).stdout)
    assert [(i["name"], i["container"], i["peak_bytes"]) for i in doc["items"]] == [("web", "main", 9 * GiB)]
    assert doc["caveats"][-1] == (
        f"refused as impossible: ml/web-7d9f4c8b5-x2b4z side on GPU-0 peaked at {10**30} bytes, over the GPU's 80.0GiB"
    )


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        pytest.param(["--window", "soon"], 2, "--window/--headroom", id="bad-window"),
        pytest.param(["--headroom", "300%"], 2, "must be at most 100%", id="bad-headroom"),
        pytest.param(["--prometheus-url", "http://127.0.0.1:9"], 1, "cannot reach", id="prometheus-unreachable"),
        pytest.param(["--prometheus-header", "nocolon"], 2, "is not 'Name: value'", id="bad-header"),
        pytest.param(["--prometheus-selector", 'job="a"} or vector(1'], 2, "--prometheus-selector", id="bad-selector"),
        pytest.param(["-n", "ml", "-A"], 2, "exclude each other", id="n-and-A"),
    ],
)
def test_recommend_exit_codes(args: list[str], code: int, words: str) -> None:
    result = invoke_recommend(*args)
    assert result.exit_code == code and words in result.output, result.output


def test_recommend_without_agents_or_prometheus_exits_1() -> None:
    result = invoke_recommend(fetched=[])
    assert result.exit_code == 1, result.output
    assert "no vramguard agents (DaemonSet vramguard/vramguard, --agent-namespace, --release)" in result.stderr
