"""End to end on a real node: the chart installed with the locally built image on a one-node cluster (a real
kubelet on containerd, tests/cluster/real_cluster.py), enforcing on real workload containers: the agent pod's
probes, ServiceAccount token and restarts are the kubelet's, and so are the workloads' cgroups.

The agent runs with the chart's default security context (not privileged: uid 0 with only KILL, SYS_PTRACE and
DAC_READ_SEARCH) and finds the test NVML through the chart's `driver.root`, and every test here but one (the
privileged agent of the GKE and GPU Operator profiles) is a check that this is enough: the kill signals another
user's processes, finds one by its open device file, and freezes the container first; evictions, driver limits,
`top`, the probes.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from helm_fixtures import need_helm
from real_parts import need
from vramguard import __version__
from vramguard.core.quantity import GiB
from vramguard.node.cgroup import v2_root
from vramguard_testbed import flood
from vramguard_testbed.fakenvml import DriverLimit, FakeNode, driver_limits, limit_calls
from vramguard_testbed.simnode import metric_value
from vramguard_testbed.waiting import WaitTimeout, wait_until

from .inotify import DirectoryWatch
from .node import raw
from .real_cluster import (
    AGENT_NS,
    DRIVER_LAYOUT,
    GPU_TOTAL,
    QUOTA,
    WORKLOAD_IMAGE,
    Cluster,
    real_cluster,
    unavailable_reason,
)

pytestmark = [pytest.mark.slow, pytest.mark.real_node]

# The workloads have no GPU: a file they open stands in for /dev/nvidia* (the agent's hidden --gpu-device-prefix).
DEVICE = "/dev/zero"
# The chart's hostPath for the agent's state, and the freeze journal the agent keeps in it (freezes.py).
FREEZES = Path("/var/lib/vramguard/freezes")
CAPABILITIES = {"DAC_READ_SEARCH": 2, "KILL": 5, "SYS_PTRACE": 19}  # bits of /proc/<pid>/status
DISCOVERY = ["SYS_PTRACE", "DAC_READ_SEARCH"]  # what reading other users' /proc/<pid>/fd takes
WORKLOAD_USER = 1000


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    need(unavailable_reason(), skip="no real node", ci="build the real node's parts first (scripts/test.sh does)")
    with real_cluster(need_helm()) as found:
        found.values["extraArgs"] = [*found.values["extraArgs"], f"--gpu-device-prefix={DEVICE}"]
        # Each test's install starts a fresh agent (its driver probe, its limiter), as a rolled DaemonSet does; the
        # reload of a policy in place is tests/cluster/test_policy_reload.py's.
        found.values["policyReload"] = {"rollOnChange": True}
        yield found


def agent_pid(cluster: Cluster) -> int:
    """The host PID of the agent (its container's first process)."""
    pod = cluster.agent_pod()
    assert pod is not None
    return cluster.pid(pod)


def proc_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def container_cgroup(pod: dict[str, Any]) -> str:
    """The v2 cgroup directory of the pod's one container, as the host sees it."""
    container_id = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    root = v2_root("/sys/fs/cgroup")
    assert root is not None
    return f"{root}/kubepods/besteffort/pod{pod['metadata']['uid']}/{container_id}"


def forking_workload(cluster: Cluster, namespace: str, name: str, quota: str) -> dict[str, Any]:
    """A running pod whose container runs as another user than the agent (WORKLOAD_USER) and holds the stand-in
    device in two processes: its first one, and a worker it forked before it exec'd (a DataLoader worker, say)."""
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app": name}),
        spec=client.V1PodSpec(
            termination_grace_period_seconds=2,
            security_context=client.V1PodSecurityContext(run_as_user=WORKLOAD_USER, run_as_group=WORKLOAD_USER),
            containers=[
                client.V1Container(
                    name="main",
                    image=WORKLOAD_IMAGE,
                    image_pull_policy="Never",
                    command=["sh", "-c", f"exec 3<{DEVICE}; sleep 1000000 & exec sleep 1000000"],
                    resources=client.V1ResourceRequirements(limits={QUOTA: quota}),
                )
            ],
        ),
    )
    cluster.core.create_namespaced_pod(namespace, pod)
    wait_until(
        lambda: cluster.phase(namespace, name) == "Running", 60, what=f"{namespace}/{name} Running", interval_s=0.25
    )
    found = cluster.pod(namespace, name)
    assert found is not None
    procs = Path(container_cgroup(found), "cgroup.procs")
    wait_until(
        lambda: len(procs.read_text().split()) == 2, 30, what=f"{namespace}/{name}'s worker forked", interval_s=0.25
    )
    return found


