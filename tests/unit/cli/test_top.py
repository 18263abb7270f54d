"""`vramguard top`'s rows and table: whose each GPU process is and what it runs (psutil), bounded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata
from collections.abc import Callable
from pathlib import Path

import pytest

from vramguard.agent.report import TopRow, row_dict
from vramguard.cli.top import TABLE_COMMAND_CHARS, render_table
from vramguard.core.model import GiB
from vramguard.node.describe import COMMAND_CHARS, ProcessDetail, describe_process, describe_process_name
from vramguard_testbed.waiting import wait_until

# Tenant text as a hostile tenant writes it: a clear-screen sequence, a bell, a terminal title, bidi overrides, and
# a return, a tab and a newline that would forge a row.
HOSTILE = "evil\x1b[2J\x1b[H\x07\u202eexe.txt\u200f\x1b]0;pwned\x07\r\t\nforged line"


def raw_controls(text: str) -> set[str]:
    """The characters a terminal would interpret (controls, bidi and other format characters) in `text`."""
    return {c for line in text.split("\n") for c in line if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")}


def describe_sleeper(
    argument: str, describe: Callable[[int], ProcessDetail] = describe_process
) -> tuple[int, ProcessDetail]:
    """A sleeping Python process whose last argument is `argument`: its PID and what `describe` says."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", argument])
    try:
        # Popen returns once exec has begun; the kernel sets the new command line a moment later.
        wait_until(lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes() != b"", 10, what="the command line set")
        return proc.pid, describe(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_the_program_name_leaves_the_arguments_out() -> None:
    """What /status shows by default: whose process and which program, never its arguments (they may be secrets)."""
    pid, detail = describe_sleeper("--token=s3cret", describe_process_name)
    assert detail.pid == pid and detail.user != "?"
    assert detail.command.startswith("[python") and "s3cret" not in detail.command


def test_describe_process_reads_user_and_command_line() -> None:
    pid, detail = describe_sleeper("x" * 500)
    assert detail.pid == pid
    assert detail.user == ("root" if os.geteuid() == 0 else detail.user)
    assert detail.command.startswith(f"{sys.executable} -c import time")
    assert len(detail.command) <= COMMAND_CHARS, "a tenant's command line is cut"


@pytest.mark.parametrize(
    "argument",
    [
        pytest.param(HOSTILE, id="escape-sequences-and-bidi-kept"),
        pytest.param("a\rb", id="carriage-return-not-turned-into-newline"),
        pytest.param("a\r\nb\n", id="crlf-and-newline-kept"),
        pytest.param("two words", id="spaces-kept"),
        pytest.param(os.fsdecode(b"caf\xe9"), id="undecodable-bytes-as-surrogates"),
    ],
)
def test_describe_process_carries_the_command_line_exactly(argument: str) -> None:
    """The command line is the process's arguments joined by spaces, each character as the kernel holds it."""
    _, detail = describe_sleeper(argument)
    assert detail.command == f"{sys.executable} -c import time; time.sleep(30) {argument}"


@pytest.mark.parametrize("reaped", [pytest.param(True, id="exited-and-reaped"), pytest.param(False, id="zombie")])
def test_describe_process_of_a_gone_pid(reaped: bool) -> None:
    """A process that exited is "(gone)", whether or not its parent has reaped it yet."""
    proc = subprocess.Popen(["/bin/true"])
    os.waitid(os.P_PID, proc.pid, os.WEXITED | (0 if reaped else os.WNOWAIT))  # WNOWAIT leaves a zombie
    try:
        assert describe_process(proc.pid) == ProcessDetail(proc.pid, "?", "(gone)")
    finally:
        proc.wait()


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
    as_json = json.dumps(row_dict(row))
    assert '"pids": [10, 11]' in as_json and '"command": "python loader.py"' in as_json


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
    assert row_dict(share)["claim"] == "small-gpu0-x7k2"


def test_hostile_tenant_text_is_escaped_in_the_table_and_exact_in_json() -> None:
    """Namespace, pod, container, user, command, state and claim: no raw control or bidi character in the table
    (one line per row, columns aligned), the exact text in JSON."""
    row = TopRow("0", HOSTILE, HOSTILE, HOSTILE, (ProcessDetail(7, HOSTILE, HOSTILE),), GiB, 2 * GiB,
                 f"unattributed: {HOSTILE}", claim=HOSTILE)  # fmt: skip
    table = render_table([row])
    assert raw_controls(table) == set()
    header, line = table.splitlines()
    assert "\\x1b[2J" in line and "\\u202e" in line and "\\x0d\\x09\\x0aforged line" in line
    assert line.index("1.0GiB") == header.index("USED"), "escaped cells keep the columns aligned"
    assert line.index("7 ") == header.index("PID"), "widths are those of the escaped text"
    back = json.loads(json.dumps(row_dict(row)))
    assert back["namespace"] == back["pod"] == back["container"] == back["claim"] == HOSTILE
    assert back["state"] == f"unattributed: {HOSTILE}"
    assert back["processes"] == [{"pid": 7, "user": HOSTILE, "command": HOSTILE}]


@pytest.mark.parametrize(
    "command",
    [
        pytest.param("python " + "x" * 5000, id="long-command"),
        pytest.param("\x1b" * 100, id="control-characters-counted-escaped"),
        pytest.param("\u202e" * 100, id="bidi-characters-counted-escaped"),
    ],
)
def test_the_table_shows_at_most_a_screen_of_a_command(command: str) -> None:
    """The COMMAND cell is at most TABLE_COMMAND_CHARS of the escaped command, marked when cut, nothing raw."""
    row = TopRow("0", "ml", "p", "main", (ProcessDetail(7, "u", command),), GiB, 2 * GiB, "ok")
    header, line = render_table([row]).splitlines()
    cell = line[header.index("COMMAND") :]
    assert len(cell) == TABLE_COMMAND_CHARS and cell.endswith(" characters]") and raw_controls(cell) == set()


@pytest.mark.parametrize(
    ("length", "marker"),
    [
        pytest.param(2000, "characters]", id="read-whole-and-its-length-told"),
        pytest.param(5000, "[cut: read in part]", id="read-no-further-than-shown"),
    ],
)
def test_a_long_command_is_cut_with_a_marker_in_json_and_shorter_in_the_table(length: int, marker: str) -> None:
    """A command line is tenant-sized: JSON carries up to COMMAND_CHARS, the table a screen's worth, both marked;
    past 4 bytes a character shown, it is not even read (its whole length is then unknown)."""
    command = "python " + "x" * 5000
    _, detail = describe_sleeper("x" * length)
    assert len(detail.command) == COMMAND_CHARS and detail.command.endswith(marker)
    row = TopRow("0", "ml", "p", "main", (ProcessDetail(7, "u", command),), GiB, 2 * GiB, "ok")
    shown = render_table([row]).splitlines()[1].rsplit(" python ", 1)[1]
    assert len("python " + shown) == 80 and shown.endswith("[cut: 5007 characters]")
