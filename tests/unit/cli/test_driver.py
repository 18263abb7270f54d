"""What /status and `vramguard version` say of the NVIDIA side, without asking NVML (that is tests/node's)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vramguard.cli.driver import nvidia_side, with_limits
from vramguard.core.ports import LimitsSupport
from vramguard.http.status import DriverFacts
from vramguard.nvml import binding_version, binds_limits

FACTS = DriverFacts(binding_version="13.615.71", binds_limits=True, driver_version="615.10")


@pytest.mark.parametrize(
    ("support", "unknown", "possible", "reason"),
    [
        pytest.param(LimitsSupport((0, 1)), "", True, "", id="every-gpu-can"),
        pytest.param(
            LimitsSupport((0,), unavailable="the driver has no nvmlDeviceSetMemoryLimits_v1"),
            "",
            False,
            "the driver has no nvmlDeviceSetMemoryLimits_v1",
            id="the-driver-cannot",
        ),
        pytest.param(
            LimitsSupport((0,), unanswered={0: "GPU 0: timeout"}), "", None, "GPU 0: timeout", id="no-answer-yet"
        ),
        pytest.param(None, "nvmlInit: failed", None, "nvmlInit: failed", id="not-asked-says-why"),
    ],
)
def test_the_driver_facts_say_whether_limits_can_be_held(
    support: LimitsSupport | None, unknown: str, possible: bool | None, reason: str
) -> None:
    """What the driver answered for the cgroup v2 root, or why it was not asked; the rest of the facts kept."""
    facts = with_limits(FACTS, support, unknown)
    assert (facts.limits_possible, facts.limits_reason) == (possible, reason)
    assert replace(facts, limits_possible=None, limits_reason="") == FACTS


def test_without_nvml_the_facts_are_the_bindings_alone() -> None:
    """Before NVML is up (or where it cannot start): the binding's version and whether it binds the limits, and no
    driver, NVML version or library."""
    facts = nvidia_side(None)
    assert (facts.binding_version, facts.binds_limits) == (binding_version(), binds_limits())
    assert (facts.driver_version, facts.nvml_version, facts.nvml_library) == (None, None, "")
