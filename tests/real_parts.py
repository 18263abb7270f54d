"""Tests that need a real part of this machine (root, cgroups, a built binary, an image): each skips, saying why,
where the part is missing, and fails instead under CI (`CI` set), which runs every install step first, so a
skipped layer can never pass as a green run. One rule for all of them: `need`.
"""

from __future__ import annotations

import os

import pytest

from vramguard_testbed.cgroups import cgroups_unavailable


def need(reason: str | None, *, skip: str, ci: str) -> None:
    """Nothing when `reason` is None; else skip with `<skip>: <reason>`, or under CI fail with `CI must <ci>:
    <reason>`."""
    found = verdict(reason, skip=skip, ci=ci, under_ci=bool(os.environ.get("CI")))
    if found is not None:
        fail, message = found
        if fail:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def why_no_cuda() -> str | None:
    """Why the GPU tests cannot run here (no PyTorch, no CUDA GPU, not root, no cgroup v2), or None."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible (torch.cuda.is_available() is False)"
    if os.geteuid() != 0:
        return "needs root for real pod cgroups"
    return cgroups_unavailable(version=2)


def verdict(reason: str | None, *, skip: str, ci: str, under_ci: bool) -> tuple[bool, str] | None:
    """(fail rather than skip, message) for a test that cannot run for `reason`; None when it can run."""
    if reason is None:
        return None
    if under_ci:
        return True, f"CI must {ci}: {reason}"
    return False, f"{skip}: {reason}"
