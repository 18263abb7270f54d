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


def holds_nvidia_device(pid: int, proc_root: str = "/proc") -> bool:
    """True when the process has an open file descriptor on /dev/nvidia* (it can hold GPU memory)."""
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
        if target.startswith("/dev/nvidia"):
            return True
    return False
