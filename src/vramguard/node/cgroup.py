"""Cgroups of pods and containers: whose a process is, from the text of /proc/<pid>/cgroup (`parse_cgroup`), and
where their directories are on the cgroup filesystem (`v2_root`, `pod_cgroups`, `locate_cgroups`, and for a kill
`find_container_cgroup` and `read_members`).

A cgroup is a pod's only where this node's kubelet makes pod cgroups (`KubeletTree`): below its --cgroup-root, in
the cgroupfs or the systemd driver's layout. `kubelet_cgroup` is that one decision, for a path read in /proc
(placed first from the agent's own cgroup namespace: `placed_path`) and for a directory walked on the cgroup
filesystem alike. A pod-shaped path anywhere else (a user slice, another kubelet's tree nested in a container) is
a look-alike, and no pod's. The shapes and the decisions: `docs/architecture.md` "Pod and container from a cgroup path".
"""

from __future__ import annotations

import enum
import functools
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from vramguard.core.process import LOOK_ALIKE, CgroupIdentity, LookAlike
from vramguard.node.procfs import FD_ERRNOS, read_cgroup

_HEX = "0-9a-f"
# Kubernetes pod UIDs are RFC 4122 UUIDs; static (file/HTTP) pods get a 32-hex hash of their manifest instead.
_UUID_DASHED = rf"[{_HEX}]{{8}}-[{_HEX}]{{4}}-[{_HEX}]{{4}}-[{_HEX}]{{4}}-[{_HEX}]{{12}}"
_UUID_ANY_SEP = rf"[{_HEX}]{{8}}[-_][{_HEX}]{{4}}[-_][{_HEX}]{{4}}[-_][{_HEX}]{{4}}[-_][{_HEX}]{{12}}"
_STATIC_UID = rf"[{_HEX}]{{32}}"

# systemd treats "-" as its hierarchy separator, so the kubelet writes the UID with "_"; "-" is accepted too.
_SYSTEMD_UID = re.compile(rf"{_UUID_ANY_SEP}|{_STATIC_UID}")
_CGROUPFS_POD = re.compile(rf"pod({_UUID_DASHED}|{_STATIC_UID})")
# A pod's directory as any kubelet names it ("kubepods-burstable-pod<uid>.slice", kind's "kubelet-kubepods-...",
# "pod<uid>"), wherever it is: what makes a path outside this kubelet's tree a look-alike rather than a host's.
_ANY_SYSTEMD_POD = re.compile(rf"(?:[A-Za-z0-9_]+-)?kubepods(?:-[a-z]+)?-pod(?:{_UUID_ANY_SEP}|{_STATIC_UID})\.slice")
# Container leaves: bare ID (containerd/Docker with cgroupfs), "crio-<id>" (CRI-O with cgroupfs), and the
# systemd scopes "cri-containerd-<id>.scope", "crio-<id>.scope", "docker-<id>.scope". CRI-O's conmon
# ("crio-conmon-<id>") is none of them.
_CONTAINER_LEAF = re.compile(rf"(?:(cri-containerd|crio|docker)-)?([{_HEX}]{{64}})(?:\.scope)?")

_RUNTIMES = {"cri-containerd": "containerd", "crio": "crio", "docker": "docker"}
_QOS_DIRS = ("burstable", "besteffort")  # Guaranteed pods sit directly in kubepods
# A part of the kubelet's --cgroup-root (one cgroup name).
_ROOT_PART = re.compile(r"[A-Za-z0-9_@:+][A-Za-z0-9_.@:+-]*")


# --------------------------------------------------------------------------------------------------------------
# Where this node's kubelet makes pod cgroups


@dataclass(frozen=True, slots=True)
class KubeletTree:
    """Where this node's kubelet makes its pod cgroups, and how a path this agent reads in /proc maps onto them.

    `root`: the kubelet's --cgroup-root as cgroup name parts (``()`` for its default ``/``, ``("kubelet",)`` for
    kind's ``/kubelet``); its pods are below ``<root>/kubepods`` (cgroupfs driver) or that name expanded into
    systemd slices (``/kubelet.slice/kubelet-kubepods.slice``). `namespace`: for each hierarchy this agent reads
    through a private cgroup namespace, (its hierarchy ID, where that namespace is rooted in it as segments from
    the hierarchy's root, or None where that could not be found): `find_namespace`. Paths of the other
    hierarchies are read as they are.
    """

    root: tuple[str, ...] = ()
    namespace: tuple[tuple[str, tuple[str, ...] | None], ...] = ()

    def namespace_root(self, hierarchy: str) -> tuple[str, ...] | None:
        """Where the paths read of `hierarchy` start: () at the hierarchy's root, None where no one knows."""
        for hid, root in self.namespace:
            if hid == hierarchy:
                return root
        return ()


