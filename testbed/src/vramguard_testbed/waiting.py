"""The one way tests, benches and the simulated node wait for something to happen: `wait_until`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """What was awaited did not happen in time; a test that meets it fails with the message."""


def wait_until(
    predicate: Callable[[], T | None], timeout_s: float = 5.0, what: str = "", interval_s: float = 0.01
) -> T:
    """Poll `predicate` until it returns something truthy, and return that (so never None); after `timeout_s` raise
    `WaitTimeout` naming `what` (or the predicate) and the last value seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            name = what or getattr(predicate, "__qualname__", repr(predicate))
            raise WaitTimeout(f"timed out after {timeout_s:g}s waiting for {name} (last: {value!r})")
        time.sleep(interval_s)
