"""bench/scan.py stays runnable: a quick run prints every figure (the values are for people, not asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cgroup_fixtures import need_cgroups

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]


def test_quick_benchmark_prints_its_figures() -> None:
    """The scan-cost table (8x64 and 1x1), the reaction-time table (the watch off and on, and on where a free hides
    the crossing) and the agent's costs come out of a quick run."""
    need_cgroups(2)
    bench = Path(__file__).resolve().parents[2] / "bench" / "scan.py"
    result = subprocess.run([sys.executable, str(bench), "--quick"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert any(line.split()[:2] == ["8x64", "512"] for line in lines if line.strip())
    assert any(line.split()[:2] == ["1x1", "1"] for line in lines if line.strip())
    reactions = [line.split() for line in lines if line.strip().startswith("1000ms")]  # --quick: the default poll
    assert {r[1] for r in reactions} == {"0s", "20ms", "10ms"}, "the default poll, the watch off and on"
    assert sum("hidden" in r for r in reactions) == 1, "the watch on, a free hiding the crossing"
    assert all(" ".join(r).endswith(("met", "NOT met")) for r in reactions)
    assert any(line.strip().startswith("at rest:") for line in lines)
    assert any("within its quota" in line for line in lines)
    assert any(line.strip().startswith("CPU per scan, watch off") for line in lines)


def test_the_probes_benchmark_prints_its_figures() -> None:
    """bench/probes.py stays runnable: a quick run prints the probe's start against a bare interpreter's, the agent
    at rest with and without its health file, and what the chart's probes cost a node."""
    need_cgroups(2)
    bench = Path(__file__).resolve().parents[2] / "bench" / "probes.py"
    result = subprocess.run([sys.executable, str(bench), "--quick"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert {line.split()[0] for line in lines if line.split()[:1] in (["bare"], ["probe"])} == {"bare", "probe"}
    assert any(line.startswith("probe / bare: wall") for line in lines)
    assert any(line.startswith("the health file's writer:") for line in lines)
    assert any(line.startswith("the chart's probes:") for line in lines)


def test_the_idle_watch_benchmark_prints_its_figures() -> None:
    """bench/watch_idle.py stays runnable: a quick run prints the three agents side by side (today's reading path,
    the new one, the wake-up alone) and the ratios against the issue's goals."""
    need_cgroups(2)
    bench = Path(__file__).resolve().parents[2] / "bench" / "watch_idle.py"
    result = subprocess.run([sys.executable, str(bench), "--quick"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line.strip() for line in result.stdout.splitlines()]
    rows = [w for w in (line.split() for line in lines) if w[:1] in (["today"], ["new"], ["floor"]) and w[1] != "/"]
    assert [r[0] for r in rows] == ["today", "new", "floor"] and all(r[-1] == "us" for r in rows)
    assert sum(line.startswith("new / today,") and line.endswith("met") for line in lines) == 2
    assert any(line.startswith("floor / today, CPU a reading:") for line in lines)


def test_the_drm_sample_benchmark_prints_its_figures() -> None:
    """bench/drm_scan.py stays runnable: a quick run prints a DRM sample's cost for 1 process and 8x16 (8x64 in a
    full run), idle and busy, and with a 100,000-fd process, and the ratios."""
    need_cgroups(2)
    bench = Path(__file__).resolve().parents[2] / "bench" / "drm_scan.py"
    result = subprocess.run([sys.executable, str(bench), "--quick"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split() for line in result.stdout.splitlines()]
    table = [r for r in rows if len(r) >= 5 and r[-4].isdigit()]  # shape, processes, wall p50, p99, cpu p50
    assert [" ".join(r[:-4]) for r in table] == ["1x1", "8x16", "8x16 busy", "8x16 + fat"]
    assert table[1][-4] == "128", "every process of 8x16 read"
    assert any(" ".join(r).startswith("8x16 / 1x1 (wall p50):") for r in rows)