HOST_KUBELET = KubeletTree()  # the kubelet's default --cgroup-root ("/"), read from the host's cgroup namespace


def kubelet_root(value: str) -> tuple[str, ...]:
    """The kubelet's --cgroup-root (``/``, ``/kubelet``: as the kubelet takes it; the systemd form
    ``/kubelet.slice`` too) as cgroup name parts. ValueError says what is wrong with it."""
    if not value.startswith("/"):
        raise ValueError("is not an absolute cgroup path (the kubelet's --cgroup-root: / by default, /kubelet in kind)")
    stripped = value.strip("/")
    segments = stripped.split("/") if stripped else []
    for segment in segments:
        if not _ROOT_PART.fullmatch(segment):
            raise ValueError(f"has {segment!r} where a cgroup name goes")
    if segments and all(s.endswith(".slice") for s in segments):
        # systemd's form: "/a.slice/a-b.slice" names the parts a, b (the kubelet writes a "-" in a part as "_").
        escaped = segments[-1].removesuffix(".slice").split("-")
        expanded = ["-".join(escaped[: i + 1]) + ".slice" for i in range(len(escaped))]
        if segments != expanded or "" in escaped:
            raise ValueError(f"is not a systemd slice path (that would be /{'/'.join(expanded)})")
        segments = [part.replace("_", "-") for part in escaped]
    if "kubepods" in segments:
        raise ValueError(
            "names the kubelet's pods directory, not its --cgroup-root: for pods under /kubepods or /kubepods.slice, "
            "the root is /"
        )
    return tuple(segments)


class Level(enum.Enum):
    """Where a cgroup lies when it is no pod's or container's of the kubelet (`kubelet_cgroup`)."""

    ABOVE_PODS = "above-pods"  # the kubelet's root, its kubepods and QoS directories: a walk for pods enters them
    NOT_WORKLOAD = "not-workload"  # in a pod cgroup, but runtime plumbing (conmon) or a leaf no runtime names so
    OUTSIDE = "outside"  # not below the kubelet's kubepods


def kubelet_cgroup(segments: Sequence[str], root: tuple[str, ...]) -> CgroupIdentity | Level:
    """Whose the cgroup at `segments` (its path from the hierarchy's root) is, when the kubelet's --cgroup-root is
    `root`: a pod's or a container's (a sub-cgroup a container made is still the container's), or where else it
    lies. The one decision of what is a kubelet pod cgroup: attribution, the orphans' candidates, the killer, the
    driver limits and the walks of the cgroup filesystem all go by it."""
    cgroupfs, systemd, prefix = _layouts(root)
    found = _cgroupfs(segments, cgroupfs)
    return found if found is not Level.OUTSIDE else _systemd(segments, systemd, prefix)


@functools.lru_cache(maxsize=16)
def _layouts(root: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...], str]:
    """The kubelet's kubepods directory as each driver names it (cgroupfs, systemd), and systemd's name prefix."""
    names = [part.replace("-", "_") for part in (*root, "kubepods")]
    systemd = tuple("-".join(names[: i + 1]) + ".slice" for i in range(len(names)))
    return (*root, "kubepods"), systemd, "-".join(names)


def _cgroupfs(segments: Sequence[str], kubepods: tuple[str, ...]) -> CgroupIdentity | Level:
    """``<root>/kubepods[/burstable|/besteffort]/pod<uid>/<leaf>``."""
    rest = _after(segments, kubepods)
    if not isinstance(rest, tuple):
        return rest
    qos = "guaranteed"
    if rest[0] in _QOS_DIRS:
        qos, rest = rest[0], rest[1:]
        if not rest:
            return Level.ABOVE_PODS
    m = _CGROUPFS_POD.fullmatch(rest[0])
    return _in_pod(m.group(1), qos, rest[1:]) if m is not None else Level.OUTSIDE


