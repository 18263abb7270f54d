"""A real Kubernetes node for tests: a kubelet built from the same go.mod as the control plane, on a private
containerd (tests/cluster/containerd.py), joined to a `ControlPlane(kubelets=True)`.

    plane = ControlPlane(find_binaries(), kubelets=True).start()
    plane.start_controller_manager(controllers=NODE_CONTROLLERS)
    plane.start_scheduler()
    with RealNode(plane, Path("/tmp/vg-node-1"), labels={"nvidia.com/gpu.present": "true"}) as node:
        node.import_images(IMAGES / "pause-1.tar", IMAGES / "workload-1.tar")
        node.kubectl("get", "nodes")

What is real: the kubelet registers the Node and keeps its status; it runs pods through containerd's CRI and runc
in the cgroups it makes (cgroupfs driver, ``/kubepods/<qos>/pod<uid>/<container id>`` in every v1 hierarchy and in
the v2 ``unified`` one); it mounts ServiceAccount tokens, runs probes, restarts killed containers, carries out
evictions and serves ``kubectl exec`` and ``logs``. Pods get addresses from a bridge on a private /24 that has no
gateway, masquerade or forwarding (a node without a CNI network stays NotReady); nothing leaves the machine.

The kubelet changes the host beyond its own directories (`docs/architecture.md` "A real node in tests"): a few
sysctls, hard-coded paths (``/var/lib/kubelet/device-plugins``, ``/var/log/containers``), cgroups, and the node's
address and bridge. `HostChanges` records what was there before and `stop()` puts it back.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from kubernetes import client

from vramguard_testbed.waiting import WaitTimeout, wait_until

from .containerd import Containerd, CtrFailed
from .containerd import unavailable_reason as containerd_unavailable
from .controlplane import NODE_BINARIES, Component, ControlPlane, ControlPlaneError, binaries_dir, free_port

# A private address for the node (the kubelet refuses loopback), on `lo`: this kernel has no dummy driver.
NODE_IP = "10.254.254.1"
POD_SUBNET = "10.254.0.0/24"
BRIDGE = "vgbr0"
# What the node needs from kube-controller-manager: the not-ready taint lifted, each namespace's "default"
# ServiceAccount and kube-root-ca.crt (for token volumes), DaemonSet pods, PodDisruptionBudget status (for
# evictions), the garbage collector (helm uninstall deletes a DaemonSet's pods through it), and the Services'
# Endpoints (Prometheus' Kubernetes discovery reads the agent's).
NODE_CONTROLLERS = ",".join(
    (
        "node-lifecycle-controller",
        "serviceaccount-controller",
        "root-ca-certificate-publisher-controller",
        "daemonset-controller",
        "disruption-controller",
        "garbage-collector-controller",
        "endpoints-controller",
    )
)
# The kubelet's setupKernelTunables (protectKernelDefaults: false) writes these.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# Paths the kubelet or the CNI plugins create whatever their configured directories are (containerd's own are
# Containerd's to clean), and the chart's hostPath for the agent's state.
HARD_CODED_PATHS = ("/var/lib/kubelet", "/var/log/containers", "/var/log/pods", "/var/lib/cni", "/var/lib/vramguard")
CGROUP_ROOT = Path("/sys/fs/cgroup")
_POLL_S = 0.2


def unavailable_reason() -> str | None:
    """Why a real node cannot start here (and which script provides what is missing), or None."""
    missing = [name for name in NODE_BINARIES if not os.access(binaries_dir() / name, os.X_OK)]
    if missing:
        return f"{', '.join(missing)} not built in {binaries_dir()} (run scripts/controlplane.sh)"
    if shutil.which("ip") is None:
        return "the ip command is missing (iproute2)"
    return containerd_unavailable()


@dataclass
class HostChanges:
    """What the node changes on the host outside its work directory, recorded before it starts."""

    sysctls: dict[str, str] = field(default_factory=dict)
    absent_paths: list[str] = field(default_factory=list)

    @classmethod
    def record(cls) -> HostChanges:
        sysctls = {}
        for name in KUBELET_SYSCTLS:
            with contextlib.suppress(OSError):
                sysctls[name] = Path("/proc/sys", name).read_text().strip()
        return cls(sysctls, [p for p in HARD_CODED_PATHS if not os.path.lexists(p)])

    def restore(self) -> None:
        for name, value in self.sysctls.items():
            with contextlib.suppress(OSError):
                Path("/proc/sys", name).write_text(value)
        for path in self.absent_paths:
            _unmount_under(Path(path))
            shutil.rmtree(path, ignore_errors=True)
        _remove_cgroup_trees("kubepods")


class RealNode:
    """`with RealNode(plane, workdir) as node:` starts containerd and a kubelet registered as `name`, and waits
    until the Node is Ready and untainted; leaving deletes the node's pods, stops both and restores the host.

    `workdir` must be short (containerd's socket path must fit in sun_path) and is removed at the end.
    """

    def __init__(
        self,
        plane: ControlPlane,
        workdir: Path,
        *,
        name: str = "vg-node-1",
        labels: Mapping[str, str] | None = None,
        ready_timeout_s: float = 90.0,
    ) -> None:
        if not plane.kubelets:
            raise ControlPlaneError("a real node needs ControlPlane(kubelets=True)")
        self.plane = plane
        self.workdir = workdir
        self.name = name
        self.labels = dict(labels or {})
        self.ready_timeout_s = ready_timeout_s
        self.containerd = Containerd(workdir / "containerd")
        # The kubelet's staticPodPath: a Pod manifest written here runs as a static pod (its mirror pod in the API).
        self.static_pods = workdir / "manifests"
        self.kubelet: Component | None = None
        self._host: HostChanges | None = None
        self._stack = contextlib.ExitStack()

    # -- lifecycle -----------------------------------------------------------------------------------------------

    def __enter__(self) -> RealNode:
        self._host = HostChanges.record()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        _ip("addr", "replace", f"{NODE_IP}/32", "dev", "lo")  # replace: a crashed run may have left it
        self._stack.callback(_ip_quiet, "addr", "del", f"{NODE_IP}/32", "dev", "lo")
        cni_dir = self.workdir / "containerd" / "cni"
        cni_dir.mkdir(parents=True, exist_ok=True)
        (cni_dir / "10-vramguard-test.conflist").write_text(json.dumps(self._cni_config(), indent=2))
        self._stack.callback(_ip_quiet, "link", "del", BRIDGE)
        self._stack.enter_context(self.containerd)
        self.static_pods.mkdir(exist_ok=True)

        config = self.workdir / "kubelet.yaml"
        config.write_text(yaml.safe_dump(self._kubelet_config(), sort_keys=False))
        argv = [
            str(binaries_dir() / "kubelet"),
            f"--config={config}",
            f"--kubeconfig={self.plane.node_kubeconfig(self.name)}",
            f"--root-dir={self.workdir / 'kubelet'}",
            f"--cert-dir={self.workdir / 'kubelet-pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={NODE_IP}",
            "--v=2",
        ]
        if self.labels:
            argv.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in self.labels.items()))
        self.kubelet = Component("kubelet", argv, self.workdir / "logs" / "kubelet.log")
        self.kubelet.start()
        self.kubelet.wait_until(self._ready, self.ready_timeout_s, "Ready and untainted")

    def stop(self) -> None:
        """Delete the node's pods and wait (briefly) for the kubelet to tear them down, then stop the kubelet and
        containerd, unmount what they left, and restore the host. Idempotent."""
        if self.kubelet is not None and self.kubelet.running():
            with contextlib.suppress(Exception):
                self._drain()
        if self.kubelet is not None:
            self.kubelet.stop()
        self._stack.close()
        _unmount_under(self.workdir)
        if self._host is not None:
            self._host.restore()
            self._host = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _drain(self, timeout_s: float = 60.0) -> None:
        # A static pod stops only with its manifest gone (deleting its mirror pod makes the kubelet put it back).
        for manifest in self.static_pods.glob("*"):
            manifest.unlink()
        with self.plane.api_client() as api:
            core = client.CoreV1Api(api)
            selector = f"spec.nodeName={self.name}"
            pods = raw(api, core.list_pod_for_all_namespaces(field_selector=selector))["items"]
            # A DaemonSet's controller would put its pod back as soon as it is deleted (and the wait below would
            # run to its end): the DaemonSets go first.
            apps = client.AppsV1Api(api)
            for namespace, name in {
                (pod["metadata"]["namespace"], owner["name"])
                for pod in pods
                for owner in pod["metadata"].get("ownerReferences", [])
                if owner.get("kind") == "DaemonSet"
            }:
                with contextlib.suppress(client.ApiException):
                    apps.delete_namespaced_daemon_set(name, namespace, propagation_policy="Orphan")
            for pod in pods:
                meta = pod["metadata"]
                with contextlib.suppress(client.ApiException):
                    core.delete_namespaced_pod(meta["name"], meta["namespace"], grace_period_seconds=1)
            with contextlib.suppress(WaitTimeout):  # best effort: stop() tears down what is left anyway
                wait_until(
                    lambda: not self._running_tasks(),
                    timeout_s,
                    what="the kubelet to stop the node's containers",
                    interval_s=_POLL_S,
                )

    def _running_tasks(self) -> list[str]:
        """The containers whose process has not ended. An ended one stays listed as a container until the kubelet's
        garbage collection, which runs once a minute: waiting for the containers to go would wait for that."""
        rows = [line.split() for line in self.containerd.ctr("tasks", "ls").splitlines()[1:]]
        return [row[0] for row in rows if row and row[-1] != "STOPPED"]

    def _ready(self) -> bool:
        with self.plane.api_client() as api:
            try:
                node = raw(api, client.CoreV1Api(api).read_node(self.name))
            except client.ApiException:
                return False
        conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
        return conditions.get("Ready") == "True" and not node["spec"].get("taints")

    def _cni_config(self) -> dict[str, object]:
        return {
            "cniVersion": "1.0.0",
            "name": "vramguard-test",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    # No address on the bridge, no default route in pods, no NAT, no forwarding: pods reach each
                    # other on the bridge and nothing else.
                    "isGateway": False,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET}]],
                        "dataDir": str(self.workdir / "cni-ipam"),
                    },
                }
            ],
        }

    def _kubelet_config(self) -> dict[str, object]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs",  # PID 1 is not systemd
            "cgroupsPerQOS": True,
            "cgroupRoot": "/",  # what the agents here take as --kubelet-cgroup-root (its default, the chart's too)
            "failSwapOn": False,
            # This host's cgroups are hybrid (v1 controllers, the v2 hierarchy at unified/): kubelets from 1.35 on
            # refuse to run on it unless told to. Pods' cgroups are still made in the v2 hierarchy too.
            "failCgroupV1": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd.socket}",
            "address": NODE_IP,
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzPort": 0,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.plane.ca_path)},
            },
            "authorization": {"mode": "Webhook"},
            "podLogsDir": str(self.workdir / "pod-logs"),
            # This machine's disk and memory are what they are: evict only when truly out, and never collect the
            # images the tests imported (no registry could bring them back).
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "makeIPTablesUtilChains": False,
            "syncFrequency": "10s",
            "staticPodPath": str(self.static_pods),
            # How often the kubelet looks at staticPodPath (besides inotify, which it also uses).
            "fileCheckFrequency": "2s",
        }

    # -- access --------------------------------------------------------------------------------------------------

    def import_images(self, *archives: Path) -> None:
        """Load OCI archives into the node's containerd (the CRI's namespace), as a registry pull would."""
        for archive in archives:
            self.containerd.import_image(archive)

    def kubectl(self, *args: str, timeout_s: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
        """The built kubectl as the cluster's admin."""
        argv = [str(binaries_dir() / "kubectl"), f"--kubeconfig={self.plane.kubeconfig_path}", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=check)

    def container_pid(self, container_id: str) -> int:
        """The host PID of a running container's first process (`container_id` as in the pod's status, with or
        without its ``containerd://`` prefix), from containerd's own task list."""
        wanted = container_id.removeprefix("containerd://")
        for line in self.containerd.ctr("task", "ls").splitlines()[1:]:
            task, pid, status = line.split()[:3]
            if task == wanted and status == "RUNNING":
                return int(pid)
        raise LookupError(f"no running task {wanted} in the node's containerd")

    @property
    def pod_logs(self) -> Path:
        """The kubelet's podLogsDir: ``<namespace>_<pod>_<uid>/<container>/<restart>.log``, written by containerd."""
        return self.workdir / "pod-logs"

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """Everything a pod's container wrote, every run of it in turn, from the files containerd writes for the
        kubelet (CRI lines: time, stream, tag, text): readable with the kubelet stopped and after the pod is gone,
        until the kubelet removes them."""
        runs = sorted(self.pod_logs.glob(f"{namespace}_{pod}_*/{container}/*.log"), key=lambda p: int(p.stem))
        return "".join(run.read_text(errors="replace") for run in runs)

    # -- the kubelet away ----------------------------------------------------------------------------------------

    def stop_kubelet(self) -> None:
        """Stop the kubelet (SIGTERM), as a crash or an upgrade does: containerd keeps the node's containers
        running, and nothing restarts, tears down or reports them until `start_kubelet`."""
        if self.kubelet is None:
            raise ControlPlaneError("the kubelet never started")
        self.kubelet.stop()

    def start_kubelet(self) -> None:
        """Start the stopped kubelet again, and wait until it has renewed the node's Lease and the Node is Ready and
        untainted. A no-op when it runs."""
        if self.kubelet is None:
            raise ControlPlaneError("the kubelet never started")
        if self.kubelet.running():
            return
        started = datetime.now(timezone.utc)
        self.kubelet.start()
        self.kubelet.wait_until(lambda: self._ready_since(started), self.ready_timeout_s, "Ready again")

    @contextlib.contextmanager
    def kubelet_stopped(self) -> Iterator[None]:
        """The kubelet stopped for the block, started again (and Ready) after it, whatever happens inside."""
        self.stop_kubelet()
        try:
            yield
        finally:
            self.start_kubelet()

    def _ready_since(self, started: datetime) -> bool:
        """Ready and untainted, with the node's Lease renewed after `started`: by a kubelet started since (the
        Node's own heartbeat has whole seconds only, and a kubelet rewrites it only every 5 minutes when nothing
        changed)."""
        if not self._ready():
            return False
        with self.plane.api_client() as api:
            lease = raw(api, client.CoordinationV1Api(api).read_namespaced_lease(self.name, "kube-node-lease"))
        renewed = lease["spec"].get("renewTime")
        return renewed is not None and datetime.fromisoformat(renewed) > started  # as `raw` writes it

    # -- containers by hand --------------------------------------------------------------------------------------

    def kill_task(self, container_id: str, timeout_s: float = 30.0) -> None:
        """SIGKILL a container's process (`container_id` with or without ``containerd://``), as a crash would, wait
        until containerd has it stopped, and delete the stopped task (the CRI deletes its own, not one that
        `start_task` started, and a container with a task left cannot be removed)."""
        wanted = container_id.removeprefix("containerd://")
        self.containerd.ctr_status("task", "kill", "--signal", "SIGKILL", wanted)
        wait_until(
            lambda: wanted not in self._running_tasks(), timeout_s, what=f"task {wanted} stopped", interval_s=0.1
        )
        self.containerd.ctr_status("task", "delete", wanted)

    def start_task(self, container_id: str, log_path: Path) -> int:
        """Start a container's process again, from the container containerd keeps (same spec: command, cgroup,
        namespaces, mounts) and without the kubelet: the restart the kubelet would make, for a node whose kubelet
        is stopped. Its output goes to `log_path` (the kubelet's log files are the CRI's, which this bypasses);
        returns its host PID. The CRI does not know of the task: kill it (`kill_task`) before the kubelet is back."""
        wanted = container_id.removeprefix("containerd://")
        for attempt in range(3):
            self.containerd.ctr_status("task", "delete", wanted)  # the stopped task, where the CRI has not removed it
            try:
                self.containerd.ctr("task", "start", "--detach", f"--log-uri=file://{log_path}", wanted)
                break
            except CtrFailed:
                # The shim of the task killed a moment ago may still be going away (its delete then fails, and so
                # does a start beside it): what a kubelet's restart would wait out too.
                if attempt == 2:
                    raise
                time.sleep(1.0)
        return self.container_pid(wanted)


