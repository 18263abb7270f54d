"""SIGKILL the GPU processes of a violating container, all of them, without ever hitting a recycled PID.

`PidfdKiller` takes the processes NVML reported and every other process of the container holding a GPU device
file, freezes the container's cgroup while it lists them (`freezer.Freezer`), and signals each through a pidfd
opened before its identity is checked, in rounds until none is left. Requires the host's PID namespace
(``hostPID: true``). Why each step: `docs/architecture.md` "Killing a container's GPU processes".
"""

from __future__ import annotations

import errno
import os
import signal
from dataclasses import dataclass, field

from vramguard.base.clock import SYSTEM_CLOCK, UNINTERRUPTED, Clock
from vramguard.core.actions import KillTarget
from vramguard.core.ports import KillResult
from vramguard.core.process import UNKNOWN_START_TIME, ProcessRef
from vramguard.node.cgroup import HOST_KUBELET, ContainerCgroup, KubeletTree, find_container_cgroup, parse_cgroup
from vramguard.node.freezer import Freezer
from vramguard.node.freezes import FreezeJournal
from vramguard.node.identify import device_holders
from vramguard.node.procfs import (
    EXITED_STATES,
    FdRetry,
    holds_device,
    list_pids,
    read_cgroup,
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


@dataclass(slots=True)
class _Run:
    """The state of one kill()."""

    pod_uid: str
    container_ids: frozenset[str]
    kubelet: KubeletTree
    deadline: float
    io: FdRetry  # every call that opens a file: out of fds, it waits a little (`_FD_WAIT_S` per kill in all)
    every_process: bool = False  # every process of the containers, not only the device holders
    killed: list[ProcessRef] = field(default_factory=list)  # in signalling order
    last_killed: dict[int, ProcessRef] = field(default_factory=dict)  # by PID: the latest process signalled there
    skipped: dict[ProcessRef, str] = field(default_factory=dict)
    pending: list[ProcessRef] = field(default_factory=list)  # signalled, not yet seen to exit
    # PIDs never signalled in this kill: a sampled ref found recycled there. The newcomer is left to the next
    # scan rather than killed on the strength of a sample that was about someone else.
    spared: set[int] = field(default_factory=set)

    def belongs(self, cgroup_text: str) -> bool:
        """Whether the process is in a violating container, in the kubelet's tree (a look-alike never is)."""
        identity = parse_cgroup(cgroup_text, self.kubelet)
        return identity is not None and identity.pod_uid == self.pod_uid and identity.container_id in self.container_ids


@dataclass(slots=True)
class _Sweep:
    """What one look at the violating containers found."""

    signalled: int = 0
    left: dict[int, ProcessRef] = field(default_factory=dict)  # live holders not signalled (yet), by PID
    complete: bool = True  # False when some listing or membership could not be read


class PidfdKiller:
    """The `Killer` that freezes, lists, verifies and signals through pidfds (`docs/architecture.md` "Finishing the
    job").

    `proc_root` must be the host's /proc as the agent sees it (hostPID); `cgroup_root` the host's cgroup
    filesystem (``/sys/fs/cgroup``, or wherever the DaemonSet mounts it, e.g. ``/host/sys/fs/cgroup``): without
    it the killer still works, by rounds of /proc walks, but cannot freeze. `device_prefix` names the GPU
    device files (tests stand a temporary file in); `self_pid` the process never to signal or freeze;
    `journal` where each freeze is written down first: without one, nothing is frozen (the rounds alone); it
    must be given this `cgroup_root`, or it refuses to record (and nothing is frozen either). `kubelet`: where
    this node's kubelet makes pod cgroups; a process is signalled only in a violating container there.
    """

    def __init__(
        self,
        proc_root: str = "/proc",
        *,
        cgroup_root: str = "/sys/fs/cgroup",
        device_prefix: str | tuple[str, ...] = "/dev/nvidia",
        self_pid: int | None = None,
        exit_timeout_s: float = 5.0,
        freeze_timeout_s: float = 1.0,
        max_rounds: int = 5,
        journal: FreezeJournal | None = None,
        clock: Clock = SYSTEM_CLOCK,
        kubelet: KubeletTree = HOST_KUBELET,
    ) -> None:
        self.clock = clock
        self._kubelet = kubelet
        self._proc_root = proc_root.rstrip("/") or "/"
        self._cgroup_root = cgroup_root.rstrip("/") or "/"
        self._device_prefix = device_prefix
        self._self_pid = os.getpid() if self_pid is None else self_pid
        self._exit_timeout_s = exit_timeout_s
        self._max_rounds = max(1, max_rounds)
        self._freezer = Freezer(journal, self._self_pid, clock, freeze_timeout_s)

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
            holders = device_holders(
                self._proc_root, target.pod_uid, set(target.container_ids), self._device_prefix, self._kubelet
            )
            found = [r for r in holders if r.pid not in sampled_pids]
            candidates = sorted([*sampled, *found], key=lambda r: r.pid)
            return KillResult(killed=(), skipped=tuple((r, SKIP_PID_NAMESPACE) for r in candidates), exited=True)
        run = _Run(
            pod_uid=target.pod_uid,
            container_ids=frozenset(target.container_ids),
            kubelet=self._kubelet,
            deadline=self.clock.now() + self._exit_timeout_s,
            io=FdRetry(self.clock, _FD_WAIT_S),
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
                text = run.io(read_cgroup, ref.pid, self._proc_root) if ref.pid > 1 else None
            except OSError:
                text = None  # the check before signalling will say why
            if text is not None and run.belongs(text):
                identity = parse_cgroup(text, run.kubelet)
                assert identity is not None and identity.container_id is not None
                container_id = identity.container_id
                if container_id not in located:
                    self._locate(run, text, ref.pid, located)
            by_container.setdefault(container_id, []).append(ref)
        return by_container

    def _locate(self, run: _Run, text: str, pid: int, located: dict[str, ContainerCgroup]) -> None:
        try:
            found = run.io(
                find_container_cgroup, text, pid, run.pod_uid, run.container_ids, self._cgroup_root, run.kubelet
            )
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
            with self._freezer.members(cgroup, run.deadline, run.io) as members:
                for ref in sampled.get(container_id, ()):
                    self._consider(run, sweep, ref, sampled=True, kill=kill)
                if members is None:
                    sweep.complete = False
                    continue
                for pid in members:
                    self._consider_pid(run, sweep, pid, kill=kill)
        # Containers without a directory (no cgroup filesystem, or not found there): walk /proc; processes whose
        # container is unknown are checked too. Each is signalled only if its cgroup, read again right before
        # (`_verify`), is a violating container's in the kubelet's tree: a look-alike elsewhere never is.
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
            pids = run.io(list_pids, self._proc_root)
        except OSError:
            sweep.complete = False
            return
        # The systemd driver writes the UID with "_"; a substring test skips most processes without parsing.
        needles = (run.pod_uid, run.pod_uid.replace("-", "_"))
        for pid in pids:
            try:
                text = run.io(read_cgroup, pid, self._proc_root)
            except OSError:
                sweep.complete = False  # it might be one of them
                continue
            if text is None or not any(n in text for n in needles) or not run.belongs(text):
                continue
            identity = parse_cgroup(text, run.kubelet)
            if identity is None or identity.container_id not in container_ids:
                continue
            if identity.container_id not in located:
                self._locate(run, text, pid, located)
            self._consider_pid(run, sweep, pid, kill=kill)

    def _consider_pid(self, run: _Run, sweep: _Sweep, pid: int, kill: bool) -> None:
        """A process listed in a violating container: signal it if it holds the device (or if every process goes)."""
        killed = run.last_killed.get(pid)
        try:
            holds = run.every_process or run.io(holds_device, pid, self._proc_root, self._device_prefix)
            state = run.io(read_stat, pid, self._proc_root) if holds else None
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
            pidfd = run.io(os.pidfd_open, ref.pid)
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
            state = run.io(read_stat, ref.pid, self._proc_root)
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
            text = run.io(read_cgroup, ref.pid, self._proc_root)
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
