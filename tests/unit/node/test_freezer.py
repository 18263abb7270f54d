"""The freezer over fake cgroups: a freeze is written down before it is made and thawed after; someone else's freeze
is never touched, nor a cgroup holding the agent; the freeze file is opened only when it is a regular file.

A fake cgroup is a directory with a regular `cgroup.freeze` (v2) or `freezer.state` (v1) file. Unlike cgroupfs, such
a file keeps every write through one fd in order, so its text after a freeze and a thaw reads "10" (v2) or
"FROZENTHAWED" (v1). Real cgroups: tests/node/test_kill_real.py and test_freezes_real.py.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from vramguard.node import freezer
from vramguard.node.cgroup import ContainerCgroup, read_members
from vramguard.node.freezer import Control, Freezer, freeze_state, is_frozen
from vramguard.node.procfs import FdRetry
from vramguard_testbed.fakes import FakeClock

DEADLINE = 1e9  # far ahead: the tests that wait say how long


def fake_cgroup(tmp_path: Path, v2: bool = True, frozen: bool = False, procs: tuple[int, ...] = (4242,)) -> str:
    """A cgroup directory whose freeze file says `frozen`, whose cgroup.events says what a freeze would make the
    kernel say, and whose cgroup.procs lists `procs`."""
    directory = tmp_path / "cgroup"
    directory.mkdir()
    if v2:
        (directory / "cgroup.freeze").write_text("1" if frozen else "0")
        (directory / "cgroup.events").write_text("populated 1\nfrozen 1\n")
    else:
        (directory / "freezer.state").write_text("FROZEN" if frozen else "THAWED")
    (directory / "cgroup.procs").write_text("".join(f"{p}\n" for p in procs))
    return str(directory)


def control_text(cgroup: str, v2: bool = True) -> str:
    return Path(cgroup, "cgroup.freeze" if v2 else "freezer.state").read_text()


class Journal:
    """Records what the freezer writes down, and what its control file said at that moment; `refuse` makes
    `record` raise it."""

    def __init__(self, refuse: Exception | None = None) -> None:
        self.refuse = refuse
        self.recorded: list[tuple[str, bool, str]] = []
        self.forgotten: list[str] = []

    def record(self, cgroup: str, v2: bool) -> str:
        if self.refuse is not None:
            raise self.refuse
        self.recorded.append((cgroup, v2, control_text(cgroup, v2)))
        return f"entry-{len(self.recorded)}"

    def forget(self, entry: str) -> None:
        self.forgotten.append(entry)


def no_retry() -> FdRetry:
    return FdRetry(FakeClock(), 0.0)


@pytest.mark.parametrize(
    ("v2", "frozen_text", "thawed_text"),
    [pytest.param(True, "1", "10", id="v2"), pytest.param(False, "FROZEN", "FROZENTHAWED", id="v1-freezer")],
)
def test_a_freeze_is_written_down_first_and_thawed_after(
    tmp_path: Path, v2: bool, frozen_text: str, thawed_text: str
) -> None:
    """The journal has the entry while the cgroup is still thawed; inside the block it is frozen; after it, it is
    thawed and its entry forgotten."""
    cgroup = fake_cgroup(tmp_path, v2)
    journal = Journal()
    with Freezer(journal, self_pid=1).frozen(cgroup, v2, DEADLINE, no_retry()) as froze:
        assert froze
        assert journal.recorded == [(cgroup, v2, "0" if v2 else "THAWED")], "no record, no freeze"
        assert control_text(cgroup, v2) == frozen_text
    assert control_text(cgroup, v2) == thawed_text
    assert journal.forgotten == ["entry-1"]


@pytest.mark.parametrize(
    ("v2", "state"),
    [pytest.param(True, "1", id="v2-frozen"), pytest.param(False, "FREEZING", id="v1-freezing")],
)
def test_someone_elses_freeze_is_never_undone(tmp_path: Path, v2: bool, state: str) -> None:
    """A cgroup frozen (or freezing) already is neither recorded nor written to: the thaw is its freezer's."""
    cgroup = fake_cgroup(tmp_path, v2)
    Path(cgroup, "cgroup.freeze" if v2 else "freezer.state").write_text(state)
    journal = Journal()
    with Freezer(journal, self_pid=1).frozen(cgroup, v2, DEADLINE, no_retry()) as froze:
        assert not froze
    assert control_text(cgroup, v2) == state
    assert journal.recorded == [] and journal.forgotten == []


@pytest.mark.parametrize(
    "refusal",
    [
        pytest.param(ValueError("not a container's cgroup"), id="journal-would-not-honour-it"),
        pytest.param(OSError(errno.EROFS, "read-only"), id="journal-cannot-write"),
    ],
)
def test_no_record_no_freeze(tmp_path: Path, refusal: Exception) -> None:
    """Where the journal does not write the freeze down, the cgroup is not frozen."""
    cgroup = fake_cgroup(tmp_path)
    with Freezer(Journal(refuse=refusal), self_pid=1).frozen(cgroup, True, DEADLINE, no_retry()) as froze:
        assert not froze
    assert control_text(cgroup) == "0"


def test_without_a_journal_nothing_is_frozen(tmp_path: Path) -> None:
    """A freezer without a journal lists the container's processes and freezes nothing."""
    cgroup = fake_cgroup(tmp_path, procs=(10, 11))
    with Freezer(None, self_pid=1).members(ContainerCgroup("c", cgroup, True), DEADLINE, no_retry()) as members:
        assert members == [10, 11]
    assert control_text(cgroup) == "0"


