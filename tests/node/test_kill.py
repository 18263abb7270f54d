"""PidfdKiller against real processes in real kubelet-shaped cgroups, with a temporary file as the GPU device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from cgroup_fixtures import CgroupsFactory, pidfd_exited
from fd_fixtures import open_fds, opened_since
from vramguard.core.actions import KillTarget
from vramguard.core.process import ProcessRef
from vramguard.node.freezes import FreezeJournal
from vramguard.node.kill import (
    SKIP_EXITED,
    SKIP_GONE,
    SKIP_INVALID_PID,
    SKIP_NOT_IN_CONTAINER,
    SKIP_PID_NAMESPACE,
    SKIP_PID_REUSED,
    SKIP_SELF,
    SKIP_UNREADABLE,
    PidfdKiller,
)
from vramguard.node.procfs import holds_device, read_stat
from vramguard_testbed.cgroups import ContainerCgroup, KubeletCgroups, PodCgroup, device_holder_argv
from vramguard_testbed.waiting import wait_until

KILL_CHILD = Path(__file__).parents[1] / "kill_child.py"

pytestmark = pytest.mark.cgroups


@dataclass
class Proc:
    """A real process under test, with a pidfd opened while it was surely alive, to observe its exit."""

    pid: int
    popen: subprocess.Popen[Any] | None
    pidfd: int

    @property
    def ref(self) -> ProcessRef:
        start = (read_stat(self.pid) or ("?", None))[1]
        assert start is not None, f"{self.pid} is gone"
        return ProcessRef(self.pid, start)

    def alive(self) -> bool:
        return not pidfd_exited(self.pidfd)

    def died_of_sigkill(self) -> bool:
        if not pidfd_exited(self.pidfd, timeout_s=5):
            return False
        return self.popen is None or self.popen.wait(timeout=5) == -9


class World:
    """Spawns processes into containers and keeps the pidfds to watch them; closes everything at the end."""

    def __init__(self, kc: KubeletCgroups, device: Path) -> None:
        self.kc = kc
        self.device = device
        self.device_prefix = str(device.parent / "nvidia")
        self._pidfds: list[int] = []

    def _holds(self, pid: int) -> bool:
        return bool(holds_device(pid, "/proc", self.device_prefix))

    def _watch(self, pid: int, popen: subprocess.Popen[Any] | None) -> Proc:
        fd = os.pidfd_open(pid)
        self._pidfds.append(fd)
        return Proc(pid, popen, fd)

    def holder(self, ctr: ContainerCgroup, children: int = 0) -> list[Proc]:
        """A process holding the fake device, then the `children` it forked (they inherit the open file)."""
        popen = ctr.spawn(device_holder_argv(str(self.device), children), stdout=subprocess.PIPE, text=True)
        assert popen.stdout is not None
        child_pids = [int(popen.stdout.readline()) for _ in range(children)]
        procs = [self._watch(popen.pid, popen), *(self._watch(pid, None) for pid in child_pids)]
        for p in procs:
            wait_until(partial(self._holds, p.pid), what="device opened")
        return procs

    def idle(self, target: ContainerCgroup | PodCgroup) -> Proc:
        """A process that holds no device file."""
        popen = target.spawn(["sleep", "300"])
        return self._watch(popen.pid, popen)

    def close(self) -> None:
        for fd in self._pidfds:
            os.close(fd)


@pytest.fixture
def world(make_cgroups: CgroupsFactory, tmp_path: Path) -> Iterator[World]:
    device = tmp_path / "dev" / "nvidia0"
    device.parent.mkdir()
    device.touch()
    w = World(make_cgroups("systemd", 2), device)
    yield w
    w.close()


def killer(world: World, **kwargs: Any) -> PidfdKiller:
    """A killer that freezes containers, noting each freeze in a journal beside the test's device file."""
    kwargs.setdefault("journal", FreezeJournal(str(world.device.parent / "freezes")))
    return PidfdKiller(proc_root="/proc", device_prefix=world.device_prefix, exit_timeout_s=5.0, **kwargs)


def violation(pod: PodCgroup, containers: Sequence[ContainerCgroup], processes: Sequence[ProcessRef]) -> KillTarget:
    """What a violation (or an orphan) of these containers hands the killer."""
    return KillTarget(pod.uid, tuple(c.container_id for c in containers), tuple(processes))


