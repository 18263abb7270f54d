"""Back-off and token pacing: growth with jitter, a fleet spread out, bursts and rate bounded."""

from __future__ import annotations

import pytest

from vramguard.base.backoff import Backoff, TokenBucket
from vramguard_testbed.fakes import FakeClock


def test_token_bucket_bounds_bursts_and_rate() -> None:
    """`burst` at once, then `per_minute` spread over the minute."""
    clock = FakeClock(0.0)
    bucket = TokenBucket(burst=3, per_minute=6, clock=clock)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    clock.step(9.9)
    assert not bucket.take()
    clock.step(0.1)
    assert bucket.take()
    clock.step(990.0)
    assert sum(bucket.take() for _ in range(10)) == 3, "refills cap at the burst"


@pytest.mark.parametrize(
    ("initial", "cap", "draws", "expected"),
    [
        pytest.param(1.0, 60.0, [0.0] * 8, [1, 2, 4, 8, 16, 32, 60, 60], id="doubles-up-to-the-cap"),
        pytest.param(1.0, 60.0, [1.0] * 3, [1.5, 3, 6], id="jitter-stretches-by-up-to-half"),
        pytest.param(10.0, 600.0, [0.5, 0.0], [12.5, 20], id="each-delay-draws-its-own-jitter"),
    ],
)
def test_backoff_grows_with_jitter(initial: float, cap: float, draws: list[float], expected: list[float]) -> None:
    """Delays double up to the cap, each stretched by jitter x a random draw (so a fleet spreads out)."""
    it = iter([*draws, 0.0])
    backoff = Backoff(initial, cap, jitter=0.5, rng=lambda: next(it))
    assert [backoff.next() for _ in draws] == expected
    backoff.reset()
    assert backoff.next() == initial, "a reset starts again from the initial delay"


def test_backoff_spreads_a_fleet() -> None:
    """A thousand agents failing together retry over a spread of times, not in lockstep."""
    delays = sorted(Backoff(1.0, 60.0).next() for _ in range(1000))
    assert delays[0] >= 1.0 and delays[-1] <= 1.5
    assert delays[900] - delays[100] > 0.3
