"""The `vramguard` command: run the agent, look at a node, check a policy. Flags in, `wiring` does the rest."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, NoReturn, TypeVar

import typer

from vramguard import __version__
from vramguard.agent.metrics import Metrics
from vramguard.agent.report import rows_from_report
from vramguard.base.clock import SYSTEM_CLOCK
from vramguard.base.healthfile import DEFAULT_PATH as DEFAULT_HEALTH_FILE
from vramguard.base.lifecycle import Services
from vramguard.base.logs import configure_logging
from vramguard.base.policyfile import check_policy_file
from vramguard.cli.cluster import connect
from vramguard.cli.config import RunConfig, ScanSetup, WiringError, kubelet_tree, policy_file
from vramguard.cli.driver import ask_driver, ask_limits, nvidia_side, with_limits
from vramguard.cli.gpus import memory_limiter, open_gpus_once
from vramguard.cli.serve import serve
from vramguard.cli.signals import SHUTDOWN_BUDGET_S, stop_on_signals
from vramguard.cli.top import render_table
from vramguard.cli.wiring import build_agent
from vramguard.core.exited import EXITED_HOLD_S
from vramguard.core.policy import DriverLimits, Mode, Overrides, parse_watch_interval
from vramguard.core.quantity import QuantityError, parse_quantity
from vramguard.core.text import printable, show_value
from vramguard.http.status import AgentFacts, DriverFacts, driver_dict, render, scan_json
from vramguard.node.cgroup_tree import CgroupfsTree
from vramguard.node.describe import describer
from vramguard.node.kubelet_pods import DEFAULT_POD_LOGS_DIR
from vramguard.node.limiter import read_held_limits
from vramguard.nvml import BINDINGS_SINCE, NvmlLocation, NvmlUnavailable

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
policy_app = typer.Typer(no_args_is_help=True, help="Work with policy files.")
app.add_typer(policy_app, name="policy")

_T = TypeVar("_T")


def _say(message: str) -> None:
    """A message for a person on standard error: what it quotes (a file's text, a pod's name) shown escaped, line by
    line; its further lines indented, so that none passes for a message of its own."""
    first, *rest = message.split("\n")
    shown = [printable(first), *(printable(line if line.startswith("  ") else f"  {line}") for line in rest)]
    typer.echo("\n".join(shown), err=True)


def _fail(message: str, code: int = 2) -> NoReturn:
    _say(f"vramguard: {message}")
    raise typer.Exit(code)


def _or_exit(build: Callable[[], _T]) -> _T:
    """`build()`, or exit 2 with its WiringError's message."""
    try:
        return build()
    except WiringError as e:
        _fail(str(e))


