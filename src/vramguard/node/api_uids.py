"""The UIDs the API server gave this node's pods, as this node's agents saw them, kept across restarts.

The API server gives every object it creates a UID of its own (a UUID; a UID a client sends is replaced), so a
UID seen as a pod's metadata.uid is an API server's, never a kubelet's: a static pod runs under the UID its
manifest has or the kubelet's hash of it, which no API object carries. That tells two things a UID's form cannot
(a manifest may set a UUID of its own):

- a pod cgroup whose UID is here is an API server pod's, which the API server can delete: only such a pod's
  leftovers can be orphans (`core/orphans.py`). A pod cgroup no agent on this node ever saw in the API server (a
  static pod without a mirror, a pod made and deleted while no agent ran) is reported and never reclaimed;
- a mirror pod claiming one of these UIDs claims an API server pod's, which is no static pod: it is a forgery
  (`kube/pod_manifest.py` `index_pods`).

The record is a file of one UID a line under the agent's state directory, appended to as pods arrive and rewritten
whole (through a rename) when it has grown to twice its bound; an agent reads it at start, bounded, and keeps the
newest `MAX_UIDS`. Without a state directory (a dry run, `vramguard top`) it lives in memory only.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from collections.abc import Iterable
from typing import Final

import structlog

from vramguard.base.logs import FailureRun

# Pods this node's agents remember: days of a busy node's pod churn (a node runs a few hundred at once).
MAX_UIDS: Final = 8192
FILE_NAME: Final = "api-pod-uids"
_LINE_BYTES: Final = 37  # a UUID and its newline
_UUID: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class ApiUids:
    """`ports.ApiUidRecord`: `add` the metadata.uid of each pod the API server serves; `uid in record`."""

    def __init__(
        self,
        state_dir: str | None = None,
        *,
        max_uids: int = MAX_UIDS,
        log: structlog.typing.FilteringBoundLogger | None = None,
    ) -> None:
        self.path = f"{state_dir.rstrip('/')}/{FILE_NAME}" if state_dir else None
        self.max_uids = max_uids
        self.log = log if log is not None else structlog.get_logger(__name__)
        self._uids: dict[str, None] = {}  # insertion-ordered: the oldest first
        self._lines = 0  # lines in the file, to know when to rewrite it
        self._lock = threading.Lock()
        self._failures = FailureRun()
        if self.path is not None:
            self._load(self.path)

    def __contains__(self, uid: object) -> bool:
        return uid in self._uids

    def __len__(self) -> int:
        return len(self._uids)

    def add(self, uids: Iterable[str]) -> None:
        """Remember each UID of API server form not remembered yet, and note the new ones in the file."""
        with self._lock:
            new = [u for u in dict.fromkeys(uids) if u not in self._uids and _UUID.fullmatch(u)]
            if not new:
                return
            for uid in new:
                self._uids[uid] = None
            while len(self._uids) > self.max_uids:
                del self._uids[next(iter(self._uids))]
            self._note(new)

    def _note(self, new: list[str]) -> None:
        if self.path is None:
            return
        try:
            if self._lines + len(new) > 2 * self.max_uids:
                self._rewrite(self.path)
            else:
                with open(self.path, "a") as f:
                    f.write("".join(f"{u}\n" for u in new))
                self._lines += len(new)
        except OSError as e:
            if self._failures.failed(e.strerror or str(e)):
                self.log.warning(
                    "api_pod_uids_unwritable",
                    path=self.path,
                    error=e.strerror or str(e),
                    consequence="an agent started after this one may not reclaim these pods' leftovers",
                )
        else:
            self._failures.ok()

    def _rewrite(self, path: str) -> None:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write("".join(f"{u}\n" for u in self._uids))
        os.replace(tmp, path)
        self._lines = len(self._uids)

    def _load(self, path: str) -> None:
        """Read what earlier agents noted: at most twice the bound's lines, anything not a UID skipped."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        except OSError as e:
            self.log.warning("api_pod_uids_unreadable", path=path, error=e.strerror or str(e))
            return
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                self.log.warning("api_pod_uids_unreadable", path=path, error="not a regular file")
                return
            data = os.read(fd, 2 * self.max_uids * _LINE_BYTES)
        except OSError as e:
            self.log.warning("api_pod_uids_unreadable", path=path, error=e.strerror or str(e))
            return
        finally:
            os.close(fd)
        lines = data.decode("ascii", "replace").splitlines()
        self._lines = len(lines)
        for line in lines:
            if _UUID.fullmatch(line):
                self._uids.pop(line, None)
                self._uids[line] = None
        while len(self._uids) > self.max_uids:
            del self._uids[next(iter(self._uids))]
