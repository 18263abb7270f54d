"""The `vramguard` command: run the agent, look at a node, check a policy."""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

import structlog
import typer
from kubernetes.client import ApiClient

from vramguard import __version__
from vramguard.act import Enforcer
from vramguard.agent import Agent
from vramguard.attribute import ProcessAttributor
from vramguard.backoff import Backoff
from vramguard.health import HealthServer
from vramguard.kill import PidfdKiller
from vramguard.kube import KubeCapacityPublisher, KubeEventRecorder, KubeEvictor, KubePodSource, load_api_client
from vramguard.logs import configure_logging
from vramguard.metrics import Metrics
from vramguard.model import Mode, Policy
from vramguard.nvml import NvmlSampler, NvmlUnavailable
from vramguard.pods import FilePodSource
from vramguard.policy import PolicyError, check_policy_file, load_policy
from vramguard.ports import CapacityPublisher, EventRecorder, Evictor, EvictResult, PodSource
from vramguard.quantity import QuantityError, parse_quantity
from vramguard.top import render_json, render_table, rows_from_report

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
policy_app = typer.Typer(no_args_is_help=True, help="Work with policy files.")
app.add_typer(policy_app, name="policy")


class LogEventRecorder:
    """Events when there is no API server to write them to (`--pods-file`): they go to the log instead."""

    def __init__(self) -> None:
        self.log = structlog.get_logger("vramguard.events")

    def record(self, pod: object, reason: str, message: str, warning: bool = True) -> None:
        self.log.warning("event", pod=getattr(pod, "key", str(pod)), reason=reason, message=message)


class NoApiEvictor:
    """Eviction is an API call; with `--pods-file` there is no API server, so every eviction fails, visibly."""

    def evict(self, pod: object, message: str) -> EvictResult:
        return EvictResult(evicted=False, refused=False, message="no API server: eviction needs the Kubernetes API")


@dataclass
class Cluster:
    """Where pods come from and where Events and evictions go: the API server, or a pods file and the log."""

    pods: PodSource
    events: EventRecorder
    evictor: Evictor
    api: ApiClient | None = None

    def close(self, timeout_s: float) -> None:
        """Stop the background threads, within `timeout_s` in all (a stuck request is abandoned, not awaited)."""
        deadline = time.monotonic() + timeout_s
        for part in (self.pods, self.events):
            stop = getattr(part, "stop", None)
            if stop is not None:
                stop(max(0.05, deadline - time.monotonic()))


def _load_policy(path: Path | None, mode: Mode | None, agent_namespace: str | None) -> Policy:
    try:
        policy = load_policy(path) if path is not None else Policy()
    except PolicyError as e:
        typer.echo(f"vramguard: {e}", err=True)
        raise typer.Exit(2) from None
    if mode is not None:
        policy = replace(policy, mode=mode)
    if agent_namespace:
        policy = replace(policy, exempt_namespaces=policy.exempt_namespaces | {agent_namespace})
    return policy


def _cluster(pods_file: Path | None, kubeconfig: str | None, node_name: str | None, metrics: Metrics) -> Cluster:
    if pods_file is not None:
        return Cluster(FilePodSource(str(pods_file), node_name=node_name).start(), LogEventRecorder(), NoApiEvictor())
    if not node_name:
        typer.echo("vramguard: --node-name (or NODE_NAME) is required to watch this node's pods", err=True)
        raise typer.Exit(2)
    try:
        api = load_api_client(kubeconfig)
    except Exception as e:  # the client raises several unrelated types for a bad or missing configuration
        where = kubeconfig or "the in-cluster ServiceAccount"
        typer.echo(f"vramguard: cannot load the Kubernetes configuration from {where}: {e}", err=True)
        raise typer.Exit(2) from None
    events = KubeEventRecorder(api, node_name, count=lambda result: metrics.events.labels(result=result).inc())
    return Cluster(KubePodSource(api, node_name).start(), events, KubeEvictor(api), api)


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft open-file limit to the hard one, as far as the kernel allows; (before, after).

    Container runtimes often start processes with a soft limit of 1024 under a far higher hard one. The agent's
    fd use is bounded (no fd per GPU process, a capped number of HTTP connections), but headroom costs nothing
    and keeps a flood elsewhere from starving the kill path.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if target == resource.RLIM_INFINITY:  # NOFILE cannot be unlimited: the kernel's ceiling is fs.nr_open
        try:
            with open("/proc/sys/fs/nr_open") as f:
                target = int(f.read())
        except (OSError, ValueError):
            target = 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft, soft
    return soft, target


def _open_sampler(proc_root: str) -> NvmlSampler:
    try:
        return NvmlSampler(proc_root=proc_root)
    except NvmlUnavailable as e:
        typer.echo(f"vramguard: {e}", err=True)
        raise typer.Exit(1) from None


