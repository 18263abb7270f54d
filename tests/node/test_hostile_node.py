"""The agent on a node that tries to blind it: few file descriptors, a thousand GPU processes, idle connections on
its port, a parent forking while it is killed, tenant input measured in megabytes, and pod cgroups made outside the
kubelet's tree.

Everything is real but the GPU: `vramguard run` as a subprocess, real processes in real cgroups, the test NVML.
"""

from __future__ import annotations

import contextlib
import resource
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cgroup_fixtures import CgroupsFactory, need_cgroups
from vramguard.core.quantity import GiB, MiB
from vramguard_testbed.cgroups import KubeletCgroups, device_holder_argv
from vramguard_testbed.simnode import SimPod, SimProcess, SimulatedNode, metric_value
from vramguard_testbed.waiting import wait_until

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]

POLL_S = 0.25
VRAM = "vramguard.io/vram"


def _metric(node: SimulatedNode, name: str, **labels: str) -> float | None:
    return metric_value(node.http_get("/metrics")[1], name, labels)


def _background(node: SimulatedNode, pod: SimPod, used_bytes: int, gpu: int) -> SimProcess:
    """A GPU process that holds no device file (cheap), registered with NVML without rewriting the state."""
    popen = pod.containers["main"].spawn(["sleep", "3600"])
    proc = SimProcess(popen=popen, gpu=gpu, used_bytes=used_bytes, pod=pod, container="main")
    node.processes.append(proc)
    return proc


@contextlib.contextmanager
def _idle_connections(port: int, count: int) -> Iterator[list[socket.socket]]:
    """`count` TCP connections to the agent that never send a byte."""
    conns: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect(("127.0.0.1", port))
            conns.append(s)
        yield conns
    finally:
        for s in conns:
            s.close()


