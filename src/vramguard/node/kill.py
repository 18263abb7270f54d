"""SIGKILL the GPU processes of a violating container, all of them, without ever hitting a recycled PID.

`PidfdKiller` takes the processes NVML reported and every other process of the container holding a GPU device
file, freezes the container's cgroup while it lists them, and signals each through a pidfd opened before its
identity is checked. Requires the host's PID namespace (``hostPID: true``). Why each step: `docs/design.md`
"Killing a container's GPU processes".
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from vramguard.base.clock import SYSTEM_CLOCK, UNINTERRUPTED, Clock
from vramguard.core.model import UNKNOWN_START_TIME, KillTarget, ProcessRef
from vramguard.core.ports import KillResult
from vramguard.node.cgroup import (
    cgroup_lines,
    container_cgroup_path,
    parse_cgroup,
    parse_cgroup_path,
    pod_cgroups,
    v2_root,
)
from vramguard.node.freezes import FreezeJournal
from vramguard.node.procfs import (
    EXITED_STATES,
    holds_device,
    list_pids,
    read_cgroup,
    read_small,
    read_stat,
    same_pid_namespace,
)

# Why a candidate was not signalled (KillResult.skipped reasons).
SKIP_INVALID_PID = "pid 0 or 1 is never signalled"
SKIP_SELF = "the agent itself"
SKIP_GONE = "process gone"
SKIP_EXITED = "process already exited"
SKIP_PID_REUSED = "start time differs from the sampled one: the PID was reused"
SKIP_NOT_IN_CONTAINER = "no longer in a violating container"
SKIP_NOT_A_PROCESS = "not a process leader (a thread ID?)"
SKIP_DENIED = "permission denied"
SKIP_PID_NAMESPACE = "proc root shows another PID namespace than the agent's"
# A prefix: the reason goes on with what could not be read and why ("cannot read the process: stat: Too many
# open files"). Such a process may well be alive: it is never reported gone.
SKIP_UNREADABLE = "cannot read the process"

# Skips after which the process is known not to be (or no longer be) a live holder of the container.
_SETTLED_SKIPS = frozenset(
    {SKIP_INVALID_PID, SKIP_GONE, SKIP_EXITED, SKIP_PID_REUSED, SKIP_NOT_IN_CONTAINER, SKIP_NOT_A_PROCESS}
)

# Total time one kill may spend waiting for fds to free up (EMFILE/ENFILE), across all its retries.
_FD_WAIT_S = 0.5
_FD_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})

_T = TypeVar("_T")


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

    The v2 hierarchy is tried first (`cgroup.v2_root`), then v1's freezer (under `cgroup_root`/freezer). In each,
    the path the process names must be one of `container_ids` of `pod_uid`; that container's directory is then
    found from the mount's root (`cgroup.pod_cgroups`) and accepted only if its ``cgroup.procs`` (or that of the
    sub-cgroup the path continues into) lists `pid`.
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


@dataclass(slots=True)
class _Run:
    """The state of one kill()."""

    pod_uid: str
    container_ids: frozenset[str]
    deadline: float
    every_process: bool = False  # every process of the containers, not only the device holders
    fd_wait_left_s: float = _FD_WAIT_S
    killed: list[ProcessRef] = field(default_factory=list)  # in signalling order
    last_killed: dict[int, ProcessRef] = field(default_factory=dict)  # by PID: the latest process signalled there
    skipped: dict[ProcessRef, str] = field(default_factory=dict)
    pending: list[ProcessRef] = field(default_factory=list)  # signalled, not yet seen to exit
    # PIDs never signalled in this kill: a sampled ref found recycled there. The newcomer is left to the next
    # scan rather than killed on the strength of a sample that was about someone else.
    spared: set[int] = field(default_factory=set)

    def belongs(self, cgroup_text: str) -> bool:
        identity = parse_cgroup(cgroup_text)
        return identity is not None and identity.pod_uid == self.pod_uid and identity.container_id in self.container_ids


@dataclass(slots=True)
class _Sweep:
    """What one look at the violating containers found."""

    signalled: int = 0
    left: dict[int, ProcessRef] = field(default_factory=dict)  # live holders not signalled (yet), by PID
    complete: bool = True  # False when some listing or membership could not be read


class PidfdKiller:
    """The `Killer` that freezes, lists, verifies and signals through pidfds (`docs/design.md` "Finishing the job").

    `proc_root` must be the host's /proc as the agent sees it (hostPID); `cgroup_root` the host's cgroup
    filesystem (``/sys/fs/cgroup``, or wherever the DaemonSet mounts it, e.g. ``/host/sys/fs/cgroup``): without
    it the killer still works, by rounds of /proc walks, but cannot freeze. `device_prefix` names the GPU
    device files (tests stand a temporary file in); `self_pid` the process never to signal or freeze;
    `journal` where each freeze is written down first: without one, nothing is frozen (the rounds alone); it
    must be given this `cgroup_root`, or it refuses to record (and nothing is frozen either).
    """

    def __init__(
        self,
        proc_root: str = "/proc",
        *,
        cgroup_root: str = "/sys/fs/cgroup",
        device_prefix: str = "/dev/nvidia",
        self_pid: int | None = None,
        exit_timeout_s: float = 5.0,
        freeze_timeout_s: float = 1.0,
        max_rounds: int = 5,
        journal: FreezeJournal | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.clock = clock
        self._proc_root = proc_root.rstrip("/") or "/"
        self._cgroup_root = cgroup_root.rstrip("/") or "/"
        self._device_prefix = device_prefix
        self._self_pid = os.getpid() if self_pid is None else self_pid
        self._exit_timeout_s = exit_timeout_s
        self._freeze_timeout_s = freeze_timeout_s
        self._max_rounds = max(1, max_rounds)
        self._journal = journal

    def kill(self, target: KillTarget, every_process: bool = False) -> KillResult:
        """SIGKILL the target containers' GPU processes (all their processes, with `every_process`) until none
        is left, or the rounds or time run out.

        `killed`: every process signalled; `skipped`: every one not signalled, with the reason; `exited`: every
        signalled process was seen to exit before the deadline (False as well when the last look at the
        containers could not be completed); `remaining`: live processes of the containers still holding the
        device at the end, which the killer did not signal (not allowed, unreadable, or found too late).
        """
        sampled = _dedupe(target.processes)
        if not same_pid_namespace(self._proc_root):
            sampled_pids = {r.pid for r in sampled}
            found = [r for r in self._foreign_holders(target) if r.pid not in sampled_pids]
            candidates = sorted([*sampled, *found], key=lambda r: r.pid)
            return KillResult(killed=(), skipped=tuple((r, SKIP_PID_NAMESPACE) for r in candidates), exited=True)
        run = _Run(
            pod_uid=target.pod_uid,
            container_ids=frozenset(target.container_ids),
            deadline=self.clock.now() + self._exit_timeout_s,
            every_process=every_process,
        )
        located: dict[str, ContainerCgroup] = {}
        by_container = self._sort_sampled(run, sampled, located)
        sweep = _Sweep()
        for round_no in range(self._max_rounds):
            sweep = self._sweep(run, located, by_container if round_no == 0 else {}, kill=True)
            self._wait_for_exit(run)
            if sweep.signalled == 0 or self.clock.now() >= run.deadline:
                break
        if sweep.signalled:
            # The last round signalled someone: look once more, without signalling, at what is left.
            sweep = self._sweep(run, located, {}, kill=False)
        remaining = dict(sweep.left)
        # A sampled process that could not be checked or signalled may still hold the memory NVML counted.
        for ref in sampled:
            reason = run.skipped.get(ref)
            if reason is None or reason in _SETTLED_SKIPS or reason == SKIP_SELF:
                continue
            if ref.pid not in run.last_killed and _may_be_alive(ref, self._proc_root):
                remaining.setdefault(ref.pid, ref)
        return KillResult(
            killed=tuple(sorted(run.killed)),
            skipped=tuple(sorted(run.skipped.items())),
            exited=not run.pending and sweep.complete,
            remaining=tuple(sorted(remaining.values())),
        )

    # ------------------------------------------------------------------------------------------------------
    # Finding the processes

    def _sort_sampled(
        self, run: _Run, sampled: list[ProcessRef], located: dict[str, ContainerCgroup]
    ) -> dict[str | None, list[ProcessRef]]:
        """The sampled refs by the violating container they are in now (None: another, or unknown), and the
        cgroup directory of each container one of them is in."""
        by_container: dict[str | None, list[ProcessRef]] = {}
        for ref in sampled:
            container_id = None
            try:
                text = self._io(run, read_cgroup, ref.pid, self._proc_root) if ref.pid > 1 else None
            except OSError:
                text = None  # the check before signalling will say why
            if text is not None and run.belongs(text):
                identity = parse_cgroup(text)
                assert identity is not None and identity.container_id is not None
                container_id = identity.container_id
                if container_id not in located:
                    self._locate(run, text, ref.pid, located)
            by_container.setdefault(container_id, []).append(ref)
        return by_container

    def _locate(self, run: _Run, text: str, pid: int, located: dict[str, ContainerCgroup]) -> None:
        try:
            found = self._io(run, find_container_cgroup, text, pid, run.pod_uid, run.container_ids, self._cgroup_root)
        except OSError:
            return
        if found is not None:
            located.setdefault(found.container_id, found)

    def _sweep(
        self, run: _Run, located: dict[str, ContainerCgroup], sampled: dict[str | None, list[ProcessRef]], kill: bool
    ) -> _Sweep:
        """Look at every violating container once: signal (when `kill`) each live device holder not yet
        signalled, sampled ones first; report the holders left."""
        sweep = _Sweep()
        for container_id, cgroup in sorted(located.items()):
            with self._maybe_frozen(run, cgroup) as members:
                for ref in sampled.get(container_id, ()):
                    self._consider(run, sweep, ref, sampled=True, kill=kill)
                if members is None:
                    sweep.complete = False
                    continue
                for pid in members:
                    self._consider_pid(run, sweep, pid, kill=kill)
        # Containers without a directory: walk /proc; processes whose container is unknown are checked too.
        unlocated = run.container_ids - located.keys()
        for key, refs in sampled.items():
            if key is None or key in unlocated:
                for ref in refs:
                    self._consider(run, sweep, ref, sampled=True, kill=kill)
        if unlocated:
            self._walk(run, sweep, unlocated, located, kill=kill)
        return sweep

    def _walk(
        self, run: _Run, sweep: _Sweep, container_ids: frozenset[str], located: dict[str, ContainerCgroup], kill: bool
    ) -> None:
        """Every process of `container_ids` found by walking /proc; locates their cgroups for the next round."""
        try:
            pids = self._io(run, list_pids, self._proc_root)
        except OSError:
            sweep.complete = False
            return
        # The systemd driver writes the UID with "_"; a substring test skips most processes without parsing.
        needles = (run.pod_uid, run.pod_uid.replace("-", "_"))
        for pid in pids:
            try:
                text = self._io(run, read_cgroup, pid, self._proc_root)
            except OSError:
                sweep.complete = False  # it might be one of them
                continue
            if text is None or not any(n in text for n in needles) or not run.belongs(text):
                continue
            identity = parse_cgroup(text)
            if identity is None or identity.container_id not in container_ids:
                continue
            if identity.container_id not in located:
                self._locate(run, text, pid, located)
            self._consider_pid(run, sweep, pid, kill=kill)

    def _consider_pid(self, run: _Run, sweep: _Sweep, pid: int, kill: bool) -> None:
        """A process listed in a violating container: signal it if it holds the device (or if every process goes)."""
        killed = run.last_killed.get(pid)
        try:
            holds = run.every_process or self._io(run, holds_device, pid, self._proc_root, self._device_prefix)
            state = self._io(run, read_stat, pid, self._proc_root) if holds else None
        except OSError as e:
            # It may hold the GPU: it counts as left unless it is one already signalled.
            ref = ProcessRef(pid, killed.start_time if killed is not None else UNKNOWN_START_TIME)
            if killed is None:
                run.skipped[ref] = f"{SKIP_UNREADABLE}: {e.strerror or e}"
                sweep.left[pid] = ref
            return
        if not holds or state is None or state[0] in EXITED_STATES:
            return
        ref = ProcessRef(pid, state[1])
        if killed is not None and killed == ref:
            return  # signalled already, still exiting (it is waited for, not signalled twice)
        if pid in run.spared or not kill:
            sweep.left[pid] = ref
            return
        self._consider(run, sweep, ref, sampled=False, kill=True)

    def _consider(self, run: _Run, sweep: _Sweep, ref: ProcessRef, sampled: bool, kill: bool) -> None:
        if not kill or run.last_killed.get(ref.pid) == ref:
            return
        if ref in run.skipped and run.skipped[ref] in _SETTLED_SKIPS:
            return
        reason = self._signal(run, ref)
        if reason is None:
            run.killed.append(ref)
            run.last_killed[ref.pid] = ref
            run.pending.append(ref)
            sweep.signalled += 1
            run.skipped.pop(ref, None)  # an earlier round may have found it unreadable
            run.skipped.pop(ProcessRef(ref.pid, UNKNOWN_START_TIME), None)
            return
        run.skipped[ref] = reason
        if sampled and reason == SKIP_PID_REUSED:
            run.spared.add(ref.pid)
        if not sampled and reason not in _SETTLED_SKIPS:
            sweep.left[ref.pid] = ref

    def _foreign_holders(self, target: KillTarget) -> list[ProcessRef]:
        """Device holders of the target, read from a /proc of another namespace (only to report them)."""
        container_ids = frozenset(target.container_ids)
        found = []
        try:
            pids = list_pids(self._proc_root)
        except OSError:
            return []
        for pid in pids:
            try:  # this list only reports: an unreadable process is left out of it
                text = read_cgroup(pid, self._proc_root)
                identity = parse_cgroup(text) if text is not None else None
                if identity is None or identity.pod_uid != target.pod_uid:
                    continue
                if identity.container_id not in container_ids:
                    continue
                if holds_device(pid, self._proc_root, self._device_prefix):
                    state = read_stat(pid, self._proc_root)
                    if state is not None:
                        found.append(ProcessRef(pid, state[1]))
            except OSError:
                continue
        return sorted(found)

    # ------------------------------------------------------------------------------------------------------
    # Freezing

    @contextmanager
    def _maybe_frozen(self, run: _Run, cgroup: ContainerCgroup) -> Iterator[list[int] | None]:
        """Freeze the container if possible, yield its processes (None if they cannot be listed), thaw.

        A container that cannot be frozen (read-only cgroupfs, the agent inside, already frozen by someone
        else, no journal to record the freeze in) is listed all the same: the rounds make up for a list that is
        not complete.
        """
        try:
            before = self._io(run, _read_members, cgroup.directory)
        except OSError:
            before = None
        if before is None or {os.getpid(), self._self_pid} & set(before) or self._journal is None:
            yield before  # never freeze the agent (or what stands for it) with its victims, nor unrecorded
            return
        name, frozen_value, thawed_value = (
            ("cgroup.freeze", b"1", b"0") if cgroup.v2 else ("freezer.state", b"FROZEN", b"THAWED")
        )
        control = f"{cgroup.directory}/{name}"
        try:
            # Opened first and kept until the thaw, so that thawing cannot fail for want of an fd.
            fd = self._io(run, os.open, control, os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            yield before
            return
        try:
            try:
                already = self._io(run, read_small, control).strip() in (frozen_value, b"FREEZING")
            except OSError:
                already = True  # unknown: do not touch (and never thaw) what someone else may have frozen
            wrote = False
            entry = None
            if not already:
                try:
                    entry = self._journal.record(cgroup.directory, cgroup.v2)  # no record, no freeze
                    os.write(fd, frozen_value)
                    wrote = True
                except (OSError, ValueError):
                    pass  # ValueError: a cgroup the next agent's journal would refuse to thaw is never frozen
            try:
                if wrote:
                    self._wait_frozen(run, cgroup)
                try:
                    members = self._io(run, _read_members, cgroup.directory)
                except OSError:
                    members = None
                yield members
            finally:
                if wrote:
                    _thaw(fd, thawed_value, control)  # raises if it fails: the entry stays for the next start
                if entry is not None:
                    self._journal.forget(entry)
        finally:
            os.close(fd)

    def _wait_frozen(self, run: _Run, cgroup: ContainerCgroup) -> bool:
        """Wait (at most `freeze_timeout_s`, never past the kill's deadline) until the kernel reports every task of
        the cgroup frozen. A task in uninterruptible sleep can hold that up: the list is then taken anyway."""
        deadline = min(self.clock.now() + self._freeze_timeout_s, run.deadline)
        delay = 0.0002
        while True:
            try:
                if cgroup.v2:
                    if b"frozen 1" in self._io(run, read_small, f"{cgroup.directory}/cgroup.events"):
                        return True
                elif self._io(run, read_small, f"{cgroup.directory}/freezer.state").strip() == b"FROZEN":
                    return True
            except OSError:
                return False
            if self.clock.now() >= deadline:
                return False
            self.clock.wait(UNINTERRUPTED, delay)
            delay = min(delay * 2, 0.01)

    # ------------------------------------------------------------------------------------------------------
    # Signalling

    def _signal(self, run: _Run, ref: ProcessRef) -> str | None:
        """Open a pidfd, verify through /proc, SIGKILL through the pidfd, close it. None when signalled, else
        why not."""
        if ref.pid <= 1:
            return SKIP_INVALID_PID
        if ref.pid == self._self_pid:
            return SKIP_SELF
        try:
            pidfd = self._io(run, os.pidfd_open, ref.pid)
        except ProcessLookupError:
            return SKIP_GONE
        except OSError as e:
            if e.errno == errno.EINVAL:
                return SKIP_NOT_A_PROCESS
            return f"{SKIP_UNREADABLE}: pidfd_open: {e.strerror}"
        try:
            reason = self._verify(run, ref)
            if reason is None:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            return reason
        except ProcessLookupError:
            return SKIP_GONE
        except PermissionError:
            return SKIP_DENIED
        except OSError as e:
            return f"pidfd_send_signal failed: {e.strerror}"
        finally:
            os.close(pidfd)

    def _verify(self, run: _Run, ref: ProcessRef) -> str | None:
        """Why the process now at ref.pid must not be signalled, or None. Called with its pidfd open."""
        try:
            state = self._io(run, read_stat, ref.pid, self._proc_root)
        except OSError as e:
            return f"{SKIP_UNREADABLE}: stat: {e.strerror or e}"
        if state is None:
            return SKIP_GONE
        letter, start_time = state
        if start_time != ref.start_time:
            return SKIP_PID_REUSED
        # A zombie holds no memory any more, and v1 already shows it at the root: report it, don't "kill" it.
        if letter in EXITED_STATES:
            return SKIP_EXITED
        try:
            text = self._io(run, read_cgroup, ref.pid, self._proc_root)
        except OSError as e:
            return f"{SKIP_UNREADABLE}: cgroup: {e.strerror or e}"
        if text is None:
            return SKIP_GONE
        if not run.belongs(text):
            return SKIP_NOT_IN_CONTAINER
        return None

    def _wait_for_exit(self, run: _Run) -> None:
        """Poll /proc until every signalled process has exited (gone, a zombie, or its PID taken by another
        process), or the deadline passes. Holds no fd in between: a pidfd per victim is what ran the agent out
        of fds."""
        delay = 0.0005
        while run.pending:
            still = []
            for ref in run.pending:
                try:
                    state = read_stat(ref.pid, self._proc_root)
                except OSError:
                    still.append(ref)  # unreadable is not exited
                    continue
                if state is not None and state[1] == ref.start_time and state[0] not in EXITED_STATES:
                    still.append(ref)
            run.pending = still
            if not still or self.clock.now() >= run.deadline:
                return
            self.clock.wait(UNINTERRUPTED, delay)
            delay = min(delay * 2, 0.01)

    def _io(self, run: _Run, fn: Callable[..., _T], *args: object) -> _T:
        """Call `fn`; on EMFILE/ENFILE wait a little and try again, while the kill's fd-wait budget lasts."""
        delay = 0.001
        while True:
            try:
                return fn(*args)
            except OSError as e:
                if e.errno not in _FD_ERRNOS or run.fd_wait_left_s <= 0:
                    raise
            pause = min(delay, run.fd_wait_left_s)
            self.clock.wait(UNINTERRUPTED, pause)
            run.fd_wait_left_s -= pause
            delay = min(delay * 2, 0.05)


# ----------------------------------------------------------------------------------------------------------
# Helpers


def _dedupe(refs: tuple[ProcessRef, ...]) -> list[ProcessRef]:
    # A PID sampled twice (two devices, two NVML lists) is one candidate; keep the first identity.
    by_pid: dict[int, ProcessRef] = {}
    for ref in refs:
        by_pid.setdefault(ref.pid, ref)
    return [by_pid[pid] for pid in sorted(by_pid)]


def _may_be_alive(ref: ProcessRef, proc_root: str) -> bool:
    try:
        state = read_stat(ref.pid, proc_root)
    except OSError:
        return True
    return state is not None and state[0] not in EXITED_STATES


def _read_procs(directory: str) -> list[int]:
    with open(f"{directory}/cgroup.procs", "rb") as f:
        return [int(line) for line in f.read().split()]


def _read_procs_or_nothing(directory: str) -> list[int]:
    """cgroup.procs of a directory that may not exist (a guess); raises only when out of fds (to be retried)."""
    try:
        return _read_procs(directory)
    except OSError as e:
        if e.errno in _FD_ERRNOS:
            raise
        return []
    except ValueError:
        return []


def _read_members(directory: str) -> list[int]:
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


def _thaw(fd: int, thawed_value: bytes, control: str) -> None:
    """Write the thawed state; a cgroup removed meanwhile needs no thaw. Anything else raises: a container left
    frozen must not go unnoticed."""
    for attempt in range(3):
        try:
            os.write(fd, thawed_value)
            return
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENODEV):
                return
            if attempt == 2:
                raise RuntimeError(f"could not thaw {control}: {e.strerror}") from e
            SYSTEM_CLOCK.wait(UNINTERRUPTED, 0.01)  # a pause between writes, not a deadline: real time