@pytest.mark.parametrize("who", [pytest.param("self", id="the-agent"), pytest.param("self_pid", id="its-stand-in")])
def test_a_cgroup_holding_the_agent_is_never_frozen(tmp_path: Path, who: str) -> None:
    """The agent (or the PID that stands for it) is never frozen with its victims: the list is taken unfrozen."""
    agent = os.getpid() if who == "self" else 777
    cgroup = fake_cgroup(tmp_path, procs=(10, agent))
    journal = Journal()
    container = ContainerCgroup("c", cgroup, True)
    with Freezer(journal, self_pid=777).members(container, DEADLINE, no_retry()) as members:
        assert members == [10, agent]
    assert control_text(cgroup) == "0" and journal.recorded == []


def test_members_are_listed_while_frozen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The processes are read again once the freeze is made, and the cgroup is thawed when the block ends."""
    cgroup = fake_cgroup(tmp_path, procs=(10,))
    seen: list[str] = []
    real_read = read_members

    def listing(directory: str) -> list[int]:
        seen.append(control_text(directory))
        return real_read(directory)

    monkeypatch.setattr(freezer, "read_members", listing)
    with Freezer(Journal(), self_pid=1).members(ContainerCgroup("c", cgroup, True), DEADLINE, no_retry()) as pids:
        assert pids == [10]
    assert seen == ["0", "1"], "once to look for the agent, once frozen"
    assert control_text(cgroup) == "10"


def test_the_wait_for_the_kernel_is_bounded(tmp_path: Path) -> None:
    """A cgroup the kernel never reports frozen (a task in uninterruptible sleep) is waited for `timeout_s`, no
    longer, and the block runs all the same; the wait never runs past the deadline given."""
    cgroup = fake_cgroup(tmp_path)
    Path(cgroup, "cgroup.events").write_text("populated 1\nfrozen 0\n")
    for timeout_s, deadline, waited in [(0.05, DEADLINE, 0.05), (1.0, 1000.02, 0.02)]:
        clock = FakeClock(start=1000.0)
        Path(cgroup, "cgroup.freeze").write_text("0")
        with Freezer(Journal(), self_pid=1, clock=clock, timeout_s=timeout_s).frozen(
            cgroup, True, deadline, no_retry()
        ) as froze:
            assert froze
            assert clock.now() - 1000.0 == pytest.approx(waited, abs=0.011)
            assert clock.now() >= 1000.0 + waited


def test_a_failed_thaw_raises_and_keeps_the_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A container left frozen must not go unnoticed: the thaw's error is raised, and the journal keeps the entry
    for the next start to thaw."""
    cgroup = fake_cgroup(tmp_path)
    journal = Journal()

    def fails(self: Control) -> bool:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(Control, "thaw", fails)
    frozen = Freezer(journal, self_pid=1).frozen(cgroup, True, DEADLINE, no_retry())
    with pytest.raises(RuntimeError, match=re.escape(f"could not thaw {cgroup}/cgroup.freeze: I/O error")), frozen:
        pass
    assert journal.recorded and journal.forgotten == []


def test_out_of_fds_the_open_is_tried_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every open goes through the kill's `FdRetry`: an EMFILE is waited out within its budget."""
    cgroup = fake_cgroup(tmp_path)
    failures = [OSError(errno.EMFILE, "Too many open files")]
    real_open = freezer.open_control

    def short_of_fds(cgroup: str, v2: bool, flags: int) -> int:
        if failures:
            raise failures.pop()
        return real_open(cgroup, v2, flags)

    monkeypatch.setattr(freezer, "open_control", short_of_fds)
    clock = FakeClock()
    with Freezer(Journal(), self_pid=1).frozen(cgroup, True, DEADLINE, FdRetry(clock, 0.5)) as froze:
        assert froze
    assert clock.waits == [0.001]


def _symlink(path: Path) -> None:
    target = path.parent / "elsewhere"
    target.write_text("0")
    path.symlink_to(target)


@pytest.mark.parametrize(
    "plant",
    [
        pytest.param(_symlink, id="symlink"),
        pytest.param(lambda path: path.mkdir(), id="directory"),
        pytest.param(lambda path: os.mkfifo(path), id="fifo"),
    ],
)
def test_a_freeze_file_that_is_not_a_regular_file_is_refused(tmp_path: Path, plant: Callable[[Path], None]) -> None:
    """What stands where cgroup.freeze should be is never read or written when it is not a regular file (a FIFO is
    opened without blocking, and refused)."""
    directory = tmp_path / "cgroup"
    directory.mkdir()
    plant(directory / "cgroup.freeze")
    with pytest.raises(OSError):
        freeze_state(str(directory), True)
    with pytest.raises(OSError):
        Control(str(directory), True)
    if (tmp_path / "elsewhere").exists():
        assert (tmp_path / "elsewhere").read_text() == "0"


def test_what_reads_as_frozen(tmp_path: Path) -> None:
    """v2's 1 and v1's FROZEN and FREEZING are frozen (someone asked for it), read with the newline stripped."""
    cgroup = fake_cgroup(tmp_path)
    assert freeze_state(cgroup, True) == b"0" and not is_frozen(cgroup, True)
    for text, frozen in [("1\n", True), ("0\n", False)]:
        Path(cgroup, "cgroup.freeze").write_text(text)
        assert is_frozen(cgroup, True) is frozen
    for text, frozen in [("FREEZING\n", True), ("FROZEN\n", True), ("THAWED\n", False)]:
        Path(cgroup, "freezer.state").write_text(text)
        assert is_frozen(cgroup, False) is frozen
