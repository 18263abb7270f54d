"""What the tests and benchmarks measure of a process: its CPU, as the kernel accounts it."""

from __future__ import annotations

import os
from pathlib import Path

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, task: int | None = None) -> float:
    """utime + stime of process `pid` (all its threads), or of its thread `task` alone, from /proc."""
    stat = Path(f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S
