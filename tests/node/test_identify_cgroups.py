"""Real processes in real kubelet-shaped cgroups are attributed to the right pod and container."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from cgroup_fixtures import CgroupsFactory, need_cgroups, pidfd_exited
from vramguard.core.process import LOOK_ALIKE, CgroupIdentity, ProcessRef
from vramguard.node.cgroup import HOST_KUBELET, KubeletTree
from vramguard.node.identify import ProcIdentifier
from vramguard.node.procfs import read_stat
from vramguard_testbed.cgroups import (
    TEST_UID_PREFIX,
    ContainerCgroup,
    KubeletCgroups,
    pod_cgroup_path,
    remove_stale_test_cgroups,
)

pytestmark = pytest.mark.cgroups


LAYOUTS = [
    pytest.param("systemd", 2, "burstable", "containerd", False, id="v2-systemd-burstable-containerd"),
    pytest.param("cgroupfs", 2, "besteffort", "crio", False, id="v2-cgroupfs-besteffort-crio"),
    pytest.param("systemd", 2, "guaranteed", "docker", False, id="v2-systemd-guaranteed-docker"),
    pytest.param("cgroupfs", 1, "guaranteed", "docker", False, id="v1-cgroupfs-guaranteed-docker"),
    pytest.param("systemd", 1, "besteffort", "crio", False, id="v1-systemd-besteffort-crio"),
    pytest.param("cgroupfs", 1, "burstable", "containerd", False, id="v1-cgroupfs-burstable-containerd"),
    pytest.param("systemd", 2, "besteffort", "containerd", True, id="v2-kind-systemd-besteffort-containerd"),
    pytest.param("cgroupfs", 1, "burstable", "containerd", True, id="v1-kind-cgroupfs-burstable-containerd"),
]


@pytest.mark.parametrize(("driver", "version", "qos", "runtime", "kind"), LAYOUTS)
def test_spawned_process_is_attributed_to_its_container(
    make_cgroups: CgroupsFactory, driver: str, version: int, qos: str, runtime: str, kind: bool
) -> None:
    """identify() on a real process in a real container cgroup returns its pod UID, container ID and start time."""
    kc = make_cgroups(driver, version, kind=kind)
    pod = kc.pod(qos=qos)
    ctr = pod.container(runtime=runtime)
    proc = ctr.spawn(["sleep", "60"])

    kubelet = KubeletTree(root=("kubelet",)) if kind else HOST_KUBELET
    found = ProcIdentifier(proc_root="/proc", kubelet=kubelet).identify(proc.pid)

    assert found is not None
    ref, identity = found
    assert ref.pid == proc.pid
    assert ref.start_time == (read_stat(proc.pid) or ("?", None))[1]
    assert isinstance(identity, CgroupIdentity)
    assert (identity.pod_uid, identity.container_id) == (pod.uid, ctr.container_id)
    assert identity == ctr.identity
    assert ctr.pids() == [proc.pid]


@pytest.mark.parametrize(("driver", "version", "qos", "runtime", "kind"), LAYOUTS)
def test_cgroups_are_gone_after_close(driver: str, version: int, qos: str, runtime: str, kind: bool) -> None:
    """Closing kills the processes inside and removes every pod and container directory it created."""
    need_cgroups(version)
    with KubeletCgroups(driver, version, kind=kind) as kc:
        pod = kc.pod(qos=qos)
        ctr = pod.container(runtime=runtime)
        in_container = ctr.spawn(["sleep", "60"])
        in_pod = pod.spawn(["sleep", "60"])
        dirs = [*ctr.dirs, *pod.dirs]
        assert all(os.path.isdir(d) for d in dirs)
    assert [d for d in dirs if os.path.exists(d)] == []
    assert (in_container.returncode, in_pod.returncode) == (-9, -9)


def test_cleanup_runs_when_the_body_raises() -> None:
    """An exception inside the with-block still kills the processes and removes the cgroups."""
    need_cgroups(2)
    with pytest.raises(ZeroDivisionError), KubeletCgroups("systemd", 2) as kc:
        ctr = kc.pod().container()
        proc = ctr.spawn(["sleep", "60"])
        dirs = ctr.dirs
        1 / 0  # noqa: B018
    assert proc.returncode == -9
    assert not any(os.path.exists(d) for d in dirs)


def test_forked_grandchildren_are_killed_at_cleanup(make_cgroups: CgroupsFactory) -> None:
    """A process forked inside the container (not spawned by the helper) is killed before the rmdir too."""
    kc = make_cgroups("cgroupfs", 1)
    ctr = kc.pod().container()
    proc = ctr.spawn(["/bin/sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    assert sorted(ctr.pids()) == sorted([proc.pid, grandchild])
    pidfd = os.pidfd_open(grandchild)
    try:
        kc.close()
        assert pidfd_exited(pidfd, timeout_s=5)
    finally:
        os.close(pidfd)
    assert not os.path.exists(ctr.dirs[0])


def test_pod_cgroup_process_and_conmon_identities(make_cgroups: CgroupsFactory) -> None:
    """A process in the pod cgroup itself has no container; one in CRI-O's conmon cgroup is not attributed."""
    kc = make_cgroups("systemd", 2)
    pod = kc.pod(qos="burstable")
    ctr = pod.container(runtime="crio")
    conmon = pod.conmon(ctr.container_id)
    in_pod = pod.spawn(["sleep", "60"])
    in_conmon = conmon.spawn(["sleep", "60"])
    attributor = ProcIdentifier()

    pod_found = attributor.identify(in_pod.pid)
    conmon_found = attributor.identify(in_conmon.pid)
    assert pod_found is not None
    assert pod_found[1] == CgroupIdentity(pod.uid, None, None, "burstable") == pod.identity
    assert conmon_found is not None
    assert conmon_found[1] is None


