"""The freeze journal: which containers this agent froze for a kill, so that none is ever left frozen.

One file per frozen cgroup in `<state dir>/freezes/`, written before the freeze and removed after the thaw; at
start the agent thaws what an agent that is gone left frozen (docs/design.md "The freeze journal").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass

from vramguard.procfs import read_small, read_stat

_MAX_ENTRY_BYTES = 4096  # an entry is a cgroup path and three numbers; anything longer is not ours


@dataclass(frozen=True, slots=True)
class Frozen:
    """One journal entry: a cgroup frozen by the agent process (pid, start time)."""

    path: str  # the entry's file
    cgroup: str  # the cgroup directory, as the agent saw it
    v2: bool  # cgroup.freeze, else v1's freezer.state
    pid: int
    start_time: int


def _own_start_time() -> int:
    state = read_stat(os.getpid())
    assert state is not None, "the agent's own /proc/<pid>/stat is always there"
    return state[1]


def freeze_state(cgroup: str, v2: bool) -> bytes:
    """What the kernel says of the cgroup's freeze: b"1"/b"0" (v2) or b"FROZEN"/b"FREEZING"/b"THAWED" (v1)."""
    return read_small(f"{cgroup}/{'cgroup.freeze' if v2 else 'freezer.state'}").strip()


def is_frozen(cgroup: str, v2: bool) -> bool:
    return freeze_state(cgroup, v2) in (b"1", b"FROZEN", b"FREEZING")


def thaw(cgroup: str, v2: bool) -> None:
    name, value = ("cgroup.freeze", b"0") if v2 else ("freezer.state", b"THAWED")
    fd = os.open(f"{cgroup}/{name}", os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value)
    finally:
        os.close(fd)


class FreezeJournal:
    """Entries under `directory` (created on first use). `record` raises OSError when the disk says no."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._pid = os.getpid()
        self._start_time = _own_start_time()

    def record(self, cgroup: str, v2: bool) -> str:
        """Write down that this agent is about to freeze `cgroup`; the entry's path (for `forget`)."""
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        name = f"{hashlib.sha256(cgroup.encode()).hexdigest()[:20]}-{self._pid}"
        path = os.path.join(self.directory, name)
        tmp = f"{path}.tmp"
        data = json.dumps({"cgroup": cgroup, "v2": v2, "pid": self._pid, "start_time": self._start_time})
        with open(tmp, "w") as f:
            f.write(data)
        os.replace(tmp, path)  # an entry is whole or absent
        return path

    def forget(self, path: str) -> None:
        """The cgroup is thawed: remove its entry. Never raises: an entry left behind names a thawed cgroup, which
        the next start finds not frozen and forgets."""
        with contextlib.suppress(OSError):
            os.unlink(path)

    def entries(self) -> list[Frozen]:
        """Every readable entry; a malformed one (not ours, or cut short) is removed."""
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            if name.endswith(".tmp"):
                continue  # written before a freeze that never happened (or is about to, by a live agent)
            path = os.path.join(self.directory, name)
            try:
                with open(path, "rb") as f:
                    data = f.read(_MAX_ENTRY_BYTES + 1)
                if len(data) > _MAX_ENTRY_BYTES:
                    raise ValueError("too long to be an entry")
                raw = json.loads(data)
                entry = Frozen(path, str(raw["cgroup"]), bool(raw["v2"]), int(raw["pid"]), int(raw["start_time"]))
            except FileNotFoundError:
                continue
            except (OSError, ValueError, KeyError, TypeError):
                self.forget(path)
                continue
            found.append(entry)
        return found

    def abandoned(self) -> list[Frozen]:
        """Entries whose agent is gone: nobody will thaw those cgroups but a new agent."""
        gone = []
        for entry in self.entries():
            try:
                state = read_stat(entry.pid)
            except OSError:
                continue  # cannot tell: leave it to the next start
            if state is None or state[1] != entry.start_time:
                gone.append(entry)
        return gone

    def thaw_abandoned(self) -> list[tuple[Frozen, str]]:
        """Thaw every cgroup an agent that is gone left frozen, and forget its entry: (entry, what happened) for
        each, where what happened is "thawed", "not frozen", "gone" (the cgroup was removed) or an error."""
        done = []
        for entry in self.abandoned():
            try:
                if is_frozen(entry.cgroup, entry.v2):
                    thaw(entry.cgroup, entry.v2)
                    outcome = "thawed"
                else:
                    outcome = "not frozen"
            except FileNotFoundError:
                outcome = "gone"
            except OSError as e:
                done.append((entry, f"cannot thaw: {e.strerror or e}"))
                continue  # kept: the next start tries again
            self.forget(entry.path)
            done.append((entry, outcome))
        return done