def raw(api: client.ApiClient, obj: object) -> dict[str, Any]:
    """An API object as the API server wrote it (camelCase keys, absent fields left out): easier to read in tests
    than the client's models, whose every field is optional."""
    serialized: dict[str, Any] = api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
    return serialized


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _ip_quiet(*args: str) -> None:
    subprocess.run(["ip", *args], check=False, capture_output=True, timeout=30)


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root).rstrip("/") + "/"
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            target = line.split()[4].replace("\\040", " ")
            if target.startswith(prefix) or target == str(root):
                found.append(target)
    return found


def _unmount_under(root: Path) -> None:
    """Lazily unmount everything mounted at or below `root`, deepest first (token tmpfs, netns, rootfs)."""
    for target in sorted(_mounts_under(root), key=len, reverse=True):
        subprocess.run(["umount", "-l", target], check=False, capture_output=True, timeout=30)


def _cgroup_mounts() -> Iterable[Path]:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            if fstype in ("cgroup", "cgroup2"):
                yield Path(fields[4])


def _remove_cgroup_trees(name: str) -> None:
    """rmdir `name` and everything below it in every cgroup hierarchy, deepest first (empty cgroups only)."""
    for mount in set(_cgroup_mounts()):
        top = mount / name
        if not top.is_dir():
            continue
        for directory, _subdirs, _files in sorted(os.walk(top), key=lambda entry: len(entry[0]), reverse=True):
            with contextlib.suppress(OSError):
                os.rmdir(directory)
