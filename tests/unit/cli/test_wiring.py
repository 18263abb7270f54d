"""Which parts the agent gets, decided without starting any: no watch with `watch_interval: 0s`, no driver limiter
where the policy does not use one, no cgroup watch without a limiter. Starting the real parts (NVML, cgroups,
inotify) is tested in tests/node."""

from __future__ import annotations

import pytest

from vramguard.agent.metrics import Metrics
from vramguard.base.lifecycle import S, Services
from vramguard.cli.wiring import driver_limiter, memory_watch, watch_cgroups
from vramguard.core.limit_plan import LimitPlanner
from vramguard.core.policy import DriverLimits, Mode, Policy
from vramguard.core.ports import MemoryLimiter
from vramguard_testbed.fakes import FakeClock, FakePodSource, FakeSampler


class NoStarts(Services):
    """A group in which nothing may be started."""

    def start(self, name: str, part: S) -> S:
        raise AssertionError(f"{name} started")


def test_no_watch_between_scans_at_watch_interval_zero() -> None:
    """`watch_interval: 0s` scans on the poll alone: no watch is built (the sampler is not asked for anything)."""
    assert memory_watch(FakeSampler(), Policy(watch_interval_s=0.0), Metrics(), FakeClock()) is None


@pytest.mark.parametrize(
    ("policy", "dry_run"),
    [
        pytest.param(Policy(mode=Mode.WARN), False, id="warn-only"),
        pytest.param(Policy(mode=Mode.KILL), True, id="dry-run"),
        pytest.param(Policy(mode=Mode.KILL, driver_limits=DriverLimits.OFF), False, id="driver-limits-off"),
    ],
)
def test_no_driver_limiter_where_the_policy_does_not_use_one(policy: Policy, dry_run: bool) -> None:
    """Nothing to program: no limiter, and no NVML started for one; no cgroup watch to feed it either."""
    services = NoStarts(FakeClock())
    planner = LimitPlanner(FakePodSource(), None, policy, dry_run=dry_run)
    assert driver_limiter(planner, policy, dry_run, "/sys/fs/cgroup", _never_made, FakeClock()) is None
    watch_cgroups(None, "/sys/fs/cgroup", services, FakeClock())


def _never_made() -> MemoryLimiter:
    raise AssertionError("no memory limiter is made where the policy uses none")
