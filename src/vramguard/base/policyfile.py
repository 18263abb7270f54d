"""The policy file on disk, read at start, by `policy check` and by each look of the reloader: only a regular file,
opened without blocking and read to `core.policy.MAX_POLICY_BYTES` at most; or a policy ConfigMap mounted as a
directory, each of its keys so, `MAX_POLICY_BYTES` in all, every key of one version (read below the `..data` link the
kubelet swaps onto each new version).

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

from vramguard.core.policy import (
    DOCUMENT_KEY,
    MAX_POLICY_BYTES,
    FieldError,
    Policy,
    PolicyError,
    PolicyText,
    policy_from_text,
)
from vramguard.core.text import format_bytes

# No open blocks (a FIFO without a writer) or makes a terminal the agent's; the links are followed (a ConfigMap's).
_READ: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
# The kubelet's link to the current version of a ConfigMap volume: every key read below it is of one version.
CONFIG_MAP_DATA: Final = "..data"
# A ConfigMap's keys read at most (the chart's has four kinds); more is not a policy ConfigMap.
MAX_KEYS: Final = 256
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
    """A policy's text, and what it was read from: (st_dev, st_ino) of the file reached through the links, or of a
    ConfigMap's version directory, which a rename over the path or a ConfigMap's `..data` swap changes and an edit
    in place keeps."""

    text: PolicyText
    file: tuple[int, int]


def read_policy_file(path: str | Path) -> PolicyFile:
    """The policy at `path`, read through its links without blocking: a file, or a ConfigMap's directory. Raises
    FileRefused (not a regular file or such a directory, or over `MAX_POLICY_BYTES`) or OSError."""
    looked = os.stat(path)
    if stat.S_ISDIR(looked.st_mode):
        return _read_config_map(Path(path))
    text, file = _read_regular(path, looked, MAX_POLICY_BYTES)
    return PolicyFile(PolicyText(text), file)


def _read_regular(path: str | Path, looked: os.stat_result, bound: int) -> tuple[bytes, tuple[int, int]]:
    _check(looked, bound)
    fd = os.open(path, _READ)
    with open(fd, "rb", closefd=True) as f:
        opened = os.fstat(fd)
        _check(opened, bound)  # swapped since the stat: opened, never read
        text = f.read(bound + 1)
    file = (opened.st_dev, opened.st_ino)
    if len(text) > bound:
        raise FileRefused(f"grew over the {format_bytes(MAX_POLICY_BYTES)} a policy may hold", file)
    return text, file


def _read_config_map(directory: Path) -> PolicyFile:
    """Every key of the ConfigMap mounted at `directory`, of one version: below `..data` where the kubelet keeps it
    (resolved once), else the directory's own entries. Names starting with "." are the kubelet's, not keys."""
    data = directory / CONFIG_MAP_DATA
    root = data.resolve() if data.is_dir() else directory
    version = os.stat(root)
    names = sorted(entry.name for entry in os.scandir(root) if not entry.name.startswith("."))
    if len(names) > MAX_KEYS:
        raise FileRefused(f"holds {len(names)} keys: a policy ConfigMap has a few", (version.st_dev, version.st_ino))
    keys: dict[str, bytes] = {}
    left = MAX_POLICY_BYTES
    for name in names:
        key = root / name
        text, _ = _read_regular(key, os.stat(key), left)
        keys[name] = text
        left -= len(text)
    if DOCUMENT_KEY not in keys:  # not a policy ConfigMap: an empty directory is no policy, nor the default one
        raise FileRefused(f"is a directory with no {DOCUMENT_KEY}", (version.st_dev, version.st_ino))
    document = keys.pop(DOCUMENT_KEY)
    return PolicyFile(PolicyText(document, keys), (version.st_dev, version.st_ino))


def _check(st: os.stat_result, bound: int = MAX_POLICY_BYTES) -> None:
    file = (st.st_dev, st.st_ino)
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
        raise FileRefused(f"is {kind}: a policy is read only from a regular file", file)
    if st.st_size > bound:
        size, most = format_bytes(st.st_size), format_bytes(MAX_POLICY_BYTES)
        raise FileRefused(f"is {size}, over the {most} a policy may hold (as a ConfigMap)", file)


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy file or a policy ConfigMap's directory. An empty file is the default policy.

    Raises PolicyError naming the file when it cannot be read, is not YAML, or is not a valid policy.
    """
    return read_policy(path)[0]


def read_policy(path: str | Path) -> tuple[Policy, PolicyText]:
    """`load_policy`, with what the policy was read from (to know the content a reload compares with)."""
    source = str(path)
    try:
        text = read_policy_file(path).text
    except FileRefused as e:
        raise PolicyError([FieldError("", None, str(e), show=False)], source) from None
    except OSError as e:
        raise PolicyError([FieldError("", None, f"cannot read the file: {e.strerror or e}", show=False)], source) from e
    return policy_from_text(text, source), text


def check_policy_file(path: str | Path) -> list[str]:
    """Human-readable problems of a policy file, one per line, [] when valid. The caller prefixes the file name."""
    try:
        load_policy(path)
    except PolicyError as e:
        return [str(error) for error in e.errors]
    return []
