"""What a GPU process is, for people (`describe_process`): its user and command line as the kernel holds them, or
its program's name alone, "(gone)" once it exited, every read bounded. Over a fake /proc; the same rules for real
processes are in tests/node/test_describe.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vramguard.node.describe import COMMAND_CHARS, ProcessDetail, describe_process, describe_process_name

# Tenant text as a hostile tenant writes it: a clear-screen sequence, a bell, a terminal title, bidi overrides, and
# a return, a tab and a newline that would forge a row.
HOSTILE = "evil\x1b[2J\x1b[H\x07\u202eexe.txt\u200f\x1b]0;pwned\x07\r\t\nforged line"
PID = 4242
PYTHON = ["/usr/bin/python3", "train.py", "--epochs=3"]
# Command-line arguments a tenant may give, each to be carried exactly.
ARGUMENTS = [
    pytest.param(HOSTILE, id="escape-sequences-and-bidi-kept"),
    pytest.param("a\rb", id="carriage-return-not-turned-into-newline"),
    pytest.param("a\r\nb\n", id="crlf-and-newline-kept"),
    pytest.param("two words", id="spaces-kept"),
    pytest.param(os.fsdecode(b"caf\xe9"), id="undecodable-bytes-as-surrogates"),
]


def fake_process(
    proc_root: Path, args: list[str], *, uid: int = 0, state: str = "S", comm: str = "python3", pid: int = PID
) -> str:
    """A process under `proc_root` as /proc shows it (stat, status, cmdline, comm); returns `proc_root` as a str."""
    directory = proc_root / str(pid)
    directory.mkdir(parents=True)
    (directory / "stat").write_text(f"{pid} ({comm}) {state} " + " ".join(["1"] * 49) + "\n")
    (directory / "status").write_text(
        f"Name:\t{comm}\nUmask:\t0022\nState:\t{state}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
    )
    (directory / "cmdline").write_bytes(b"".join(os.fsencode(a) + b"\0" for a in args))
    (directory / "comm").write_text(comm + "\n")
    return str(proc_root)


def test_the_program_name_leaves_the_arguments_out(tmp_path: Path) -> None:
    """What /status shows by default: whose process and which program, never its arguments (they may be secrets)."""
    detail = describe_process_name(PID, fake_process(tmp_path, [*PYTHON, "--token=s3cret"]))
    assert detail == ProcessDetail(PID, "root", "[python3]")


def test_describe_process_reads_user_and_command_line(tmp_path: Path) -> None:
    """The user is named from the process's real UID; a tenant's command line is cut."""
    detail = describe_process(PID, fake_process(tmp_path, [*PYTHON, "x" * 5000]))
    assert (detail.pid, detail.user) == (PID, "root")
    assert detail.command.startswith("/usr/bin/python3 train.py --epochs=3 xxx")
    assert len(detail.command) <= COMMAND_CHARS, "a tenant's command line is cut"


@pytest.mark.parametrize("argument", ARGUMENTS)
def test_describe_process_carries_the_command_line_exactly(tmp_path: Path, argument: str) -> None:
    """The command line is the process's arguments joined by spaces, each character as the kernel holds it."""
    detail = describe_process(PID, fake_process(tmp_path, [*PYTHON, argument]))
    assert detail.command == f"/usr/bin/python3 train.py --epochs=3 {argument}"


@pytest.mark.parametrize(
    ("state", "planted"),
    [
        pytest.param("S", False, id="exited-and-reaped"),
        pytest.param("Z", True, id="zombie"),
        pytest.param("X", True, id="dead"),
    ],
)
def test_describe_process_of_a_gone_pid(tmp_path: Path, state: str, planted: bool) -> None:
    """A process that exited is "(gone)", whether or not its parent has reaped it yet."""
    proc_root = fake_process(tmp_path, PYTHON, state=state) if planted else str(tmp_path)
    assert describe_process(PID, proc_root) == ProcessDetail(PID, "?", "(gone)")


def test_a_process_without_arguments_shows_its_name(tmp_path: Path) -> None:
    """A kernel thread has no command line: its name in brackets, as ps shows it."""
    assert describe_process(PID, fake_process(tmp_path, [], comm="kworker/0:1")).command == "[kworker/0:1]"


def test_a_user_the_agent_does_not_know_is_its_number(tmp_path: Path) -> None:
    """A UID missing from the agent's own user database is shown as the number."""
    assert describe_process(PID, fake_process(tmp_path, PYTHON, uid=3999999)).user == "3999999"


@pytest.mark.parametrize(
    ("length", "marker"),
    [
        pytest.param(2000, "characters]", id="read-whole-and-its-length-told"),
        pytest.param(5000, "[cut: read in part]", id="read-no-further-than-shown"),
    ],
)
def test_a_long_command_is_cut_with_a_marker_in_json(tmp_path: Path, length: int, marker: str) -> None:
    """A command line is tenant-sized: JSON carries up to COMMAND_CHARS, marked; past 4 bytes a character shown, it
    is not even read (its whole length is then unknown)."""
    detail = describe_process(PID, fake_process(tmp_path, [*PYTHON, "x" * length]))
    assert len(detail.command) == COMMAND_CHARS and detail.command.endswith(marker)
