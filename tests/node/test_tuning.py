"""The agent's start in a real process: its soft open-file limit lifted to the hard one."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("soft", "hard", "expected"),
    [
        pytest.param(256, 4096, (256, 4096), id="soft-raised-to-hard"),
        pytest.param(4096, 4096, (4096, 4096), id="already-at-hard-unchanged"),
    ],
)
def test_open_file_limit_is_raised_to_the_hard_limit(soft: int, hard: int, expected: tuple[int, int]) -> None:
    """At start the agent lifts its soft open-file limit to the hard one (a container's 1024 is not its ceiling)."""
    script = (
        "import resource; from vramguard.cli.tuning import raise_open_file_limit\n"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))\n"
        "print(raise_open_file_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert out == [f"({expected[0]},", f"{expected[1]})", str(expected[1])]