@pytest.mark.parametrize(
    ("driver", "version", "runtime"),
    [
        pytest.param("systemd", 2, "containerd", id="v2-systemd-containerd"),
        pytest.param("cgroupfs", 2, "crio", id="v2-cgroupfs-crio"),
        pytest.param("cgroupfs", 1, "docker", id="v1-cgroupfs-docker"),
        pytest.param("systemd", 1, "crio", id="v1-systemd-crio"),
    ],
)
def test_sampled_holder_and_its_forked_children_are_killed(
    make_cgroups: CgroupsFactory, tmp_path: Path, driver: str, version: int, runtime: str
) -> None:
    """The sampled process dies, and so do the forked children holding the device that NVML did not list."""
    device = tmp_path / "nvidia0"
    device.touch()
    world = World(make_cgroups(driver, version), device)
    try:
        pod = world.kc.pod(qos="burstable")
        ctr = pod.container(runtime=runtime)
        parent, child1, child2 = world.holder(ctr, children=2)

        result = killer(world).kill(violation(pod, [ctr], [parent.ref]))

        assert sorted(r.pid for r in result.killed) == sorted([parent.pid, child1.pid, child2.pid])
        assert result.skipped == ()
        assert result.exited and result.ok
        assert parent.died_of_sigkill() and child1.died_of_sigkill() and child2.died_of_sigkill()
    finally:
        world.close()


def test_process_of_the_container_without_the_device_survives(world: World) -> None:
    """Only device holders are killed: an idle process of the same container is neither killed nor skipped."""
    pod = world.kc.pod()
    ctr = pod.container()
    (gpu,) = world.holder(ctr)
    idle = world.idle(ctr)

    result = killer(world).kill(violation(pod, [ctr], [gpu.ref]))

    assert [r.pid for r in result.killed] == [gpu.pid]
    assert gpu.died_of_sigkill()
    assert idle.alive()
    assert idle.pid not in {r.pid for r, _ in result.skipped}


@pytest.mark.parametrize(("driver", "version"), [("systemd", 2), ("cgroupfs", 1)], ids=["v2", "v1-freezer"])
def test_every_process_takes_the_whole_container_and_nothing_else(
    make_cgroups: CgroupsFactory, tmp_path: Path, driver: str, version: int
) -> None:
    """For a repeat, every process of the container dies, the supervisor that holds no device too; the sibling
    container and the pod's own cgroup live on."""
    device = tmp_path / "nvidia0"
    device.touch()
    world = World(make_cgroups(driver, version, v1_hierarchies=("freezer", "pids")), device)
    try:
        pod = world.kc.pod()
        ctr, sibling = pod.container(), pod.container()
        (gpu,) = world.holder(ctr)
        supervisor, shell = world.idle(ctr), world.idle(ctr)
        neighbour, in_pod = world.idle(sibling), world.idle(pod)

        result = killer(world).kill(violation(pod, [ctr], [gpu.ref]), every_process=True)

        assert sorted(r.pid for r in result.killed) == sorted([gpu.pid, supervisor.pid, shell.pid])
        assert result.ok
        assert gpu.died_of_sigkill() and supervisor.died_of_sigkill() and shell.died_of_sigkill()
        assert neighbour.alive() and in_pod.alive()
    finally:
        world.close()


def test_other_container_and_other_pod_survive(world: World) -> None:
    """Holders in a sibling container or another pod live on, even when a stale sample names one of them."""
    pod = world.kc.pod()
    ctr, sibling = pod.container(), pod.container()
    other_pod = world.kc.pod()
    stranger_ctr = other_pod.container()
    (gpu,) = world.holder(ctr)
    (sib,) = world.holder(sibling)
    (stranger,) = world.holder(stranger_ctr)

    result = killer(world).kill(violation(pod, [ctr], [gpu.ref, stranger.ref]))

    assert [r.pid for r in result.killed] == [gpu.pid]
    assert result.skipped == ((stranger.ref, SKIP_NOT_IN_CONTAINER),)
    assert gpu.died_of_sigkill()
    assert sib.alive() and stranger.alive()


def test_pod_wide_violation_kills_holders_of_every_listed_container(world: World) -> None:
    """With a pod-wide quota every listed container's holders die; an unlisted container's do not."""
    pod = world.kc.pod()
    a, b, unlisted = pod.container(), pod.container(), pod.container()
    (pa,) = world.holder(a)
    (pb,) = world.holder(b)
    (pu,) = world.holder(unlisted)

    result = killer(world).kill(violation(pod, [a, b], [pa.ref]))

    assert sorted(r.pid for r in result.killed) == sorted([pa.pid, pb.pid])
    assert pa.died_of_sigkill() and pb.died_of_sigkill()
    assert pu.alive()