def _limit_fds(n: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


def test_256_fds_1000_gpu_processes_and_idle_connections_still_kill_the_offender(tmp_path: Path) -> None:
    """Under `ulimit -n 256`, with 1,000 GPU processes on 4 GPUs and 1,000 idle connections on its port, the agent
    answers /healthz, stays far below its fd limit, and kills the one process that crosses its quota."""
    with SimulatedNode(tmp_path / "node", gpus=4, gpu_total_bytes=80 * GiB) as node:
        pods = [node.add_pod(f"job-{i}", "batch", containers={"main": {VRAM: "1Gi"}}) for i in range(100)]
        for i in range(1000):
            _background(node, pods[i % 100], 16 * MiB, gpu=i % 4)
        offender_pod = node.add_pod("offender", "batch", containers={"main": {VRAM: "2Gi"}})
        offender = node.spawn(offender_pod, "main", 1 * GiB, children=2)
        node.sync()
        node.start_agent(
            "--mode", "kill", "--poll-interval", str(POLL_S),
            stderr=subprocess.DEVNULL, preexec_fn=lambda: _limit_fds(256),
        )  # fmt: skip
        node.wait_ready(timeout_s=60)
        attributed = _metric(node, "vramguard_container_gpu_memory_used_bytes", pod="job-0", gpu="0")
        assert attributed == 10 * 16 * MiB, "the thousand processes are attributed, not dropped"

        with _idle_connections(node.metrics_port, 1000):
            node.wait_scans(4)  # a second of scans while the connections are held
            started = time.monotonic()
            status, _ = node.http_get("/healthz")
            assert status == 200 and time.monotonic() - started < 2.0
            node.set_usage(offender, 3 * GiB)
            crossed = time.monotonic()
            wait_until(lambda: not offender.alive(), 4 * POLL_S + 2, what="the offender killed")
            assert time.monotonic() - crossed < 4 * POLL_S + 2
            wait_until(
                lambda: not any(Path(f"/proc/{c}").exists() for c in offender.children),
                3,
                what="the offender's forked children gone",
            )

        fds = _metric(node, "process_open_fds")
        assert _metric(node, "process_max_fds") == 256
        assert fds is not None and fds < 128, f"{fds} open fds: the agent must not hold one per GPU process"
        wait_until(
            lambda: _metric(node, "vramguard_actions_total", action="kill", result="ok") == 1.0,
            5,
            what="one kill counted",
        )
        alive = sum(p.alive() for p in node.processes if p is not offender)
        assert alive == 1000, "no process within its quota was touched"


FORKER = 'exec 3<"$1"; while :; do sleep 3600 & sleep 0.002; done'


def test_a_continuously_forking_parent_is_killed_to_the_last_child(sim_node: SimulatedNode) -> None:
    """A parent forking a device-holding child every 2 ms: after the kill no process of the container is left,
    and the action is reported ok only then."""
    pod = sim_node.add_pod("forker", "ml", containers={"main": {VRAM: "4Gi"}})
    container = pod.containers["main"]
    popen = container.spawn(["/bin/sh", "-c", FORKER, "forker", str(sim_node.device_path)])
    parent = SimProcess(popen=popen, gpu=0, used_bytes=2 * GiB, pod=pod, container="main")
    sim_node.processes.append(parent)
    sim_node.sync()
    sim_node.start_agent("--mode", "kill", "--poll-interval", str(POLL_S), stderr=subprocess.DEVNULL)
    sim_node.wait_ready()
    wait_until(lambda: len(container.pids()) > 100, 10, what="the parent to fork over 100 children")

    sim_node.set_usage(parent, 6 * GiB)
    wait_until(lambda: not parent.alive(), 4 * POLL_S + 2, what="the forking parent killed")
    wait_until(lambda: container.pids() == [], 5, what="every process of the container gone")
    wait_until(
        lambda: _metric(sim_node, "vramguard_actions_total", action="kill", result="ok") == 1.0,
        5,
        what="one kill counted",
    )
    assert _metric(sim_node, "vramguard_actions_total", action="kill", result="memory-not-freed") == 0


def test_megabyte_annotations_cost_bounded_log_lines(sim_node: SimulatedNode) -> None:
    """A 10 MB quota annotation is reported invalid in lines of bounded length, once, and the pod is still
    held to the namespace cap."""
    policy = sim_node.workdir / "policy.yaml"
    policy.write_text("namespaces:\n  tenant:\n    max_quota: 2Gi\n")
    huge = "9" * 10_000_000
    pod = sim_node.add_pod("sneaky", "tenant", annotations={"vramguard.io/vram-limit": huge})
    proc = sim_node.spawn(pod, "main", 1 * GiB)
    agent = sim_node.start_agent(
        "--mode", "kill", "--policy", str(policy), "--poll-interval", str(POLL_S), stderr=subprocess.PIPE, text=True
    )
    sim_node.wait_ready(timeout_s=60)
    sim_node.set_usage(proc, 3 * GiB)
    wait_until(lambda: not proc.alive(), 4 * POLL_S + 2, what="the pod killed, held to the 2Gi cap")
    sim_node.stop_agents()
    _, err = agent.communicate(timeout=15)
    lines = err.splitlines()
    assert max(len(line) for line in lines) < 8192, "every log line is bounded"
    invalid = [line for line in lines if "quota_invalid" in line or "VRAMQuotaInvalid" in line]
    assert 1 <= len(invalid) <= 2, "reported once (a log line, and the Event that goes to the log without an API)"
    assert "namespace max_quota 2Gi" in invalid[0]


def test_a_broken_pods_file_is_on_readyz_and_the_last_good_pods_stay(sim_node: SimulatedNode) -> None:
    """A pods file rewritten with a YAML alias is refused: /readyz says why, and enforcement goes on with the
    pods read before."""
    pod = sim_node.add_pod("trainer", "ml", containers={"main": {VRAM: "4Gi"}})
    proc = sim_node.spawn(pod, "main", 2 * GiB)
    sim_node.start_agent("--mode", "kill", "--poll-interval", str(POLL_S), stderr=subprocess.DEVNULL)
    sim_node.wait_ready()
    sim_node.pods_path.write_text("a: &x [1, 2]\nb: *x\n")
    wait_until(lambda: sim_node.http_get("/readyz")[0] == 503, 5, what="/readyz to say 503 for the broken pods file")
    assert "aliases are not allowed" in sim_node.http_get("/readyz")[1]
    sim_node.nvml.gpu(0).processes = []
    proc.used_bytes = 6 * GiB
    sim_node.nvml.gpu(0).add_process(proc.pid, proc.used_bytes)
    sim_node.nvml.write(sim_node.state_path)  # NVML only: the pods file stays broken
    wait_until(lambda: not proc.alive(), 4 * POLL_S + 2, what="the kill, enforced from the last good pods")


def _listening_addresses(port: int) -> set[str]:
    """The IPv4 addresses a socket listens on at `port`, from /proc/net/tcp (state 0A is LISTEN)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        pytest.param([], {"0.0.0.0"}, id="all-interfaces-by-default"),
        pytest.param(["--metrics-bind-address", "127.0.0.1"], {"127.0.0.1"}, id="loopback-only-on-request"),
    ],
)
def test_metrics_bind_address(sim_node: SimulatedNode, flag: list[str], expected: set[str]) -> None:
    """--metrics-bind-address decides where /metrics and the probes listen."""
    sim_node.start_agent("--poll-interval", str(POLL_S), *flag, stderr=subprocess.DEVNULL)
    sim_node.wait_ready()
    assert _listening_addresses(sim_node.metrics_port) == expected


def _freeze_file(pod: SimPod) -> Path:
    (directory,) = pod.containers["main"].dirs  # a v2 node: one hierarchy
    return Path(directory, "cgroup.freeze")


def test_an_agent_killed_mid_kill_leaves_nothing_frozen(sim_node: SimulatedNode) -> None:
    """SIGKILL of the agent while it holds a container of 400 GPU holders frozen leaves it frozen; the next agent
    thaws it at start, so the container's other process runs again. A container someone else froze stays so."""
    greedy = sim_node.add_pod("greedy", "ml", containers={"main": {VRAM: "1Gi"}})
    other = sim_node.add_pod("checkpointed", "ml")
    holders = sim_node.spawn(greedy, "main", 2 * GiB, children=399)
    shell = greedy.containers["main"].spawn(["sleep", "600"])
    frozen_by_someone = other.containers["main"].spawn(["sleep", "600"])
    _freeze_file(other).write_text("1")
    freeze = _freeze_file(greedy)
    agent = sim_node.start_agent("--mode", "kill", "--poll-interval", str(POLL_S))

    # A busy read (no pause between reads): the freeze lasts tens of milliseconds.
    wait_until(lambda: freeze.read_text().strip() == "1", 30, what="the agent to freeze the container", interval_s=0)
    agent.kill()
    agent.wait()
    assert freeze.read_text().strip() == "1", "killed mid-kill: the container is left frozen"
    assert holders.alive() or shell.poll() is None

    sim_node.start_agent("--mode", "kill", "--poll-interval", str(POLL_S))
    sim_node.wait_ready()
    assert freeze.read_text().strip() == "0", "the next agent thawed what the killed one froze"
    wait_until(
        lambda: Path(f"/proc/{shell.pid}/stat").read_text().split(") ")[1][0] in "RS",
        2,
        what="the thawed shell running or sleeping",
    )
    assert _freeze_file(other).read_text().strip() == "1", "a freeze that is not the agent's is left alone"
    assert frozen_by_someone.poll() is None
    wait_until(lambda: not holders.alive(), 5, what="the offender killed after all")
    _freeze_file(other).write_text("0")


def test_sighup_stops_the_agent_like_sigterm(sim_node: SimulatedNode) -> None:
    """SIGHUP (a terminal closing, a supervisor's reload) ends the agent cleanly, never in the middle of a kill."""
    agent = sim_node.start_agent("--poll-interval", str(POLL_S), stderr=subprocess.PIPE, text=True)
    sim_node.wait_ready()
    agent.send_signal(signal.SIGHUP)
    _, err = agent.communicate(timeout=10)
    assert agent.returncode == 0
    assert '"event": "stopped"' in err


ROOTLESS = "/user.slice/user-64957.slice/user@64957.service"  # where a rootless kubelet makes its pods' cgroups
GRACE_S = 10.0  # the policy's least orphan_grace


def _look_alike(node: SimulatedNode, kc: KubeletCgroups, used_bytes: int, pod: SimPod | None = None) -> SimProcess:
    """A GPU process in a pod-shaped cgroup of `kc` (outside the kubelet's tree): naming `pod`'s UID and its main
    container's ID, or a pod this node's API server never had."""
    forged = kc.pod(uid=pod.uid if pod is not None else None, qos=pod.qos if pod is not None else "burstable")
    ctr = forged.container(container_id=pod.containers["main"].container_id if pod is not None else None)
    popen = ctr.spawn(device_holder_argv(str(node.device_path)), stdout=subprocess.DEVNULL)
    proc = SimProcess(popen=popen, gpu=0, used_bytes=used_bytes)
    node.processes.append(proc)
    node.sync()
    return proc


def test_a_look_alike_naming_a_live_pod_is_charged_to_no_pod(tmp_path: Path, make_cgroups: CgroupsFactory) -> None:
    """A process under a user slice (the rootless shape) naming a live pod's UID and container ID, holding 39.5 GiB,
    is reported as outside the kubelet: the live pod stays at its own 1 GiB of its 40Gi quota, and nothing is
    killed."""
    need_cgroups(2)
    with SimulatedNode(tmp_path / "node", gpu_total_bytes=80 * GiB) as node:
        live = node.add_pod("trainer", "ml", annotations={"vramguard.io/vram-limit": "40Gi"})
        own = node.spawn(live, "main", 1 * GiB)
        impostor = _look_alike(node, make_cgroups("systemd", 2, under=ROOTLESS), int(39.5 * GiB), live)
        node.start_agent("--mode", "kill", "--poll-interval", str(POLL_S), stderr=subprocess.DEVNULL)
        node.wait_ready()
        node.wait_scans(8)

        assert own.alive() and impostor.alive(), "nothing is killed"
        assert _metric(node, "vramguard_container_gpu_memory_used_bytes", pod="trainer", gpu="0") == 1 * GiB
        outside = _metric(node, "vramguard_unattributed_gpu_memory_bytes", gpu="0", reason="outside-kubelet")
        assert outside == 39.5 * GiB
        assert _metric(node, "vramguard_actions_total", action="kill") in (None, 0.0)


def test_look_alikes_of_pod_cgroups_are_never_reclaimed_as_orphans(
    sim_node: SimulatedNode, make_cgroups: CgroupsFactory, tmp_path: Path
) -> None:
    """Pod cgroups under a user slice and under a nested node's /docker/<id>/kubepods, of pods this agent's API server
    never had, are outside the kubelet: a deleted pod's leftover of this kubelet is reclaimed after the grace, and
    eight scans later the look-alikes still run, reported as outside the kubelet."""
    gone = sim_node.add_pod("trainer", "ml")
    leftover = sim_node.spawn(gone, "main", 3 * GiB)
    rootless = _look_alike(sim_node, make_cgroups("systemd", 2, under=ROOTLESS), 2 * GiB)
    nested = _look_alike(sim_node, make_cgroups("cgroupfs", 2, under=f"/docker/{secrets.token_hex(32)}"), 1 * GiB)
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"mode: kill\norphan_grace: {GRACE_S:g}s\nexempt_namespaces: []\n")
    sim_node.start_agent("--policy", str(policy), "--poll-interval", str(POLL_S), stderr=subprocess.DEVNULL)
    sim_node.wait_ready()
    sim_node.wait_scans(2)

    sim_node.pods.remove(gone)
    sim_node.sync()
    everyone = (leftover, rootless, nested)
    wait_until(lambda: not all(p.alive() for p in everyone), GRACE_S + 10.0, what="an orphan reclaimed")
    sim_node.wait_scans(8)

    assert rootless.alive() and nested.alive(), "a look-alike is never an orphan"
    assert not leftover.alive(), "the deleted pod's leftover is"
    assert _metric(sim_node, "vramguard_orphan_reclaims_total", result="ok") == 1.0
    assert _metric(sim_node, "vramguard_unattributed_gpu_memory_bytes", gpu="0", reason="outside-kubelet") == 3 * GiB
    assert _metric(sim_node, "vramguard_orphaned_gpu_memory_bytes", gpu="0") == 0.0
