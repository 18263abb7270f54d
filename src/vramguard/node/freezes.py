"""The freeze journal: which containers this agent froze for a kill, so that none is ever left frozen.

One file per frozen cgroup in `<state dir>/freezes/`, written before the freeze and removed after the thaw; at
start (`freeze_journal`) the agent thaws, through `freezer`, what an agent that is gone left frozen. The directory
is a hostPath others may write: an entry is honoured only when it names a container's cgroup the killer could have
frozen, nothing in it is opened that could block, and what is refused is reported once (docs/architecture.md "The
freeze journal").
"""

from __future__ import annotations

import contextlib
import enum
import errno
import hashlib
import itertools
import json
import os
import re
import stat
from collections import Counter
from dataclasses import dataclass, field

import structlog

from vramguard.core.text import cut
from vramguard.node.cgroup import HOST_KUBELET, KubeletTree, container_segments, v2_root
from vramguard.node.freezer import Control, is_frozen
from vramguard.node.procfs import read_stat

_MAX_ENTRY_BYTES = 4096  # an entry is a cgroup path and three numbers; anything longer is not ours
# Names looked at per start: an agent restarted on a journal filled with junk starts in bounded time, and the next
# start looks at what is left (an agent's own entries are a handful: one per container frozen at once).
MAX_EXAMINED = 1024
_MAX_COUNTED = 100_000  # names beyond the examined ones that are counted for the report, no more
_MAX_EXAMPLES = 3
_EXAMPLE_CHARS = 200
_TMP_NAME = re.compile(r"[0-9a-f]{20}-([0-9]{1,7})\.tmp")  # what `record` writes before the entry is whole

# Never blocks on a FIFO or a device, never follows a planted symlink, never leaks into a child.
_SAFE_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class Junk(enum.Enum):
    """Why something in the journal's directory is not an entry to honour (the log counts each kind)."""

    NOT_A_FILE = "not a regular file"  # a FIFO, a directory, a symlink, a socket, a device
    TOO_BIG = "too big"
    MALFORMED = "malformed"
    OUTSIDE = "outside the cgroup root"
    NOT_A_CONTAINER = "not a container's cgroup"  # the root, a pod's cgroup, a sub-cgroup, a foreign directory
    UNFINISHED = "unfinished write"  # the temporary file of an agent that is gone


class _Refused(Exception):
    def __init__(self, kind: Junk) -> None:
        super().__init__(kind.value)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Frozen:
    """One journal entry: a cgroup frozen by the agent process (pid, start time)."""

    path: str  # the entry's file
    cgroup: str  # the cgroup directory, resolved below the hierarchy's mount
    v2: bool  # cgroup.freeze, else v1's freezer.state
    pid: int
    start_time: int


@dataclass(slots=True)
class JunkReport:
    """What one look at the journal's directory refused: counts per kind, a few examples, what it left unread."""

    counts: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    kept: int = 0  # refused but not removable (a directory with something in it, a read-only disk)
    not_examined: int = 0  # names past `MAX_EXAMINED`: the next start looks at them
    not_examined_counted_all: bool = True  # False when there were more than `_MAX_COUNTED` of them

    def add(self, kind: Junk, name: str, detail: str = "") -> None:
        self.counts[kind.value] += 1
        if len(self.examples) < _MAX_EXAMPLES:
            self.examples.append(cut(f"{name}: {kind.value}{f' ({detail})' if detail else ''}", _EXAMPLE_CHARS))

    def __bool__(self) -> bool:
        return bool(self.counts) or self.not_examined > 0

    def log_fields(self) -> dict[str, object]:
        """The report as the fields of one log line."""
        return {
            "refused": sum(self.counts.values()),
            "by_kind": dict(sorted(self.counts.items())),
            "examples": list(self.examples),
            "kept": self.kept,
            "not_examined": self.not_examined if self.not_examined_counted_all else f">{self.not_examined}",
        }


@dataclass(frozen=True, slots=True)
class Recovery:
    """What a start did with the journal: (entry, what happened) for each abandoned entry, and the junk refused."""

    outcomes: tuple[tuple[Frozen, str], ...]
    junk: JunkReport


