"""The health file's format and the probe's reading of it: what the agent writes is what the probe reads back,
anything else is refused naming the field, and a file too old to believe fails either check."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vramguard.base import healthfile
from vramguard.base.healthfile import HealthDocument, HealthFileError

DOCUMENT = HealthDocument(1234.5, 42, (True, "last scan 0.4s ago"), (False, "pod cache not synced"))


def test_a_document_reads_back_as_written() -> None:
    """encode then decode gives the same document, a reason's whitespace runs folded into one line."""
    assert healthfile.decode(healthfile.encode(DOCUMENT)) == DOCUMENT
    multiline = HealthDocument(1.0, 1, (True, "a\n  b\tc"), (True, "ready"))
    assert healthfile.decode(healthfile.encode(multiline)).live == (True, "a b c")


def test_a_reason_is_cut_to_its_bound() -> None:
    """However long a reason (it may quote an API server's error), the file stays within MAX_FILE_BYTES."""
    long = HealthDocument(1.0, 1, (True, "x" * 100_000), (False, "é" * 100_000))
    data = healthfile.encode(long)
    assert len(data) <= healthfile.MAX_FILE_BYTES
    assert len(healthfile.decode(data).ready[1]) == healthfile.MAX_WHY_CHARS


@pytest.mark.parametrize(
    ("data", "names"),
    [
        pytest.param(b"", "first line", id="empty"),
        pytest.param(b'{"live": true}', "first line", id="not-the-format"),
        pytest.param(b"vramguard-health 1\npid 1\nlive ok x\nready ok y\n", "written_at", id="no-time"),
        pytest.param(b"vramguard-health 1\nwritten_at nan\npid 1\nlive ok x\nready ok y\n", "written_at", id="nan"),
        pytest.param(b"vramguard-health 1\nwritten_at inf\npid 1\nlive ok x\nready ok y\n", "written_at", id="inf"),
        pytest.param(b"vramguard-health 1\nwritten_at 1\npid -3\nlive ok x\nready ok y\n", "pid", id="bad-pid"),
        pytest.param(b"vramguard-health 1\nwritten_at 1\npid 3\nlive yes x\nready ok y\n", "live", id="bad-state"),
        pytest.param(b"vramguard-health 1\nwritten_at 1\npid 3\nlive ok x\n", "ready", id="no-readiness"),
    ],
)
def test_what_the_agent_did_not_write_is_refused_naming_the_field(data: bytes, names: str) -> None:
    """A file that is not the agent's document is a HealthFileError whose message names the field at fault."""
    with pytest.raises(HealthFileError, match=names):
        healthfile.decode(data)


@pytest.mark.parametrize(
    ("probe", "now", "expected"),
    [
        pytest.param("live", 1234.5 + 9.9, (True, "last scan 0.4s ago"), id="fresh-live-is-the-agents-answer"),
        pytest.param("ready", 1234.5, (False, "pod cache not synced"), id="fresh-ready-is-the-agents-answer"),
        pytest.param(
            "live",
            1234.5 + 10.5,
            (False, "the agent (PID 42) last wrote its health 10.5 s ago: it is stuck"),
            id="stale-fails-live",
        ),
        pytest.param(
            "ready",
            1234.5 + 60,
            (False, "the agent (PID 42) last wrote its health 60.0 s ago: it is stuck"),
            id="stale-fails-ready",
        ),
        pytest.param(
            "live",
            1234.5 - 20,
            (False, "the health file is dated 20.0 s ahead of this clock: not written in this boot"),
            id="from-the-future-fails",
        ),
    ],
)
def test_the_verdict_is_the_agents_unless_the_file_is_too_old(probe: str, now: float, expected: object) -> None:
    """The probe believes the agent's answer for STALE_AFTER_S after it was written, and fails it after."""
    assert healthfile.verdict(DOCUMENT, probe, now) == expected


def test_reading_refuses_what_is_not_a_small_regular_file(tmp_path: Path) -> None:
    """No file, a link, a FIFO (never waited on) and an oversized file are each a HealthFileError saying which."""
    with pytest.raises(HealthFileError, match="no health file"):
        healthfile.read(str(tmp_path / "absent"))
    target = tmp_path / "target"
    target.write_bytes(healthfile.encode(DOCUMENT))
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(HealthFileError, match="cannot open"):
        healthfile.read(str(tmp_path / "link"))
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(HealthFileError, match="not a regular file"):
        healthfile.read(str(tmp_path / "fifo"))
    (tmp_path / "big").write_bytes(b"x" * (healthfile.MAX_FILE_BYTES + 1))
    with pytest.raises(HealthFileError, match="larger than"):
        healthfile.read(str(tmp_path / "big"))
    assert healthfile.read(str(target)) == healthfile.encode(DOCUMENT)
