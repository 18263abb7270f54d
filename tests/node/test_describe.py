"""What a real process is, for people: its user and its command line as the kernel holds it, or its program's name
alone, and "(gone)" once it exited. The same rules over a fake /proc are in tests/unit/node/test_describe.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from unit.cli.test_top import command_row
from unit.node.test_describe import ARGUMENTS
from vramguard.cli.top import render_table
from vramguard.node.describe import COMMAND_CHARS, ProcessDetail, describe_process, describe_process_name
from vramguard_testbed.waiting import wait_until


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


@pytest.mark.parametrize("argument", ARGUMENTS)
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
    shown = render_table([command_row(command)]).splitlines()[1].rsplit(" python ", 1)[1]
    assert len("python " + shown) == 80 and shown.endswith("[cut: 5007 characters]")
