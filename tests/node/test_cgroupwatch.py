"""The cgroup watcher on the real cgroup v2 tree: every pod and container cgroup the kubelet's layouts make is
reported once, including those made faster than a watch can be added, and a container's own sub-cgroups are
not entered."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cgroup_fixtures import CgroupsFactory, need_cgroups
from fd_fixtures import open_fds
from vramguard.base.clock import SYSTEM_CLOCK
from vramguard.core.process import CgroupIdentity
from vramguard.node.cgroup import HOST_KUBELET, KubeletTree, v2_root
from vramguard.node.cgroupwatch import CgroupWatcher, InotifyUnavailable
from vramguard_testbed.cgroups import KubeletCgroups
from vramguard_testbed.waiting import wait_until

pytestmark = pytest.mark.cgroups


class Seen:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, CgroupIdentity]] = []
        self.fresh: dict[str, bool] = {}

    def __call__(self, path: str, identity: CgroupIdentity, fresh: bool) -> None:
        with self.lock:
            self.calls.append((path, identity))
            self.fresh[path] = fresh

    def of(self, uid: str) -> list[tuple[str, str | None]]:
        with self.lock:
            return [(p, i.container_id) for p, i in self.calls if i.pod_uid == uid]


@contextlib.contextmanager
def watching(kubelet: KubeletTree = HOST_KUBELET) -> Iterator[Seen]:
    """What a watcher of the real v2 tree reports, for the kubelet whose --cgroup-root `kubelet` names."""
    need_cgroups(2)
    root = v2_root("/sys/fs/cgroup")
    assert root is not None
    seen = Seen()
    watcher = CgroupWatcher(root, seen, kubelet=kubelet)
    watcher.start()
    assert watcher.walked.wait(10), "the walk of the cgroups there at start"
    yield seen
    watcher.stop(SYSTEM_CLOCK.now() + 2.0)
    assert not watcher.running


@pytest.fixture
def watched() -> Iterator[Seen]:
    with watching() as seen:
        yield seen


@pytest.mark.parametrize(
    ("driver", "kind"),
    [
        pytest.param("cgroupfs", False, id="cgroupfs"),
        pytest.param("systemd", False, id="systemd"),
        pytest.param("systemd", True, id="kind-systemd"),
    ],
)
def test_new_pod_and_container_cgroups_are_reported_once(make_cgroups: CgroupsFactory, driver: str, kind: bool) -> None:
    """Each pod and container cgroup the kubelet makes below its root is reported once, fresh."""
    with watching(KubeletTree(root=("kubelet",)) if kind else HOST_KUBELET) as watched:
        cgroups: KubeletCgroups = make_cgroups(driver=driver, version=2, kind=kind)
        pod = cgroups.pod(qos="burstable")
        first, second = pod.container(), pod.container()  # made at once: the second may precede the pod's watch
        expected = [(pod.dirs[0], None), (first.dirs[0], first.container_id), (second.dirs[0], second.container_id)]
        wait_until(lambda: len(watched.of(pod.uid)) >= 3, what="the pod and both containers reported")
        assert sorted(watched.of(pod.uid), key=str) == sorted(expected, key=str)
        assert all(watched.fresh[p] for p, _ in expected), "created while watched"


def test_look_alikes_outside_the_kubelets_tree_are_never_reported(watched: Seen, make_cgroups: CgroupsFactory) -> None:
    """Pod-shaped cgroups under a user slice or kind's root, made for a kubelet rooted at /, are never reported: a
    pod of the kubelet's made after them is, and they were not."""
    forged = [
        make_cgroups("systemd", 2, under="/user.slice/user-64957.slice/user@64957.service").pod().container(),
        make_cgroups("cgroupfs", 2, kind=True).pod().container(),
    ]
    later = make_cgroups("cgroupfs", 2).pod(qos="besteffort")  # an event after theirs: theirs would have come first
    wait_until(lambda: len(watched.of(later.uid)) >= 1, what="the kubelet's pod reported")
    assert [watched.of(c.pod.uid) for c in forged if c.pod is not None] == [[], []]


def test_cgroups_there_before_the_start_are_reported_not_fresh(make_cgroups: CgroupsFactory) -> None:
    need_cgroups(2)
    cgroups: KubeletCgroups = make_cgroups(driver="cgroupfs", version=2)
    pod = cgroups.pod(qos="burstable")
    ctr = pod.container()
    root = v2_root("/sys/fs/cgroup")
    assert root is not None
    seen = Seen()
    watcher = CgroupWatcher(root, seen)
    watcher.start()
    try:
        wait_until(lambda: len(seen.of(pod.uid)) >= 2, what="the existing pod and container reported")
        assert seen.fresh[pod.dirs[0]] is False and seen.fresh[ctr.dirs[0]] is False
    finally:
        watcher.stop(SYSTEM_CLOCK.now() + 2.0)
        assert not watcher.running


def test_a_containers_sub_cgroups_are_not_entered(watched: Seen, make_cgroups: CgroupsFactory) -> None:
    cgroups: KubeletCgroups = make_cgroups(driver="cgroupfs", version=2)
    pod = cgroups.pod(qos="besteffort")
    ctr = pod.container()
    wait_until(lambda: len(watched.of(pod.uid)) >= 2, what="the pod and its container reported")
    inner = os.path.join(ctr.dirs[0], "inner")
    os.mkdir(inner)
    try:
        later = pod.container()  # an event after the sub-cgroup's: proves the sub-cgroup's would have come
        wait_until(lambda: len(watched.of(pod.uid)) >= 3, what="the later container reported")
        assert [p for p, _ in watched.of(pod.uid)] == [pod.dirs[0], ctr.dirs[0], later.dirs[0]]
    finally:
        os.rmdir(inner)


def test_no_inotify_on_a_missing_root_says_why(tmp_path: object) -> None:
    watcher = CgroupWatcher(f"{tmp_path}/absent", lambda p, i, f: None)
    with pytest.raises(InotifyUnavailable, match=r"cannot watch .*absent"):
        watcher.start()
    assert not watcher.running
    watcher.stop(SYSTEM_CLOCK.now())  # stopping one that never started is harmless


def test_the_inotify_and_wake_fds_are_closed_once_stopped(tmp_path: Path) -> None:
    """`start()` opens the inotify fd and the wake pipe; the thread closes them on its way out, within the stop.

    The watcher's own fds are checked by what they point at, not the process's fds counted: a thread left by
    another test may open or close one meanwhile, and a closed number may be reused by it.
    """
    watcher = CgroupWatcher(str(tmp_path), lambda p, i, f: None)
    watcher.start()
    assert watcher._inotify is not None
    fds = [watcher._inotify.fd, watcher._wake_r, watcher._wake_w]
    opened = {fd: open_fds().get(fd) for fd in fds}
    assert opened[fds[0]] == "anon_inode:inotify", opened
    assert str(opened[fds[1]]).startswith("pipe:") and opened[fds[1]] == opened[fds[2]], opened  # one pipe
    watcher.stop(SYSTEM_CLOCK.now() + 2.0)
    assert not watcher.running
    after = open_fds()
    assert {fd: after[fd] for fd in fds if after.get(fd) == opened[fd]} == {}
