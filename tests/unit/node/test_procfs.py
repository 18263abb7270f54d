"""The /proc readers over a proc tree written as plain files: what each reads, and "gone" told from "cannot read".

The same readers over the real /proc, with real processes, are exercised in tests/node (identify, kill)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from vramguard.node.procfs import (
    PidCursor,
    holds_device,
    is_gone_error,
    list_pids,
    parse_stat,
    read_cgroup,
    read_head,
    read_pid_cursor,
    read_real_uid,
    read_stat,
    read_stat_start_token,
    same_pid_namespace,
)

# Fields 3 to 22 of /proc/<pid>/stat after the command name: the state, then 18 fields, then the start time.
TAIL = b"S 1 100 100 0 -1 4194304 500 0 0 0 10 5 0 0 20 0 4 0 123456 1000000 200\n"


@pytest.mark.parametrize(
    ("data", "parsed"),
    [
        pytest.param(b"42 (python3) " + TAIL, (b"S", b"123456"), id="plain"),
        pytest.param(b"42 (my prog) x) " + TAIL, (b"S", b"123456"), id="name-with-space-and-paren"),
        pytest.param(b"42 (z) Z" + TAIL[1:], (b"Z", b"123456"), id="zombie"),
        pytest.param(b"42 (python3) S 1 100", None, id="truncated"),
        pytest.param(b"", None, id="empty"),
        pytest.param(b"42 python3 " + TAIL, None, id="no-name-parens"),
        pytest.param(b"42 (python3) " + TAIL.replace(b"123456", b"12x456"), None, id="start-time-not-a-number"),
    ],
)
def test_stat_is_split_after_the_last_paren(data: bytes, parsed: tuple[bytes, bytes] | None) -> None:
    """A tenant names its process: ")" and spaces in the name must not shift the state or the start time."""
    assert parse_stat(data) == parsed


@pytest.mark.parametrize(
    ("code", "gone"),
    [
        pytest.param(errno.ENOENT, True, id="enoent"),
        pytest.param(errno.ESRCH, True, id="esrch"),
        pytest.param(errno.EACCES, False, id="eacces-says-nothing"),
        pytest.param(errno.EMFILE, False, id="emfile-says-nothing"),
    ],
)
def test_only_enoent_and_esrch_mean_gone(code: int, gone: bool) -> None:
    """An agent out of fds must not read an offender as gone."""
    assert is_gone_error(OSError(code, os.strerror(code))) is gone


def write(root: Path, relative: str, data: bytes) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_stat_state_and_start_time(tmp_path: Path) -> None:
    """(state, start time) of a process; None once it is gone; contents that do not parse are an error (EIO)."""
    write(tmp_path, "42/stat", b"42 (trainer) " + TAIL)
    write(tmp_path, "43/stat", b"43 (trainer) S 1")
    assert read_stat(42, str(tmp_path)) == ("S", 123456)
    assert read_stat_start_token(f"{tmp_path}/42/stat") == b"123456"
    assert read_stat(44, str(tmp_path)) is None
    assert read_stat_start_token(f"{tmp_path}/44/stat") is None
    with pytest.raises(OSError) as raised:
        read_stat(43, str(tmp_path))
    assert raised.value.errno == errno.EIO


def test_a_read_is_bounded_whatever_the_file_holds(tmp_path: Path) -> None:
    """A command line may be megabytes: never more than `max_bytes` is read; a missing file is a gone process."""
    write(tmp_path, "42/cmdline", b"python\0" + b"x" * 100_000)
    assert read_head(f"{tmp_path}/42/cmdline", 4096) == (b"python\0" + b"x" * 100_000)[:4096]
    assert read_head(f"{tmp_path}/43/cmdline", 4096) is None


def test_a_directory_is_not_a_gone_process(tmp_path: Path) -> None:
    """Any error but ENOENT/ESRCH is raised: it says nothing about the process."""
    (tmp_path / "42" / "cmdline").mkdir(parents=True)
    with pytest.raises(IsADirectoryError):
        read_head(f"{tmp_path}/42/cmdline", 4096)


@pytest.mark.parametrize(
    ("status", "uid"),
    [
        pytest.param(b"Name:\tpython\nUmask:\t0022\nState:\tS\nUid:\t1000\t1000\t1000\t1000\n", 1000, id="real-uid"),
        pytest.param(b"Name:\troot\nUid:\t0\t0\t0\t0\n", 0, id="root"),
        pytest.param(b"", None, id="released-between-open-and-read"),
    ],
)
def test_the_real_uid_is_the_first_field_of_the_uid_line(tmp_path: Path, status: bytes, uid: int | None) -> None:
    """The real user ID, from the line a tenant cannot make long ahead of."""
    write(tmp_path, "42/status", status)
    assert read_real_uid(42, str(tmp_path)) == uid


def test_a_status_without_a_uid_line_is_an_error(tmp_path: Path) -> None:
    """Contents that do not parse raise EIO (not "gone"); a missing file is gone."""
    write(tmp_path, "42/status", b"Name:\tpython\n")
    with pytest.raises(OSError) as raised:
        read_real_uid(42, str(tmp_path))
    assert raised.value.errno == errno.EIO
    assert read_real_uid(43, str(tmp_path)) is None


def test_the_cgroup_text_keeps_undecodable_bytes(tmp_path: Path) -> None:
    """The cgroup file as text, undecodable bytes escaped rather than failing the read; None once gone."""
    write(tmp_path, "42/cgroup", b"0::/kubepods.slice/\xff\n")
    assert read_cgroup(42, str(tmp_path)) == "0::/kubepods.slice/\udcff\n"
    assert read_cgroup(43, str(tmp_path)) is None


def test_a_device_holder_is_found_by_its_fds(tmp_path: Path) -> None:
    """A process holds the GPU when one of its fds points at the device prefix; None once its fd directory is gone."""
    fds = tmp_path / "42" / "fd"
    fds.mkdir(parents=True)
    (fds / "0").symlink_to("/dev/null")
    assert holds_device(42, str(tmp_path)) is False
    (fds / "3").symlink_to("/dev/nvidia0")
    assert holds_device(42, str(tmp_path)) is True
    assert holds_device(42, str(tmp_path), device_prefix="/tmp/fake-gpu") is False
    assert holds_device(43, str(tmp_path)) is None


def test_pids_are_the_numeric_entries(tmp_path: Path) -> None:
    """Only the numbered entries are processes; an unlistable root raises rather than saying "no processes"."""
    for name in ("1", "42", "self", "sys", "loadavg"):
        (tmp_path / name).mkdir()
    assert sorted(list_pids(str(tmp_path))) == [1, 42]
    with pytest.raises(OSError):
        list_pids(str(tmp_path / "missing"))


def test_the_pid_cursor_from_loadavg_stat_and_pid_max(tmp_path: Path) -> None:
    """The last PID and task count from loadavg, forks from stat's processes line, and pid_max; None when any of
    them cannot be read or parsed."""
    write(tmp_path, "loadavg", b"0.10 0.20 0.30 2/812 31337\n")
    write(tmp_path, "stat", b"cpu  1 2 3\ncpu0 1 2 3\nintr 5 0 0\nctxt 99\nprocesses 123456\nprocs_running 2\n")
    write(tmp_path, "sys/kernel/pid_max", b"4194304\n")
    assert read_pid_cursor(str(tmp_path)) == PidCursor(last_pid=31337, forks=123456, pid_max=4194304, tasks=812)
    write(tmp_path, "stat", b"cpu  1 2 3\n")
    assert read_pid_cursor(str(tmp_path)) is None
    assert read_pid_cursor(str(tmp_path / "missing")) is None


def test_a_proc_tree_of_another_namespace_is_not_ours(tmp_path: Path) -> None:
    """Only a proc root whose `self` names this process speaks our PID namespace."""
    assert same_pid_namespace(str(tmp_path)) is False
    (tmp_path / "self").symlink_to("1")
    assert same_pid_namespace(str(tmp_path)) is False
    (tmp_path / "self").unlink()
    (tmp_path / "self").symlink_to(str(os.getpid()))
    assert same_pid_namespace(str(tmp_path)) is True