def test_recycled_pid_is_never_signalled(world: World) -> None:
    """A sampled ref whose start time differs from the live process at that PID is skipped, never signalled.

    The live process is even a device holder of the violating container, so discovery alone would pick it:
    the stale sample still wins, and the newcomer is left to the next scan.
    """
    pod = world.kc.pod()
    ctr = pod.container()
    (newcomer,) = world.holder(ctr)
    stale = ProcessRef(newcomer.pid, newcomer.ref.start_time - 1)

    result = killer(world).kill(violation(pod, [ctr], [stale]))

    assert result.killed == ()
    assert result.skipped == ((stale, SKIP_PID_REUSED),)
    assert not result.ok
    assert newcomer.alive()


@pytest.mark.parametrize(
    ("reap", "reason"),
    [
        pytest.param(True, SKIP_GONE, id="exited-and-reaped"),
        pytest.param(False, SKIP_EXITED, id="exited-zombie-not-reaped"),
    ],
)
def test_process_that_already_exited_is_skipped(world: World, reap: bool, reason: str) -> None:
    """A sampled process that is gone (or a zombie) is reported skipped, and the other holders still die."""
    pod = world.kc.pod()
    ctr = pod.container()
    (dead,) = world.holder(ctr)
    (gpu,) = world.holder(ctr)
    dead_ref = dead.ref
    assert dead.popen is not None
    dead.popen.kill()
    wait_until(lambda: not dead.alive(), what="the process to exit")
    if reap:
        dead.popen.wait()

    result = killer(world).kill(violation(pod, [ctr], [dead_ref, gpu.ref]))

    assert result.skipped == ((dead_ref, reason),)
    assert [r.pid for r in result.killed] == [gpu.pid]
    assert result.exited
    assert gpu.died_of_sigkill()


def test_agent_itself_and_low_pids_are_never_signalled(world: World) -> None:
    """The agent's own PID (self_pid) and PIDs 0 and 1 are skipped, even inside the violating container."""
    pod = world.kc.pod()
    ctr = pod.container()
    (agent,) = world.holder(ctr)
    (gpu,) = world.holder(ctr)
    me = ProcessRef(os.getpid(), _start_time(os.getpid()))
    refs = [ProcessRef(0, 0), ProcessRef(1, 1), agent.ref, gpu.ref, me]

    result = killer(world, self_pid=agent.pid).kill(violation(pod, [ctr], refs))

    assert [r.pid for r in result.killed] == [gpu.pid]
    assert dict((r.pid, why) for r, why in result.skipped) == {
        0: SKIP_INVALID_PID,
        1: SKIP_INVALID_PID,
        agent.pid: SKIP_SELF,
        # The test process plays no agent here, but it is in no container, so it is refused for that.
        os.getpid(): SKIP_NOT_IN_CONTAINER,
    }
    assert agent.alive()
    assert gpu.died_of_sigkill()


def test_default_self_pid_is_the_calling_process(world: World) -> None:
    """Without self_pid the killer protects os.getpid()."""
    pod = world.kc.pod()
    ctr = pod.container()
    me = ProcessRef(os.getpid(), _start_time(os.getpid()))

    result = killer(world).kill(violation(pod, [ctr], [me]))

    assert result.skipped == ((me, SKIP_SELF),)


def test_every_pidfd_is_closed(world: World) -> None:
    """After a kill that signals some processes and skips others, the agent holds no more fds than before."""
    pod = world.kc.pod()
    ctr = pod.container()
    holders = world.holder(ctr, children=3)
    stale = ProcessRef(holders[0].pid, 1)
    before = open_fds()

    result = killer(world).kill(violation(pod, [ctr], [stale, holders[1].ref]))

    assert opened_since(before) == {}
    assert len(result.killed) == 3  # holders[1] sampled, holders[2..3] discovered; holders[0]'s sample is stale
    assert result.exited


def test_proc_root_of_another_pid_namespace_signals_nothing(world: World, tmp_path: Path) -> None:
    """When proc_root's PIDs are not the agent's (no hostPID), every candidate is skipped and survives."""
    pod = world.kc.pod()
    ctr = pod.container()
    (gpu,) = world.holder(ctr)
    fake_proc = tmp_path / "proc"
    fake_proc.mkdir()

    result = PidfdKiller(proc_root=str(fake_proc), device_prefix=world.device_prefix).kill(
        violation(pod, [ctr], [gpu.ref])
    )

    assert result.killed == ()
    assert result.skipped == ((gpu.ref, SKIP_PID_NAMESPACE),)
    assert gpu.alive()


