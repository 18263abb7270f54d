"""Shared fixtures. Real parts: the simulated node runs the real agent over the test NVML library and real cgroups."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cgroup_fixtures import CgroupsFactory
from vramguard_testbed.cgroups import cgroups_unavailable
from vramguard_testbed.simnode import SimulatedNode


@pytest.fixture
def make_cgroups() -> Iterator[CgroupsFactory]:
    """factory(driver, version, **kw) -> KubeletCgroups; every one it made is cleaned up after the test."""
    with CgroupsFactory() as factory:
        yield factory


@pytest.fixture
def sim_node(tmp_path: Path) -> Iterator[SimulatedNode]:
    """A simulated GPU node (one 24GiB GPU); skips, saying why, where real cgroups cannot be made."""
    reason = "needs root" if os.geteuid() != 0 else cgroups_unavailable(version=2)
    if reason is not None:
        pytest.skip(f"real cgroup v2 unavailable: {reason}")
    with SimulatedNode(tmp_path / "node") as node:
        yield node