def _wire(
    *,
    sampler: NvmlSampler,
    cluster: Cluster,
    policy: Policy,
    dry_run: bool,
    proc_root: str,
    metrics: Metrics,
    cgroup_root: str = "/sys/fs/cgroup",
    device_prefix: str = "/dev/nvidia",
    capacity: CapacityPublisher | None = None,
) -> Agent:
    # Dry-run writes nothing to the API server, Events included: they go to the log.
    events = cluster.events if not dry_run else LogEventRecorder()
    enforcer = Enforcer(
        killer=PidfdKiller(proc_root=proc_root, cgroup_root=cgroup_root, device_prefix=device_prefix),
        evictor=cluster.evictor,
        events=events,
        policy=policy,
        dry_run=dry_run,
    )
    return Agent(
        sampler=sampler,
        attributor=ProcessAttributor(proc_root=proc_root),
        pods=cluster.pods,
        policy=policy,
        enforcer=enforcer,
        events=events,
        metrics=metrics,
        error_counts=lambda: {kind.value: n for kind, n in sampler.errors.items()},
        capacity=capacity if not dry_run else None,
    )


@contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


ModeOpt = Annotated[Mode | None, typer.Option("--mode", help="warn, evict or kill; overrides the policy's mode.")]
PolicyOpt = Annotated[Path | None, typer.Option("--policy", help="Policy file (YAML).", exists=True, dir_okay=False)]
ProcRootOpt = Annotated[str, typer.Option("--proc-root", help="Where the host's /proc is mounted.")]
PodsFileOpt = Annotated[
    Path | None,
    typer.Option("--pods-file", help="Pods from a file (`kubectl get pods -o yaml` shape) instead of the API server."),
]
NodeOpt = Annotated[str | None, typer.Option("--node-name", envvar="NODE_NAME", help="This node's name.")]
KubeconfigOpt = Annotated[
    str | None, typer.Option("--kubeconfig", help="Kubeconfig file; the in-cluster ServiceAccount when absent.")
]


@app.command()
def run(
    node_name: NodeOpt = None,
    mode: ModeOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Decide and report everything, change nothing.")] = False,
    poll_interval: Annotated[float, typer.Option("--poll-interval", help="Seconds between scans.", min=0.01)] = 1.0,
    policy_path: PolicyOpt = None,
    metrics_port: Annotated[int, typer.Option("--metrics-port", help="Port for /metrics, /healthz, /readyz.")] = 9400,
    metrics_bind_address: Annotated[
        str,
        typer.Option(
            "--metrics-bind-address",
            help="Address for /metrics and the probes: all interfaces by default (Prometheus scrapes the pod IP); "
            "127.0.0.1 keeps them on the node.",
        ),
    ] = "0.0.0.0",
    proc_root: ProcRootOpt = "/proc",
    cgroup_root: Annotated[
        str,
        typer.Option(
            "--cgroup-root",
            help="Where the host's cgroup filesystem is mounted (writable): a kill freezes the container there.",
        ),
    ] = "/sys/fs/cgroup",
    log_format: Annotated[str, typer.Option("--log-format", help="json, console or auto.")] = "auto",
    pods_file: PodsFileOpt = None,
    kubeconfig: KubeconfigOpt = None,
    advertise_capacity: Annotated[
        bool,
        typer.Option(
            "--advertise-capacity", help="Publish GPU memory as the node's vramguard.io/vram capacity (else remove it)."
        ),
    ] = False,
    capacity_reserve: Annotated[
        str, typer.Option("--capacity-reserve", help="GPU memory kept out of the advertised capacity (quantity).")
    ] = "0",
    agent_namespace: Annotated[
        str | None, typer.Option("--agent-namespace", envvar="POD_NAMESPACE", help="Exempted like kube-system.")
    ] = None,
    device_prefix: Annotated[
        str, typer.Option("--gpu-device-prefix", hidden=True, help="Device files that hold GPU memory (tests).")
    ] = "/dev/nvidia",
) -> None:
    """Run the agent: scan every poll interval, enforce quotas, serve metrics and probes."""
    configure_logging(log_format)
    log = structlog.get_logger("vramguard")
    policy = _load_policy(policy_path, mode, agent_namespace)
    try:
        reserve_bytes = parse_quantity(capacity_reserve)
    except QuantityError as e:
        typer.echo(f"vramguard: --capacity-reserve: {e}", err=True)
        raise typer.Exit(2) from None
    if advertise_capacity and pods_file is not None:
        typer.echo("vramguard: --advertise-capacity needs the API server, not --pods-file", err=True)
        raise typer.Exit(2)
    open_files = raise_open_file_limit()
    metrics = Metrics()
    cluster = _cluster(pods_file, kubeconfig, node_name, metrics)
    pods = cluster.pods
    capacity = _capacity(cluster, node_name, reserve_bytes, advertise_capacity, dry_run)
    state: dict[str, str | None] = {"nvml": "NVML not initialised yet"}
    wiring: list[Agent] = []

    def healthz() -> tuple[bool, str]:
        if not wiring or wiring[0].last_scan_at is None:
            return True, "starting"
        age = time.monotonic() - wiring[0].last_scan_at
        return age < max(30.0, 10 * poll_interval), f"last scan {age:.1f}s ago"

    def readyz() -> tuple[bool, str]:
        problems = [p for p in (state["nvml"], pods.problem()) if p]
        if not problems and (not wiring or wiring[0].last_scan_at is None):
            problems.append("no scan completed yet")
        return (not problems), "; ".join(problems) or "ready"

    server = HealthServer(metrics_port, metrics.registry, healthz, readyz, host=metrics_bind_address)
    log.info(
        "starting",
        version=__version__,
        node=node_name,
        mode=policy.mode.value,
        dry_run=dry_run,
        address=f"{metrics_bind_address or '*'}:{server.port}",
        open_file_limit=open_files[1],
    )
    with _stop_on_signals() as stop:
        # NVML may come up after the agent (driver container still installing): retry with back-off, unready.
        backoff = Backoff(1.0, 60.0)
        sampler: NvmlSampler | None = None
        while sampler is None and not stop.is_set():
            try:
                sampler = NvmlSampler(proc_root=proc_root)
            except NvmlUnavailable as e:
                if state["nvml"] != str(e):
                    log.error("nvml_unavailable", error=str(e))
                state["nvml"] = str(e)
                stop.wait(backoff.next())
        if sampler is not None:
            state["nvml"] = None
            wiring.append(
                _wire(
                    sampler=sampler,
                    cluster=cluster,
                    policy=policy,
                    dry_run=dry_run,
                    proc_root=proc_root,
                    metrics=metrics,
                    cgroup_root=cgroup_root,
                    device_prefix=device_prefix,
                    capacity=capacity if advertise_capacity else None,
                )
            )
            wiring[0].run(poll_interval, stop)
    # Shutting down never waits on the API server: every background thread gets a fraction of a second, and
    # one stuck in a request is abandoned (they are daemons). SIGTERM ends the agent within 2 s.
    if wiring:
        wiring[0].enforcer.close(0.3)
    if capacity is not None:
        capacity.stop(0.2)
    cluster.close(0.6)
    if sampler is not None:
        sampler.close()
    server.close()
    log.info("stopped")


