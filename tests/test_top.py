"""`vramguard top`'s rows and table: whose each GPU process is and what it runs (psutil), bounded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata

from vramguard.model import GiB
from vramguard.top import COMMAND_CHARS, ProcessDetail, TopRow, describe_process, render_json, render_table

# Tenant text as a hostile tenant writes it: a clear-screen sequence, a bell, a terminal title, bidi overrides.
HOSTILE = "evil\x1b[2J\x1b[H\x07\u202eexe.txt\u200f\x1b]0;pwned\x07\nforged line"


def raw_controls(text: str) -> set[str]:
    """The characters a terminal would interpret (controls, bidi and other format characters) in `text`."""
    return {c for line in text.split("\n") for c in line if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")}


def describe_sleeper(argument: str) -> tuple[int, ProcessDetail]:
    """A sleeping Python process whose last argument is `argument`: its PID and what describe_process says."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", argument])
    try:
        return proc.pid, describe_process(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_describe_process_reads_user_and_command_line() -> None:
    pid, detail = describe_sleeper("x" * 500)
    assert detail.pid == pid
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


def test_hostile_tenant_text_is_escaped_in_the_table_and_exact_in_json() -> None:
    """Namespace, pod, container, user, command and claim: no raw control or bidi character in the table (one line
    per row, columns aligned), the exact text in JSON."""
    row = TopRow("0", HOSTILE, HOSTILE, HOSTILE, (ProcessDetail(7, HOSTILE, HOSTILE),), GiB, 2 * GiB, "ok",
                 claim=HOSTILE)  # fmt: skip
    table = render_table([row])
    assert raw_controls(table) == set()
    header, line = table.splitlines()
    assert "\\x1b[2J" in line and "\\u202e" in line
    assert line.index("1.0GiB") == header.index("USED"), "escaped cells keep the columns aligned"
    (back,) = json.loads(render_json([row]))
    assert back["namespace"] == back["pod"] == back["container"] == back["claim"] == HOSTILE
    assert back["processes"] == [{"pid": 7, "user": HOSTILE, "command": HOSTILE}]


def test_a_long_command_is_cut_with_a_marker_in_json_and_shorter_in_the_table() -> None:
    """A command line is tenant-sized: JSON carries up to COMMAND_CHARS, the table a screen's worth, both marked."""
    command = "python " + "x" * 5000
    _, detail = describe_sleeper("x" * 5000)
    assert len(detail.command) == COMMAND_CHARS and detail.command.endswith("characters]")
    row = TopRow("0", "ml", "p", "main", (ProcessDetail(7, "u", command),), GiB, 2 * GiB, "ok")
    shown = render_table([row]).splitlines()[1].rsplit(" python ", 1)[1]
    assert len("python " + shown) == 80 and shown.endswith("[cut: 5007 characters]")
