"""The rule: a peak and its headroom, rounded up to a friendly amount in the field's unit."""

from __future__ import annotations

import pytest

from vramguard.core.quantity import GiB, MiB
from vramguard.plugin.strategy import friendly, recommended_bytes


@pytest.mark.parametrize(
    ("n_bytes", "unit", "want"),
    [
        pytest.param(10.8 * GiB, 1, 11 * GiB, id="gib-steps-above-8gi"),
        pytest.param(12 * GiB, 1, 12 * GiB, id="exact-stays"),
        pytest.param(700 * MiB, 1, 704 * MiB, id="64mi-steps-at-700mi"),
        pytest.param(1, 1, MiB, id="at-least-1mi"),
        pytest.param(3.1 * GiB, 1, 3.25 * GiB, id="256mi-steps-at-3gi"),
        pytest.param(10.2 * GiB, GiB, 11 * GiB, id="aliyun-whole-gib"),
        pytest.param(700 * MiB, 256 * MiB, 768 * MiB, id="tencent-256mi-units"),
        pytest.param(100 * GiB, 1, 104 * GiB, id="8gi-steps-at-100gi"),
    ],
)
def test_friendly_rounds_up_at_most_an_eighth(n_bytes: float, unit: int, want: int) -> None:
    """Up to a multiple of the largest power of two MiB at most an eighth of the amount, and of the unit."""
    got = friendly(n_bytes, unit)
    assert got == want
    assert got >= n_bytes and (got <= n_bytes * 1.125 or got - n_bytes < max(unit, MiB))


@pytest.mark.parametrize(
    ("peak", "headroom", "unit", "want"),
    [
        pytest.param(9 * GiB, 0.0, 1, 9 * GiB, id="no-headroom-the-peak"),
        pytest.param(9 * GiB, 0.2, 1, 11 * GiB, id="a-fifth-more-rounded-up"),
        pytest.param(9 * GiB, 0.2, 256 * MiB, 11 * GiB, id="in-256mi-units"),
        pytest.param(0, 0.2, 1, MiB, id="nothing-used-the-smallest-quota"),
    ],
)
def test_recommended_bytes_is_the_peak_and_its_headroom(peak: int, headroom: float, unit: int, want: int) -> None:
    """The peak grown by the headroom, rounded up by `friendly`, never below the smallest quota."""
    assert recommended_bytes(peak, headroom, unit) == want