def _own_start_time() -> int:
    state = read_stat(os.getpid())
    assert state is not None, "the agent's own /proc/<pid>/stat is always there"
    return state[1]


def _is_container_leaf(relative: str, kubelet: KubeletTree) -> bool:
    """Whether `relative` (below a hierarchy's mount: "/kubepods/burstable/pod<uid>/<id>") is a directory the
    killer freezes: a container's own cgroup in the kubelet's tree (`cgroup.kubelet_cgroup`), not the root, a pod,
    a sub-cgroup, or anything outside the kubelet's tree."""
    segments = relative.split("/")
    if segments[0] != "":
        return False
    return container_segments(segments[1:], kubelet.root) == tuple(segments[1:])


class FreezeJournal:
    """Entries under `directory` (created on first use), for containers' cgroups of the kubelet (`kubelet`) below
    `cgroup_root` (the killer's: the v2 hierarchy there, or v1's freezer). `record` raises OSError when the disk
    says no, ValueError for a cgroup the journal would not honour: either way the killer does not freeze."""

    def __init__(
        self, directory: str, cgroup_root: str = "/sys/fs/cgroup", kubelet: KubeletTree = HOST_KUBELET
    ) -> None:
        self.directory = directory
        self.cgroup_root = cgroup_root.rstrip("/") or "/"
        self.kubelet = kubelet
        self._pid = os.getpid()
        self._start_time = _own_start_time()

    def ensure(self) -> None:
        """Create the directory if missing and check it is one: OSError saying why it cannot be used."""
        os.close(self._open_directory(create=True))

    def record(self, cgroup: str, v2: bool) -> str:
        """Write down that this agent is about to freeze `cgroup`; the entry's path (for `forget`)."""
        try:
            self._resolve(cgroup, v2)
        except _Refused as e:
            raise ValueError(f"{cgroup}: {e.kind.value}, never frozen") from None
        name = f"{hashlib.sha256(cgroup.encode()).hexdigest()[:20]}-{self._pid}"
        tmp = f"{name}.tmp"
        data = json.dumps({"cgroup": cgroup, "v2": v2, "pid": self._pid, "start_time": self._start_time}).encode()
        dfd = self._open_directory(create=True)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dfd)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)  # an entry is whole or absent
        finally:
            os.close(dfd)
        return os.path.join(self.directory, name)

    def forget(self, path: str) -> None:
        """The cgroup is thawed: remove its entry. Never raises: an entry left behind names a thawed cgroup, which
        the next start finds not frozen and forgets."""
        with contextlib.suppress(OSError):
            dfd = self._open_directory(create=False)
            try:
                os.unlink(os.path.basename(path), dir_fd=dfd)
            finally:
                os.close(dfd)

    def entries(self) -> list[Frozen]:
        """Every entry honoured; junk is removed (`scan` says what it was)."""
        return self.scan()[0]

    def scan(self) -> tuple[list[Frozen], JunkReport]:
        """The entries honoured, and what was refused (removed where that is safe). At most `MAX_EXAMINED` names
        are looked at; OSError when the directory cannot be used (a symlink, a FIFO, unreadable)."""
        junk = JunkReport()
        try:
            dfd = self._open_directory(create=False)
        except FileNotFoundError:
            return [], junk
        found: list[Frozen] = []
        try:
            with os.scandir(dfd) as names:
                for examined, item in enumerate(names):
                    if examined >= MAX_EXAMINED:
                        junk.not_examined = 1 + sum(1 for _ in itertools.islice(names, _MAX_COUNTED - 1))
                        junk.not_examined_counted_all = next(names, None) is None
                        break
                    entry = self._examine(dfd, item.name, junk)
                    if entry is not None:
                        found.append(entry)
        finally:
            os.close(dfd)
        return found, junk

    def abandoned(self) -> list[Frozen]:
        """Entries whose agent is gone: nobody will thaw those cgroups but a new agent."""
        return _abandoned(self.entries())

    def thaw_abandoned(self) -> Recovery:
        """Thaw every cgroup an agent that is gone left frozen, and forget its entry. Each outcome is "thawed",
        "not frozen", "gone" (the cgroup was removed) or an error (the entry is kept: the next start tries again)."""
        entries, junk = self.scan()
        done = []
        for entry in _abandoned(entries):
            try:
                if is_frozen(entry.cgroup, entry.v2):
                    with Control(entry.cgroup, entry.v2) as control:
                        outcome = "thawed" if control.thaw() else "gone"
                else:
                    outcome = "not frozen"
            except FileNotFoundError:
                outcome = "gone"
            except OSError as e:
                done.append((entry, f"cannot thaw: {e.strerror or e}"))
                continue
            self.forget(entry.path)
            done.append((entry, outcome))
        return Recovery(tuple(done), junk)

    # ------------------------------------------------------------------------------------------------------

    def _open_directory(self, create: bool) -> int:
        if create:
            os.makedirs(os.path.dirname(self.directory) or ".", exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.directory, 0o700)
        try:
            return os.open(self.directory, _DIRECTORY)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                # Someone put a symlink or another file where the journal goes: never follow it.
                raise OSError(e.errno, "not a directory (a symlink or another file): refused", self.directory) from e
            raise

    def _examine(self, dfd: int, name: str, junk: JunkReport) -> Frozen | None:
        """The entry `name` if it is one to honour; else it is counted in `junk` and removed where safe."""
        try:
            info = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return None  # forgotten meanwhile
        except OSError as e:
            junk.add(Junk.NOT_A_FILE, name, e.strerror or "")
            junk.kept += 1
            return None
        if name.endswith(".tmp") and stat.S_ISREG(info.st_mode):
            if _writer_alive(name):
                return None  # an agent writing it now (its freeze follows)
            self._discard(dfd, name, info, Junk.UNFINISHED, junk)
            return None
        if not stat.S_ISREG(info.st_mode):
            self._discard(dfd, name, info, Junk.NOT_A_FILE, junk)
            return None
        if info.st_size > _MAX_ENTRY_BYTES:
            self._discard(dfd, name, info, Junk.TOO_BIG, junk, f"{info.st_size} bytes")
            return None
        try:
            fd = os.open(name, _SAFE_READ, dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError:  # swapped for a symlink since the look (ELOOP), or unreadable
            self._discard(dfd, name, info, Junk.NOT_A_FILE, junk)
            return None
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode):  # swapped for a FIFO since the look: opened, never read
                self._discard(dfd, name, opened, Junk.NOT_A_FILE, junk)
                return None
            data = os.read(fd, _MAX_ENTRY_BYTES + 1)
        finally:
            os.close(fd)
        if len(data) > _MAX_ENTRY_BYTES:
            self._discard(dfd, name, opened, Junk.TOO_BIG, junk)
            return None
        try:
            raw = json.loads(data)
            cgroup, v2, pid, start_time = raw["cgroup"], raw["v2"], raw["pid"], raw["start_time"]
            if not (isinstance(cgroup, str) and isinstance(v2, bool) and _count(pid) and _count(start_time)):
                raise ValueError("wrong types")
        except (ValueError, KeyError, TypeError):
            self._discard(dfd, name, opened, Junk.MALFORMED, junk)
            return None
        try:
            resolved = self._resolve(cgroup, v2)
        except _Refused as e:
            self._discard(dfd, name, opened, e.kind, junk, cgroup)
            return None
        return Frozen(os.path.join(self.directory, name), resolved, v2, pid, start_time)

    def _discard(
        self, dfd: int, name: str, info: os.stat_result, kind: Junk, junk: JunkReport, detail: str = ""
    ) -> None:
        """Count `name` as junk and remove it: unlink never follows a symlink, rmdir only takes an empty
        directory; a directory with something in it stays (there is no safe way to empty what someone else made)."""
        junk.add(kind, name, detail)
        try:
            if stat.S_ISDIR(info.st_mode):
                os.rmdir(name, dir_fd=dfd)
            else:
                os.unlink(name, dir_fd=dfd)
        except FileNotFoundError:
            pass
        except OSError:
            junk.kept += 1

    def _resolve(self, cgroup: str, v2: bool) -> str:
        """The directory `cgroup` names, when it is a container's cgroup below the hierarchy the killer freezes
        in; `_Refused` otherwise. A cgroup that does not exist (any more) is not refused: it is "gone"."""
        mount = v2_root(self.cgroup_root) if v2 else f"{self.cgroup_root}/freezer"
        if mount is not None and cgroup.rstrip("/") == mount:
            raise _Refused(Junk.NOT_A_CONTAINER)  # the hierarchy's root is never frozen
        if mount is None or "\0" in cgroup or not cgroup.startswith(f"{mount}/"):
            raise _Refused(Junk.OUTSIDE)
        relative = cgroup[len(mount) :]
        if any(s in ("", ".", "..") for s in relative.split("/")[1:]):
            raise _Refused(Junk.OUTSIDE)  # the killer writes plain paths; these are crafted to climb out
        if not _is_container_leaf(relative, self.kubelet):
            raise _Refused(Junk.NOT_A_CONTAINER)
        try:
            real_mount = os.path.realpath(mount)
            resolved = os.path.realpath(cgroup)
        except (OSError, ValueError):
            raise _Refused(Junk.OUTSIDE) from None
        if resolved != f"{real_mount.rstrip('/')}{relative}":
            raise _Refused(Junk.OUTSIDE)  # a symlink on the way (cgroupfs has none)
        try:
            if os.stat(resolved).st_dev != os.stat(real_mount).st_dev:
                raise _Refused(Junk.OUTSIDE)  # another filesystem mounted inside the hierarchy
        except FileNotFoundError:
            pass  # removed since: "gone" when thawed
        except OSError:
            raise _Refused(Junk.OUTSIDE) from None
        return resolved


