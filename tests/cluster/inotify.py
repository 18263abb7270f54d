"""The names that appear in a directory while a test watches it (inotify, through libc), for what happens too fast
to poll: a freeze journal entry lives for the few milliseconds a kill holds a container frozen.

    with DirectoryWatch(Path("/var/lib/vramguard/freezes")) as watch:
        ...                       # something writes a file there and removes it again
        assert "entry" in watch.names()
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from pathlib import Path
from types import TracebackType

IN_CREATE = 0x100
IN_MOVED_TO = 0x80
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (the name follows)


class DirectoryWatch:
    """Records every name created in, or moved into, `directory` from `__enter__` on."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self._fd = -1
        self._seen: list[str] = []

    def __enter__(self) -> DirectoryWatch:
        self._fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        if self._libc.inotify_add_watch(self._fd, os.fsencode(self.directory), IN_CREATE | IN_MOVED_TO) < 0:
            error = ctypes.get_errno()
            os.close(self._fd)
            raise OSError(error, f"inotify_add_watch {self.directory}")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        os.close(self._fd)

    def names(self) -> list[str]:
        """Every name seen so far, in order (a name created, then renamed over, shows up twice)."""
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return list(self._seen)
            offset = 0
            while offset < len(data):
                _wd, _mask, _cookie, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size
                self._seen.append(data[offset : offset + length].rstrip(b"\0").decode())
                offset += length
