"""Small readers for /proc, with the proc root as a parameter so tests and `--proc-root /host/proc` both work."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass


def parse_start_time(stat_text: str) -> int:
    """Field 22 of /proc/<pid>/stat: the start time in clock ticks since boot.

    The command name (field 2) may contain spaces and parentheses, so split after the *last* ')'.
    """
    rest = stat_text[stat_text.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state); field 22 is therefore rest[19].
    return int(rest[19])


def read_start_time(pid: int, proc_root: str = "/proc") -> int | None:
    """The start time of `pid`, or None when the process is gone or unreadable."""
    try:
        with open(os.path.join(proc_root, str(pid), "stat")) as f:
            return parse_start_time(f.read())
    except (OSError, ValueError, IndexError):
        return None


def read_cgroup_text(pid: int, proc_root: str = "/proc") -> str | None:
    try:
        with open(os.path.join(proc_root, str(pid), "cgroup")) as f:
            return f.read()
    except OSError:
        return None


def list_pids(proc_root: str = "/proc") -> list[int]:
    try:
        return [int(name) for name in os.listdir(proc_root) if name.isdigit()]
    except OSError:
        return []


def holds_nvidia_device(pid: int, proc_root: str = "/proc", device_prefix: str = "/dev/nvidia") -> bool:
    """True when the process has an open file descriptor on /dev/nvidia* (it can hold GPU memory).

    `device_prefix` lets tests on machines without a GPU stand a temporary file in for the device.
    """
    fd_dir = os.path.join(proc_root, str(pid), "fd")
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return False
    for name in names:
        try:
            target = os.readlink(os.path.join(fd_dir, name))
        except OSError:
            continue
        if target.startswith(device_prefix):
            return True
    return False


def read_stat_start_token(stat_path: str) -> bytes | None:
    """Field 22 (start time) of the stat file at `stat_path`, unparsed; None when the process is gone.

    The warm path of attribution calls this once per GPU process per scan, so it avoids the text layer and
    int(): comparing the raw token with the cached one is enough to tell the same process from a new one.
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
    # The command name may contain spaces and ")"; fields 3.. start two bytes after the last ")".
    end = data.rfind(b")")
    if end < 0:
        return None
    fields = data[end + 2 :].split(None, 20)
    return fields[19] if len(fields) > 19 else None


def read_state_and_start_time(pid: int, proc_root: str = "/proc") -> tuple[str, int] | None:
    """(state letter, start time) from /proc/<pid>/stat; "Z" is a zombie. None when gone or unreadable."""
    try:
        with open(os.path.join(proc_root, str(pid), "stat"), "rb") as f:
            data = f.read()
        rest = data[data.rindex(b")") + 2 :].split()
        return rest[0].decode("ascii", "replace"), int(rest[19])
    except (OSError, ValueError, IndexError):
        return None


def read_cgroup_text_tolerant(pid: int, proc_root: str = "/proc") -> str | None:
    """Like read_cgroup_text, but cgroup names with bytes that are not UTF-8 never raise."""
    try:
        with open(os.path.join(proc_root, str(pid), "cgroup"), "rb") as f:
            return f.read().decode("utf-8", "surrogateescape")
    except OSError:
        return None


# ----------------------------------------------------------------------------------------------------------
# Readers that tell "gone" from "cannot read"
#
# The readers above answer None both when the process is gone and when its file could not be read. That is fine
# for observing, and wrong for the killer: an EMFILE (the agent out of fds) or an EACCES says nothing about the
# process, and reading it as "gone" once made a kill report "nothing to kill" while the offender lived on. The
# readers below return None only for ENOENT/ESRCH (the process is gone) and raise OSError for everything else.

_GONE_ERRNOS = frozenset({errno.ENOENT, errno.ESRCH})


def is_gone_error(error: OSError) -> bool:
    """True when `error` means the process (or its /proc entry) no longer exists."""
    return error.errno in _GONE_ERRNOS


def read_stat_strict(pid: int, proc_root: str = "/proc") -> tuple[str, int] | None:
    """(state letter, start time) of `pid`; None when the process is gone.

    Raises OSError when the file cannot be read for another reason (EMFILE, EACCES, ...), and for contents that
    do not parse (errno EIO): neither says anything about the process.
    """
    try:
        fd = os.open(f"{proc_root}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        if is_gone_error(e):
            return None
        raise
    try:
        data = os.read(fd, 4096)
    except OSError as e:
        if is_gone_error(e):
            return None
        raise
    finally:
        os.close(fd)
    if not data:
        return None  # the task was released between open and read
    try:
        rest = data[data.rindex(b")") + 2 :].split()
        return rest[0].decode("ascii", "replace"), int(rest[19])
    except (ValueError, IndexError):
        raise OSError(errno.EIO, f"unparsable {proc_root}/{pid}/stat") from None


def read_cgroup_strict(pid: int, proc_root: str = "/proc") -> str | None:
    """The text of /proc/<pid>/cgroup (undecodable bytes escaped); None when the process is gone; else raises."""
    try:
        with open(f"{proc_root}/{pid}/cgroup", "rb") as f:
            return f.read().decode("utf-8", "surrogateescape")
    except OSError as e:
        if is_gone_error(e):
            return None
        raise


def holds_device_strict(pid: int, proc_root: str = "/proc", device_prefix: str = "/dev/nvidia") -> bool | None:
    """Whether `pid` has a file descriptor open on a path starting with `device_prefix`; None when it is gone.

    Raises OSError when its fd directory cannot be listed for another reason (EMFILE, EACCES without
    CAP_SYS_PTRACE, ...). An fd closed while it is being looked at is skipped. Holds at most one fd (the
    directory listing) while it runs.
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


def list_pids_strict(proc_root: str = "/proc") -> list[int]:
    """Every PID listed in `proc_root`; raises OSError when the directory cannot be listed (an empty list would
    say "no processes", which is never true of a real /proc)."""
    return [int(name) for name in os.listdir(proc_root) if name.isdigit()]


# ----------------------------------------------------------------------------------------------------------
# The kernel's PID allocation cursor (see attribute.ProcessAttributor)


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
