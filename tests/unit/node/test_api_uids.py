"""The UIDs the API server gave this node's pods: remembered across restarts, bounded, junk skipped."""

from __future__ import annotations

import os
from pathlib import Path

from structlog.testing import capture_logs

from vramguard.node.api_uids import FILE_NAME, ApiUids


def uid(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-000000000000"


def test_a_restarted_agent_remembers_what_an_earlier_one_saw(tmp_path: Path) -> None:
    """What one agent adds, the next one started on the same state directory has."""
    ApiUids(str(tmp_path)).add([uid(1), uid(2)])
    later = ApiUids(str(tmp_path))
    assert uid(1) in later and uid(2) in later and uid(3) not in later


def test_only_api_server_uids_are_kept(tmp_path: Path) -> None:
    """A kubelet's hash, or anything not a UUID, is no API server UID: not added, and skipped when read."""
    record = ApiUids(str(tmp_path))
    record.add(["6f0c2c0b1b6e4b3f8e1d2a3b4c5d6e7f", "m1", uid(1)])
    junk = "junk\n\x00\nABCDEF01-0000-4000-8000-000000000000\n"
    (tmp_path / FILE_NAME).write_text((tmp_path / FILE_NAME).read_text() + junk)
    later = ApiUids(str(tmp_path))
    assert len(later) == 1 and uid(1) in later


def test_the_record_is_bounded_and_its_file_rewritten(tmp_path: Path) -> None:
    """The newest `max_uids` are kept; the file is rewritten whole once it holds twice as many lines."""
    record = ApiUids(str(tmp_path), max_uids=4)
    for i in range(20):
        record.add([uid(i)])
    assert len(record) == 4 and uid(19) in record and uid(15) not in record
    assert len((tmp_path / FILE_NAME).read_text().splitlines()) <= 8
    later = ApiUids(str(tmp_path), max_uids=4)
    assert {uid(i) for i in range(16, 20)} == {u for u in map(uid, range(20)) if u in later}


def test_a_fifo_at_the_path_is_refused_without_blocking(tmp_path: Path) -> None:
    """The state directory is a hostPath: a FIFO there is said once and read as nothing, never waited on."""
    os.mkfifo(tmp_path / FILE_NAME)
    with capture_logs() as logs:
        record = ApiUids(str(tmp_path))
    assert len(record) == 0 and [e["event"] for e in logs] == ["api_pod_uids_unreadable"]


def test_without_a_state_directory_the_record_is_in_memory(tmp_path: Path) -> None:
    """A dry run or `vramguard top` writes nothing."""
    record = ApiUids(None)
    record.add([uid(1)])
    assert uid(1) in record and record.path is None