def test_the_chart_runs_the_agent_on_a_real_kubelet(cluster: Cluster) -> None:
    started = time.monotonic()
    cluster.helm_install(mode="kill")
    pod = cluster.agent_pod()
    assert pod is not None
    print(f"agent Ready {time.monotonic() - started:.1f}s after helm install")
    # Ready through its real probes; its ServiceAccount token came from the kubelet's projected volume.
    (container,) = pod["spec"]["containers"]
    assert "readinessProbe" in container and "livenessProbe" in container
    assert any("projected" in v for v in pod["spec"]["volumes"]), "the token volume the kubelet mounts"

    # Not privileged: the chart's default security context, and the running agent holds what it says and no more
    # (uid 0 with three capabilities, none to gain: no_new_privs, the bounding set, seccomp filtering).
    assert container["securityContext"]["privileged"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["KILL", *DISCOVERY]}
    status = proc_status(agent_pid(cluster))
    caps = sum(1 << bit for bit in CAPABILITIES.values())
    assert [int(status[k], 16) for k in ("CapEff", "CapPrm", "CapBnd")] == [caps, caps, caps], status
    assert status["Uid"].split() == ["0"] * 4 and status["NoNewPrivs"] == "1" and status["Seccomp"] == "2"

    # It talked to the API server as itself: the node's capacity is its PATCH, allowed by RBAC and the own-node
    # admission policy.
    def published() -> bool:
        node = raw(cluster.api, cluster.core.read_node(cluster.node.name))
        return bool(node["status"]["allocatable"].get(QUOTA) == str(GPU_TOTAL))

    wait_until(published, 60, what="the node's VRAM capacity published by the agent", interval_s=0.25)


