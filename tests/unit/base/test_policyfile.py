"""The policy file on disk: only a regular file of at most 1 MiB is read, without blocking; what is there is known
by its inode, which an edit in place keeps and a rename over the path changes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from policy_fixtures import NOT_POLICY_FILES, Make, unblocked, write_atomically
from vramguard.base.policyfile import (
    FileRefused,
    check_policy_file,
    load_policy,
    read_policy,
    read_policy_file,
)
from vramguard.core.policy import MAX_POLICY_BYTES, Mode, Policy, PolicyError, PolicyText

EXAMPLE = Path(__file__).resolve().parents[3] / "config" / "policy.example.yaml"


def test_read_policy_gives_the_bytes_it_read(tmp_path: Path) -> None:
    """The policy and the bytes it came from (what /status hashes and a reload compares with)."""
    path = tmp_path / "policy.yaml"
    path.write_bytes(b"mode: evict\n")
    assert read_policy(path) == (Policy(mode=Mode.EVICT), PolicyText(b"mode: evict\n"))


def test_an_edit_in_place_keeps_the_file_and_a_rename_changes_it(tmp_path: Path) -> None:
    """The file read is named by (st_dev, st_ino) of what the links lead to: the same after an edit in place, another
    after a rename over the path."""
    path = tmp_path / "policy.yaml"
    path.write_text("mode: warn\n")
    first = read_policy_file(path)
    path.write_text("mode: kill\n")
    edited = read_policy_file(path)
    write_atomically(path, "mode: evict\n")
    renamed = read_policy_file(path)
    texts = (first.text.document, edited.text.document, renamed.text.document)
    assert texts == (b"mode: warn\n", b"mode: kill\n", b"mode: evict\n")
    assert edited.file == first.file and renamed.file != first.file
    assert renamed.file == (os.stat(path).st_dev, os.stat(path).st_ino)


def test_a_file_of_exactly_1MiB_is_read(tmp_path: Path) -> None:
    """The bound is a ConfigMap's: 1 MiB is a policy file still."""
    path = tmp_path / "policy.yaml"
    path.write_bytes(b"mode: kill\n" + b"#" * (MAX_POLICY_BYTES - len(b"mode: kill\n")))
    assert load_policy(path).mode is Mode.KILL


@pytest.mark.parametrize(("make", "says"), NOT_POLICY_FILES)
def test_what_is_not_a_policy_file_is_refused_at_once(tmp_path: Path, make: Make, says: str) -> None:
    """A FIFO, a device, a socket, a directory or a file over 1 MiB is refused without blocking or reading it:
    a PolicyError naming the file and what is there, so `vramguard run --policy` stops at start, never hangs."""
    path = tmp_path / "policy.yaml"
    make(path)
    with pytest.raises(FileRefused, match=says) as refused:
        unblocked(lambda: read_policy_file(path))
    assert refused.value.file == (os.stat(path).st_dev, os.stat(path).st_ino)
    with pytest.raises(PolicyError) as info:
        unblocked(lambda: load_policy(path))
    assert info.value.source == str(path) and says in str(info.value)


def test_load_policy_missing_file(tmp_path: Path) -> None:
    """A missing file is a PolicyError naming the file, not an OSError."""
    path = tmp_path / "absent.yaml"
    with pytest.raises(PolicyError, match="cannot read the file: No such file or directory") as info:
        load_policy(path)
    assert info.value.source == str(path)


def test_check_policy_file(tmp_path: Path) -> None:
    """`policy check` lines: none for a valid file, one per error, each naming the field and the value."""
    assert check_policy_file(EXAMPLE) == []
    path = tmp_path / "bad.yaml"
    path.write_text("mode: wran\nnamespaces:\n  team-a: {max_quota: 16GB}\n")
    assert check_policy_file(path) == [
        'mode: "wran" must be one of warn, evict, kill',
        'namespaces.team-a.max_quota: "16GB" is not a valid quantity (GB is not a Kubernetes suffix; '
        "write 16Gi or 17179869184 for 16 GiB, or 16G for 16e9 bytes)",
    ]


def test_check_policy_file_unreadable(tmp_path: Path) -> None:
    """A missing file is one line saying so, not an exception."""
    assert check_policy_file(tmp_path / "absent.yaml") == ["cannot read the file: No such file or directory"]
