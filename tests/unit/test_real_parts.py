"""The cgroup tests skip where they cannot run, saying why, except under CI, where that is a failure (as for the
control plane): a skipped layer must not pass as a green run."""

from __future__ import annotations

import pytest

from cgroup_fixtures import cgroup_messages
from real_parts import verdict


@pytest.mark.parametrize(
    ("reason", "ci", "expected"),
    [
        pytest.param(None, False, None, id="runs"),
        pytest.param(None, True, None, id="runs-under-ci"),
        pytest.param("needs root", False, (False, "real cgroup v2 unavailable: needs root"), id="skips"),
        pytest.param(
            "needs root",
            True,
            (True, "CI must run the cgroup tests (as root, with cgroup v2): needs root"),
            id="fails-under-ci",
        ),
    ],
)
def test_cgroup_verdict(reason: str | None, ci: bool, expected: tuple[bool, str] | None) -> None:
    """A cgroup test that cannot run skips saying why, or fails under CI; one that can runs."""
    assert verdict(reason, under_ci=ci, **cgroup_messages(2)) == expected