def test_kill_mode_on_real_containers(cluster: Cluster) -> None:
    """The unprivileged agent kills the trainer whole: its processes run as another user (signalling them takes
    KILL), NVML reports only the worker it forked, and its first process is found holding the device through its
    /proc/<pid>/fd (listing another user's takes DAC_READ_SEARCH, its links SYS_PTRACE) in the listing of the
    container's processes that the agent takes with the container frozen."""
    cluster.helm_install(mode="kill")
    ns = cluster.namespace("ml-kill")
    trainer = forking_workload(cluster, ns, "trainer", "4Gi")
    notebook = cluster.workload(ns, "notebook", "4Gi")
    trainer_pid, notebook_pid = cluster.pid(trainer), cluster.pid(notebook)
    (worker_pid,) = {int(p) for p in Path(container_cgroup(trainer), "cgroup.procs").read_text().split()} - {
        trainer_pid
    }
    assert proc_status(worker_pid)["Uid"].split() == [str(WORKLOAD_USER)] * 4
    # Attribution goes through the cgroups the kubelet and containerd made for these containers.
    cgroup = Path(f"/proc/{trainer_pid}/cgroup").read_text()
    assert f"/kubepods/besteffort/pod{trainer['metadata']['uid']}/" in cgroup
    assert trainer["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://") in cgroup

    # The kill writes down its freeze of the trainer's container before it happens, and forgets it once thawed:
    # an entry named by the cgroup (as the agent sees the host's) and the agent's PID, there for milliseconds.
    entry = hashlib.sha256(f"/host{container_cgroup(trainer)}".encode()).hexdigest()[:20] + f"-{agent_pid(cluster)}"
    with DirectoryWatch(FREEZES) as journal:
        cluster.gpu({worker_pid: 9 * GiB, notebook_pid: 3 * GiB})

        def restarted() -> bool:
            status = cluster.status(ns, "trainer")
            return bool(status["restartCount"] >= 1 and "running" in status["state"])

        wait_until(restarted, 60, what="the trainer killed and restarted by the kubelet", interval_s=0.25)
        assert entry in journal.names(), f"no freeze of the trainer written down: {journal.names()}"
    assert not list(FREEZES.iterdir()), "every freeze thawed and forgotten"
    # Its first process was killed too (the container ended), not only the worker NVML reported.
    assert cluster.status(ns, "trainer")["lastState"]["terminated"]["exitCode"] == 137  # SIGKILL
    assert not Path(f"/proc/{trainer_pid}").exists() and not Path(f"/proc/{worker_pid}").exists()
    wait_until(
        lambda: "VRAMKilled" in cluster.reasons(ns, "trainer"),
        30,
        what="the VRAMKilled Event on the trainer",
        interval_s=0.25,
    )
    assert cluster.status(ns, "notebook")["restartCount"] == 0
    assert Path(f"/proc/{notebook_pid}").exists()

    described = cluster.node.kubectl("describe", "pod", "trainer", "--namespace", ns).stdout
    assert "VRAMKilled" in described and "uses 9.0GiB" in described, described
    killed = sorted((trainer_pid, worker_pid))
    assert f"killed PIDs {killed[0]}, {killed[1]}:" in described, described

    # A user's view: `vramguard top` from inside the agent's pod.
    agent = cluster.agent_pod()
    assert agent is not None
    top = cluster.node.kubectl(
        "exec",
        "--namespace",
        AGENT_NS,
        agent["metadata"]["name"],
        "--",
        "vramguard",
        "top",
        "--once",
        "--policy=/etc/vramguard",
    )
    assert "notebook" in top.stdout and "3.0GiB" in top.stdout, top.stdout + top.stderr

    # The freeze itself, done by hand from the agent's container (what the kill does): uid 0 without
    # DAC_OVERRIDE writes the root-owned cgroup.freeze of another container, and the kernel freezes it.
    try:
        freeze_from(cluster, agent["metadata"]["name"], container_cgroup(notebook), frozen=True)
        freeze_from(cluster, agent["metadata"]["name"], container_cgroup(notebook), frozen=False)
    finally:
        Path(container_cgroup(notebook), "cgroup.freeze").write_text("0")


def test_a_privileged_agent_finds_nvml_through_the_driver_root_and_kills(cluster: Cluster) -> None:
    """As on a node without NVIDIA's runtime (the gke and gpu-operator profiles): `driver.root` with
    `privileged: true` and nothing else, so the chart's own mount and variable are all that lead the agent to the
    host's libnvidia-ml.so.1; it loads that file and kills an offender."""
    root = cluster.values["driver"]["root"]
    cluster.helm_install(chart_values={"driver": {"root": root}, "privileged": True}, mode="kill")
    agent = cluster.agent_pod()
    assert agent is not None
    (container,) = agent["spec"]["containers"]
    assert container["securityContext"]["privileged"] is True
    assert "LD_LIBRARY_PATH" not in {e["name"] for e in container["env"]}
    assert {"name": "driver", "hostPath": {"path": root, "type": "Directory"}} in agent["spec"]["volumes"]

    version = cluster.node.kubectl("exec", "--namespace", AGENT_NS, agent["metadata"]["name"], "--",
                                   "vramguard", "version").stdout  # fmt: skip
    assert f"(loaded from /host/driver/{DRIVER_LAYOUT}/libnvidia-ml.so.1)" in version, version

    ns = cluster.namespace("ml-driver-root")
    offender = cluster.workload(ns, "offender", "4Gi")
    cluster.gpu({cluster.pid(offender): 9 * GiB})

    def restarted() -> bool:
        status = cluster.status(ns, "offender")
        return bool(status["restartCount"] >= 1 and "running" in status["state"])

    wait_until(restarted, 60, what="the offender killed and restarted by the kubelet", interval_s=0.25)
    wait_until(lambda: "VRAMKilled" in cluster.reasons(ns, "offender"), 30, what="VRAMKilled", interval_s=0.25)
    cluster.gpu({})


