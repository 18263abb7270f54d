"""Shared fixtures. Real parts: the simulated node runs the real agent over the test NVML library and real cgroups."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cgroup_fixtures import CgroupsFactory, need_cgroups
from vramguard_testbed.simnode import SimulatedNode


@pytest.fixture
def make_cgroups() -> Iterator[CgroupsFactory]:
    """factory(driver, version, **kw) -> KubeletCgroups; every one it made is cleaned up after the test."""
    with CgroupsFactory() as factory:
        yield factory


@pytest.fixture
def sim_node(tmp_path: Path) -> Iterator[SimulatedNode]:
    """A simulated GPU node (one 24GiB GPU); skips, saying why, where real cgroups cannot be made."""
    need_cgroups(2)
    with SimulatedNode(tmp_path / "node") as node:
        yield node