ModeOpt = Annotated[Mode | None, typer.Option("--mode", help="warn, evict or kill; overrides the policy's mode.")]
PolicyOpt = Annotated[
    Path | None,
    typer.Option(
        "--policy",
        help="Policy file (YAML), or a policy ConfigMap's directory (the chart's: policy.yaml and the door's keys).",
        exists=True,
    ),
]
ProcRootOpt = Annotated[str, typer.Option("--proc-root", help="Where the host's /proc is mounted.")]
CgroupRootOpt = Annotated[
    str,
    typer.Option(
        "--cgroup-root",
        envvar="VRAMGUARD_CGROUP_ROOT",
        help="Where the host's cgroup filesystem is mounted (writable): a kill freezes the container there, and "
        "driver limits name its v2 directories.",
    ),
]
SysRootOpt = Annotated[
    str,
    typer.Option(
        "--sys-root",
        envvar="VRAMGUARD_SYS_ROOT",
        help="Where the host's /sys is mounted (node-exporter's --path.sysfs): the GPUs a DRM driver with memory "
        "stats drives (amdgpu, xe, i915) are found under its class/drm.",
    ),
]
FdinfoRootOpt = Annotated[
    str | None, typer.Option("--fdinfo-root", hidden=True, help="Where processes' fd/ and fdinfo/ are read (tests).")
]
PodLogsDirOpt = Annotated[
    str,
    typer.Option(
        "--pod-logs-dir",
        envvar="VRAMGUARD_POD_LOGS_DIR",
        help="Where the host's kubelet pod logs directory is mounted (the kubelet's podLogsDir, /var/log/pods by "
        "default): its <namespace>_<name>_<uid> entries tell a static pod's genuine mirror pod from a forgery.",
    ),
]
KubeletCgroupRootOpt = Annotated[
    str,
    typer.Option(
        "--kubelet-cgroup-root",
        envvar="VRAMGUARD_KUBELET_CGROUP_ROOT",
        help="The kubelet's own --cgroup-root (cgroupRoot) on this node: / by default (pods under /kubepods or "
        "/kubepods.slice), /kubelet in kind. Only cgroups below it are pods'; a pod-shaped cgroup anywhere else "
        "is reported as outside the kubelet, never attributed or killed.",
    ),
]
PodsFileOpt = Annotated[
    Path | None,
    typer.Option("--pods-file", help="Pods from a file (`kubectl get pods -o yaml` shape) instead of the API server."),
]
NodeOpt = Annotated[str | None, typer.Option("--node-name", envvar="NODE_NAME", help="This node's name.")]
DriverRootOpt = Annotated[
    str,
    typer.Option(
        "--driver-root",
        envvar="VRAMGUARD_DRIVER_ROOT",
        help="Where the host's NVIDIA driver install is mounted (the chart's driver.root): libnvidia-ml.so.1 is "
        "loaded from the driver's layouts under it (usr/lib64, usr/lib/<arch>-linux-gnu, lib64, ...). Empty: "
        "the dynamic loader's search (the NVIDIA container runtime's libraries, LD_LIBRARY_PATH).",
    ),
]
NvmlLibraryOpt = Annotated[
    str,
    typer.Option(
        "--nvml-library",
        envvar="VRAMGUARD_NVML_LIBRARY",
        help="The NVML library file itself (the chart's driver.nvmlLibrary); within --driver-root when that is set.",
    ),
]
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
    metrics_port: Annotated[
        int, typer.Option("--metrics-port", help="Port for /metrics, /healthz, /readyz, /status.")
    ] = 9400,
    health_file: Annotated[
        str,
        typer.Option(
            "--health-file",
            help="Where liveness and readiness are written every second for the kubelet's exec probe "
            "(`vramguard-probe live|ready`); no connection can delay it. Empty: none.",
        ),
    ] = DEFAULT_HEALTH_FILE,
    metrics_bind_address: Annotated[
        str,
        typer.Option(
            "--metrics-bind-address",
            help="Address for /metrics, /status, /healthz and /readyz: all interfaces by default (Prometheus "
            "scrapes the pod IP); 127.0.0.1 keeps them on the node.",
        ),
    ] = "0.0.0.0",
    proc_root: ProcRootOpt = "/proc",
    cgroup_root: CgroupRootOpt = "/sys/fs/cgroup",
    sys_root: SysRootOpt = "/sys",
    fdinfo_root: FdinfoRootOpt = None,
    pod_logs_dir: PodLogsDirOpt = DEFAULT_POD_LOGS_DIR,
    kubelet_cgroup_root: KubeletCgroupRootOpt = "/",
    driver_root: DriverRootOpt = "",
    nvml_library: NvmlLibraryOpt = "",
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
    drm_device_prefix: Annotated[
        str, typer.Option("--drm-device-prefix", hidden=True, help="DRM device nodes a GPU process holds (tests).")
    ] = "/dev/dri/",
    exited_hold: Annotated[
        float,
        typer.Option(
            "--exited-hold-seconds",
            hidden=True,
            min=0.0,
            help="How long exited PIDs may hold GPU memory before the GPU is said to need a reset (tests).",
        ),
    ] = EXITED_HOLD_S,
    driver_limits: Annotated[
        DriverLimits | None,
        typer.Option(
            "--driver-limits",
            help="The driver's per-cgroup memory limits (R615+) in evict/kill: auto, off or require "
            "(overrides the policy's driver_limits).",
        ),
    ] = None,
    state_dir: Annotated[
        str,
        typer.Option(
            "--state-dir",
            envvar="VRAMGUARD_STATE_DIR",
            help="A writable directory that outlives the agent (a hostPath): it notes each container frozen for a "
            "kill, so that an agent killed mid-kill is followed by one that thaws it. Without it, no freezing.",
        ),
    ] = "/var/lib/vramguard",
    watch_interval: Annotated[
        str | None,
        typer.Option(
            "--watch-interval",
            help="How often each GPU's memory counter is read between scans (e.g. 10ms; 1ms to 1s): a rise scans at "
            "once. 0s: no watch, scans on the poll alone. Overrides the policy's watch_interval.",
        ),
    ] = None,
    status_command_lines: Annotated[
        bool,
        typer.Option(
            "--status-command-lines",
            help="Show each GPU process's whole command line in /status (by default its program's name only: "
            "arguments may hold secrets, and whoever can read /status would see them).",
        ),
    ] = False,
) -> None:
    """Run the agent: scan every poll interval, enforce quotas, serve metrics and probes."""
    configure_logging(log_format)
    try:
        reserve_bytes = parse_quantity(capacity_reserve)
    except QuantityError as e:
        _fail(f"--capacity-reserve: {e}")
    watch_interval_s = None
    if watch_interval is not None:
        try:
            watch_interval_s = parse_watch_interval(watch_interval)
        except QuantityError as e:
            _fail(f"--watch-interval: {e}")
        except ValueError as e:
            _fail(f"--watch-interval: {show_value(watch_interval)} {e}")
    # The flags override the file at start and at each reload of it alike.
    overrides = Overrides(mode, driver_limits, watch_interval_s, agent_namespace)
    policy, policy_digest = _or_exit(lambda: policy_file(policy_path, overrides))
    config = RunConfig(
        scan=ScanSetup(
            node_name=node_name,
            policy=policy,
            dry_run=dry_run,
            proc_root=proc_root,
            cgroup_root=cgroup_root,
            pods_file=pods_file,
            kubeconfig=kubeconfig,
            device_prefix=device_prefix,
            sys_root=sys_root,
            fdinfo_root=fdinfo_root,
            drm_device_prefix=drm_device_prefix,
            nvml_location=NvmlLocation(driver_root, nvml_library),
            exited_hold_s=exited_hold,
            pod_logs_dir=pod_logs_dir,
            kubelet=_or_exit(lambda: kubelet_tree(kubelet_cgroup_root, proc_root, cgroup_root)),
        ),
        policy_path=policy_path,
        overrides=overrides,
        policy_digest=policy_digest,
        poll_interval_s=poll_interval,
        metrics_port=metrics_port,
        health_file=health_file,
        metrics_bind_address=metrics_bind_address,
        advertise_capacity=advertise_capacity,
        capacity_reserve_bytes=reserve_bytes,
        state_dir=state_dir,
        status_command_lines=status_command_lines,
    )
    with stop_on_signals() as stop:
        _or_exit(lambda: serve(config, stop))