def freeze_from(cluster: Cluster, agent: str, directory: str, *, frozen: bool) -> None:
    """Freeze (or thaw) the cgroup `directory` (the host's path) from a shell in the agent's container; wait until
    the kernel reports it done."""
    value = int(frozen)
    command = f"echo {value} > /host{directory}/cgroup.freeze"
    cluster.node.kubectl("exec", "--namespace", AGENT_NS, agent, "--", "sh", "-c", command)
    events = Path(directory, "cgroup.events")
    wait_until(lambda: f"frozen {value}" in events.read_text(), 10, what=f"{events} at frozen {value}", interval_s=0.25)


def test_evict_mode_on_real_containers(cluster: Cluster) -> None:
    cluster.helm_install(mode="evict")
    ns = cluster.namespace("ml-evict")
    evictee = cluster.workload(ns, "evictee", "2Gi")
    guarded = cluster.workload(ns, "guarded", "2Gi")
    budget = client.V1PodDisruptionBudget(
        metadata=client.V1ObjectMeta(name="guarded"),
        spec=client.V1PodDisruptionBudgetSpec(
            min_available=1, selector=client.V1LabelSelector(match_labels={"app": "guarded"})
        ),
    )
    policy = client.PolicyV1Api(cluster.api)
    policy.create_namespaced_pod_disruption_budget(ns, budget)
    wait_until(
        lambda: raw(cluster.api, policy.read_namespaced_pod_disruption_budget("guarded", ns))["status"].get(
            "observedGeneration"
        ),
        30,
        what="the PodDisruptionBudget's status computed",
        interval_s=0.25,
    )

    cluster.gpu({cluster.pid(evictee): 5 * GiB, cluster.pid(guarded): 5 * GiB})

    wait_until(
        lambda: cluster.phase(ns, "evictee") is None,
        90,
        what="the evictee evicted and removed by the kubelet",
        interval_s=0.25,
    )
    assert "VRAMEvicted" in cluster.reasons(ns, "evictee")
    wait_until(
        lambda: "VRAMEvictionRefused" in cluster.reasons(ns, "guarded"),
        30,
        what="the refusal Event on the guarded pod",
        interval_s=0.25,
    )
    assert cluster.phase(ns, "guarded") == "Running"
    assert cluster.status(ns, "guarded")["restartCount"] == 0


def test_the_toolkit_variable_is_a_quota_on_real_containers(cluster: Cluster) -> None:
    """A pod that declares its limit as NVIDIA's container toolkit reads it, `NVIDIA_GPU_MEMORY_LIMIT` in MiB in its
    container's env[] and nothing of vramguard's, is killed over it by the agent's default quota sources (on a driver
    below R615 nothing else enforces it); a neighbour within its own quota lives."""
    cluster.helm_install(mode="kill")
    ns = cluster.namespace("ml-toolkit")
    trainer = cluster.workload(ns, "trainer", None, env={"NVIDIA_GPU_MEMORY_LIMIT": "4096"})
    notebook = cluster.workload(ns, "notebook", "8Gi")
    trainer_pid, notebook_pid = cluster.pid(trainer), cluster.pid(notebook)
    cluster.gpu({trainer_pid: 6 * GiB, notebook_pid: 6 * GiB})

    def restarted() -> bool:
        status = cluster.status(ns, "trainer")
        return bool(status["restartCount"] >= 1 and "running" in status["state"])

    wait_until(restarted, 60, what="the trainer killed over its 4096 MiB and restarted", interval_s=0.25)
    wait_until(lambda: "VRAMKilled" in cluster.reasons(ns, "trainer"), 30, what="VRAMKilled", interval_s=0.25)
    described = cluster.node.kubectl("describe", "pod", "trainer", "--namespace", ns).stdout
    assert "quota 4.0GiB (env NVIDIA_GPU_MEMORY_LIMIT)" in described, described
    assert cluster.status(ns, "notebook")["restartCount"] == 0 and Path(f"/proc/{notebook_pid}").exists()
    cluster.gpu({})
    # Its pods go with it: the notebook's 8Gi of vramguard.io/vram would stay allocated on the one node, and the later
    # tests' pods would not fit beside what the earlier ones hold.
    for name in ("trainer", "notebook"):
        cluster.core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    wait_until(lambda: cluster.pod(ns, "trainer") is None and cluster.pod(ns, "notebook") is None, 60, what="gone")


