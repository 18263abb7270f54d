"""The freeze journal over real cgroups: what an agent killed mid-kill left frozen is thawed by the next one, and
nothing else is."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cgroup_fixtures import CgroupsFactory
from vramguard.freezes import FreezeJournal, freeze_state, is_frozen
from vramguard_testbed.cgroups import ContainerCgroup


@pytest.fixture
def make_cgroups() -> Iterator[CgroupsFactory]:
    with CgroupsFactory() as factory:
        yield factory


def _dead_pid() -> tuple[int, int]:
    """The PID and start time of a process that has exited (and been reaped)."""
    child = subprocess.Popen(["sh", "-c", "cut -d' ' -f22 /proc/$$/stat"], stdout=subprocess.PIPE, text=True)
    out, _ = child.communicate()
    return child.pid, int(out)


def _entry_of(journal: FreezeJournal, cgroup: str, v2: bool, pid: int, start_time: int) -> str:
    """An entry as another agent process (`pid`, `start_time`) wrote it."""
    os.makedirs(journal.directory, exist_ok=True)
    path = os.path.join(journal.directory, f"entry-{pid}")
    Path(path).write_text(json.dumps({"cgroup": cgroup, "v2": v2, "pid": pid, "start_time": start_time}))
    return path


def _freeze(directory: str, v2: bool) -> None:
    Path(directory, "cgroup.freeze" if v2 else "freezer.state").write_text("1" if v2 else "FROZEN")


def _container(make_cgroups: CgroupsFactory, version: int) -> tuple[ContainerCgroup, str]:
    """A container with a sleeping process, and its directory in the hierarchy that freezes it."""
    kwargs = {"v1_hierarchies": ("pids", "freezer")} if version == 1 else {}
    ctr = make_cgroups("cgroupfs", version, **kwargs).pod().container()
    ctr.spawn(["sleep", "600"])
    return ctr, next(d for d in ctr.dirs if version == 2 or "/freezer/" in d)


@pytest.mark.cgroups
@pytest.mark.parametrize("version", [2, 1], ids=["v2", "v1-freezer"])
def test_thaws_what_a_dead_agent_left_frozen_and_nothing_else(
    make_cgroups: CgroupsFactory, tmp_path: Path, version: int
) -> None:
    """A cgroup frozen by an agent that is gone is thawed and forgotten; one frozen by someone else (no entry),
    one frozen by a live agent, and one whose entry's agent is a different process with the same PID stay."""
    v2 = version == 2
    journal = FreezeJournal(str(tmp_path / "freezes"))
    (left, left_dir), (foreign, foreign_dir), (live, live_dir) = (_container(make_cgroups, version) for _ in range(3))
    for directory in (left_dir, foreign_dir, live_dir):
        _freeze(directory, v2)
    dead_pid, dead_start = _dead_pid()
    _entry_of(journal, left_dir, v2, dead_pid, dead_start)
    own_start = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    _entry_of(journal, live_dir, v2, os.getpid(), own_start)
    gone = _entry_of(journal, str(tmp_path / "removed-cgroup"), v2, dead_pid + 1, 1)  # not a live start time

    done = journal.thaw_abandoned()

    assert sorted((e.cgroup, what) for e, what in done) == sorted(
        [(left_dir, "thawed"), (str(tmp_path / "removed-cgroup"), "gone")]
    )
    assert not is_frozen(left_dir, v2)
    assert is_frozen(foreign_dir, v2) and is_frozen(live_dir, v2)
    assert [e.cgroup for e in journal.entries()] == [live_dir]
    assert not Path(gone).exists()
    for directory in (foreign_dir, live_dir):  # let the cleanup kill them
        Path(directory, "cgroup.freeze" if v2 else "freezer.state").write_text("0" if v2 else "THAWED")
    assert freeze_state(left_dir, v2) in (b"0", b"THAWED")
    assert left.pids() and foreign.pids() and live.pids()
