"""Freezing a container's cgroup, and thawing it: the one writer of v2's `cgroup.freeze` and v1's `freezer.state`.

The killer freezes a container while it lists its processes (`Freezer.members`, each freeze written down in the
journal first); a starting agent thaws what an agent that is gone left frozen (`FreezeJournal.thaw_abandoned`).
Both open the file one way (`open_control`): without blocking, following no symlink, leaking into no child, and only
when it is a regular file, as cgroupfs files are, since the journal that names the cgroup is a directory others
may write (`docs/architecture.md` "Finishing the job" and "What the journal trusts").
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Protocol

from vramguard.base.clock import SYSTEM_CLOCK, UNINTERRUPTED, Clock
from vramguard.node.cgroup import ContainerCgroup, read_members
from vramguard.node.procfs import FdRetry, read_small

_SAFE = os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
_THAW_TRIES = 3


def control_name(v2: bool) -> str:
    """The cgroup's freeze file: cgroup.freeze (v2), or freezer.state (v1's freezer hierarchy)."""
    return "cgroup.freeze" if v2 else "freezer.state"


def open_control(cgroup: str, v2: bool, flags: int) -> int:
    """The cgroup's freeze file, opened with `flags` without blocking or following a symlink; OSError unless it is
    a regular file."""
    fd = os.open(f"{cgroup}/{control_name(v2)}", flags | _SAFE)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{control_name(v2)} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def freeze_state(cgroup: str, v2: bool) -> bytes:
    """What the kernel says of the cgroup's freeze: b"1"/b"0" (v2) or b"FROZEN"/b"FREEZING"/b"THAWED" (v1)."""
    fd = open_control(cgroup, v2, os.O_RDONLY)
    try:
        return os.read(fd, 64).strip()
    finally:
        os.close(fd)


def is_frozen(cgroup: str, v2: bool) -> bool:
    """Whether someone asked for the cgroup to be frozen (v1's FREEZING included: the kernel is still at it)."""
    return freeze_state(cgroup, v2) in (b"1", b"FROZEN", b"FREEZING")


def reports_frozen(cgroup: str, v2: bool) -> bool:
    """Whether the kernel reports every task of the cgroup frozen: v2's cgroup.events says ``frozen 1``, v1's
    freezer.state FROZEN."""
    if v2:
        return b"frozen 1" in read_small(f"{cgroup}/cgroup.events")
    return freeze_state(cgroup, v2) == b"FROZEN"


class Control:
    """A cgroup's freeze file (`open_control`), opened for writing and held until closed, so that a thaw through
    it needs no new fd."""

    def __init__(self, cgroup: str, v2: bool) -> None:
        self.path = f"{cgroup}/{control_name(v2)}"
        self._v2 = v2
        self._fd = open_control(cgroup, v2, os.O_WRONLY)

    def freeze(self) -> None:
        os.write(self._fd, b"1" if self._v2 else b"FROZEN")

    def thaw(self) -> bool:
        """Write the thawed state: True once written, False when the cgroup was removed meanwhile (nothing is left
        to thaw). A failed write is tried again, twice; OSError when every try failed."""
        for attempt in range(1, _THAW_TRIES + 1):
            try:
                os.write(self._fd, b"0" if self._v2 else b"THAWED")
                return True
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ENODEV):
                    return False
                if attempt == _THAW_TRIES:
                    raise
            SYSTEM_CLOCK.wait(UNINTERRUPTED, 0.01)  # a pause between writes, not a deadline: real time
        raise AssertionError("unreachable")

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> Control:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


class Journal(Protocol):
    """Where a freeze is written down before it is made, and forgotten after the thaw (`freezes.FreezeJournal`)."""

    def record(self, cgroup: str, v2: bool) -> str:
        """The entry written for `cgroup`; OSError or ValueError when it is not written (then nothing is frozen)."""
        ...

    def forget(self, entry: str) -> None:
        """The cgroup is thawed: remove its entry. Never raises."""
        ...


