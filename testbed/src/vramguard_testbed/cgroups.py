"""Real kubelet-shaped cgroups with real processes in them, for tests, the demo and benchmarks.

The agent attributes and kills processes by what the kernel says about them, so its tests create exactly what a
kubelet and a container runtime would: the same directory names under ``/sys/fs/cgroup``, with processes moved
into them. Nothing is nested under a test-only parent, because such a path would not be kubelet-shaped; instead
every pod gets a fresh random UID (and every container a fresh ID), so parallel runs never share a pod or
container directory. Only the QoS/kubepods parents are shared; they are created when missing, marked with a
``trusted.vramguard-test`` xattr, and removed by whichever run finishes last (a cgroup with children cannot be
removed). A parent without the mark (a real kubelet's) is never removed.

Usage::

    from vramguard_testbed.cgroups import KubeletCgroups, cgroups_unavailable, device_holder_argv

    if (reason := cgroups_unavailable(version=2)) is not None:
        pytest.skip(reason)
    with KubeletCgroups(driver="systemd", version=2) as kc:
        pod = kc.pod(qos="burstable")                   # random UID unless uid= is given
        ctr = pod.container(runtime="containerd")       # random 64-hex ID unless container_id= is given
        proc = ctr.spawn(["sleep", "60"])               # a subprocess.Popen, already inside the cgroup
        assert ctr.identity == CgroupIdentity(pod.uid, ctr.container_id, "containerd", "burstable")
        ctr.pids()                                      # what the kernel lists in the container's cgroup
        # A "GPU process" on a machine without a GPU: holds a file open the way CUDA holds /dev/nvidia0, and
        # forks two children that inherit it (their PIDs come on stdout); give the killer the file's prefix.
        holder = ctr.spawn(device_holder_argv("/tmp/x/nvidia0", children=2), stdout=subprocess.PIPE, text=True)
    # here every process in those cgroups is dead and every directory this instance made is gone

As a pytest fixture (``tests/cgroup_fixtures.py`` has a factory that also skips with the reason)::

    @pytest.fixture
    def kubelet_cgroups():
        with KubeletCgroups(driver="cgroupfs", version=1) as kc:
            yield kc

A pod whose UID comes from elsewhere (a pod created in a test apiserver) is ``kc.pod(uid=pod.metadata.uid,
qos="guaranteed")``, and its container ``pod.container(container_id=<ID from the pod's status>)``.

The layouts: ``driver`` "systemd" (``kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/
cri-containerd-<id>.scope``) or "cgroupfs" (``kubepods/burstable/pod<uid>/<id>``); ``kind=True`` nests them the
way kind does (``kubelet.slice/kubelet-kubepods.slice/...``, ``kubelet/kubepods/...``); ``under`` puts the whole
tree below another cgroup, as a look-alike no kubelet of this node made (``under="/user.slice/user-1000.slice/
user@1000.service"``: a rootless kubelet's; ``under="/docker/<id>"``: a nested node's). ``version=2`` uses the
unified hierarchy (``/sys/fs/cgroup`` on a pure v2 host, ``/sys/fs/cgroup/unified`` on a hybrid one);
``version=1`` uses the v1 hierarchies named by ``v1_hierarchies`` (default: ``pids`` and the named ``systemd``
one), leaving the process at ``0::/`` in v2, as on a hybrid node. Controllers that change how the test machine
runs (``memory``, ``cpu``, ``cpuset``) are not used by default: a process moved there would leave the memory
limit the test runner itself lives under. (On a pure v2 host that cannot be avoided: the unified hierarchy
carries every controller, and the spawned processes run without the runner's limits.)

How a process gets in: ``spawn`` starts ``/bin/sh`` with a tiny script that writes its own PID into each
cgroup's ``cgroup.procs`` and then ``exec``s the command. The command therefore runs inside the cgroup from its
first instruction, with the PID and start time ``Popen`` reports, and any child it forks starts there too.
``preexec_fn`` would do the same without the shell, but Python documents it as unsafe in a process with threads,
and the demo and end-to-end tests run threads (metrics server, pod watch). ``spawn`` returns only once the kernel
lists the PID in every target cgroup. ``move(pid)`` puts an already running process in instead.

Cleanup (``close``/``__exit__``, also when the body raised): every process in the created cgroups is killed
(``cgroup.kill`` on v2; on v1 each member through a pidfd, after checking it is still a member), spawned
children are reaped, then directories are removed innermost first, retrying while the kernel finishes tearing
exiting tasks down. A pod or container directory that cannot be removed raises `CgroupCleanupError` (or, when
the body already raised, a warning) so leaks are never silent. Not thread-safe: use one instance per thread.
"""