# ----------------------------------------------------------------------------------------------------------
# Finishing the job: forks during the kill, few fds, unreadable /proc, freezing


# Forks a device holder every 2 ms, forever: `sleep 600 &` keeps fd 3 (the device) like a DataLoader worker.
FORKER = 'exec 3<"$1"; while :; do sleep 600 & sleep 0.002; done'


def device_holders(world: World, ctr: ContainerCgroup) -> list[int]:
    return [pid for pid in ctr.pids() if holds_device(pid, "/proc", world.device_prefix)]


def freeze_state(ctr: ContainerCgroup, version: int) -> str:
    name = "cgroup.freeze" if version == 2 else "freezer.state"
    directory = next(d for d in ctr.dirs if version == 2 or "/freezer/" in d)
    return Path(directory, name).read_text().strip()


def world_for(make_cgroups: CgroupsFactory, tmp_path: Path, version: int) -> World:
    """A World whose v1 containers are in the freezer hierarchy too (and pids, and the named systemd one)."""
    device = tmp_path / "dev" / "nvidia0"
    device.parent.mkdir(exist_ok=True)
    device.touch()
    kwargs: dict[str, Any] = {"v1_hierarchies": ("pids", "systemd", "freezer")} if version == 1 else {}
    return World(make_cgroups("cgroupfs", version, **kwargs), device)


@pytest.mark.parametrize(
    ("version", "find_cgroup"),
    [
        pytest.param(2, True, id="v2-frozen"),
        pytest.param(1, True, id="v1-freezer-frozen"),
        pytest.param(2, False, id="v2-cgroup-not-found-rounds-only"),
        pytest.param(1, False, id="v1-cgroup-not-found-rounds-only"),
    ],
)
def test_parent_forking_every_2ms_leaves_no_survivor(
    make_cgroups: CgroupsFactory, tmp_path: Path, version: int, find_cgroup: bool
) -> None:
    """A parent forking a device holder every 2 ms: after kill() no process of the container holds the device."""
    world = world_for(make_cgroups, tmp_path, version)
    try:
        pod = world.kc.pod()
        ctr = pod.container()
        popen = ctr.spawn(["/bin/sh", "-c", FORKER, "forker", str(world.device)])
        parent = world._watch(popen.pid, popen)
        wait_until(lambda: len(ctr.pids()) >= 60, timeout_s=30, what="the forker to have 60 children")
        # No cgroup under this root: the re-scan rounds alone must finish the job.
        cgroup_root = "/sys/fs/cgroup" if find_cgroup else str(tmp_path / "no-cgroups")

        result = killer(world, cgroup_root=cgroup_root).kill(violation(pod, [ctr], [parent.ref]))

        assert parent.died_of_sigkill()
        # Orphans are reaped by init: bounds for a busy 2-core machine (about 0.1 s at rest); a survivor
        # (sleep 600) would stay for good.
        wait_until(lambda: device_holders(world, ctr) == [], timeout_s=10, what="no device holder left")
        wait_until(lambda: ctr.pids() == [], timeout_s=10, what="every child to be dead")
        assert result.remaining == ()
        assert result.exited and result.ok
        assert len(result.killed) >= 30  # some `sleep 0.002` children exit before they can be signalled
        if find_cgroup:
            assert freeze_state(ctr, version) == ("0" if version == 2 else "THAWED")
    finally:
        world.close()


