"""The freeze journal's file: entries recorded and forgotten, malformed ones dropped, an unwritable one named."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vramguard.freezes import FreezeJournal


def test_record_and_forget(tmp_path: Path) -> None:
    """An entry names the cgroup and this process; forgetting it removes it; forgetting twice is harmless."""
    journal = FreezeJournal(str(tmp_path / "freezes"))
    path = journal.record("/sys/fs/cgroup/kubepods/pod1/abc", v2=True)
    (entry,) = journal.entries()
    assert (entry.cgroup, entry.v2, entry.pid) == ("/sys/fs/cgroup/kubepods/pod1/abc", True, os.getpid())
    assert journal.abandoned() == [], "this process is alive: its freezes are its own to thaw"
    journal.forget(path)
    journal.forget(path)
    assert journal.entries() == []


@pytest.mark.parametrize(
    "content",
    [
        pytest.param("{", id="cut-short"),
        pytest.param('{"cgroup": "/x"}', id="fields-missing"),
        pytest.param('{"cgroup": "/x", "v2": true, "pid": "many", "start_time": 1}', id="pid-not-a-number"),
        pytest.param(json.dumps({"cgroup": "/" + "x" * 5000, "v2": True, "pid": 1, "start_time": 1}), id="too-long"),
    ],
)
def test_a_malformed_entry_is_dropped(tmp_path: Path, content: str) -> None:
    """What does not read as an entry is removed, never acted on."""
    journal = FreezeJournal(str(tmp_path))
    Path(tmp_path, "junk").write_text(content)
    assert journal.entries() == []
    assert not Path(tmp_path, "junk").exists()


def test_an_unwritable_journal_says_so(tmp_path: Path) -> None:
    """Where the state directory cannot hold the journal, recording raises (and the killer then never freezes)."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    with pytest.raises(OSError):
        FreezeJournal(str(blocker / "freezes")).record("/sys/fs/cgroup/x", v2=True)
