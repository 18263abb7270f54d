"""Which fds a piece of code left open, told apart from those another test's thread opens meanwhile.

Counting `/proc/self/fd` is racy in a suite where earlier tests leave threads winding down (an HTTP server's
socket, a watcher's wake pipe, an inotify fd): CI once saw a fourth fd appear between two listings. A check asks
instead which fds are open now that were not before, pointing at the same thing, and leaves out the kinds the
code under these tests never opens.
"""

from __future__ import annotations

import os

# What only the suite's other threads open: the code these checks guard opens pidfds, files and directories.
FOREIGN = ("pipe:", "socket:", "anon_inode:inotify", "anon_inode:[eventpoll]", "anon_inode:[eventfd]")


def open_fds() -> dict[int, str]:
    """This process's open fds and what each points at, read from /proc."""
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except FileNotFoundError:  # the listing's own directory fd, or one closed since
            continue
    return fds


def opened_since(before: dict[int, str]) -> dict[int, str]:
    """The fds open now that were not open before (or pointed elsewhere), less those of the foreign kinds."""
    return {
        fd: target for fd, target in open_fds().items() if before.get(fd) != target and not target.startswith(FOREIGN)
    }