from __future__ import annotations

import contextlib
import enum
import os
import secrets
import shutil
import signal
import subprocess
import time
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from vramguard.core.process import CgroupIdentity
from vramguard_testbed.waiting import WaitTimeout, wait_until

DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup"
DEFAULT_V1_HIERARCHIES: tuple[str, ...] = ("pids", "systemd")

# Pod UIDs made here start with this, so a person looking at /sys/fs/cgroup after a crashed run can tell test
# leftovers from real pods (and `remove_stale_test_cgroups` can).
TEST_UID_PREFIX = "7e57"

# Set on the shared parents (kubepods.slice, ...) this module creates. trusted.* works on v1 and v2 cgroupfs.
_TEST_XATTR = "trusted.vramguard-test"

_SPAWN_TIMEOUT_S = 10.0
_RMDIR_TIMEOUT_S = 5.0

# `$0` is a label; the arguments are the cgroup.procs files, then "--", then the command.
_SPAWN_SHIM = 'for f do shift; [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; done; exec "$@"'


class CgroupDriver(str, enum.Enum):
    """The kubelet's --cgroup-driver."""

    SYSTEMD = "systemd"
    CGROUPFS = "cgroupfs"


class QoS(str, enum.Enum):
    GUARANTEED = "guaranteed"
    BURSTABLE = "burstable"
    BESTEFFORT = "besteffort"


class Runtime(str, enum.Enum):
    CONTAINERD = "containerd"
    CRIO = "crio"
    DOCKER = "docker"


class CgroupCleanupError(RuntimeError):
    """Some cgroup this helper created could not be removed."""


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """One mounted cgroup hierarchy: where it is, and whether it is v2."""

    mount: str
    v2: bool


# ----------------------------------------------------------------------------------------------------------
# Discovery


def find_hierarchies(
    version: int, cgroup_root: str = DEFAULT_CGROUP_ROOT, v1_hierarchies: Sequence[str] = DEFAULT_V1_HIERARCHIES
) -> list[Hierarchy]:
    """The mounted hierarchies a `KubeletCgroups` of this version would use (empty when there are none)."""
    if version == 2:
        for mount in (cgroup_root, os.path.join(cgroup_root, "unified")):
            if os.path.exists(os.path.join(mount, "cgroup.controllers")):
                return [Hierarchy(mount, v2=True)]
        return []
    if version == 1:
        found = []
        for name in v1_hierarchies:
            mount = os.path.join(cgroup_root, name)
            # v1 hierarchies have "tasks"; v2 has cgroup.controllers instead.
            if os.path.exists(os.path.join(mount, "tasks")):
                found.append(Hierarchy(mount, v2=False))
        return found
    raise ValueError(f"cgroup version must be 1 or 2, not {version!r}")


def cgroups_unavailable(
    version: int = 2, cgroup_root: str = DEFAULT_CGROUP_ROOT, v1_hierarchies: Sequence[str] = DEFAULT_V1_HIERARCHIES
) -> str | None:
    """Why real cgroups of this version cannot be made here, or None when they can (for `pytest.skip`)."""
    if not hasattr(os, "pidfd_open"):
        return "needs Linux with pidfd_open (Python 3.9+, kernel 5.3+)"
    if os.geteuid() != 0:
        return "needs root to create cgroups and move processes into them"
    hierarchies = find_hierarchies(version, cgroup_root, v1_hierarchies)
    if not hierarchies:
        wanted = "a cgroup2 mount" if version == 2 else f"v1 hierarchies {list(v1_hierarchies)}"
        return f"no {wanted} under {cgroup_root}"
    for h in hierarchies:
        probe = os.path.join(h.mount, f"vramguard-probe-{secrets.token_hex(4)}")
        try:
            os.mkdir(probe)
            os.rmdir(probe)
        except OSError as e:
            return f"cannot create a cgroup in {h.mount}: {e.strerror}"
    return None


# ----------------------------------------------------------------------------------------------------------
# Layout: the names the kubelet and the runtimes give their cgroups


