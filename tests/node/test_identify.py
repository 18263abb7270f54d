"""The identify stage over the real /proc and real processes: the cache's life with a process, zombies, the start
tick, the fds it (does not) keep, and the stat reader."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from fd_fixtures import open_fds, opened_since
from vramguard.core.process import ProcessRef
from vramguard.node.identify import ProcIdentifier
from vramguard.node.procfs import read_stat


@pytest.mark.parametrize("use_cursor", [pytest.param(True, id="cursor"), pytest.param(False, id="stat")])
def test_real_process_cache_lifecycle(use_cursor: bool) -> None:
    """A live process is a hit; once it exits and is reaped it reads as gone and leaves the cache. No fd is kept."""
    before = open_fds()
    child = subprocess.Popen(["sleep", "60"])
    time.sleep(0.03)  # read in a later tick than it started in (else every check is a re-read: see "same tick")
    try:
        attributor = ProcIdentifier("/proc", use_pid_cursor=use_cursor)
        first = attributor.scan([child.pid])[child.pid]
        assert first[0] == ProcessRef(child.pid, (read_stat(child.pid) or ("?", -1))[1])
        assert attributor.scan([child.pid]) == {child.pid: first}
        assert (attributor.hits, attributor.misses) == (1, 1)
        assert opened_since(before) == {}
    finally:
        child.kill()
        child.wait()
    assert attributor.scan([child.pid]) == {}
    assert attributor.identify(child.pid) is None
    assert attributor.cache_size == 0


@pytest.mark.parametrize("use_cursor", [pytest.param(True, id="cursor"), pytest.param(False, id="stat")])
def test_zombie_is_still_the_same_process(use_cursor: bool) -> None:
    """An exited but unreaped child keeps its PID, so its cached identity is still a hit."""
    child = subprocess.Popen(["sleep", "60"])
    time.sleep(0.03)  # read in a later tick than it started in
    try:
        attributor = ProcIdentifier("/proc", use_pid_cursor=use_cursor)
        first = attributor.scan([child.pid])
        child.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 5
        while (read_stat(child.pid) or ("?", 0))[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.001)
        assert attributor.scan([child.pid]) == first
        assert attributor.identify(child.pid) == first[child.pid]
        assert attributor.hits == 2
    finally:
        child.kill()
        child.wait()


def test_process_read_in_its_start_tick_is_vouched_for_once_read_later() -> None:
    """A process read right after it started is re-read when next checked; read in a later tick, stat suffices."""
    child = subprocess.Popen(["sleep", "60"])
    try:
        attributor = ProcIdentifier("/proc")
        first = attributor.identify(child.pid)
        time.sleep(0.03)
        assert attributor.identify(child.pid) == first  # a re-read or (if the first read was a tick late) a check
        checks = attributor.stat_checks
        assert attributor.identify(child.pid) == first
        assert attributor.stat_checks == checks + 1
    finally:
        child.kill()
        child.wait()


@pytest.mark.slow
def test_a_thousand_cached_processes_cost_no_fd() -> None:
    """Scanning (cold, then warm) 1,000 real processes leaves the agent with exactly the fds it had before."""
    children = [subprocess.Popen(["sleep", "120"]) for _ in range(1000)]
    try:
        before = open_fds()
        attributor = ProcIdentifier("/proc")
        assert len(attributor.scan(c.pid for c in children)) == 1000
        assert opened_since(before) == {}
        warm = attributor.scan(c.pid for c in children)
        assert len(warm) == 1000 and attributor.cache_size == 1000
        assert opened_since(before) == {}
        assert attributor.full_checks == 1  # only the first scan had no earlier reading to go by
        assert attributor.hits == 1000
    finally:
        for c in children:
            c.kill()
        for c in children:
            c.wait()


def test_read_stat_of_a_real_and_a_gone_process() -> None:
    """A live process reads its state and start time; a reaped one reads as gone (None)."""
    me = read_stat(os.getpid())
    assert me is not None and me[0] in ("R", "S") and me[1] > 0
    child = subprocess.Popen(["/bin/true"])
    child.wait()
    assert read_stat(child.pid) is None
