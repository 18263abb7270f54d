"""The heartbeat: how long since a loop last went round."""

from __future__ import annotations

from vramguard.base.heartbeat import Heartbeat


def test_the_age_is_from_the_last_beat() -> None:
    """No age before the first beat; then the time since the latest one."""
    beat = Heartbeat()
    assert beat.age(10.0) is None
    beat.beat(10.0)
    beat.beat(12.0)
    assert beat.age(15.5) == 3.5
