"""The policy file on disk, read at start, by `policy check` and by each look of the reloader: only a regular file,
opened without blocking and read to `core.policy.MAX_POLICY_BYTES` at most.

What else may stand at the path is refused before it is read: a FIFO (an open waits for a writer, and would hold
the reader), a device (opening one can act, a watchdog or a tape; reading /dev/zero never ends), a socket, a
directory, a file over 1 MiB. The path is looked at with a stat first, so a device is never opened, and the open
file again, for what was swapped in between.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from vramguard.core.model import Policy
from vramguard.core.policy import MAX_POLICY_BYTES, FieldError, PolicyError, policy_from_bytes
from vramguard.core.text import format_bytes

# No open blocks (a FIFO without a writer) or makes a terminal the agent's; the links are followed (a ConfigMap's).
_READ: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_KINDS: Final = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


class FileRefused(Exception):
    """What is at the path is never read as a policy: not a regular file, or over `MAX_POLICY_BYTES`. `file` is
    its (st_dev, st_ino)."""

    def __init__(self, why: str, file: tuple[int, int]) -> None:
        super().__init__(why)
        self.file = file


@dataclass(frozen=True, slots=True)
class PolicyFile:
    """A policy file's bytes, and the file they were read from: (st_dev, st_ino) of the file reached through the
    links, which a rename over the path or a ConfigMap's `..data` swap changes and an edit in place keeps."""

    text: bytes
    file: tuple[int, int]


def read_policy_file(path: str | Path) -> PolicyFile:
    """The file's bytes, read through its links without blocking. Raises FileRefused (not a regular file, or over
    `MAX_POLICY_BYTES`) or OSError."""
    _check(os.stat(path))
    fd = os.open(path, _READ)
    with open(fd, "rb", closefd=True) as f:
        opened = os.fstat(fd)
        _check(opened)  # swapped since the stat: opened, never read
        text = f.read(MAX_POLICY_BYTES + 1)
    file = (opened.st_dev, opened.st_ino)
    if len(text) > MAX_POLICY_BYTES:
        raise FileRefused(f"grew over the {format_bytes(MAX_POLICY_BYTES)} a policy file may hold", file)
    return PolicyFile(text, file)


def _check(st: os.stat_result) -> None:
    file = (st.st_dev, st.st_ino)
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
        raise FileRefused(f"is {kind}: a policy is read only from a regular file", file)
    if st.st_size > MAX_POLICY_BYTES:
        size, bound = format_bytes(st.st_size), format_bytes(MAX_POLICY_BYTES)
        raise FileRefused(f"is {size}, over the {bound} a policy file may hold (as a ConfigMap)", file)


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy file. An empty file is the default policy.

    Raises PolicyError naming the file when it cannot be read, is not YAML, or is not a valid policy.
    """
    return read_policy(path)[0]


def read_policy(path: str | Path) -> tuple[Policy, bytes]:
    """`load_policy`, with the bytes the policy was read from (to know the content a reload compares with)."""
    source = str(path)
    try:
        text = read_policy_file(path).text
    except FileRefused as e:
        raise PolicyError([FieldError("", None, str(e), show=False)], source) from None
    except OSError as e:
        raise PolicyError([FieldError("", None, f"cannot read the file: {e.strerror or e}", show=False)], source) from e
    return policy_from_bytes(text, source), text


def check_policy_file(path: str | Path) -> list[str]:
    """Human-readable problems of a policy file, one per line, [] when valid. The caller prefixes the file name."""
    try:
        load_policy(path)
    except PolicyError as e:
        return [str(error) for error in e.errors]
    return []