def _capacity(
    cluster: Cluster,
    node_name: str | None,
    reserve_bytes: int,
    advertise: bool,
    dry_run: bool,
) -> KubeCapacityPublisher | None:
    """The publisher; it withdraws what an earlier run may have advertised when not advertising (in the
    background, like every publish: a failure is logged, never raised, never waited for)."""
    if cluster.api is None or node_name is None or dry_run:
        return None
    publisher = KubeCapacityPublisher(cluster.api, node_name, reserve_bytes)
    if not advertise:
        publisher.withdraw()
    return publisher


@app.command()
def top(
    node_name: NodeOpt = None,
    policy_path: PolicyOpt = None,
    proc_root: ProcRootOpt = "/proc",
    pods_file: PodsFileOpt = None,
    kubeconfig: KubeconfigOpt = None,
    once: Annotated[bool, typer.Option("--once", help="Print one table and exit.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (one document per refresh).")] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between refreshes.", min=0.1)] = 2.0,
) -> None:
    """A live table of this node: GPU, pod, container, PIDs, used, quota, % and state. Changes nothing."""
    configure_logging("console", level="error")
    policy = _load_policy(policy_path, None, None)
    metrics = Metrics()
    cluster = _cluster(pods_file, kubeconfig, node_name, metrics)
    if isinstance(cluster.pods, (KubePodSource, FilePodSource)) and not cluster.pods.wait_synced(timeout_s=15):
        typer.echo(f"vramguard: could not read this node's pods within 15s: {cluster.pods.problem()}", err=True)
        raise typer.Exit(1)
    sampler = _open_sampler(proc_root)
    agent = _wire(sampler=sampler, cluster=cluster, policy=policy, dry_run=True, proc_root=proc_root, metrics=metrics)
    try:
        while True:
            rows = rows_from_report(agent.scan())
            if as_json:
                typer.echo(render_json(rows))
            else:
                if not once and sys.stdout.isatty():
                    typer.echo("\x1b[H\x1b[2J", nl=False)
                typer.echo(render_table(rows))
            if once:
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
    finally:
        sampler.close()


@policy_app.command("check")
def policy_check(file: Annotated[Path, typer.Argument(help="Policy file to validate.")]) -> None:
    """Validate a policy file; every error names the field and the value."""
    errors = check_policy_file(file)
    if errors:
        for line in errors:
            typer.echo(f"{file}: {line}", err=True)
        raise typer.Exit(1)
    typer.echo(f"{file}: ok")


@app.command()
def version(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Print vramguard's version (and, with --json, its runtime's)."""
    if as_json:
        typer.echo(json.dumps({"vramguard": __version__, "python": sys.version.split()[0], "pid": os.getpid()}))
    else:
        typer.echo(f"vramguard {__version__}")


def main() -> None:
    app()
