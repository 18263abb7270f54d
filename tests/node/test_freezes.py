"""The freeze journal over real cgroups: what an agent killed mid-kill left frozen is thawed by the next one, and
nothing else is, whatever a writer of the state directory forges."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cgroup_fixtures import CgroupsFactory
from vramguard.node.cgroup import v2_root
from vramguard.node.freezer import freeze_state, is_frozen
from vramguard.node.freezes import FreezeJournal, Junk
from vramguard_testbed.cgroups import ContainerCgroup, new_container_id, new_pod_uid


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
    mount = v2_root("/sys/fs/cgroup") if v2 else "/sys/fs/cgroup/freezer"
    removed = f"{mount}/kubepods/burstable/pod{new_pod_uid()}/{new_container_id()}"
    gone = _entry_of(journal, removed, v2, dead_pid + 1, 1)  # not a live start time

    done = journal.thaw_abandoned().outcomes

    assert sorted((e.cgroup, what) for e, what in done) == sorted([(left_dir, "thawed"), (removed, "gone")])
    assert not is_frozen(left_dir, v2)
    assert is_frozen(foreign_dir, v2) and is_frozen(live_dir, v2)
    assert [e.cgroup for e in journal.entries()] == [live_dir]
    assert not Path(gone).exists()
    for directory in (foreign_dir, live_dir):  # let the cleanup kill them
        Path(directory, "cgroup.freeze" if v2 else "freezer.state").write_text("0" if v2 else "THAWED")
    assert freeze_state(left_dir, v2) in (b"0", b"THAWED")
    assert left.pids() and foreign.pids() and live.pids()


@pytest.fixture
def host_cgroup(make_cgroups: CgroupsFactory, request: pytest.FixtureRequest) -> Iterator[tuple[str, bool]]:
    """A frozen cgroup outside the kubelet's (a host service's, say) with a sleeping process; (directory, v2).
    Thawed, emptied and removed afterwards."""
    version = request.param
    make_cgroups("cgroupfs", version, v1_hierarchies=("freezer",))  # skips where such cgroups cannot be made
    v2 = version == 2
    mount = v2_root("/sys/fs/cgroup") if v2 else "/sys/fs/cgroup/freezer"
    assert mount is not None
    directory = f"{mount}/vramguard-test-host-{secrets.token_hex(4)}"
    os.mkdir(directory)
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        Path(directory, "cgroup.procs").write_text(str(sleeper.pid))
        _freeze(directory, v2)
        yield directory, v2
    finally:
        Path(directory, "cgroup.freeze" if v2 else "freezer.state").write_text("0" if v2 else "THAWED")
        sleeper.kill()
        sleeper.wait()
        os.rmdir(directory)


@pytest.mark.cgroups
@pytest.mark.parametrize("host_cgroup", [pytest.param(2, id="v2"), pytest.param(1, id="v1-freezer")], indirect=True)
@pytest.mark.parametrize(
    ("form", "kind"),
    [
        pytest.param("plain", Junk.NOT_A_CONTAINER, id="host-cgroup-by-its-path"),
        pytest.param("dot-dot", Junk.OUTSIDE, id="climbing-out-of-kubepods"),
    ],
)
def test_a_forged_entry_outside_the_kubelet_cgroups_is_refused(
    make_cgroups: CgroupsFactory, tmp_path: Path, host_cgroup: tuple[str, bool], form: str, kind: Junk
) -> None:
    """An entry naming a frozen host cgroup outside kubepods (by its path, or climbing out of kubepods with `..`)
    is removed and reported, and that cgroup stays frozen; a genuine abandoned freeze beside it is still thawed."""
    directory, v2 = host_cgroup
    journal = FreezeJournal(str(tmp_path / "freezes"))
    _, genuine = _container(make_cgroups, 2 if v2 else 1)
    _freeze(genuine, v2)
    dead_pid, dead_start = _dead_pid()
    _entry_of(journal, genuine, v2, dead_pid, dead_start)
    mount, name = os.path.split(directory)
    named = directory if form == "plain" else f"{mount}/kubepods/../{name}"
    forged = Path(journal.directory, "forged")
    forged.write_text(json.dumps({"cgroup": named, "v2": v2, "pid": dead_pid, "start_time": dead_start}))

    recovery = journal.thaw_abandoned()

    assert [(e.cgroup, what) for e, what in recovery.outcomes] == [(genuine, "thawed")]
    assert dict(recovery.junk.counts) == {kind.value: 1}
    assert not forged.exists()
    assert is_frozen(directory, v2), "a host cgroup is never thawed on the journal's word"
    assert not is_frozen(genuine, v2)
