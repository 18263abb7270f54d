"""`kubectl vramguard`: what every vramguard agent sees, merged. `top` lists containers, `nodes` lists GPUs,
`recommend` the quota each workload needs.

Exit status: 0, also when some agent did not answer (its row says why) unless --strict; 1 with --strict when some
agent did not answer, when no agent was found, or when what recommend reads failed or ran past its deadline; 2 on a
usage or configuration error.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Annotated, Any, NoReturn

import typer
from kubernetes.client.exceptions import ApiException

from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.policyfile import load_policy
from vramguard.core.policy import Policy, PolicyError, policy_from_text
from vramguard.core.quantity import QuantityError, format_duration, parse_duration, parse_percentage
from vramguard.core.text import cut, format_bytes, printable
from vramguard.kube.client import describe
from vramguard.plugin import prometheus
from vramguard.plugin.fetch import (
    LIST_TIMEOUT,
    TIMEOUT_S,
    WORKERS,
    ConfigError,
    KubeReader,
    Release,
    connect_core,
    connect_reader,
    find_agents,
    read_all,
    release_agents,
)
from vramguard.plugin.merge import Answer, Fetched, SortBy, filter_rows, merge_nodes, merge_rows, partial, sort_rows
from vramguard.plugin.patch import patches
from vramguard.plugin.prometheus import PrometheusError, parse_selector, read_peaks
from vramguard.plugin.recommend import Impossible, PeakSeries, recommend, within_gpu_memory
from vramguard.plugin.render import Output, RecommendOutput, render_nodes, render_recommend, render_top
from vramguard.plugin.strategy import DEFAULT_HEADROOM
from vramguard.plugin.workloads import KINDS, Owners

Connect = Callable[[str | None, str | None], tuple[Any, str]]  # (kubeconfig, context) -> (CoreV1Api, namespace)
# (kubeconfig, context) -> (the lists recommend reads, CoreV1Api, namespace)
ConnectReader = Callable[[str | None, str | None], tuple[KubeReader, Any, str]]

_CLEAR = "\x1b[H\x1b[2J"
# The README's install (`helm install vramguard ... --namespace vramguard`): the release recommend reads by default.
RELEASE_NAMESPACE = "vramguard"
RELEASE_NAME = "vramguard"
DEADLINE_S = 120.0
MAX_REFUSED_LINES = 10  # impossible peaks named one by one; the rest counted

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


def parse_window(text: str) -> float:
    """`7d`, `2w`, `36h`, `90m` or a duration `parse_duration` reads → seconds. Raises QuantityError."""
    units = {"d": 86400.0, "w": 7 * 86400.0}
    if text[-1:] in units and text[:-1].isdigit() and len(text) <= 12:
        seconds = int(text[:-1]) * units[text[-1]]
    else:
        seconds = parse_duration(text)
    if seconds <= 0:
        raise QuantityError(text, "must be longer than 0", "window")
    return seconds


def _agents_policy(reader: KubeReader, release: Release, timeout: tuple[float, float]) -> tuple[Policy, str | None]:
    """The policy the release's agents run with, or the default one and a caveat saying why."""
    text, where = reader.policy_text(release, timeout)
    if text is None:
        return Policy(), f"the default policy: {where}"
    try:
        return policy_from_text(text, where), None
    except PolicyError as e:
        return Policy(), f"the default policy: {where} is not a valid policy ({e.errors[0]})"


def _gpu_totals(document: Mapping[str, Any]) -> dict[str, int]:
    """The memory of each GPU an agent reports, by UUID."""
    gpus = document.get("gpus")
    out: dict[str, int] = {}
    for g in gpus if isinstance(gpus, list) else []:
        total = g.get("total_bytes") if isinstance(g, dict) else None
        if isinstance(total, int) and not isinstance(total, bool) and total > 0:
            out[str(g.get("uuid", ""))] = total
    return out


