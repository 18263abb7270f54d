"""The open-file limit the agent raises itself to: the hard limit, or the kernel's ceiling where that is unlimited.
Setting it in a real process is tested in tests/node/test_tuning.py."""

from __future__ import annotations

import resource

import pytest

from vramguard.cli.tuning import NR_OPEN_DEFAULT, open_file_target

INFINITY = resource.RLIM_INFINITY


@pytest.mark.parametrize(
    ("soft", "hard", "nr_open", "target"),
    [
        pytest.param(1024, 4096, None, 4096, id="soft-raised-to-hard"),
        pytest.param(4096, 4096, None, None, id="already-at-hard-left"),
        pytest.param(1024, INFINITY, 1 << 21, 1 << 21, id="unlimited-hard-raised-to-the-kernels-ceiling"),
        pytest.param(1024, INFINITY, None, NR_OPEN_DEFAULT, id="unlimited-hard-and-ceiling-unread-its-default"),
        pytest.param(INFINITY, INFINITY, 1 << 20, None, id="soft-unlimited-left"),
        pytest.param(1 << 22, INFINITY, 1 << 20, None, id="soft-above-the-ceiling-left"),
    ],
)
def test_the_soft_limit_goes_as_high_as_the_kernel_allows(
    soft: int, hard: int, nr_open: int | None, target: int | None
) -> None:
    """The hard limit, where NOFILE is unlimited the kernel's fs.nr_open; never lowered."""
    assert open_file_target(soft, hard, nr_open) == target