def new_pod_uid() -> str:
    """A random pod UID marked as a test one (it starts with TEST_UID_PREFIX)."""
    return TEST_UID_PREFIX + str(uuid.uuid4())[len(TEST_UID_PREFIX) :]


def new_container_id() -> str:
    return secrets.token_hex(32)


def pod_cgroup_path(driver: CgroupDriver | str, qos: QoS | str, pod_uid: str, kind: bool = False) -> str:
    """The pod's cgroup path as /proc/<pid>/cgroup shows it, e.g. "/kubepods/burstable/pod<uid>"."""
    driver, qos = CgroupDriver(driver), QoS(qos)
    if driver is CgroupDriver.SYSTEMD:
        base, prefix = (
            ("/kubelet.slice/kubelet-kubepods.slice", "kubelet-kubepods") if kind else ("/kubepods.slice", "kubepods")
        )
        slug = pod_uid.replace("-", "_")
        if qos is QoS.GUARANTEED:
            return f"{base}/{prefix}-pod{slug}.slice"
        return f"{base}/{prefix}-{qos.value}.slice/{prefix}-{qos.value}-pod{slug}.slice"
    base = "/kubelet/kubepods" if kind else "/kubepods"
    if qos is QoS.GUARANTEED:
        return f"{base}/pod{pod_uid}"
    return f"{base}/{qos.value}/pod{pod_uid}"


def container_leaf(driver: CgroupDriver | str, runtime: Runtime | str, container_id: str, conmon: bool = False) -> str:
    """The container's directory name inside its pod cgroup, e.g. "cri-containerd-<id>.scope"."""
    driver, runtime = CgroupDriver(driver), Runtime(runtime)
    if conmon:
        if runtime is not Runtime.CRIO:
            raise ValueError("only CRI-O runs conmon")
        return f"crio-conmon-{container_id}.scope" if driver is CgroupDriver.SYSTEMD else f"crio-conmon-{container_id}"
    if driver is CgroupDriver.SYSTEMD:
        prefix = {Runtime.CONTAINERD: "cri-containerd", Runtime.CRIO: "crio", Runtime.DOCKER: "docker"}[runtime]
        return f"{prefix}-{container_id}.scope"
    return f"crio-{container_id}" if runtime is Runtime.CRIO else container_id


def _runtime_seen_in_path(driver: CgroupDriver, runtime: Runtime) -> str | None:
    # With cgroupfs, containerd and Docker name the leaf by the bare ID, so the path cannot tell which it was.
    if driver is CgroupDriver.CGROUPFS and runtime is not Runtime.CRIO:
        return None
    return runtime.value


# ----------------------------------------------------------------------------------------------------------
# The cgroups


