"""The cgroup tests skip where they cannot run, saying why, except under CI, where that is a failure (as for the
control plane): a skipped layer must not pass as a green run."""

from __future__ import annotations

import pytest

from cgroup_fixtures import cgroup_verdict


@pytest.mark.parametrize(
    ("reason", "ci", "verdict"),
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
def test_cgroup_verdict(reason: str | None, ci: bool, verdict: tuple[bool, str] | None) -> None:
    assert cgroup_verdict(reason, 2, ci=ci) == verdict
