"""`kubectl vramguard`: what every vramguard agent sees, merged. `top` lists containers, `nodes` lists GPUs.

Exit status: 0, also when some agent did not answer (its row says why) unless --strict; 1 with --strict when some
agent did not answer, or when no agent was found; 2 on a usage or configuration error.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Annotated, Any, NoReturn

import typer
from kubernetes.client.exceptions import ApiException

from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.core.text import printable
from vramguard.kube.client import describe
from vramguard.plugin.fetch import TIMEOUT_S, WORKERS, ConfigError, connect_core, find_agents, read_all
from vramguard.plugin.merge import Fetched, SortBy, filter_rows, merge_nodes, merge_rows, partial, sort_rows
from vramguard.plugin.render import Output, render_nodes, render_top

Connect = Callable[[str | None, str | None], tuple[Any, str]]  # (kubeconfig, context) -> (CoreV1Api, namespace)

_CLEAR = "\x1b[H\x1b[2J"

KubeconfigOpt = Annotated[str | None, typer.Option("--kubeconfig", envvar="KUBECONFIG", help="Kubeconfig file.")]
ContextOpt = Annotated[str | None, typer.Option("--context", help="The kubeconfig context to use.")]
AgentNsOpt = Annotated[
    str | None, typer.Option("--agent-namespace", help="Where the agents run (default: look in every namespace).")
]
NodeOpt = Annotated[str | None, typer.Option("--node", help="Only this node.")]
OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="table, wide, json or yaml.")]
WatchOpt = Annotated[bool, typer.Option("--watch", "-w", help="Read again every --interval seconds.")]
IntervalOpt = Annotated[float, typer.Option("--interval", min=0.5, help="Seconds between reads with --watch.")]
StrictOpt = Annotated[bool, typer.Option("--strict", help="Exit 1 when some agent did not answer.")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds allowed to each agent.")]
WorkersOpt = Annotated[int, typer.Option("--concurrency", min=1, max=256, help="Agents read at a time.")]


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(printable(f"kubectl-vramguard: {message}"), err=True)
    raise typer.Exit(code)


def use_colour(stream: Any) -> bool:
    """Colour only on a terminal, and never with NO_COLOR set (https://no-color.org)."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and not os.environ.get("NO_COLOR")


def build_app(
    connect: Connect = connect_core,
    clock: Clock = SYSTEM_CLOCK,
    stop: threading.Event | None = None,
    colour: Callable[[], bool] = lambda: use_colour(sys.stdout),
) -> typer.Typer:
    """The command; `connect` gives the API client (a fake in tests), `stop` ends a --watch."""
    app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
    stopped = stop or threading.Event()

    def gather(
        kubeconfig: str | None, context: str | None, agent_ns: str | None, node: str | None, **read: Any
    ) -> tuple[Callable[[], list[Fetched] | None], str]:
        """A read of every agent, and the context's namespace."""
        try:
            core, namespace = connect(kubeconfig, context)
        except ConfigError as e:
            _fail(str(e))

        def once() -> list[Fetched] | None:
            try:
                agents = find_agents(core, agent_ns, node)
            except Exception as e:  # the API server itself: nothing to show
                hint = ""
                if isinstance(e, ApiException) and e.status == 403:
                    hint = " (bind the vramguard-viewer ClusterRole; bound in one namespace, pass --agent-namespace)"
                _fail(f"cannot list the agent pods: {describe(e)}{hint}", 1)
            if not agents:
                where = f"namespace {agent_ns}" if agent_ns else "any namespace"
                typer.echo(
                    printable(
                        f"kubectl-vramguard: no vramguard agents (pods app.kubernetes.io/name=vramguard) in {where}"
                    ),
                    err=True,
                )
                return None
            return read_all(core, agents, clock=clock, **read)

        return once, namespace

    def run(
        once: Callable[[], list[Fetched] | None],
        show: Callable[[list[Fetched]], str],
        watch: bool,
        interval: float,
        strict: bool,
    ) -> None:
        paint = colour()
        while True:
            fetched = once()
            if fetched is None and not watch:
                raise typer.Exit(1)
            text = show(fetched or [])
            typer.echo((_CLEAR if watch and paint else "") + text, color=paint)  # click strips SGR off a pipe
            if not watch:
                break
            if clock.wait(stopped, interval):
                return
        if strict and fetched is not None and partial(fetched):
            raise typer.Exit(1)

    @app.command()
    def top(
        namespace: Annotated[str | None, typer.Option("--namespace", "-n", help="Only this namespace's pods.")] = None,
        all_namespaces: Annotated[bool, typer.Option("--all-namespaces", "-A", help="Every namespace.")] = False,
        node: NodeOpt = None,
        sort_by: Annotated[SortBy | None, typer.Option("--sort-by", help="used, overage or quota.")] = None,
        output: OutputOpt = Output.table,
        watch: WatchOpt = False,
        interval: IntervalOpt = 2.0,
        strict: StrictOpt = False,
        agent_namespace: AgentNsOpt = None,
        kubeconfig: KubeconfigOpt = None,
        context: ContextOpt = None,
        timeout: TimeoutOpt = TIMEOUT_S,
        concurrency: WorkersOpt = WORKERS,
    ) -> None:
        """Containers using GPU memory: NODE, GPU, NAMESPACE, POD, CONTAINER, USED, QUOTA, %, STATE, HELD-BY."""
        if namespace and all_namespaces:
            _fail("-n and -A exclude each other")
        once, current = gather(kubeconfig, context, agent_namespace, node, timeout_s=timeout, workers=concurrency)
        only = None if all_namespaces else namespace or current

        def show(fetched: list[Fetched]) -> str:
            rows = sort_rows(filter_rows(merge_rows(fetched), only, node), sort_by)
            return render_top(rows, output, colour=colour())

        run(once, show, watch, interval, strict)

    @app.command()
    def nodes(
        node: NodeOpt = None,
        output: OutputOpt = Output.table,
        watch: WatchOpt = False,
        interval: IntervalOpt = 2.0,
        strict: StrictOpt = False,
        agent_namespace: AgentNsOpt = None,
        kubeconfig: KubeconfigOpt = None,
        context: ContextOpt = None,
        timeout: TimeoutOpt = TIMEOUT_S,
        concurrency: WorkersOpt = WORKERS,
    ) -> None:
        """Per node and GPU: total, used, used under quota, unattributed, free, and who holds the limits."""
        once, _ = gather(kubeconfig, context, agent_namespace, node, timeout_s=timeout, workers=concurrency)
        run(
            once,
            lambda fetched: render_nodes(merge_nodes(fetched, node), output, colour=colour()),
            watch,
            interval,
            strict,
        )

    return app


def main() -> None:
    try:
        build_app()(prog_name="kubectl-vramguard")
    except KeyboardInterrupt:  # Ctrl-C ends a --watch
        sys.exit(130)