def test_explicit_uid_and_container_id_are_used(make_cgroups: CgroupsFactory) -> None:
    """Given a UID and container ID (say, from a pod in a test apiserver) the helper builds exactly that path."""
    kc = make_cgroups("systemd", 2)
    uid = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"
    pod = kc.pod(uid=uid, qos="guaranteed")
    ctr = pod.container(container_id="ab" * 32, runtime="containerd")
    assert pod.path == pod_cgroup_path("systemd", "guaranteed", uid)
    assert ctr.path.endswith(f"/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-{'ab' * 32}.scope")
    assert kc.pod(uid=uid, qos="guaranteed") is pod
    with pytest.raises(ValueError, match="already exists"):
        kc.pod(uid=uid, qos="besteffort")


def test_move_puts_a_running_process_in(make_cgroups: CgroupsFactory) -> None:
    """move() places an already running process in the container, where identify() then finds it."""
    kc = make_cgroups("cgroupfs", 2)
    ctr = kc.pod().container()
    other = kc.pod().container()
    proc = other.spawn(["sleep", "60"])
    ctr.move(proc.pid)
    found = ProcIdentifier().identify(proc.pid)
    assert found is not None
    assert found[1] == ctr.identity
    assert other.pids() == []


def test_spawn_of_a_missing_command_fails_like_popen(make_cgroups: CgroupsFactory) -> None:
    """A command that does not exist raises FileNotFoundError instead of a shell's exit status 127."""
    kc = make_cgroups("systemd", 2)
    ctr = kc.pod().container()
    with pytest.raises(FileNotFoundError):
        ctr.spawn(["/nonexistent/vramguard-no-such-command"])
    assert ctr.pids() == []


def test_stale_test_cgroups_are_swept() -> None:
    """remove_stale_test_cgroups removes empty test-pod cgroups a crashed run left, and nothing else."""
    need_cgroups(2)
    kc = KubeletCgroups("systemd", 2)
    try:
        pod = kc.pod()
        ctr = pod.container()
        neighbour = kc.pod()
        assert pod.uid.startswith(TEST_UID_PREFIX)
        # Simulate the crash: the helper never got to close. The sweep is narrowed to this pod's UID so a
        # concurrent run's pods are never touched; a young pod survives the default age limit.
        assert remove_stale_test_cgroups(uid_prefix=pod.uid) == []
        assert os.path.isdir(ctr.dirs[0])
        assert remove_stale_test_cgroups(uid_prefix=pod.uid, min_age_s=0) == []
        assert not os.path.exists(ctr.dirs[0])
        assert not os.path.exists(pod.dirs[0])
        assert os.path.isdir(neighbour.dirs[0])
    finally:
        kc.close()


def test_shared_parent_is_removed_by_the_last_run_to_finish() -> None:
    """A test-made kubepods parent outlives the run that made it while another run uses it, then goes."""
    need_cgroups(2)
    first = KubeletCgroups("cgroupfs", 2, kind=True)
    second = KubeletCgroups("cgroupfs", 2, kind=True)
    try:
        first_pod = first.pod(qos="besteffort")
        second_pod = second.pod(qos="besteffort")
        qos_dir = os.path.dirname(first_pod.dirs[0])
        assert qos_dir == os.path.dirname(second_pod.dirs[0])
        first.close()
        assert os.path.isdir(second_pod.dirs[0])
    finally:
        first.close()
        second.close()
    # Gone, unless a concurrent run is using it right now (then it still has a pod in it).
    assert not os.path.exists(qos_dir) or any(e.is_dir() for e in os.scandir(qos_dir))


