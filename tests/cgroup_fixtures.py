"""Helpers for tests that need real kubelet-shaped cgroups (not a conftest: import what you use).

A test module gets a `make_cgroups` fixture with four lines::

    @pytest.fixture
    def make_cgroups() -> Iterator[CgroupsFactory]:
        with CgroupsFactory() as factory:
            yield factory
"""

from __future__ import annotations

import os
import select
from types import TracebackType
from typing import Any

from real_parts import need
from vramguard_testbed.cgroups import CgroupCleanupError, KubeletCgroups, cgroups_unavailable


def need_cgroups(version: int = 2) -> None:
    """Skip, saying why, where real cgroups of `version` cannot be made here; under CI (`CI` set) fail instead.

    CI runs as root on a machine with cgroups: a skip there would hide that a whole layer went untested.
    """
    reason = "needs root" if os.geteuid() != 0 else cgroups_unavailable(version)
    need(reason, **cgroup_messages(version))


def cgroup_messages(version: int) -> dict[str, str]:
    """What a cgroup test says when it cannot run (`real_parts.need`)."""
    return {
        "skip": f"real cgroup v{version} unavailable",
        "ci": f"run the cgroup tests (as root, with cgroup v{version})",
    }


class CgroupsFactory:
    """factory(driver, version, **kw) -> KubeletCgroups, or a pytest skip with the reason it is not possible here.

    Every instance it made is closed on exit, whatever the test did; a cgroup that could not be removed fails
    the test.
    """

    def __init__(self) -> None:
        self._made: list[KubeletCgroups] = []

    def __call__(self, driver: str = "systemd", version: int = 2, **kwargs: Any) -> KubeletCgroups:
        need_cgroups(version)
        kc = KubeletCgroups(driver, version, **kwargs)
        self._made.append(kc)
        return kc

    def __enter__(self) -> CgroupsFactory:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        errors = []
        for kc in reversed(self._made):
            try:
                kc.close()
            except CgroupCleanupError as e:
                errors.append(str(e))
        assert not errors, errors


def pidfd_exited(pidfd: int, timeout_s: float = 0.0) -> bool:
    """True once the process behind `pidfd` has exited (its pidfd polls readable)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(int(timeout_s * 1000)))