class Freezer:
    """Freezes a violating container's cgroup while the killer lists its processes, so that the list is complete:
    nothing in a frozen cgroup can fork. Each freeze is written down in `journal` first (without one, nothing is
    frozen); a cgroup that holds this process or `self_pid` is never frozen; the kernel is given at most
    `timeout_s` to report the cgroup frozen."""

    def __init__(
        self, journal: Journal | None, self_pid: int, clock: Clock = SYSTEM_CLOCK, timeout_s: float = 1.0
    ) -> None:
        self.journal = journal
        self.clock = clock
        self._self_pid = self_pid
        self._timeout_s = timeout_s

    @contextmanager
    def members(self, container: ContainerCgroup, deadline: float, io: FdRetry) -> Iterator[list[int] | None]:
        """The container's processes, its sub-cgroups' included (None if they cannot be listed), listed while it is
        frozen (`frozen`) where it may be, for the block; thawed after.

        A container that cannot be frozen (read-only cgroupfs, the agent inside, already frozen by someone else, no
        journal to record the freeze in) is listed all the same: the killer's rounds make up for a list that is
        not complete. `io` makes every call that opens a file.
        """
        try:
            before = io(read_members, container.directory)
        except OSError:
            before = None
        if before is None or {os.getpid(), self._self_pid} & set(before) or self.journal is None:
            yield before  # never freeze the agent (or what stands for it) with its victims, nor unrecorded
            return
        with self.frozen(container.directory, container.v2, deadline, io):
            try:
                members = io(read_members, container.directory)
            except OSError:
                members = None
            yield members

    @contextmanager
    def frozen(self, cgroup: str, v2: bool, deadline: float, io: FdRetry) -> Iterator[bool]:
        """Freeze `cgroup` for the block and thaw it after; yields whether this froze it. `io` makes every call that
        opens a file; the wait for the kernel never runs past `deadline`.

        Nothing is frozen (nor thawed) where the file cannot be opened, where the cgroup is frozen already or its
        state cannot be read (someone else's freeze is never undone), or where the journal does not write the freeze
        down. The file stays open from before the freeze to after the thaw, so that thawing cannot fail for want of
        an fd; a thaw that fails raises RuntimeError, and the journal's entry stays for the next start.
        """
        journal = self.journal
        try:
            control = io(Control, cgroup, v2) if journal is not None else None
        except OSError:
            control = None
        if journal is None or control is None:
            yield False
            return
        with control:
            try:
                already = io(is_frozen, cgroup, v2)
            except OSError:
                already = True  # unknown: do not touch what someone else may have frozen
            entry = None
            froze = False
            if not already:
                try:
                    entry = journal.record(cgroup, v2)  # no record, no freeze
                    control.freeze()
                    froze = True
                except (OSError, ValueError):
                    pass  # ValueError: a cgroup the next agent's journal would refuse to thaw is never frozen
            try:
                if froze:
                    self._wait_frozen(cgroup, v2, deadline, io)
                yield froze
            finally:
                if froze:
                    self._thaw(control)  # raises if it fails: the entry stays for the next start
                if entry is not None:
                    journal.forget(entry)

    def _wait_frozen(self, cgroup: str, v2: bool, deadline: float, io: FdRetry) -> bool:
        """Wait (at most `timeout_s`, never past `deadline`) until the kernel reports every task of the cgroup
        frozen. A task in uninterruptible sleep can hold that up: the list is then taken anyway."""
        deadline = min(self.clock.now() + self._timeout_s, deadline)
        delay = 0.0002
        while True:
            try:
                if io(reports_frozen, cgroup, v2):
                    return True
            except OSError:
                return False
            if self.clock.now() >= deadline:
                return False
            self.clock.wait(UNINTERRUPTED, delay)
            delay = min(delay * 2, 0.01)

    @staticmethod
    def _thaw(control: Control) -> None:
        """A container left frozen must not go unnoticed: a thaw that fails raises."""
        try:
            control.thaw()
        except OSError as e:
            raise RuntimeError(f"could not thaw {control.path}: {e.strerror}") from e
