"""The `kubectl vramguard` command: exit codes, the context's namespace, output and colour flags, --watch."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from typer.testing import CliRunner

from vramguard.plugin import fetch
from vramguard.plugin.command import build_app
from vramguard.plugin.merge import Fetched
from vramguard.testing.fakes import FakeClock

from .agents import FakeCore, FakeResponse, core_for, fleet, status_exception


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