def freeze_journal(state_dir: str, cgroup_root: str, kubelet: KubeletTree = HOST_KUBELET) -> FreezeJournal | None:
    """The journal of this agent's freezes (`<state_dir>/freezes`), after thawing every container an earlier agent
    left frozen (killed mid-kill); None, and no freezing, where the state directory cannot be used. Junk in the
    journal's directory (it is a hostPath others may write) is refused and reported in one line."""
    log = structlog.get_logger(__name__)
    journal = FreezeJournal(f"{state_dir.rstrip('/')}/freezes", cgroup_root=cgroup_root, kubelet=kubelet)
    try:
        journal.ensure()
        recovery = journal.thaw_abandoned()
    except OSError as e:
        log.error(
            "freeze_journal_unavailable", directory=journal.directory, error=e.strerror or repr(e), freezing=False
        )
        return None
    if recovery.junk:
        log.warning("freeze_journal_junk", directory=journal.directory, **recovery.junk.log_fields())
    forgotten: dict[str, int] = {}
    for entry, outcome in recovery.outcomes:
        if outcome in ("not frozen", "gone"):
            forgotten[outcome] = forgotten.get(outcome, 0) + 1  # nothing changed on the node: no line each
            continue
        log.warning("abandoned_freeze", cgroup=entry.cgroup, frozen_by_pid=entry.pid, outcome=outcome)
    if forgotten:
        log.info("abandoned_freezes_forgotten", **{k.replace(" ", "_"): n for k, n in sorted(forgotten.items())})
    return journal


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _writer_alive(tmp_name: str) -> bool:
    """Whether the temporary file is named as `record` names it ("<hash>-<pid>.tmp") and that PID is running."""
    m = _TMP_NAME.fullmatch(tmp_name)
    pid = int(m.group(1)) if m is not None else 0
    if not 0 < pid < 1 << 22:  # 1 << 22: the kernel's highest pid_max
        return False
    try:
        return read_stat(pid) is not None
    except OSError:
        return True  # cannot tell: leave it


def _abandoned(entries: list[Frozen]) -> list[Frozen]:
    gone = []
    for entry in entries:
        try:
            state = read_stat(entry.pid)
        except OSError:
            continue  # cannot tell: leave it to the next start
        if state is None or state[1] != entry.start_time:
            gone.append(entry)
    return gone
