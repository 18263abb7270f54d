"""Runs `PidfdKiller.kill` in a process of its own, for tests that squeeze its fds or give it another cgroup view.

    python kill_child.py '{"pod_uid": ..., "container_ids": [...], "processes": [[pid, start_time], ...],
                           "device_prefix": ..., "cgroup_root": ..., "kubelet_cgroup_root": "/kubelet",
                           "nofile": 64, "free_fds": null}'

The killer places paths as the agent does: below the kubelet's `kubelet_cgroup_root` ("/" unless given), read
from wherever this process's cgroup namespace is rooted (`find_namespace`). `nofile` lowers RLIMIT_NOFILE before
the kill; `free_fds` then fills the fd table but for that many slots. The KillResult goes to stdout as JSON. Not a
test module: the tests in test_kill.py start it.
"""

from __future__ import annotations

import json
import os
import resource
import sys

from vramguard.core.actions import KillTarget
from vramguard.core.process import ProcessRef
from vramguard.node.cgroup import KubeletTree, find_namespace, kubelet_root
from vramguard.node.freezes import FreezeJournal
from vramguard.node.kill import PidfdKiller


def main(spec: dict[str, object]) -> None:
    processes = spec["processes"]
    container_ids = spec["container_ids"]
    assert isinstance(processes, list) and isinstance(container_ids, list)
    target = KillTarget(
        pod_uid=str(spec["pod_uid"]),
        container_ids=tuple(str(c) for c in container_ids),
        processes=tuple(ProcessRef(int(pid), int(start)) for pid, start in processes),
    )
    cgroup_root = str(spec.get("cgroup_root") or "/sys/fs/cgroup")
    root = kubelet_root(str(spec.get("kubelet_cgroup_root") or "/"))
    kubelet = KubeletTree(root, find_namespace("/proc", cgroup_root, os.getpid()))
    killer = PidfdKiller(
        device_prefix=str(spec["device_prefix"]),
        cgroup_root=cgroup_root,
        exit_timeout_s=10.0,
        journal=FreezeJournal(str(spec["journal"]), cgroup_root, kubelet) if spec.get("journal") else None,
        kubelet=kubelet,
    )
    nofile = spec.get("nofile")
    if isinstance(nofile, int):
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    filler: list[int] = []
    free_fds = spec.get("free_fds")
    if isinstance(free_fds, int):
        try:
            while True:
                filler.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        for _ in range(free_fds):
            os.close(filler.pop())
    result = killer.kill(target)
    for fd in filler:
        os.close(fd)
    out = {
        "killed": [[r.pid, r.start_time] for r in result.killed],
        "skipped": [[r.pid, r.start_time, reason] for r, reason in result.skipped],
        "exited": result.exited,
        "remaining": [[r.pid, r.start_time] for r in result.remaining],
        "ok": result.ok,
        "fds_after": len(os.listdir("/proc/self/fd")),
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