@dataclass(eq=False)
class _Target:
    """A cgroup (pod or container) that exists in every hierarchy of its owner."""

    owner: KubeletCgroups
    path: str  # as /proc/<pid>/cgroup shows it
    dirs: tuple[str, ...] = field(default=())  # the absolute directory in each hierarchy

    def spawn(self, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """Start `argv` inside this cgroup (see the module docstring); `popen_kwargs` go to Popen."""
        return self.owner.spawn(self, argv, **popen_kwargs)

    def move(self, pid: int) -> None:
        """Move a running process in. It is killed at cleanup like the spawned ones."""
        self.owner.move(self, pid)

    def pids(self) -> list[int]:
        """The processes the kernel lists in this cgroup (in its first hierarchy)."""
        return _read_procs(self.dirs[0])


@dataclass(eq=False)
class PodCgroup(_Target):
    """A pod-level cgroup. Processes spawned here sit in the pod cgroup itself, with no container."""

    uid: str = ""
    qos: QoS = QoS.BURSTABLE

    @property
    def identity(self) -> CgroupIdentity:
        """What parse_cgroup must say about a process in the pod cgroup itself."""
        return CgroupIdentity(pod_uid=self.uid, container_id=None, runtime=None, qos=self.qos.value)

    def container(
        self, container_id: str | None = None, runtime: Runtime | str = Runtime.CONTAINERD
    ) -> ContainerCgroup:
        """Create a container cgroup in this pod (a fresh random ID unless one is given)."""
        return self.owner.container(self, container_id, runtime)

    def conmon(self, container_id: str) -> ContainerCgroup:
        """Create CRI-O's conmon cgroup for a container of this pod (never attributed to the container)."""
        return self.owner.container(self, container_id, Runtime.CRIO, conmon=True)


@dataclass(eq=False)
class ContainerCgroup(_Target):
    pod: PodCgroup | None = None
    container_id: str = ""
    runtime: Runtime = Runtime.CONTAINERD
    conmon: bool = False

    @property
    def identity(self) -> CgroupIdentity | None:
        """What parse_cgroup must say about a process here (None for conmon), for the kubelet whose tree this is
        (kind's for `kind`; for `under`, no kubelet's: it is a look-alike)."""
        assert self.pod is not None
        if self.conmon:
            return None
        return CgroupIdentity(
            pod_uid=self.pod.uid,
            container_id=self.container_id,
            runtime=_runtime_seen_in_path(self.owner.driver, self.runtime),
            qos=self.pod.qos.value,
        )


class KubeletCgroups:
    """Creates kubelet-shaped cgroups, puts real processes in them, and removes it all on close."""

    def __init__(
        self,
        driver: CgroupDriver | str = CgroupDriver.SYSTEMD,
        version: int = 2,
        *,
        kind: bool = False,
        under: str = "",
        cgroup_root: str = DEFAULT_CGROUP_ROOT,
        v1_hierarchies: Sequence[str] = DEFAULT_V1_HIERARCHIES,
    ) -> None:
        if under and (not under.startswith("/") or under.endswith("/")):
            raise ValueError(f"under must be a cgroup path like /user.slice, not {under!r}")
        self.driver = CgroupDriver(driver)
        self.version = version
        self.kind = kind
        self.under = under
        self.hierarchies = find_hierarchies(version, cgroup_root, v1_hierarchies)
        if not self.hierarchies:
            raise RuntimeError(cgroups_unavailable(version, cgroup_root, v1_hierarchies) or "no cgroup hierarchy")
        self._pods: dict[str, PodCgroup] = {}
        self._containers: dict[tuple[str, str], ContainerCgroup] = {}
        self._created: list[str] = []  # directories in creation order, so cleanup can go innermost first
        self._parents: set[str] = set()  # every shared parent directory used, created here or not
        self._owned: set[str] = set()  # pod and container directories: nobody else can be using them
        self._children: list[subprocess.Popen[Any]] = []
        self._closed = False

    # -- context manager ---------------------------------------------------------------------------------

    def __enter__(self) -> KubeletCgroups:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.close()
        except CgroupCleanupError as e:
            if exc is None:
                raise
            # Do not hide the test's own failure behind the cleanup's; still say what leaked.
            warnings.warn(str(e), RuntimeWarning, stacklevel=2)

    # -- building ----------------------------------------------------------------------------------------

    def pod(self, uid: str | None = None, qos: QoS | str = QoS.BURSTABLE) -> PodCgroup:
        """Create (or return) the pod cgroup for `uid` (a fresh test UID unless given)."""
        self._check_open()
        qos = QoS(qos)
        uid = uid or new_pod_uid()
        existing = self._pods.get(uid)
        if existing is not None:
            if existing.qos is not qos:
                raise ValueError(f"pod {uid} already exists with QoS {existing.qos.value}")
            return existing
        path = self.under + pod_cgroup_path(self.driver, qos, uid, self.kind)
        pod = PodCgroup(owner=self, path=path, dirs=self._make(path), uid=uid, qos=qos)
        self._pods[uid] = pod
        return pod

    def container(
        self,
        pod: PodCgroup,
        container_id: str | None = None,
        runtime: Runtime | str = Runtime.CONTAINERD,
        conmon: bool = False,
    ) -> ContainerCgroup:
        """Create (or return) a container cgroup inside `pod`."""
        self._check_open()
        runtime = Runtime(runtime)
        container_id = container_id or new_container_id()
        leaf = container_leaf(self.driver, runtime, container_id, conmon)
        existing = self._containers.get((pod.uid, leaf))
        if existing is not None:
            return existing
        path = f"{pod.path}/{leaf}"
        ctr = ContainerCgroup(
            owner=self,
            path=path,
            dirs=self._make(path),
            pod=pod,
            container_id=container_id,
            runtime=runtime,
            conmon=conmon,
        )
        self._containers[(pod.uid, leaf)] = ctr
        return ctr

    def _make(self, path: str) -> tuple[str, ...]:
        dirs = []
        for h in self.hierarchies:
            target = h.mount + path
            self._mkdirs(h.mount, path)
            self._owned.add(target)
            dirs.append(target)
        return tuple(dirs)

    def _mkdirs(self, mount: str, path: str) -> None:
        parts = [p for p in path.split("/") if p]
        # Another run may remove a shared parent (kubepods.slice) between our mkdirs when it saw it empty: start
        # again from the top, which recreates it.
        for _ in range(10):
            current = mount
            try:
                for i, part in enumerate(parts):
                    current = os.path.join(current, part)
                    if i < len(parts) - 1:
                        self._parents.add(current)
                    try:
                        os.mkdir(current)
                    except FileExistsError:
                        continue
                    self._created.append(current)
                    if i < len(parts) - 1:
                        # Marks the parent as a test-made one, so whichever run finishes last may remove it,
                        # while a real kubelet's kubepods tree (never marked) is never touched.
                        with contextlib.suppress(OSError):
                            os.setxattr(current, _TEST_XATTR, b"1")
                return
            except FileNotFoundError:
                continue
        raise RuntimeError(f"could not create {mount}{path}: a parent kept disappearing")

    # -- processes ---------------------------------------------------------------------------------------

    def spawn(self, target: _Target, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """Start `argv` inside `target`'s cgroup; returns once the kernel lists it there."""
        self._check_open()
        if not argv:
            raise ValueError("argv is empty")
        env = popen_kwargs.get("env")
        search_path = (env if env is not None else os.environ).get("PATH", os.defpath)
        # The shim would report a missing command only as exit status 127; fail the way Popen would instead.
        if shutil.which(argv[0], path=search_path) is None:
            raise FileNotFoundError(f"command not found: {argv[0]!r}")
        procs_files = [os.path.join(d, "cgroup.procs") for d in target.dirs]
        shim = ["/bin/sh", "-c", _SPAWN_SHIM, "vramguard-spawn", *procs_files, "--", *argv]
        child = subprocess.Popen(shim, **popen_kwargs)
        self._children.append(child)

        def placed() -> bool:
            if all(child.pid in _read_procs(d) for d in target.dirs):
                return True
            if child.poll() is not None:
                raise RuntimeError(f"{argv[0]} exited with {child.returncode} before it was in {target.path}")
            return False

        try:
            wait_until(placed, _SPAWN_TIMEOUT_S, what=f"{argv[0]} in {target.path}", interval_s=0.001)
        except WaitTimeout:
            raise TimeoutError(f"{argv[0]} (pid {child.pid}) did not appear in {target.path}") from None
        return child

    def move(self, target: _Target, pid: int) -> None:
        """Move the running process `pid` into `target`'s cgroup in every hierarchy."""
        self._check_open()
        for d in target.dirs:
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(pid))

    # -- cleanup -----------------------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every process in the created cgroups, reap spawned children, remove the directories."""
        if self._closed:
            return
        self._closed = True
        # Only pod and container cgroups: a shared parent (kubepods.slice) may hold another run's processes.
        for d in reversed(self._created):
            if d in self._owned:
                _kill_members(d)
        for child in self._children:
            if child.poll() is None:
                child.kill()
            # A child stuck in uninterruptible sleep must not hang cleanup; the rmdir below reports it.
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=_RMDIR_TIMEOUT_S)
            for stream in (child.stdin, child.stdout, child.stderr):
                if stream is not None:
                    stream.close()
        leaked = []
        for d in reversed(self._created):
            owned = d in self._owned
            if not _rmdir_patiently(d, kill_members=owned) and owned:
                leaked.append(d)
        # Shared parents another (concurrent) run created: the last run to finish removes them, if they are
        # test-made and empty. Deepest first, so a parent is tried after its children.
        for d in sorted(self._parents - set(self._created), key=lambda p: p.count("/"), reverse=True):
            if _is_test_made(d):
                with contextlib.suppress(OSError):
                    os.rmdir(d)
        if leaked:
            raise CgroupCleanupError("could not remove cgroups: " + ", ".join(leaked))

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("KubeletCgroups is closed")