def _agents_peaks(fetched: list[Fetched]) -> tuple[list[PeakSeries], list[Impossible], list[str]]:
    """The peaks since each agent started, from their status documents, each within the GPU memory its agent
    reports; the peaks above it, refused; and what they leave out."""
    series: list[PeakSeries] = []
    refused: list[Impossible] = []
    covers: list[float] = []
    caveats: list[str] = []
    for f in fetched:
        if not isinstance(f, Answer):
            caveats.append(f"no answer from {f.agent.namespace}/{f.agent.pod} on {f.agent.node}: {f.reason}")
            continue
        peaks = f.document.get("peaks")
        if not isinstance(peaks, list):
            caveats.append(f"{f.agent.namespace}/{f.agent.pod} on {f.agent.node} keeps no peaks (an older agent)")
            continue
        cover = f.document.get("peaks_cover_s")
        covers.append(float(cover) if isinstance(cover, (int, float)) else 0.0)
        found = []
        for p in peaks:
            if not isinstance(p, dict) or not isinstance(p.get("peak_bytes"), int) or isinstance(p["peak_bytes"], bool):
                continue
            found.append(
                PeakSeries(
                    str(p.get("namespace", "")),
                    str(p.get("pod", "")),
                    str(p.get("container", "")),
                    str(p.get("gpu_uuid", "")),
                    int(p["peak_bytes"]),
                    str(p.get("owner", "")),
                )
            )
        within, over = within_gpu_memory(found, _gpu_totals(f.document))  # this agent's node's GPUs
        series.extend(within)
        refused.extend(over)
    if covers:
        shortest, longest = float(round(min(covers))), float(round(max(covers)))
        span = format_duration(shortest) + (f" to {format_duration(longest)}" if longest != shortest else "")
        caveats.insert(
            0,
            f"no --prometheus-url: the peaks are the agents' own, since each agent started ({span}), "
            "not over the window; give a Prometheus for the window",
        )
    return series, refused, caveats


def _refused_caveats(refused: list[Impossible]) -> list[str]:
    """Each impossible peak named (the first MAX_REFUSED_LINES), and the rest counted."""
    lines = []
    for r in refused[:MAX_REFUSED_LINES]:
        s = r.series
        where = f"{cut(s.namespace, 63)}/{cut(s.pod, 63)} {cut(s.container, 63)} on {cut(s.gpu_uuid, 80)}"
        bound = f"the GPU's {format_bytes(r.bound_bytes)}" if r.bound_bytes is not None else "no GPU memory reported"
        lines.append(f"refused as impossible: {where} peaked at {s.peak_bytes} bytes, over {bound}")
    if len(refused) > MAX_REFUSED_LINES:
        lines.append(f"refused as impossible: {len(refused) - MAX_REFUSED_LINES} more peaks over their GPU's memory")
    return lines


