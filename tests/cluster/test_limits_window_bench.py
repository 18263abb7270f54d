"""bench/limits_window.py stays runnable on the real node: a quick run prints its table and summary (the figures
are for people comparing runs, never asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helm_fixtures import need_helm
from real_parts import need

from .real_cluster import unavailable_reason

pytestmark = [pytest.mark.slow, pytest.mark.real_node]

BENCH = Path(__file__).resolve().parents[2] / "bench" / "limits_window.py"


def test_quick_limits_window_prints_its_table_and_summary() -> None:
    need(unavailable_reason(), skip="no real node", ci="build the real node's parts first (scripts/test.sh does)")
    need_helm()
    result = subprocess.run([sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=1800)
    if result.returncode == 2:  # the bench's own skip: another real node held the host for 10 minutes
        pytest.skip(result.stderr.strip())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert any(line.startswith("agent: vramguard ") for line in lines), result.stdout
    assert any(line.startswith("image: ") and " built " in line for line in lines), result.stdout
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["pod", "container", "start"])
    rows = [line.split() for line in lines[header + 1 : header + 4]]
    assert [row[:2] for row in rows] == [[f"quota-{i:03d}", "main"] for i in range(3)], result.stdout
    assert all(len(row) == 6 for row in rows), result.stdout
    assert any(line.startswith("summary of 3 containers") for line in lines), result.stdout
    for what in ("pod limit before the first process: ", "own limit before the first process: "):
        assert any(line.startswith(what) and "/3 " in line for line in lines), result.stdout