# ----------------------------------------------------------------------------------------------------------
# Helpers


def device_holder_argv(device_path: str, children: int = 0, seconds: int = 3600) -> list[str]:
    """A command that holds `device_path` open (as a GPU process holds /dev/nvidia0) and sleeps.

    With `children`, it first forks that many sleeping children that inherit the open file, the way a
    DataLoader worker inherits the CUDA device, and prints their PIDs one per line (pass
    ``stdout=subprocess.PIPE`` to `spawn` to read them). Tests on machines without a GPU point it at a
    temporary file and give the killer that file's path as its device prefix.
    """
    script = 'exec 3<"$1"; i=0; while [ "$i" -lt "$2" ]; do sleep "$3" & echo $!; i=$((i + 1)); done; exec sleep "$3"'
    return ["/bin/sh", "-c", script, "vramguard-holder", device_path, str(children), str(seconds)]


def _is_test_made(path: str) -> bool:
    try:
        return os.getxattr(path, _TEST_XATTR) == b"1"
    except OSError:
        return False


def _read_procs(cgroup_dir: str) -> list[int]:
    try:
        with open(os.path.join(cgroup_dir, "cgroup.procs")) as f:
            return [int(line) for line in f.read().split()]
    except (OSError, ValueError):
        return []


def _kill_members(cgroup_dir: str) -> None:
    """SIGKILL every process in the cgroup and its children cgroups."""
    kill_file = os.path.join(cgroup_dir, "cgroup.kill")
    if os.path.exists(kill_file):
        # v2 (Linux 5.14+): the kernel kills the whole subtree atomically, so no PID can be mistaken.
        try:
            with open(kill_file, "w") as f:
                f.write("1")
            return
        except OSError:
            pass
    for pid in _read_procs(cgroup_dir):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            # The pidfd pins one process. If the PID is still listed now, that process is the member (a live
            # PID is unique); if it died meanwhile, signalling the pidfd cannot reach a recycled PID's owner.
            if pid in _read_procs(cgroup_dir):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(pidfd)


