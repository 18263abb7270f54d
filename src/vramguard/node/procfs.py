"""Small readers for /proc, with the proc root as a parameter so tests and `--proc-root /host/proc` both work.

Each reader comes in one version that tells "gone" from "cannot read": it returns None only for ENOENT/ESRCH
(the process is gone) and raises OSError for everything else. An EMFILE (the agent out of fds) or an EACCES
says nothing about the process, and reading it as "gone" once made a kill report "nothing to kill" while the
offender lived on. Observers that may treat both alike catch OSError themselves. One parser reads
/proc/<pid>/stat for all of them: `parse_stat`.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from vramguard.base.clock import UNINTERRUPTED, Clock

_T = TypeVar("_T")

_GONE_ERRNOS = frozenset({errno.ENOENT, errno.ESRCH})
# Out of fds, the process's own (EMFILE) or the system's (ENFILE): an open may succeed once others close theirs.
FD_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})


def is_gone_error(error: OSError) -> bool:
    """True when `error` means the process (or its /proc entry) no longer exists."""
    return error.errno in _GONE_ERRNOS


class FdRetry:
    """Calls that open files, made again after a short pause while the process is out of fds (`FD_ERRNOS`), for
    at most `budget_s` of pauses in all the calls made through one `FdRetry` (one kill's)."""

    def __init__(self, clock: Clock, budget_s: float) -> None:
        self._clock = clock
        self.left_s = budget_s

    def __call__(self, fn: Callable[..., _T], /, *args: object) -> _T:
        """`fn(*args)`; on EMFILE/ENFILE it is called again while the budget lasts, then the OSError is raised."""
        delay = 0.001
        while True:
            try:
                return fn(*args)
            except OSError as e:
                if e.errno not in FD_ERRNOS or self.left_s <= 0:
                    raise
            pause = min(delay, self.left_s)
            self._clock.wait(UNINTERRUPTED, pause)
            self.left_s -= pause
            delay = min(delay * 2, 0.05)


# States of a process that has exited: a zombie ("Z") or one being torn down ("X", "x"). It holds no memory any
# more and must not be signalled.
EXITED_STATES = frozenset({"Z", "X", "x"})


def parse_stat(data: bytes) -> tuple[bytes, bytes] | None:
    """(state, start time) from the contents of /proc/<pid>/stat, both as the kernel wrote them; None when the
    contents do not parse (truncated, empty, a start time that is not a number).

    Field 2, the command name, may contain spaces and ")", so the fields are split after the *last* ")": field 3
    (the state letter, "Z" for a zombie) comes two bytes after it, and field 22 (the start time, clock ticks
    since boot) is the 20th from there. The start time stays bytes: comparing the raw token with a cached one
    is all the identifier's warm path needs.
    """
    end = data.rfind(b")")
    if end < 0:
        return None
    fields = data[end + 2 :].split(None, 20)
    if len(fields) < 20 or not fields[19].isdigit():
        return None
    return fields[0], fields[19]


def read_stat_start_token(stat_path: str) -> bytes | None:
    """Field 22 (start time) of the stat file at `stat_path`, unparsed; None when it cannot be read or parsed.

    The identifier's hot path: one open and one read, no text layer, no int().
    """
    try:
        fd = os.open(stat_path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    parsed = parse_stat(data)
    return parsed[1] if parsed is not None else None


def read_stat(pid: int, proc_root: str = "/proc") -> tuple[str, int] | None:
    """(state letter, start time) of `pid`; None when the process is gone.

    Raises OSError when the file cannot be read for another reason (EMFILE, EACCES, ...), and for contents that
    do not parse (errno EIO): neither says anything about the process.
    """
    data = read_head(f"{proc_root}/{pid}/stat", 4096)
    if not data:
        return None  # gone, or the task was released between open and read
    parsed = parse_stat(data)
    if parsed is None:
        raise OSError(errno.EIO, f"unparsable {proc_root}/{pid}/stat")
    return parsed[0].decode("ascii", "replace"), int(parsed[1])


def read_head(path: str, max_bytes: int) -> bytes | None:
    """At most `max_bytes` of the file at `path` (a /proc file of a process): never more, whatever the process
    put there; None when the process is gone; else raises OSError.

    For what a tenant controls (a command line may be megabytes): the read itself is bounded, not just what is kept.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        if is_gone_error(e):
            return None
        raise
    try:
        chunks: list[bytes] = []
        left = max_bytes
        while left > 0:  # cmdline comes a page at a time
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError as e:
        if is_gone_error(e):
            return None
        raise
    finally:
        os.close(fd)


def read_real_uid(pid: int, proc_root: str = "/proc") -> int | None:
    """The real user ID of `pid` (the "Uid:" line of its status, which comes before any line a tenant can make
    long); None when the process is gone; else raises OSError (EIO for contents that do not parse)."""
    data = read_head(f"{proc_root}/{pid}/status", 4096)
    if data is None:
        return None
    at = data.find(b"\nUid:")
    fields = data[at + 5 :].split(None, 1) if at >= 0 else []
    if not fields or not fields[0].isdigit():
        if not data:
            return None  # the task was released between open and read
        raise OSError(errno.EIO, f"no Uid line in {proc_root}/{pid}/status")
    return int(fields[0])


def read_cgroup(pid: int, proc_root: str = "/proc") -> str | None:
    """The text of /proc/<pid>/cgroup (undecodable bytes escaped); None when the process is gone; else raises."""
    try:
        with open(f"{proc_root}/{pid}/cgroup", "rb") as f:
            return f.read().decode("utf-8", "surrogateescape")
    except OSError as e:
        if is_gone_error(e):
            return None
        raise


def holds_device(
    pid: int, proc_root: str = "/proc", device_prefix: str | tuple[str, ...] = "/dev/nvidia"
) -> bool | None:
    """Whether `pid` has a file descriptor open on a path starting with `device_prefix` (one of them, for a tuple:
    NVIDIA's device files, the DRM nodes and /dev/kfd); None when it is gone.

    `device_prefix` lets tests on machines without a GPU stand a temporary file in for the device. Raises
    OSError when its fd directory cannot be listed for another reason (EMFILE, EACCES without CAP_SYS_PTRACE,
    ...). An fd closed while it is being looked at is skipped. Holds at most one fd (the directory listing).
    """
    fd_dir = f"{proc_root}/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError as e:
        if is_gone_error(e):
            return None
        raise
    for name in names:
        try:
            target = os.readlink(f"{fd_dir}/{name}")
        except OSError as e:
            if is_gone_error(e):
                continue
            raise
        if target.startswith(device_prefix):
            return True
    return False


def list_pids(proc_root: str = "/proc") -> list[int]:
    """Every PID listed in `proc_root`; raises OSError when the directory cannot be listed (an empty list would
    say "no processes", which is never true of a real /proc)."""
    return [int(name) for name in os.listdir(proc_root) if name.isdigit()]


# ----------------------------------------------------------------------------------------------------------
# The kernel's PID allocation cursor (see identify.ProcIdentifier)


@dataclass(frozen=True, slots=True)
class PidCursor:
    """One reading of the kernel's PID allocation state, as seen from the reader's PID namespace."""

    last_pid: int  # the last PID handed out in the reader's namespace (/proc/loadavg, field 5)
    forks: int  # processes and threads created since boot, all namespaces (/proc/stat "processes")
    pid_max: int  # /proc/sys/kernel/pid_max: PIDs are handed out cyclically below it
    tasks: int  # tasks (threads, zombies included) that exist now (/proc/loadavg, field 4 after the "/")


def read_pid_cursor(proc_root: str = "/proc") -> PidCursor | None:
    """Read the cursor; None when any of the three files cannot be read or parsed.

    /proc/loadavg is read first: the fork count read after it can only be larger than the one that goes with
    the PID it names, and a larger fork count only makes the caller more careful.
    """
    try:
        loadavg = read_small(f"{proc_root}/loadavg").split()
        _running, tasks = loadavg[3].split(b"/")
        last_pid = int(loadavg[4])
        forks = _read_forks(f"{proc_root}/stat")
        pid_max = int(read_small(f"{proc_root}/sys/kernel/pid_max"))
        return PidCursor(last_pid=last_pid, forks=forks, pid_max=pid_max, tasks=int(tasks))
    except (OSError, ValueError, IndexError):
        return None


def boot_ticks() -> int:
    """Now, in the unit of /proc/<pid>/stat's start time: clock ticks since boot (CLOCK_BOOTTIME)."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // _NS_PER_TICK


_NS_PER_TICK = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def read_small(path: str) -> bytes:
    """A small /proc or cgroupfs file in one read (the kernel fills the buffer with the whole file)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def _read_forks(path: str) -> int:
    """The "processes" line of /proc/stat, reading only as far as it (the file grows with CPUs and IRQs)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = b""
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise ValueError("no processes line")
            data += chunk
            at = data.find(b"\nprocesses ")
            if at >= 0:
                end = data.find(b"\n", at + 11)
                if end >= 0:
                    return int(data[at + 11 : end])
    finally:
        os.close(fd)


def same_pid_namespace(proc_root: str = "/proc") -> bool:
    """Whether `proc_root` numbers processes as this process's own namespace does (its "self" names us).

    pidfd_open, kill and /proc/loadavg speak the caller's namespace; a fake tree (tests) or a /proc of another
    namespace does not, and its PIDs must not be mixed with ours.
    """
    try:
        return os.readlink(os.path.join(proc_root, "self")) == str(os.getpid())
    except OSError:
        return False