def _systemd(segments: Sequence[str], kubepods: tuple[str, ...], prefix: str) -> CgroupIdentity | Level:
    """``<root slices>/<p>.slice[/<p>-<qos>.slice]/<p>[-<qos>]-pod<uid with _>.slice/<leaf>``, p the name prefix
    (``kubepods``, kind's ``kubelet-kubepods``)."""
    rest = _after(segments, kubepods)
    if not isinstance(rest, tuple):
        return rest
    qos, pod_prefix = "guaranteed", f"{prefix}-pod"
    for name in _QOS_DIRS:
        if rest[0] == f"{prefix}-{name}.slice":
            qos, pod_prefix, rest = name, f"{prefix}-{name}-pod", rest[1:]
            if not rest:
                return Level.ABOVE_PODS
            break
    pod = rest[0]
    uid = pod[len(pod_prefix) : -len(".slice")]
    if not (pod.startswith(pod_prefix) and pod.endswith(".slice") and _SYSTEMD_UID.fullmatch(uid)):
        return Level.OUTSIDE
    return _in_pod(uid.replace("_", "-"), qos, rest[1:])


def _after(segments: Sequence[str], kubepods: tuple[str, ...]) -> tuple[str, ...] | Level:
    """The segments below `kubepods`, or where `segments` lies when it is not below it."""
    head = len(kubepods)
    if len(segments) <= head:
        return Level.ABOVE_PODS if tuple(segments) == kubepods[: len(segments)] else Level.OUTSIDE
    if tuple(segments[:head]) != kubepods:
        return Level.OUTSIDE
    return tuple(segments[head:])


def _in_pod(uid: str, qos: str, below: Sequence[str]) -> CgroupIdentity | Level:
    if not below:
        return CgroupIdentity(pod_uid=uid, container_id=None, runtime=None, qos=qos)
    m = _CONTAINER_LEAF.fullmatch(below[0])
    if m is None:
        return Level.NOT_WORKLOAD
    prefix, container_id = m.group(1), m.group(2)
    runtime = _RUNTIMES[prefix] if prefix is not None else None
    return CgroupIdentity(pod_uid=uid, container_id=container_id, runtime=runtime, qos=qos)


def placed_path(path: str, hierarchy: str, kubelet: KubeletTree) -> tuple[str, ...] | None:
    """`path`, a /proc/<pid>/cgroup line's of `hierarchy` as this agent reads it, as segments from the hierarchy's
    root: a private cgroup namespace's leading ``..`` climb from where the namespace is rooted. None when it
    cannot be placed (malformed, above the root, or read through a namespace whose root is not known)."""
    if not path.startswith("/"):
        return None
    segments = path[1:].split("/")
    if segments[-1] == "":
        segments.pop()  # "/" itself, or a trailing slash
    ups = 0
    while ups < len(segments) and segments[ups] == "..":
        ups += 1
    rest = segments[ups:]
    base = kubelet.namespace_root(hierarchy)
    if base is None or ups > len(base) or any(s in ("", ".", "..") for s in rest):
        return None
    return (*base[: len(base) - ups], *rest)


def parse_cgroup(text: str, kubelet: KubeletTree = HOST_KUBELET) -> CgroupIdentity | None:
    """The pod and container of this node's kubelet named by the contents of /proc/<pid>/cgroup; None outside
    them (a look-alike included) or on garbage."""
    found = place_cgroup(text, kubelet)
    return found if isinstance(found, CgroupIdentity) else None


@functools.lru_cache(maxsize=4096)
def place_cgroup(text: str, kubelet: KubeletTree = HOST_KUBELET) -> CgroupIdentity | LookAlike | None:
    """Where the contents of /proc/<pid>/cgroup put a process: a pod or container cgroup of this node's kubelet, a
    look-alike of one elsewhere (`LookAlike`), or None (a host process, runtime plumbing, garbage).

    Every line is tried (a hybrid host often names the pod in only one of them); a line naming a container wins
    over one naming only the pod, and either over a look-alike. Cached: every process of one container has the
    same text, so a cold scan of a busy node mostly hits it.
    """
    pod_only: CgroupIdentity | None = None
    look_alike = False
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        segments = placed_path(parts[2], parts[0], kubelet)
        found = kubelet_cgroup(segments, kubelet.root) if segments is not None else Level.OUTSIDE
        if isinstance(found, CgroupIdentity):
            if found.container_id is not None:
                return found
            pod_only = pod_only or found
        elif found is Level.OUTSIDE and _names_a_pod(parts[2]):
            look_alike = True
    if pod_only is not None:
        return pod_only
    return LOOK_ALIKE if look_alike else None


def _names_a_pod(path: str) -> bool:
    return any(_ANY_SYSTEMD_POD.fullmatch(s) or _CGROUPFS_POD.fullmatch(s) for s in path.split("/"))


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


