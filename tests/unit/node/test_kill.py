"""What the killer refuses before any signal, over fake /proc trees: a /proc of another PID namespace (nothing
signalled, every candidate reported), PID 0 and 1, the agent itself, and a process that is gone. Against real
processes in real cgroups: tests/node/test_kill_real.py; where a container's directory is found:
tests/unit/node/test_cgroup.py; the freeze: tests/unit/node/test_freezer.py."""

from __future__ import annotations

import os
from pathlib import Path

from unit.node.test_identify import FakeProc, cgroup_text
from vramguard.core.actions import KillTarget
from vramguard.core.ports import KillResult
from vramguard.core.process import ProcessRef
from vramguard.node.kill import SKIP_GONE, SKIP_INVALID_PID, SKIP_PID_NAMESPACE, SKIP_SELF, PidfdKiller

UID = "11111111-2222-3333-4444-555555555555"
CID = "a1" * 32
OTHER_CID = "a2" * 32
DEAD_PID = (1 << 22) + 1  # above the kernel's highest pid_max: no process ever has it


def holding(proc: FakeProc, pid: int, device: str) -> None:
    """Give the fake process an fd open on `device`."""
    (proc.root / str(pid) / "fd").mkdir()
    (proc.root / str(pid) / "fd" / "3").symlink_to(device)


def test_a_proc_of_another_pid_namespace_gets_nothing_signalled(tmp_path: Path) -> None:
    """Where /proc numbers processes as another namespace does, its PIDs are not ours to signal: each sampled
    process and each device holder found there is reported skipped, once, in PID order."""
    proc = FakeProc(tmp_path / "proc")
    proc.add(40, 400, cgroup_text(UID, CID))
    holding(proc, 40, "/dev/nvidia0")
    proc.add(41, 410, cgroup_text(UID, CID))
    holding(proc, 41, "/dev/nvidia1")
    proc.add(42, 420, cgroup_text(UID, CID))  # holds no device
    proc.add(43, 430, cgroup_text(UID, OTHER_CID))  # another container of the pod
    holding(proc, 43, "/dev/nvidia0")
    target = KillTarget(UID, (CID,), (ProcessRef(40, 400), ProcessRef(7, 70), ProcessRef(40, 400)))

    result = PidfdKiller(str(proc.root)).kill(target)

    refs = [ProcessRef(7, 70), ProcessRef(40, 400), ProcessRef(41, 410)]
    assert result == KillResult(killed=(), skipped=tuple((r, SKIP_PID_NAMESPACE) for r in refs), exited=True)


def test_what_is_never_signalled(tmp_path: Path) -> None:
    """PID 0 and 1 and the agent itself are refused before a pidfd is opened, and a PID that no process holds is
    gone; none of them is left to report as remaining."""
    proc = FakeProc(tmp_path / "proc")
    proc.root.mkdir(parents=True)
    (proc.root / "self").symlink_to(str(os.getpid()))  # this /proc numbers processes as the agent does
    sampled = (ProcessRef(0, 1), ProcessRef(1, 1), ProcessRef(os.getpid(), 5), ProcessRef(DEAD_PID, 9))

    result = PidfdKiller(str(proc.root)).kill(KillTarget(UID, (CID,), sampled))

    assert result.killed == () and result.remaining == () and result.exited
    assert dict(result.skipped) == {
        ProcessRef(0, 1): SKIP_INVALID_PID,
        ProcessRef(1, 1): SKIP_INVALID_PID,
        ProcessRef(os.getpid(), 5): SKIP_SELF,
        ProcessRef(DEAD_PID, 9): SKIP_GONE,
    }
