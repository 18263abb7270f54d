"""A simulated GPU node: the test NVML library, real processes in real kubelet-shaped cgroups, and a pod list.

Everything the agent reads is real except the GPU: NVML answers through nvidia-ml-py's own ctypes code from the
test library (`fakenvml`), processes are real and sit in real cgroups (`cgroups`), and pods come from a
`kubectl get pods -o yaml`-shaped file. The agent itself runs as `vramguard run`, a subprocess. Used by
`vramguard demo`, the end-to-end tests and `bench/scan.py`.

    with SimulatedNode(workdir) as node:
        web = node.add_pod("trainer", "ml", containers={"main": {"vramguard.io/vram": "8Gi"}})
        proc = node.spawn(web, "main", used_bytes=6 * GiB)
        agent = node.start_agent("--mode", "kill", "--poll-interval", "0.1")
        node.set_usage(proc, 9 * GiB)    # crosses the quota; the agent kills it
        proc.wait(timeout=1)

GPU processes hold a file under `workdir` open, as CUDA processes hold /dev/nvidia*; the agent is started with
that file's path as its device prefix, so its killer finds forked children the way it would on a real node.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from vramguard.core.quantity import GiB
from vramguard_testbed.cgroups import ContainerCgroup, KubeletCgroups, PodCgroup, device_holder_argv
from vramguard_testbed.drmnode import DrmStandIn
from vramguard_testbed.fakenvml import Allocator, FakeNode, build_fake_nvml, fake_nvml_env
from vramguard_testbed.supervisor import Supervisor
from vramguard_testbed.waiting import wait_until


@dataclass(eq=False)
class SimPod:
    name: str
    namespace: str
    cgroup: PodCgroup
    containers: dict[str, ContainerCgroup]
    limits: dict[str, dict[str, str]]
    annotations: dict[str, str]
    priority: int
    qos: str
    # DRA: the claims the pod names (spec.resourceClaims[].name → the ResourceClaim's name), and each container's.
    resource_claims: dict[str, str] = field(default_factory=dict)
    container_claims: dict[str, list[str]] = field(default_factory=dict)
    env: dict[str, dict[str, str]] = field(default_factory=dict)  # container → its env[] literal values

    @property
    def uid(self) -> str:
        return self.cgroup.uid

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(eq=False)
class SimProcess:
    """A real process using `used_bytes` of a simulated GPU."""

    popen: subprocess.Popen[Any]
    gpu: int
    used_bytes: int
    pod: SimPod | None = None
    container: str | None = None
    children: list[int] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)


class SimulatedNode:
    def __init__(
        self,
        workdir: Path,
        *,
        gpus: int = 1,
        gpu_total_bytes: int = 24 * GiB,
        gpu_name: str = "NVIDIA H100 (simulated)",
        driver: str = "systemd",
        cgroup_version: int = 2,
        node_name: str = "gpu-node-1",
        node_labels: Mapping[str, str] | None = None,
        real_gpu: bool = False,
        driver_limits: bool | None = None,
        amd_gpus: int = 0,
    ) -> None:
        """With `real_gpu`, NVML is the machine's driver: no test library, and processes use real memory.

        `driver_limits`: None, a driver without per-cgroup memory limits support on its GPUs (the default, like
        R550); True, an R615+ driver that holds them; False, a driver before R615 (the library lacks the
        functions). Either way processes may allocate through `spawn_allocator`.

        `amd_gpus`: instead of NVIDIA's, that many AMD Instinct MI300X GPUs, seen through the kernel's DRM stats
        (`drmnode.DrmStandIn`: a stand-in /sys and fdinfo around the real processes); no NVML at all.
        """
        self.real_gpu = real_gpu
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.node_name = node_name
        self.node_labels = dict(node_labels or {})
        self.state_path = workdir / "nvml-state"
        self.pods_path = workdir / "pods.yaml"
        self.device_path = workdir / "nvidia0"  # held open by GPU processes, like /dev/nvidia0
        self.state_dir = workdir / "agent-state"  # the agent's --state-dir: it outlives an agent, as a hostPath
        # The kubelet's podLogsDir: it makes `<namespace>_<name>_<uid>` for each pod it sets up (`add_pod`).
        self.pod_logs = workdir / "pod-logs"
        self.pod_logs.mkdir(exist_ok=True)
        self.device_path.touch()
        self.drm = DrmStandIn(workdir / "drm", gpus=amd_gpus) if amd_gpus else None
        fake_nvml = not real_gpu and self.drm is None
        self.lib_dir = build_fake_nvml(memory_limits=driver_limits is not False) if fake_nvml else None
        self.nvml = FakeNode.gpus(gpus, total_bytes=gpu_total_bytes, name=gpu_name)
        self.nvml.drop_dead_pids = True  # the driver frees a process' memory when it exits
        if driver_limits:
            self.nvml.memory_limits = True
            self.nvml.driver_version, self.nvml.nvml_version = "615.40.02", "13.615.40.02"
        self.cgroups = KubeletCgroups(driver=driver, version=cgroup_version)
        self.pods: list[SimPod] = []
        self.objects: list[dict[str, Any]] = []  # more objects for the pods file: ResourceClaims, ResourceSlices
        self.processes: list[SimProcess] = []
        self._agents: list[subprocess.Popen[Any]] = []
        self.metrics_port = 0
        self.health_file = workdir / "health"  # where `vramguard run` writes what the kubelet's probes read
        self.poll_interval_s = 1.0  # the running agent's --poll-interval (vramguard's default until one is given)
        # With a kubeconfig, `vramguard run`/`top` watch the API server for pods instead of reading pods.yaml.
        self.kubeconfig: Path | None = None
        self.sync()

    # -- building the node --------------------------------------------------------------------------------

    def add_pod(
        self,
        name: str,
        namespace: str = "default",
        *,
        containers: Mapping[str, Mapping[str, str]] | None = None,
        annotations: Mapping[str, str] | None = None,
        priority: int = 0,
        qos: str = "burstable",
        uid: str | None = None,
        claims: Mapping[str, str] | None = None,
        env: Mapping[str, Mapping[str, str]] | None = None,
    ) -> SimPod:
        """A pod with one cgroup per container; `containers` maps container name → resources.limits.

        `uid` names the cgroup after a real pod (one created in an API server); by default it is random.
        `claims` maps each container to the ResourceClaim it uses (a claim of that name must be in `objects`).
        `env` maps a container to the variables its `env[]` sets, each a literal `value`.
        """
        specs = {c: dict(limits) for c, limits in (containers or {"main": {}}).items()}
        pod_cgroup = self.cgroups.pod(uid=uid, qos=qos)
        pod = SimPod(
            name=name,
            namespace=namespace,
            cgroup=pod_cgroup,
            containers={c: pod_cgroup.container() for c in specs},
            limits=specs,
            annotations=dict(annotations or {}),
            priority=priority,
            qos=qos,
            resource_claims={f"claim-{c}": claim for c, claim in (claims or {}).items()},
            container_claims={c: [f"claim-{c}"] for c in (claims or {})},
            env={c: dict(variables) for c, variables in (env or {}).items()},
        )
        self.pods.append(pod)
        (self.pod_logs / f"{namespace}_{name}_{pod.uid}").mkdir(exist_ok=True)
        self.sync()
        return pod

    def publish_shares(self, shares: Mapping[str, tuple[str, int, str]], driver: str = "gpu.nvidia.com") -> None:
        """DRA objects for the pods file: this node's ResourceSlice (one device per GPU, named by the UUID NVML
        reports, as NVIDIA's DRA driver publishes it) and an allocated claim for each entry of `shares`
        (claim name → (namespace, GPU index, consumed memory such as "10Gi")), as the scheduler leaves it."""
        devices = [
            {"name": f"gpu-{g.index}", "attributes": {"uuid": {"string": g.uuid}},
             "capacity": {"memory": {"value": str(g.total_bytes)}}}
            for g in self.nvml.gpu_list
        ]  # fmt: skip
        spec = {"driver": driver, "nodeName": self.node_name, "pool": {"name": self.node_name}, "devices": devices}
        objects: list[dict[str, Any]] = [
            {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "gpus"}, "spec": spec}
        ]
        for name, (namespace, gpu, memory) in shares.items():
            share_id = str(uuid.uuid5(uuid.NAMESPACE_URL, name))
            result = {"request": "gpu", "driver": driver, "pool": self.node_name, "device": f"gpu-{gpu}",
                      "consumedCapacity": {"memory": memory}, "shareID": share_id}  # fmt: skip
            objects.append({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
                "status": {"allocation": {"devices": {"results": [result]}}},
            })  # fmt: skip
        self.objects = objects
        self.sync()

    def spawn(self, pod: SimPod, container: str, used_bytes: int, *, gpu: int = 0, children: int = 0) -> SimProcess:
        """A real process in the container's cgroup, holding the simulated device and using `used_bytes`."""
        device = self.drm.render_path(gpu) if self.drm is not None else self.device_path
        popen = pod.containers[container].spawn(
            device_holder_argv(str(device), children=children), stdout=subprocess.PIPE, text=True
        )
        proc = SimProcess(popen=popen, gpu=gpu, used_bytes=used_bytes, pod=pod, container=container)
        assert popen.stdout is not None
        proc.children = [int(popen.stdout.readline()) for _ in range(children)]
        self.processes.append(proc)
        self.sync()
        return proc

    def spawn_command(self, pod: SimPod, container: str, argv: Sequence[str], **popen_kwargs: Any) -> SimProcess:
        """Any command in the container's cgroup (a real CUDA program on a real GPU); NVML reports its memory."""
        proc = SimProcess(popen=pod.containers[container].spawn(argv, **popen_kwargs), gpu=0, used_bytes=0)
        proc.pod, proc.container = pod, container
        return proc

    def spawn_allocator(self, pod: SimPod, container: str) -> Allocator:
        """A simulated CUDA process in the container's cgroup that allocates through the driver (see Allocator):
        the driver refuses what the GPU has not free or what is over a hard limit of its cgroup."""
        if self.lib_dir is None:
            raise RuntimeError("allocators need the test NVML library")
        self._enable_allocations()
        io: dict[str, Any] = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True, "env": self.env}
        return Allocator(pod.containers[container].spawn(Allocator.argv(self.lib_dir), **io))

    def spawn_supervisor(self, pod: SimPod, container: str, worker_bytes: int, **shape: Any) -> subprocess.Popen[Any]:
        """A supervisor in the container's cgroup that respawns GPU workers of `worker_bytes` each (`shape`: the
        `Supervisor` fields interval_s, hold_s, respawn_delay_s, max_workers); it holds no GPU itself."""
        if self.lib_dir is None:
            raise RuntimeError("a supervisor's workers allocate through the test NVML library")
        self._enable_allocations()
        supervisor = Supervisor(self.lib_dir, self.device_path, worker_bytes, **shape)
        return pod.containers[container].spawn(supervisor.argv(), env=self.env)

    def container_used_bytes(self, pod: SimPod, container: str, gpu: int = 0) -> int:
        """What the container's live processes hold on `gpu` through the driver's allocations now (as NVML would
        count it), read from the test driver's allocations file and the cgroup's process list."""
        members = set(pod.containers[container].pids())
        try:
            records = Path(f"{self.state_path}.alloc").read_text().split("\n")
        except FileNotFoundError:
            return 0
        used = 0
        for line in records:
            fields = line.split()
            if len(fields) == 3 and int(fields[0]) == gpu and int(fields[1]) in members:
                used += int(fields[2])
        return used

    def restart_container(self, pod: SimPod, container: str) -> None:
        """The container as the kubelet restarts it: a new cgroup with a new runtime ID, named in the pod's status."""
        pod.containers[container] = pod.cgroup.container()
        self.sync()

    def spawn_host(self, used_bytes: int, *, gpu: int = 0) -> SimProcess:
        """A GPU process outside any pod (a node daemon, an SSH session): never to be touched."""
        popen = subprocess.Popen(device_holder_argv(str(self.device_path)), stdout=subprocess.DEVNULL)
        proc = SimProcess(popen=popen, gpu=gpu, used_bytes=used_bytes)
        self.processes.append(proc)
        self.sync()
        return proc

    def _enable_allocations(self) -> None:
        if not self.nvml.allocations:
            self.nvml.allocations = True  # only now: the library then reads its allocations file on every call
            self.sync()

    def set_usage(self, proc: SimProcess, used_bytes: int) -> None:
        """What NVML says `proc` uses; the pod list is not rewritten (an allocation changes no pod)."""
        proc.used_bytes = used_bytes
        self._sync_nvml()

    def sync(self) -> None:
        """Write what NVML and the pod list should say now (each file replaced atomically)."""
        self._sync_nvml()
        tmp = self.pods_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(self.pod_list()))
        os.replace(tmp, self.pods_path)

    def _sync_nvml(self) -> None:
        if self.drm is not None:
            for proc in self.processes:
                if proc.alive():
                    self.drm.set_usage(proc.pid, proc.used_bytes, proc.gpu)
                else:
                    self.drm.forget(proc.pid)
        elif not self.real_gpu:
            for gpu in self.nvml.gpu_list:
                gpu.processes = []
            for proc in self.processes:
                self.nvml.gpu(proc.gpu).add_process(proc.pid, proc.used_bytes)
            self.nvml.write(self.state_path)

    def pod_list(self) -> dict[str, Any]:
        """The pods as `kubectl get pods -o yaml` prints them, and the Node with its labels."""
        items: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node_name, "labels": self.node_labels}}
        ]
        for pod in self.pods:
            items.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": pod.name,
                        "namespace": pod.namespace,
                        "uid": pod.uid,
                        "annotations": pod.annotations,
                    },
                    "spec": {
                        "nodeName": self.node_name,
                        "priority": pod.priority,
                        "resourceClaims": [{"name": r, "resourceClaimName": n} for r, n in pod.resource_claims.items()],
                        "containers": [
                            {
                                "name": c,
                                "image": "busybox",
                                "env": [{"name": k, "value": v} for k, v in pod.env.get(c, {}).items()],
                                "resources": {
                                    "limits": pod.limits[c],
                                    "claims": [{"name": r} for r in pod.container_claims.get(c, [])],
                                },
                            }
                            for c in pod.containers
                        ],
                    },
                    "status": {
                        "qosClass": pod.qos.capitalize() if pod.qos != "besteffort" else "BestEffort",
                        "containerStatuses": [
                            {"name": c, "containerID": f"containerd://{cg.container_id}"}
                            for c, cg in pod.containers.items()
                        ],
                    },
                }
            )
        return {"apiVersion": "v1", "kind": "List", "items": items + self.objects}

    # -- running vramguard against it -----------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        """The environment in which vramguard's pynvml loads the test NVML library and reads this node."""
        if self.lib_dir is None:
            return dict(os.environ)
        return fake_nvml_env(self.lib_dir, self.state_path)

    def vramguard_argv(self, command: str, *args: str) -> list[str]:
        base = [sys.executable, "-m", "vramguard", command]
        if command in ("run", "top"):
            source = ["--kubeconfig", str(self.kubeconfig)] if self.kubeconfig else ["--pods-file", str(self.pods_path)]
            base += [*source, "--node-name", self.node_name, "--pod-logs-dir", str(self.pod_logs)]
        if command == "run":
            base += ["--state-dir", str(self.state_dir), "--health-file", str(self.health_file)]
        if command == "run" and not self.real_gpu:
            base += ["--gpu-device-prefix", str(self.device_path)]
        if command in ("run", "top") and self.drm is not None:
            # No NVML here, even on a machine that has one: the node's GPUs are the stand-in's alone.
            base += [*self.drm.argv(command), "--nvml-library", str(self.workdir / "no-nvml" / "libnvidia-ml.so.1")]
        return base + list(args)

    def start_agent(self, *args: str, **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """`vramguard run` on this node, with its metrics on a free port (`self.metrics_port`) and its health in
        `self.health_file` (`probe`)."""
        self.metrics_port = free_port()
        self.poll_interval_s = float(args[args.index("--poll-interval") + 1]) if "--poll-interval" in args else 1.0
        argv = self.vramguard_argv("run", "--metrics-port", str(self.metrics_port), "--log-format", "json", *args)
        agent = subprocess.Popen(argv, env=self.env, **popen_kwargs)
        self._agents.append(agent)
        return agent

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Block until the agent's /readyz says ready (NVML up, pods synced, one scan done)."""
        wait_until(lambda: self.http_get("/readyz")[0] == 200, timeout_s, what="the agent's /readyz", interval_s=0.05)

    def scans(self) -> float:
        """How many scans the agent has completed (its vramguard_scan_duration_seconds_count; 0 before its first)."""
        return metric_value(self.http_get("/metrics")[1], "vramguard_scan_duration_seconds_count") or 0.0

    def wait_scans(self, n: int, timeout_s: float | None = None) -> None:
        """Block until the agent has completed `n` more scans. This is how a test lets time pass for the agent
        before it asserts that something did not happen: a count of the agent's own cycles, not a sleep. By
        default it waits ten poll intervals a scan, and 5 s more."""
        target = self.scans() + n
        limit_s = timeout_s if timeout_s is not None else n * self.poll_interval_s * 10 + 5
        wait_until(lambda: self.scans() >= target, limit_s, what=f"{n} more scans of the agent (to {target:g})")

    def probe(self, check: str, timeout_s: float = 1.0) -> tuple[bool, str, float]:
        """What the kubelet's exec probe `vramguard-probe <check>` answers, as the kubelet runs it (a process, with
        a timeout): (passed, its output line, seconds it took); a probe past `timeout_s` fails."""
        argv = [str(Path(sys.executable).with_name("vramguard-probe")), check, "--file", str(self.health_file)]
        started = time.monotonic()
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False, f"timed out after {timeout_s}s", time.monotonic() - started
        return done.returncode == 0, done.stdout.strip(), time.monotonic() - started

    def http_get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError as e:
            return 0, str(e)

    def run_vramguard(self, command: str, *args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.vramguard_argv(command, *args), env=self.env, capture_output=True, text=True, timeout=timeout_s
        )

    # -- teardown -----------------------------------------------------------------------------------------

    def stop_agents(self) -> None:
        for agent in self._agents:
            if agent.poll() is None:
                agent.terminate()
                try:
                    agent.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    agent.kill()
                    agent.wait()
        self._agents.clear()

    def close(self) -> None:
        self.stop_agents()
        for proc in self.processes:
            if proc.pod is None and proc.alive():
                proc.popen.kill()
                proc.popen.wait()
        self.cgroups.close()  # kills and reaps everything in the pod cgroups, removes the directories

    def __enter__(self) -> SimulatedNode:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def json_logs(agent: subprocess.Popen[str]) -> list[dict[str, Any]]:
    """The JSON log lines of an agent that was stopped (started with `stderr=subprocess.PIPE, text=True`)."""
    _, err = agent.communicate(timeout=15)
    out = []
    for line in err.splitlines():
        with contextlib.suppress(ValueError):  # a non-JSON line would be a traceback: the asserts will show it
            out.append(json.loads(line))
    return out


def metric_value(metrics_text: str, name: str, labels: Mapping[str, str] | None = None) -> float | None:
    """The summed value of the samples named `name` whose labels include `labels`, read with client_python's
    own parser from the Prometheus text format; None when there is none."""
    wanted = dict(labels or {})
    values = [
        sample.value
        for family in text_string_to_metric_families(metrics_text)
        for sample in family.samples
        if sample.name == name and wanted.items() <= sample.labels.items()
    ]
    return sum(values) if values else None


__all__: Sequence[str] = ("SimPod", "SimProcess", "SimulatedNode", "free_port", "metric_value")
