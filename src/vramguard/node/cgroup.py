"""Cgroups of pods and containers: whose a process is, from the text of /proc/<pid>/cgroup (`parse_cgroup`), and
where their directories are on the cgroup filesystem (`v2_root`, `pod_cgroups`, `locate_cgroups`, and for a kill
`find_container_cgroup` and `read_members`).

The path alone names the pod (the kubelet's directory) and the container (the runtime's leaf), under the
cgroupfs and systemd drivers, kind's nesting and a private cgroup namespace alike. The shapes understood and
the decisions taken (conmon, the sandbox, unknown leaves): `docs/design.md` "Pod and container from a cgroup
path".
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from vramguard.core.model import CgroupIdentity
from vramguard.node.procfs import FD_ERRNOS

_HEX = "0-9a-f"
# Kubernetes pod UIDs are RFC 4122 UUIDs; static (file/HTTP) pods get a 32-hex hash of their manifest instead.
_UUID_DASHED = rf"[{_HEX}]{{8}}-[{_HEX}]{{4}}-[{_HEX}]{{4}}-[{_HEX}]{{4}}-[{_HEX}]{{12}}"
_UUID_ANY_SEP = rf"[{_HEX}]{{8}}[-_][{_HEX}]{{4}}[-_][{_HEX}]{{4}}[-_][{_HEX}]{{4}}[-_][{_HEX}]{{12}}"
_STATIC_UID = rf"[{_HEX}]{{32}}"

# "kubepods-burstable-pod<uid>.slice", "kubepods-pod<uid>.slice", kind's "kubelet-kubepods-...".
# systemd treats "-" as its hierarchy separator, so the kubelet writes the UID with "_"; "-" is accepted too.
_SYSTEMD_POD = re.compile(
    rf"(?:[a-z0-9_]+-)?kubepods(?:-(burstable|besteffort))?-pod({_UUID_ANY_SEP}|{_STATIC_UID})\.slice"
)
_CGROUPFS_POD = re.compile(rf"pod({_UUID_DASHED}|{_STATIC_UID})")
# Container leaves: bare ID (containerd/Docker with cgroupfs), "crio-<id>" (CRI-O with cgroupfs), and the
# systemd scopes "cri-containerd-<id>.scope", "crio-<id>.scope", "docker-<id>.scope".
_CONTAINER_LEAF = re.compile(rf"(?:(cri-containerd|crio|docker)-)?([{_HEX}]{{64}})(?:\.scope)?")
_CONMON_LEAF = re.compile(rf"crio-conmon-[{_HEX}]{{64}}(?:\.scope)?")

_RUNTIMES = {"cri-containerd": "containerd", "crio": "crio", "docker": "docker"}
# The segments a cgroupfs pod directory may sit under. ".." is what a private cgroup namespace leaves of them.
_CGROUPFS_QOS_PARENTS = {"burstable": "burstable", "besteffort": "besteffort", "kubepods": "guaranteed"}
_CGROUPFS_ABOVE_QOS = frozenset({"kubepods", ".."})

# Sentinel: the line names a pod, but the process is not (or must not be treated as) one of its workloads.
_NOT_WORKLOAD = object()


def parse_cgroup(text: str) -> CgroupIdentity | None:
    """The pod and container named by the contents of /proc/<pid>/cgroup; None outside a pod or on garbage."""
    # Every process of one container has the same text, so a cold scan of a busy node mostly hits this cache.
    return _parse_cached(text)


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str) -> CgroupIdentity | None:
    pod_only: CgroupIdentity | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or "pod" not in parts[2]:
            continue
        found = parse_cgroup_path(parts[2])
        if found is None:
            continue
        if found.container_id is not None:
            return found
        if pod_only is None:
            pod_only = found
    return pod_only


def parse_cgroup_path(path: str) -> CgroupIdentity | None:
    """The pod and container named by one cgroup path (the third field of a /proc/<pid>/cgroup line)."""
    result = _parse_path(path)
    return result if isinstance(result, CgroupIdentity) else None


def _parse_path(path: str) -> CgroupIdentity | object | None:
    segments = path.split("/")
    for i, segment in enumerate(segments):
        if not segment.endswith(".slice") and not segment.startswith("pod"):
            continue
        pod = _match_pod(segments, i)
        if pod is None:
            continue
        uid, qos = pod
        # Anything below the container leaf (sub-cgroups a container made for itself, crun's "container"
        # child of a CRI-O scope) is still that container.
        if i + 1 >= len(segments) or segments[i + 1] == "":
            return CgroupIdentity(pod_uid=uid, container_id=None, runtime=None, qos=qos)
        leaf = segments[i + 1]
        if _CONMON_LEAF.fullmatch(leaf):
            return _NOT_WORKLOAD
        m = _CONTAINER_LEAF.fullmatch(leaf)
        if m is None:
            return _NOT_WORKLOAD
        prefix, container_id = m.group(1), m.group(2)
        runtime = _RUNTIMES[prefix] if prefix is not None else None
        return CgroupIdentity(pod_uid=uid, container_id=container_id, runtime=runtime, qos=qos)
    return None


def _match_pod(segments: list[str], i: int) -> tuple[str, str | None] | None:
    """(pod UID with dashes, QoS class) when segments[i] is a kubelet pod cgroup, else None."""
    segment = segments[i]
    m = _SYSTEMD_POD.fullmatch(segment)
    if m is not None:
        qos = m.group(1) or "guaranteed"
        return m.group(2).replace("_", "-"), qos
    m = _CGROUPFS_POD.fullmatch(segment)
    if m is None or i == 0:
        return None
    # A bare "pod<uid>" directory is only a kubelet pod when it sits where the kubelet puts it; this keeps
    # an unrelated "pod…" directory elsewhere on the host from being taken for one.
    parent = segments[i - 1]
    if parent == "..":
        return m.group(1), None  # a private namespace hid the QoS level
    qos = _CGROUPFS_QOS_PARENTS.get(parent)
    if qos is None:
        return None
    if qos != "guaranteed" and (i < 2 or segments[i - 2] not in _CGROUPFS_ABOVE_QOS):
        return None
    return m.group(1), qos


def leaf_container_id(name: str) -> str | None:
    """The container ID a runtime's leaf directory name carries (``<id>``, ``crio-<id>``,
    ``cri-containerd-<id>.scope``...), or None (conmon's, or not a container's)."""
    m = _CONTAINER_LEAF.fullmatch(name)
    return m.group(2) if m is not None else None


def cgroup_lines(text: str) -> list[tuple[str, tuple[str, ...], str]]:
    """The lines of /proc/<pid>/cgroup as (hierarchy ID, controllers, path); v2's line is ("0", (), path).

    The killer needs the raw path of one hierarchy (the unified one, or v1's freezer) to find the container's
    directory; `parse_cgroup` only says whose it is.
    """
    lines = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            controllers = tuple(c for c in parts[1].split(",") if c)
            lines.append((parts[0], controllers, parts[2]))
    return lines


def container_cgroup_path(path: str, container_id: str) -> str | None:
    """The part of `path` that ends with the container's own leaf (its sub-cgroups cut off), or None when
    `path` is not inside that container. Leading ``..`` segments (a private cgroup namespace) are kept."""
    segments = path.split("/")
    for end in range(1, len(segments) + 1):
        prefix = "/".join(segments[:end])
        found = parse_cgroup_path(prefix)
        if found is not None and found.container_id is not None:
            return prefix if found.container_id == container_id else None
    return None


# --------------------------------------------------------------------------------------------------------------
# The directories on the cgroup filesystem

# The directories the kubelet makes above its pods (cgroupfs, systemd, kind's nesting): a walk for pod cgroups
# enters these and nothing else. kind nests the pods five levels down; a container may have sub-cgroups.
KUBELET_LEVELS = ("kubepods", "kubelet", "besteffort", "burstable")
MAX_POD_DEPTH = 7


def v2_root(cgroup_root: str) -> str | None:
    """The cgroup v2 hierarchy under `cgroup_root`: itself on a pure v2 host, ``unified`` on a hybrid one."""
    for candidate in (cgroup_root, os.path.join(cgroup_root, "unified")):
        if os.path.exists(os.path.join(candidate, "cgroup.controllers")):
            return candidate
    return None


def pod_cgroups(root: str, pod_uids: Iterable[str]) -> Iterator[tuple[CgroupIdentity, str]]:
    """The directories of the pods in `pod_uids` under the hierarchy mounted at `root` (v2, or one of v1's):
    each pod's own and each container's own (not the sub-cgroups a container made), with whose they are.

    Only the kubelet's directories are entered (`KUBELET_LEVELS`, at most `MAX_POD_DEPTH` deep), in name order.
    A directory removed while walking, or unreadable, is passed over: the next walk sees it again."""
    wanted = set(pod_uids)
    if not wanted:
        return

    def walk(directory: str, relative: str, depth: int) -> Iterator[tuple[CgroupIdentity, str]]:
        try:
            entries = sorted((e for e in os.scandir(directory) if e.is_dir(follow_symlinks=False)), key=_name)
        except OSError:
            return
        for entry in entries:
            path = f"{relative}/{entry.name}"
            identity = parse_cgroup_path(path)
            if identity is not None:
                if identity.pod_uid not in wanted:
                    continue
                yield identity, entry.path
                if identity.container_id is not None:
                    continue
            elif not entry.name.startswith(KUBELET_LEVELS):
                continue
            if depth < MAX_POD_DEPTH:
                yield from walk(entry.path, path, depth + 1)

    yield from walk(root, "", 1)


def _name(entry: os.DirEntry[str]) -> str:
    return entry.name


def locate_cgroups(root: str, pod_uids: Iterable[str]) -> dict[tuple[str, str | None], str]:
    """(pod UID, container ID or None for the pod's own cgroup) → directory, for the pods in `pod_uids`
    (`pod_cgroups`; where two directories name one container, the first found)."""
    found: dict[tuple[str, str | None], str] = {}
    for identity, directory in pod_cgroups(root, pod_uids):
        found.setdefault((identity.pod_uid, identity.container_id), directory)
    return found


# --------------------------------------------------------------------------------------------------------------
# A violating container's directory, for the killer


@dataclass(frozen=True, slots=True)
class ContainerCgroup:
    """A violating container's cgroup directory in one hierarchy."""

    container_id: str
    directory: str  # the container's own directory (its sub-cgroups, if any, are below it)
    v2: bool  # cgroup2 (cgroup.freeze) or v1's freezer hierarchy (freezer.state)


def find_container_cgroup(
    cgroup_text: str, pid: int, pod_uid: str, container_ids: frozenset[str], cgroup_root: str = "/sys/fs/cgroup"
) -> ContainerCgroup | None:
    """The cgroup directory of the container `pid` is in, from its /proc/<pid>/cgroup text; None if not found.

    The v2 hierarchy is tried first (`v2_root`), then v1's freezer (under `cgroup_root`/freezer). In each, the path
    the process names must be one of `container_ids` of `pod_uid`; that container's directory is then found from
    the mount's root (`pod_cgroups`) and accepted only if its ``cgroup.procs`` (or that of the sub-cgroup the path
    continues into) lists `pid`. Raises OSError only when out of fds (to be retried).
    """
    v2 = v2_root(cgroup_root)
    freezer = f"{cgroup_root}/freezer"
    lines = cgroup_lines(cgroup_text)
    tries: list[tuple[str, str, bool]] = []
    if v2 is not None:
        tries += [(path, v2, True) for hid, controllers, path in lines if hid == "0" and not controllers]
    if os.path.exists(f"{freezer}/cgroup.procs"):
        tries += [(path, freezer, False) for _, controllers, path in lines if "freezer" in controllers]
    for path, mount, is_v2 in tries:
        identity = parse_cgroup_path(path)
        if identity is None or identity.pod_uid != pod_uid or identity.container_id not in container_ids:
            continue
        own = container_cgroup_path(path, identity.container_id)
        if own is None:
            continue
        below = path[len(own) :]  # the sub-cgroup the process is in, inside the container ("" mostly)
        # The directory is looked for from the mount's root: the path read may be relative to a private cgroup
        # namespace ("/../../burstable/pod…"), and a look-alike elsewhere fails the membership check.
        for found, directory in pod_cgroups(mount, (pod_uid,)):
            if found.container_id == identity.container_id and pid in _read_procs_or_nothing(f"{directory}{below}"):
                return ContainerCgroup(identity.container_id, directory, is_v2)
    return None


def read_members(directory: str) -> list[int]:
    """The processes of a cgroup and of its sub-cgroups. A sub-cgroup removed meanwhile is skipped; a directory
    that is gone altogether has no processes (the container is gone); any other error raises."""
    pids: list[int] = []
    stack = [directory]
    while stack:
        current = stack.pop()
        try:
            pids.extend(_read_procs(current))
            with os.scandir(current) as entries:
                stack.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))
        except FileNotFoundError:
            continue
    return pids


def _read_procs(directory: str) -> list[int]:
    with open(f"{directory}/cgroup.procs", "rb") as f:
        return [int(line) for line in f.read().split()]


def _read_procs_or_nothing(directory: str) -> list[int]:
    """cgroup.procs of a directory that may not exist (a guess); raises only when out of fds (to be retried)."""
    try:
        return _read_procs(directory)
    except OSError as e:
        if e.errno in FD_ERRNOS:  # the killer waits a little and tries again
            raise
        return []
    except ValueError:
        return []
