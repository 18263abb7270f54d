"""The `kubectl vramguard` command: exit codes, the context's namespace, output and colour flags, --watch."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from typer.testing import CliRunner

from vramguard.core.model import GiB
from vramguard.core.policy import PolicyText
from vramguard.plugin import fetch
from vramguard.plugin.command import build_app
from vramguard.plugin.merge import Failure, Fetched
from vramguard.plugin.prometheus import PEAK_METRIC, SLICES
from vramguard_testbed.fakes import FakeClock

from .agents import FakeCore, FakeResponse, answer, core_for, fleet, gpu_doc, ref, status_exception
from .objects import by_kind, template, workload
from .test_prometheus import fake_prometheus


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
    """The lists recommend reads, from `objects`, and the agents' policy text (None: unreadable)."""

    def __init__(self, objects: dict[str, list[dict[str, Any]]], policy: bytes | None = b"mode: kill\n") -> None:
        super().__init__(api=None)
        self.objects, self.policy = objects, policy

    def list_objects(self, kind: str, namespace: str | None) -> list[dict[str, Any]]:
        self.requests += 1
        items = self.objects.get(kind, [])
        return [o for o in items if namespace is None or o["metadata"]["namespace"] == namespace]

    def policy_text(self, agents: Sequence[fetch.AgentPod]) -> tuple[PolicyText | None, str]:
        if not self.policy:
            return None, "cannot read it: 403 Forbidden"
        return PolicyText.of_config_map({"policy.yaml": self.policy.decode()}), "vramguard/vramguard-policy"


def peaks_answer(node: str, peaks: list[dict[str, Any]], cover_s: float) -> Fetched:
    found = answer(node, [gpu_doc("0")], [])
    return type(found)(found.agent, {**found.document, "peaks": peaks, "peaks_cover_s": cover_s})


WEB = by_kind(workload("Deployment", "ml", "web", template({"vramguard.io/vram": "4Gi"})))
PEAK = {"namespace": "ml", "pod": "web-7d9f4c8b5-x2b4z", "container": "main", "gpu_uuid": "GPU-0"}


def invoke_recommend(
    *args: str, fetched: list[Fetched] | None = None, reader: FakeReader | None = None, namespace: str = "ml"
) -> Any:
    core = core_for(fetched if fetched is not None else fleet())
    app = build_app(
        connect=lambda kubeconfig, context: (core, namespace),
        clock=FakeClock(),
        colour=lambda: False,
        connect_reader=lambda kubeconfig, context: (reader or FakeReader(WEB), core, namespace),
    )
    return CliRunner().invoke(app, ["recommend", *args])


def test_recommend_from_prometheus() -> None:
    """With --prometheus-url: the peak over the window, the quota in force under the agents' policy, the verdict,
    and in JSON the facts and the patch."""
    answer_ = {PEAK_METRIC: [{"metric": {**PEAK, "gpu": "0"}, "value": [0, str(9 * GiB)]}]}
    with fake_prometheus(answer_) as (url, asked):
        table = invoke_recommend("--prometheus-url", url)
        doc = json.loads(invoke_recommend("--prometheus-url", url, "-o", "json", "--window", "2w").stdout)
        patch = invoke_recommend("--prometheus-url", url, "-o", "patch").stdout
    assert table.exit_code == 0, table.output
    header, line = table.stdout.splitlines()
    assert header.split() == ["NAMESPACE", "WORKLOAD", "CONTAINER", "PODS", "GPUS", "PEAK", "RECOMMENDED", "QUOTA",
                              "SOURCE", "VERDICT"]  # fmt: skip
    assert line.split() == ["ml", "Deployment/web", "main", "1", "1", "9.0GiB", "11Gi", "4Gi",
                            "limits[vramguard.io/vram]", "would", "have", "been", "killed"]  # fmt: skip
    assert len(asked) == 3 * 2 * SLICES, "the same queries a run, whatever the workloads"
    assert (doc["source"], doc["window"], doc["queries"], doc["headroom"]) == ("prometheus", "336h", 2 * SLICES, 0.2)
    (item,) = doc["items"]
    assert (item["kind"], item["name"], item["field"]["value"]) == ("Deployment", "web", "11Gi")
    assert doc["patches"][0]["patch"]["spec"]["template"]["spec"]["containers"][0]["name"] == "main"
    assert patch.startswith("kubectl patch deployment web --namespace ml --type strategic --patch '{")


def test_recommend_from_the_agents_says_what_they_cover() -> None:
    """Without a Prometheus: the agents' own peaks (their pods' owners placing gone pods), and caveats saying
    they cover the time since each agent started, and which agent did not answer."""
    gone = {**PEAK, "pod": "web-5c6d7f8b9-q9w2k", "owner": "ReplicaSet/web-5c6d7f8b9", "peak_bytes": 3 * GiB}
    fetched = [
        peaks_answer("node-a", [{**PEAK, "owner": "ReplicaSet/web-7d9f4c8b5", "peak_bytes": 2 * GiB}], 3600.0),
        peaks_answer("node-b", [gone], 7200.0),
        Failure(ref("node-c"), "503 Service Unavailable: connection refused"),
    ]
    result = invoke_recommend(fetched=fetched, reader=FakeReader(WEB, policy=None))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[1].split()[:8] == ["ml", "Deployment/web", "main", "2", "1", "3.0GiB", "3840Mi", "4Gi"]
    assert lines[2].startswith("# no --prometheus-url: the peaks are the agents' own, since each agent started")
    assert "(1h to 2h)" in lines[2]
    assert lines[3] == (
        "# no answer from vramguard/vramguard-node-c on node-c: 503 Service Unavailable: connection refused"
    )
    assert lines[4] == "# the default policy: cannot read it: 403 Forbidden"


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        pytest.param(["--window", "soon"], 2, "--window/--headroom", id="bad-window"),
        pytest.param(["--headroom", "300%"], 2, "must be at most 100%", id="bad-headroom"),
        pytest.param(["--prometheus-url", "http://127.0.0.1:9"], 1, "cannot reach", id="prometheus-unreachable"),
        pytest.param(["--prometheus-header", "nocolon"], 2, "is not 'Name: value'", id="bad-header"),
        pytest.param(["-n", "ml", "-A"], 2, "exclude each other", id="n-and-A"),
    ],
)
def test_recommend_exit_codes(args: list[str], code: int, words: str) -> None:
    result = invoke_recommend(*args)
    assert result.exit_code == code and words in result.output, result.output


def test_recommend_without_agents_or_prometheus_exits_1() -> None:
    result = invoke_recommend(fetched=[])
    assert result.exit_code == 1 and "no vramguard agents found, and no --prometheus-url" in result.output
