"""The seams: what a kill result means, and the honest fakes answering to every Protocol."""

from __future__ import annotations

import pytest

from vramguard.core.ports import (
    LIMIT_MAX,
    EventRecorder,
    Evictor,
    GpuSampler,
    Killer,
    KillResult,
    MemoryLimiter,
    PodLister,
    PodSource,
    ProcessIdentifier,
)
from vramguard.core.process import ProcessRef
from vramguard_testbed.fakes import (
    FakeEvictor,
    FakeIdentifier,
    FakeMemoryLimiter,
    FakePodSource,
    FakeSampler,
    GatedEvictor,
    RecordingEventRecorder,
    RecordingKiller,
)

P1, P2 = ProcessRef(100, 1000), ProcessRef(101, 1001)


@pytest.mark.parametrize(
    ("result", "ok"),
    [
        pytest.param(KillResult(killed=(P1,), skipped=(), exited=True), True, id="killed-and-exited"),
        pytest.param(KillResult(killed=(P1,), skipped=(), exited=False), False, id="killed-not-yet-exited"),
        pytest.param(KillResult(killed=(), skipped=((P1, "process gone"),), exited=True), False, id="nothing-killed"),
        pytest.param(KillResult(killed=(P1,), skipped=(), exited=True, remaining=(P2,)), False, id="a-holder-remains"),
        pytest.param(
            KillResult(killed=(P1,), skipped=((P2, "process gone"),), exited=True), True, id="a-skip-is-not-a-failure"
        ),
    ],
)
def test_a_kill_is_done_when_what_it_signalled_exited_and_no_holder_remains(result: KillResult, ok: bool) -> None:
    """`ok`: something was killed, every killed process exited, and none of the containers' holders is left."""
    assert result.ok is ok


def test_limit_max_is_the_drivers_no_limit() -> None:
    """LIMIT_MAX is NVML_DEVICE_MEMORY_LIMIT_MAX, the hard limit the driver reads as "no hard limit"."""
    assert LIMIT_MAX == 2**64 - 1


def members(protocol: type) -> set[str]:
    return {name for name, value in vars(protocol).items() if not name.startswith("_") and callable(value)}


@pytest.mark.parametrize(
    ("protocol", "fake"),
    [
        pytest.param(GpuSampler, FakeSampler(), id="sampler"),
        pytest.param(ProcessIdentifier, FakeIdentifier(), id="identifier"),
        pytest.param(PodSource, FakePodSource(), id="pod-source"),
        pytest.param(PodLister, FakePodSource(), id="pod-lister"),
        pytest.param(EventRecorder, RecordingEventRecorder(), id="event-recorder"),
        pytest.param(Evictor, FakeEvictor(), id="evictor"),
        pytest.param(Evictor, GatedEvictor(), id="gated-evictor"),
        pytest.param(Killer, RecordingKiller(), id="killer"),
        pytest.param(MemoryLimiter, FakeMemoryLimiter(), id="memory-limiter"),
    ],
)
def test_every_fake_answers_to_its_protocol(protocol: type, fake: object) -> None:
    """A fake has each method of the Protocol it stands in for, so a test through it goes the real part's way."""
    assert members(protocol), protocol
    assert {name for name in members(protocol) if not callable(getattr(fake, name, None))} == set()