def test_unmarked_parent_is_never_removed_by_a_run_that_did_not_create_it() -> None:
    """A kubepods parent without the test mark (as a real kubelet's would be) survives every run that used it."""
    need_cgroups(1)
    maker = KubeletCgroups("cgroupfs", 1, kind=True, v1_hierarchies=("pids",))
    user = KubeletCgroups("cgroupfs", 1, kind=True, v1_hierarchies=("pids",))
    qos_dir = ""
    try:
        qos_dir = os.path.dirname(maker.pod(qos="burstable").dirs[0])
        user_pod = user.pod(qos="burstable")
        with contextlib.suppress(OSError):  # it may predate this test, made by a concurrent run
            os.removexattr(qos_dir, "trusted.vramguard-test")
        maker.close()  # the maker may remove what it made, but cannot: the user's pod is inside
        user.close()
        assert not os.path.exists(user_pod.dirs[0])
        assert os.path.isdir(qos_dir)
    finally:
        maker.close()
        user.close()
        # Remove the unmarked directory and the (marked) parents it kept busy, unless someone uses them.
        for d in (qos_dir, os.path.dirname(qos_dir), os.path.dirname(os.path.dirname(qos_dir))) if qos_dir else ():
            with contextlib.suppress(OSError):
                os.rmdir(d)


ROOTLESS = "/user.slice/user-64957.slice/user@64957.service"  # a rootless kubelet's tree, in a user's service
KIND = KubeletTree(root=("kubelet",))


@pytest.mark.parametrize(
    ("driver", "version", "kind", "under", "kubelet"),
    [
        pytest.param("systemd", 2, False, ROOTLESS, HOST_KUBELET, id="v2-rootless-user-slice-systemd"),
        pytest.param("cgroupfs", 2, False, ROOTLESS, HOST_KUBELET, id="v2-rootless-user-slice-cgroupfs"),
        pytest.param("cgroupfs", 2, False, f"/docker/{'5e' * 32}", HOST_KUBELET, id="v2-nested-node-docker-kubepods"),
        pytest.param("systemd", 2, True, f"/docker/{'5e' * 32}", KIND, id="v2-kind-tree-nested-in-docker"),
        pytest.param("cgroupfs", 1, False, ROOTLESS, HOST_KUBELET, id="v1-rootless-user-slice-cgroupfs"),
        pytest.param("systemd", 2, True, "", HOST_KUBELET, id="v2-kind-tree-to-a-kubelet-rooted-at-slash"),
        pytest.param("cgroupfs", 2, False, "", KIND, id="v2-host-tree-to-kinds-kubelet"),
    ],
)
def test_a_look_alike_naming_a_live_pod_is_outside_the_kubelet(
    make_cgroups: CgroupsFactory, driver: str, version: int, kind: bool, under: str, kubelet: KubeletTree
) -> None:
    """A real process in a pod-shaped cgroup outside this kubelet's tree, naming a live pod's UID and container ID,
    is a look-alike: no pod's, whatever it names; the live pod's own process is still the pod's."""
    live = make_cgroups(driver, version, kind=kubelet is KIND).pod(qos="burstable")
    ctr = live.container()
    own = ctr.spawn(["sleep", "60"])
    forged = make_cgroups(driver, version, kind=kind, under=under).pod(uid=live.uid, qos="burstable")
    impostor = forged.container(container_id=ctr.container_id).spawn(["sleep", "60"])
    identifier = ProcIdentifier(kubelet=kubelet)

    found = identifier.scan([impostor.pid, own.pid])

    assert found[impostor.pid][1] is LOOK_ALIKE
    assert found[own.pid][1] == ctr.identity


# An agent's identify stage in a process of its own: paths placed as `vramguard run` places them (the kubelet's root
# from argv[1], the namespace found at start), each PID's identity (pod UID, container ID), "look-alike" or null.
IDENTIFY_CHILD = """
import json, os, sys
from vramguard.core.process import CgroupIdentity
from vramguard.node.cgroup import KubeletTree, find_namespace, kubelet_root
from vramguard.node.identify import ProcIdentifier
tree = KubeletTree(kubelet_root(sys.argv[1]), find_namespace("/proc", "/sys/fs/cgroup", os.getpid()))
found = ProcIdentifier(kubelet=tree).scan(int(p) for p in sys.argv[2:])
def show(c):
    return [c.pod_uid, c.container_id] if isinstance(c, CgroupIdentity) else None if c is None else c.value
own = open("/proc/self/cgroup").read()
print(json.dumps({"own": own, "found": {str(p): show(c) for p, (_, c) in found.items()}}))
"""


