"""The keyed work queue: de-duplicated keys, one hand-out at a time, keys held back on the clock, per-key back-off."""

from __future__ import annotations

from vramguard.base.backoff import Backoff
from vramguard.base.workqueue import WorkQueue
from vramguard_testbed.fakes import FakeClock


def make(clock: FakeClock | None = None) -> WorkQueue[str]:
    return WorkQueue(lambda: Backoff(2.0, 8.0, jitter=0.0), clock if clock is not None else FakeClock(0.0))


def drain(queue: WorkQueue[str]) -> list[str]:
    """One pass of a driver: every ready key, each done at once."""
    taken = []
    queue.release_due()
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


def test_held_back_keys_are_ready_at_the_first_pass_after_their_time() -> None:
    """`add_after` makes a key ready at the driver's first pass once its time has come, the earlier of two times;
    a key put back with no delay waits for the next pass instead of coming round again in this one."""
    clock = FakeClock(0.0)
    queue = make(clock)
    queue.add_after("a", 5.0)
    queue.add_after("a", 3.0)
    queue.add_after("a", 9.0)
    clock.step(2.9)
    assert drain(queue) == []
    clock.step(0.1)
    assert drain(queue) == ["a"]
    queue.add("b")
    queue.release_due()
    assert queue.get() == "b"
    queue.add_after("b", 0.0)
    queue.done("b")
    assert queue.get() is None, "not in the same pass"
    assert drain(queue) == ["b"]


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
