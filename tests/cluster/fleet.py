"""A fleet of real agents on one real control plane, for bench/fleet.py and tests/cluster/test_fleet.py.

    fleet = Fleet(plane, api, workdir, poll_interval_s=5.0)
    fleet.add_nodes(50, pods_per_node=3, annotated_share=0.3)   # Nodes, pods bound to them, GPU processes
    fleet.start_agents()                                        # one `vramguard run --mode warn` per node
    fleet.wait_ready(timeout_s=300)
    agent_requests(plane.audit_events())                        # what the agents asked the API server
    read = read_with_plugin(plane)                              # every agent's /status, as kubectl-vramguard reads it
    fleet.close()

Each node is a `KubeNode` (kube_fixtures): a Node in the API server, the agent's token bound to its pod on that
node (so the audit log names the node of every request an agent makes), and a simulated GPU over the test NVML
with real kubelet-shaped cgroups. Its pods are real API objects bound to it, each with one container whose quota
is `vramguard.io/vram` in its limits or, for a share of them, the pod annotation `vramguard.io/vram-limit`, and
one real process in the container's cgroup that the node's NVML state lists with `USED_BYTES`. Each node has its
own agent: its own NVML state, metrics port and state directory; `agent_src` runs the agents from another
checkout's ``src`` (PYTHONPATH ahead of the installed package).

The plugin finds each agent as it finds the DaemonSet's: a Pod in the agent namespace labelled
`app.kubernetes.io/name: vramguard`, bound to the agent's Node, with a container port `metrics` (the agent's port),
Running with this machine's non-loopback IPv4 address as its pod IP (set through the status subresource, as a
kubelet would; the API server's pod proxy refuses loopback and link-local addresses), so the agents listen on all
interfaces. It is another pod than the one the agent's token is bound to: a pod's container ports cannot change.

Agents on one machine do not see each other's pods, though they share /sys/fs/cgroup: in warn mode there are no
driver limits, so no cgroup watcher (the agent watches cgroups only for its limiter) and no kills; each agent's
NVML lists only its own node's processes, and it attributes a process through the process' cgroup to a pod of its
own pod cache, which holds only the pods bound to its node. `own_pods_only()` checks it from each agent's metrics.
"""

from __future__ import annotations

import ipaddress
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client, utils
from prometheus_client.parser import text_string_to_metric_families

from vramguard.core.quantity import GiB
from vramguard.plugin.fetch import AGENT_SELECTOR, PORT_NAME, find_agents, load_api, read_all
from vramguard.plugin.merge import Answer, Fetched, Row, merge_rows
from vramguard.plugin.render import Output, render_top
from vramguard_testbed.simnode import SimProcess, metric_value
from vramguard_testbed.waiting import WaitTimeout, wait_until

from .controlplane import _PDEATHSIG_SHIM, AuditEvent, ControlPlane, _create_ignoring_conflict
from .kube_fixtures import AGENT_NAMESPACE, MERGE, KubeNode

AGENT_USER = f"system:serviceaccount:{AGENT_NAMESPACE}:vramguard"
PLUGIN_USER_AGENT = "kubectl-vramguard/"  # the start of the plugin's user agent (fetch.load_api)
WORKLOAD_NAMESPACE = "fleet"
QUOTA = "4Gi"
USED_BYTES = 2 * GiB
OVER_BYTES = 6 * GiB  # over QUOTA: a violation
DRA_DRIVER = "gpu.nvidia.com"
# With DRA, claims come first, as the policy example advises for NVIDIA's DRA driver; the pods here name no claim,
# so their quota comes from the next sources, and the agent watches its node's ResourceSlices.
DRA_POLICY = f"""\
mode: warn
quota_sources:
  - claim:{DRA_DRIVER}
  - resource:vramguard.io/vram
  - annotation:vramguard.io/vram-limit
"""


def agent_requests(events: Iterable[AuditEvent], since_s: float = 0.0, until_s: float = math.inf) -> list[AuditEvent]:
    """The agents' requests (their ServiceAccount's) received in [since_s, until_s)."""
    return [e for e in events if e.username == AGENT_USER and since_s <= e.at_s < until_s]


def plugin_requests(events: Iterable[AuditEvent], since_s: float = 0.0, until_s: float = math.inf) -> list[AuditEvent]:
    """The plugin's requests (by its user agent) received in [since_s, until_s)."""
    return [e for e in events if e.user_agent.startswith(PLUGIN_USER_AGENT) and since_s <= e.at_s < until_s]


