"""bench/limits_cost.py stays runnable: a quick run prints its table and the CPU ratio (figures are for people, not
asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from cgroup_fixtures import need_cgroups

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]


def test_quick_benchmark_prints_its_figures() -> None:
    """A row per driver (works, unsupported, failing) with every column filled, and the failing/unsupported line."""
    need_cgroups(2)
    bench = Path(__file__).resolve().parents[2] / "bench" / "limits_cost.py"
    result = subprocess.run([sys.executable, str(bench), "--quick"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    rows = {line.split()[0]: line.split() for line in lines if line.startswith(("works ", "unsupported ", "failing "))}
    assert set(rows) == {"works", "unsupported", "failing"}, result.stdout
    for driver, fields in rows.items():
        assert len(fields) == 12 and fields[1] == "1", f"{driver}: {fields}"
        assert fields[2].endswith("%") and fields[11].endswith("%"), f"{driver}: {fields}"
    # Every call to the failing driver fails, and none to the working one (calls/s, errors/s).
    assert rows["failing"][6] == rows["failing"][7] and float(rows["works"][7]) == 0, rows
    assert any(
        re.fullmatch(r"failing/unsupported CPU: \S+x \(goal <= 1\.5x\); round by round: \S+", ln) for ln in lines
    )