def _identify_in_namespace(agent_ctr: ContainerCgroup, kubelet_root: str, pids: list[int]) -> dict[str, Any]:
    """What an agent in `agent_ctr`, in a cgroup namespace of its own (`unshare --cgroup`), finds for `pids`."""
    argv = ["unshare", "--cgroup", sys.executable, "-c", IDENTIFY_CHILD, kubelet_root, *map(str, pids)]
    proc = agent_ctr.spawn(argv, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    return dict(json.loads(out))


@pytest.mark.parametrize(
    ("driver", "kind"),
    [
        pytest.param("cgroupfs", False, id="cgroupfs-kubelet-at-slash"),
        pytest.param("systemd", False, id="systemd-kubelet-at-slash"),
        pytest.param("systemd", True, id="kind-systemd-kubelet-at-kubelet"),
    ],
)
def test_an_agent_in_its_own_cgroup_namespace_places_paths_from_its_root(
    make_cgroups: CgroupsFactory, driver: str, kind: bool
) -> None:
    """An agent in a pod with a private cgroup namespace reads other processes' paths as /../..: it finds where its
    namespace is rooted, so pods of its own QoS and of another are the kubelet's, and a look-alike under a user
    slice naming one of them is not."""
    kc = make_cgroups(driver, 2, kind=kind)
    agent_ctr = kc.pod(qos="besteffort").container()
    sibling_pod, other_pod = kc.pod(qos="besteffort"), kc.pod(qos="burstable")  # the first shares the agent's QoS
    sibling, other = sibling_pod.container(), other_pod.container()
    forged = make_cgroups(driver, 2, under=ROOTLESS).pod(uid=other_pod.uid, qos="burstable")
    procs = {
        "sibling": sibling.spawn(["sleep", "60"]),
        "other": other.spawn(["sleep", "60"]),
        "impostor": forged.container(container_id=other.container_id).spawn(["sleep", "60"]),
    }

    seen = _identify_in_namespace(agent_ctr, "/kubelet" if kind else "/", [p.pid for p in procs.values()])

    assert seen["own"].splitlines()[-1] == "0::/", "the agent reads its own cgroup as its namespace's root"
    assert {name: seen["found"][str(p.pid)] for name, p in procs.items()} == {
        "sibling": [sibling_pod.uid, sibling.container_id],
        "other": [other_pod.uid, other.container_id],
        "impostor": "look-alike",
    }


def spawn_with_pid(pid: int, argv: list[str], attempts: int = 50) -> subprocess.Popen[Any] | None:
    """A process that gets exactly `pid`: the kernel's cursor is set to pid - 1 right before forking (root)."""
    for _ in range(attempts):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        popen = subprocess.Popen(argv)
        if popen.pid == pid:
            return popen
        popen.kill()
        popen.wait()
    return None


def test_pid_reused_through_the_cursor_is_read_again(make_cgroups: CgroupsFactory) -> None:
    """A cached PID the kernel hands to a new process (forced with ns_last_pid) is re-read: new start, new cgroup.

    The warm scan before the reuse checks nothing through stat (the cursor rules every cached PID out); the one
    after it sees the PID inside the window the cursor moved through, and reads the newcomer.
    """
    kc = make_cgroups("systemd", 2)
    ctr = kc.pod().container()
    old = ctr.spawn(["sleep", "60"])
    pid = old.pid
    attributor = ProcIdentifier(audit_per_scan=0)
    assert attributor.uses_pid_cursor
    first = attributor.scan([pid])[pid]
    assert first[1] == ctr.identity
    assert attributor.scan([pid]) == {pid: first}
    assert attributor.stat_checks == 0, "a warm scan with the cursor reads no stat"

    old.kill()
    old.wait()
    newcomer = spawn_with_pid(pid, ["sleep", "60"])
    if newcomer is None:
        pytest.skip(f"could not get the kernel to hand out PID {pid} again (another process took it)")
    try:
        ref, identity = attributor.scan([pid])[pid]
        assert ref == ProcessRef(pid, (read_stat(pid) or ("?", -1))[1])
        assert ref.start_time != first[0].start_time or identity != first[1]
        assert identity is None  # the newcomer is a host process, in no pod
        assert attributor.misses == 2
    finally:
        newcomer.kill()
        newcomer.wait()
