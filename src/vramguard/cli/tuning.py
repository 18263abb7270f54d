"""The process's own limits, tuned at the agent's start."""

from __future__ import annotations

import resource

# Where the kernel's ceiling for open files (fs.nr_open) cannot be read: its default.
NR_OPEN_DEFAULT = 1 << 20


def open_file_target(soft: int, hard: int, nr_open: int | None) -> int | None:
    """The soft open-file limit to set for these limits, None to leave it: the hard one, or where that is unlimited
    (NOFILE cannot be), the kernel's ceiling `nr_open` (its default where unread)."""
    target = hard
    if target == resource.RLIM_INFINITY:
        target = nr_open if nr_open is not None else NR_OPEN_DEFAULT
    if soft == resource.RLIM_INFINITY or soft >= target:
        return None
    return target


def _nr_open() -> int | None:
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft open-file limit to the hard one, as far as the kernel allows; (before, after).

    Container runtimes often start processes with a soft limit of 1024 under a far higher hard one. The agent's
    fd use is bounded (no fd per GPU process, a capped number of HTTP connections), but headroom costs nothing
    and keeps a flood elsewhere from starving the kill path.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = open_file_target(soft, hard, _nr_open() if hard == resource.RLIM_INFINITY else None)
    if target is None:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft, soft
    return soft, target
