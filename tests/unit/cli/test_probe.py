"""`vramguard-probe`: exit 0 or 1 with the agent's reason on one line, 2 for a usage error."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from vramguard.agent.health import write
from vramguard.base.healthfile import HealthDocument
from vramguard.cli.probe import main


@pytest.mark.parametrize(
    ("check", "age_s", "code", "said"),
    [
        pytest.param("live", 0.0, 0, "live: last scan 0.2s ago", id="live-passes"),
        pytest.param("ready", 0.0, 1, "ready: pod cache not synced", id="not-ready-fails-with-the-reason"),
        pytest.param("live", 30.0, 1, "live: the agent (PID 7) last wrote its health 30.", id="stale-fails"),
    ],
)
def test_the_exit_code_and_line_are_the_verdicts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], check: str, age_s: float, code: int, said: str
) -> None:
    """The probe reads the file at --file and answers with the verdict at this moment's CLOCK_MONOTONIC."""
    path = tmp_path / "health"
    written_at = time.monotonic() - age_s
    write(str(path), HealthDocument(written_at, 7, (True, "last scan 0.2s ago"), (False, "pod cache not synced")))
    assert main([check, "--file", str(path)]) == code
    assert capsys.readouterr().out.startswith(said)
    assert main([check, f"--file={path}"]) == code


def test_no_file_fails_saying_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An agent that has not written its file yet (or cannot) fails the probe with where it looked."""
    assert main(["live", "--file", str(tmp_path / "absent")]) == 1
    assert f"no health file at {tmp_path / 'absent'}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param([], id="nothing"),
        pytest.param(["alive"], id="unknown-check"),
        pytest.param(["live", "--file"], id="file-without-a-path"),
        pytest.param(["live", "ready"], id="two-checks"),
    ],
)
def test_a_usage_error_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Whatever is not `live|ready [--file PATH]` prints the usage on standard error and exits 2."""
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("usage: vramguard-probe {live|ready}")