def audited_until_now(plane: ControlPlane) -> float:
    """When the API server received a request made now (a GET of a namespace that does not exist): the audit log
    is written before each response (blocking mode), so every request received before it is in the log (a
    long-running one, a WATCH or a pod proxy GET, once its response began)."""
    marker = f"audit-marker-{os.urandom(4).hex()}"
    with plane.api_client() as api:
        try:
            client.CoreV1Api(api).read_namespace(marker)
        except client.ApiException as e:
            if e.status != 404:
                raise
        else:
            raise RuntimeError(f"namespace {marker} exists")
    (event,) = [e for e in plane.audit_events() if e.resource == "namespaces" and e.name == marker]
    return event.at_s


def describe(event: AuditEvent) -> str:
    """``verb resource[/subresource]``, e.g. ``get nodes`` or ``patch nodes/status``."""
    resource = event.resource + (f"/{event.subresource}" if event.subresource else "") or event.request_uri
    return f"{event.verb} {resource}"


@dataclass(eq=False)
class FleetNode:
    """One node of the fleet and its agent."""

    kube: KubeNode
    processes: list[SimProcess] = field(default_factory=list)
    agent: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def name(self) -> str:
        return self.kube.name

    def metrics(self) -> str:
        status, text = self.kube.sim.http_get("/metrics")
        if status != 200:
            raise RuntimeError(f"the agent of {self.name} answered {status} on /metrics: {text[:200]}")
        return text

    def scans(self) -> float:
        """Scans the agent finished (vramguard_scan_duration_seconds_count)."""
        return metric_value(self.metrics(), "vramguard_scan_duration_seconds_count") or 0.0

    def log_tail(self, chars: int = 3000) -> str:
        if self.log_path is None:
            return "(no log)"
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return "(no log)"