def container_segments(segments: Sequence[str], root: tuple[str, ...]) -> tuple[str, ...] | None:
    """The part of `segments` (from a hierarchy's root) that ends with a kubelet container's own leaf, the
    sub-cgroups it made cut off; None when `segments` is in no container of the kubelet."""
    for end in range(len(segments) + 1):
        found = kubelet_cgroup(segments[:end], root)
        if isinstance(found, CgroupIdentity) and found.container_id is not None:
            return tuple(segments[:end])
        if isinstance(found, Level) and found is not Level.ABOVE_PODS:
            return None
    return None


# --------------------------------------------------------------------------------------------------------------
# Where the agent's own cgroup namespace is rooted

# Directories looked at, at most, to find the agent's own cgroup (once, at start).
_MAX_NAMESPACE_SEARCH = 100_000


def find_namespace(proc_root: str, cgroup_root: str, self_pid: int) -> tuple[tuple[str, tuple[str, ...] | None], ...]:
    """Where this agent's cgroup namespace is rooted in each hierarchy it reads through a private one
    (`KubeletTree.namespace`); empty in the host's cgroup namespace.

    How deep: the host's PID 1 (hostPID) lives near the top of every hierarchy, and the path the agent reads for it
    climbs one ``..`` per level from the namespace's root up to the hierarchy's root. Which directory that deep:
    the one where the agent's own path (from its /proc/<pid>/cgroup, ``/`` mostly) lists the agent, on the cgroup
    filesystem mounted at `cgroup_root` (the host's). None for a hierarchy where none does (no such mount).
    Raises OSError when /proc cannot be read.
    """
    init = read_cgroup(1, proc_root) or ""
    own = {hid: path for hid, _, path in cgroup_lines(read_cgroup(self_pid, proc_root) or "")}
    found: list[tuple[str, tuple[str, ...] | None]] = []
    for hid, controllers, path in cgroup_lines(init):
        ups = _leading_ups(path)
        if ups == 0:
            continue
        mount = _hierarchy_mount(cgroup_root, hid, controllers)
        own_path = own.get(hid)
        root = None
        if mount is not None and own_path is not None and _leading_ups(own_path) == 0:
            root = _own_directory(mount, ups, own_path, self_pid)
        found.append((hid, root))
    return tuple(found)


def _leading_ups(path: str) -> int:
    segments = path.split("/")[1:]
    count = 0
    while count < len(segments) and segments[count] == "..":
        count += 1
    return count


def _hierarchy_mount(cgroup_root: str, hierarchy: str, controllers: tuple[str, ...]) -> str | None:
    """Where a hierarchy is mounted under `cgroup_root`: v2's (`v2_root`), or the v1 one named by its controllers
    (``cpu,cpuacct``, ``systemd`` for ``name=systemd``)."""
    if hierarchy == "0" and not controllers:
        return v2_root(cgroup_root)
    mount = os.path.join(cgroup_root, ",".join(c.removeprefix("name=") for c in controllers))
    return mount if os.path.exists(os.path.join(mount, "cgroup.procs")) else None


def _own_directory(mount: str, depth: int, own_path: str, pid: int) -> tuple[str, ...] | None:
    """The directory `depth` levels below `mount` under which `own_path` lists `pid`, as segments; None if none."""
    tail = [s for s in own_path.split("/") if s]
    level: list[tuple[str, ...]] = [()]
    seen = 0
    for _ in range(depth):
        deeper: list[tuple[str, ...]] = []
        for segments in level:
            try:
                with os.scandir(os.path.join(mount, *segments)) as entries:
                    names = sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
            except OSError:
                continue
            seen += len(names)
            if seen > _MAX_NAMESPACE_SEARCH:
                return None
            deeper.extend((*segments, name) for name in names)
        level = deeper
    for segments in level:
        if pid in _read_procs_or_nothing(os.path.join(mount, *segments, *tail)):
            return segments
    return None


# --------------------------------------------------------------------------------------------------------------
# The directories on the cgroup filesystem


def v2_root(cgroup_root: str) -> str | None:
    """The cgroup v2 hierarchy under `cgroup_root`: itself on a pure v2 host, ``unified`` on a hybrid one."""
    for candidate in (cgroup_root, os.path.join(cgroup_root, "unified")):
        if os.path.exists(os.path.join(candidate, "cgroup.controllers")):
            return candidate
    return None


