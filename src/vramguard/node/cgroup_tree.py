"""The pod and container cgroups as the driver limiter sees them (`CgroupTree`), and the real one over cgroupfs.

Every file-system read of `limiter.DriverLimiter` goes through this one seam, so its decisions are unit tests over
a fake tree; `CgroupfsTree` does the reading with `cgroup.py`'s helpers.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Protocol

from vramguard.node.cgroup import HOST_KUBELET, KubeletTree, leaf_container_id, locate_cgroups, v2_root


class CgroupTree(Protocol):
    """Which pod and container cgroup directories exist, whose they are, and whether anything runs in them.
    Reads only; may block on the file system (only the limiter's worker and `vramguard top` call it)."""

    @property
    def root(self) -> str:
        """Where the cgroup filesystem is mounted, as this process sees it (for messages)."""
        ...

    def v2_root(self) -> str | None:
        """The cgroup v2 hierarchy under `root`, or None (the driver's limits need cgroup v2)."""
        ...

    def locate(self, hierarchy: str, pod_uids: Iterable[str]) -> dict[tuple[str, str | None], str]:
        """(pod UID, container ID or None for the pod's own cgroup) → directory, for the pods in `pod_uids`
        under `hierarchy` (`cgroup.locate_cgroups`)."""
        ...

    def exists(self, path: str) -> bool:
        """Whether the cgroup directory is there (not removed with its container or pod)."""
        ...

    def sibling_container_ids(self, path: str) -> set[str]:
        """The container IDs of the cgroups next to a container's cgroup (in its pod's), itself included."""
        ...

    def populated(self, path: str) -> bool:
        """Whether any process runs in the cgroup or below it."""
        ...


class CgroupfsTree:
    """The cgroup filesystem mounted at `root` (``/sys/fs/cgroup``, or under ``--host-root``), where the kubelet
    makes pod cgroups as `kubelet` says."""

    def __init__(self, root: str = "/sys/fs/cgroup", kubelet: KubeletTree = HOST_KUBELET) -> None:
        self._root = root
        self._kubelet = kubelet

    @property
    def root(self) -> str:
        return self._root

    def v2_root(self) -> str | None:
        return v2_root(self._root)

    def locate(self, hierarchy: str, pod_uids: Iterable[str]) -> dict[tuple[str, str | None], str]:
        return locate_cgroups(hierarchy, pod_uids, self._kubelet)

    def exists(self, path: str) -> bool:
        return os.path.isdir(path)

    def sibling_container_ids(self, path: str) -> set[str]:
        parent = os.path.dirname(path)
        try:
            names = [e.name for e in os.scandir(parent) if e.is_dir(follow_symlinks=False)]
        except OSError:
            return set()
        return {cid for name in names if (cid := leaf_container_id(name)) is not None}

    def populated(self, path: str) -> bool:
        """cgroup v2's cgroup.events says ``populated 1``; an unreadable one (a removed cgroup) says no."""
        try:
            with open(os.path.join(path, "cgroup.events")) as f:
                return any(line.split() == ["populated", "1"] for line in f)
        except OSError:
            return False
