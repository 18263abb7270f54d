"""The test command runs the cluster tier as two pytest processes side by side (scripts/test.sh): the modules marked
`real_node`, which take the host's real node and so run one after the other, and the rest. A module that starts a
real node, containerd, or a fleet in kubepods cgroups without the mark would run beside another real node: it would
wait for the host's lock, or break the other."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "tests" / "cluster"
STARTS_A_NODE = ("real_cluster(", "one_node_at_a_time(", "Containerd(")
# A benchmark that takes the host's real node, which a module may run (bench/limits_window.py, bench/fleet.py).
BENCHES = tuple(
    f"bench/{p.name}" for p in sorted((ROOT / "bench").glob("*.py")) if any(s in p.read_text() for s in STARTS_A_NODE)
)
TAKES_THE_HOST = STARTS_A_NODE + tuple(f'"{b.split("/")[1]}"' for b in BENCHES)
MODULES = sorted(CLUSTER.glob("test_*.py"))


def test_there_are_cluster_modules_and_benchmarks_to_check() -> None:
    assert any(any(s in m.read_text() for s in TAKES_THE_HOST) for m in MODULES)
    assert "bench/limits_window.py" in BENCHES, BENCHES


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.name)
def test_a_module_that_takes_the_hosts_real_node_is_marked_real_node(module: Path) -> None:
    text = module.read_text()
    takes = [s for s in TAKES_THE_HOST if s in text]
    marked = "pytest.mark.real_node" in text
    assert marked == bool(takes), f"{module.name}: takes {takes or 'nothing of the host'}, marked real_node: {marked}"