def pod_cgroups(
    root: str, pod_uids: Iterable[str] | None, kubelet: KubeletTree = HOST_KUBELET, *, containers: bool = True
) -> Iterator[tuple[CgroupIdentity, str]]:
    """The directories of the pods in `pod_uids` (every pod's for None) under the hierarchy mounted at `root` (v2,
    or one of v1's): each pod's own and, with `containers`, each container's own (not the sub-cgroups a container
    made), with whose they are.

    Only the kubelet's own directories are entered (`kubelet_cgroup`), in name order. A directory removed while
    walking, or unreadable, is passed over: the next walk sees it again."""
    wanted = set(pod_uids) if pod_uids is not None else None
    if wanted is not None and not wanted:
        return

    def walk(directory: str, segments: tuple[str, ...]) -> Iterator[tuple[CgroupIdentity, str]]:
        try:
            entries = sorted((e for e in os.scandir(directory) if e.is_dir(follow_symlinks=False)), key=_name)
        except OSError:
            return
        for entry in entries:
            below = (*segments, entry.name)
            found = kubelet_cgroup(below, kubelet.root)
            if isinstance(found, CgroupIdentity):
                if wanted is not None and found.pod_uid not in wanted:
                    continue
                yield found, entry.path
                if found.container_id is None and containers:
                    yield from walk(entry.path, below)
            elif found is Level.ABOVE_PODS:
                yield from walk(entry.path, below)

    yield from walk(root, ())


def pod_members(root: str, kubelet: KubeletTree = HOST_KUBELET, limit: int = 65_536) -> tuple[list[int], bool]:
    """The processes of every pod cgroup under the hierarchy mounted at `root` (the kubelet's pod directories,
    `pod_cgroups`, and everything below each), at most `limit` of them, and whether that is all (False when the
    limit cut the list: the rest is read by a later call, as the caller rotates). In PID order within each cgroup,
    pods in name order. A directory removed meanwhile is passed over."""
    found: list[int] = []
    for _, directory in pod_cgroups(root, None, kubelet, containers=False):
        try:
            found.extend(read_members(directory))
        except (OSError, ValueError):
            continue
        if len(found) >= limit:
            del found[limit:]
            return found, False
    return found, True


def _name(entry: os.DirEntry[str]) -> str:
    return entry.name


def locate_cgroups(
    root: str, pod_uids: Iterable[str], kubelet: KubeletTree = HOST_KUBELET
) -> dict[tuple[str, str | None], str]:
    """(pod UID, container ID or None for the pod's own cgroup) → directory, for the pods in `pod_uids`
    (`pod_cgroups`; where two directories name one container, the first found)."""
    found: dict[tuple[str, str | None], str] = {}
    for identity, directory in pod_cgroups(root, pod_uids, kubelet):
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
    cgroup_text: str,
    pid: int,
    pod_uid: str,
    container_ids: frozenset[str],
    cgroup_root: str = "/sys/fs/cgroup",
    kubelet: KubeletTree = HOST_KUBELET,
) -> ContainerCgroup | None:
    """The cgroup directory of the container `pid` is in, from its /proc/<pid>/cgroup text; None if not found.

    The v2 hierarchy is tried first (`v2_root`), then v1's freezer (under `cgroup_root`/freezer). In each, the path
    the process names, placed from the agent's cgroup namespace (`placed_path`), must be a container's of the
    kubelet's (`kubelet_cgroup`), one of `container_ids` of `pod_uid`; its directory under the mount is accepted
    only if its ``cgroup.procs`` (or that of the sub-cgroup the path goes on into) lists `pid`. Raises OSError only
    when out of fds (to be retried).
    """
    v2 = v2_root(cgroup_root)
    freezer = f"{cgroup_root}/freezer"
    lines = cgroup_lines(cgroup_text)
    tries: list[tuple[str, str, str, bool]] = []
    if v2 is not None:
        tries += [(hid, path, v2, True) for hid, controllers, path in lines if hid == "0" and not controllers]
    if os.path.exists(f"{freezer}/cgroup.procs"):
        tries += [(hid, path, freezer, False) for hid, controllers, path in lines if "freezer" in controllers]
    for hierarchy, path, mount, is_v2 in tries:
        segments = placed_path(path, hierarchy, kubelet)
        own = container_segments(segments, kubelet.root) if segments is not None else None
        if segments is None or own is None:
            continue
        identity = kubelet_cgroup(own, kubelet.root)
        assert isinstance(identity, CgroupIdentity) and identity.container_id is not None
        if identity.pod_uid != pod_uid or identity.container_id not in container_ids:
            continue
        if pid in _read_procs_or_nothing(os.path.join(mount, *segments)):
            return ContainerCgroup(identity.container_id, os.path.join(mount, *own), is_v2)
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