class Fleet:
    """Nodes, their pods and processes, and one agent per node (see the module's docstring)."""

    def __init__(
        self,
        plane: ControlPlane,
        api: client.ApiClient,
        workdir: Path,
        *,
        agent_src: Path | None = None,
        poll_interval_s: float = 5.0,
        dra: bool = False,
    ) -> None:
        self.plane = plane
        self.api = api
        self.core = client.CoreV1Api(api)
        self.workdir = workdir
        self.agent_src = agent_src
        self.poll_interval_s = poll_interval_s
        self.dra = dra
        self.nodes: list[FleetNode] = []
        self.policy: Path | None = None
        if dra:
            self.policy = workdir / "policy.yaml"
            self.policy.write_text(DRA_POLICY)
        self._pods = 0

    # -- building ----------------------------------------------------------------------------------------------

    def add_nodes(self, count: int, *, pods_per_node: int = 3, annotated_share: float = 0.3) -> None:
        """`count` nodes, each with `pods_per_node` running pods (a process using USED_BYTES of a QUOTA each);
        `annotated_share` of the pods take their quota from the annotation rather than their limits."""
        namespace = client.V1Namespace(metadata=client.V1ObjectMeta(name=WORKLOAD_NAMESPACE))
        _create_ignoring_conflict(lambda: self.core.create_namespace(namespace))
        for _ in range(count):
            index = len(self.nodes)
            kube = KubeNode(
                self.plane, self.api, self.workdir / f"node-{index:04d}", labels={"nvidia.com/gpu.present": "true"}
            )
            node = FleetNode(kube)
            self.nodes.append(node)
            for p in range(pods_per_node):
                # Spread the annotated pods evenly: the k-th pod is annotated when k * share crosses an integer.
                annotated = math.floor((self._pods + 1) * annotated_share) > math.floor(self._pods * annotated_share)
                self._pods += 1
                _, sim_pod = kube.pod(
                    f"{kube.name}-job-{p}",
                    WORKLOAD_NAMESPACE,
                    limits=None if annotated else {"vramguard.io/vram": QUOTA},
                    annotations={"vramguard.io/vram-limit": QUOTA} if annotated else None,
                )
                node.processes.append(kube.sim.spawn(sim_pod, "main", USED_BYTES))
            if self.dra:
                self._publish_slice(kube)

    def _publish_slice(self, kube: KubeNode) -> None:
        """The node's ResourceSlice, one device per GPU named by the UUID its NVML reports (NVIDIA's DRA driver
        publishes the same)."""
        devices = [
            {"name": f"gpu-{g.index}", "attributes": {"uuid": {"string": g.uuid}},
             "capacity": {"memory": {"value": str(g.total_bytes)}}}
            for g in kube.sim.nvml.gpu_list
        ]  # fmt: skip
        utils.create_from_dict(  # type: ignore[no-untyped-call]  # untyped in the client
            self.api,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{kube.name}-gpus"},
                "spec": {
                    "driver": DRA_DRIVER,
                    "nodeName": kube.name,
                    "pool": {"name": kube.name, "generation": 1, "resourceSliceCount": 1},
                    "devices": devices,
                },
            },
        )

    # -- the agents --------------------------------------------------------------------------------------------

    def agent_env(self, node: FleetNode) -> dict[str, str]:
        env = node.kube.sim.env
        if self.agent_src is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(self.agent_src), *filter(None, [env.get("PYTHONPATH")])])
        return env

    def start_agents(self, extra_args: Sequence[str] = ()) -> None:
        """Start every node's agent (`vramguard run --mode warn`), logging to the node's directory."""
        for node, port in zip(self.nodes, listen_ports(len(self.nodes)), strict=True):
            sim = node.kube.sim
            sim.metrics_port = port
            # All interfaces: the API server's pod proxy reaches the agent at this machine's address, the tests at
            # 127.0.0.1.
            argv = sim.vramguard_argv(
                "run", "--metrics-port", str(sim.metrics_port), "--metrics-bind-address", "0.0.0.0",
                "--log-format", "json", "--mode", "warn", "--poll-interval", f"{self.poll_interval_s:g}",
                *(["--policy", str(self.policy)] if self.policy else []), *extra_args,
            )  # fmt: skip
            # Through the control plane's shim: an agent dies with the process that started it, even by SIGKILL.
            argv = [sys.executable, "-I", "-S", "-c", _PDEATHSIG_SHIM, str(os.getpid()), *argv]
            node.log_path = sim.workdir / "agent.log"
            with node.log_path.open("ab") as log:
                node.agent = subprocess.Popen(
                    argv, env=self.agent_env(node), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
                )
        self.publish_agent_pods()

    def publish_agent_pods(self) -> None:
        """Each agent's Pod as the plugin looks for it (see the module's docstring), Running at this machine's
        address."""
        address = host_address()
        label, value = AGENT_SELECTOR.split("=", 1)
        for node in self.nodes:
            name = f"vramguard-agent-{node.name}"
            pod = client.V1Pod(
                metadata=client.V1ObjectMeta(name=name, labels={label: value}),
                spec=client.V1PodSpec(
                    node_name=node.name,
                    service_account_name="vramguard",
                    containers=[
                        client.V1Container(
                            name="vramguard",
                            image="vramguard:test",
                            ports=[client.V1ContainerPort(name=PORT_NAME, container_port=node.kube.sim.metrics_port)],
                        )
                    ],
                ),
            )
            self.core.create_namespaced_pod(AGENT_NAMESPACE, pod)
            status = {"phase": "Running", "podIP": address, "podIPs": [{"ip": address}], "hostIP": address}
            self.core.patch_namespaced_pod_status(name, AGENT_NAMESPACE, {"status": status}, _content_type=MERGE)

    def wait_ready(self, timeout_s: float) -> float:
        """Wait until every agent's /readyz answers 200; the seconds it took. Raises with the log of an agent
        that exited or is still not ready."""
        started = time.monotonic()
        waiting = list(self.nodes)

        def all_ready() -> bool:
            for node in list(waiting):
                if node.agent is not None and node.agent.poll() is not None:
                    code = node.agent.returncode
                    raise RuntimeError(f"the agent of {node.name} exited with {code}; its log ends:\n{node.log_tail()}")
                if node.kube.sim.http_get("/readyz")[0] == 200:
                    waiting.remove(node)
            return not waiting

        try:
            wait_until(all_ready, timeout_s, what="every agent's /readyz to answer 200", interval_s=0.5)
        except WaitTimeout:
            node = waiting[0]
            raise RuntimeError(
                f"{len(waiting)} of {len(self.nodes)} agents not ready after {timeout_s:.0f}s; {node.name}'s "
                f"/readyz: {node.kube.sim.http_get('/readyz')}; its log ends:\n{node.log_tail()}"
            ) from None
        return time.monotonic() - started

    def agent_pids(self) -> list[int]:
        return [n.agent.pid for n in self.nodes if n.agent is not None and n.agent.poll() is None]

    def exited(self) -> list[FleetNode]:
        """The nodes whose agent is no longer running."""
        return [n for n in self.nodes if n.agent is not None and n.agent.poll() is not None]

    def own_pods_only(self) -> list[str]:
        """What each agent reports that is not its own node's: containers of other pods than its own, or GPU
        memory it could not attribute. Empty when the agents keep to their own pods."""
        problems = []
        for node in self.nodes:
            text = node.metrics()
            mine = {p.pod.name for p in node.processes if p.pod is not None}
            reported = {
                labels.get("pod", "")
                for labels in _sample_labels(text, "vramguard_container_gpu_memory_used_bytes")
                if labels.get("namespace") == WORKLOAD_NAMESPACE
            }
            if reported != mine:
                problems.append(f"{node.name} reports pods {sorted(reported)}, its own are {sorted(mine)}")
            unattributed = metric_value(text, "vramguard_unattributed_gpu_memory_bytes") or 0.0
            if unattributed:
                problems.append(f"{node.name} reports {unattributed:.0f} unattributed bytes")
        return problems

    def violate(self, share: float) -> list[FleetNode]:
        """On `share` of the nodes (at least one when above 0), every pod's process goes over its quota."""
        count = min(len(self.nodes), math.ceil(share * len(self.nodes))) if share > 0 else 0
        chosen = self.nodes[:count]
        for node in chosen:
            for proc in node.processes:
                node.kube.sim.set_usage(proc, OVER_BYTES)
        return chosen

    def stop_agents(self, timeout_s: float = 15.0) -> None:
        """SIGTERM every agent at once, then reap each (SIGKILL after `timeout_s`)."""
        running = [n.agent for n in self.nodes if n.agent is not None and n.agent.poll() is None]
        for agent in running:
            agent.terminate()
        deadline = time.monotonic() + timeout_s
        for agent in running:
            try:
                agent.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()

    def close(self) -> None:
        """Stop the agents, then every node's processes and cgroups."""
        self.stop_agents()
        for node in self.nodes:
            node.kube.close()