def _rmdir_patiently(path: str, kill_members: bool) -> bool:
    """rmdir, retrying while the cgroup is busy (tasks still exiting); True when the directory is gone.

    A shared parent that is busy belongs to someone else's run as well: it is left alone, not waited for.
    """
    deadline = time.monotonic() + _RMDIR_TIMEOUT_S
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            # Busy: either a child cgroup that is someone else's (a shared parent), or tasks still exiting.
            if not kill_members or any(entry.is_dir() for entry in os.scandir(path)):
                return False
            if time.monotonic() > deadline:
                return False
            _kill_members(path)
            time.sleep(0.01)


def remove_stale_test_cgroups(
    uid_prefix: str = TEST_UID_PREFIX,
    min_age_s: float = 600.0,
    cgroup_root: str = DEFAULT_CGROUP_ROOT,
    v1_hierarchies: Sequence[str] = DEFAULT_V1_HIERARCHIES,
) -> list[str]:
    """Remove the empty cgroups of test pods a crashed run left behind; returns those still there (busy).

    Touches only pod cgroups whose UID starts with `uid_prefix` (TEST_UID_PREFIX marks every UID this module
    makes), that are older than `min_age_s` (so a concurrent run's fresh, still empty pod is not pulled from
    under it), and that hold no process: rmdir refuses a cgroup with members, and nothing is killed.
    """
    busy: list[str] = []
    now = time.time()
    hierarchies = find_hierarchies(2, cgroup_root) + find_hierarchies(1, cgroup_root, v1_hierarchies)
    for h in hierarchies:
        # The kubelet's trees, kind's, and where the look-alikes (`under`) go.
        for top in ("kubepods.slice", "kubepods", "kubelet.slice", "kubelet", "user.slice", "docker"):
            for dirpath, _, _ in os.walk(os.path.join(h.mount, top), topdown=False):
                name = os.path.basename(dirpath)
                if not (name.startswith(f"pod{uid_prefix}") or f"-pod{uid_prefix.replace('-', '_')}" in name):
                    continue
                try:
                    if now - os.stat(dirpath).st_mtime < min_age_s:
                        continue
                    for entry in os.scandir(dirpath):
                        if entry.is_dir():
                            _rmdir_tree(entry.path)
                    os.rmdir(dirpath)
                except OSError:
                    busy.append(dirpath)
    return busy


def _rmdir_tree(path: str) -> None:
    for entry in os.scandir(path):
        if entry.is_dir():
            _rmdir_tree(entry.path)
    os.rmdir(path)
