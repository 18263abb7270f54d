"""The freeze journal against what blocks a reader: a FIFO or a socket planted in the journal, or a FIFO where its
directory should be, is refused without blocking the agent's start. The journal's other rules are in
tests/unit/node/test_freezes.py.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from unit.node.test_freezes import fake_root, freeze_state, frozen_container
from vramguard.node.freezes import FreezeJournal, Frozen, Junk, JunkReport, freeze_journal


def _junk_fifo(directory: Path) -> None:
    os.mkfifo(directory / "fifo")


def _junk_socket(directory: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(directory / "sock"))
    s.close()


@pytest.mark.parametrize(
    ("plant", "kind"),
    [
        pytest.param(_junk_fifo, Junk.NOT_A_FILE, id="fifo"),
        pytest.param(_junk_socket, Junk.NOT_A_FILE, id="socket"),
    ],
)
def test_what_is_not_a_small_regular_file_is_refused_without_blocking(
    tmp_path: Path, plant: Callable[[Path], None], kind: Junk
) -> None:
    """A FIFO or a socket is never read: the look returns at once, removes it, and reports it."""
    journal = FreezeJournal(str(tmp_path / "freezes"), cgroup_root=str(fake_root(tmp_path)))
    directory = tmp_path / "freezes"
    directory.mkdir()
    plant(directory)
    result: list[tuple[list[Frozen], JunkReport]] = []
    reader = threading.Thread(target=lambda: result.append(journal.scan()), daemon=True)
    reader.start()
    reader.join(5)
    try:
        assert not reader.is_alive(), "the journal blocked on what it found"
    finally:
        if (directory / "fifo").exists():  # release a reader stuck on the FIFO, so that a failure ends
            os.close(os.open(directory / "fifo", os.O_WRONLY | os.O_NONBLOCK))
            reader.join(5)
    ((entries, junk),) = result
    assert entries == []
    assert dict(junk.counts) == {kind.value: 1}
    assert os.listdir(directory) == []


def test_a_journal_directory_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """Where `<state dir>/freezes` is a FIFO, the agent's start says so in one line, at once, and does not freeze."""
    root = fake_root(tmp_path)
    cgroup = frozen_container(root)
    state = tmp_path / "state"
    state.mkdir()
    os.mkfifo(state / "freezes")
    result: list[tuple[FreezeJournal | None, list[MutableMapping[str, Any]]]] = []

    def start() -> None:
        with capture_logs() as logs:
            result.append((freeze_journal(str(state), str(root)), logs))

    starter = threading.Thread(target=start, daemon=True)
    starter.start()
    starter.join(5)
    if starter.is_alive() and (state / "freezes").exists():
        os.close(os.open(state / "freezes", os.O_WRONLY | os.O_NONBLOCK))  # release it, so that a failure ends
    assert not starter.is_alive(), "the start blocked on the journal's directory"
    ((journal, logs),) = result
    assert journal is None
    assert [(e["event"], e["freezing"]) for e in logs] == [("freeze_journal_unavailable", False)]
    assert "not a directory" in str(logs[0]["error"])
    assert freeze_state(cgroup) == "1"