@dataclass(frozen=True)
class PluginRead:
    """One read of every agent as `kubectl vramguard top -A` does it: the agents found, their answers, the merged
    rows and the rendered table, and when it started and ended (time.time(), the audit log's clock)."""

    agents: int
    fetched: list[Fetched]
    rows: list[Row]
    table: str
    started_s: float
    ended_s: float
    seconds: float  # monotonic, from the first request to the rendered table

    @property
    def answered(self) -> int:
        return sum(1 for f in self.fetched if isinstance(f, Answer))

    @property
    def failures(self) -> list[Row]:
        return [r for r in self.rows if r.error]


def read_with_plugin(plane: ControlPlane, kubeconfig: Path | None = None) -> PluginRead:
    """The plugin's code path, in-process: its API client from a kubeconfig (admin by default), the agent pods
    found in every namespace, each agent's /status through the pod proxy, merged and rendered as a table."""
    api, _ = load_api(str(kubeconfig or plane.kubeconfig_path), None)
    try:
        core = client.CoreV1Api(api)
        started_s = time.time()
        t0 = time.monotonic()
        agents = find_agents(core)
        fetched = read_all(core, agents)
        rows = merge_rows(fetched)
        table = render_top(rows, Output.table)
        seconds = time.monotonic() - t0
        return PluginRead(len(agents), fetched, rows, table, started_s, time.time(), seconds)
    finally:
        api.close()


def host_address() -> str:
    """This machine's IPv4 address that the API server's pod proxy accepts: neither loopback nor link-local.
    The route to a public address says which (a UDP connect sends nothing); else the first such in `ip -4 addr`."""
    candidates: list[str] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: routed by a default route, never answered
            candidates.append(s.getsockname()[0])
        except OSError:
            pass
    listed = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=False).stdout
    candidates += [line.split()[3].split("/")[0] for line in listed.splitlines() if len(line.split()) > 3]
    for candidate in candidates:
        try:
            ip = ipaddress.IPv4Address(candidate)
        except ValueError:
            continue
        if not (ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast):
            return candidate
    raise RuntimeError(f"no IPv4 address but loopback or link-local here (seen: {candidates or 'none'})")


def _sample_labels(text: str, name: str) -> list[Mapping[str, str]]:
    return [
        sample.labels
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


def listen_ports(count: int, start: int = 20000) -> list[int]:
    """`count` ports free now on every interface, below the kernel's ephemeral range (32768 and up): a port that
    bind(0) picked there can be taken by an outgoing connection (fifty agents hold hundreds) before its agent
    listens on it."""
    ports: list[int] = []
    port = start
    while len(ports) < count and port < 32768:
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                pass
            else:
                ports.append(port)
        port += 1
    if len(ports) < count:
        raise RuntimeError(f"only {len(ports)} free ports between {start} and 32767, {count} wanted")
    return ports