@app.command()
def top(
    node_name: NodeOpt = None,
    policy_path: PolicyOpt = None,
    proc_root: ProcRootOpt = "/proc",
    cgroup_root: CgroupRootOpt = "/sys/fs/cgroup",
    sys_root: SysRootOpt = "/sys",
    fdinfo_root: FdinfoRootOpt = None,
    pod_logs_dir: PodLogsDirOpt = DEFAULT_POD_LOGS_DIR,
    kubelet_cgroup_root: KubeletCgroupRootOpt = "/",
    driver_root: DriverRootOpt = "",
    nvml_library: NvmlLibraryOpt = "",
    pods_file: PodsFileOpt = None,
    kubeconfig: KubeconfigOpt = None,
    once: Annotated[bool, typer.Option("--once", help="Print one table and exit.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the status document, as the agent's /status answers (one a refresh).")
    ] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between refreshes.", min=0.1)] = 2.0,
) -> None:
    """A live table of this node: GPU, pod, container, used, quota, %, state, who holds the quota (the driver's
    limit or the agent), and each process' PID, user and command. Changes nothing."""
    configure_logging("console", level="error")
    describe = describer(proc_root, command_lines=True)
    policy = _or_exit(lambda: policy_file(policy_path, Overrides())[0])
    # The agent here is this command's own: dry run, scanning every refresh, with none of `serve`'s parts.
    kubelet = _or_exit(lambda: kubelet_tree(kubelet_cgroup_root, proc_root, cgroup_root))
    setup = ScanSetup(node_name, policy, True, proc_root, cgroup_root, pods_file, kubeconfig,
                      nvml_location=NvmlLocation(driver_root, nvml_library), kubelet=kubelet,
                      pod_logs_dir=pod_logs_dir, sys_root=sys_root, fdinfo_root=fdinfo_root)  # fmt: skip
    metrics = Metrics()
    cluster = _or_exit(lambda: connect(setup, metrics))
    services = Services()
    try:
        cluster.start(services)
        if not cluster.pods.wait_synced(timeout_s=15):
            _fail(f"could not read this node's pods within 15s: {cluster.pods.problem()}", 1)
        if cluster.claims is not None and not cluster.claims.wait_synced(timeout_s=15):
            _say(f"warning: DRA claims not all read within 15s: {cluster.claims.problem() or 'slow'}")
        try:
            gpus = open_gpus_once(setup, services)
        except NvmlUnavailable as e:
            _fail(str(e), 1)
        agent = build_agent(setup, gpus, cluster, metrics)
        memory = memory_limiter(gpus, cgroup_root, services)
        cgroups = CgroupfsTree(cgroup_root, kubelet)
        facts = AgentFacts(__version__, node_name or "", policy.mode.value, True, interval)
        driver: DriverFacts | None = None  # asked once, at the first scan's GPUs
        with stop_on_signals() as stop:
            while not stop.is_set():
                report = agent.scan()
                held = read_held_limits(
                    memory, cgroup_root, report.snapshot.containers, report.snapshot.devices, tree=cgroups
                )
                if as_json:
                    if driver is None:
                        support = ask_limits(memory, cgroup_root, report.snapshot.devices)
                        driver = with_limits(nvidia_side(gpus.nvml), support, "")
                    finished = agent.last_scan.finished_at if agent.last_scan is not None else None
                    age = SYSTEM_CLOCK.now() - finished if finished is not None else None
                    typer.echo(render(facts, age, scan_json(report, held, describe), driver).decode())
                else:
                    if not once and sys.stdout.isatty():
                        typer.echo("\x1b[H\x1b[2J", nl=False)
                    typer.echo(render_table(rows_from_report(report, describe, driver_limits=held)))
                if once:
                    return
                SYSTEM_CLOCK.wait(stop, interval)
    finally:
        services.stop(SHUTDOWN_BUDGET_S)