def test_driver_limits_on_the_cgroups_the_kubelet_made(cluster: Cluster) -> None:
    """On an R615 driver the agent, in its pod, programs each container's limit on the cgroup v2 directory the
    kubelet and containerd made, through the host's cgroup filesystem the chart mounts."""
    cluster.gpu({}, memory_limits=True)
    # An agent asks the driver what it can hold once, at start: a fresh one must meet the R615 driver, whatever the
    # test before installed (the same values would leave its agent running).
    cluster.helm_install(mode="kill", chart_values={"podAnnotations": {"vramguard.test/driver": "r615"}})
    ns = cluster.namespace("ml-limits")
    trainer = cluster.workload(ns, "trainer", "6Gi")
    container_id = trainer["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    leaf = f"/kubepods/besteffort/pod{trainer['metadata']['uid']}/{container_id}"

    def held() -> list[DriverLimit]:
        return [d for d in driver_limits(cluster.gpu_state) if d.cgroup.endswith(leaf)]

    try:
        wait_until(lambda: held(), 60, what="the trainer's limit in the driver", interval_s=0.25)
    except WaitTimeout as e:
        calls = [c for c in limit_calls(cluster.gpu_state) if leaf.rsplit("/", 1)[0] in c.cgroup]
        raise WaitTimeout(f"{e}\ndriver calls on the pod's cgroups: {calls}\n{cluster.agent_state()}") from None
    (limit,) = held()
    assert (limit.soft_bytes, limit.hard_bytes) == (0, 6 * GiB)
    assert limit.cgroup == f"/host{v2_root('/sys/fs/cgroup')}{leaf}", "the agent's view of the host's v2 hierarchy"

    def described() -> str:
        return str(cluster.node.kubectl("describe", "pod", "trainer", "--namespace", ns).stdout)

    wait_until(
        lambda: "the driver now holds container main to 6.0GiB on GPU 0" in described(),
        30,
        what="the container's Event",
        interval_s=0.25,
    )
    assert "the driver now holds pod trainer to 6.0GiB on GPU 0" in described(), described()
    # At creation: the pod's cgroup held the pod's limit before the container's first process started (the
    # test NVML logs each call on CLOCK_BOOTTIME, the clock of /proc's start times), and nothing was late.
    pod_dir = f"/kubepods/besteffort/pod{trainer['metadata']['uid']}"
    sets = [c for c in limit_calls(cluster.gpu_state) if c.verb == "set" and c.result == 0]
    pod_set = min(c.at_s for c in sets if c.cgroup.endswith(pod_dir) and c.hard_bytes == 6 * GiB)
    ticks = int(Path(f"/proc/{cluster.pid(trainer)}/stat").read_text().rsplit(")", 1)[1].split()[19])
    started = ticks / os.sysconf("SC_CLK_TCK")
    assert pod_set < started, f"the pod's limit at {pod_set:.2f} s, its container's process at {started:.2f} s"
    assert "VRAMLimitLate" not in cluster.reasons(ns, "trainer")


FLOOD_S = 35.0  # longer than the kubelet takes to restart an agent whose liveness fails (3 periods of 10 s)
FLOODS = {"hammer": 2000, "loris": 2000, "idle": 2000}  # connections of each kind; the hammer's pod reads /status too
STATUS_READERS = 1000


def probe_failures(cluster: Cluster, pod_name: str) -> dict[tuple[str, int], str]:
    """The kubelet's failed-probe Events on the agent's pod: (Event name, its count) -> message."""
    selector = f"involvedObject.name={pod_name},reason=Unhealthy"
    events = raw(cluster.api, cluster.core.list_namespaced_event(AGENT_NS, field_selector=selector))["items"]
    return {(e["metadata"]["name"], e.get("count") or 1): e["message"] for e in events}


def test_a_flood_from_a_pod_never_gets_the_agent_restarted(cluster: Cluster) -> None:
    """A pod on the node floods the agent's port for 35 s (loris and idle connections, a hammer of /healthz, and
    1,000 /status readers): the kubelet's exec probes never fail, so the agent is never restarted nor unready,
    and an offender crossing its quota mid-flood is killed as at rest."""
    cluster.helm_install(mode="kill")
    agent = cluster.agent_pod()
    assert agent is not None
    agent_name = agent["metadata"]["name"]
    ns = cluster.namespace("tenant-flood")
    trainer = forking_workload(cluster, ns, "trainer", "4Gi")
    trainer_pid = cluster.pid(trainer)
    (worker_pid,) = {int(p) for p in Path(container_cgroup(trainer), "cgroup.procs").read_text().split()} - {
        trainer_pid
    }

    # The tenant: Python from the agent's image running the test bench's flood, on the node's network where the
    # agent listens (the test values run it with hostNetwork).
    source = Path(flood.__file__).read_text()
    port = str(cluster.values["metrics"]["port"])
    containers = [
        client.V1Container(
            name=kind,
            image=f"localhost/vramguard:{__version__}",
            image_pull_policy="Never",
            command=["python3", "-c", source, "127.0.0.1", port, kind, str(n), str(FLOOD_S)]
            + ([str(STATUS_READERS)] if kind == "hammer" else []),
        )
        for kind, n in FLOODS.items()
    ]
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="flood"),
        spec=client.V1PodSpec(host_network=True, restart_policy="Never", containers=containers),
    )
    cluster.core.create_namespaced_pod(ns, pod)
    wait_until(lambda: cluster.phase(ns, "flood") == "Running", 60, what="the flood running", interval_s=0.25)
    started = time.monotonic()
    before = probe_failures(cluster, agent_name)  # a readiness probe before the first scan fails, as it should

    unready = 0
    reaction_s: float | None = None
    while cluster.phase(ns, "flood") == "Running":
        now = cluster.agent_pod()  # Ready, alone, of the current template
        unready += now is None
        if reaction_s is None and time.monotonic() - started >= FLOOD_S / 2:
            crossed = time.monotonic()
            cluster.gpu({worker_pid: 9 * GiB})
            wait_until(lambda: not Path(f"/proc/{worker_pid}").exists(), 10, what="the worker killed", interval_s=0.005)
            reaction_s = time.monotonic() - crossed
        time.sleep(0.5)
    flood_s = time.monotonic() - started

    logs = {
        kind: cluster.node.kubectl("logs", "--namespace", ns, "flood", "-c", kind).stdout.strip() for kind in FLOODS
    }
    status = cluster.status(AGENT_NS, agent_name)
    after = probe_failures(cluster, agent_name)
    failed_probes = [message for key, message in after.items() if before.get(key) != message]
    print(
        f"flood {flood_s:.1f}s: agent restarts {status['restartCount']}, unready {unready} times, probe failures "
        f"{len(failed_probes)}, trainer killed {reaction_s}s after crossing; tenant got {logs}"
    )
    assert cluster.phase(ns, "flood") == "Succeeded", logs
    assert flood_s >= FLOOD_S - 5
    assert all(json.loads(line)["flood"]["connections"] >= FLOODS[kind] for kind, line in logs.items()), logs
    assert status["restartCount"] == 0 and unready == 0, failed_probes
    assert failed_probes == []
    assert reaction_s is not None and reaction_s < 1.0


