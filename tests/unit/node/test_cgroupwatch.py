"""What the cgroup watcher makes of inotify's events, over a kubelet-shaped tree of plain directories and a fake
inotify: which directories are reported and entered, and how lost events and exhausted watches are handled.

The watcher over real cgroups and the kernel's inotify, on its own thread: tests/node/test_cgroupwatch.py."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from vramguard.core.process import CgroupIdentity
from vramguard.node.cgroupwatch import (
    _IN_CREATE,
    _IN_DELETE,
    _IN_IGNORED,
    _IN_ISDIR,
    _IN_MOVED_TO,
    _IN_Q_OVERFLOW,
    CgroupWatcher,
)

UID = "0f9b6c2e-3b0a-4c1d-9e8f-7a6b5c4d3e2f"
CID = "a" * 64
POD = f"kubepods/burstable/pod{UID}"
CONTAINER = f"{POD}/{CID}"


class FakeInotify:
    """inotify's watches as a dict: `add` hands out the next watch descriptor, or fails with `error` (ENOSPC: the
    kernel's max_user_watches)."""

    def __init__(self) -> None:
        self.fd = -1
        self.watched: dict[int, str] = {}
        self.error: OSError | None = None

    def add(self, path: str) -> int:
        if self.error is not None:
            raise self.error
        wd = len(self.watched) + 1
        self.watched[wd] = path
        return wd

    def close(self) -> None:
        pass


class Watched:
    """A watcher over `root` (never started: its events are handed to it here) and what it reported."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.seen: list[tuple[str, CgroupIdentity, bool]] = []
        self.watcher = CgroupWatcher(str(root), lambda path, ident, fresh: self.seen.append((path, ident, fresh)))
        self.inotify = FakeInotify()
        self.watcher._inotify = self.inotify  # type: ignore[assignment]
        self.watcher._watches[self.inotify.add(str(root))] = str(root)

    def wd(self, relative: str) -> int:
        path = os.path.join(self.root, relative) if relative else str(self.root)
        return next(wd for wd, p in self.inotify.watched.items() if p == path)

    def made(self, relative: str, mask: int = _IN_CREATE) -> None:
        """mkdir under the watched directory, and the event inotify sends for it."""
        (self.root / relative).mkdir(parents=True, exist_ok=True)
        parent, name = os.path.split(relative)
        self.watcher._event(self.wd(parent), mask | _IN_ISDIR, name)

    def reported(self) -> list[tuple[str, str | None, bool]]:
        return [(os.path.relpath(p, self.root), i.container_id, fresh) for p, i, fresh in self.seen]


@pytest.fixture
def watched(tmp_path: Path) -> Watched:
    return Watched(tmp_path)


def test_a_new_pod_and_its_container_are_reported_fresh(watched: Watched) -> None:
    """The kubelet's levels are entered, a pod is reported and entered, a container reported and not entered."""
    watched.made("kubepods")
    watched.made("kubepods/burstable")
    watched.made(POD)
    watched.made(CONTAINER)
    assert watched.reported() == [(POD, None, True), (CONTAINER, CID, True)]
    assert sorted(os.path.relpath(p, watched.root) for p in watched.inotify.watched.values()) == sorted(
        [".", "kubepods", "kubepods/burstable", POD]
    )


def test_a_tree_made_before_its_watch_is_found_by_the_scan(watched: Watched) -> None:
    """Directories made between mkdir and the watch on it are not missed: each new watch scans what is below."""
    (watched.root / CONTAINER).mkdir(parents=True)
    watched.watcher._event(watched.wd(""), _IN_CREATE | _IN_ISDIR, "kubepods")
    assert watched.reported() == [(POD, None, True), (CONTAINER, CID, True)]


def test_a_rename_into_the_tree_counts_as_made(watched: Watched) -> None:
    """IN_MOVED_TO is a directory appearing as much as IN_CREATE is."""
    watched.made("kubepods")
    watched.made("kubepods/burstable")
    watched.made(POD, mask=_IN_MOVED_TO)
    assert watched.reported() == [(POD, None, True)]


def test_other_directories_and_files_are_passed_over(watched: Watched) -> None:
    """Only the kubelet's levels are entered: a pod-named directory under system.slice, and a file, report nothing
    and watch nothing."""
    (watched.root / "system.slice" / f"pod{UID}").mkdir(parents=True)
    watched.watcher._event(watched.wd(""), _IN_CREATE | _IN_ISDIR, "system.slice")
    (watched.root / "cgroup.procs").touch()
    watched.watcher._event(watched.wd(""), _IN_CREATE, "cgroup.procs")
    assert watched.reported() == []
    assert list(watched.inotify.watched.values()) == [str(watched.root)]


def test_each_directory_is_reported_once_until_it_is_deleted(watched: Watched) -> None:
    """A second event for one directory reports nothing; once deleted, one made under its name is new."""
    watched.made("kubepods")
    watched.made("kubepods/burstable")
    watched.made(POD)
    watched.made(POD)
    (watched.root / POD).rmdir()
    watched.watcher._event(watched.wd("kubepods/burstable"), _IN_DELETE | _IN_ISDIR, f"pod{UID}")
    watched.made(POD)
    assert watched.reported() == [(POD, None, True), (POD, None, True)]


def test_a_watch_the_kernel_dropped_is_forgotten(watched: Watched) -> None:
    """IN_IGNORED: the directory went, and its watch with it; its events are no one's any more."""
    watched.made("kubepods")
    wd = watched.wd("kubepods")
    watched.watcher._event(wd, _IN_IGNORED, "")
    assert wd not in watched.watcher._watches
    watched.watcher._event(wd, _IN_CREATE | _IN_ISDIR, "burstable")
    assert watched.reported() == []


def test_lost_events_rescan_everything_watched(watched: Watched) -> None:
    """On a queue overflow the watched directories are walked again: what was made meanwhile is reported (not
    fresh: it may have run for a while), what was reported before is not reported twice."""
    watched.made("kubepods")
    watched.made("kubepods/burstable")
    watched.made(POD)
    (watched.root / CONTAINER).mkdir()
    with capture_logs() as logs:
        watched.watcher._event(-1, _IN_Q_OVERFLOW, "")
    assert watched.reported() == [(POD, None, True), (CONTAINER, CID, False)]
    assert [entry["event"] for entry in logs] == ["cgroup_watch_overflow"]


def test_an_exhausted_inotify_is_said_once_and_the_reconcile_covers(watched: Watched) -> None:
    """ENOSPC on a new watch: the pod is still reported, `exhausted` says why (for /readyz), logged once."""
    watched.made("kubepods")
    watched.made("kubepods/burstable")
    watched.inotify.error = OSError(errno.ENOSPC, "No space left on device")
    with capture_logs() as logs:
        watched.made(POD)
        watched.made(f"kubepods/burstable/pod{UID[:-1]}0")
    assert [r[0] for r in watched.reported()] == [POD, f"kubepods/burstable/pod{UID[:-1]}0"]
    assert watched.watcher.exhausted is not None and "max_user_watches" in watched.watcher.exhausted
    assert [entry["event"] for entry in logs] == ["cgroup_watch_limit"]
