"""Small readers for /proc, with the proc root as a parameter so tests and `--proc-root /host/proc` both work."""

from __future__ import annotations

import os


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