@policy_app.command("check")
def policy_check(
    file: Annotated[Path, typer.Argument(help="Policy file, or policy ConfigMap directory, to validate.")],
) -> None:
    """Validate a policy file; every error names the field and the value."""
    errors = check_policy_file(file)
    if errors:
        for line in errors:
            _say(printable(f"{file}: {line}"))  # one line per problem, whatever the file's name holds
        raise typer.Exit(1)
    typer.echo(printable(f"{file}: ok"))


@app.command()
def version(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object, with the Python version too.")] = False,
    cgroup_root: CgroupRootOpt = "/sys/fs/cgroup",
    driver_root: DriverRootOpt = "",
    nvml_library: NvmlLibraryOpt = "",
) -> None:
    """Print vramguard's version, nvidia-ml-py's, the NVIDIA driver's and NVML's, and whether the driver can hold
    per-cgroup memory limits here (R615+). Where NVML cannot be loaded, says why, and still exits 0."""
    configure_logging("console", level="error")
    driver = ask_driver("/proc", cgroup_root, NvmlLocation(driver_root, nvml_library))
    if as_json:
        typer.echo(json.dumps(version_dict(driver)))
    else:
        typer.echo("\n".join(printable(line) for line in version_lines(driver)))


_POSSIBLE = {True: "possible", False: "not possible", None: "unknown"}


def version_lines(driver: DriverFacts) -> list[str]:
    """What `vramguard version` prints: the agent, nvidia-ml-py, the driver and NVML, the limits; a line each."""
    bindings = (
        "binds the driver's per-cgroup memory limits"
        if driver.binds_limits
        else f"no bindings for the driver's per-cgroup memory limits: {BINDINGS_SINCE} or later has them"
    )
    if driver.driver_version is None:
        nvidia = f"NVIDIA driver: unknown ({driver.problem or 'NVML is not up'})"
    else:
        nvidia = f"NVIDIA driver {driver.driver_version}, NVML {driver.nvml_version}"
        if driver.nvml_library:
            nvidia += f" (loaded from {driver.nvml_library})"
    limits = f"driver limits: {_POSSIBLE[driver.limits_possible]}"
    if driver.limits_reason:
        limits += (
            f" (not everywhere: {driver.limits_reason})" if driver.limits_possible else f": {driver.limits_reason}"
        )
    return [
        f"vramguard {__version__}",
        f"nvidia-ml-py {driver.binding_version} ({bindings})",
        nvidia,
        limits,
    ]


def version_dict(driver: DriverFacts) -> dict[str, object]:
    """`vramguard version --json`: the agent's and Python's versions, and the NVIDIA side as /status has it, with
    whether nvidia-ml-py binds the limits and why NVML is not up ("" where it is)."""
    return {
        "vramguard": __version__,
        "python": sys.version.split()[0],
        "pid": os.getpid(),
        **driver_dict(driver),
        "binds_limits": driver.binds_limits,
        "nvml_problem": driver.problem,
        "nvml_library": driver.nvml_library or None,
    }


def main() -> None:
    app()
