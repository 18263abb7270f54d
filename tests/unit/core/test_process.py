"""What /proc tells the agent: a process's reuse-proof reference and the kubelet pod it runs as."""

from __future__ import annotations

from vramguard.core.process import LOOK_ALIKE, UNKNOWN_START_TIME, KubeletPod, LookAlike, ProcessRef


def test_a_process_is_its_pid_and_start_time() -> None:
    """A PID reused by a new process is another process: the start time tells them apart, and orders them."""
    assert ProcessRef(7, 100) != ProcessRef(7, 200)
    assert sorted([ProcessRef(9, 1), ProcessRef(7, 200), ProcessRef(7, 100)]) == [
        ProcessRef(7, 100),
        ProcessRef(7, 200),
        ProcessRef(9, 1),
    ]
    assert UNKNOWN_START_TIME < 0, "no real process has it: clock ticks since boot are never negative"


def test_a_kubelet_pod_is_keyed_as_the_api_server_keys_it() -> None:
    assert KubeletPod("kube-system", "etcd-node1").key == "kube-system/etcd-node1"


def test_a_look_alike_is_one_answer() -> None:
    assert LOOK_ALIKE is LookAlike.CGROUP
