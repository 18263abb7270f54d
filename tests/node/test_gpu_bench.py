"""bench/gpu.py stays runnable without a GPU: over the test NVML library a quick run prints and writes every figure
(the values are for people, not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cgroup_fixtures import need_cgroups

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu.py"


def _figures(section: dict[str, float | None]) -> list[float | None]:
    return [section["median"], section["p95"], section["max"]]


def test_fake_nvml_quick_run_prints_and_writes_every_figure(tmp_path: Path) -> None:
    """--fake-nvml --quick: the scan-cost rows at 32 and 96 processes, both reaction rows and both teardown rows
    are printed with numbers, and the JSON holds each of them."""
    need_cgroups(2)
    figures = tmp_path / "gpu.json"
    result = subprocess.run(
        [sys.executable, str(BENCH), "--fake-nvml", "--quick", "--json", str(figures)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = [line.split() for line in result.stdout.splitlines() if line.strip()]
    first_line = result.stdout.splitlines()[0]
    assert "driver 550.54.15" in first_line and "NVML 12.550.54.15" in first_line, first_line

    scan_rows = {row[0]: row for row in rows if row[0] in ("32", "96")}
    assert set(scan_rows) == {"32", "96"}, result.stdout
    for n, row in scan_rows.items():
        assert len(row) == 13 and "-" not in row, row  # every NVML call the fake GPU has, and each figure
        assert row[11] == f"{n}/{n}", row  # every GPU process attributed to its pod
        assert row[10].endswith("x"), row
    reaction = {" ".join(row[:3]): row[3:] for row in rows if row[0] == "crossing"}
    assert set(reaction) == {"crossing -> dead", "crossing -> released"}, result.stdout
    assert all("-" not in cells and cells[-1] == "3/3" for cells in reaction.values()), reaction
    teardown = {row[0]: row[2:] for row in rows if row[1:2] == ["GiB"]}
    assert set(teardown) == {"1", "20"}, result.stdout
    assert all(len(cells) == 4 and "-" not in cells for cells in teardown.values()), teardown

    data = json.loads(figures.read_text())
    assert data["mode"] == "fake-nvml" and not data["failed"] and not data["notes"]
    assert [c["processes"] for c in data["scan_cost"]] == [32, 96]
    for c in data["scan_cost"]:
        numbers = [c["raw_nvml_ms"], c["sample_ms"], c["scan_ms"], c["agent_ms_per_scan"]]
        assert all(v > 0 for v in numbers) and c["rest_millicores"] >= 0, c  # at rest, 2 s may be under a tick
    assert all(v is not None for v in _figures(data["reaction"]["dead_ms"]) + _figures(data["reaction"]["released_ms"]))
    assert [t["held_bytes"] for t in data["teardown"]] == [2**30, 20 * 2**30]
    assert all(v is not None for t in data["teardown"] for v in _figures(t["dead_ms"]) + _figures(t["released_ms"]))
