"""What a GPU process is, for people: its user and command line, read from /proc at display time, never further
than what is shown (as nvitop says whose each GPU process is and what it runs). Never for decisions: a process may
have exited, or its PID been reused, between the scan and the read."""

from __future__ import annotations

import functools
import os
import pwd
from collections.abc import Callable
from dataclasses import dataclass

from vramguard.core.text import cut, cut_head
from vramguard.node.procfs import EXITED_STATES, is_gone_error, read_head, read_real_uid, read_stat

COMMAND_CHARS = 1024  # a command line is cut to this (with a marker saying so): a tenant controls its length


@dataclass(frozen=True, slots=True)
class ProcessDetail:
    pid: int
    user: str  # "?" when it cannot be read
    # The arguments joined by spaces, exactly as the kernel holds them up to COMMAND_CHARS; "[name]" for a process
    # without arguments (a kernel thread), "(gone)" when the process exited, "?" when it cannot be read.
    command: str


def describe_process(pid: int, proc_root: str = "/proc") -> ProcessDetail:
    """The user and command line of `pid`, the command line read no further than COMMAND_CHARS can show."""
    return _describe(pid, proc_root, command_line=True)


def describe_process_name(pid: int, proc_root: str = "/proc") -> ProcessDetail:
    """`describe_process` with the program's name ("[python3]") instead of its arguments, which may hold secrets:
    what `/status` shows to whoever can read it, unless the agent runs with `--status-command-lines`. The
    arguments are never read."""
    return _describe(pid, proc_root, command_line=False)


def describer(proc_root: str, command_lines: bool) -> Callable[[int], ProcessDetail]:
    """`describe_process` (or `describe_process_name`, without `command_lines`) over `proc_root`."""
    return functools.partial(describe_process if command_lines else describe_process_name, proc_root=proc_root)


def _describe(pid: int, proc_root: str, *, command_line: bool) -> ProcessDetail:
    """Every read is bounded whatever the process holds: its stat, the head of its status, its comm, and at most
    `_COMMAND_BYTES` of its command line."""
    gone = ProcessDetail(pid, "?", "(gone)")
    try:
        state = read_stat(pid, proc_root)
        if state is None or state[0] in EXITED_STATES:
            return gone
        uid = read_real_uid(pid, proc_root)
        if uid is None:
            return gone
        user = cut(_user_name(uid), 32)
        args = read_head(f"{proc_root}/{pid}/cmdline", _COMMAND_BYTES + 1) if command_line else b""
        if args:
            return ProcessDetail(pid, user, _command_text(args))
        name = read_head(f"{proc_root}/{pid}/comm", 64)  # a kernel thread has no arguments: its name, as ps shows
    except OSError as e:
        return gone if is_gone_error(e) else ProcessDetail(pid, "?", "?")
    if name is None:
        return gone
    program = os.fsdecode(name.rstrip(b"\n"))
    return ProcessDetail(pid, user, f"[{cut(program, 64)}]")


# Enough bytes for COMMAND_CHARS characters of any text: a character decodes from at most 4 bytes of UTF-8, and an
# undecodable byte is one character of its own.
_COMMAND_BYTES = 4 * COMMAND_CHARS


def _command_text(args: bytes) -> str:
    """The arguments joined by spaces, exactly as the kernel holds them up to COMMAND_CHARS (undecodable bytes kept
    as surrogates); cut with a marker saying so where there was more than was read."""
    whole = len(args) <= _COMMAND_BYTES
    text = os.fsdecode(args[:_COMMAND_BYTES].removesuffix(b"\0") if whole else args[:_COMMAND_BYTES])
    text = text.replace("\0", " ")
    return cut(text, COMMAND_CHARS) if whole else cut_head(text, COMMAND_CHARS)


@functools.lru_cache(maxsize=256)
def _user_name(uid: int) -> str:
    """The name the agent's own user database gives `uid`, else the number (psutil's rule)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
