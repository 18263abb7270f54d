"""The named checks each part supplies: the driver limits' (read from the policy in force and the limiter's own
word), the HTTP server's rounds, and the names declared from the start in the order the answers read them.

The scan loop's checks over a real Agent are tested in test_loop.py, the limits check under a reload in
test_reload.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from vramguard.agent.checks import PART_STUCK_S, AgentChecks, DriverLimitsCheck, server_rounds
from vramguard.agent.reload import InForce
from vramguard.base.heartbeat import Heartbeat
from vramguard.core.policy import DriverLimits, Mode, Policy
from vramguard_testbed.fakes import FakeClock, FakePodSource

REQUIRE = Policy(mode=Mode.KILL, driver_limits=DriverLimits.REQUIRE)


@dataclass
class FakeLimiter:
    """The limiter's public word on what the driver holds."""

    unavailable: str | None = None
    unsupported: dict[int, str] = field(default_factory=dict)

    def unsupported_gpus(self) -> Mapping[int, str]:
        return self.unsupported


@pytest.mark.parametrize(
    ("limiter", "in_force", "answer"),
    [
        pytest.param(None, InForce(Policy(mode=Mode.KILL)), (True, ""), id="not-required-no-limiter"),
        pytest.param(
            FakeLimiter("no cgroup v2"), InForce(Policy(mode=Mode.KILL)), (True, ""), id="not-required-whatever-it-says"
        ),
        pytest.param(FakeLimiter(), InForce(REQUIRE), (True, ""), id="required-and-held"),
        pytest.param(
            None,
            InForce(REQUIRE),
            (False, "driver limits required, but never applied in warn mode or with --dry-run"),
            id="required-without-a-limiter",
        ),
        pytest.param(
            None,
            InForce(REQUIRE, "abc", ("driver_limits",)),
            (False, "driver limits required by the reloaded policy: they apply after a restart of the agent"),
            id="required-by-a-reload-waiting-for-a-restart",
        ),
        pytest.param(
            FakeLimiter("the driver has no nvmlDeviceSetMemoryLimits_v1"),
            InForce(REQUIRE),
            (False, "driver limits required: the driver has no nvmlDeviceSetMemoryLimits_v1"),
            id="required-and-unavailable",
        ),
        pytest.param(
            FakeLimiter(unsupported={1: "GPU 1: not supported", 0: "GPU 0: not supported"}),
            InForce(REQUIRE),
            (False, "driver limits required: GPU 0: not supported; GPU 1: not supported"),
            id="required-and-unsupported-on-gpus-in-order",
        ),
    ],
)
def test_the_driver_limits_check_reads_require_from_the_policy_in_force(
    limiter: FakeLimiter | None, in_force: InForce, answer: tuple[bool, str]
) -> None:
    """`driver_limits: require` fails readiness while the driver cannot hold the quotas, saying why; any other
    setting passes whatever the limiter says."""
    assert DriverLimitsCheck(limiter, in_force)() == answer


def test_the_driver_limits_check_holds_the_policy_a_reload_applies() -> None:
    """Registered with the reloader, the check answers for the policy in force from the reload on."""
    check = DriverLimitsCheck(None, InForce(Policy(mode=Mode.WARN)))
    assert check() == (True, "")
    check.apply(InForce(REQUIRE, "abc", ("driver_limits",)))
    assert check()[0] is False and "after a restart" in check()[1]


def test_the_http_servers_rounds_fail_liveness_once_stuck() -> None:
    """No round yet passes (the server may not be started); a round older than PART_STUCK_S fails, naming its age."""
    clock, rounds = FakeClock(), Heartbeat()
    check = server_rounds(rounds, clock)
    assert check() == (True, "")
    rounds.beat(clock.now())
    clock.step(PART_STUCK_S - 0.1)
    assert check() == (True, "")
    clock.step(0.1)
    assert check() == (False, f"HTTP server's last round {PART_STUCK_S:.1f}s ago: stuck")


def test_every_check_is_named_from_the_start_in_the_order_the_answers_read_them() -> None:
    """Before NVML is up the names are the ones the agent lists once running; NVML's is its opener's word."""
    checks = AgentChecks(FakePodSource(), clock=FakeClock())
    assert checks.healthz.names() == ("http", "scan-loop")
    assert checks.readyz.names() == ("nvml", "pods", "driver-limits", "memory-watch", "scan")
    assert checks.readyz() == (False, "NVML not initialised yet")
    checks.nvml("libnvidia-ml.so.1: cannot open shared object file")
    assert checks.readyz() == (False, "libnvidia-ml.so.1: cannot open shared object file")
    checks.nvml(None)
    assert checks.readyz() == (False, "no scan completed yet")