def build_app(
    connect: Connect = connect_core,
    clock: Clock = SYSTEM_CLOCK,
    stop: threading.Event | None = None,
    colour: Callable[[], bool] = lambda: use_colour(sys.stdout),
    connect_reader: ConnectReader = connect_reader,
) -> typer.Typer:
    """The command; `connect` and `connect_reader` give the API clients (fakes in tests), `stop` ends a
    --watch."""
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

    @app.command("recommend")
    def recommend_command(
        namespace: Annotated[str | None, typer.Option("--namespace", "-n", help="Only this namespace.")] = None,
        all_namespaces: Annotated[bool, typer.Option("--all-namespaces", "-A", help="Every namespace.")] = False,
        prometheus_url: Annotated[
            str | None,
            typer.Option(
                "--prometheus-url",
                envvar="VRAMGUARD_PROMETHEUS_URL",
                help="A Prometheus that scrapes the agents (without one: the agents' own peaks, since each started).",
            ),
        ] = None,
        prometheus_header: Annotated[
            list[str] | None,
            typer.Option("--prometheus-header", help="'Name: value' sent to Prometheus (repeat), e.g. a token."),
        ] = None,
        prometheus_selector: Annotated[
            str | None,
            typer.Option(
                "--prometheus-selector",
                help="Label matchers of the agents' scrape targets, on `up`: only their series count (default: "
                'job="<release>-metrics",namespace="<agent namespace>", the chart\'s ServiceMonitor).',
            ),
        ] = None,
        window: Annotated[str, typer.Option("--window", help="The history read: 7d, 2w, 36h.")] = "7d",
        headroom: Annotated[
            str, typer.Option("--headroom", help="Added to the peak before rounding up, e.g. 20%.")
        ] = f"{DEFAULT_HEADROOM:.0%}",
        policy_file: Annotated[
            str | None,
            typer.Option("--policy", help="The agents' policy file (default: read from the release's ConfigMap)."),
        ] = None,
        output: Annotated[
            RecommendOutput, typer.Option("--output", "-o", help="table, wide, json, yaml or patch.")
        ] = RecommendOutput.table,
        agent_namespace: Annotated[
            str,
            typer.Option(
                "--agent-namespace",
                help="The chart's namespace: only its agents, its policy ConfigMap and its scrape are read.",
            ),
        ] = RELEASE_NAMESPACE,
        release_name: Annotated[
            str,
            typer.Option("--release", help="The chart's release: its DaemonSet, policy ConfigMap and Service."),
        ] = RELEASE_NAME,
        kubeconfig: KubeconfigOpt = None,
        context: ContextOpt = None,
        timeout: TimeoutOpt = TIMEOUT_S,
        prometheus_timeout: Annotated[
            float, typer.Option("--prometheus-timeout", min=0.1, help="Seconds allowed to each query's whole answer.")
        ] = prometheus.TIMEOUT_S,
        deadline: Annotated[float, typer.Option("--deadline", min=1.0, help="Seconds the whole run may take.")] = (
            DEADLINE_S
        ),
        concurrency: WorkersOpt = WORKERS,
    ) -> None:
        """Per workload and container: the peak GPU memory over the window, the quota to set (peak plus headroom,
        rounded up), the quota in force and its source, and a verdict: would have been killed, wasteful, no
        quota, or ok."""
        ends_at = clock.now() + deadline

        def left(doing: str) -> float:
            """The seconds the run has left; past its deadline, the run ends saying what it was about to do."""
            remaining = ends_at - clock.now()
            if remaining <= 0:
                _fail(f"ran past its --deadline of {deadline:g}s before {doing}", 1)
            return remaining

        def within(doing: str) -> tuple[float, float]:
            """An API request's (connect, read) timeouts, within what the run has left."""
            remaining = left(doing)
            return (min(LIST_TIMEOUT[0], remaining), min(LIST_TIMEOUT[1], remaining))

        if namespace and all_namespaces:
            _fail("-n and -A exclude each other")
        try:
            window_s = parse_window(window)
            ratio = parse_percentage(headroom)
        except QuantityError as e:
            _fail(f"--window/--headroom: {e}")
        release = Release(agent_namespace, release_name)
        try:
            selector = parse_selector(prometheus_selector or release.scrape_selector)
        except ValueError as e:
            _fail(f"--prometheus-selector: {e}")
        headers: dict[str, str] = {}
        for line in prometheus_header or []:
            name, sep, value = line.partition(":")
            if not sep or not name.strip():
                _fail(f"--prometheus-header: {line[:80]!r} is not 'Name: value'")
            headers[name.strip()] = value.strip()
        try:
            reader, core, current = connect_reader(kubeconfig, context)
        except ConfigError as e:
            _fail(str(e))
        only = None if all_namespaces else namespace or current
        caveats: list[str] = []
        if policy_file is not None:
            try:
                policy = load_policy(policy_file)
            except PolicyError as e:
                _fail(str(e))
        else:
            policy, why = _agents_policy(reader, release, within("reading the policy"))
            caveats.extend([why] if why else [])
        facts: dict[str, Any] = {"headroom": ratio, "namespace": only}
        if prometheus_url:
            try:
                scraped = read_peaks(
                    prometheus_url,
                    window_s,
                    selector,
                    only,
                    timeout_s=min(prometheus_timeout, left("asking Prometheus")),
                    headers=headers,
                )
            except PrometheusError as e:
                _fail(str(e), 1)
            series, refused = within_gpu_memory(scraped.series, scraped.gpu_total_bytes)
            if not scraped.gpu_total_bytes:
                caveats.append(f"no GPU memory from up{{{selector}}} in the window: check --prometheus-selector")
            facts |= {
                "source": "prometheus",
                "window": format_duration(window_s),
                "queries": scraped.queries,
                "agents": f"up{{{selector}}}",
            }
        else:
            listing = within("listing the agent pods")
            try:
                agents, strangers = release_agents(core, release, listing)
            except Exception as e:  # the API server itself: nothing to read
                _fail(f"cannot list the agent pods: {describe(e)}", 1)
            caveats.extend(
                f"left out {a.ref.namespace}/{a.ref.pod}: not a pod of DaemonSet/{release.daemonset}" for a in strangers
            )
            daemonset = f"DaemonSet {release.namespace}/{release.daemonset}"
            if not agents:
                _fail(f"no vramguard agents ({daemonset}, --agent-namespace, --release) and no --prometheus-url", 1)
            fetched = read_all(
                core, agents, workers=concurrency, timeout_s=min(timeout, left("reading the agents")), clock=clock
            )
            series, refused, found = _agents_peaks(fetched)
            series = [s for s in series if only is None or s.namespace == only]
            refused = [r for r in refused if only is None or r.series.namespace == only]
            caveats = found + caveats
            facts |= {"source": "agents", "window": None, "agents": daemonset}
        caveats.extend(_refused_caveats(refused))
        lists: dict[str, list[dict[str, Any]]] = {}
        for kind in KINDS if series else ():
            listing = within(f"listing the {kind}s")
            try:
                lists[kind] = reader.list_objects(kind, only, listing)
            except Exception as e:
                hint = " (bind the vramguard-recommender ClusterRole)" if getattr(e, "status", None) == 403 else ""
                _fail(f"cannot list the workloads: {describe(e)}{hint}", 1)
        owners = Owners(lists)
        left("printing")
        rows = recommend(series, owners, policy, ratio)
        changes = patches(rows, owners)
        typer.echo(render_recommend(rows, changes, facts, caveats, output, colour=colour()), color=colour())

    return app


def main() -> None:
    try:
        build_app()(prog_name="kubectl-vramguard")
    except KeyboardInterrupt:  # Ctrl-C ends a --watch
        sys.exit(130)
