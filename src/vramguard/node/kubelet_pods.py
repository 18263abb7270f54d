"""The pods this node's kubelet has set up, from the node itself: the kubelet's pod logs directory.

The kubelet makes `<podLogsDir>/<namespace>_<name>_<uid>` for every pod before it starts its sandbox, static pods
included, under the namespace, name and UID it runs the pod as (kubelet `BuildPodLogsDirectory`; `podLogsDir`
defaults to /var/log/pods), and removes it with the pod. Only the node's root can write there, so it is what a
tenant cannot forge: a mirror pod whose namespace and name are not the ones the kubelet runs that UID as is no
mirror (`kube/pod_manifest.py` `index_pods`), and a static pod whose mirror is missing is still named.

The directory is listed on a thread of its own every `REFRESH_S` (one readdir of the node's pods), and `runs`
reads the last listing: the scan never waits on the disk. A pod source whose mirror claim the last listing does not
back lists it again at once on its own watch thread (`refresh`), since the kubelet makes the mirror pod and the pod
together. `on_change` hears a listing that differs from the last.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final

import structlog

from vramguard.base.background import BackgroundLoop
from vramguard.base.clock import SYSTEM_CLOCK, Clock
from vramguard.base.logs import FailureRun
from vramguard.core.process import KubeletPod

DEFAULT_POD_LOGS_DIR: Final = "/var/log/pods"
REFRESH_S: Final = 2.0
# A node runs a few hundred pods at most; past this many entries the rest of the directory is not read.
MAX_ENTRIES: Final = 4096
# `<namespace>_<name>_<uid>`: a namespace is a DNS label and a name a DNS subdomain, neither with "_".
_ENTRY: Final = re.compile(r"([a-z0-9][a-z0-9-]{0,62})_([a-z0-9][a-z0-9.-]{0,252})_([0-9a-f][0-9a-f-]{0,63})")


def parse_entry(entry: str) -> tuple[str, KubeletPod] | None:
    """`infra_trainer-node-1_7c4e…` → ("7c4e…", KubeletPod("infra", "trainer-node-1")); None for any other
    name."""
    m = _ENTRY.fullmatch(entry)
    if m is None:
        return None
    return m.group(3), KubeletPod(m.group(1), m.group(2))


class KubeletPods:
    """`ports.KubeletPods` from the kubelet's pod logs directory under `root` (as this agent sees the host's)."""

    def __init__(
        self,
        root: str = DEFAULT_POD_LOGS_DIR,
        *,
        clock: Clock = SYSTEM_CLOCK,
        on_change: Callable[[], None] | None = None,
        log: structlog.typing.FilteringBoundLogger | None = None,
    ) -> None:
        self.root = root
        self.on_change = on_change
        self.log = log if log is not None else structlog.get_logger(__name__)
        self._pods: Mapping[str, KubeletPod] = MappingProxyType({})
        self._lock = threading.Lock()  # one refresh at a time: the loop's, or a pod source's `refresh`
        self._failures = FailureRun()
        self.loop = BackgroundLoop("kubelet-pods", self._step, clock=clock, log=self.log)

    def start(self) -> None:
        self.refresh()
        self.loop.start()

    def stop(self, deadline: float) -> None:
        self.loop.stop(deadline)

    def runs(self, uid: str) -> KubeletPod | None:
        return self._pods.get(uid)

    def pods(self) -> Mapping[str, KubeletPod]:
        return self._pods

    def refresh(self) -> bool:
        """List the directory now; True when the listing changed (`on_change` was called)."""
        with self._lock:
            try:
                pods = self._list()
            except OSError as e:
                if self._failures.failed(f"{type(e).__name__}: {e.strerror or e}"):
                    self.log.warning(
                        "kubelet_pod_logs_unreadable",
                        path=self.root,
                        error=e.strerror or str(e),
                        consequence="mirror pods cannot be verified: static pods are governed as pods without one",
                    )
                pods = {}
            else:
                if self._failures.ok():
                    self.log.info("kubelet_pod_logs_readable", path=self.root)
            changed = pods != self._pods
            if changed:
                self._pods = MappingProxyType(pods)
        if changed and self.on_change is not None:
            self.on_change()
        return changed

    def _list(self) -> dict[str, KubeletPod]:
        pods: dict[str, KubeletPod] = {}
        with os.scandir(self.root) as entries:
            for i, entry in enumerate(entries):
                if i >= MAX_ENTRIES:
                    break
                found = parse_entry(entry.name)
                if found is not None:
                    pods[found[0]] = found[1]
        return pods

    def _step(self) -> float:
        self.refresh()
        return REFRESH_S
