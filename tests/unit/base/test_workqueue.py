"""The keyed work queue: de-duplicated keys, one hand-out at a time, keys held back on the clock, per-key back-off.
No threads here: tests/node/test_workqueue.py drives a blocking `get` from several threads."""

from __future__ import annotations

import pytest

from vramguard.base.backoff import Backoff
from vramguard.base.workqueue import WorkQueue
from vramguard_testbed.fakes import FakeClock


def make(clock: FakeClock | None = None) -> WorkQueue[str]:
    return WorkQueue(lambda: Backoff(2.0, 8.0, jitter=0.0), clock if clock is not None else FakeClock(0.0))


def drain(queue: WorkQueue[str]) -> list[str]:
    """One pass of a worker: every ready key, each done at once."""
    taken = []
    while (key := queue.get()) is not None:
        taken.append(key)
        queue.done(key)
    return taken


def test_keys_are_handed_out_in_order_each_once() -> None:
    """A key added while it waits is not queued twice; keys come out in the order they were added."""
    queue = make()
    for key in ("a", "b", "a", "c", "b"):
        queue.add(key)
    assert drain(queue) == ["a", "b", "c"]
    assert drain(queue) == []


def test_first_keys_go_ahead_and_a_waiting_key_moves_up() -> None:
    """`first` puts a key ahead of the others, a waiting one included; without it, a waiting key keeps its place."""
    queue = make()
    for key in ("a", "b", "c"):
        queue.add(key)
    queue.add("c", first=True)
    queue.add("d", first=True)
    queue.add("d")  # does not move it back
    assert drain(queue) == ["c", "d", "a", "b"]


def test_a_key_added_while_handed_out_waits_for_done() -> None:
    """A key is never handed out twice at once: added again meanwhile, it is ready after `done`, once."""
    queue = make()
    queue.add("a")
    assert queue.get() == "a"
    queue.add("a")
    queue.add("a")
    assert queue.get() is None, "still handed out"
    queue.done("a")
    assert queue.get() == "a"
    queue.done("a")
    assert queue.get() is None


def test_held_back_keys_are_ready_once_their_time_has_come() -> None:
    """`add_after` makes a key ready at the first `get` once its time has come, the earlier of two times; due keys
    come out in the order of their times."""
    clock = FakeClock(0.0)
    queue = make(clock)
    queue.add_after("a", 5.0)
    queue.add_after("a", 3.0)
    queue.add_after("a", 9.0)
    queue.add_after("b", 1.0)
    clock.step(2.9)
    assert drain(queue) == ["b"]
    clock.step(0.1)
    assert drain(queue) == ["a"]
    assert drain(queue) == []


def test_a_key_held_back_while_handed_out_comes_back_when_due() -> None:
    """A key put back with a delay while it is handed out is ready once that delay has passed, not before; with no
    delay, at the next `get` (client-go's `AddAfter(key, 0)` is an `Add`)."""
    clock = FakeClock(0.0)
    queue = make(clock)
    queue.add("a")
    assert queue.get() == "a"
    queue.add_after("a", 1.0)
    queue.done("a")
    assert queue.get() is None
    clock.step(1.0)
    assert queue.get() == "a"
    queue.add_after("a", 0.0)
    queue.done("a")
    assert queue.get() == "a"


@pytest.mark.parametrize(
    ("delays", "step_s", "expected"),
    [
        pytest.param({}, 0.0, None, id="nothing-held-back-waits-for-an-add"),
        pytest.param({"a": 5.0}, 0.0, 5.0, id="until-the-held-back-keys-time"),
        pytest.param({"a": 5.0, "b": 1.5}, 0.0, 1.5, id="until-the-earliest"),
        pytest.param({"a": 5.0}, 2.0, 3.0, id="less-as-the-clock-moves"),
    ],
)
def test_a_waiting_get_wakes_for_the_earliest_held_back_key(
    delays: dict[str, float], step_s: float, expected: float | None
) -> None:
    """The wait of a `get` with nothing ready ends at the earliest held-back key's time (the queue wakes itself);
    with none held back, only an add ends it."""
    clock = FakeClock(0.0)
    queue = make(clock)
    for key, delay in delays.items():
        queue.add_after(key, delay)
    clock.step(step_s)
    assert queue.until_due() == expected


def test_a_blocking_get_returns_a_ready_key_at_once_and_nothing_once_shut_down() -> None:
    """`get(block=True)` hands out a ready key (a due one included) without waiting; after `shut_down` every
    `get` returns None, ready keys or not."""
    clock = FakeClock(0.0)
    queue = make(clock)
    queue.add_after("a", 1.0)
    clock.step(1.0)
    assert queue.get(block=True) == "a"
    queue.done("a")
    queue.add("b")
    queue.shut_down()
    assert queue.get(block=True) is None
    assert queue.get() is None


def test_the_snapshot_holds_ready_held_back_and_handed_out_keys() -> None:
    """`snapshot` lists every key the queue holds, whatever its state, each once; a key done leaves it."""
    queue = make()
    queue.add("ready")
    queue.add("taken")
    queue.add_after("later", 5.0)
    queue.add_after("ready", 5.0)
    assert queue.get() == "ready"
    queue.add("ready")  # handed out and waiting again: still one key
    assert sorted(queue.snapshot()) == ["later", "ready", "taken"]
    queue.done("ready")
    assert drain(queue) == ["taken", "ready"]
    assert queue.snapshot() == ["later", "ready"]


def test_back_off_grows_per_key_until_forgotten() -> None:
    """Each `add_rate_limited` holds the key back longer (2, 4, 8, 8 s here), counting failures; `forget` starts
    its back-off again from the shortest, and another key's back-off is its own."""
    clock = FakeClock(0.0)
    queue = make(clock)
    ready_at = []
    for _ in range(4):
        queue.add_rate_limited("a")
        start = clock.now()
        while drain(queue) != ["a"]:
            clock.step(1.0)
        ready_at.append(clock.now() - start)
    assert ready_at == [2.0, 4.0, 8.0, 8.0]
    assert (queue.failures("a"), queue.failing()) == (4, 1)
    queue.add_rate_limited("b")
    assert (queue.failures("b"), queue.failing()) == (1, 2)
    queue.forget("a")
    assert (queue.failures("a"), queue.failing()) == (0, 1)
    queue.add_rate_limited("a")
    clock.step(2.0)
    assert sorted(drain(queue)) == ["a", "b"]
