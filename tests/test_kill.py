"""PidfdKiller against real processes in real kubelet-shaped cgroups, with a temporary file as the GPU device."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from cgroup_fixtures import CgroupsFactory, pidfd_exited, wait_until
from vramguard.kill import (
    SKIP_EXITED,
    SKIP_GONE,
    SKIP_INVALID_PID,
    SKIP_NOT_IN_CONTAINER,
    SKIP_PID_NAMESPACE,
    SKIP_PID_REUSED,
    SKIP_SELF,
    PidfdKiller,
)
from vramguard.model import GpuDevice, PodInfo, ProcessRef, Violation
from vramguard.procfs import holds_nvidia_device, read_start_time
from vramguard.testing.cgroups import ContainerCgroup, KubeletCgroups, PodCgroup, device_holder_argv

pytestmark = pytest.mark.cgroups


GPU = GpuDevice(index=0, uuid="GPU-0", name="fake", total_bytes=16 << 30, used_bytes=12 << 30, free_bytes=4 << 30)


@dataclass
class Proc:
    """A real process under test, with a pidfd opened while it was surely alive, to observe its exit."""

    pid: int
    popen: subprocess.Popen[Any] | None
    pidfd: int

    @property
    def ref(self) -> ProcessRef:
        start = read_start_time(self.pid)
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
            wait_until(partial(holds_nvidia_device, p.pid, "/proc", self.device_prefix), what="device opened")
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
    return PidfdKiller(proc_root="/proc", device_prefix=world.device_prefix, exit_timeout_s=5.0, **kwargs)


def violation(
    pod: PodCgroup, containers: Sequence[ContainerCgroup], processes: Sequence[ProcessRef], pod_wide: bool = False
) -> Violation:
    return Violation(
        pod=PodInfo(uid=pod.uid, namespace="ml", name="trainer"),
        container=None if pod_wide else "main",
        device=GPU,
        used_bytes=12 << 30,
        limit_bytes=8 << 30,
        hard_bytes=8 << 30,
        quota_source="limits[vramguard.io/vram]",
        processes=tuple(processes),
        container_ids=tuple(c.container_id for c in containers),
    )


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

    result = killer(world).kill(violation(pod, [a, b], [pa.ref], pod_wide=True))

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
    me = ProcessRef(os.getpid(), read_start_time(os.getpid()) or 0)
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
    me = ProcessRef(os.getpid(), read_start_time(os.getpid()) or 0)

    result = killer(world).kill(violation(pod, [ctr], [me]))

    assert result.skipped == ((me, SKIP_SELF),)


def test_every_pidfd_is_closed(world: World) -> None:
    """After a kill that signals some processes and skips others, the agent holds no more fds than before."""
    pod = world.kc.pod()
    ctr = pod.container()
    holders = world.holder(ctr, children=3)
    stale = ProcessRef(holders[0].pid, 1)
    before = len(os.listdir("/proc/self/fd"))

    result = killer(world).kill(violation(pod, [ctr], [stale, holders[1].ref]))

    assert len(os.listdir("/proc/self/fd")) == before
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
