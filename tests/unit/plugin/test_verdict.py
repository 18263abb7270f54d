"""The verdict on a quota in force against a workload's peak and its recommendation."""

from __future__ import annotations

import pytest

from vramguard.core.quantity import GiB
from vramguard.plugin.verdict import Verdict, verdict


@pytest.mark.parametrize(
    ("peak", "quota", "recommended", "has_quota", "want"),
    [
        pytest.param(9 * GiB, 12 * GiB, 11 * GiB, None, Verdict.UNKNOWN, id="quota-in-force-unknown"),
        pytest.param(9 * GiB, None, 11 * GiB, False, Verdict.NO_QUOTA, id="no-quota"),
        pytest.param(9 * GiB, 8 * GiB, 11 * GiB, True, Verdict.KILLED, id="peak-over-the-hard-limit"),
        pytest.param(8 * GiB, 8 * GiB, 10 * GiB, True, Verdict.OK, id="peak-at-the-hard-limit-ok"),
        pytest.param(9 * GiB, 22 * GiB, 11 * GiB, True, Verdict.WASTEFUL, id="twice-the-recommendation"),
        pytest.param(9 * GiB, 21 * GiB, 11 * GiB, True, Verdict.OK, id="under-twice-ok"),
        pytest.param(9 * GiB, None, 11 * GiB, True, Verdict.OK, id="a-share-not-bytes-ok"),
    ],
)
def test_verdict(peak: int, quota: int | None, recommended: int, has_quota: bool | None, want: Verdict) -> None:
    """Unknown and no quota first; then killed above the hard limit, wasteful at twice the recommendation."""
    assert verdict(peak, quota, recommended, has_quota) == want