def test_a_static_pod_is_enforced_and_told_on_its_mirror_pod(cluster: Cluster) -> None:
    """A static pod (a manifest in the kubelet's staticPodPath) runs in the cgroup of the UID the kubelet gave it,
    which only its mirror pod's kubernetes.io/config.mirror annotation names: the agent finds its quota through the
    mirror pod, kills it over that quota, and writes the Event on the mirror pod (with the static pod's UID, as the
    kubelet does, so that `kubectl describe` shows it). In evict mode its eviction is
    refused without a request (the API server could only delete the mirror), and on_eviction_refused: kill kills."""
    cluster.helm_install(mode="kill")
    ns = cluster.namespace("static-gpu")  # not kube-system: exempt by default
    name = f"trainer-{cluster.node.name}"  # the mirror pod's name: the manifest's and the node's
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": ns, "annotations": {"vramguard.io/vram-limit": "4Gi"}},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "main",
                    "image": WORKLOAD_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", f"exec 3<{DEVICE}; exec sleep 1000000"],
                }
            ],
        },
    }
    path = cluster.node.static_pods / "trainer.yaml"
    path.write_text(json.dumps(manifest))
    try:

        def running(restarts: int) -> dict[str, Any] | None:
            mirror = cluster.pod(ns, name)
            statuses = (mirror or {}).get("status", {}).get("containerStatuses") or [{}]
            ok = statuses[0].get("restartCount", -1) >= restarts and "running" in statuses[0].get("state", {})
            return mirror if ok else None

        wait_until(lambda: running(0), 60, what=f"the mirror pod {ns}/{name} Running", interval_s=0.25)
        mirror = running(0)
        assert mirror is not None
        static_uid = mirror["metadata"]["annotations"]["kubernetes.io/config.mirror"]
        assert static_uid != mirror["metadata"]["uid"]
        pid = cluster.pid(mirror)
        assert f"/pod{static_uid}/" in Path(f"/proc/{pid}/cgroup").read_text()

        # The agent believes the genuine mirror first (its word on the kubelet's pods is at most REFRESH_S old): the
        # forgery below is then judged against a listing that has the static pod, not raced against it.
        wait_until(
            lambda: metric_value(cluster.metrics(), "vramguard_pod_mirror_claims_refused") == 0,
            30,
            what="the agent believing the genuine mirror pod",
            interval_s=0.25,
        )
        # A tenant's pod claiming to be its mirror (the API server takes the annotation from anyone): the kubelet's
        # pod logs directory names the static pod's UID under its own namespace and name, so the forgery is refused,
        # said once in the log, and the genuine mirror's quota still holds while the forgery lives.
        forger = cluster.namespace("static-forger")
        forged = client.V1Pod(
            metadata=client.V1ObjectMeta(
                name="forged",
                annotations={"kubernetes.io/config.mirror": static_uid, "vramguard.io/vram-limit": "100Gi"},
            ),
            spec=client.V1PodSpec(
                node_name=cluster.node.name,
                containers=[client.V1Container(name="main", image=WORKLOAD_IMAGE, image_pull_policy="Never")],
            ),
        )
        cluster.core.create_namespaced_pod(forger, forged)
        forged_at = time.monotonic()
        agent = cluster.agent_pod()
        assert agent is not None

        def agent_log() -> str:
            return str(cluster.node.kubectl("logs", "--namespace", AGENT_NS, agent["metadata"]["name"]).stdout)

        # The forgery's own line (the genuine mirror may have had one too, made before the pod's sandbox).
        forged_line = f"pod {forger}/forged claims to be the mirror of UID {static_uid}: this node's kubelet runs that"
        try:
            wait_until(lambda: forged_line in agent_log(), 30, what="the forged claim refused", interval_s=0.25)
        except WaitTimeout:
            alive = cluster.pod(forger, "forged") is not None
            pytest.fail(
                f"no refusal of the forged claim in 30 s (forgery alive: {alive}); the agent said:\n"
                + agent_log()[-6000:]
            )
        assert f"{forged_line} UID as {ns}/{name}" in agent_log()

        crossed = time.monotonic()
        cluster.gpu({pid: 9 * GiB})
        wait_until(
            lambda: not Path(f"/proc/{pid}").exists(), 30, what="the static pod's process killed", interval_s=0.01
        )
        killed_s = time.monotonic() - crossed
        forgery_alive = cluster.pod(forger, "forged") is not None
        wait_until(lambda: cluster.pod(forger, "forged") is None, 30, what="the kubelet deleting the forged mirror")
        forged_s = time.monotonic() - forged_at
        wait_until(
            lambda: "VRAMKilled" in cluster.reasons(ns, name), 30, what="VRAMKilled on the mirror", interval_s=0.25
        )
        selector = f"involvedObject.name={name},reason=VRAMKilled"
        (event,) = raw(cluster.api, cluster.core.list_namespaced_event(ns, field_selector=selector))["items"]
        # The mirror pod's name with the static pod's UID, as the kubelet writes its own: `kubectl describe` shows it.
        assert event["involvedObject"]["uid"] == static_uid, event["involvedObject"]
        assert f"killed PIDs {pid}:" in event["message"] and "uses 9.0GiB" in event["message"], event["message"]
        described = cluster.node.kubectl("describe", "pod", name, "--namespace", ns).stdout
        assert "VRAMKilled" in described, described

        # Evict mode: refused at once (no Eviction sent), said on the mirror pod, then killed (on_eviction_refused).
        wait_until(lambda: running(1), 60, what="the static pod restarted by the kubelet", interval_s=0.25)
        cluster.gpu({})
        cluster.helm_install(mode="evict", on_eviction_refused="kill")
        restarted = running(1)
        assert restarted is not None
        pid = cluster.pid(restarted)
        cluster.gpu({pid: 9 * GiB})
        wait_until(lambda: not Path(f"/proc/{pid}").exists(), 30, what="the static pod killed after the refusal")
        wait_until(lambda: "VRAMEvictionRefused" in cluster.reasons(ns, name), 30, what="the refusal on the mirror pod")
        described = cluster.node.kubectl("describe", "pod", name, "--namespace", ns).stdout
        assert "eviction refused: a static pod cannot be evicted" in described, described
        still = cluster.pod(ns, name)
        assert still is not None and still["metadata"]["uid"] == mirror["metadata"]["uid"], "the mirror was not evicted"
        print(
            f"static pod killed {killed_s:.2f}s after crossing its quota (the forgery "
            f"{'still there' if forgery_alive else 'already deleted'}); forged mirror lived {forged_s:.1f}s"
        )
    finally:
        path.unlink()
        cluster.gpu({})
    wait_until(lambda: cluster.pod(ns, name) is None, 60, what="the mirror pod gone with its manifest")


