"""SIGKILL the GPU processes of a violating container without ever hitting a recycled PID.

Which processes: the ones NVML reported for the violation (its `processes`, each with the start time it had
when sampled), plus every other process of the violating containers that holds an open GPU device file. GPU
memory is freed only when the last holder of /dev/nvidia* exits, and a forked child (a DataLoader worker, a
shell that spawned the trainer) keeps it alive without NVML necessarily listing it. A process of the container
that holds no device file is left alone: it holds no GPU memory, and the container's restart (or the next
scan) takes care of the rest. That keeps the blast radius to what frees the memory.

How, for each candidate:

1. ``os.pidfd_open(pid)``: the fd now refers to one process, whatever later happens to the number;
2. through /proc/<pid>, check that its start time is the expected one and that its cgroup still names the
   violating pod and one of the violating containers;
3. ``signal.pidfd_send_signal(fd, SIGKILL)``.

Why checking /proc *after* opening the pidfd is enough: call P the process the pidfd refers to. If P is still
alive when the signal is sent, it was alive during the checks in step 2 (a process does not come back), and
while P is alive no other process can have its PID, so /proc/<pid> described P: the checks were about P. If P
died at any point after step 1, the kernel answers the signal with ESRCH and nothing is sent, even if the number
now belongs to someone else. Opening first and checking second closes the window that kill(pid) has (check,
PID recycled, signal hits the newcomer). The start time comparison is what rejects a PID that was already
recycled between the NVML sample and step 1. (Start times count clock ticks, so a PID reused within the same
tick would pass it; that needs the whole PID space to wrap within ~10 ms.)

This requires the PID numbers of `proc_root` to be the agent's own (``hostPID: true`` and the host's /proc);
the killer checks that and signals nothing otherwise.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import time
from dataclasses import dataclass

from vramguard.cgroup import parse_cgroup
from vramguard.model import ProcessRef, Violation
from vramguard.ports import KillResult
from vramguard.procfs import (
    holds_nvidia_device,
    list_pids,
    read_cgroup_text_tolerant,
    read_state_and_start_time,
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


@dataclass(frozen=True, slots=True)
class _Candidate:
    ref: ProcessRef
    sampled: bool  # reported by NVML; otherwise found holding a device file


class PidfdKiller:
    """The `Killer` that signals through pidfds after re-checking each process's identity (see module doc)."""

    def __init__(
        self,
        proc_root: str = "/proc",
        *,
        device_prefix: str = "/dev/nvidia",
        self_pid: int | None = None,
        exit_timeout_s: float = 5.0,
    ) -> None:
        self._proc_root = proc_root
        self._device_prefix = device_prefix
        self._self_pid = os.getpid() if self_pid is None else self_pid
        self._exit_timeout_s = exit_timeout_s

    def kill(self, violation: Violation) -> KillResult:
        """SIGKILL the violation's GPU processes; report each one signalled or skipped, and whether all exited."""
        candidates = self._candidates(violation)
        if not self._same_pid_namespace():
            return KillResult(killed=(), skipped=tuple((c.ref, SKIP_PID_NAMESPACE) for c in candidates), exited=True)
        container_ids = frozenset(violation.container_ids)
        killed: list[ProcessRef] = []
        skipped: list[tuple[ProcessRef, str]] = []
        pidfds: list[int] = []
        try:
            for candidate in candidates:
                pidfd, reason = self._signal(candidate.ref, violation.pod.uid, container_ids)
                if reason is not None:
                    skipped.append((candidate.ref, reason))
                else:
                    assert pidfd is not None
                    pidfds.append(pidfd)
                    killed.append(candidate.ref)
            # Nothing signalled means nothing to wait for: "exited" is vacuously true; KillResult.ok is False.
            exited = self._wait_for_exit(pidfds)
        finally:
            for fd in pidfds:
                os.close(fd)
        return KillResult(killed=tuple(killed), skipped=tuple(skipped), exited=exited)

    # ------------------------------------------------------------------------------------------------------

    def _candidates(self, violation: Violation) -> list[_Candidate]:
        by_pid: dict[int, _Candidate] = {}
        for ref in violation.processes:
            # A PID sampled twice (two devices, two NVML lists) is one candidate; keep the first identity.
            by_pid.setdefault(ref.pid, _Candidate(ref, sampled=True))
        # The sampled identity wins over what discovery finds at the same PID: if the sample's start time is
        # stale the process it meant is gone, and a newcomer is left to the next scan rather than killed on
        # the strength of a sample that was about someone else.
        for ref in self._device_holders(violation):
            by_pid.setdefault(ref.pid, _Candidate(ref, sampled=False))
        return [by_pid[pid] for pid in sorted(by_pid)]

    def _device_holders(self, violation: Violation) -> list[ProcessRef]:
        """Processes of the violating containers holding a GPU device file, with their current start time."""
        container_ids = frozenset(violation.container_ids)
        if not container_ids:
            return []
        uid = violation.pod.uid
        # The systemd driver writes the UID with "_"; a substring test skips most processes without parsing.
        needles = (uid, uid.replace("-", "_"))
        found = []
        for pid in list_pids(self._proc_root):
            text = read_cgroup_text_tolerant(pid, self._proc_root)
            if text is None or not any(n in text for n in needles):
                continue
            identity = parse_cgroup(text)
            if identity is None or identity.pod_uid != uid or identity.container_id not in container_ids:
                continue
            if not holds_nvidia_device(pid, self._proc_root, self._device_prefix):
                continue
            state = read_state_and_start_time(pid, self._proc_root)
            if state is not None:
                found.append(ProcessRef(pid, state[1]))
        return found

    def _signal(self, ref: ProcessRef, pod_uid: str, container_ids: frozenset[str]) -> tuple[int | None, str | None]:
        """(pidfd, None) when `ref` was signalled, (None, reason) when it was skipped."""
        if ref.pid <= 1:
            return None, SKIP_INVALID_PID
        if ref.pid == self._self_pid:
            return None, SKIP_SELF
        try:
            pidfd = os.pidfd_open(ref.pid)
        except ProcessLookupError:
            return None, SKIP_GONE
        except OSError as e:
            return None, SKIP_NOT_A_PROCESS if e.errno == errno.EINVAL else f"pidfd_open failed: {e.strerror}"
        try:
            reason = self._verify(ref, pod_uid, container_ids)
            if reason is None:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                return pidfd, None
        except ProcessLookupError:
            reason = SKIP_GONE
        except PermissionError:
            reason = SKIP_DENIED
        except OSError as e:
            reason = f"pidfd_send_signal failed: {e.strerror}"
        except BaseException:
            os.close(pidfd)
            raise
        os.close(pidfd)
        return None, reason

    def _verify(self, ref: ProcessRef, pod_uid: str, container_ids: frozenset[str]) -> str | None:
        """Why the process now at ref.pid must not be signalled, or None. Called with its pidfd open."""
        state = read_state_and_start_time(ref.pid, self._proc_root)
        if state is None:
            return SKIP_GONE
        letter, start_time = state
        if start_time != ref.start_time:
            return SKIP_PID_REUSED
        # A zombie holds no memory any more, and v1 already shows it at the root: report it, don't "kill" it.
        if letter in ("Z", "X", "x"):
            return SKIP_EXITED
        text = read_cgroup_text_tolerant(ref.pid, self._proc_root)
        identity = parse_cgroup(text) if text is not None else None
        if identity is None or identity.pod_uid != pod_uid or identity.container_id not in container_ids:
            return SKIP_NOT_IN_CONTAINER
        return None

    def _wait_for_exit(self, pidfds: list[int]) -> bool:
        """Poll the pidfds (readable once the process has exited) until all are, or the timeout passes."""
        if not pidfds:
            return True
        poller = select.poll()
        for fd in pidfds:
            poller.register(fd, select.POLLIN)
        remaining = set(pidfds)
        deadline = time.monotonic() + self._exit_timeout_s
        while remaining:
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                return False
            for fd, _events in poller.poll(max(1, int(left_s * 1000))):
                remaining.discard(fd)
                poller.unregister(fd)
        return True

    def _same_pid_namespace(self) -> bool:
        # <proc_root>/self names the reader's PID as that procfs's namespace numbers it; pidfd_open and
        # os.getpid use the agent's own namespace. When they differ the two sets of PIDs cannot be compared.
        try:
            return os.readlink(os.path.join(self._proc_root, "self")) == str(os.getpid())
        except OSError:
            return False
