"""Sees the kubelet's pod and container cgroups the moment they are created: inotify on the cgroup v2 tree.

A limit programmed when a cgroup appears is in place before the container's first instruction. `start()` raises
`InotifyUnavailable` where inotify cannot be had (then the agent's reconcile, driven by the pod's status, is the
only path); `stop(deadline)` ends the watching loop. See docs/architecture.md "Cgroup watcher" for why no cgroup is
missed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import struct
import threading
from collections.abc import Callable

import structlog

from vramguard.base.background import BackgroundLoop
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.core.process import CgroupIdentity
from vramguard.node.cgroup import HOST_KUBELET, KubeletTree, Level, kubelet_cgroup

_IN_CREATE = 0x00000100
_IN_MOVED_TO = 0x00000080
_IN_DELETE = 0x00000200
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_IN_ISDIR = 0x40000000
_IN_ONLYDIR = 0x01000000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")
_MASK = _IN_CREATE | _IN_MOVED_TO | _IN_DELETE | _IN_ONLYDIR


class InotifyUnavailable(OSError):
    """The root cannot be watched (no inotify, the kernel's limits, no such directory); the message says why."""


class _Inotify:
    """The three inotify calls, through libc."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("c") or "libc.so.6"
        self._libc = ctypes.CDLL(name, use_errno=True)
        fd = self._libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            e = ctypes.get_errno()
            raise InotifyUnavailable(e, f"inotify_init1: {os.strerror(e)}")
        self.fd = fd

    def add(self, path: str) -> int:
        wd = int(self._libc.inotify_add_watch(self.fd, os.fsencode(path), _MASK))
        if wd < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e), path)
        return wd

    def close(self) -> None:
        os.close(self.fd)


class CgroupWatcher:
    """Calls `appeared(path, identity, fresh)` on its own thread for each pod or container cgroup created under the
    v2 `root` (`fresh`), and once at start for each that already exists (not `fresh`: it may have run for long),
    in the kubelet's tree (`kubelet`) only. The limiter retries a cgroup whose pod it did not know yet on its own
    queue's clock: the watcher only reports."""

    def __init__(
        self,
        root: str,
        appeared: Callable[[str, CgroupIdentity, bool], None],
        *,
        clock: Clock = SYSTEM_CLOCK,
        log: structlog.typing.FilteringBoundLogger | None = None,
        kubelet: KubeletTree = HOST_KUBELET,
    ) -> None:
        self.root = root.rstrip("/") or "/"
        self.kubelet = kubelet
        self.appeared = appeared
        self.clock = clock
        self.log = log if log is not None else structlog.get_logger(__name__)
        self._inotify: _Inotify | None = None
        self._watches: dict[int, str] = {}  # watch descriptor → directory
        self._seen: set[str] = set()  # directories reported or watched, so a rescan reports each once
        self._wake_r, self._wake_w = -1, -1
        self._fds = threading.Lock()  # the wake's write and the close on the thread's way out
        self._poller = select.poll()
        # Set once the cgroups there at start are reported: one made after that is reported `fresh`.
        self.walked = threading.Event()
        self.exhausted: str | None = None  # why some directory could not be watched (the kernel's limit)
        self.loop = BackgroundLoop(
            "cgroup-watch", self._step, clock=clock, wake=self._wake, on_exit=self._close, log=self.log
        )

    def start(self) -> None:
        """Start watching; raises `InotifyUnavailable` saying why it cannot (the caller falls back to the
        reconcile alone)."""
        try:
            self._inotify = _Inotify()
            self._watches[self._inotify.add(self.root)] = self.root  # the walk below it runs on the thread
            self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            self._close()
            raise InotifyUnavailable(e.errno or 0, f"cannot watch {self.root} with inotify: {e}") from None
        self._poller.register(self._inotify.fd, select.POLLIN)
        self._poller.register(self._wake_r, select.POLLIN)
        self.loop.start()

    def stop(self, deadline: float) -> None:
        """Stop the thread, waiting for it until `deadline`; its fds are closed once it has ended (a thread still
        inside `appeared` keeps them until it returns and sees the stop)."""
        self.loop.stop(deadline)

    @property
    def running(self) -> bool:
        return self.loop.running

    def _wake(self) -> None:
        with self._fds:
            if self._wake_w >= 0:
                os.write(self._wake_w, b"x")

    def _close(self) -> None:
        with self._fds:
            if self._inotify is not None:
                self._inotify.close()
                self._inotify = None
            for fd in (self._wake_r, self._wake_w):
                if fd >= 0:
                    os.close(fd)
            self._wake_r = self._wake_w = -1

    # -- the watcher's thread --------------------------------------------------------------------------------

    def _step(self) -> float:
        """The walk of what is there, first; then one wait for events, and what they call for."""
        assert self._inotify is not None
        if not self.walked.is_set():
            self._scan(self.root, fresh=False)
            self.walked.set()
            return 0.0
        ready = self._poller.poll()  # until an event, or the stop's wake
        if self.loop.stopping.is_set():
            return 0.0
        if any(fd == self._inotify.fd for fd, _ in ready):
            try:
                self._read_events()
            except Exception as e:  # a bug here must not stop the watching: the reconcile stays the backstop
                self.log.exception("cgroup_watch_failed", error=repr(e))
        return 0.0

    def _read_events(self) -> None:
        assert self._inotify is not None
        while True:
            try:
                data = os.read(self._inotify.fd, 65536)
            except BlockingIOError:
                return
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                self._event(wd, mask, os.fsdecode(name))

    def _event(self, wd: int, mask: int, name: str) -> None:
        if mask & _IN_Q_OVERFLOW:  # events were lost: look at everything again
            self.log.warning("cgroup_watch_overflow", action="rescan")
            for watched in list(self._watches.values()):
                self._scan(watched, fresh=False)
            return
        directory = self._watches.get(wd)
        if mask & _IN_IGNORED:  # the directory is gone, and its watch with it
            if directory is not None:
                del self._watches[wd]
                self._seen.discard(directory)
            return
        if directory is None or not mask & _IN_ISDIR:
            return
        path = os.path.join(directory, name)
        if mask & _IN_DELETE:
            self._seen.discard(path)
            return
        self._found(path, fresh=True)

    def _found(self, path: str, *, fresh: bool) -> None:
        """A directory under a watched one: report it if it is a pod's or a container's, and descend into the
        kubelet's levels and into pods."""
        if path in self._seen:
            return
        relative = path[len(self.root) :] if self.root != "/" else path
        found = kubelet_cgroup(relative.split("/")[1:], self.kubelet.root)
        if not isinstance(found, CgroupIdentity) and found is not Level.ABOVE_PODS:
            return
        self._seen.add(path)
        if isinstance(found, CgroupIdentity):
            self.appeared(path, found, fresh)
            if found.container_id is not None:
                return  # a container: not entered
        self._watch(path, fresh=fresh)

    def _watch(self, directory: str, *, fresh: bool) -> None:
        assert self._inotify is not None
        try:
            wd = self._inotify.add(directory)
        except OSError as e:
            if e.errno == errno.ENOSPC and self.exhausted is None:
                self.exhausted = f"{e} (raise fs.inotify.max_user_watches)"
                self.log.warning("cgroup_watch_limit", directory=directory, error=str(e), fallback="reconcile")
            return  # or removed already (ENOENT)
        self._watches[wd] = directory
        self._scan(directory, fresh=fresh)

    def _scan(self, directory: str, *, fresh: bool) -> None:
        """Every subdirectory, as if just created: those made before the watch was in place are not missed."""
        try:
            entries = [e.path for e in os.scandir(directory) if e.is_dir(follow_symlinks=False)]
        except OSError:
            return
        for path in entries:
            self._found(path, fresh=fresh)