def test_memory_an_exited_pid_holds_is_one_warning_on_the_node(cluster: Cluster) -> None:
    """NVML listing a PID with no process past the threshold (cut to 2 s by the hidden flag): one VRAMGPUNeedsReset
    Warning on the Node, written by the agent through the chart's RBAC, not one per scan; nothing is signalled."""
    cluster.helm_install(chart_values={"extraArgs": [*cluster.values["extraArgs"], "--exited-hold-seconds=2"]})
    port = cluster.values["metrics"]["port"]

    def scans() -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return metric_value(r.read().decode(), "vramguard_scan_duration_seconds_count") or 0.0

    exited = subprocess.Popen(["true"])
    exited.wait()
    ghost = exited.pid  # a PID with no process: the test driver keeps listing it (no drop_dead_pids)
    state = FakeNode.gpus(1, total_bytes=GPU_TOTAL, name="NVIDIA L4 (test NVML)")
    state.gpu(0).add_process(ghost, 3 * GiB)
    selector = f"involvedObject.kind=Node,involvedObject.name={cluster.node.name},reason=VRAMGPUNeedsReset"

    def events() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = raw(
            cluster.api, cluster.core.list_namespaced_event("default", field_selector=selector)
        )["items"]
        return found

    try:
        started = time.monotonic()
        state.write(cluster.gpu_state)
        (event,) = wait_until(events, 60, what="VRAMGPUNeedsReset on the Node", interval_s=0.25)
        print(f"VRAMGPUNeedsReset on the Node {time.monotonic() - started:.1f}s after the PID was listed")
        assert event["type"] == "Warning" and event["involvedObject"]["uid"] == cluster.node.name, event
        message = event["message"]
        assert f"needs a reset: 3.0GiB held by exited processes (PIDs {ghost}," in message, message
        assert "nvidia-smi --gpu-reset -i 0" in message, message
        target = scans() + 10
        wait_until(lambda: scans() >= target, 30, what="10 more scans", interval_s=0.25)
        (again,) = events()
        assert again["count"] == 1, "told once per onset, not once per scan"
        described = cluster.node.kubectl("describe", "node", cluster.node.name).stdout
        assert "VRAMGPUNeedsReset" in described, described
    finally:
        cluster.gpu({})
