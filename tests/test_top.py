"""`vramguard top`'s rows and table: whose each GPU process is and what it runs (psutil), bounded."""

from __future__ import annotations

import os
import subprocess
import sys

from vramguard.model import GiB
from vramguard.top import COMMAND_CHARS, ProcessDetail, TopRow, describe_process, render_json, render_table


def test_describe_process_reads_user_and_command_line() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "x" * 500])
    try:
        detail = describe_process(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert detail.pid == proc.pid
    assert detail.user == ("root" if os.geteuid() == 0 else detail.user)
    assert detail.command.startswith(f"{sys.executable} -c import time")
    assert len(detail.command) <= COMMAND_CHARS, "a tenant's command line is cut"


def test_describe_process_of_a_gone_pid() -> None:
    proc = subprocess.Popen(["/bin/true"])
    proc.wait()
    assert describe_process(proc.pid) == ProcessDetail(proc.pid, "?", "(gone)")


def test_table_lists_each_process_of_a_container() -> None:
    """The container's line carries its first process; the others follow on lines of their own."""
    row = TopRow(
        gpu="0",
        namespace="ml",
        pod="trainer",
        container="main",
        processes=(ProcessDetail(10, "alice", "python train.py"), ProcessDetail(11, "alice", "python loader.py")),
        used_bytes=3 * GiB,
        quota_bytes=4 * GiB,
        state="ok",
        held_by="driver",
    )
    header, first, second = render_table([row]).splitlines()
    assert header.split()[-3:] == ["PID", "USER", "COMMAND"]
    assert first.split() == [
        "0",
        "ml",
        "trainer",
        "main",
        "3.0GiB",
        "4.0GiB",
        "75",
        "ok",
        "driver",
        "10",
        "alice",
        "python",
        "train.py",
    ]
    assert second.split() == ["11", "alice", "python", "loader.py"]
    assert second.index("11") == first.index(" 10 ") + 1, "further processes line up under PID"
    assert '"pids": [10, 11]' in render_json([row]) and '"command": "python loader.py"' in render_json([row])


def test_a_claim_column_only_where_dra_claims_give_quotas() -> None:
    """Rows whose quota is a DRA share name its claim; without any, the table has no CLAIM column."""
    share = TopRow("2", "ml", "small", "main", (ProcessDetail(7, "bob", "python serve.py"),), 11 * GiB, 10 * GiB,
                   "over-hard", "agent", claim="small-gpu0-x7k2")  # fmt: skip
    other = TopRow("0", "ml", "batch", "main", (ProcessDetail(8, "eve", "python batch.py"),), GiB, 4 * GiB, "ok")
    header, *_ = render_table([share, other]).splitlines()
    assert header.split()[8:10] == ["HELD-BY", "CLAIM"]
    lines = render_table([share, other]).splitlines()
    assert "small-gpu0-x7k2" in next(line for line in lines if " small " in line)
    assert "CLAIM" not in render_table([other]).splitlines()[0]
    assert '"claim": "small-gpu0-x7k2"' in render_json([share])
