"""What can stand at a policy file's path that is never read as a policy, and the swaps that put things there: shared
by the unit tests of the start's read and of the reloader, and the reload on a real agent."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

MiB = 1024**2
T = TypeVar("T")
# How long a read that must not block may take before the test calls it blocked, on a busy machine.
BLOCKED_AFTER_S = 10.0


def make_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))  # the node outlives the socket


def make_big_file(path: Path) -> None:
    path.write_bytes(b"mode: kill\n" + b"#" * MiB)  # a valid policy, padded one line over 1 MiB


# (what to make at a path, what the refusal says); each id names the thing.
NOT_POLICY_FILES = [
    pytest.param(os.mkfifo, "is a FIFO", id="fifo"),
    pytest.param(lambda path: path.symlink_to("/dev/null"), "is a character device", id="dev-null"),
    pytest.param(lambda path: path.symlink_to("/dev/zero"), "is a character device", id="dev-zero"),
    pytest.param(make_socket, "is a socket", id="socket"),
    pytest.param(Path.mkdir, "is a directory with no policy.yaml", id="directory"),
    pytest.param(make_big_file, "over the 1.0MiB a policy may hold", id="over-1MiB"),
]

Make = Callable[[Path], object]


def swap_in(path: Path, target: Path) -> None:
    """Point `path` at `target` with one rename, as the kubelet swaps a ConfigMap volume's `..data` link."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.symlink_to(target)
    os.rename(tmp, path)


def write_atomically(path: Path, content: str) -> None:
    """Write a whole file under a temporary name and rename it over `path`: a new inode, complete when it appears."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(content)
    os.rename(tmp, path)


def unblocked(call: Callable[[], T]) -> T:
    """`call()`'s value, or what it raised, on a thread of its own: a call that blocks (an open of a FIFO that has
    no writer) fails the test instead of hanging it."""
    done: list[T] = []
    raised: list[BaseException] = []

    def run() -> None:
        try:
            done.append(call())
        except BaseException as e:  # handed to the test's thread
            raised.append(e)

    thread = threading.Thread(target=run, daemon=True)  # a blocked one is left behind
    thread.start()
    thread.join(BLOCKED_AFTER_S)
    assert not thread.is_alive(), f"blocked for {BLOCKED_AFTER_S:g}s"
    if raised:
        raise raised[0]
    return done[0]