def run_kill_child(spec: dict[str, Any], timeout_s: float = 60) -> dict[str, Any]:
    """kill() in a subprocess (see kill_child.py); its result as a dict."""
    done = subprocess.run(
        [sys.executable, str(KILL_CHILD), json.dumps(spec)], capture_output=True, text=True, timeout=timeout_s
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize(
    "find_cgroup", [pytest.param(True, id="frozen-cgroup"), pytest.param(False, id="proc-walk-rounds")]
)
def test_killer_with_64_fds_kills_300_holders(world: World, tmp_path: Path, find_cgroup: bool) -> None:
    """With RLIMIT_NOFILE at 64 the killer still kills ~300 device holders: it never holds an fd per process."""
    pod = world.kc.pod()
    ctr = pod.container()
    procs = world.holder(ctr, children=299)
    spec = {
        "pod_uid": pod.uid,
        "container_ids": [ctr.container_id],
        "processes": [[procs[0].pid, procs[0].ref.start_time]],
        "device_prefix": world.device_prefix,
        "cgroup_root": "/sys/fs/cgroup" if find_cgroup else str(tmp_path / "no-cgroups"),
        "nofile": 64,
        "journal": str(tmp_path / "freezes"),
    }

    result = run_kill_child(spec)

    assert sorted(pid for pid, _ in result["killed"]) == sorted(p.pid for p in procs)
    assert result["remaining"] == [] and result["ok"], result["skipped"]
    assert all(p.died_of_sigkill() for p in procs)


@pytest.mark.parametrize("free_fds", [pytest.param(0, id="no-fd-free"), pytest.param(1, id="one-fd-free")])
def test_out_of_fds_is_never_reported_as_gone(world: World, free_fds: int) -> None:
    """An EMFILE says nothing about the process: it is skipped as unreadable, reported remaining, and lives."""
    pod = world.kc.pod()
    ctr = pod.container()
    (gpu,) = world.holder(ctr)
    spec = {
        "pod_uid": pod.uid,
        "container_ids": [ctr.container_id],
        "processes": [[gpu.pid, gpu.ref.start_time]],
        "device_prefix": world.device_prefix,
        "nofile": 64,
        "free_fds": free_fds,
        "journal": str(world.device.parent / "freezes"),
    }

    result = run_kill_child(spec)

    reasons = [reason for _, _, reason in result["skipped"]]
    assert SKIP_GONE not in reasons
    assert [[pid, start] for pid, start, _ in result["skipped"]] == [[gpu.pid, gpu.ref.start_time]]
    assert reasons[0].startswith(SKIP_UNREADABLE) and "Too many open files" in reasons[0]
    assert result["remaining"] == [[gpu.pid, gpu.ref.start_time]]
    assert not result["ok"]
    assert gpu.alive()
    assert freeze_state(ctr, 2) == "0"


class RaisingKiller(PidfdKiller):
    """Raises from the identity check, after noting whether the container was frozen at that moment."""

    def __init__(self, control: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.control = control
        self.seen_while_verifying: list[str] = []

    def _verify(self, run: Any, ref: ProcessRef) -> str | None:
        self.seen_while_verifying.append(self.control.read_text())
        raise RuntimeError("verify failed")


@pytest.mark.parametrize("version", [pytest.param(2, id="v2"), pytest.param(1, id="v1-freezer")])
def test_container_is_thawed_even_when_a_check_raises(
    make_cgroups: CgroupsFactory, tmp_path: Path, version: int
) -> None:
    """The freeze is undone in a finally: an exception in the middle of the kill leaves the container running."""
    world = world_for(make_cgroups, tmp_path, version)
    try:
        pod = world.kc.pod()
        ctr = pod.container()
        (gpu,) = world.holder(ctr)
        directory = next(d for d in ctr.dirs if version == 2 or "/freezer/" in d)
        control = Path(directory, "cgroup.events" if version == 2 else "freezer.state")
        fds_before = open_fds()
        journal = FreezeJournal(str(tmp_path / "freezes"))
        raising = RaisingKiller(control, device_prefix=world.device_prefix, exit_timeout_s=5.0, journal=journal)

        with pytest.raises(RuntimeError, match="verify failed"):
            raising.kill(violation(pod, [ctr], [gpu.ref]))

        frozen_then = (
            "frozen 1" in raising.seen_while_verifying[0] or raising.seen_while_verifying[0].strip() == "FROZEN"
        )
        assert frozen_then, f"the container was not frozen during the check: {raising.seen_while_verifying}"
        assert freeze_state(ctr, version) == ("0" if version == 2 else "THAWED")
        if version == 2:
            assert "frozen 0" in control.read_text()
        assert opened_since(fds_before) == {}
        assert journal.entries() == [], "thawed, so forgotten"
        assert gpu.alive()
        # And it really runs again: a thawed container can be killed normally.
        assert killer(world).kill(violation(pod, [ctr], [gpu.ref])).ok
        assert gpu.died_of_sigkill()
    finally:
        world.close()


def test_killer_in_a_private_cgroup_namespace_places_paths_from_its_own_root(
    make_cgroups: CgroupsFactory, tmp_path: Path
) -> None:
    """An agent in kind (--kubelet-cgroup-root /kubelet) with its own cgroup namespace reads paths starting with /..;
    it places them from its namespace's root, so the host kubelet's directory with the same pod UID and container ID
    is never frozen or signalled, and the kind kubelet's container is emptied."""
    device = tmp_path / "dev" / "nvidia0"
    device.parent.mkdir()
    device.touch()
    real = World(make_cgroups("cgroupfs", 2, kind=True), device)  # /kubelet/kubepods/burstable/pod<X>/<id>
    decoys = World(make_cgroups("cgroupfs", 2), device)  # /kubepods/burstable/pod<X>/<id>
    try:
        pod = real.kc.pod(qos="burstable")
        ctr = pod.container()
        look_alike = decoys.kc.pod(uid=pod.uid, qos="burstable").container(container_id=ctr.container_id)
        victims = real.holder(ctr, children=3)
        (bystander,) = decoys.holder(look_alike)
        agent_ctr = real.kc.pod(qos="besteffort").container()  # the agent's own container: its cgroupns root
        spec = {
            "pod_uid": pod.uid,
            "container_ids": [ctr.container_id],
            "processes": [[victims[0].pid, victims[0].ref.start_time], [bystander.pid, bystander.ref.start_time]],
            "device_prefix": real.device_prefix,
            "journal": str(tmp_path / "freezes"),
            "kubelet_cgroup_root": "/kubelet",
        }
        agent = agent_ctr.spawn(
            ["unshare", "--cgroup", sys.executable, str(KILL_CHILD), json.dumps(spec)],
            stdout=subprocess.PIPE,
            text=True,
        )
        out, _ = agent.communicate(timeout=60)
        assert agent.returncode == 0
        result = json.loads(out)

        assert sorted(pid for pid, _ in result["killed"]) == sorted(p.pid for p in victims)
        assert [(pid, reason) for pid, _, reason in result["skipped"]] == [(bystander.pid, SKIP_NOT_IN_CONTAINER)]
        assert result["ok"]
        assert all(p.died_of_sigkill() for p in victims)
        assert bystander.alive()
        assert (Path(look_alike.dirs[0]) / "cgroup.freeze").read_text().strip() == "0"
    finally:
        real.close()
        decoys.close()


ROOTLESS = "/user.slice/user-64957.slice/user@64957.service"  # a rootless kubelet's tree, in a user's service


@pytest.mark.parametrize(
    ("driver", "under", "real_container"),
    [
        pytest.param("systemd", ROOTLESS, True, id="user-slice-beside-the-real-container"),
        pytest.param("systemd", ROOTLESS, False, id="user-slice-and-no-real-container-directory"),
        pytest.param("cgroupfs", f"/docker/{'5e' * 32}", False, id="nested-node-and-no-real-container-directory"),
    ],
)
def test_a_look_alike_naming_the_violating_container_is_never_signalled(
    make_cgroups: CgroupsFactory, tmp_path: Path, driver: str, under: str, real_container: bool
) -> None:
    """A process in a look-alike cgroup outside the kubelet's tree, naming the violating pod's UID and container ID
    and sampled with it, is never signalled: not beside the real container, nor when the container has no directory
    in the kubelet's tree to find (the killer then walks /proc, and still goes by the kubelet's tree only)."""
    device = tmp_path / "dev" / "nvidia0"
    device.parent.mkdir()
    device.touch()
    real = World(make_cgroups(driver, 2), device)
    elsewhere = World(make_cgroups(driver, 2, under=under), device)
    try:
        pod = real.kc.pod(qos="burstable")
        ctr = pod.container() if real_container else None
        container_id = ctr.container_id if ctr is not None else "5a" * 32
        look_alike = elsewhere.kc.pod(uid=pod.uid, qos="burstable").container(container_id=container_id)
        (impostor,) = elsewhere.holder(look_alike)
        victims = real.holder(ctr) if ctr is not None else []
        target = KillTarget(pod.uid, (container_id,), tuple(p.ref for p in [*victims, impostor]))

        result = killer(real).kill(target)

        assert [r.pid for r in result.killed] == [p.pid for p in victims]
        assert [(r.pid, reason) for r, reason in result.skipped] == [(impostor.pid, SKIP_NOT_IN_CONTAINER)]
        assert all(p.died_of_sigkill() for p in victims)
        assert impostor.alive()
        assert (Path(look_alike.dirs[0]) / "cgroup.freeze").read_text().strip() == "0"
    finally:
        real.close()
        elsewhere.close()


UID = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"
PID = 4242


def _start_time(pid: int) -> int:
    stat = read_stat(pid)
    assert stat is not None
    return stat[1]
